"""Suggestions for Chinese shoppers: the suggestion index alone, in process, over the bundled catalogue.

Two catalogues made from the bundled data (20,873 products):

- **English titles** (the bundled catalogue as it is) with its values' Chinese forms added as the
  server adds them (vitrine/search/suggestions.py ``chinese_phrases``: the lexicon's, learned and
  dictionary forms of its categories, brands and colours);
- **Chinese titles**, a synthetic variant: each product's title rewritten as the Chinese forms of
  its brand, gender, colour and article type (the hand-written lexicon, else the dictionary; a
  value with none keeps its English), with its category path in Chinese the same way. It stands
  for a Chinese shop's size and shape, not its wording.

Prefixes typed: every keystroke of the whole pinyin of a Chinese phrase of the index (a category,
a brand, a title's first two words), its initials, a mixed form (the first character, then the
rest in pinyin, as an input method shows it while composing) and a homophone (one character
swapped for another of the same reading, as an input method offers first); English prefixes
(keystrokes of English titles) beside them on the same index. Build times include the pinyin
index (built on first use in a server; here timed on its own).
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from vitrine_bench.common import Report, summary_ms
from vitrine_bench.suggest import prefixes


def _zh(value: str, field: str, forms: dict[str, dict[str, list[str]]]) -> str:
    got = forms.get(field, {}).get(value)
    return got[0] if got else value


def chinese_docs(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The synthetic Chinese-titled variant of ``docs`` (see the module docstring)."""
    from vitrine.intent import lexicon_zh

    brands = sorted({str(d.get("brand") or d["title"].split()[0]) for d in docs})
    attrs = [d.get("attributes") or {} for d in docs]
    values = {"brand": brands, "category": sorted({c for d in docs for c in d.get("category") or []}),
              "colour": sorted({str(a.get("colour")) for a in attrs if a.get("colour")})}
    forms = lexicon_zh.chinese_forms(values)
    gender = {k: [f for f in v if not f.isascii()] for k, v in lexicon_zh.lexicon()["gender"].items()}
    out = []
    for d, a in zip(docs, attrs):
        brand = str(d.get("brand") or d["title"].split()[0])
        cat = [_zh(c, "category", forms) for c in d.get("category") or []]
        words = [_zh(brand, "brand", forms), (gender.get(str(a.get("gender"))) or [""])[0],
                 _zh(str(a.get("colour") or ""), "colour", forms), cat[-1] if cat else ""]
        out.append({"id": d["id"], "title": " ".join(w for w in words if w), "category": cat,
                    "attributes": {"colour": _zh(str(a.get("colour") or ""), "colour", forms),
                                   "gender": (gender.get(str(a.get("gender"))) or [""])[0]}})
    return out


def _homophone(word: str, rng: random.Random, by_reading: dict[str, list[str]]) -> str | None:
    from vitrine.lang import pinyin

    i = rng.randrange(len(word))
    r = pinyin.readings(word[i])[0]
    others = [c for c in by_reading.get(r, []) if c != word[i]]
    return word[:i] + rng.choice(others) + word[i + 1:] if others else None


def pinyin_prefixes(phrases: list[str], n: int, seed: int = 0) -> dict[str, list[str]]:
    """Typed forms of ``phrases`` by kind: keystrokes of the whole pinyin and of the initials, a
    mixed form, a homophone."""
    from pypinyin.pinyin_dict import pinyin_dict

    from vitrine.lang import pinyin

    rng = random.Random(seed)
    by_reading: dict[str, list[str]] = {}
    for code in pinyin_dict:
        ch = chr(code)
        if "\u4e00" <= ch <= "\u9fff" and len(by_reading.get(pinyin.readings(ch)[0], [])) < 40:
            by_reading.setdefault(pinyin.readings(ch)[0], []).append(ch)
    out: dict[str, list[str]] = {"pinyin": [], "initials": [], "mixed": [], "homophone": []}
    for p in phrases:
        chars = "".join(ch for ch in p if pinyin.is_cjk_char(ch))[:6]
        if len(chars) < 2:
            continue
        sylls = pinyin.syllables(chars)
        full, ini = pinyin.full(sylls), pinyin.initials(sylls)
        out["pinyin"] += [full[:i] for i in range(2, len(full) + 1)]
        out["initials"] += [ini[:i] for i in range(2, len(ini) + 1)]
        out["mixed"].append(chars[0] + pinyin.full(sylls[1:]))
        h = _homophone(chars, rng, by_reading)
        if h:
            out["homophone"].append(h)
    for v in out.values():
        rng.shuffle(v)
    return {k: v[:n] for k, v in out.items()}


def _timed(idx: Any, pool: list[str], k: int = 8) -> dict[str, Any]:
    lat = []
    found = 0
    for p in pool:
        t = time.perf_counter()
        got = idx.lookup(p, k)
        lat.append(time.perf_counter() - t)
        found += bool(got)
    return {"prefixes": len(pool), "answered": round(found / max(1, len(pool)), 3), **summary_ms(lat)}


def run(source: Path, out: Path, n: int = 3000) -> Path:
    from vitrine.bundled import read_styles
    from vitrine.index import suggest
    from vitrine.index.suggest_pinyin import PinyinIndex
    from vitrine.index.vocabulary import GraphData
    from vitrine.ingest.fashion import to_record
    from vitrine.intent import lexicon_zh
    from vitrine.lang import pinyin
    from vitrine.search.suggestions import chinese_phrases

    rep = Report("suggest_chinese", out, "Suggestions for Chinese shoppers: pinyin, initials, homophones")
    docs = [to_record(r, "") for r in read_styles(source)]
    brands = GraphData.load(None, None).brands
    brand_of = brands.from_title if len(brands) else None
    lexicon_zh.reverse_dictionary()
    pinyin.readings("手")  # pypinyin's tables: once per process, not a build's time
    rows: list[dict[str, Any]] = []
    catalogues = {"English titles + Chinese forms": docs, "Chinese titles (synthetic)": chinese_docs(docs)}
    english_pool = prefixes([d["title"] for d in docs[::7]], n)
    for name, cat in catalogues.items():
        t0 = time.perf_counter()
        phrases = suggest.catalogue_phrases(cat, brand_of=brand_of if cat is docs else None)
        zh = chinese_phrases(phrases) if cat is docs else []
        idx = suggest.SuggestIndex(phrases + zh)
        build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        py: PinyinIndex = idx.pinyin()
        pinyin_s = time.perf_counter() - t0
        chinese = [t for t, kd in zip(idx.texts, idx.kinds) if pinyin.has_cjk(t)]
        pools = pinyin_prefixes(chinese, n)
        base = {"catalogue": name, "products": len(cat), "phrases": len(idx), "chinese_phrases": len(chinese),
                "pinyin_entries": len(py), "build_s": round(build_s, 3), "pinyin_build_s": round(pinyin_s, 3)}
        for kind, pool in [*pools.items(), ("english", english_pool if cat is docs else [])]:
            if pool:
                rows.append({**base, "typed": kind, **_timed(idx, pool)})
                r = rows[-1]
                print(f"{name:32s} {kind:10s} n={r['prefixes']} answered={r['answered']:.2f} p50={r['p50_ms']:.3f}ms "
                      f"p99={r['p99_ms']:.3f}ms (build {build_s:.2f}s + pinyin {pinyin_s:.2f}s)", flush=True)
    rep.add("results", rows)
    rep.text("The suggestion index alone, in process, no result cache, k=8, on one core of the machine shared with "
             "other work. `answered`: the share of typed forms given at least one suggestion. `build_s`: the phrases "
             "and the prefix index (with the Chinese forms for the English catalogue); `pinyin_build_s`: the pinyin "
             "index on top (built on the first lookup that may be pinyin, or at warm-up). The Chinese-titled "
             "catalogue is synthetic (see vitrine_bench/suggest_zh.py): its size and shape, not a shop's wording.")
    rep.table(rows, ["catalogue", "typed", "prefixes", "answered", "p50_ms", "p95_ms", "p99_ms", "phrases",
                     "chinese_phrases", "pinyin_entries", "build_s", "pinyin_build_s"],
              "Lookup latency by what was typed")
    return rep.write()


def chinese_prefixes(phrases: list[str], n: int, seed: int = 0) -> list[str]:
    """Keystrokes of Chinese phrases as an input method commits them: 1, 2, 3... characters."""
    from vitrine.lang import pinyin

    rng = random.Random(seed)
    out: list[str] = []
    for p in phrases:
        chars = "".join(ch for ch in p if pinyin.is_cjk_char(ch))[:6]
        out += [chars[:i] for i in range(1, len(chars) + 1)]
    rng.shuffle(out)
    return out[:n]


def served(data_dir: Path, out: Path, n: int = 300) -> Path:
    """GET /v1/suggest on a served data dir (a Chinese shop), in process through the app: the index
    warmed as at start-up, each typed form asked once (distinct forms, so the response cache never
    answers), for whole pinyin, initials, mixed and homophone forms of the shop's own Chinese phrases,
    Chinese character prefixes, and the issue's own examples."""
    from fastapi.testclient import TestClient

    from vitrine.lang import pinyin
    from vitrine.search.engine import Engine
    from vitrine.settings import Settings
    from vitrine.web.app import create_app

    rep = Report("suggest_chinese_served", out, "GET /v1/suggest on a served Chinese shop: pinyin, initials, prefixes")
    engine = Engine.open(Settings(data_dir=data_dir))
    t0 = time.perf_counter()
    warm_s = engine.suggestions.warm()
    idx = engine.suggestions.catalogue()
    assert idx is not None
    chinese = [t for t in idx.texts if pinyin.has_cjk(t)]
    pools: dict[str, list[str]] = {"issue": ["shoubiao", "sb", "shoub", "手b", "手标", "手表", "lianyiqun", "lyq",
                                             "shoutibao", "stb", "heise", "hs", "nanshi"]}
    pools.update(pinyin_prefixes(chinese, n))
    pools["chinese prefix"] = chinese_prefixes(chinese, n)
    seen: set[str] = set()
    rows: list[dict[str, Any]] = []
    base = {"products": len(engine.records.ids()), "phrases": len(idx), "chinese_phrases": len(chinese),
            "pinyin_entries": len(idx.pinyin()), "warm_s": round(warm_s, 2), "open_s": round(time.perf_counter() - t0, 2)}
    with TestClient(create_app(engine=engine)) as client:
        client.get("/v1/suggest", params={"q": "warm-up"})
        for kind, pool in pools.items():
            lat: list[float] = []
            server: list[float] = []
            answered = 0
            for q in pool:
                if q in seen:
                    continue
                seen.add(q)
                t = time.perf_counter()
                r = client.get("/v1/suggest", params={"q": q})
                lat.append(time.perf_counter() - t)
                body = r.json()
                server.append(body["took_ms"] / 1000)
                answered += bool(body["suggestions"])
                if kind == "issue":
                    rows.append({**base, "typed": q, "first": (body["suggestions"] or [{"text": ""}])[0]["text"],
                                 **{f"http_{k}": v for k, v in summary_ms(lat[-1:]).items() if k == "p50_ms"}})
            s = summary_ms(server)
            rows.append({**base, "typed": kind, "prefixes": len(lat), "answered": round(answered / max(1, len(lat)), 3),
                         "server_p50_ms": s["p50_ms"], "server_p99_ms": s["p99_ms"],
                         **{f"http_{k}": v for k, v in summary_ms(lat).items() if k in ("p50_ms", "p99_ms")}})
            r0 = rows[-1]
            print(f"{kind:15s} n={r0['prefixes']} answered={r0['answered']} server p50={r0['server_p50_ms']:.2f} "
                  f"p99={r0['server_p99_ms']:.2f} ms; http p50={r0['http_p50_ms']:.2f} p99={r0['http_p99_ms']:.2f}",
                  flush=True)
    rep.add("data_dir", str(data_dir))
    rep.add("results", rows)
    rep.text("GET /v1/suggest through the app in process (FastAPI TestClient), k=8, the suggestion indexes warmed "
             "as at start-up; each typed form asked once (the response cache never answers). `server`: the "
             "response's took_ms (the lookup); `http`: the whole call through the app. Typed forms are made from "
             "the shop's own Chinese phrases (see vitrine_bench/suggest_zh.py `pinyin_prefixes`, `chinese_prefixes`).")
    rep.table([r for r in rows if "prefixes" in r], ["typed", "prefixes", "answered", "server_p50_ms", "server_p99_ms",
                                                     "http_p50_ms", "http_p99_ms", "phrases", "chinese_phrases",
                                                     "pinyin_entries", "warm_s"], "Latency by what was typed")
    rep.table([r for r in rows if "first" in r], ["typed", "first", "http_p50_ms"], "The issue's examples: first suggestion")
    return rep.write()
