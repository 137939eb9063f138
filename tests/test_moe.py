"""The cross-modal MoE gate: routing, losses, statistics, persistence, and training on real features."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vitrine.encoders.adapters import create_adapter, load_adapter
from vitrine.errors import ModelError

from conftest import SOURCE


def small(**kw):
    cfg = dict(image_dim=12, text_dim=8, dim=6, width=16, hidden=16, experts=4, top_k=2) | kw
    torch.manual_seed(0)
    return create_adapter("moe", **cfg)


def test_top_k_routing_renormalised_and_exactly_k_experts():
    m = small(experts=5, top_k=2).eval()
    pi, pt = m._project(torch.randn(30, 12), torch.randn(30, 8))
    logits, weights, chosen = m._route(m._route_input(pi, pt, 0))
    assert (chosen.sum(1) == 2).all()
    assert torch.allclose(weights.sum(1), torch.ones(30), atol=1e-6)
    # the chosen experts are the router's two highest logits (no noise at eval)
    assert torch.equal(chosen, torch.zeros_like(chosen).scatter(1, logits.topk(2, dim=1).indices, True))
    # weights are the softmax restricted to those two, renormalised
    p = torch.softmax(logits, dim=1)
    want = torch.where(chosen, p, torch.zeros_like(p))
    assert torch.allclose(weights, want / want.sum(1, keepdim=True), atol=1e-6)


def test_one_query_short_path_equals_the_batched_route():
    """A single query must give what the same query gives inside a batch,
    choice bias included."""
    m = small(experts=6, top_k=2).eval()
    with torch.no_grad():
        m.route_bias.copy_(torch.tensor([0.5, -0.3, 0.0, 1.0, -1.0, 0.2]))
    x, t = torch.randn(9, 12), torch.randn(9, 8)
    with torch.inference_mode():
        batch = m(x, t)
        for i in range(9):
            one = m(x[i:i + 1], t[i:i + 1])
            assert torch.allclose(one.image, batch.image[i:i + 1], atol=1e-6)
            assert torch.allclose(one.text, batch.text[i:i + 1], atol=1e-6)
        for img, txt in ((x, t), (None, t), (x, None)):  # fused vectors: both, text only, photo only
            whole = m(img, txt).fused
            one = torch.cat([m(img[i:i + 1] if img is not None else None,
                               txt[i:i + 1] if txt is not None else None).fused for i in range(9)])
            assert torch.allclose(whole, one, atol=1e-5)
        # the bias decides which experts run, not how much they count
        pi, _ = m._project(x, None)
        logits, weights, chosen = m._route(m._route_input(pi, None, 0))
        want = torch.zeros_like(chosen).scatter(1, (logits + m.route_bias).topk(2, dim=1).indices, True)
        assert torch.equal(chosen, want)
        p = torch.where(chosen, torch.softmax(logits, 1), torch.zeros_like(logits))
        assert torch.allclose(weights, p / p.sum(1, keepdim=True), atol=1e-6)


def test_float16_query_precision_stays_close_and_follows_new_weights():
    """query_precision=float16: inference reads float16 copies of the projections and experts; one
    query equals the batch, both within float16 rounding of float32, and new weights (a load, a
    training step) are picked up."""
    m = small(experts=6, top_k=2, width=64, hidden=128, query_precision="float16").eval()
    x, t = torch.randn(20, 12), torch.randn(20, 8)
    with torch.inference_mode():
        for img, txt in ((x, t), (None, t), (x, None)):  # photo + text, text alone, photo alone
            want = m(img, txt).fused
            m.query_precision = "float32"
            ref = m(img, txt).fused
            m.query_precision = "float16"
            assert ((want * ref).sum(1) > 0.999).all()  # cosines of unit vectors
            for i in range(20):
                one = m(img[i:i + 1] if img is not None else None, txt[i:i + 1] if txt is not None else None).fused
                assert torch.allclose(one, want[i:i + 1], atol=1e-4)
    assert m._half.copies is not None and m._half.copies["0.0"][0].dtype == torch.float16
    other = small(experts=6, top_k=2, width=64, hidden=128)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p))
    m.load_state_dict(other.state_dict())
    assert m._half.copies is None  # the copies of the old weights are gone
    with torch.inference_mode():
        assert torch.allclose(m(x[:1], t[:1]).fused, m(x, t).fused[:1], atol=3e-3)
    m.train()
    assert m._half.copies is None
    with pytest.raises(ModelError, match="query_precision"):
        small(query_precision="int8")


def test_loss_free_balancing_evens_out_a_lopsided_router():
    """A router that sends nearly every token to expert 0: the per-step bias update moves towards
    the idle experts, and the calibration brings the load CV of these tokens under 0.1."""
    m = small(experts=4, top_k=1).eval()
    x, t = torch.randn(400, 12), torch.randn(400, 8)
    with torch.no_grad():
        m.router.bias.copy_(torch.tensor([3.0, 0.0, 0.0, 0.0]))
    before = m.routing_stats(x, t)
    assert before["load"][0] > 0.8
    m.after_step({"lone_load": torch.tensor(before["load"])})
    assert m.route_bias[0] < 0 and (m.route_bias[1:] > 0).all()
    res = m.calibrate_balance(x, t)
    after = m.routing_stats(x, t)
    assert res["load_cv_after"] == pytest.approx(after["load_cv"], abs=1e-3)
    assert after["load_cv"] <= 0.1 < before["load_cv"] and not after["dead_experts"]
    # balance="loss": no bias, nothing calibrated
    plain = small(experts=4, top_k=1, balance="loss")
    plain.after_step({"lone_load": torch.tensor([1.0, 0.0, 0.0, 0.0])})
    assert plain.calibrate_balance(x, t) == {} and not plain.route_bias.any()
    with pytest.raises(ModelError, match="balance"):
        small(balance="sinkhorn")
    # a gate saved before the choice bias existed still loads, with a zero bias
    old_state = {k: v for k, v in m.state_dict().items() if k != "route_bias"}
    fresh = small(experts=4, top_k=1)
    fresh.load_state_dict(old_state, strict=True)
    assert not fresh.route_bias.any()


def test_dynamic_k_uses_one_expert_for_confident_routes():
    m = small(experts=4, top_k=2, dynamic_k=True).eval()
    x = torch.randn(40, 12)
    with torch.no_grad():  # a threshold at the median top weight: half the routes are confident
        pi, _ = m._project(x, None)
        m.dynamic_threshold = float(torch.softmax(m.router(m._route_input(pi, None, 0)), 1).max(1).values.median())
    with torch.inference_mode():  # one query at a time agrees with the batch, confident or not
        whole = m(x, None).image
        assert torch.allclose(torch.cat([m(x[i:i + 1], None).image for i in range(40)]), whole, atol=1e-5)
    per_token = m.routing_stats(x, None)["experts_per_token"]
    assert 1.0 < per_token < 2.0  # some routes confident, some not
    m = small(experts=4, top_k=2, dynamic_k=True, dynamic_threshold=0.0).eval()
    stats = m.routing_stats(torch.randn(20, 12), torch.randn(20, 8))
    assert stats["experts_per_token"] == 1.0
    m2 = small(experts=4, top_k=2, dynamic_k=True, dynamic_threshold=1.01).eval()
    assert m2.routing_stats(torch.randn(20, 12), None)["experts_per_token"] == 2.0


def test_outputs_missing_modalities_and_light_path():
    m = small().eval()
    x, t = torch.randn(5, 12), torch.randn(5, 8)
    both = m(x, t)
    assert both.image.shape == both.text.shape == both.fused.shape == (5, 6)
    for v in (both.image, both.text, both.fused):
        assert torch.allclose(v.norm(dim=-1), torch.ones(5), atol=1e-5)
    photo_only = m(x, None)
    assert photo_only.text is None and torch.equal(photo_only.fused, photo_only.image)
    text_only = m(None, t)
    assert text_only.image is None and torch.equal(text_only.fused, text_only.text)
    w = m.photo_weight(both.image, both.text)
    assert ((w > 0) & (w < 1)).all()
    light = m.forward_light(None, t)
    assert torch.allclose(light.text.norm(dim=-1), torch.ones(5), atol=1e-5)
    assert not torch.allclose(light.text, text_only.text)  # no router: an even mix of experts
    with pytest.raises(ModelError):
        m(None, None)
    with pytest.raises(ModelError):
        m(torch.randn(2, 12), torch.randn(3, 8))
    with pytest.raises(ModelError, match="top_k"):
        small(experts=2, top_k=3)


def test_aux_losses_match_their_definitions():
    m = small(experts=4, top_k=1, balance_weight=1.0, z_weight=0.0).train()
    m.router_noise = False
    # brute force: Switch balance = E * sum_e (share of assignments to e) * (mean router prob of e)
    logits = []
    x, t = torch.randn(40, 12), torch.randn(40, 8)
    torch.manual_seed(1)
    out = m.training_forward(x, t)
    torch.manual_seed(1)
    pi, pt = m._project(x, t)
    lone = torch.rand(40) < m.cross_dropout
    for own, other, mod, ph in ((pi, pt, 0, m.placeholder[1]), (pt, pi, 1, m.placeholder[0])):
        oth = torch.where(lone[:, None], ph.expand(40, -1), other)
        img, txt = (own, oth) if mod == 0 else (oth, own)
        logits.append(m.router(torch.cat([img, txt, m.flag.weight[mod].expand(40, -1)], dim=-1)))
    lg = torch.cat(logits)
    p = torch.softmax(lg, dim=1)
    share = torch.zeros(4).index_add(0, lg.argmax(1), torch.ones(80)) / 80
    assert float(out.aux["balance"]) == pytest.approx(float(4 * (share * p.mean(0)).sum().detach()), rel=1e-4)
    assert float(out.aux["z"]) == pytest.approx(float(torch.logsumexp(lg, 1).pow(2).mean().detach()), rel=1e-4)
    out.aux["loss"].backward()
    assert m.router.weight.grad is not None and m.router.weight.grad.abs().sum() > 0
    # a product without a photo: its fused vector is its text alone
    hide = torch.tensor([True] + [False] * 39)
    o2 = m.training_forward(x, t, hide_image=hide)
    assert torch.allclose(o2.fused[0], o2.text[0])


def test_routing_stats_report_load_cv_entropy_and_dead_experts():
    m = small(experts=4, top_k=1).eval()
    with torch.no_grad():  # force every token to expert 2
        m.router.weight.zero_()
        m.router.bias.copy_(torch.tensor([0.0, 0.0, 5.0, 0.0]))
    s = m.routing_stats(torch.randn(10, 12), torch.randn(10, 8))
    assert s["load"] == [0.0, 0.0, 1.0, 0.0] and s["dead_experts"] == [0, 1, 3]
    assert s["load_cv"] == pytest.approx(np.sqrt(3), rel=1e-3) and s["tokens"] == 20
    assert 0 < s["entropy"] < s["max_entropy"] == round(np.log(4), 4)


def test_routing_stats_pairs_share_of_products_whose_photo_and_title_share_an_expert():
    m = small(experts=4, top_k=1, width=16).eval()
    x, t = torch.randn(10, 12), torch.randn(10, 8)
    with torch.no_grad():  # every token to expert 2: every product's photo and title share it
        m.router.weight.zero_()
        m.router.bias.copy_(torch.tensor([0.0, 0.0, 5.0, 0.0]))
    assert m.routing_stats(x, t, pairs=True)["pairs_sharing_an_expert"] == 1.0
    assert "pairs_sharing_an_expert" not in m.routing_stats(x, t)
    with torch.no_grad():  # the modality flag decides: photos to expert 0, titles to expert 1
        m.router.bias.zero_()
        m.flag.weight.zero_()
        m.flag.weight[0, 0] = m.flag.weight[1, 1] = 10.0
        m.router.weight[0, 32] = m.router.weight[1, 33] = 1.0  # router input = [photo, title, flag]
    s = m.routing_stats(x, t, pairs=True)
    assert s["pairs_sharing_an_expert"] == 0.0 and s["load"] == [0.5, 0.5, 0.0, 0.0]
    with pytest.raises(ModelError, match="as many photos as texts"):
        m.routing_stats(x, t[:5], pairs=True)


def test_routing_report_of_vitrine_eval_on_real_features(encoder, subset_rows):
    """`vitrine eval --protocol kagl-t2i/kagl-subcat` with the gate reports its routing on the split."""
    from vitrine.encoders.encoder import MultimodalEncoder
    from vitrine.evals import protocols as P
    from vitrine.evals.datasets import Catalog

    cat = Catalog.load(limit_ids={r["id"] for r in subset_rows})
    moe = create_adapter("moe", image_dim=encoder.towers.image_dim, text_dim=encoder.towers.text_dim, dim=32,
                         width=32, hidden=32, experts=4, top_k=2, towers_key=encoder.towers.key)
    rep = P.routing_report(MultimodalEncoder(encoder.towers, moe, cache=encoder.cache), cat, split="train",
                           progress=False)
    n = int(cat.split_mask("train").sum())
    assert rep["split"] == "train" and rep["products"] == n > 0 and rep["tokens"] == 2 * n
    assert sum(rep["load"]) == pytest.approx(1.0, abs=1e-3) and 0.0 <= rep["pairs_sharing_an_expert"] <= 1.0
    with pytest.raises(ModelError, match="router"):  # the shipped MLP has no router
        P.routing_report(MultimodalEncoder(encoder.towers, load_adapter("mlp"), cache=encoder.cache), cat,
                         split="train", progress=False)


def test_moe_roundtrip_through_the_adapter_factory(tmp_path):
    m = small(dynamic_k=True).eval()
    m.save_pretrained(tmp_path / "moe")
    cfg = json.loads((tmp_path / "moe" / "config.json").read_text())
    assert cfg["kind"] == "moe" and cfg["experts"] == 4 and cfg["top_k"] == 2 and cfg["weights_sha256"]
    b = load_adapter(tmp_path / "moe")
    x, t = torch.randn(4, 12), torch.randn(4, 8)
    assert torch.allclose(m(x, t).fused, b(x, t).fused, atol=5e-3)
    data = bytearray((tmp_path / "moe" / "model.safetensors").read_bytes())
    data[-3] ^= 0xFF
    (tmp_path / "moe" / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ModelError):
        load_adapter(tmp_path / "moe")


@pytest.fixture(scope="module")
def trained_moe(encoder, subset_rows):
    """A small MoE trained for a few epochs on real backbone features of the subset (180 products
    to train, 60 to validate)."""
    from vitrine.training.adapter import TrainConfig, evaluate_pairs, train_adapter
    from vitrine.training.pairs import PairSet

    rows = subset_rows[:240]
    photos = [(SOURCE / "images" / f"{r['id']}.jpg").read_bytes() for r in rows]
    img = encoder.image_features(photos)
    txt = encoder.text_features([r["productDisplayName"] for r in rows])
    titles = [r["productDisplayName"] for r in rows]
    group = np.array([titles.index(t) for t in titles])
    train, val = PairSet(img[:180], txt[:180], group[:180]), PairSet(img[180:], txt[180:], group[180:])
    m = create_adapter("moe", image_dim=img.shape[1], text_dim=txt.shape[1], dim=64, width=64, hidden=64,
                       experts=4, top_k=2, towers_key=encoder.towers.key)
    before = evaluate_pairs(m, val)["MRR@10"]
    res = train_adapter(m, train, val, TrainConfig(epochs=15, batch_size=64, patience=15, modality_dropout=0.1),
                        progress=False)
    return m, before, res, img, txt, val


def test_moe_learns_to_align_real_catalogue_features(trained_moe):
    """Titles find their photos far above chance, and every expert is used."""
    from vitrine.training.adapter import evaluate_pairs

    m, before, res, img, txt, val = trained_moe
    after = evaluate_pairs(m, val)
    assert after["MRR@10"] > max(0.25, 2 * before), (before, after)  # chance MRR@10 among 60 is ~0.05
    stats = m.routing_stats(torch.from_numpy(img), torch.from_numpy(txt), pairs=True)
    assert not stats["dead_experts"], stats
    # the shipped gate's figures, checked against brute force
    with torch.inference_mode():
        pi, pt = m(torch.from_numpy(img), None).image, m(None, torch.from_numpy(txt)).text
        assert stats["pair_cosine"] == pytest.approx(float((pi * pt).sum(-1).mean()), abs=1e-3)
        zi, zt = m._lone_logits(torch.from_numpy(img), None, 512), m._lone_logits(None, torch.from_numpy(txt), 512)
    p, q = torch.softmax(zi, -1), torch.softmax(zt, -1)
    kl = 0.5 * ((p * (p / q).log()).sum(-1) + (q * (q / p).log()).sum(-1)).mean()
    assert stats["route_kl"] == pytest.approx(float(kl), abs=1e-3)
    load = np.array(stats["load"]) * stats["experts"]
    assert stats["utilisation_variance"] == pytest.approx(float(load.var()), abs=1e-3)
    assert res.best_epoch >= 0 and m.config["train"]["val_score"] == pytest.approx(res.best_score)


def test_ablation_table_on_real_features(encoder, subset_rows, tmp_path):
    """The ablation tooling on a real subset: baselines and adapters on the same queries, one
    number checked by brute force, and the report files."""
    from vitrine.evals.ablation import load_embedders, run_ablation, write_report
    from vitrine.evals.datasets import Catalog

    small(image_dim=encoder.towers.image_dim, text_dim=encoder.towers.text_dim, dim=32).save_pretrained(tmp_path / "m")
    catalog = Catalog.load(limit_ids={r["id"] for r in subset_rows})
    split = max(("train", "val", "test"), key=lambda s: int(catalog.split_mask(s).sum()))
    embedders = load_embedders(encoder, ["mlp", f"tiny-moe={tmp_path / 'm'}"])
    result = run_ablation(encoder, catalog, embedders, split=split, n_attr=40)
    rows = {r["name"]: r for r in result["rows"]}
    assert list(rows) == ["mlp", "none (ConSE)", "text tower alone", "tiny-moe"]  # the first adapter leads
    for r in rows.values():
        assert all(0.0 <= v <= 1.0 for v in r["metrics"].values())
    assert rows["text tower alone"]["metrics"] == {"textonly_attr_nDCG@10": rows["none (ConSE)"]["metrics"][
        "textonly_attr_nDCG@10"]}
    assert rows["mlp"]["metrics"]["kagl_R@10"] > rows["none (ConSE)"]["metrics"]["kagl_R@10"]
    assert rows["tiny-moe"]["routing"]["experts"] == 4
    # brute force: KAGL R@10 of the MLP (titles of the split -> every photo; relevant = same title)
    mlp = embedders[0]
    img_f, txt_f = catalog.features(encoder, progress=False)
    gal, q = mlp.image(img_f), mlp.text(txt_f[catalog.split_mask(split)])
    titles = np.array(catalog.titles)
    recalls = []
    for qi, t in zip(q, titles[catalog.split_mask(split)]):
        top = np.argsort(-(gal @ qi), kind="stable")[:10]
        rel = set(np.flatnonzero(titles == t))
        recalls.append(len(rel & set(top.tolist())) / len(rel))
    assert rows["mlp"]["metrics"]["kagl_R@10"] == pytest.approx(np.mean(recalls), abs=2e-3)
    paths = write_report(result, tmp_path / "report")
    assert [p.name for p in paths] == ["gate_ablation.md", "gate_ablation.json", "gate_ablation.png"]
    md = paths[0].read_text()
    assert "| mlp |" in md and "tiny-moe" in md and "load CV" in md


def test_engine_serves_with_an_moe_gate(trained_moe, settings_factory, catalog_dir, tmp_path, subset_rows):
    """`--adapter FOLDER` with an MoE gate: ingest and search through the engine, the routed path
    and the degraded (router-free) path both answering in the same space."""
    from vitrine.ingest.catalog import ingest_file
    from vitrine.search import fallback
    from vitrine.search.engine import Engine
    from vitrine.search.models import SearchRequest

    trained_moe[0].save_pretrained(tmp_path / "moe")
    eng = Engine.open(settings_factory(tmp_path / "data", adapter=str(tmp_path / "moe"), intent=False))
    try:
        assert eng.encoder.adapter.kind == "moe" and "+moe-" in eng.model_key
        report = ingest_file(eng, catalog_dir / "catalog.jsonl", progress=False)
        assert report.upserted == len(subset_rows) and not report.failed
        row = next(r for r in subset_rows if r["articleType"] == "Watches")
        resp = eng.search(SearchRequest(text=row["productDisplayName"], k=5))
        assert resp.results and not resp.degraded
        assert any(h.id == row["id"] for h in resp.results)
        light = fallback.light_query_vectors(eng.reader, row["productDisplayName"], None)
        routed = eng.query_vectors(row["productDisplayName"], None)
        assert float(light["text"] @ routed["text"]) > 0.5  # same space, without the router

        # Break the routing: the router raises. The search still answers, by the light path, marked
        # degraded; a photo alone too (the light path needs no words).
        def broken(*a, **kw):
            raise RuntimeError("router produced NaN weights")

        eng.encoder.adapter.router.forward = broken
        # At the floor (an untuned catalogue) a text query ranks by the text tower's own cosine: the
        # gate is not run, so its failure costs that query nothing.
        floor = eng.search(SearchRequest(text=row["productDisplayName"] + " strap", k=5))
        assert floor.degraded == [] and floor.results
        search = eng.settings.search
        before, search.calibration = search.calibration, "off"  # the shared space ranks text
        try:
            resp = eng.search(SearchRequest(text=row["productDisplayName"] + " strap", k=5))
            assert resp.degraded == ["gate"] and resp.results
        finally:
            search.calibration = before
        photo = (SOURCE / "images" / f"{row['id']}.jpg").read_bytes()
        resp = eng.search(SearchRequest(k=3), image=photo)
        assert resp.degraded == ["gate"] and resp.results[0].id == row["id"]  # its own photo, router-free
    finally:
        eng.close()
    # The same data dir opened with another aligner re-embeds every product on open.
    eng = Engine.open(settings_factory(tmp_path / "data", adapter="mlp", intent=False))
    try:
        assert "+mlp-" in eng.model_key
        assert {r.model_key for r in eng.records.iter_rows(with_vectors=False)} == {eng.model_key}
        resp = eng.search(SearchRequest(text=row["productDisplayName"], k=5))
        assert any(h.id == row["id"] for h in resp.results) and not resp.degraded
    finally:
        eng.close()


def test_ema_training_validates_and_keeps_the_averaged_weights():
    """With a decay so close to 1 that the average never leaves the start, the kept weights are
    the starting ones (the live weights did move), and validation saw them."""
    from vitrine.training.adapter import TrainConfig, evaluate_pairs, train_adapter
    from vitrine.training.pairs import PairSet

    rng = np.random.default_rng(0)
    img, txt = rng.normal(size=(64, 12)).astype(np.float32), rng.normal(size=(64, 8)).astype(np.float32)
    data = PairSet(img, txt, np.arange(64))
    for ema, moved in ((0.0, True), (1.0 - 1e-9, False)):
        m = small(experts=4, top_k=2, balance="loss")  # no calibration after training: scores comparable
        start = {k: v.clone() for k, v in m.state_dict().items()}
        res = train_adapter(m, data, data, TrainConfig(epochs=2, batch_size=32, ema_decay=ema), progress=False)
        end = m.state_dict()
        same = all(torch.allclose(end[k], start[k], atol=1e-5) for k in start
                   if k not in ("image_mean", "image_std", "text_mean", "text_std"))
        assert same is not moved
        assert res.best_score == pytest.approx(evaluate_pairs(m, data)["MRR@10"], abs=1e-6) or moved


def test_adapter_specs_label_path_and_inference_options(tmp_path):
    """`[NAME=]PATH[@KEY=VALUE]...` as the ablation and the gate benchmark read it: the same
    weights loaded with an inference option (dynamic k) route differently; a bad option is a
    clear error."""
    from vitrine.encoders.adapters import parse_adapter_spec

    assert parse_adapter_spec("mlp") == ("mlp", "mlp", {})
    assert parse_adapter_spec("x=/a/moe@dynamic_k=true@dynamic_threshold=0.6") == (
        "x", "/a/moe", {"dynamic_k": True, "dynamic_threshold": 0.6})
    assert parse_adapter_spec("/a/moe@balance=loss")[:2] == ("moe", "/a/moe")
    with pytest.raises(ModelError, match="KEY=VALUE"):
        parse_adapter_spec("moe@dynamic_k")
    small(experts=4, top_k=2).save_pretrained(tmp_path / "m")
    x, t = torch.randn(30, 12), torch.randn(30, 8)
    plain = load_adapter(tmp_path / "m")
    dyn = load_adapter(tmp_path / "m", overrides={"dynamic_k": True, "dynamic_threshold": 0.0})
    assert plain.routing_stats(x, t)["experts_per_token"] == 2.0
    assert dyn.routing_stats(x, t)["experts_per_token"] == 1.0
    with pytest.raises(ModelError, match="do not fit"):
        load_adapter(tmp_path / "m", overrides={"experts": 5})


def test_training_on_augmented_views_uses_them():
    """With views given, rows train on them at the configured rate: a view set that is pure noise
    drags training down against the same run without views; a PairSet with misshapen views is refused."""
    from vitrine.training.adapter import TrainConfig, evaluate_pairs, train_adapter
    from vitrine.training.pairs import PairSet

    rng = np.random.default_rng(0)
    txt = rng.normal(size=(128, 8)).astype(np.float32)
    img = np.concatenate([txt, rng.normal(size=(128, 4))], axis=1).astype(np.float32)  # photo "contains" the text
    noise = rng.normal(size=(2, 128, 12)).astype(np.float32)
    scores = {}
    for vp in (0.0, 0.9):
        m = small(balance="loss")
        data = PairSet(img, txt, np.arange(128), image_views=noise)
        train_adapter(m, data, PairSet(img, txt, np.arange(128)),
                      TrainConfig(epochs=8, batch_size=64, view_prob=vp), progress=False)
        scores[vp] = evaluate_pairs(m, PairSet(img, txt, np.arange(128)))["MRR@10"]
    assert scores[0.9] < scores[0.0] - 0.1, scores
    with pytest.raises(ValueError):
        PairSet(img, txt, np.arange(128), image_views=noise[:, :64])


def test_composed_queries_and_protocol_on_real_features(encoder, subset_rows):
    """Photo + words naming one changed attribute: the queries' relevant sets are what they say,
    and the photo-only row matches a brute-force ranking."""
    from vitrine.evals import composed as C
    from vitrine.evals.datasets import Catalog

    catalog = Catalog.load(limit_ids={r["id"] for r in subset_rows})
    qs = C.composed_queries(catalog, "train", n=30, seed=1, min_relevant=1)
    assert qs and {q["kind"] for q in qs} <= set(C.KINDS)
    for q in qs:
        p = catalog.rows[q["row"]]
        assert q["new"] != q["old"] == C.attribute_value(p, q["kind"]) and q["row"] not in q["relevant"]
        assert q["words"] == C.words_for(q["kind"], q["new"])
        want = {j for j, r in enumerate(catalog.rows)
                if r["articleType"] == p["articleType"] and C.attribute_value(r, q["kind"]) == q["new"]} - {q["row"]}
        assert set(q["relevant"]) == want
    result = C.composed_eval(encoder, catalog, split="train", tune_split="train", n=30)
    assert {"photo", "text"} <= set(result["rows"]) and result["composed"] in result["rows"]
    # brute force: photo-only R@10 = the photo's vector against every product photo vector
    img_f, txt_f = catalog.features(encoder, progress=False)
    qs = C.composed_queries(catalog, "train", n=30, seed=3, has_photo=~np.isnan(img_f).any(1))
    with torch.inference_mode():
        gal = encoder.embed(img_f, None).image
        vs = [encoder.embed(img_f[[q["row"]]], None).image[0] for q in qs]
    recalls = []
    for q, v in zip(qs, vs):
        top = np.argsort(-(gal @ v), kind="stable")[:10]
        recalls.append(len(set(top.tolist()) & set(q["relevant"])) / len(q["relevant"]))
    assert result["rows"]["photo"]["R@10"] == pytest.approx(np.mean(recalls), abs=2e-3)


def test_degraded_photo_protocol_on_real_features(encoder, subset_rows, tmp_path):
    """Same-category P@10 of clean and grayscale photos, checked by brute force, and the report."""
    from vitrine.evals import degraded as D
    from vitrine.evals.datasets import Catalog

    catalog = Catalog.load(limit_ids={r["id"] for r in subset_rows})
    split = max(("train", "val", "test"), key=lambda s: int(catalog.split_mask(s).sum()))
    result = D.degraded_eval(encoder, catalog, ["mlp"], split=split, degradations=("gray",), progress=False)
    m = result["rows"][0]["metrics"]
    assert set(m) == {"clean", "gray"} and all(0.0 <= v <= 1.0 for d in m.values() for v in d.values())
    from vitrine.encoders.adapters import load_adapter

    mlp = load_adapter("mlp")
    img_f, _ = catalog.features(encoder, progress=False)
    with torch.inference_mode():
        vec = mlp(torch.from_numpy(img_f), None).image.numpy()
    types = np.array([r["articleType"] for r in catalog.rows])
    precisions = []
    for q in np.flatnonzero(catalog.split_mask(split)):
        sims = vec @ vec[q]
        sims[q] = -np.inf  # its own product left out
        top = np.argsort(-sims, kind="stable")[:10]
        precisions.append(float((types[top] == types[q]).mean()))
    assert m["clean"]["articleType"] == pytest.approx(np.mean(precisions), abs=2e-3)
    paths = D.write_report(result, tmp_path)
    assert [p.name for p in paths] == ["degraded.md", "degraded.json", "degraded.png"]
    assert "| mlp |" in paths[0].read_text()
