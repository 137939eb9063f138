"""The multimodal encoder: towers + adapter, batch encoding with progress and a feature cache."""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from vitrine.encoders.adapter_base import Adapter
from vitrine.encoders.adapters import load_adapter
from vitrine.encoders.factory import DEFAULT_MODEL, Towers, create_towers, pick_device
from vitrine.encoders.feature_cache import FeatureCache
from vitrine.encoders.images import augment_view, check_view, decode_image
from vitrine.encoders.precision import batch_autocast, resolve_batch_precision
from vitrine.errors import InvalidImage, InvalidInput, ModelError
from vitrine.progress import progress_bar

if TYPE_CHECKING:  # pragma: no cover
    from PIL import Image

    from vitrine.encoders.lora import TowerLora

log = logging.getLogger(__name__)

# Photos per image-tower forward on CPU. The tower's depthwise convolutions are memory-bound:
# 8 photos at 128x96 stay in cache, 32 do not (2 cores: 120 photos/s at 8 vs 75 at 32 and 48 at
# 128; bench-results/encoders.md). Ingest batches stay large; only the forward is split.
IMAGE_FORWARD_BATCH = 8


@dataclass
class Embeddings:
    """Shared-space vectors (float32, L2-normalised) for a batch; rows of absent modality are zero."""

    image: np.ndarray | None
    text: np.ndarray | None
    fused: np.ndarray
    aux: dict


def _digest(kind: str, towers_key: str, payload: bytes) -> str:
    return f"{towers_key}:{kind}:{hashlib.sha256(payload).hexdigest()}"


class MultimodalEncoder:
    """Pixels and words -> backbone features -> shared-space vectors.

    Build it with :meth:`create` (the explicit constructor that loads models); nothing is
    loaded at import.
    """

    def __init__(
        self,
        towers: Towers,
        adapter: Adapter | None,
        *,
        batch_size: int = 64,
        cache: FeatureCache | None = None,
        max_image_bytes: int = 10_000_000,
        max_image_pixels: int = 40_000_000,
        lora: TowerLora | None = None,
        batch_precision: str = "auto",
    ) -> None:
        if adapter is not None and (adapter.image_dim != towers.image_dim or adapter.text_dim != towers.text_dim):
            raise ModelError(
                f"adapter expects features {adapter.image_dim}/{adapter.text_dim}-d but towers "
                f"{towers.name} give {towers.image_dim}/{towers.text_dim}-d"
            )
        self.towers = towers
        self._adapter = adapter.to(towers.device).eval() if adapter is not None else None
        self.batch_size = batch_size
        self.cache = cache
        self.max_image_bytes = max_image_bytes
        self.max_image_pixels = max_image_pixels
        self._lock = threading.Lock()  # torch modules are not re-entrant across threads for us
        # LoRA deltas of the towers saved beside the adapter (vitrine/encoders/lora.py): they adapt
        # the adapter's inputs only; text_features / image_features stay the frozen towers' (the
        # native text space, the floor of text search, reads those).
        self.lora = lora.to(towers.device).eval() if lora is not None else None
        self._lora_key = lora.key if lora is not None else None
        self._batch_precision = batch_precision

    @property
    def batch_precision(self) -> str:
        """``fp32`` or ``bf16``: the text tower's precision in batch encodes (products, training
        features, evals; :mod:`vitrine.encoders.precision`). ``auto`` is measured on first use."""
        if self._batch_precision == "auto":
            self._batch_precision = resolve_batch_precision("auto", self.towers.device.type)
        return self._batch_precision

    @property
    def lock(self) -> threading.Lock:
        """Held by every forward of the towers (their feature taps keep per-forward state):
        whoever runs the towers outside this class (tracing an export) holds it too."""
        return self._lock

    @classmethod
    def create(
        cls,
        model: str = DEFAULT_MODEL,
        adapter: str | os.PathLike[str] | Adapter | None = None,
        *,
        features_only: bool = False,
        pretrained: str | None = None,
        device: str = "auto",
        image_size: tuple[int, int] | None = None,
        cache_path: str | os.PathLike[str] | None = None,
        batch_size: int = 64,
        max_image_bytes: int = 10_000_000,
        max_image_pixels: int = 40_000_000,
        batch_precision: str = "auto",
    ) -> "MultimodalEncoder":
        dev = pick_device(device)
        towers = create_towers(model, pretrained=pretrained, device=dev, image_size=image_size)
        adapter_obj: Adapter | None
        if features_only:
            adapter_obj = None
        elif adapter is None:
            from vitrine.encoders.adapters import create_adapter

            adapter_obj = create_adapter("identity", image_dim=towers.image_dim, text_dim=towers.text_dim)
        elif isinstance(adapter, Adapter):
            adapter_obj = adapter
        else:
            adapter_obj = load_adapter(adapter)
        lora = None
        if adapter_obj is not None and adapter_obj.config.get("lora") and not isinstance(adapter, Adapter) \
                and adapter is not None:
            from vitrine.encoders.adapters import WEIGHTS_DIR
            from vitrine.encoders.lora import has_lora, load_lora

            folder = Path(adapter) if has_lora(adapter) else WEIGHTS_DIR / str(adapter)
            lora = load_lora(folder, towers)
        expected = adapter_obj.config.get("towers_key") if adapter_obj is not None else None
        if expected and expected != towers.key:
            raise ModelError(
                f"adapter {adapter} was trained on towers {expected}, but these are {towers.key}: "
                "retrain it (vitrine train gate) or pick the matching model"
            )
        return cls(
            towers, adapter_obj, batch_size=batch_size,
            cache=FeatureCache(cache_path) if cache_path else None,
            max_image_bytes=max_image_bytes, max_image_pixels=max_image_pixels, lora=lora,
            batch_precision=batch_precision,
        )

    @property
    def adapter(self) -> Adapter:
        if self._adapter is None:
            raise ModelError("this encoder was built for backbone features only (no adapter)")
        return self._adapter

    @property
    def dim(self) -> int:
        return self.adapter.dim

    @property
    def model_key(self) -> str:
        """Identifies towers + adapter weights: vectors made under another key are stale."""
        h = hashlib.sha256(self.towers.key.encode())
        for name, t in sorted(self.adapter.state_dict().items()):
            h.update(name.encode())
            h.update(t.detach().cpu().numpy().tobytes())
        if self._lora_key:
            h.update(self._lora_key.encode())
        return f"{self.towers.key}+{self.adapter.kind}-{h.hexdigest()[:12]}"

    # -- backbone features ---------------------------------------------------------------
    def decode(self, data: bytes) -> Image.Image:
        return decode_image(data, max_bytes=self.max_image_bytes, max_pixels=self.max_image_pixels)

    def image_features(
        self, images: Sequence[bytes], *, progress: bool = False, errors: dict[int, str] | None = None,
        view: str | None = None, adapted: bool = False,
    ) -> np.ndarray:
        """Backbone features for photos given as encoded bytes, (N, image_dim) float32.

        With ``errors`` given, an undecodable image leaves a NaN row and its reason under its
        position in ``errors``; without it, the first bad image raises :class:`InvalidImage`.
        ``view`` (training only): features of an augmented view of each photo
        (:func:`~vitrine.encoders.images.augment_view`), cached under their own keys.
        ``adapted``: through the image tower's LoRA deltas (:meth:`shared_image_features`).
        """
        n = len(images)
        out = np.zeros((n, self.towers.image_dim), dtype=np.float32)
        kind = "img" if view is None else f"img@{check_view(view)}"
        tower_key = self._lora_key if adapted and self._lora_key else self.towers.key
        keys = [_digest(kind, tower_key, b) for b in images]
        cached = self.cache.get_many(keys) if self.cache else {}
        todo = [i for i, k in enumerate(keys) if k not in cached]
        for i, k in enumerate(keys):
            if k in cached:
                out[i] = cached[k]
        bar: Any = progress_bar(total=len(todo), desc="photos" if view is None else f"photos ({view})", unit="img",
                                enabled=progress and bool(todo))
        for start in range(0, len(todo), self.batch_size):
            chunk = todo[start:start + self.batch_size]
            pixels, ok = [], []
            for i in chunk:
                try:
                    img = self.decode(images[i])
                    if view is not None:
                        img = augment_view(img, view, images[i])
                    pixels.append(self.towers.preprocess(img))
                    ok.append(i)
                except InvalidImage as e:
                    if errors is None:
                        raise
                    errors[i] = str(e)
                    out[i] = np.nan
            if pixels:
                feats = (self.shared_pixel_features if adapted else self.pixel_features)(torch.stack(pixels))
                out[ok] = feats
                if self.cache:
                    self.cache.put_many((keys[i], feats[j]) for j, i in enumerate(ok))
            bar.update(len(chunk))
        bar.close()
        return out

    def pixel_features(self, pixels: torch.Tensor, *, precision: str = "fp32") -> np.ndarray:
        """Image-tower features of preprocessed photos (N, 3, H, W), in cache-sized forwards on CPU.
        Photos stay float32 in every encode (:mod:`vitrine.encoders.precision` says why);
        ``precision`` ``bf16`` is for measuring that choice (``vitrine bench batch-precision``)."""
        step = IMAGE_FORWARD_BATCH if self.towers.device.type == "cpu" else max(1, len(pixels))
        with self._lock:  # the tower's feature taps keep per-forward state
            return torch.cat([self.towers.image_features(pixels[s:s + step], precision=precision)
                              for s in range(0, len(pixels), step)]).cpu().numpy()

    def reads_as_word(self, word: str) -> bool:
        """Whether the text tower knows ``word`` as a word of its own (Towers.reads_as_word)."""
        return self.towers.reads_as_word(word)

    def text_features(self, texts: Sequence[str], *, progress: bool = False) -> np.ndarray:
        """Backbone features for texts, (N, text_dim) float32."""
        n = len(texts)
        out = np.zeros((n, self.towers.text_dim), dtype=np.float32)
        keys = [_digest("txt", self.towers.key, t.encode("utf-8")) for t in texts]
        cached = self.cache.get_many(keys) if self.cache else {}
        todo = [i for i, k in enumerate(keys) if k not in cached]
        for i, k in enumerate(keys):
            if k in cached:
                out[i] = cached[k]
        bar: Any = progress_bar(total=len(todo), desc="texts", unit="txt", enabled=progress and bool(todo))
        # tokenized once: the ids sort the batches and feed the tower
        ids = self.towers.tokenize([texts[i] for i in todo]) if len(todo) > 1 else None
        tokens = dict(zip(todo, ids)) if ids is not None else {}
        precision = self.batch_precision if todo else "fp32"
        for chunk in self.length_batches(texts, todo, lengths=[len(x) for x in ids] if ids is not None else None):
            with self._lock, batch_autocast(precision, self.towers.device.type):
                feats = (self.towers.text_features_of_tokens([tokens[i] for i in chunk]) if tokens
                         else self.towers.text_features([texts[i] for i in chunk])).cpu().numpy()
            out[chunk] = feats
            if self.cache:
                self.cache.put_many((keys[i], feats[j]) for j, i in enumerate(chunk))
            bar.update(len(chunk))
        bar.close()
        return out

    def length_batches(self, texts: Sequence[str], todo: Sequence[int], *,
                       lengths: Sequence[int] | None = None) -> Iterator[list[int]]:
        """Positions ``todo`` of ``texts`` in forwards of ``batch_size``, sorted by token length.

        A forward pads every text to its longest, so a batch in catalogue order pays for its
        longest text many times over (512 titles of 11 tokens on average, 47 at most: 47 vs 109
        texts/s). Sorted, forwards of 64 beat 256 (375 vs 308 texts/s on 2 threads, 250 vs 191 on
        one: docs/performance.md). Callers scatter each batch's rows back by position, so the
        order of the result is the caller's; a text's vector does not depend on its batch (the
        attention mask hides the padding: equal to float rounding, tests/test_ingest_speed.py).
        ``lengths``: the token lengths of ``todo``'s texts when the caller has them."""
        if not todo:
            return
        order = list(todo)
        if len(order) > 1:
            if lengths is None:
                lengths = self.towers.token_lengths([texts[i] for i in order])
            order = [i for _, i in sorted(zip(lengths, order))]
        bs = self.batch_size
        for start in range(0, len(order), bs):
            yield order[start:start + bs]

    # -- the adapter's inputs (the towers' features, through their LoRA deltas when loaded) ------
    @property
    def adapts_text(self) -> bool:
        return self.lora is not None and self.lora.spec.text

    @property
    def adapts_image(self) -> bool:
        return self.lora is not None and self.lora.spec.image

    def shared_text_features(self, texts: Sequence[str], *, native: np.ndarray | None = None,
                             progress: bool = False) -> np.ndarray:
        """Text features that feed the adapter: the frozen tower's (``native`` when already at
        hand) unless LoRA deltas adapt the text tower; those are cached under the deltas' key."""
        if not self.adapts_text:
            return native if native is not None else self.text_features(texts, progress=progress)
        assert self.lora is not None and self._lora_key is not None
        keys = [_digest("txt", self._lora_key, t.encode("utf-8")) for t in texts]
        got = self.cache.get_many(keys) if self.cache else {}
        out = np.zeros((len(texts), self.towers.text_dim), dtype=np.float32)
        todo = [i for i, k in enumerate(keys) if k not in got]
        for i, k in enumerate(keys):
            if k in got:
                out[i] = got[k]
        for chunk in self.length_batches(texts, todo):
            with self._lock, torch.inference_mode():
                feats = self.lora.text_features([texts[i] for i in chunk]).cpu().numpy()
            out[chunk] = feats
            if self.cache:
                self.cache.put_many((keys[i], feats[j]) for j, i in enumerate(chunk))
        return out

    def shared_image_features(self, images: Sequence[bytes], *, progress: bool = False,
                              errors: dict[int, str] | None = None) -> np.ndarray:
        """Photo features that feed the adapter (as :meth:`image_features`, through the image
        tower's LoRA deltas when loaded)."""
        if not self.adapts_image:
            return self.image_features(images, progress=progress, errors=errors)
        return self.image_features(images, progress=progress, errors=errors, adapted=True)

    def shared_pixel_features(self, pixels: torch.Tensor) -> np.ndarray:
        """:meth:`pixel_features` through the image tower's LoRA deltas when loaded."""
        if not self.adapts_image:
            return self.pixel_features(pixels)
        assert self.lora is not None
        step = IMAGE_FORWARD_BATCH if self.towers.device.type == "cpu" else max(1, len(pixels))
        with self._lock:
            return torch.cat([self.lora.pixel_features(self.towers, pixels[s:s + step])
                              for s in range(0, len(pixels), step)]).cpu().numpy()

    # -- shared space ----------------------------------------------------------------------
    def query_photo_weight(self, image_vec: np.ndarray, text_vec: np.ndarray, default: float) -> float:
        """The photo's weight for a query with a photo and words (their shared-space vectors): the
        adapter's per-query choice when it makes one (the MoE's modality gate), else ``default``."""
        fn = getattr(self.adapter, "query_photo_weight", None)
        if fn is None:
            return default
        with torch.inference_mode():
            w = fn(torch.from_numpy(np.asarray(image_vec, dtype=np.float32)[None]),
                   torch.from_numpy(np.asarray(text_vec, dtype=np.float32)[None]))
        return float(w[0])

    @torch.inference_mode()
    def embed(self, image_feats: np.ndarray | None, text_feats: np.ndarray | None) -> Embeddings:
        """Adapter over backbone features. Rows whose image features are NaN count as no photo."""
        if image_feats is not None:
            n = len(image_feats)
        elif text_feats is not None:
            n = len(text_feats)
        else:
            raise InvalidInput("nothing to embed: give image features, text features or both")
        dev = self.towers.device
        dim = self.adapter.dim
        img_out = np.zeros((n, dim), dtype=np.float32) if image_feats is not None else None
        txt_out = np.zeros((n, dim), dtype=np.float32) if text_feats is not None else None
        fused = np.zeros((n, dim), dtype=np.float32)
        has_img = (
            ~np.isnan(image_feats).any(axis=1) if image_feats is not None else np.zeros(n, dtype=bool)
        )
        aux: dict = {}
        bs = 4096
        with self._lock:
            for s in range(0, n, bs):
                sl = slice(s, s + bs)
                t = torch.from_numpy(text_feats[sl]).to(dev) if text_feats is not None else None
                im_mask = has_img[sl]
                if image_feats is not None and img_out is not None and im_mask.all():
                    out = self.adapter(torch.from_numpy(image_feats[sl]).to(dev), t)
                    img_out[sl] = out.image.cpu().numpy()
                    if out.text is not None and txt_out is not None:
                        txt_out[sl] = out.text.cpu().numpy()
                    fused[sl] = out.fused.cpu().numpy()
                    aux = out.aux
                    continue
                # Mixed batch: rows without a usable photo go through the text-only path.
                idx = np.arange(s, min(s + bs, n))
                with_img, without = idx[im_mask], idx[~im_mask]
                if len(with_img):
                    # rows with a photo: there are image features (has_img is all False without)
                    assert image_feats is not None and img_out is not None
                    out = self.adapter(
                        torch.from_numpy(image_feats[with_img]).to(dev),
                        torch.from_numpy(text_feats[with_img]).to(dev) if text_feats is not None else None,
                    )
                    img_out[with_img] = out.image.cpu().numpy()
                    if out.text is not None and txt_out is not None:
                        txt_out[with_img] = out.text.cpu().numpy()
                    fused[with_img] = out.fused.cpu().numpy()
                if len(without):
                    if text_feats is None or txt_out is None:
                        continue  # no modality at all: leaves a zero vector
                    out = self.adapter(None, torch.from_numpy(text_feats[without]).to(dev))
                    txt_out[without] = out.text.cpu().numpy()
                    fused[without] = out.fused.cpu().numpy()
        return Embeddings(image=img_out, text=txt_out, fused=fused, aux=aux)

    def encode(
        self, texts: Sequence[str] | None = None, images: Sequence[bytes] | None = None, *, progress: bool = False
    ) -> Embeddings:
        """Texts and/or photos (aligned by position) -> shared-space embeddings."""
        tf = self.shared_text_features(texts, progress=progress) if texts is not None else None
        imf = self.shared_image_features(images, progress=progress) if images is not None else None
        return self.embed(imf, tf)
