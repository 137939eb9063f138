"""The filter index (vitrine/index/filters.py) at a catalogue's size: build time, bytes per product,
one upsert, and filters and facets without their answer cache, against another build's module.

``python -m vitrine_bench.filters --n 1000000 [--before OLD/vitrine/index/filters.py] [--out DIR]``

Products are synthetic (a three-level category path out of 4,000, gender, colour, one of 840
brands, stock, a price); the index is built in batches of 5,000 where the build has
``upsert_many`` (as opening a data dir does), one product at a time otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import time
import tracemalloc
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from vitrine.index import filters as this_build
from vitrine_bench.common import Report

FIELDS = ("category", "gender", "colour", "brand", "stock")


def _items(n: int) -> list[tuple[int, dict[str, list[str]], float]]:
    rng = random.Random(0)
    cats = [[f"Top{i % 20}", f"Mid{i % 200}", f"Leaf{i}"] for i in range(4000)]
    return [(i, {"category": cats[rng.randrange(4000)], "gender": [rng.choice(["Men", "Women", "Unisex"])],
                 "colour": [rng.choice(["red", "blue", "black", "white", "green", "grey"])],
                 "brand": [f"Brand{rng.randrange(840)}"], "stock": [rng.choice(["in", "out"])]},
             rng.uniform(1, 500)) for i in range(n)]


def measure(mod: ModuleType, items: list[tuple[int, dict[str, list[str]], float]]) -> dict[str, Any]:
    n = len(items)
    tracemalloc.start()
    f = mod.FilterIndex(FIELDS)
    t = time.perf_counter()
    if hasattr(f, "upsert_many"):
        for s in range(0, n, 5000):
            f.upsert_many(items[s:s + 5000])
    else:
        for iid, v, p in items:
            f.upsert(iid, v, p)
    build = time.perf_counter() - t
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    t = time.perf_counter()
    for iid, v, p in items[:2000]:
        f.upsert(iid, v, p)
    single = (time.perf_counter() - t) / 2000

    def ms(fn: Any, reps: int = 20) -> float:
        ts = []
        for _ in range(reps):
            f._cache.clear()  # noqa: SLF001 - the benchmark times the work the cache saves
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return round(1000 * float(np.median(ts)), 2)

    ids = list(range(0, n, max(1, n // 1000)))
    return {"products": n, "build_s": round(build, 2), "bytes_per_product": round(held / n),
            "single_upsert_us": round(single * 1e6, 1),
            "category_ms": ms(lambda: f.allowed({"category": ["top3"]})),
            "two_brands_and_colour_ms": ms(lambda: f.allowed({"brand": ["brand7", "brand9"], "colour": ["red"]})),
            "price_range_ms": ms(lambda: f.allowed({}, price_min=100, price_max=200)),
            "exclude_brand_ms": ms(lambda: f.allowed({}, exclude={"brand": ["brand7"]})),
            "counts_of_1000_ids_ms": ms(lambda: f.counts(ids, "brand")),
            "facet_whole_ms": ms(lambda: f.facet("category"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--before", type=Path, default=None, help="another build's vitrine/index/filters.py")
    ap.add_argument("--out", type=Path, default=Path("bench-results"))
    a = ap.parse_args()
    rep = Report("filters", a.out, "The filter index at a catalogue's size")
    items = _items(a.n)
    rows = []
    if a.before is not None:
        spec = importlib.util.spec_from_file_location("before_filters", a.before)
        assert spec is not None and spec.loader is not None
        before = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(before)
        rows.append({"build": "before", **measure(before, items)})
    rows.append({"build": "this build", **measure(this_build, items)})
    rep.add("rows", rows)
    rep.text(f"`python -m vitrine_bench.filters --n {a.n}{' --before ' + str(a.before) if a.before else ''}`. "
             "Median of 20 runs per filter, the answer cache cleared before each; bytes per product from "
             "tracemalloc while building.")
    rep.table(rows, ["build", *[k for k in rows[-1] if k != "build"]], "Per build")
    print(rep.write())


if __name__ == "__main__":
    main()
