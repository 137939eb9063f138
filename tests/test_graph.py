"""Knowledge graph, BM25 and hybrid ranking: the reviewed data, the graph's behaviour and
persistence, symbolic retrieval in the record store, and fusion through the engine."""

from __future__ import annotations

import csv
import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vitrine.errors import StorageError
from vitrine.index.bm25 import BM25Scores
from vitrine.index.graph import ProductGraph
from vitrine.index.graph_facts import ProductFacts
from vitrine.index.vocabulary import GraphData, QueryTerms, learn_brands, norm_key
from vitrine.ingest.catalog import ingest_file
from vitrine import resources
from vitrine.bundled import read_styles
from vitrine.ingest.fashion import to_record
from vitrine.search.engine import Engine
from vitrine.search.fusion import GRAPH_SIGNALS, GraphScorer, Pool, fuse, fuse_weighted, graph_candidate_ids
from vitrine.search.models import Filters, SearchRequest

from conftest import SOURCE

GRAPH_DIR = resources.graph_dir()
TAXONOMY = resources.taxonomy_file()


@pytest.fixture(scope="module")
def data() -> GraphData:
    return GraphData.load(GRAPH_DIR, TAXONOMY)


@pytest.fixture(scope="module")
def all_rows():
    return read_styles(SOURCE)


def docs_of(rows):
    return [(n + 1, r["id"], to_record(r, f"images/{r['id']}.jpg")) for n, r in enumerate(rows)]


@pytest.fixture()
def subset_graph(data, subset_rows) -> ProductGraph:
    g = ProductGraph(data)
    g.upsert_many(docs_of(subset_rows))
    return g


# -- the reviewed data --------------------------------------------------------------------------------
def test_every_article_type_maps_to_a_real_taxonomy_node(data, all_rows):
    types = {r["articleType"] for r in all_rows}
    assert len(types) == 89
    with open(GRAPH_DIR / "category_map.csv", encoding="utf-8") as f:
        mapping = {row["article_type"]: row for row in csv.DictReader(f)}
    assert set(mapping) == types
    for t, row in mapping.items():
        tid = int(row["taxonomy_id"])
        assert " > ".join(data.taxonomy[tid]) == row["taxonomy_path"], t  # id and path agree with Google's file
    in_outfit = {norm_key(c) for o in data.outfits for s in o.slots for c in s}
    assert {norm_key(t) for t in types} <= in_outfit
    assert in_outfit <= {norm_key(t) for t in types}  # no typo'd category in complements.json
    fams = {c for c in data.colours.family}
    assert {norm_key(r["baseColour"]) for r in all_rows if r["baseColour"] not in ("NA", "")} <= fams


def test_brands_are_learned_from_titles_with_multi_word_brands(data, all_rows):
    overrides = json.loads((GRAPH_DIR / "brand_overrides.json").read_text())
    brands = learn_brands([r["productDisplayName"] for r in all_rows], overrides)
    names = {b["name"] for b in brands}
    assert {"United Colors of Benetton", "Louis Philippe", "Peter England", "Puma", "Nike", "Lee", "Lee Cooper",
            "Red Tape", "U.S. Polo Assn."} <= names
    assert "Jockey ZONE" not in names and "ADIDAS Originals" not in names  # product lines fold into the brand
    # the shipped lexicon is exactly what the learner produces (regenerate with `vitrine graph learn-brands`)
    shipped = json.loads((GRAPH_DIR / "brands.json").read_text())["brands"]
    assert shipped == brands
    lex = data.brands
    assert lex.from_title("United Colors of Benetton Men Blue Shirt") == "United Colors of Benetton"
    assert lex.from_title("Jockey ZONE Men Black Trunks") == "Jockey"
    assert lex.from_title("Lee Cooper Men Brown Shoes") == "Lee Cooper"
    assert lex.from_title("Lee Men Blue Jeans") == "Lee"
    assert lex.from_title("Redtape Men Black Shoes") == "Red Tape"
    assert lex.from_title("Acme Outdoor Men Green Jacket") == "Acme Outdoor"  # unseen brand: learned online


def test_colour_rules(data):
    c = data.colours
    assert c.compatible("Black", "Pink") == (True, "neutral")
    assert c.compatible("Gold", "Green") == (True, "metallic")
    assert c.compatible("Blue", "Orange") == (True, "pairing")
    assert c.compatible("Red", "Maroon") == (True, "tonal")
    assert c.compatible("Red", "Pink")[0] is False
    assert c.compatible("Red", "Green")[0] is False
    assert c.compatible("Multi", "Yellow")[0] is False and c.compatible("Multi", "White")[0] is True
    assert c.compatible(None, "Red") == (True, "colour unknown")


# -- the graph -----------------------------------------------------------------------------------------
def test_graph_structure_over_real_products(subset_graph, subset_rows):
    g = subset_graph
    assert len(g) == len(subset_rows)
    r = next(r for r in subset_rows if r["articleType"] == "Casual Shoes")
    f = g.facts_of(str(r["id"]))
    assert f is not None and g.category_node(f.category) == "category:casualshoes"
    assert f.gender == r["gender"] and f.iid in g.store.postings(f"gender:{norm_key(r['gender'])}").tolist()
    assert f.iid in g.products_of_category("Casual Shoes")
    tax = [t for _, t, k in g.g.out_edges("category:casualshoes", keys=True) if k == "maps_to"]
    assert tax == ["taxonomy:187"] and g.g.nodes["taxonomy:187"]["path"] == "Apparel & Accessories > Shoes"
    # the backbone climbs to the taxonomy root, and catalogue groups hold their leaves
    assert g.taxonomy_distance("taxonomy:187", "taxonomy:166") == 1
    assert "category:casualshoes" in g.category_leaves("Footwear")
    shoes = g.products_with("category", ["category:footwear"])
    footwear = {x["articleType"] for x in subset_rows if x["masterCategory"] == "Footwear"}
    assert shoes == {f.iid for f in (g.facts_of(str(x["id"])) for x in subset_rows)
                     if f is not None and f.category in footwear}
    # brands come from titles
    ucb = [x for x in subset_rows if x["productDisplayName"].startswith("United Colors of Benetton")]
    assert ucb and g.facts_of(ucb[0]["id"]).brand == "United Colors of Benetton"


def test_leaf_category_versus_group(data):
    g = ProductGraph(data)
    g.upsert(1, "a", {"title": "Baggit Women Pink Wallet", "category": ["Free Items", "Free Gifts", "Wallets"]})
    g.upsert(2, "b", {"title": "Aspen Women Blue Dial Watch", "category": ["Free Items", "Free Gifts", "Free Gifts"]})
    g.upsert(3, "c", {"title": "Baggit Women Brown Wallet", "category": ["Accessories", "Wallets", "Wallets"]})
    assert g.products_of_category("Free Gifts") == {2}  # recommendations: the leaf only
    assert g.products_of_category("Wallets") == {1, 3}
    # a query naming the group expands to every category filed under it (here Wallets, via product 1)
    assert g.products_with("category", ["category:freegifts"]) == {1, 2, 3}


def test_remembered_product_sets_follow_every_change(data):
    """Graph candidates are remembered per query terms; any product change must drop them."""
    g = ProductGraph(data)
    g.upsert(1, "a", {"title": "Baggit Women Pink Wallet", "category": ["Accessories", "Wallets", "Wallets"],
                      "attributes": {"gender": "Women"}})
    terms = g.match_query("women wallets")
    assert terms

    def cands():
        return graph_candidate_ids(g, terms).tolist()

    assert cands() == [1] and cands() == [1]
    g.upsert(2, "b", {"title": "Lino Women Red Wallet", "category": ["Accessories", "Wallets", "Wallets"],
                      "attributes": {"gender": "Women"}})
    assert cands() == [1, 2]
    g.delete(["a"])
    assert cands() == [2]
    g.upsert(2, "b", {"title": "Lino Men Red Wallet", "category": ["Accessories", "Wallets", "Wallets"],
                      "attributes": {"gender": "Men"}})
    assert cands() == [2]  # relaxed: no women's wallet left, the category alone
    assert not g.product_set(("graph_candidates", terms.key()), lambda: []).flags.writeable


def _signals_one_by_one(g: ProductGraph, terms: QueryTerms, iid: int) -> list[float]:
    """Brute force: one product's graph signals from its facts, as fusion's docstring defines them."""
    out = dict.fromkeys(GRAPH_SIGNALS, 0.0)
    f = g.facts(iid)
    if f is None:
        return list(out.values())
    cats = terms.get("category")
    leaves = set().union(*(g.category_leaves(c) for c in cats)) if cats else set()
    if cats and f.category:
        if g.category_node(f.category) in leaves:
            out["graph:category"] = 1.0
        else:
            out["graph:proximity"] = g.category_proximity(f.category, cats)
    families = {g.data.colours.family_of(v) for v in terms.get("colour")} - set(g.data.colours.universal) - {None}
    for field in ("brand", "colour", "gender", "usage", "season"):
        want, v = {norm_key(x) for x in terms.get(field)}, getattr(f, field)
        if not want or v is None:
            continue
        if norm_key(v) in want:
            out[f"graph:{field}"] = 1.0
        elif (field == "gender" and v == "Unisex" and want & {"men", "women"}) or (
                field == "colour" and g.data.colours.family_of(v) in families):
            out[f"graph:{field}"] = 0.5
    return list(out.values())


@pytest.mark.parametrize("query", ["puma sports shoes for men", "women red casual shoes", "navy blue watches",
                                   "unisex black backpack", "kurtas", "nike"])
def test_pool_graph_signals_equal_each_products_own(subset_graph, subset_rows, data, query):
    """The pool's graph signals come from integer fact codes, per distinct value; they equal each
    product's signals from its own facts, also after products change, go, or never existed."""
    g = subset_graph
    terms = g.match_query(query)
    assert terms
    iids = np.array([*range(1, len(subset_rows) + 1), 10**6], dtype=np.int64)  # the last: no such product

    def check() -> None:
        got = GraphScorer(g, terms).rows(iids)
        want = np.array([_signals_one_by_one(g, terms, i) for i in iids.tolist()])
        np.testing.assert_array_equal(got, want)
        assert want.any() and not want[-1].any()

    check()
    docs = docs_of(subset_rows)
    changed = []
    for iid, pid, doc in docs[:10]:
        d = json.loads(json.dumps(doc))
        d["attributes"].update(colour="Red", gender="Unisex")
        d["category"] = ["Footwear", "Shoes", "Casual Shoes"]
        changed.append((iid, pid, d))
    g.upsert_many(changed)
    g.delete([pid for _, pid, _ in docs[10:15]])
    check()


def test_relations_and_complements(subset_graph):
    g = subset_graph
    men_shirt = g.complements_of("Shirts", "Men")
    assert {"Trousers", "Belts", "Formal Shoes", "Ties", "Watches"} <= set(men_shirt)
    assert "Shirts" not in men_shirt and "Skirts" not in men_shirt  # never itself; skirts are not a men's pairing
    assert "Skirts" in g.complements_of("Shirts", "Women")
    assert g.relation("Watches", "Wallets") == "complements"
    assert g.relation("Casual Shoes", "Sports Shoes") == "substitutes"  # same Google node
    assert g.relation("Shirts", "Shirts") == "substitutes"
    assert g.relation("Shirts", "Deodorant") == "unrelated"
    assert 0 < g.category_proximity("Sports Shoes", ["category:casualshoes"]) < 1
    assert g.category_proximity("Sports Shoes", ["category:casualshoes"]) > \
        g.category_proximity("Tshirts", ["category:casualshoes"])


@pytest.mark.parametrize("query, expect", [
    ("puma women sports shoes", {"brand": ["Puma"], "gender": ["Women"], "category": ["category:sportsshoes"]}),
    ("men black casual shoes", {"gender": ["Men"], "colour": ["Black"], "category": ["category:casualshoes"]}),
    ("United Colors of Benetton navy tees", {"brand": ["United Colors of Benetton"], "colour": ["Navy Blue"],
                                             "category": ["category:tshirts"]}),
    ("red tape formal shoes for mens", {"brand": ["Red Tape"], "category": ["category:formalshoes"],
                                        "gender": ["Men"]}),
    ("black and white shirt", {"colour": ["Black", "White"], "category": ["category:shirts"]}),  # "and" is no brand
])
def test_query_words_match_the_graph_vocabulary(subset_graph, query, expect):
    got = subset_graph.match_query(query).as_dict()
    assert got == expect


def test_incremental_updates_equal_a_rebuild(data, subset_rows):
    docs = docs_of(subset_rows)
    g = ProductGraph(data)
    g.upsert_many(docs)
    changed = []
    for iid, pid, doc in docs[:20]:  # recolour, re-gender and re-categorise some; delete others
        d = json.loads(json.dumps(doc))
        d["attributes"]["colour"] = "Purple"
        d["attributes"]["gender"] = "Unisex"
        d["category"] = ["Accessories", "Watches", "Watches"]
        changed.append((iid, pid, d))
    g.upsert_many(changed)
    g.delete([pid for _, pid, _ in docs[20:40]])
    final = {pid: (iid, doc) for iid, pid, doc in docs[40:]} | {pid: (iid, doc) for iid, pid, doc in changed}
    fresh = ProductGraph(data)
    fresh.upsert_many((iid, pid, doc) for pid, (iid, doc) in final.items())

    def prods(gr: ProductGraph) -> dict[str, ProductFacts | None]:
        return {pid: gr.facts_of(pid) for pid in final}

    assert prods(g) == prods(fresh) and all(prods(g).values()) and g.facts_of(docs[20][1]) is None
    # the counts and code columns agree with a scan of every product's facts
    for field in ("category", "colour", "gender", "brand"):
        want: dict[str, set[int]] = {}
        for pid in final:
            f = g.facts_of(pid)
            v = getattr(f, field)
            if v is not None:
                node = g.category_node(v) if field == "category" else f"{field}:{norm_key(v)}"
                want.setdefault(node, set()).add(f.iid)
        for node, iids in want.items():
            assert set(g.store.postings(node).tolist()) == iids and g.store.on_node(node) == len(iids), node
    assert g.products_with("colour", ["Purple"]) == fresh.products_with("colour", ["Purple"])
    assert g.products_with("category", ["category:watches"]) == fresh.products_with("category", ["category:watches"])
    assert len(g) == len(final)


def test_graph_file_round_trip_and_integrity(subset_graph, subset_rows, data, tmp_path):
    from vitrine.index import vector_files

    path = tmp_path / "graph.varr"
    sha = subset_graph.save(path)
    meta, arrays = vector_files.read_arrays(path, sha)  # node-link JSON and arrays, no pickle
    assert {"nodes", "edges"} <= set(meta["graph"]) and meta["graph"]["graph"]["fingerprint"] == data.fingerprint
    assert arrays["codes"].dtype == np.int32
    back = ProductGraph.load(path, data, sha)
    assert set(back.g.nodes) == set(subset_graph.g.nodes)
    assert set(back.g.edges(keys=True)) == set(subset_graph.g.edges(keys=True))
    assert len(back) == len(subset_graph) and all(
        back.facts_of(str(r["id"])) == subset_graph.facts_of(str(r["id"])) for r in subset_rows)
    assert back.products_with("gender", ["Men"]) == subset_graph.products_with("gender", ["Men"])
    assert back.stats() == subset_graph.stats()
    assert back.match_query("puma women sports shoes").as_dict() == \
        subset_graph.match_query("puma women sports shoes").as_dict()
    with pytest.raises(StorageError, match="checksum"):
        ProductGraph.load(path, data, "0" * 64)
    other = GraphData.load(GRAPH_DIR, TAXONOMY)
    other.fingerprint = "different reviewed data"
    with pytest.raises(StorageError, match="other graph data"):
        ProductGraph.load(path, other, sha)


# -- the engine: snapshot, replay, BM25, fusion ---------------------------------------------------------
def test_graph_lives_in_the_snapshot_and_replays(settings_factory, encoder, catalog_dir, tmp_path):
    s = settings_factory(tmp_path / "d")
    e1 = Engine(s, encoder)
    ingest_file(e1, catalog_dir / "catalog.jsonl", progress=False, limit=40)  # saves a snapshot
    manifest = json.loads((tmp_path / "d" / "index" / "manifest.json").read_text())
    assert "graph.varr" in manifest["files"] and len(e1.graph) == 40
    ids = e1.records.ids()
    e1.delete(ids[:5])  # after the snapshot, then "crash"
    assert len(e1.graph) == 35
    e1.records.close()
    e2 = Engine(s, encoder)  # snapshot (40) + replayed deletes
    assert len(e2.graph) == 35 and ids[0] not in e2.graph and ids[10] in e2.graph
    e2.close()
    newest = e2.snapshots.versions()[0]
    (newest.path / "graph.varr").write_bytes(b"not a graph")
    e3 = Engine(s, encoder)  # a damaged version is refused; the one before it serves, the deletes replayed
    assert len(e3.graph) == 35 and ids[10] in e3.graph and ids[0] not in e3.graph
    assert e3.recovery["refused"] and e3.recovery["snapshot"] != newest.name
    e3.records.close()


def test_bm25_is_transactional_with_the_records(fresh_engine, catalog_dir):
    ingest_file(fresh_engine, catalog_dir / "catalog.jsonl", progress=False, limit=60)
    rows = {r.iid: r for r in fresh_engine.records.iter_rows(with_vectors=False)}
    word = Counter(r.doc["title"].split()[0] for r in rows.values()).most_common(1)[0][0]  # a brand
    hits = fresh_engine.records.bm25(word, 100)
    want = {i for i, r in rows.items() if word.casefold() in r.doc["title"].casefold().split()}
    assert {i for i, _ in hits} >= want and want
    scores = [s for _, s in hits]
    assert scores == sorted(scores, reverse=True) and scores[0] > 0
    victim = rows[hits[0][0]].id
    fresh_engine.delete([victim])
    assert hits[0][0] not in {i for i, _ in fresh_engine.records.bm25(word, 100)}
    assert fresh_engine.records.bm25("the of and", 10) == []  # stopwords only: nothing to match, no error
    assert fresh_engine.records.bm25('"); DROP TABLE products; --', 10) == []


def test_hybrid_search_uses_and_explains_every_signal(engine):
    engine.settings.search.calibration = "off"  # the configured fusion weights (an untuned catalogue ranks at the floor)
    try:
        res = engine.search(SearchRequest(text="puma sports shoes for men", k=5, explain=True))
    finally:
        engine.settings.search.calibration = "auto"
    assert not {"graph", "bm25"} & set(res.degraded)
    assert res.query["graph_terms"]["brand"] == ["puma"]
    top = res.results[0]
    assert top.title.casefold().startswith("puma") and top.category[-1] == "Sports Shoes"
    sig = top.explanation.signals
    assert {"vector", "bm25", "graph:brand", "graph:category", "graph:gender"} <= set(sig)
    assert top.score == pytest.approx(sum(v for k, v in sig.items() if k in (
        "vector", "bm25") or k.startswith("graph:")), abs=1e-4)
    assert top.explanation.vector_score == pytest.approx(sig["text->fused"], abs=1e-5)


def test_a_tuned_search_explains_only_its_page_and_skips_a_space_of_no_weight(engine, monkeypatch):
    """A search ranks a pool of a few hundred candidates for every page; only the returned hits are
    explained (each explanation still adds up to its score), and a space the catalogue's mix gives
    no weight (here the text tower's own) is neither searched nor scored."""
    from vitrine.search.calibration import Calibration
    from vitrine.search.read_context import ReadContext

    cal = Calibration(text_weights={"vector": 1.0, "bm25": 0.3, "graph:brand": 0.25, "graph:category": 0.4,
                                    "graph:gender": 0.1}, accepted=True, source="tuned")
    monkeypatch.setattr(ReadContext, "calibration", property(lambda self: cal))
    explained, native_searches = [], []
    signals, native = Pool.signals, engine.reader.state.native.index
    monkeypatch.setattr(Pool, "signals", lambda self, r: explained.append(r) or signals(self, r))
    monkeypatch.setattr(native, "search", lambda *a, **kw: native_searches.append(a) or type(native).search(native, *a, **kw))
    res = engine.search(SearchRequest(text="puma sports shoes for men", k=5, offset=5, explain=True))
    assert res.pool > 50 and len(res.results) == 5 and not res.degraded
    assert len(explained) == 5 and native_searches == []
    assert any(k.startswith("graph:") for h in res.results for k in h.explanation.signals)
    for h in res.results:
        sig = h.explanation.signals
        assert "native" not in sig and "vector" in sig
        assert h.score == pytest.approx(sum(v for k, v in sig.items() if "->" not in k), abs=1e-5)


def test_a_tuned_mix_without_the_shared_space_runs_no_adapter_and_ranks_as_the_full_pool(engine, subset_rows,
                                                                                       monkeypatch):
    """The twin case: a mix that gives the shared space no weight ranks text without the adapter
    (the native space retrieves in its place), with the same top hits as the same weights over the
    pool that has the shared-space retriever too; each hit's ``native`` part is the brute-force
    cosine of the two texts' native vectors, and each explanation adds up to its score."""
    from vitrine.search import fusion
    from vitrine.search.calibration import Calibration
    from vitrine.search.read_context import ReadContext

    weights = {"native": 1.0, "bm25": 0.3, "graph:category": 0.5, "graph:gender": 0.2}
    cal = Calibration(text_weights=weights, accepted=True, source="tuned")
    monkeypatch.setattr(ReadContext, "calibration", property(lambda self: cal))
    rd, qe, embed = engine.reader, engine.query_encoder, engine.encoder.embed
    adapter_calls = []
    monkeypatch.setattr(engine.encoder, "embed", lambda *a, **kw: adapter_calls.append(a) or embed(*a, **kw))
    texts = [f"{r['gender']} {r['articleType']} {r['baseColour']} lean-check" for r in subset_rows[70:78]]
    got = [engine.search(SearchRequest(text=t, k=5, explain=True, use_intent=False)) for t in texts]
    assert adapter_calls == []
    same = 0
    for t, r in zip(texts, got):
        assert r.results and not r.degraded
        nq = qe.native(t)
        iids = [rd.state.records.get(h.id).iid for h in r.results]
        for h, iid in zip(r.results, iids):
            sig = h.explanation.signals
            assert sig["native"] == pytest.approx(float(rd.state.native.index.get([iid])[0] @ nq), abs=1e-5)
            assert h.score == pytest.approx(sum(v for k, v in sig.items() if "->" not in k), abs=1e-5)
        full = fusion.build_pool(rd, {"text": qe.text([t])[0]}, t, 5, None, native_q=nq, depth=100)
        same += iids == [i for i, _, _ in fusion.fuse_weighted(full, weights, 5)]
    assert same >= len(texts) - 1  # a candidate only the shared space found may rarely rank in


def test_fusion_switches(engine, subset_rows):
    q = SearchRequest(text="women red heels", k=10, explain=True)
    before = engine.settings.model_copy(deep=True)
    try:
        engine.settings.search.fusion = "off"
        plain = engine.search(q)
        assert all(set(h.explanation.signals) == {"text->fused"} for h in plain.results)
        engine.settings.search.fusion = "weighted"
        w = engine.search(q)
        engine.settings.search.fusion = "rrf"
        engine.settings.search.fusion_signals = ["bm25"]
        b = engine.search(q)
        assert not any(k.startswith("graph:") for h in b.results for k in h.explanation.signals)
    finally:
        engine.settings.search.fusion, engine.settings.search.fusion_signals = before.search.fusion, before.search.fusion_signals
    want = {r["id"] for r in subset_rows if r["gender"] == "Women" and r["baseColour"] == "Red"
            and r["articleType"] == "Heels"}
    got_w = [h.id for h in w.results][:len(want)]
    assert want and set(got_w) == want  # the graph puts every red women's heel first


def test_filters_still_bind_hybrid_search(engine):
    res = engine.search(SearchRequest(text="puma shoes", k=10, filters=Filters(gender="Women")))
    assert res.results and all(h.attributes["gender"] == "Women" for h in res.results)


def test_cli_graph_check_and_make_queries(tmp_path, all_rows, data):
    from click.testing import CliRunner

    from vitrine.cli.app import main

    r = CliRunner().invoke(main, ["graph", "check"])
    assert r.exit_code == 0, r.output
    assert "89 article types, 0 problems" in r.output
    out = tmp_path / "attr.jsonl"
    r = CliRunner().invoke(main, ["make-queries", "--split", "val", "--n", "60", "--out", str(out)])
    assert r.exit_code == 0, r.output
    qs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(qs) == 60
    by_id = {x["id"]: x for x in all_rows}
    for q in qs:  # relevant = every product with all the attributes the query names
        a = q["attributes"]
        assert q["relevant"]
        for pid in list(q["relevant"])[:5]:
            row = by_id[pid]
            assert row["articleType"] == a["articleType"]
            if "gender" in a:
                assert row["gender"] == a["gender"]
            if "brand" in a:
                assert data.brands.from_title(row["productDisplayName"]) == a["brand"]
    out2 = tmp_path / "words.jsonl"
    r = CliRunner().invoke(main, ["make-queries", "--kind", "words", "--split", "val", "--n", "20", "--out", str(out2)])
    assert r.exit_code == 0, r.output
    for q in map(json.loads, out2.read_text().splitlines()):
        for pid in q["relevant"]:
            title = by_id[pid]["productDisplayName"].casefold()
            assert all(w in title for w in q["words"])


@given(st.lists(st.tuples(st.floats(-1, 1, allow_nan=False), st.floats(0, 30, allow_nan=False),
                          st.dictionaries(st.sampled_from(["graph:category", "graph:colour", "graph:brand"]),
                                          st.sampled_from([0.0, 0.5, 1.0]), max_size=3)),
                min_size=0, max_size=60),
       st.integers(1, 20))
@settings(max_examples=150, deadline=None)
def test_weighted_fusion_head_equals_the_full_ranking_head(rows, k):
    """fuse(limit=k) scores only totals and explains the best k: it must return exactly the
    head of the full ranking, with the same scores and explanations."""
    pool = Pool.of(dict(enumerate(rows)), QueryTerms())
    weights = {"vector": 1.0, "bm25": 0.3, "graph:category": 0.4, "graph:colour": 0.2, "graph:brand": 0.25}
    full = fuse_weighted(pool, weights)
    assert fuse_weighted(pool, weights, k) == full[:k]
    assert [s for _, s, _ in full] == sorted((s for _, s, _ in full), reverse=True)


def _reference_fusion(rows, weights, method, rrf_k):
    """Fusion one candidate at a time over plain dicts (the pool before it became arrays)."""
    bmax = max((b for _, b, _ in rows.values()), default=0.0)
    sig = {}
    for i, (v, b, g) in rows.items():
        s = {"vector": v}
        if b > 0 and bmax > 0:
            s["bm25"] = b / bmax
        s.update({name: g[name] for name in GRAPH_SIGNALS if g.get(name, 0.0) != 0.0})  # the scorer's order
        sig[i] = s
    if method == "weighted":
        out = []
        for i, s in sig.items():
            contrib = {n: weights.get(n, 0.0) * x for n, x in s.items()}
            contrib = {n: c for n, c in contrib.items() if c != 0.0 or n == "vector"}
            out.append((i, sum(contrib.values()), contrib))
        return sorted(out, key=lambda t: (-t[1], t[0]))
    contrib = {i: {} for i in sig}
    for name in sorted({n for s in sig.values() for n in s}):
        w = weights.get(name, 0.0)
        if w == 0.0:
            continue
        have = sorted((i for i, s in sig.items() if s.get(name, 0.0) > 0 or name == "vector"),
                      key=lambda i: (-sig[i].get(name, 0.0), -sig[i]["vector"], i))
        for rank, i in enumerate(have, start=1):
            contrib[i][name] = w / (rrf_k + rank)
    out = [(i, sum(c.values()), c) for i, c in contrib.items()]
    return sorted(out, key=lambda t: (-t[1], -sig[t[0]]["vector"], t[0]))


@given(st.dictionaries(st.integers(0, 10_000),
                       st.tuples(st.floats(-1, 1, allow_nan=False), st.sampled_from([0.0, 0.5, 3.0, 7.25]),
                                 st.dictionaries(st.sampled_from(["graph:category", "graph:proximity", "graph:brand",
                                                                  "graph:colour", "graph:gender"]),
                                                 st.sampled_from([0.0, 0.125, 0.5, 1.0]), max_size=4)),
                       max_size=40),
       st.sampled_from(["weighted", "rrf"]))
@settings(max_examples=200, deadline=None)
def test_array_fusion_equals_fusing_one_candidate_at_a_time(rows, method):
    """The numpy pool fuses exactly as the per-candidate reference: same order (ties included),
    same scores, same explanations."""
    weights = {"vector": 1.0, "bm25": 0.3, "graph:category": 0.4, "graph:proximity": 0.2, "graph:colour": 0.2,
               "graph:brand": 0.25, "graph:gender": -0.1}
    got = fuse(Pool.of(rows), method, weights=weights, rrf_k=10.0)
    want = _reference_fusion(rows, weights, method, 10.0)
    assert [i for i, _, _ in got] == [i for i, _, _ in want]
    assert [s for _, s, _ in got] == [s for _, s, _ in want]
    assert [c for _, _, c in got] == [c for _, _, c in want]


@given(st.lists(st.integers(0, 500), unique=True, max_size=40), st.lists(st.integers(-5, 600), max_size=40))
@settings(max_examples=150, deadline=None)
def test_bm25_get_many_matches_get(ids, keys):
    scores = BM25Scores(np.array(sorted(ids), dtype=np.int64), np.arange(len(ids), dtype=np.float64) + 0.5)
    assert scores.get_many(keys) == [scores.get(k, 0.0) for k in keys]


def test_a_graph_saved_with_product_nodes_is_still_read(subset_graph, subset_rows, data, tmp_path):
    """Format 1 (snapshots written before products became rows): node-link JSON with a node per
    product, its facts as attributes and an edge to each value; read, its products become rows."""
    import hashlib

    import networkx as nx

    old = subset_graph.g.copy()
    old.graph["format"] = 1
    for r in subset_rows:
        f = subset_graph.facts_of(str(r["id"]))
        node = f"product:{f.pid}"
        old.add_node(node, kind="product", iid=f.iid, **{k: v for k, v in f.__dict__.items()
                                                         if k not in ("iid", "pid") and v is not None})
        old.add_edge(node, subset_graph.category_node(f.category), key="is_a")
    raw = json.dumps(nx.node_link_data(old, edges="edges")).encode()
    path = tmp_path / "graph.json"
    path.write_bytes(raw)
    back = ProductGraph.load(path, data, hashlib.sha256(raw).hexdigest())
    assert not any(n.startswith("product:") for n in back.g.nodes)
    assert len(back) == len(subset_graph) and all(
        back.facts_of(str(r["id"])) == subset_graph.facts_of(str(r["id"])) for r in subset_rows)
    assert back.products_with("category", ["Footwear"]) == subset_graph.products_with("category", ["Footwear"])
