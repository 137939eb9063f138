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


@pytest.mark.slow
def test_train_gate_with_lora_saves_deltas_that_change_the_shared_inputs_only(mini_source, towers, tmp_path, cache_dir):
    """A short joint run: the deltas move, save as config.json + safetensors beside the gate, load
    back to the same features; the frozen towers (the native space's) are unchanged."""
    from vitrine.cli.train import train_gate_command
    from vitrine.encoders.adapters import load_adapter
    from vitrine.encoders.lora import has_lora, load_lora
    from vitrine.search.settings import Settings

    settings = Settings(data_dir=tmp_path / "data", cache_dir=cache_dir, _env_file=None, torch_threads=1)
    out = tmp_path / "gate"
    summary = train_gate_command(
        settings, kind="moe", out=out, source=mini_source, epochs=2, batch_size=64, lr=2e-3, dim=64, hidden=64,
        experts=4, top_k=2, dynamic_k=False, queries=True, seed=0, patience=3, name="moe-lora-test", views=(),
        lora="both", lora_rank=4, lora_text_layers=[5], lora_lr_scale=1.0)
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

    from vitrine.cli import main

    res = CliRunner().invoke(main, ["train", "gate", "--kind", "mlp", "--lora", "text", "--out", "/tmp/never"])
    assert res.exit_code != 0 and "MoE gate only" in res.output
