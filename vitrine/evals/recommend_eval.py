"""Complementary recommendations, checked: for random products of a split, does every result
come from a category the graph's outfits pair with the anchor's, for the anchor's gender,
colour-compatible, and never from the anchor's own category?"""

from __future__ import annotations

import random
import time
from typing import Any

import numpy as np

from vitrine.index.vocabulary import norm_key
from vitrine.progress import progress_bar
from vitrine.search.engine import Engine


def complements_check(engine: Engine, ids: list[str], *, n: int = 200, k: int = 10, seed: int = 0,
                      progress: bool = True) -> dict[str, Any]:
    """Recommend ``k`` complementary products for ``n`` random products of ``ids`` and measure
    the share of results that satisfy each rule."""
    present = set(engine.records.ids())
    pool = sorted(i for i in ids if i in present)
    anchors = random.Random(seed).sample(pool, min(n, len(pool)))
    total = comp = gender = compat = colour = own = 0
    both = 0
    empty = []
    lat = []
    counts = []
    examples: list[dict[str, Any]] = []
    for pid in progress_bar(anchors, desc="complements", enabled=progress):
        t0 = time.perf_counter()
        res = engine.recommend(pid, "complementary", k)
        lat.append((time.perf_counter() - t0) * 1000)
        a = res.anchor
        a_cat = a.category[-1] if a.category else None
        a_gender = (a.attributes or {}).get("gender")
        a_colour = (a.attributes or {}).get("colour")
        allowed = {norm_key(c) for c in engine.graph.complements_of(a_cat, a_gender)}
        counts.append(len(res.results))
        if not res.results:
            empty.append(pid)
        for h in res.results:
            cat = h.category[-1] if h.category else None
            g = (h.attributes or {}).get("gender")
            is_comp = cat is not None and norm_key(cat) in allowed
            same_g = g == a_gender
            total += 1
            comp += is_comp
            gender += same_g
            both += is_comp and same_g
            compat += same_g or g == "Unisex" or a_gender == "Unisex"
            colour += engine.graph.colour_compatible(a_colour, (h.attributes or {}).get("colour"))[0]
            own += cat is not None and a_cat is not None and norm_key(cat) == norm_key(a_cat)
        if len(examples) < 5 and res.results:
            examples.append({"anchor": f"{a.title} ({a_cat}, {a_gender}, {a_colour})",
                             "results": [f"{h.title} | {h.relation}" for h in res.results[:4]]})

    def share(x: float) -> float:
        return x / total if total else 0.0

    return {
        "protocol": "complements", "anchors": len(anchors), "k": k, "results": total,
        "metrics": {
            "complementary_category_and_gender": share(both),
            "complementary_category": share(comp),
            "same_gender": share(gender),
            "gender_compatible (unisex fits)": share(compat),
            "colour_compatible": share(colour),
            "own_category": share(own),
            "mean_results": float(np.mean(counts)) if counts else 0.0,
            "anchors_without_results": len(empty),
        },
        "latency_ms": {"p50": float(np.percentile(lat, 50)) if lat else None,
                       "p99": float(np.percentile(lat, 99)) if lat else None},
        "anchors_without_results": empty[:20],
        "examples": examples,
    }
