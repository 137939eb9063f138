"""Safe image decoding and preprocessing suited to small product photos.

Catalogue photos are small (60x80 in the bundled catalogue) and show the whole product, so
preprocessing never crops: it letterboxes the photo onto a canvas of the model's aspect ratio
(filled with the catalogue's white background) and resizes that to the model's input size.
"""

from __future__ import annotations

import hashlib
import io
import logging
import re
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image, ImageOps

from vitrine.errors import ImageTooLarge, InvalidImage, InvalidInput

log = logging.getLogger(__name__)

#: Formats we accept from users and catalogue files.
ALLOWED_FORMATS = frozenset({"JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF", "MPO"})

_INTERPOLATION = {
    "bicubic": Image.Resampling.BICUBIC,
    "bilinear": Image.Resampling.BILINEAR,
    "nearest": Image.Resampling.NEAREST,
    "lanczos": Image.Resampling.LANCZOS,
}


def decode_image(data: bytes, *, max_bytes: int = 10_000_000, max_pixels: int = 40_000_000) -> Image.Image:
    """Decode ``data`` into an RGB image, refusing anything unsafe or unreadable.

    Raises :class:`InvalidImage` naming the problem: empty, too large (bytes or pixels,
    including decompression bombs), an unsupported format, or truncated/corrupt data.
    """
    if not data:
        raise InvalidImage("image is empty")
    if len(data) > max_bytes:
        raise ImageTooLarge(f"image is {len(data):,} bytes, over the limit of {max_bytes:,} bytes")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            fmt = img.format
            if fmt not in ALLOWED_FORMATS:
                raise InvalidImage(f"unsupported image format {fmt!r}; use JPEG, PNG, WEBP, GIF or BMP")
            w, h = img.size
            if w <= 0 or h <= 0:
                raise InvalidImage("image has no pixels")
            if w * h > max_pixels:
                raise ImageTooLarge(
                    f"image is {w}x{h} = {w * h:,} pixels, over the limit of {max_pixels:,} pixels"
                )
            img.load()
    except InvalidImage:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageTooLarge(f"image refused as a decompression bomb: {e}") from e
    except Image.UnidentifiedImageError as e:
        raise InvalidImage("bytes are not a recognisable image") from e
    except (OSError, SyntaxError, ValueError) as e:
        raise InvalidImage(f"image is corrupt or truncated: {e}") from e
    return to_rgb(img)


def to_rgb(img: Image.Image) -> Image.Image:
    """RGB version of ``img``; transparency is composited onto white (the catalogue background)."""
    img = ImageOps.exif_transpose(img) or img
    if img.mode in ("RGBA", "LA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        canvas = Image.new("RGB", rgba.size, (255, 255, 255))
        canvas.paste(rgba, mask=rgba.getchannel("A"))
        return canvas
    return img.convert("RGB")


@dataclass(frozen=True)
class ImagePreprocess:
    """Letterbox to the target aspect ratio, resize, normalise. Callable on a PIL image."""

    size: tuple[int, int]  # (height, width)
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    interpolation: str = "bicubic"
    resize_mode: str = "pad"  # "pad" (letterbox, never crop) or "squash"
    fill_color: tuple[int, int, int] = (255, 255, 255)

    @classmethod
    def from_cfg(cls, cfg: dict, size: tuple[int, int] | int) -> "ImagePreprocess":
        if isinstance(size, int):
            size = (size, size)
        fill = cfg.get("fill_color", (255, 255, 255))
        if isinstance(fill, int):
            fill = (fill, fill, fill)
        return cls(
            size=(int(size[0]), int(size[1])),
            mean=tuple(cfg.get("mean", (0.5, 0.5, 0.5))),
            std=tuple(cfg.get("std", (0.5, 0.5, 0.5))),
            interpolation=cfg.get("interpolation", "bicubic"),
            resize_mode=cfg.get("resize_mode", "pad"),
            fill_color=tuple(fill),
        )

    def resize(self, img: Image.Image) -> Image.Image:
        th, tw = self.size
        resample = _INTERPOLATION.get(self.interpolation, Image.Resampling.BICUBIC)
        if self.resize_mode == "pad":
            w, h = img.size
            target_ratio = tw / th
            if abs(w / h - target_ratio) > 1e-3:
                if w / h > target_ratio:  # too wide: pad top/bottom
                    nw, nh = w, max(h, round(w / target_ratio))
                else:  # too tall: pad left/right
                    nw, nh = max(w, round(h * target_ratio)), h
                canvas = Image.new("RGB", (nw, nh), self.fill_color)
                canvas.paste(img, ((nw - w) // 2, (nh - h) // 2))
                img = canvas
        if img.size != (tw, th):
            img = img.resize((tw, th), resample=resample)
        return img

    def __call__(self, img: Image.Image) -> torch.Tensor:
        img = self.resize(to_rgb(img) if img.mode != "RGB" else img)
        arr: np.ndarray = np.asarray(img, dtype=np.float32) / 255.0
        arr = (arr - np.asarray(self.mean, dtype=np.float32)) / np.asarray(self.std, dtype=np.float32)
        return torch.from_numpy(arr.transpose(2, 0, 1).copy())


#: Photo views for training-time augmentation: ``flip`` (mirrored) and ``crop<N>`` (the N-th
#: seeded crop keeping 85-97% of each side, mirrored half of the time); and photos unlike the
#: catalogue's (a shopper's scan, thumbnail or phone crop): ``gray`` (grayscale), ``tiny``
#: (downscaled to 32 px on its longest side and back), ``invert`` (negative: a dark background)
#: and ``tight<N>`` (the N-th seeded crop keeping 55-75% of each side). ``center`` (the middle
#: 60% of each side) is the degraded-photo protocol's crop, kept out of training.
VIEW_PATTERN = re.compile(r"^(flip|gray|tiny|invert|center|crop\d{1,3}|tight\d{1,3})$")

#: The degraded views the gate trains on besides ``flip`` and ``crop<N>``.
DEGRADED_VIEWS: tuple[str, ...] = ("gray", "tiny", "invert", "tight1")



def is_degraded_view(view: str) -> bool:
    """Whether ``view`` degrades the photo (a colour, size or framing no catalogue photo has)."""
    return view in ("gray", "tiny", "invert", "center") or view.startswith("tight")


#: Longest side of the ``tiny`` view, in pixels.
TINY_SIDE = 32


def check_view(view: str) -> str:
    """``view`` if it names a training view, else :class:`InvalidInput` saying which exist."""
    if not VIEW_PATTERN.match(view):
        raise InvalidInput(f"unknown photo view {view!r}: use flip, gray, tiny, invert, center, "
                           "crop<N> or tight<N> (e.g. crop1)")
    return view


def _seeded_crop(img: Image.Image, view: str, data: bytes, low: float, high: float) -> Image.Image:
    seed = int.from_bytes(hashlib.sha256(view.encode() + b"\0" + data).digest()[:8], "little")
    rng = np.random.default_rng(seed)
    w, h = img.size
    scale = rng.uniform(low, high)
    cw, ch = max(1, int(w * scale)), max(1, int(h * scale))
    x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    img = img.crop((x0, y0, x0 + cw, y0 + ch))
    return ImageOps.mirror(img) if rng.random() < 0.5 else img


def augment_view(img: Image.Image, view: str, data: bytes) -> Image.Image:
    """``img`` (decoded from ``data``) as the view ``view``. Deterministic: the crops of
    ``crop<N>``/``tight<N>`` are seeded by the photo's bytes and N, so a view's features can be
    cached and a training run repeated. ``flip`` and the crops keep colours (shoppers name
    colours); ``gray`` and ``invert`` do not, as photos from outside the catalogue may not."""
    check_view(view)
    if view == "flip":
        return ImageOps.mirror(img)
    if view == "gray":
        return ImageOps.grayscale(img).convert("RGB")
    if view == "invert":
        return ImageOps.invert(img.convert("RGB"))
    if view == "tiny":
        w, h = img.size
        f = TINY_SIDE / max(w, h)
        small = img.resize((max(1, round(w * f)), max(1, round(h * f))), Image.Resampling.BILINEAR)
        return small.resize((w, h), Image.Resampling.BILINEAR)
    if view == "center":
        w, h = img.size
        cw, ch = max(1, round(w * 0.6)), max(1, round(h * 0.6))
        x0, y0 = (w - cw) // 2, (h - ch) // 2
        return img.crop((x0, y0, x0 + cw, y0 + ch))
    if view.startswith("tight"):
        return _seeded_crop(img, view, data, 0.55, 0.75)
    return _seeded_crop(img, view, data, 0.85, 0.97)
