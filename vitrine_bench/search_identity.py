"""Result identity of the read path across a change: dump the responses of a fixed query set on a
data dir before the change, dump them again after, and compare (ids, totals, facets and every other
field but timings identical; scores and explanation contributions within a tolerance).

    python -m vitrine_bench.search_identity dump DATA_DIR OUT.json [--wands]
    python -m vitrine_bench.search_identity compare BEFORE.json AFTER.json

The query set: English queries of the bundled catalogue's test split (attribute queries and titles,
the API bench's pool), their Chinese twins and the hand-written Chinese fashion twins, and the WANDS
dev queries in English and Chinese. Fusion's time budget is lifted (a search past it on a loaded
machine would degrade to another ranking: a difference of load, not of code). Each query is searched plain (k 10, every facet), every fifth
one also with ``explain`` (its per-signal contributions compared too) and every seventh one also
under a filter (the filtered pool's path). The query-embedding cache is off, nothing is logged.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

WANDS_DEV = Path("/work/shared/data/wands-dev/queries.jsonl")
_VOLATILE = ("took_ms", "query_id", "stale_s")
_FACETS = ["gender", "colour", "brand", "category", "price"]


def query_set(wands: Path | None) -> list[str]:
    """The queries, in a fixed order."""
    from vitrine.bundled import bundled_dir
    from vitrine.evals.chinese import DATA as ZH_DATA
    from vitrine_bench.api import chinese_pool, query_pool

    texts, _ = query_pool(bundled_dir(), n=500)
    texts += chinese_pool(bundled_dir(), n=200)
    for path in ([wands] if wands else []) + [ZH_DATA / "wands-dev-queries.zh.jsonl"]:
        if path.exists():
            texts += [json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()]
    return texts


def requests(texts: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, t in enumerate(texts):
        out.append({"text": t, "k": 10, "facets": _FACETS})
        if i % 5 == 0:
            out.append({"text": t, "k": 10, "explain": True})
        if i % 7 == 0:
            out.append({"text": t, "k": 10, "facets": _FACETS, "filters": {"price_max": 2000.0}})
    return out


def dump(data_dir: Path, out: Path) -> int:
    from vitrine.cli.base import make_settings
    from vitrine.search.engine import Engine
    from vitrine.search.models import SearchRequest

    reqs = requests(query_set(WANDS_DEV))
    # no time budget: on a loaded machine a search past fusion's budget degrades to another ranking
    eng = Engine.open(make_settings(data_dir=data_dir, query_cache_size=0, fusion_timeout_ms=600_000))
    rows = []
    for r in reqs:
        res = eng.search(SearchRequest(**r)).model_dump(mode="json")
        for k in _VOLATILE:
            res.pop(k, None)
        rows.append({"request": r, "response": res})
    out.write_text(json.dumps(rows, ensure_ascii=False))
    log.info("%d responses from %s -> %s", len(rows), data_dir, out)
    return len(rows)


def _diff(a: Any, b: Any, path: str, tol: float, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            out.append(f"{path}: keys {sorted(set(a) ^ set(b))}")
        for k in set(a) & set(b):
            if k.endswith("_ms"):  # a timing (query.intent_ms)
                continue
            _diff(a[k], b[k], f"{path}.{k}", tol, out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{path}: length {len(a)} != {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            _diff(x, y, f"{path}[{i}]", tol, out)
    elif isinstance(a, float) and isinstance(b, float | int) and not isinstance(b, bool):
        if not (math.isclose(a, b, abs_tol=tol, rel_tol=0) or (math.isnan(a) and math.isnan(b))):
            out.append(f"{path}: {a!r} != {b!r}")
    elif a != b:
        out.append(f"{path}: {a!r} != {b!r}")


def compare(before: Path, after: Path, tol: float = 1e-6) -> list[str]:
    """Every difference between two dumps (empty: identical within ``tol``)."""
    a, b = json.loads(before.read_text()), json.loads(after.read_text())
    if [r["request"] for r in a] != [r["request"] for r in b]:
        return ["the dumps hold different requests"]
    out: list[str] = []
    for name, dump_ in (("before", a), ("after", b)):  # a degraded search ranked otherwise: not comparable
        out += [f"[{i}] {r['request']['text']!r}: degraded {r['response']['degraded']} in {name}"
                for i, r in enumerate(dump_) if r["response"].get("degraded")]
    for i, (x, y) in enumerate(zip(a, b)):
        _diff(x["response"], y["response"], f"[{i}] {x['request']['text']!r}", tol, out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("data_dir", type=Path)
    d.add_argument("out", type=Path)
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    c.add_argument("--tol", type=float, default=1e-6)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if a.cmd == "dump":
        dump(a.data_dir, a.out)
        return 0
    diffs = compare(a.before, a.after, a.tol)
    n = len(json.loads(a.before.read_text()))
    for line in diffs[:50]:
        sys.stdout.write(line + "\n")
    sys.stdout.write(f"{n} responses compared: {len(diffs)} differences\n")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
