"""`vitrine train gate --data` installs the new aligner only if it beats the serving one on held-out data
(issue 53, item 9): a real, deliberately starved training run (one epoch at a learning rate that
barely moves fresh weights) on a copy of the small real subset is measured, refused and said so."""

from __future__ import annotations

import numpy as np
from conftest import engine_copy

COUNTS = {"title": 200, "category": 30, "brand_type": 30, "attributes": 60}
TINY_MOE = {"experts": 4, "top_k": 2, "width": 64, "hidden": 64}


def test_an_aligner_that_does_not_beat_the_serving_one_is_not_installed(engine, settings_factory, encoder,
                                                                        tmp_path):
    from vitrine.search.models import SearchRequest
    from vitrine.training.gate_data import train_on_data
    from vitrine.training.recipe import GateRecipe

    eng = engine_copy(engine, settings_factory, encoder, tmp_path / "data")
    try:
        served = eng.encoder.adapter
        served_name = served.config.get("name")
        before = [h.id for h in eng.search(SearchRequest(text="men casual shoes", k=10)).results]
        recipe = GateRecipe(kind="moe", epochs=1, patience=1, dim=64, overrides=TINY_MOE, lr=1e-7, batch_size=64,
                            init="fresh")
        summary = train_on_data(eng, tmp_path / "adapter", recipe, counts=COUNTS)
        assert 0.0 <= summary["heldout_MRR@10_new"] < summary["heldout_MRR@10_served_before"] <= 1.0, summary
        assert summary["installed"] is False and "swap" not in summary and "tune" not in summary
        assert summary["decision"].startswith("not installed") and "does not beat" in summary["decision"]
        assert eng.encoder.adapter is served and eng.encoder.adapter.config.get("name") == served_name
        after = [h.id for h in eng.search(SearchRequest(text="men casual shoes", k=10)).results]
        assert after == before and len(after) == 10
        assert (tmp_path / "adapter" / "train_summary.json").exists()  # trained and saved, only not installed
        assert np.isfinite(summary["heldout_MRR@10"])
    finally:
        eng.close()
