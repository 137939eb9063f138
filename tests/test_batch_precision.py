"""The text tower's precision in batch encodes (vitrine/encoders/precision.py): bf16 autocast gives
the float32 features of real titles (cosine 0.999), auto measures and picks, photos stay float32
in encodes (the photo tower's bf16 path, measured by the bench, moves them to a cosine of 0.99)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vitrine.encoders.encoder import MultimodalEncoder
from vitrine.encoders.precision import bf16_speedup, resolve_batch_precision
from vitrine.errors import InvalidInput


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", a, b) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def _bf16_runs() -> bool:
    return bf16_speedup("cpu") > 0


def test_resolve_passes_explicit_choices_and_refuses_others():
    assert resolve_batch_precision("fp32", "cpu") == "fp32"
    assert resolve_batch_precision("bf16", "cpu") == "bf16"
    assert resolve_batch_precision("auto", "cpu") in ("fp32", "bf16")
    assert resolve_batch_precision("auto", "cpu") == ("bf16" if bf16_speedup("cpu") >= 1.3 else "fp32")
    with pytest.raises(InvalidInput, match="batch precision"):
        resolve_batch_precision("fp8", "cpu")


def test_an_encoder_resolves_auto_once(encoder):
    enc = MultimodalEncoder(encoder.towers, None, cache=None, batch_precision="auto")
    first = enc.batch_precision
    assert first in ("fp32", "bf16")
    assert enc.batch_precision == first
    assert MultimodalEncoder(encoder.towers, None, cache=None, batch_precision="fp32").batch_precision == "fp32"


@pytest.mark.skipif(not _bf16_runs(), reason="bf16 matrix products do not run on this CPU")
def test_bf16_text_features_match_fp32_and_photos_stay_fp32(encoder, catalog_dir):
    rows = [json.loads(x) for x in (catalog_dir / "catalog.jsonl").read_text().splitlines()[:48]]
    texts = [r["title"] + " " + (r.get("description") or "") for r in rows]
    photos = [(catalog_dir / r["image"]).read_bytes() for r in rows[:24]]
    fp = MultimodalEncoder(encoder.towers, None, batch_size=16, cache=None, batch_precision="fp32")
    bf = MultimodalEncoder(encoder.towers, None, batch_size=16, cache=None, batch_precision="bf16")
    t32, t16 = fp.text_features(texts), bf.text_features(texts)
    assert t16.dtype == np.float32 and t16.shape == t32.shape
    assert not np.array_equal(t16, t32)  # bf16 really ran
    assert _cosines(t32, t16).min() > 0.999
    np.testing.assert_array_equal(bf.image_features(photos), fp.image_features(photos))  # photos: float32 in both
    px = torch.stack([encoder.towers.preprocess(fp.decode(b)) for b in photos])
    i32, i16 = fp.pixel_features(px), fp.pixel_features(px, precision="bf16")  # the bench's measurement
    assert i16.dtype == np.float32 and i16.shape == i32.shape
    assert not np.array_equal(i16, i32)
    # the photo tower's pooled block taps move more (depthwise convolutions); KAGL text->photo holds
    # within +-0.003 on val and test (bench-results/batch-precision-quality.md)
    assert _cosines(i32, i16).min() > 0.99 and _cosines(i32, i16).mean() > 0.998
    # the colour histogram (the features' tail) is computed from the pixels in float32 either way
    hist = encoder.towers.with_histogram(torch.zeros(len(px), 0), px).numpy()
    if hist.shape[1]:
        np.testing.assert_allclose(i16[:, -hist.shape[1]:], hist, atol=1e-6)
    # the nearest other title of each title is the same in both precisions
    np.fill_diagonal(s32 := t32 @ t32.T, -np.inf)
    np.fill_diagonal(s16 := t16 @ t16.T, -np.inf)
    assert (s32.argmax(1) == s16.argmax(1)).mean() >= 0.95
    assert not torch.is_autocast_enabled("cpu")  # autocast left as it was found
