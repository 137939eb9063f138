"""The read path's per-catalogue structures (fact postings, category placements, graph candidates as
arrays) give what a scan of every product gives, also after products change."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from vitrine import resources
from vitrine.index.fact_codes import FACT_FIELDS, FactCodes
from vitrine.index.graph import ProductGraph
from vitrine.index.vocabulary import GraphData, QueryTerms, norm_key
from vitrine.ingest.fashion import to_record
from vitrine.search.fusion import GRAPH_FIELDS, graph_candidate_array, graph_candidate_ids

QUERIES = ["puma sports shoes for men", "women red casual shoes", "navy blue watches", "unisex black backpack",
           "kurtas", "nike", "men summer formal shirts", "girls pink tops", "adidas women watches"]


@pytest.fixture(scope="module")
def data() -> GraphData:
    return GraphData.load(resources.graph_dir(), resources.taxonomy_file())


def _docs(rows):
    return [(n + 1, r["id"], to_record(r, f"images/{r['id']}.jpg")) for n, r in enumerate(rows)]


def test_fact_postings_equal_a_scan_of_the_codes_after_every_change():
    rng = random.Random(3)
    fc = FactCodes()
    values = {f: [f"{f}-{i}" for i in range(7)] for f in FACT_FIELDS}

    def check() -> None:
        for f in FACT_FIELDS:
            col = fc.column(f)
            for _ in range(6):
                codes = rng.sample(range(-1, 9), rng.randint(1, 3))  # some codes no value has, and NONE
                want = np.flatnonzero(np.isin(col, [c for c in codes if c >= 0]))
                got = fc.postings(f, codes)
                np.testing.assert_array_equal(got, want)
                assert got.dtype == np.int64 and not got.flags.writeable

    for iid in rng.sample(range(1, 400), 200):
        fc.set(iid, [rng.choice(values[f] + [None]) for f in FACT_FIELDS])
    check()
    for iid in rng.sample(range(1, 400), 50):
        fc.drop(iid)
    fc.set(2000, [values[f][0] for f in FACT_FIELDS])  # the rows grow
    check()
    fc.restore({f: list(fc.values(f)) for f in FACT_FIELDS}, fc.rows().copy())
    check()


def _candidates_by_scan(g: ProductGraph, terms: QueryTerms, iids: list[int]) -> list[int]:
    """Brute force: each product's own facts against the named values, relaxed as fusion's docstring says."""
    sets: dict[str, set[int]] = {}
    cats = terms.get("category")
    if cats:
        leaves = set().union(*(g.category_leaves(c) for c in cats))
        sets["category"] = {i for i in iids if (f := g.facts(i)) and f.category and g.category_node(f.category) in leaves}
    for field in GRAPH_FIELDS:
        want = {norm_key(v) for v in terms.get(field)}
        if want:
            sets[field] = {i for i in iids if (f := g.facts(i)) and (v := getattr(f, field)) and norm_key(v) in want}
    fields = list(sets)
    while fields:
        out = set.intersection(*(sets[f] for f in fields))
        if out:
            return sorted(out)
        drop = next((f for f in ("season", "usage", "colour", "brand", "gender") if f in fields), None)
        if drop is None:
            break
        fields.remove(drop)
    return sorted(sets.get("category", set()))


def test_graph_candidates_equal_a_scan_of_every_product(data, subset_rows):
    g = ProductGraph(data)
    docs = _docs(subset_rows)
    g.upsert_many(docs)
    iids = [i for i, _, _ in docs]

    def check() -> None:
        for q in QUERIES:
            terms = g.match_query(q)
            want = _candidates_by_scan(g, terms, iids)
            assert graph_candidate_array(g, terms).tolist() == want, q
            assert graph_candidate_ids(g, terms).tolist() == want, q  # remembered: the same

    check()
    changed = []
    for iid, pid, doc in docs[:40]:
        d = json.loads(json.dumps(doc))
        d["attributes"].update(colour="Red", gender="Women")
        changed.append((iid, pid, d))
    g.upsert_many(changed)
    g.delete([pid for _, pid, _ in docs[40:60]])
    check()


def test_category_proximities_follow_a_new_category(data, subset_rows):
    """Placements and chains are kept per category tree: a category added later is placed, and every
    proximity equals a fresh graph's over the same products."""
    docs = _docs(subset_rows)
    g = ProductGraph(data)
    g.upsert_many(docs[:100])
    cats = sorted({d["category"][-1] for _, _, d in docs if d.get("category")})
    terms = [g.match_query(q).get("category") for q in QUERIES]
    before = {(c, tuple(t)): g.category_proximity(c, t) for c in cats for t in terms if t}
    g.upsert_many(docs[100:])
    fresh = ProductGraph(data)
    fresh.upsert_many(docs)
    for c in cats:
        assert g.taxonomy_of(c) == fresh.taxonomy_of(c)
        assert g.mapping_confidence(c) == fresh.mapping_confidence(c)
        for t in terms:
            if t:
                assert g.category_proximity(c, t) == fresh.category_proximity(c, t), (c, t)
    assert any(v > 0 for v in before.values())
