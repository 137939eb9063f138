"""The ingest-floor bench (vitrine_bench/ingest_floor.py): its start probe times every stage in a
fresh process, its text-tower forms are measured against float32 on real titles and leave the
served tower as it was, and its cosine is the brute-force one."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vitrine.encoders.precision import bf16_speedup
from vitrine_bench import ingest_floor
from vitrine_bench.batch_precision import cosines


def test_cosines_match_brute_force():
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(50, 8)).astype(np.float32), rng.normal(size=(50, 8)).astype(np.float32)
    brute = [float(np.dot(x, y) / (np.sqrt(np.dot(x, x)) * np.sqrt(np.dot(y, y)))) for x, y in zip(a, b)]
    got = cosines(a, b)
    assert got["min"] == pytest.approx(min(brute), abs=1e-6)
    assert got["mean"] == pytest.approx(sum(brute) / len(brute), abs=1e-6)
    assert got["p1"] == pytest.approx(float(np.percentile(brute, 1)), abs=1e-6)


def test_tower_forms_measure_each_form_against_float32(encoder, catalog_dir, tmp_path):
    rows = [json.loads(x) for x in (catalog_dir / "catalog.jsonl").read_text().splitlines()[:40]]
    cat = tmp_path / "text-only.jsonl"
    cat.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "image"}) + "\n" for r in rows))
    shipped = encoder.towers.model.text
    res = ingest_floor.tower_forms(cat, n_text=40, rounds=1, batch=16, towers=encoder.towers)
    assert encoder.towers.model.text is shipped  # restored after every form
    forms = {r["form"]: r for r in res["rows"]}
    assert {"float32", "bf16 autocast (shipped)", "bf16 weights"} <= set(forms)
    assert "int8 dynamic" in forms or "int8 dynamic" in res["skipped"]
    assert res["n_text"] == 40 and res["max_tokens"] >= res["mean_tokens"] > 1
    assert all(r["texts_per_s"] > 0 for r in forms.values())
    assert forms["float32"]["cos_min"] == pytest.approx(1.0, abs=1e-5)
    for name in ("bf16 autocast (shipped)", "bf16 weights"):
        assert forms[name]["cos_min"] > 0.99
        if bf16_speedup("cpu") > 0:
            assert forms[name]["cos_min"] < 1.0 - 1e-7  # bf16 really ran
    for r in forms.values():
        assert -1.0 <= r["cos_min"] <= r["cos_p1"] <= 1.0 + 1e-6 and r["cos_min"] <= r["cos_mean"] <= 1.0 + 1e-6


def test_start_probe_times_each_stage_in_a_fresh_process():
    res = ingest_floor.start_costs(jobs=1, rounds=1)
    stages = res["stages"]
    assert list(stages) == ["torch", "transformers", "open_clip (torchvision, timm)", "vitrine engine",
                            "towers + adapter built", "interpreter start and exit"]
    assert all(v >= 0 for v in stages.values())
    assert res["total"] == pytest.approx(sum(stages.values()))
    assert stages["torch"] > 0.05  # a fresh process really imported it
