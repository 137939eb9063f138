"""The floor (native text space), pseudo-queries and `vitrine tune`, on a real catalogue subset."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest

from vitrine.evals import pseudo_queries as pq
from vitrine.metrics import mrr_at_k, ndcg_at_k, recall_at_k
from vitrine.search import calibration, fusion
from vitrine.search.engine import Engine
from vitrine.search.models import product_text
from vitrine.search.models import Product, SearchRequest


@pytest.fixture(scope="module")
def tuned_dir(settings_factory, encoder, catalog_dir, tmp_path_factory):
    """A data dir of the subset, tuned once (small pseudo-query counts)."""
    from vitrine.evals.tuning import tune
    from vitrine.ingest.catalog import ingest_file

    d = tmp_path_factory.mktemp("tuned")
    eng = Engine(settings_factory(d), encoder)
    ingest_file(eng, catalog_dir / "catalog.jsonl", progress=False)
    res = tune(eng, counts={"title": 120, "category": 40, "brand_type": 20, "attributes": 80}, slot_queries=20)
    eng.close()
    return d, res


def _docs(eng: Engine) -> list[dict]:
    return [{**r.doc, "id": r.id} for r in eng.records.iter_rows(with_vectors=False)]


def _native_brute(eng: Engine, text: str, k: int) -> list[tuple[str, float]]:
    """The text tower's cosine ranking of every product's text, computed from scratch."""
    rows = list(eng.records.iter_rows(with_vectors=False))
    feats = eng.encoder.text_features([product_text(Product.model_validate(r.doc)) for r in rows])
    vecs = feats / np.linalg.norm(feats, axis=1, keepdims=True)
    q = eng.query_encoder.text_features([text])[0]
    q = q / np.linalg.norm(q)
    sc = vecs @ q
    order = np.argsort(-sc, kind="stable")[:k]
    return [(rows[i].id, float(sc[i])) for i in order]


def test_untuned_text_ranking_is_the_native_cosine_ranking(engine):
    assert engine.calibration.is_floor and engine.calibration.source == "floor"
    assert not engine.slot_filters_on()
    queries = [q.text for q in pq.generate(_docs(engine), counts={"title": 8, "category": 4, "attributes": 4})
               if q.text][:16]
    for text in queries:
        got = engine.search(SearchRequest(text=text, k=10, explain=True))
        want = _native_brute(engine, text, 10)
        got_scores = [h.score for h in got.results]
        assert np.allclose(got_scores, [s for _, s in want], atol=1e-4), text
        # same products up to ties of equal score
        assert {h.id for h in got.results if h.score > want[-1][1] + 1e-4} <= {i for i, _ in want}
        assert all(set(h.explanation.signals) == {"native"} for h in got.results)


def test_photo_queries_keep_the_shared_space(engine, catalog_dir):
    photo = next((catalog_dir / "images").iterdir()).read_bytes()
    res = engine.search(SearchRequest(k=5, explain=True), image=photo)
    assert res.results and "image->image" in res.results[0].explanation.signals
    both = engine.search(SearchRequest(text="shirt", k=5, explain=True), image=photo)
    assert "native" not in both.results[0].explanation.signals  # photo + text: configured weights


def test_native_vectors_persist_and_backfill(fresh_engine, settings_factory, encoder, catalog_dir):
    from vitrine.ingest.catalog import ingest_file

    ingest_file(fresh_engine, catalog_dir / "catalog.jsonl", progress=False, limit=60)
    assert len(fresh_engine.native) == len(fresh_engine) == 60
    v = fresh_engine.native.index.get([1])[0]
    fresh_engine.close()
    again = Engine(settings_factory(fresh_engine.data_dir), encoder)
    assert again.recovery["snapshot"] and len(again.native) == 60
    assert np.allclose(again.native.index.get([1])[0], v)
    again.close()
    # a store from before native vectors: none stored, no snapshot -> filled in from the texts
    with sqlite3.connect(fresh_engine.data_dir / "records.sqlite") as c:
        c.execute("UPDATE products SET vec_native=NULL")
    for p in (fresh_engine.data_dir / "index").glob("v*"):
        for f in p.iterdir():
            f.unlink()
        p.rmdir()
    old = Engine(settings_factory(fresh_engine.data_dir), encoder)
    assert len(old.native) == 60 and np.allclose(old.native.index.get([1])[0], v, atol=1e-3)
    old.records.close()


def test_pseudo_queries_split_by_source():
    docs = [{"id": str(i), "title": f"Acme Red Cotton Shirt Model {i}", "brand": "Acme",
             "category": ["Clothing", "Shirts" if i % 2 else "Trousers"],
             "attributes": {"colour": "Red" if i % 3 else "Blue", "year": "2012"}} for i in range(60)]
    qs = pq.generate(docs, counts={"title": 40, "category": 5, "brand_type": 5, "attributes": 10})
    kinds = {q.kind for q in qs}
    assert {"title", "category", "brand_type", "attributes"} <= kinds
    assert pq.facet_keys(docs) == ["colour"]  # year is numeric, not a facet
    fit = {q.source for q in qs if q.kind == "title" and q.split == "fit"}
    held = {q.source for q in qs if q.kind == "title" and q.split == "heldout"}
    assert fit and held and not fit & held
    for q in qs:
        if q.kind == "attributes":
            for d in docs:  # relevant = exactly the products holding every facet value named
                holds = all((d["brand"] if k == "brand" else d["attributes"].get(k)) == v
                            for k, v in q.meta["facets"].items()) and q.source.endswith("|" + d["category"][-1])
                assert holds == (d["id"] in q.relevant), (q.text, d)
                if holds:
                    assert all(v.casefold() in q.text.casefold() for v in q.meta["facets"].values())


def test_attribute_pseudo_queries_name_up_to_three_facets_and_every_holder_is_relevant():
    """Attribute pseudo-queries as the attribute protocol defines relevance: every product that
    holds all the named facet values (in that category), checked against brute force over the
    catalogue; one, two and three values named."""
    colours, genders, usages = ("Red", "Blue", "Navy Blue"), ("Men", "Women"), ("Casual", "Formal", "Sports")
    docs = [{"id": str(i), "title": f"Acme {colours[i % 3]} Shoe {i}", "brand": ("Acme", "Zed")[i % 2],
             "category": ["Footwear", ("Casual Shoes", "Heels")[(i // 7) % 2]],
             "attributes": {"colour": colours[i % 3], "gender": genders[(i // 3) % 2], "usage": usages[(i // 5) % 3]}}
            for i in range(240)]
    qs = [q for q in pq.generate(docs, counts={"title": 0, "category": 0, "brand_type": 0, "attributes": 90})
          if q.kind == "attributes"]
    sizes = [len(q.meta["facets"]) for q in qs]
    # 20 one-value combinations exist (10 values x 2 leaves): sizes 2 and 3 take the rest
    assert len(qs) == 90 and len({q.source for q in qs}) == 90
    assert 10 <= sizes.count(1) <= 20 and min(sizes.count(2), sizes.count(3)) >= 25
    for q in qs:
        leaf = q.source.rsplit("|", 1)[1]
        brute = {d["id"] for d in docs if d["category"][-1] == leaf and all(
            (d["brand"] if k == "brand" else d["attributes"].get(k)) == v for k, v in q.meta["facets"].items())}
        assert set(q.relevant) == brute and brute, q.text
        assert all(v.casefold() in q.text.casefold() for v in q.meta["facets"].values())


def test_attribute_pseudo_queries_speak_the_graphs_other_words_half_the_time(engine):
    """With the graph's phrasings a value or the category is said in other words about half the
    time ("ladies sneakers"), relevance unchanged (every holder of the values); without them the
    queries are exactly what they were. The graph offers words only for values the catalogue holds."""
    phrasings = engine.graph.phrasings()
    assert "sneakers" in phrasings["casual shoes"] and "ladies" in phrasings["women"]
    held = {c.casefold() for r in engine.records.iter_rows(with_vectors=False) for c in r.doc.get("category") or []}
    named = {c.casefold() for c in engine.graph_data.vocabulary["category"]}
    assert named - held and {c for c in named if c in phrasings} == named & held  # categories: only those held
    docs = [{"id": str(i), "title": f"Acme Shoe {i}", "category": ["Footwear", ("Casual Shoes", "Heels")[i % 2]],
             "attributes": {"gender": ("Men", "Women")[(i // 2) % 2], "usage": ("Casual", "Sports")[(i // 4) % 2]}}
            for i in range(200)]
    counts = {"title": 0, "category": 0, "brand_type": 0, "attributes": 40}
    plain = pq.generate(docs, counts=counts)
    assert [q.text for q in plain] == [q.text for q in pq.generate(docs, counts=counts, phrasings=None)]
    said = pq.generate(docs, counts=counts, phrasings=phrasings)
    assert [q.relevant for q in said] == [q.relevant for q in plain]
    other = [q for q in said if not all(v.casefold() in q.text.casefold() for v in q.meta["facets"].values())
             or not any(c in q.text.casefold() for c in ("casual shoe", "heel"))]
    assert 0.3 * len(said) <= len(other) <= 0.95 * len(said)
    words = {w for ws in phrasings.values() for w in ws}
    assert all(any(w in q.text.casefold() for w in words) for q in other)


def test_taxonomy_queries_name_nodes_in_other_words():
    """The ``taxonomy`` kind: a node a category maps to (or an ancestor below the root), only where
    its name is not the category's own words; relevant = every product mapped under it (holding
    the facet value when one is named); off unless counted."""
    docs = [{"id": str(i), "title": f"item {i}", "category": ["Apparel", leaf],
             "attributes": {"colour": colour}}
            for i, (leaf, colour) in enumerate([("Tshirts", "Blue"), ("Tshirts", "Red"), ("Shirts", "Blue"),
                                                ("Sandals", "Red"), ("Shoes", "Blue")] * 4)]
    tax = {"Tshirts": ["Apparel & Accessories", "Clothing", "Shirts & Tops"],
           "Shirts": ["Apparel & Accessories", "Clothing", "Shirts & Tops"],
           "Sandals": ["Apparel & Accessories", "Shoes", "Sandals"], "Shoes": ["Apparel & Accessories", "Shoes"]}
    assert not [q for q in pq.generate(docs, taxonomy=tax) if q.kind == "taxonomy"]
    qs = [q for q in pq.generate(docs, taxonomy=tax, counts={"taxonomy": 50}) if q.kind == "taxonomy"]
    nodes = {q.source.split("|")[0] for q in qs}
    # "Sandals" and "Shoes" name their own categories' words: only the other nodes are queried
    assert nodes <= {"t:Apparel & Accessories > Clothing", "t:Apparel & Accessories > Clothing > Shirts & Tops",
                     "t:Apparel & Accessories > Shoes"} and nodes
    by_leaf = {d["id"]: d for d in docs}
    for q in qs:
        node = tuple(q.source.split("|")[0][2:].split(" > "))
        want = {d["id"] for d in docs if tuple(tax[d["category"][-1]][:len(node)]) == node}
        if "|" in q.source:
            k, v = q.source.split("|")[1].split("=")
            want = {i for i in want if by_leaf[i]["attributes"][k] == v}
        assert set(q.relevant) == want, q


def test_slot_check_sees_every_kind():
    from vitrine.evals.tuning import slot_sample

    qs = [pq.PseudoQuery(kind, {"1": 1.0}, "heldout", text=f"{kind} {i}")
          for kind, n in (("title", 50), ("category", 4), ("attributes", 30)) for i in range(n)]
    got = slot_sample(qs, np.arange(len(qs)), 20)
    kinds = [q.kind for q in got]
    assert len(got) == 20 and kinds.count("category") == 4 and kinds.count("title") == 8 == kinds.count("attributes")


def test_tuning_metrics_match_brute_force(engine):
    from vitrine.evals.tuning import SIGNALS, build_pools, per_query

    queries = [q for q in pq.generate(_docs(engine), counts={"title": 6, "category": 3, "attributes": 3, "shopper": 6}) if q.text]
    pools = build_pools(engine, queries)
    w = np.array([0.5 if s in ("native", "bm25") else 0.2 for s in SIGNALS])
    got = per_query(pools, w)
    weights = dict(zip(SIGNALS, w.tolist()))
    iid_to_id = {r.iid: r.id for r in engine.records.iter_rows(with_vectors=False)}
    for i, q in enumerate(queries):
        qv = {"text": engine.query_encoder.text([q.text])[0]}
        pool = fusion.build_pool(engine.reader, qv, q.text, 10, None, signals=("bm25", "graph"),
                                 native_q=engine.query_encoder.native(q.text))
        ranked = [iid_to_id[iid] for iid, _, _ in fusion.fuse_weighted(pool, weights, limit=10)]
        assert got["nDCG@10"][i] == pytest.approx(ndcg_at_k(ranked, q.relevant, 10, "linear"), abs=1e-9)
        assert got["R@10"][i] == pytest.approx(recall_at_k(ranked, q.relevant, 10), abs=1e-9)
        assert got["MRR@10"][i] == pytest.approx(mrr_at_k(ranked, q.relevant, 10), abs=1e-9)


def test_robust_objective_measures_each_pool_against_its_own_floor(engine):
    """The robust objective caches each pool's floor; a subset made, used and freed in a loop (as
    one fit per sample does) must never get another subset's floor through a reused array id."""
    from vitrine.evals.tuning import Robust, build_pools, kind_means, weights_vec

    queries = [q for q in pq.generate(_docs(engine), counts={"title": 12, "category": 6, "attributes": 6, "shopper": 6}) if q.text]
    pools = build_pools(engine, queries)
    floor_w = weights_vec(calibration.FLOOR_WEIGHTS)
    robust = Robust(floor_w, 3.0)
    rng = np.random.default_rng(0)
    for _ in range(30):
        sub = pools.subset(np.sort(rng.choice(len(queries), size=len(queries) // 2, replace=False)))
        assert robust.floor_of(sub) == kind_means(sub, floor_w)
        del sub


@pytest.mark.slow
def test_shop_queries_join_the_fit_with_their_share(engine, tmp_path):
    """`vitrine tune --queries FILE`: the shop's judged queries (eval JSONL) fit beside the
    pseudo-queries as one kind per file, split by text, with LABELLED_SHARE of the objective
    (checked against a by-hand weighted mean); the report and tuning.json say so."""
    from vitrine.cli.tune import labelled_queries
    from vitrine.evals.tuning import LABELLED_SHARE, build_pools, labelled_weights, objective, per_query, tune

    docs = _docs(engine)
    shop = [q for q in pq.generate(docs, counts={"title": 0, "category": 0, "brand_type": 0, "attributes": 30},
                                   seed=5) if q.text]
    f = tmp_path / "shop-logs.jsonl"
    f.write_text("\n".join(json.dumps({"qid": f"s{i}", "text": q.text, "relevant": q.relevant})
                           for i, q in enumerate(shop)) + "\n")
    lab = labelled_queries([f])
    assert len(lab) == len(shop) and {q.kind for q in lab} == {"shop:shop-logs"}
    assert {q.split for q in lab} == {"fit", "heldout"}
    same = {}
    for q in lab:  # one text, one side
        assert same.setdefault(q.text.casefold(), q.split) == q.split

    gen = [q for q in pq.generate(docs, counts={"title": 8, "category": 4, "brand_type": 0, "attributes": 4})
           if q.text]
    qs = gen + lab
    kw = labelled_weights(qs, LABELLED_SHARE)
    gen_kinds = {q.kind for q in gen}
    assert kw["shop:shop-logs"] == pytest.approx(len(gen_kinds) * LABELLED_SHARE / (1 - LABELLED_SHARE))
    pools = build_pools(engine, qs)
    pools.kind_weights = kw
    w = np.zeros(pools.x.shape[2])
    w[0], w[2] = 1.0, 0.5
    nd = per_query(pools, w)["nDCG@10"]
    kinds = [q.kind for q in qs]
    means = {k: np.mean([nd[i] for i in range(len(qs)) if kinds[i] == k]) for k in set(kinds)}
    gen_mean = np.mean([means[k] for k in gen_kinds])
    assert objective(pools, w) == pytest.approx((1 - LABELLED_SHARE) * gen_mean + LABELLED_SHARE * means["shop:shop-logs"])

    res = tune(engine, counts={"title": 30, "category": 10, "brand_type": 5, "attributes": 20}, slot_queries=0,
               save=False, labelled=lab)
    r = res.report["labelled"]
    assert r["queries"]["shop:shop-logs"]["fit"] + r["queries"]["shop:shop-logs"]["heldout"] == len(lab)
    assert set(r["heldout"]) == {"native_only (floor)", "configured_defaults", "fitted"}
    if res.calibration.accepted:  # never accepted while losing to the floor on the shop's held-out queries
        assert r["heldout"]["fitted"]["objective"] >= r["heldout"]["native_only (floor)"]["objective"]
    assert res.calibration.summary["labelled"]["queries"] == r["queries"]


def test_tune_serves_the_mean_of_one_fit_per_sample(engine):
    """Each sample of pseudo-queries (seeds 0, 1, 2) is fitted apart, and the mix served is the mean
    of the three, each scaled to sum 1: the same as three one-sample tunes averaged by hand, made
    with the same signals left out. A signal the refit left out weighs 0 in every sample's mix, in
    the mean and in what serves (it kept weight from a start of the descent before)."""
    from vitrine.evals.tuning import tune, weights_vec

    counts = {"title": 30, "category": 10, "brand_type": 5, "attributes": 20}
    # the shared space left out by hand, with whatever the refit leaves out (a loss of MIN_HURT or more)
    res = tune(engine, counts=counts, slot_queries=0, save=False, samples=3, leave_out=("vector",))
    left = ("vector", *res.report["signals_left_out"])
    for sig in left:
        assert res.report["fitted"].get(sig, 0.0) == 0.0 and res.report["guarded"].get(sig, 0.0) == 0.0
        assert res.calibration.text_weights.get(sig, 0.0) == 0.0
        assert all(m.get(sig, 0.0) == 0.0 for m in res.report["samples"])
    alone = []
    for seed in range(3):
        w = weights_vec(tune(engine, counts=counts, slot_queries=0, save=False, samples=1, seed=seed,
                             leave_out=left).report["fitted"])
        alone.append(w / w.sum())
    assert len({tuple(np.round(w, 4)) for w in alone}) > 1  # the samples' fits differ: the mean is not one of them
    np.testing.assert_allclose([weights_vec(m) for m in res.report["samples"]], alone, atol=1e-4)
    np.testing.assert_allclose(weights_vec(res.report["fitted"]), np.mean(alone, axis=0), atol=1e-9)
    assert res.report["queries"]["total"] > max(30 + 10 + 5 + 20, 3 * 40)  # three samples' queries


@pytest.mark.slow
def test_tune_writes_and_engine_loads(tuned_dir, settings_factory, encoder):
    d, res = tuned_dir
    saved = json.loads((d / calibration.FILE).read_text())
    assert saved["catalogue"]["count"] == 240 and saved["model_key"] == encoder.model_key
    r = res.report
    floor_ho = r["heldout"]["native_only (floor)"]["objective"]
    assert res.calibration.accepted == (r["heldout"]["fitted"]["objective"] > floor_ho + r["margin"]
                                        and not r["kind_guard"].get("losing"))
    if not res.calibration.accepted:
        assert res.calibration.is_floor
    eng = Engine(settings_factory(d), encoder)
    try:
        cal = eng.calibration
        assert cal.source == "tuned" and cal.text_weights == res.calibration.text_weights
        text = "blue shirt"
        hits = eng.search(SearchRequest(text=text, k=5, explain=True)).results
        assert hits
        if not cal.is_floor:
            used = {s for h in hits for s in h.explanation.signals if "->" not in s}
            assert used <= set(cal.text_weights) | {"vector", "native"}
    finally:
        eng.records.close()


@pytest.mark.slow
def test_stale_tuning_is_ignored(tuned_dir, settings_factory, encoder, tmp_path):
    import shutil

    d, _ = tuned_dir
    copy = tmp_path / "copy"
    shutil.copytree(d, copy)
    eng = Engine(settings_factory(copy, tune_max_drift=0.1), encoder)
    try:
        assert eng.calibration.source == "tuned"
        ids = eng.records.ids()[:30]  # 30 of 240 changed: more than 10%
        eng.delete(ids)
        cal = eng.calibration
        assert cal.source.startswith("stale") and cal.is_floor
        assert not eng.slot_filters_on()
    finally:
        eng.records.close()
    # a file for another model is ignored too
    other = calibration.load(copy, eng.records.__class__(copy / "records.sqlite"), eng.store_id, "other-model", 1.0)
    assert other.source.startswith("stale")


@pytest.mark.slow
def test_train_gate_on_data_installs_by_hot_swap(tuned_dir, settings_factory, encoder, tmp_path):
    import shutil

    from vitrine.training.gate_data import train_on_data
    from vitrine.training.pairs import catalogue_pairs
    from vitrine.training.recipe import GateRecipe

    d, _ = tuned_dir
    copy = tmp_path / "gate"
    shutil.copytree(d, copy)
    eng = Engine(settings_factory(copy), encoder)
    try:
        train, val, info = catalogue_pairs(eng)
        assert info["train_products"] + info["heldout_products"] == info["products_with_photos"] == 240
        assert len(train.image) == info["train_products"] and len(val.image) == info["heldout_products"]
        # every pseudo-query's own product carries its key: it is a positive of its query
        assert (train.product_keys[train.query_subset, train.query_rows] == train.query_key).all()
        before = eng.model_key
        summary = train_on_data(eng, tmp_path / "adapter", GateRecipe(kind="mlp", epochs=2, patience=1), retune=True)
        assert (tmp_path / "adapter" / "config.json").is_file()
        if summary["installed"]:  # installed: the catalogue was re-tuned for the new shared space
            assert summary["swap"]["switched"] and eng.model_key != before and summary["tune"]
            assert eng.calibration.source == "tuned" and eng.calibration.model_key == eng.model_key
        else:  # 2 epochs on 200 pairs: below the serving aligner on held-out pairs, or refused by the canary
            assert eng.model_key == before and eng.calibration.source == "tuned"
            assert ("does not beat" in summary["decision"]) != ("swap" in summary and "recall" in summary["swap"]["reason"])
    finally:
        eng.close()


def test_domain_shift_systems_on_an_untuned_catalogue(engine, subset_rows):
    """On an untuned catalogue Vitrine's text ranking is the text tower's: the protocol's
    ``vitrine`` and ``text_tower`` figures agree (the floor), and every figure is a mean of
    per-query metrics."""
    from vitrine.evals.domain_shift import domain_queries, evaluate_catalogue

    queries = domain_queries(subset_rows, 20, 10, brand_fn=lambda t: t.split()[0] if t else None)
    assert {q["kind"] for q in queries} == {"attr", "words"}
    res = evaluate_catalogue(engine, queries)
    assert res["vitrine"]["nDCG@10"] == pytest.approx(res["text_tower"]["nDCG@10"], abs=0.02)
    for system in ("vitrine", "text_tower", "bm25"):
        assert 0.0 <= res[system]["nDCG@10"] <= 1.0 and set(res["by_kind"]) == {"attr", "words"}
