"""Chinese queries beside their English twins (``vitrine eval --protocol zh``).

- :func:`attribute_twins`: the attribute queries of ``--protocol attr`` (vitrine/evals/attribute_queries.py),
  each with a Chinese twin naming the same attributes the way a Chinese shopper types them
  ("男士黑色休闲鞋" for "men black casual shoes"): gender, colour and article type in one of their
  Chinese forms from the intent lexicon (vitrine/intent/data/lexicon.json), usage from
  :data:`USAGE_ZH`, brands as written on the catalogue or by their Chinese name where the lexicon
  has one. A query whose article type has no Chinese form is left out of both sides.
- :func:`hand_twins`: hand-written Chinese fashion queries with their English twins
  (``data/fashion-twins.zh.jsonl``), relevant = every product with the attributes each names.
- :func:`run_twins`: both sides through the engine, side by side, with the ZH/EN ratio per metric.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vitrine.metrics import mean_metrics
from vitrine.search.engine import Engine
from vitrine.search.models import SearchRequest

DATA = Path(__file__).with_name("data")
HAND_TWINS = DATA / "fashion-twins.zh.jsonl"
USAGE_ZH = {"Casual": ["休闲"], "Sports": ["运动"], "Formal": ["正装", "正式"], "Ethnic": ["民族风"],
            "Party": ["派对"], "Smart Casual": ["商务休闲"], "Travel": ["旅行"], "Home": ["居家"]}
_TEMPLATES_ZH = {
    ("gender", "colour", "articleType"): "{g}{c}{a}",
    ("colour", "articleType"): "{c}{a}",
    ("gender", "usage", "articleType"): "{g}{u}{a}",
    ("brand", "gender", "articleType"): "{b} {g}{a}",
    ("gender", "articleType"): "{g}{a}",
    ("brand", "articleType"): "{b} {a}",
    ("articleType",): "{a}",
}


def _has_cjk(text: str) -> bool:
    return any("\u4e00" <= ch <= "\u9fff" for ch in text)


def chinese_forms() -> dict[str, dict[str, list[str]]]:
    """field -> catalogue value -> its Chinese forms, from the intent lexicon (and :data:`USAGE_ZH`)."""
    from vitrine.intent.slots import LEXICON_PATH

    lex = json.loads(LEXICON_PATH.read_text(encoding="utf-8"))
    out: dict[str, dict[str, list[str]]] = {}
    for field, key in (("gender", "gender"), ("colour", "colour"), ("articleType", "category"), ("brand", "brand")):
        out[field] = {v: [f for f in forms if _has_cjk(f) and len(f) > 1] for v, forms in lex[key].items()}
    out["usage"] = USAGE_ZH
    return out


def twin_text(attrs: Mapping[str, str], forms: Mapping[str, Mapping[str, list[str]]], rng: random.Random) -> str | None:
    """The Chinese twin of an attribute query (None: an attribute has no Chinese form)."""
    subset = tuple(attrs)
    template = _TEMPLATES_ZH.get(subset)
    if template is None:
        return None
    words: dict[str, str] = {}
    for field, letter in (("gender", "g"), ("colour", "c"), ("articleType", "a"), ("usage", "u"), ("brand", "b")):
        if field not in attrs:
            continue
        value = attrs[field]
        options = list(forms.get(field, {}).get(value, []))
        if field == "brand":  # as the catalogue writes it, or its Chinese name
            options = [value] + options[:1]
        if not options:
            return None
        words[letter] = rng.choice(options)
    return template.format(**{k: words.get(k, "") for k in "gcaub"})


def attribute_twins(queries: Sequence[dict], seed: int = 7) -> list[dict]:
    """``queries`` (attribute queries with their ``attributes``) that have a Chinese twin, each with
    ``zh`` (the twin) beside its English ``text``."""
    forms, rng = chinese_forms(), random.Random(seed)
    out = []
    for q in queries:
        zh = twin_text(q["attributes"], forms, rng)
        if zh:
            out.append({**q, "zh": zh})
    return out


def hand_twins(rows: Sequence[Mapping[str, str]], path: Path = HAND_TWINS) -> list[dict]:
    """The hand-written twins; relevant = every catalogue row with all the attributes a twin names."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        q = json.loads(line)
        attrs = q["attributes"]
        rel = {r["id"]: 1 for r in rows if all(r.get(k, "") == v for k, v in attrs.items())}
        if rel:
            out.append({"qid": q["qid"], "text": q["english"], "zh": q["text"], "relevant": rel, "attributes": attrs})
    return out


def catalogue_language(engine: Engine, sample: int = 500) -> dict[str, Any]:
    """The share of ``sample`` product titles written in Chinese: the same twins run on the bundled
    catalogue and on its Chinese-titled variant (``vitrine convert-fashion --language zh``)."""
    all_ids = engine.records.ids()
    rows = engine.records.get_many(all_ids[:sample])
    zh = sum(1 for r in rows.values() if _has_cjk(str(r.doc.get("title", ""))))
    return {"products": len(all_ids), "sampled": len(rows), "chinese_titles": round(zh / len(rows), 3) if rows else 0.0}


def _search(engine: Engine, text: str, k: int) -> tuple[list[str], float, dict[str, Any]]:
    t0 = time.perf_counter()
    res = engine.search(SearchRequest(text=text, k=k))
    return [h.id for h in res.results], (time.perf_counter() - t0) * 1000, res.query


def run_twins(engine: Engine, twins: Sequence[dict], ks: Sequence[int], *, keep: int = 20) -> dict[str, Any]:
    """English (``text``) and Chinese (``zh``) of each twin through ``engine``: metrics side by side,
    the ZH/EN ratio of each, latencies, and the first ``keep`` queries with what the Chinese was read as."""
    kmax = max(ks)
    en_runs: list[tuple[list[str], dict]] = []
    zh_runs: list[tuple[list[str], dict]] = []
    en_lat: list[float] = []
    zh_lat: list[float] = []
    shown: list[dict[str, Any]] = []
    for q in twins:
        present = q["relevant"]
        en_ids, en_ms, _ = _search(engine, q["text"], kmax)
        zh_ids, zh_ms, zq = _search(engine, q["zh"], kmax)
        en_runs.append((en_ids, present))
        zh_runs.append((zh_ids, present))
        en_lat.append(en_ms)
        zh_lat.append(zh_ms)
        if len(shown) < keep:
            shown.append({"qid": q["qid"], "en": q["text"], "zh": q["zh"], "translated": zq.get("translated"),
                          "en_hits@10": sum(1 for i in en_ids[:10] if i in present),
                          "zh_hits@10": sum(1 for i in zh_ids[:10] if i in present)})
    en = mean_metrics(en_runs, ks, ("R", "P", "MRR", "nDCG"))
    zh = mean_metrics(zh_runs, ks, ("R", "P", "MRR", "nDCG"))
    ratio = {m: (zh[m] / en[m] if en[m] else None) for m in en}

    def lat(xs: list[float]) -> dict[str, float]:
        return {"p50": float(np.percentile(xs, 50)), "p99": float(np.percentile(xs, 99))} if xs else {}

    # the best P@k any ranking reaches on these queries (a query with fewer relevant products than k
    # caps it): on a catalogue subset read P@k beside it
    ideal = {f"P@{k}": float(np.mean([min(k, len(q["relevant"])) / k for q in twins])) if twins else 0.0 for k in ks}
    return {"queries": len(twins), "en": en, "zh": zh, "zh_over_en": ratio, "ideal": ideal,
            "latency_ms": {"en": lat(en_lat), "zh": lat(zh_lat)}, "examples": shown}


def qrels_twins(path: Path) -> list[dict]:
    """A qrels file of Chinese queries whose lines also carry their ``english`` twin."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            q = json.loads(line)
            if q.get("english"):
                out.append({"qid": q["qid"], "text": q["english"], "zh": q["text"],
                            "relevant": {str(k): float(v) for k, v in q["relevant"].items()}})
    return out
