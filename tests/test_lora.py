"""LoRA deltas of the towers trained with the gate (vitrine/encoders/lora.py), on real parts: the
shipped towers and a small real subset of the bundled catalogue."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import SOURCE

pytest.importorskip("peft")


@pytest.fixture(scope="module")
def towers():
    from vitrine.encoders.factory import create_towers

    return create_towers()


@pytest.fixture(scope="module")
def mini_source(tmp_path_factory, subset_rows) -> Path:
    """A catalogue folder (styles.csv, splits.csv, images/) holding the test subset only."""
    d = tmp_path_factory.mktemp("mini-source")
    keep = {r["id"] for r in subset_rows}
    with open(SOURCE / "styles.csv", newline="", encoding="utf-8") as f_in, \
            open(d / "styles.csv", "w", newline="", encoding="utf-8") as f_out:
        reader = csv.DictReader(f_in)
        writer = csv.DictWriter(f_out, fieldnames=reader.fieldnames)
        writer.writeheader()
        writer.writerows(r for r in reader if r["id"] in keep)
    with open(SOURCE / "splits.csv", encoding="utf-8") as f_in, open(d / "splits.csv", "w", encoding="utf-8") as f_out:
        lines = f_in.read().splitlines()
        f_out.write("\n".join([lines[0]] + [ln for ln in lines[1:] if ln.split(",")[0] in keep]) + "\n")
    (d / "images").mkdir()
    for pid in keep:
        os.symlink(SOURCE / "images" / f"{pid}.jpg", d / "images" / f"{pid}.jpg")
    return d


def test_untrained_deltas_reproduce_the_frozen_towers(towers, subset_rows):
    """B starts at zero: the adapted towers give the frozen towers' features exactly, text and photo."""
    from vitrine.encoders.images import decode_image
    from vitrine.encoders.lora import LoraSpec, TowerLora, photo_activations

    lora = TowerLora(towers, LoraSpec(text=True, image=True))
    titles = [r["productDisplayName"] for r in subset_rows[:16]]
    photos = [(SOURCE / "images" / f"{r['id']}.jpg").read_bytes() for r in subset_rows[:8]]
    with torch.no_grad():
        assert torch.allclose(lora.text_features(titles), towers.text_features(titles), atol=1e-5)
        px = torch.stack([towers.preprocess(decode_image(b)) for b in photos])
        frozen = towers.image_features(px)
        act = photo_activations(towers, photos, decode_image)
        got = lora.image_features(torch.from_numpy(act), frozen)
    # The cut activations are kept in float16: the pooled part differs by that rounding only.
    assert torch.allclose(got[:, 1280:], frozen[:, 1280:])
    assert torch.allclose(got[:, :1280], frozen[:, :1280], atol=0.05, rtol=0.02)
    trainable = {n.split(".")[0] for n, p in lora.named_parameters() if p.requires_grad}
    assert trainable == {"text", "image"}
    assert all("lora_" in n for n, p in lora.named_parameters() if p.requires_grad)
    assert not any("lora_" in n for n, _ in towers.model.named_parameters())  # the originals are untouched


def test_top_layers_only_and_image_targets(towers):
    from vitrine.encoders.lora import LoraSpec, TowerLora

    lora = TowerLora(towers, LoraSpec(text=True, image=True, text_layers=[5]))
    names = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert all(".layer.5." in n for n in names if n.startswith("text."))
    assert {n.split(".")[-4] for n in names if n.startswith("image.")} == {"conv_pw", "conv_pwl", "conv_head"}
    assert all(n.startswith("image.stage.6.") or n.startswith("image.conv_head") for n in names if n.startswith("image."))


@pytest.fixture(scope="module")
def lora_gate(mini_source, tmp_path_factory, cache_dir) -> tuple[Path, dict]:
    """A short joint run of the gate with both towers' deltas on the real subset."""
    from vitrine.settings import Settings
    from vitrine.training.gate import train_gate
    from vitrine.training.recipe import GateRecipe

    tmp = tmp_path_factory.mktemp("lora-gate")
    settings = Settings(data_dir=tmp / "data", cache_dir=cache_dir, _env_file=None, torch_threads=1)
    recipe = GateRecipe(kind="moe", source=str(mini_source), epochs=2, batch_size=64, lr=2e-3, dim=64, hidden=64,
                        experts=4, top_k=2, queries=True, seed=0, patience=3, name="moe-lora-test", views=(),
                        lora="both", lora_rank=4, lora_text_layers=(5,), lora_lr_scale=1.0)
    summary = train_gate(settings, recipe, tmp / "gate")
    return tmp / "gate", summary


@pytest.mark.slow
def test_train_gate_with_lora_saves_deltas_that_change_the_shared_inputs_only(lora_gate, towers):
    """The deltas move, save as config.json + safetensors beside the gate, load back; the frozen
    towers (the native space's) are unchanged."""
    from vitrine.encoders.adapters import load_adapter
    from vitrine.encoders.lora import has_lora, load_lora

    out, summary = lora_gate
    assert summary["lora"]["mode"] == "both" and summary["lora"]["parameters"] > 0
    vf = summary["val_figures"]
    for key in ("val_t2i_Hit@10", "val_t2i_MRR@10", "val_textonly_attr_nDCG@10", "val_textonly_attr_nDCG@10_text_tower"):
        assert 0.0 <= vf[key] <= 1.0
    assert has_lora(out)
    cfg = json.loads((out / "lora" / "config.json").read_text())
    assert cfg["towers_key"] == towers.key and cfg["text"] and cfg["image"] and cfg["text_layers"] == [5]
    assert load_adapter(out).config["lora"]["mode"] == "both"
    lora = load_lora(out, towers)
    b = [v for k, v in lora.delta_state().items() if "lora_B" in k]
    assert any(float(v.abs().max()) > 0 for v in b)  # trained: B left zero
    titles = ["red cotton shirt for men", "black leather handbag"]
    with torch.no_grad():
        adapted = lora.text_features(titles)
        native = towers.text_features(titles)
    assert not torch.allclose(adapted, native, atol=1e-4)
    assert np.isfinite(adapted.numpy()).all()
    with torch.no_grad():  # loading the deltas left the towers themselves (the native space) alone
        assert torch.equal(towers.text_features(titles), native)


@pytest.mark.slow
def test_engine_serves_through_the_deltas_and_keeps_the_native_floor(lora_gate, settings_factory, subset_rows,
                                                                      tmp_path, cache_dir):
    """Products and queries reach the shared space through the deltas; the native text space (the
    floor) reads the frozen text tower."""
    from vitrine.encoders.encoder import MultimodalEncoder
    from vitrine.search.engine import Engine
    from vitrine.search.writes import ProductInput
    from vitrine.search.models import Product, SearchRequest

    out, _ = lora_gate
    enc = MultimodalEncoder.create(adapter=str(out), device="cpu", cache_path=cache_dir / "features.sqlite")
    assert enc.adapts_text and enc.adapts_image
    rows = subset_rows[:12]
    titles = [r["productDisplayName"] for r in rows]
    photos = [(SOURCE / "images" / f"{r['id']}.jpg").read_bytes() for r in rows]
    emb = enc.encode(texts=titles, images=photos)
    with torch.no_grad():
        lt = enc.lora.text_features(titles).numpy()
    want = enc.embed(enc.shared_image_features(photos), lt)  # each token routed seeing the other
    assert np.allclose(emb.text, want.text, atol=1e-4) and np.allclose(emb.fused, want.fused, atol=1e-4)
    assert not np.allclose(enc.shared_text_features(titles), enc.text_features(titles), atol=1e-4)
    assert not np.allclose(enc.shared_image_features(photos), enc.image_features(photos), atol=1e-4)

    eng = Engine(settings_factory(tmp_path / "data", adapter=str(out), query_runtime="torch"), enc)
    try:
        eng.upsert([ProductInput(Product(id=r["id"], title=t), image=b) for r, t, b in zip(rows, titles, photos)])
        q = titles[3]
        qv = eng.query_encoder.text([q])[0]
        assert np.allclose(qv, enc.embed(None, enc.shared_text_features([q])).text[0], atol=1e-3)
        nv = eng.query_encoder.native(q)
        frozen = enc.text_features([q])[0]
        assert np.allclose(nv, frozen / np.linalg.norm(frozen), atol=1e-3)
        res = eng.search(SearchRequest(text=q, k=3))
        assert res.results and res.results[0].id == rows[3]["id"]
    finally:
        eng.close()


def test_lora_refuses_other_towers_and_tampered_weights(mini_source, towers, tmp_path):
    from vitrine.encoders.lora import LoraSpec, TowerLora, load_lora
    from vitrine.errors import ModelError

    TowerLora(towers, LoraSpec(text=True, image=False)).save(tmp_path)
    load_lora(tmp_path, towers)
    cfg_file = tmp_path / "lora" / "config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg_file.write_text(json.dumps(cfg | {"towers_key": "other"}))
    with pytest.raises(ModelError, match="trained on towers"):
        load_lora(tmp_path, towers)
    cfg_file.write_text(json.dumps(cfg | {"weights_sha256": "0" * 64}))
    with pytest.raises(ModelError, match="checksum"):
        load_lora(tmp_path, towers)


def test_cli_refuses_lora_without_the_gate():
    from click.testing import CliRunner

    from vitrine.cli.app import main

    res = CliRunner().invoke(main, ["train", "gate", "--kind", "mlp", "--lora", "text", "--out", "/tmp/never"])
    assert res.exit_code != 0 and "MoE gate only" in res.output
