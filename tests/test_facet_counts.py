"""A facet value's count is what applying it gives: the total of the same query filtered by it
(the relevance floor is anchored at the query's unfiltered top score, so it does not move with a filter)."""

from __future__ import annotations

import pytest

QUERIES = ["jeans", "kurta", "shoes", "black shirt", "watch", "women handbags", "men sports shoes", "blue tshirt",
           "sunglasses", "casual shoes", "dress", "red"]
FIELDS = ["gender", "colour"]


@pytest.mark.parametrize("use_intent", [True, False])
def test_facet_count_equals_filtered_total(engine, use_intent):
    from vitrine.search.models import Filters, SearchRequest

    tried, bad = 0, []
    for q in QUERIES:
        base = engine.search(SearchRequest(text=q, k=10, facets=FIELDS, use_intent=use_intent))
        for f in FIELDS:
            for fv in (base.facets or {}).get(f, [])[:6]:
                got = engine.search(SearchRequest(text=q, k=10, use_intent=use_intent,
                                                  filters=Filters.model_validate({f: fv.value})))
                tried += 1
                if got.total != fv.count:
                    bad.append((q, f, fv.value, fv.count, got.total))
    assert tried >= 40, tried
    assert not bad, f"{len(bad)} of {tried} facet values disagree with the filtered total: {bad[:10]}"
