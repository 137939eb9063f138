"""The graph built from whatever catalogue is ingested: a furniture/electronics catalogue on real
Google taxonomy nodes (data/home-electronics, scripts/make_home_electronics.py) gets its
categories mapped onto the taxonomy with a confidence, its brands and colours learned, and no
fashion term (brand, category, colour, gender) the catalogue does not hold ever fires."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from vitrine import resources
from vitrine.index.graph import ProductGraph
from vitrine.index.vocabulary import GraphData, leading_brands, norm_key
from vitrine.index.taxonomy_map import (
    CategoryMapping,
    TaxonomyMapper,
    TaxonomyVectors,
    confidence,
    mapper_for,
    mapping_report,
    path_text,
)
from vitrine.ingest.catalog import ingest_file
from vitrine.search.engine import Engine
from vitrine.search.models import SearchRequest
from vitrine.settings import TAXONOMY_VECTORS_FILE

from conftest import REPO

GRAPH_DIR = resources.graph_dir()
TAXONOMY = resources.taxonomy_file()
VECTORS = resources.resource_path("taxonomy", TAXONOMY_VECTORS_FILE)
OTHER = REPO / "data" / "home-electronics"
FASHION_QUERIES = ["nike", "puma sports shoes", "tshirts", "kurta", "men", "women's handbags", "red",
                   "casual wear for summer", "jeans"]


@pytest.fixture(scope="module")
def records() -> list[dict]:
    return [json.loads(line) for line in (OTHER / "catalog.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def expected() -> dict[str, int]:
    with open(OTHER / "categories.csv", encoding="utf-8") as f:
        return {r["category_path"]: int(r["taxonomy_id"]) for r in csv.DictReader(f)}


@pytest.fixture(scope="module")
def graph(encoder, records) -> ProductGraph:
    data = GraphData.load(GRAPH_DIR, TAXONOMY)
    mapper = mapper_for(data.taxonomy, data.taxonomy_sha256, encoder.text_features, encoder.towers.key, VECTORS)
    data.use_mapper(mapper, mapper.identity)
    g = ProductGraph(data)
    g.upsert_many((i + 1, r["id"], r) for i, r in enumerate(records))
    return g


def test_shipped_taxonomy_vectors_are_the_text_towers_own(encoder):
    data = GraphData.load(None, TAXONOMY)
    tv = TaxonomyVectors.load(VECTORS, encoder.towers.key, data.taxonomy_sha256)
    assert tv is not None and len(tv.ids) == len(data.taxonomy) == 5582
    rng = np.random.default_rng(0)
    pick = rng.choice(len(tv.ids), 24, replace=False)
    mine = encoder.text_features([path_text(data.taxonomy[tv.ids[i]]) for i in pick])
    mine /= np.linalg.norm(mine, axis=1, keepdims=True)
    assert np.min(np.sum(mine * tv.vectors[pick], axis=1)) > 0.999  # float16 storage
    # made for another tower or another taxonomy: not used
    assert TaxonomyVectors.load(VECTORS, "another-tower", data.taxonomy_sha256) is None
    assert TaxonomyVectors.load(VECTORS, encoder.towers.key, "0" * 64) is None


def test_categories_of_another_domain_map_onto_the_taxonomy(graph, expected):
    tax = graph.data.taxonomy
    by_path = {" > ".join(m["path"]): m for m in graph.mapping() if m["products"]}
    assert set(by_path) == set(expected)
    mapper = graph.data.mapper
    exact = near = 0
    for path, want in expected.items():
        m = by_path[path]
        assert m["source"] in ("auto", "unmapped")
        assert (m["taxonomy_id"] is not None) == (m["confidence"] >= mapper.threshold)
        if m["taxonomy_id"] is None:
            continue
        exact += m["taxonomy_id"] == want
        near += m["taxonomy_id"] in mapper.lineage(want)
        # the graph's edge agrees with the node's record of the mapping
        assert graph.taxonomy_of(path.split(" > ")[-1]) == f"taxonomy:{m['taxonomy_id']}"
        assert m["taxonomy_path"] == " > ".join(tax[m["taxonomy_id"]])
    mapped = sum(1 for m in by_path.values() if m["taxonomy_id"] is not None)
    assert mapped >= 13 and exact >= 11 and near == mapped
    # an unmapped category is its own node: no taxonomy proximity, but a query still names it
    unmapped = [p.split(" > ")[-1] for p, m in by_path.items() if m["taxonomy_id"] is None]
    for name in unmapped:
        assert graph.taxonomy_of(name) is None
        assert graph.category_proximity(name, [graph.category_node("Sofas")]) == 0.0
        assert graph.match_query(name).get("category") == [graph.category_node(name)]
    # a taxonomy node a mapped category sits under is a query term this catalogue holds
    assert graph.match_query("office furniture").get("category")


def test_brands_and_colours_are_learned_from_the_catalogue(graph, records):
    facts = {graph.facts_of(r["id"]).brand for r in records}  # type: ignore[union-attr]
    assert facts == {"IKEA", "Ashley", "Herman Miller", "Steelcase", "Zinus", "Sauder", "Sony", "Samsung", "LG",
                     "Logitech", "Dell", "HP", "Bose", "Lenovo", "JBL", "Brother"}
    for r in records:  # brand field where given, else the title's leading words
        f = graph.facts_of(r["id"])
        assert f is not None and r["title"].startswith(f.brand)
        if r.get("brand"):
            assert f.brand == r["brand"]
        colour = (r.get("attributes") or {}).get("color")
        title_colour = next(w for w in r["title"].split() if w in {"Black", "White", "Grey", "Blue", "Green", "Beige",
                                                                  "Brown"}) if colour is None else None
        assert f.colour == (colour or title_colour)
    terms = graph.match_query("grey sofa by herman miller")
    assert terms.get("brand") == ["Herman Miller"] and terms.get("colour") == ["Grey"]
    assert terms.get("category") == [graph.category_node("Sofas")]


@pytest.mark.parametrize("query", FASHION_QUERIES)
def test_no_fashion_term_fires_on_another_catalogue(graph, query):
    # the shipped fashion lexicons know every one of these words ...
    fashion = ProductGraph(GraphData.load(GRAPH_DIR, TAXONOMY))
    fashion.upsert_many([(1, "p1", {"title": "Nike Men Red Tshirts", "category": ["Apparel", "Topwear", "Tshirts"],
                                    "attributes": {"gender": "Men", "colour": "Red", "usage": "Casual",
                                                   "season": "Summer"}}),
                         (2, "p2", {"title": "Puma Women Handbags", "category": ["Accessories", "Bags", "Handbags"],
                                    "attributes": {"gender": "Women"}}),
                         (3, "p3", {"title": "Levis Men Jeans", "category": ["Apparel", "Bottomwear", "Jeans"]}),
                         (4, "p4", {"title": "Biba Women Kurta", "category": ["Apparel", "Topwear", "Kurtas"]}),
                         (5, "p5", {"title": "Puma Men Sports Shoes",
                                    "category": ["Footwear", "Shoes", "Sports Shoes"]})])
    assert fashion.match_query(query)
    # ... and none of them names anything this catalogue holds
    assert not graph.match_query(query), graph.match_query(query).as_dict()


def test_a_term_stops_firing_when_its_last_product_goes(graph):
    g = ProductGraph(GraphData.load(GRAPH_DIR, TAXONOMY))
    g.upsert_many([(1, "a", {"title": "Nike Men Red Tshirts", "category": ["Apparel", "Topwear", "Tshirts"],
                             "attributes": {"colour": "Red"}})])
    assert g.match_query("nike tshirts").as_dict() == {"brand": ["Nike"], "category": [g.category_node("Tshirts")]}
    assert g.match_query("navy").get("colour") == []  # no navy product, and navy's family is neutral
    assert g.match_query("wine").get("colour") == ["Maroon"]  # a Red product holds the red family
    g.delete(["a"])
    assert not g.match_query("nike tshirts")


def test_threshold_leaves_categories_unmapped(encoder, records):
    data = GraphData.load(None, TAXONOMY)
    strict = mapper_for(data.taxonomy, data.taxonomy_sha256, encoder.text_features, encoder.towers.key, VECTORS,
                        threshold=1.01)
    data.use_mapper(strict, strict.identity)
    g = ProductGraph(data)
    g.upsert_many((i + 1, r["id"], r) for i, r in enumerate(records))
    assert all(m["taxonomy_id"] is None and m["source"] == "unmapped" for m in g.mapping())
    assert g.stats()["taxonomy_nodes"] == 0
    assert not any(k == "maps_to" for _, _, k in g.g.edges(keys=True))
    # without a mapper (no text tower), only a taxonomy node of the same name
    plain = ProductGraph(GraphData.load(None, TAXONOMY))
    plain.upsert_many((i + 1, r["id"], r) for i, r in enumerate(records))
    by = {m["category"]: m for m in plain.mapping() if m["products"]}
    assert by["Sofas"]["source"] == "name" and by["Sofas"]["taxonomy_id"] == 460
    assert by["Computer Mice"]["source"] == "unmapped"


def test_mapping_confidence_and_report_against_brute_force():
    tax = {1: ("A",), 2: ("A", "B"), 3: ("A", "B", "C"), 4: ("D",), 5: ("D", "E")}
    vecs = np.eye(5, dtype=np.float32)

    def embed(texts):
        rows = {"A": 0, "A > B": 1, "A > B > C": 2, "D": 3, "D > E": 4}
        out = []
        for t in texts:
            v = np.zeros(5, dtype=np.float32)
            for part, w in zip(t.split(" | "), (1.0, 0.6, 0.3)):
                v[rows[part]] = w
            out.append(v)
        return np.stack(out)

    m = TaxonomyMapper(tax, lambda: TaxonomyVectors(sorted(tax), vecs, "toy"), lambda ts: embed(
        [t.replace("Shop > ", "").replace(" :: ", " | ") for t in ts]), lexical_weight=0.0, threshold=0.5)
    # "A > B > C" first, "A > B" second (its own lineage: no rival), "D > E" the best rival
    got = m.map_path(["Shop > A > B > C :: A > B :: D > E"])
    q = np.array([0, 0.6, 1.0, 0, 0.3])
    q = q / np.linalg.norm(q)
    assert got.best_id == 3 and got.runner_up_id == 5
    assert got.score == pytest.approx(q[2], abs=1e-4) and got.margin == pytest.approx(q[2] - q[4], abs=1e-4)
    assert got.confidence == pytest.approx(confidence(q[2], q[2] - q[4]), abs=1e-4)
    assert (got.taxonomy_id == 3) == (got.confidence >= 0.5)
    # the report's figures, counted by hand
    maps = [CategoryMapping("x", ("x",), 3, 0.9, "auto", best_id=3), CategoryMapping("y", ("y",), None, 0.2, "unmapped",
                                                                                       best_id=2),
            CategoryMapping("z", ("z",), 5, 0.7, "auto", best_id=5)]
    rep = mapping_report(maps, {"x": 3, "y": 3, "z": 4}, tax, norm_key, thresholds=(0.0, 0.5, 0.8))
    by = {c["threshold"]: c for c in rep["curve"]}
    assert by[0.0] == {"threshold": 0.0, "coverage": 1.0, "mapped": 3, "accuracy": round(1 / 3, 4),
                       "accuracy_near": 1.0}  # y: B is C's parent; z: E is D's child
    assert by[0.5]["mapped"] == 2 and by[0.5]["accuracy"] == 0.5 and by[0.8]["accuracy"] == 1.0


def test_leading_brands_from_titles():
    titles = ["Herman Miller Aeron Chair", "Herman Miller Sayl Chair", "Herman Miller Mirra Chair",
              "IKEA Billy Bookcase", "IKEA Kallax Shelf", "IKEA Poang Chair",
              "Wireless Mouse Black", "Wireless Keyboard", "Compact Wireless Speaker", "Oak Desk"]
    assert sorted(leading_brands(titles, min_count=3)) == ["Herman Miller", "IKEA"]


@pytest.mark.slow
def test_engine_ingests_another_domain_and_persists_the_mapping(settings_factory, encoder, tmp_path, expected):
    data_dir = tmp_path / "data"
    # the graph signals themselves are under test: rank with the configured fusion weights, not the
    # untuned floor (an untuned catalogue ranks text by the text tower alone)
    eng = Engine(settings_factory(data_dir, calibration="off"), encoder)
    report = ingest_file(eng, OTHER / "catalog.jsonl", progress=False)
    assert report.upserted == 96 and not report.failed
    mapping = {" > ".join(m["path"]): m for m in eng.graph.mapping() if m["products"]}
    assert set(mapping) == set(expected)
    assert sum(m["source"] == "auto" for m in mapping.values()) >= 13
    res = eng.search(SearchRequest(text="herman miller grey office chair", k=10, explain=True))
    top = res.results[0]
    assert top.explanation is not None
    signals = set(top.explanation.signals)
    assert {"graph:brand", "graph:category"} <= signals
    for q in FASHION_QUERIES:
        r = eng.search(SearchRequest(text=q, k=10, explain=True))
        for hit in r.results:
            assert not any(s.startswith("graph:") and v for s, v in (hit.explanation.signals or {}).items()), (q, hit)
    eng.save()
    eng.close()
    again = Engine(settings_factory(data_dir), encoder)  # the mapping comes back from graph.json
    assert not again.recovery["graph_rebuilt"]
    assert {" > ".join(m["path"]): m for m in again.graph.mapping() if m["products"]} == mapping
    again.close()
