"""`vitrine train gate --data DIR` on a text-only catalogue: the aligner's text side trained on
pseudo-query <-> product-text pairs, on a real subset of the bundled catalogue ingested without photos."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vitrine.encoders.adapters import load_adapter
from vitrine.errors import InvalidInput
from vitrine.search.engine import Engine
from vitrine.search.models import product_text
from vitrine.search.models import Product

COUNTS = {"title": 300, "category": 40, "brand_type": 40, "attributes": 120}
TINY_MOE = {"experts": 4, "top_k": 2, "width": 64, "hidden": 64}


def _text_only_jsonl(catalog_dir, path, limit=None):
    """The subset's records as a shop's JSONL without photos."""
    lines = (catalog_dir / "catalog.jsonl").read_text(encoding="utf-8").splitlines()[:limit]
    recs = [{k: v for k, v in json.loads(x).items() if k not in ("image", "image_b64")} for x in lines if x.strip()]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    return path


def _engine(settings_factory, encoder, catalog_dir, tmp_path, name, limit=None):
    from vitrine.ingest.catalog import ingest_file

    # one tune sample: these tests check training and installing; averaging samples is test_tuning's
    eng = Engine(settings_factory(tmp_path / name, tune_samples=1), encoder)
    ingest_file(eng, _text_only_jsonl(catalog_dir, tmp_path / f"{name}.jsonl", limit), progress=False)
    return eng


@pytest.mark.slow
def test_text_only_catalogue_trains_the_text_side_and_installs(settings_factory, encoder, catalog_dir, tmp_path):
    from vitrine.training.gate_data import train_on_data
    from vitrine.training.pairs import catalogue_pairs
    from vitrine.training.recipe import GateRecipe
    from vitrine.evals.tuning import tune

    eng = _engine(settings_factory, encoder, catalog_dir, tmp_path, "textonly")
    try:
        assert not any(r.image_key for r in eng.records.iter_rows(with_vectors=False))
        tune(eng, counts=COUNTS, slot_queries=20)
        floor_before = eng.calibration
        train, val, info = catalogue_pairs(eng, counts=COUNTS)
        assert info["text_only"] and info["products_with_photos"] == 0
        assert info["train_products"] + info["heldout_products"] == info["products"] == len(eng) == 240
        assert train.text_only and val.text_only and len(train.variant) == info["train_products"]
        assert (train.product_keys[train.query_subset, train.query_rows] == train.query_key).all()
        out = tmp_path / "adapter"
        recipe = GateRecipe(kind="moe", epochs=12, patience=3, dim=64, overrides=TINY_MOE, lr=5e-3, batch_size=64,
                            init="fresh")
        summary = train_on_data(eng, out, recipe, counts=COUNTS)
        log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
        scores = [r["score"] for r in log]
        # early-stopped on the held-out pseudo title queries: the kept weights are the best epoch's
        assert summary["init"] == "fresh" and 0.0 <= summary["heldout_MRR@10_served_before"] <= 1.0
        assert summary["heldout_MRR@10"] == pytest.approx(max(scores)) and summary["best_epoch"] == int(np.argmax(scores))
        assert len(log) == summary["epochs_run"] and (len(log) == 12 or len(log) - 1 - summary["best_epoch"] == 3)
        assert max(scores) > scores[0], scores  # it learns the catalogue beyond its first epoch
        adapter = load_adapter(out)
        assert adapter.config["train"]["val_score"] == pytest.approx(max(scores))
        # the held-out score is a brute-force MRR@10 of title variant -> product text (text token alone)
        with torch.inference_mode():
            g = adapter(None, torch.from_numpy(val.text)).text.numpy()
            q = adapter(None, torch.from_numpy(val.variant)).text.numpy()
        rr = []
        for i in range(len(q)):
            top = np.argsort(-(g @ q[i]), kind="stable")[:10]
            hit = [r for r, j in enumerate(top) if val.group[j] == val.group[i]]
            rr.append(1.0 / (hit[0] + 1) if hit else 0.0)
        assert float(np.mean(rr)) == pytest.approx(max(scores), abs=0.03)  # float16 on disk
        # the install decision scores the weights as saved (float16), as the brute force above does
        assert summary["heldout_MRR@10_new"] == pytest.approx(float(np.mean(rr)), abs=0.01)
        if summary["heldout_MRR@10_new"] <= summary["heldout_MRR@10_served_before"]:  # no better: never installed
            assert not summary["installed"] and "swap" not in summary and "not installed" in summary["decision"]
            assert eng.calibration.text_weights == floor_before.text_weights
            return
        swap = summary["swap"]
        assert summary["installed"] == swap["switched"]
        if swap["switched"]:
            # installed: the engine indexes each product as the trained vector, its text token alone
            rows = list(eng.records.iter_rows(with_vectors=False))[:20]
            feats = eng.encoder.text_features([product_text(Product.model_validate(r.doc)) for r in rows])
            with torch.inference_mode():
                want = adapter(None, torch.from_numpy(feats)).text.numpy()
            got = eng.vectors["fused"].get([int(r.iid) for r in rows])
            assert np.allclose(got, want, atol=2e-3)
            # re-tuned for the new shared space; the floor still guards it
            t = summary["tune"]
            assert eng.calibration.source == "tuned" and eng.calibration.model_key == eng.model_key
            if t["accepted"]:  # the shared space counts only where it beat the floor on held-out pseudo-queries
                assert t["heldout_fitted"] > t["heldout_floor"]
            else:
                assert eng.calibration.is_floor
        else:  # refused by the canary: the live model and its tuning serve on
            assert eng.calibration.text_weights == floor_before.text_weights
    finally:
        eng.close()


def test_too_small_a_text_only_catalogue_is_refused_clearly(settings_factory, encoder, catalog_dir, tmp_path):
    from vitrine.training.pairs import MIN_PRODUCTS, catalogue_pairs

    eng = _engine(settings_factory, encoder, catalog_dir, tmp_path, "tiny", limit=30)
    try:
        with pytest.raises(InvalidInput, match=f"30 products with a title and too few photos.*at least {MIN_PRODUCTS}"):
            catalogue_pairs(eng)
    finally:
        eng.close()


def test_auto_init_fine_tunes_the_served_aligner_only_for_text_only_catalogues():
    from vitrine.training.gate_data import resolve_init

    assert resolve_init("auto", text_only=True, served_kind="moe", kind="moe", overrides=False) == "live"
    assert resolve_init("auto", text_only=False, served_kind="moe", kind="moe", overrides=False) == "fresh"
    assert resolve_init("auto", text_only=True, served_kind="mlp", kind="moe", overrides=False) == "fresh"
    assert resolve_init("auto", text_only=True, served_kind="moe", kind="moe", overrides=True) == "fresh"
    assert resolve_init("fresh", text_only=True, served_kind="moe", kind="moe", overrides=False) == "fresh"
