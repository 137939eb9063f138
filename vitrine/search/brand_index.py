"""One notion of brand for filters, facets and rules: the record's own ``brand`` field or, without
one, the brand the product graph learned from the title (vitrine/index/graph_facts.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vitrine.index.filters import FilterIndex
from vitrine.index.graph import ProductGraph


def brand_ids(graph: ProductGraph, filters: FilterIndex, brands: Sequence[str]) -> np.ndarray:
    """The sorted iids whose brand is one of ``brands`` (case-insensitive)."""
    key = ("brand-ids", tuple(sorted({b.casefold() for b in brands})))
    learned = graph.product_set(key, lambda: graph.products_with("brand", brands))
    own = filters.allowed({"brand": list(brands)})
    if own is not None and len(own):
        return np.union1d(own, learned)
    return learned


def brand_counts(graph: ProductGraph, filters: FilterIndex, iids: Sequence[int] | np.ndarray) -> dict[str, int]:
    """Brand -> how many of ``iids`` carry it, the record's brand or the learned one alike."""
    arr = np.asarray(iids, dtype=np.int64)
    if not len(arr):
        return {}
    codes = graph.fact_codes(arr, ("brand",))[:, 0]
    codes = codes[codes >= 0]
    out: dict[str, int] = {}
    if len(codes):
        vals, n = np.unique(codes, return_counts=True)
        for c, k in zip(vals.tolist(), n.tolist()):
            name = graph.fact_value("brand", int(c))
            if name:
                out[name] = out.get(name, 0) + int(k)
    own = filters.counts(arr.tolist(), "brand")
    return out if sum(out.values()) >= sum(own.values()) else dict(own)


def live_counts(graph: ProductGraph, filters: FilterIndex) -> dict[str, int]:
    """Brand -> products, over the whole live catalogue (``/v1/facets``)."""
    return brand_counts(graph, filters, filters.live_ids())
