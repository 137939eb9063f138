"""The query fast path: search queries -> shared-space vectors, batched and cached.

A search query is one short text or one photo, and many arrive at once under load. Encoding
each alone pays a whole model forward per request; ``QueryEncoder`` instead

- looks the query up in an LRU cache of query embeddings keyed by the encoder's model key,
  the text tower's precision and the normalised text (or the photo's SHA-256), so a cached
  vector can never come from another model (a new adapter or towers means a new key);
- sends misses through a dynamic micro-batcher (:class:`~vitrine.encoders.batching.MicroBatcher`)
  per modality: requests arriving together are encoded in one forward, in
  ``torch.inference_mode`` and with a deliberate torch thread count in the worker thread
  (photos: tower + adapter; texts: the tower, then the adapter per text when its shared-space
  vector is wanted: :meth:`QueryEncoder.text_query` makes it only when read, since a text query
  ranked by the text tower's own cosine needs the tower's vector alone);
- can run the text tower in reduced precision for queries only (``int8``: dynamic
  quantisation of its Linear layers; ``bf16``): product vectors are unchanged, so switching
  needs no re-indexing. Whether that keeps quality is measured (`vitrine bench fastpath`);
- picks what runs the towers (torch, or onnxruntime graphs through :func:`vitrine.onnxrt.choose`).
  The graphs and the reduced-precision copies are built by :mod:`vitrine.encoders.query_export`;
  concurrent asks for one query share its encode (:class:`~vitrine.encoders.batching.InFlight`).

Photo decoding and preprocessing happen in the caller's thread (a bad photo fails only its
own request); the batch runs the image tower and the adapter. Query texts and photos never
enter the SQLite feature cache (which is for catalogue items).
"""

from __future__ import annotations

import hashlib
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from vitrine import onnxrt
from vitrine.encoders.batching import InFlight, LRUCache, MicroBatcher, done
from vitrine.encoders.encoder import MultimodalEncoder
from vitrine.encoders.query_export import (PRECISIONS, Precision, QueryGraphs, export_query_graphs,
                                           quantize_text_tower)
from vitrine.errors import InvalidInput, ModelError
from vitrine.lang.render import for_tower
from vitrine.onnxrt import OnnxModule

log = logging.getLogger(__name__)

Runtime = Literal["auto", "torch", "onnx"]
Key = tuple[str, str, str, str]
NATIVE_HANDOFF = 256  # native vectors kept even with the query cache off: more than the queries in flight


class QueryEncoder:
    """Batched, cached query encoding over one :class:`MultimodalEncoder`.

    ``cache`` may be shared between query encoders (entries are keyed by model key), e.g. when
    an engine swaps its encoder. ``threads`` sets torch's intra-op threads of the batch workers
    (None: leave torch's setting).
    """

    def __init__(
        self,
        encoder: MultimodalEncoder,
        *,
        cache: LRUCache[np.ndarray] | None = None,
        cache_size: int = 4096,
        max_batch: int = 32,
        max_wait_ms: float = 1.0,
        text_precision: Precision | str = "fp32",
        threads: int | None = None,
        runtime: Runtime | str = "torch",
        onnx_dir: Path | None = None,
    ) -> None:
        if text_precision not in PRECISIONS and text_precision != "auto":
            raise InvalidInput(f"unknown text precision {text_precision!r}; use auto or one of "
                               f"{', '.join(PRECISIONS)}")
        self.encoder = encoder
        self.model_key = encoder.model_key  # hashes the adapter weights: once, not per query
        towers = encoder.towers
        if text_precision != "fp32" and towers.hf_tokenizer is None:
            log.warning("text precision %s needs a Hugging Face text tower; %s keeps fp32", text_precision,
                        towers.name)
            text_precision = "fp32"
        if text_precision == "int8" and towers.device.type != "cpu":
            log.warning("int8 dynamic quantisation runs on CPU only; the %s text tower keeps fp32",
                        towers.device.type)
            text_precision = "fp32"
        # auto: int8 where onnxruntime runs the text tower (its recipe holds quality, measured in
        # `vitrine bench fastpath`), else fp32 (torch's int8 recipe does not hold it)
        self._want_precision = str(text_precision)
        self.text_precision = "fp32" if text_precision == "auto" else str(text_precision)
        self._lowercase = bool(getattr(towers.hf_tokenizer, "do_lower_case", False))
        self.cache: LRUCache[np.ndarray] = cache if cache is not None else LRUCache(cache_size)
        # the text tower's own (native) unit vectors of recent query texts, kept by the same forward:
        # at least the queries in flight even with the cache off (size 0), so that reading a
        # query's native vector never runs the tower a second time
        self.native_cache: LRUCache[np.ndarray] = LRUCache(max(cache_size, NATIVE_HANDOFF))
        # the text tower's features of recent query texts (the adapter's input), as the cache above
        self.feature_cache: LRUCache[np.ndarray] = LRUCache(self.cache.size)
        self.threads = threads
        self._text_module: torch.nn.Module | None = None
        if towers.hf_tokenizer is not None:
            # int8 is made after the runtime is picked: onnxruntime quantises its own graph
            self._text_module = quantize_text_tower(towers.model.text, "bf16" if self.text_precision == "bf16"
                                                    else "fp32")
            self._text_device = towers.device
        self._onnx_text: OnnxModule | None = None
        self._onnx_image: OnnxModule | None = None
        self.runtime = self._pick_runtime(str(runtime), onnx_dir)
        if self.runtime == "torch" and self.text_precision == "int8" and self._text_module is not None:
            self._text_module = quantize_text_tower(towers.model.text, "int8")
            self._text_device = torch.device("cpu")  # quantized Linear layers live on CPU
        wait = max_wait_ms / 1000.0
        self._text = MicroBatcher(self._text_feature_rows, max_batch=max_batch, max_wait_s=wait,
                                  name="vitrine-query-text", on_start=self._thread_setup)
        self._image = MicroBatcher(self._encode_pixels, max_batch=max_batch, max_wait_s=wait,
                                   name="vitrine-query-image", on_start=self._thread_setup)
        self._in_flight: InFlight[np.ndarray] = InFlight(self.cache)
        self._closed = False
        self._close_lock = threading.Lock()

    def _pick_runtime(self, runtime: str, onnx_dir: Path | None) -> str:
        """"torch" or "onnx": what runs the query towers (text and photo). ``auto`` takes
        onnxruntime when it is installed and the towers qualify (fp32 Hugging Face text tower, on
        CPU), else torch; an explicit ``onnx`` that cannot be had raises."""
        towers = self.encoder.towers
        why = None
        if self._text_module is None:
            why = "the text tower has no Hugging Face tokenizer"
        elif self.text_precision == "bf16":
            why = "text precision bf16 runs in torch"
        elif towers.device.type != "cpu":
            why = f"the towers run on {towers.device.type}"
        module = self._text_module

        def build() -> QueryGraphs:
            assert module is not None  # without it there is an obstacle, and choose builds nothing
            return export_query_graphs(self.encoder, module, precision=self._want_precision, onnx_dir=onnx_dir,
                                       threads=self.threads or 1)

        graphs = onnxrt.choose(runtime, "query", build, obstacle=why)
        if graphs is None:
            return "torch"
        self._onnx_text, self._onnx_image = graphs.text, graphs.image
        if graphs.int8:
            self.text_precision = "int8"
        return "onnx"

    # -- public ------------------------------------------------------------------------------------
    def text(self, texts: Sequence[str]) -> np.ndarray:
        """Shared-space vectors of query texts, (N, dim) float32: the text tower in the batcher,
        the adapter over every missing text in one call. Chinese is read as its English rendering
        (:func:`vitrine.lang.render.for_tower`), as a product's Chinese title was at ingest."""
        texts = [for_tower(t) for t in texts]
        keys = [self._text_key(t) for t in texts]
        out: list[np.ndarray | None] = [self.cache.get(k) for k in keys]
        todo = [i for i, v in enumerate(out) if v is None]
        if todo:
            waits = [self._text.submit(texts[i]) for i in todo]  # concurrent submits share forwards
            feats = np.stack([f.result() for f in waits])
            for i, v in zip(todo, self._shared_rows([texts[i] for i in todo], feats)):
                self.cache.put(keys[i], v)
                out[i] = v
        return self._stack(out)

    def text_query(self, text: str) -> "TextQuery":
        """One query text's encode, started now: the text tower runs in the batcher; the adapter's
        shared-space vector is made only if :meth:`TextQuery.vector` asks for it (a text query
        ranked by the text tower's own cosine never does). A cached vector comes back done."""
        text = for_tower(text)
        v = self.cache.get(self._text_key(text))
        if v is not None:
            return TextQuery(self, text, None, v)
        f = self.feature_cache.get(self._feature_key(text))
        return TextQuery(self, text, done(f) if f is not None else self._text.submit(text))

    def shared_vector(self, text: str, features: np.ndarray) -> np.ndarray:
        """The shared-space vector of ``text`` from its text-tower ``features`` (the adapter, in
        the caller's thread), cached like every query vector."""
        text = for_tower(text)
        key = self._text_key(text)
        v = self.cache.get(key)
        if v is None:
            v = self._shared_rows([text], np.array(features, dtype=np.float32)[None])[0]  # a writable copy for torch
            self.cache.put(key, v)
        return v

    def native(self, text: str) -> np.ndarray:
        """A query text's vector in the text tower's own space (its L2-normalised output, before
        the adapter), (text_dim,) float32: kept from the forward that made the shared-space
        vector when there was one, else computed now."""
        text = for_tower(text)
        key = (self.encoder.towers.key, self.text_precision, "n", self.normalise(text))
        v = self.native_cache.get(key)
        if v is None:
            v = _rows(unit_rows(self.text_features([text])))[0]
            self.native_cache.put(key, v)
        return v

    def image(self, photos: Sequence[bytes]) -> np.ndarray:
        """Shared-space vectors of query photos (encoded bytes), (N, dim) float32; a photo that
        cannot be decoded raises :class:`~vitrine.errors.InvalidImage`."""
        keys = [self._image_key(p) for p in photos]
        return self._lookup(keys, lambda i: self._submit_photo(photos[i]))

    def image_future(self, photo: bytes) -> Future[np.ndarray]:
        """One query photo's vector as a future. The photo is decoded here, in the caller's thread
        (a photo that cannot be decoded raises :class:`~vitrine.errors.InvalidImage` now); the
        tower runs in the batcher."""
        key = self._image_key(photo)
        v = self.cache.get(key)
        if v is not None:
            return done(v)
        return self._in_flight.get(key, lambda: self._submit_photo(photo))

    def _submit_photo(self, photo: bytes) -> Future[np.ndarray]:
        px = self.encoder.towers.preprocess(self.encoder.decode(photo))  # bad photo: raises here
        return self._image.submit(px)

    def _lookup(self, keys: list[Key], submit: Callable[[int], Future[np.ndarray]]) -> np.ndarray:
        """Cached vectors, else the in-flight or a new encode of each key."""
        out: list[np.ndarray | None] = [self.cache.get(k) for k in keys]
        waits = [(i, self._in_flight.get(keys[i], functools.partial(submit, i)))
                 for i, v in enumerate(out) if v is None]
        for i, fut in waits:
            out[i] = fut.result()
        return self._stack(out)

    def _stack(self, rows: list[np.ndarray | None]) -> np.ndarray:
        """The rows, every one filled by now, as one (N, dim) array."""
        full = [v for v in rows if v is not None]
        if len(full) != len(rows):
            raise ModelError("a query vector is missing")  # cannot happen: every row was filled
        if not full:
            return np.zeros((0, self.encoder.dim), dtype=np.float32)
        return np.stack(full)

    def stats(self) -> dict[str, Any]:
        return {"model": self.model_key, "text_precision": self.text_precision, "runtime": self.runtime, "cache": self.cache.stats(),
                "text_batches": self._text.stats(), "image_batches": self._image.stats()}

    def close(self) -> None:
        with self._close_lock:
            if not self._closed:
                self._closed = True
                self._text.close()
                self._image.close()

    # -- keys -----------------------------------------------------------------------------------------
    def normalise(self, text: str) -> str:
        t = " ".join(text.split())
        return t.lower() if self._lowercase else t

    def _text_key(self, text: str) -> Key:
        return (self.model_key, self.text_precision, "t", self.normalise(text))

    def _feature_key(self, text: str) -> Key:
        return (self.encoder.towers.key, self.text_precision, "f", self.normalise(text))

    def _image_key(self, photo: bytes) -> Key:
        return (self.model_key, "", "i", hashlib.sha256(photo).hexdigest())

    # -- batch functions (run in the batcher threads) ---------------------------------------------
    def _thread_setup(self) -> None:
        if self.threads:
            torch.set_num_threads(self.threads)

    @torch.inference_mode()
    def text_features(self, texts: list[str]) -> np.ndarray:
        """Backbone text features through the query text tower (its precision), (N, text_dim)."""
        towers = self.encoder.towers
        if self._text_module is None:  # open_clip tokenizer towers: the encoder's own path
            with self.encoder.lock:
                return towers.text_features(list(texts)).cpu().numpy()
        if self._onnx_text is not None and self.text_precision == "int8":
            # one text per run: dynamic int8 scales activations by the whole input tensor, so in a
            # batch a query's vector would depend on its neighbours (and their padding)
            rows = [self._onnx_text(towers.hf_tokenizer([t], truncation=True, max_length=towers.context_length,
                                                        return_tensors="np")["input_ids"].astype(np.int64))
                    for t in texts]
            return np.concatenate(rows) if rows else np.zeros((0, towers.text_dim), dtype=np.float32)
        batch = towers.hf_tokenizer(list(texts), padding=True, truncation=True, max_length=towers.context_length,
                                    return_tensors="pt")
        if self._onnx_text is not None:
            return self._onnx_text(batch["input_ids"].numpy())
        ids = batch["input_ids"].to(self._text_device)
        # A text forward keeps no state, so even the shared fp32 tower needs no lock here.
        return self._text_module(ids).float().cpu().numpy()

    def _text_feature_rows(self, texts: list[str]) -> list[np.ndarray]:
        """The batcher's work for query texts: the text tower's features (each text's native
        vector kept in ``native_cache``); the adapter runs apart (:meth:`_shared_rows`)."""
        feats = self.text_features(texts)
        tk = self.encoder.towers.key
        rows = _rows(feats)
        for t, v, f in zip(texts, _rows(unit_rows(feats)), rows):
            self.native_cache.put((tk, self.text_precision, "n", self.normalise(t)), v)
            self.feature_cache.put(self._feature_key(t), f)
        return rows

    def _shared_rows(self, texts: list[str], feats: np.ndarray) -> list[np.ndarray]:
        """The adapter over query texts' tower features: their shared-space vectors."""
        emb = self.encoder.embed(None, self.encoder.shared_text_features(texts, native=feats)).text
        if emb is None:  # pragma: no cover - an adapter always gives text vectors for text input
            raise ModelError("the adapter returned no text vectors")
        return _rows(emb)

    @torch.inference_mode()
    def _encode_pixels(self, pixels: list[torch.Tensor]) -> list[np.ndarray]:
        px = torch.stack(pixels)
        if self.encoder.adapts_image:  # the image tower's LoRA deltas run in torch
            feats = self.encoder.shared_pixel_features(px)
        elif self._onnx_image is not None:
            trunk = torch.from_numpy(self._onnx_image(px.numpy()))
            feats = self.encoder.towers.with_histogram(trunk, px).numpy()
        else:
            feats = self.encoder.pixel_features(px)
        emb = self.encoder.embed(feats, None).image
        if emb is None:  # pragma: no cover
            raise ModelError("the adapter returned no image vectors")
        return _rows(emb)


class TextQuery:
    """A query text's encode in flight (:meth:`QueryEncoder.text_query`): the text tower's forward
    now, in the batcher; the adapter's shared-space vector once, when first asked for."""

    def __init__(self, encoder: QueryEncoder, text: str, features: Future[np.ndarray] | None,
                 vector: np.ndarray | None = None) -> None:
        self.text = text
        self._encoder = encoder
        self._features = features
        self._vector = vector
        self._lock = threading.Lock()

    def wait(self, timeout: float | None = None) -> None:
        """Until the text tower's forward is done (the native vector is then cached); raises
        TimeoutError past ``timeout`` seconds, or what the forward raised."""
        if self._features is not None:
            self._features.result(timeout)

    def vector(self, timeout: float | None = None) -> np.ndarray:
        """The shared-space vector (the adapter runs in this thread, once)."""
        with self._lock:
            if self._vector is None:
                assert self._features is not None
                self._vector = self._encoder.shared_vector(self.text, self._features.result(timeout))
            return self._vector

    def shared_future(self) -> Future[np.ndarray]:
        """The shared-space vector as a future: the adapter runs in the batcher's thread right after
        the text tower (so a caller's wait, with its time budget, covers both)."""
        if self._vector is not None or self._features is None:
            return done(self.vector())
        out: Future[np.ndarray] = Future()

        def finish(f: Future[np.ndarray]) -> None:
            try:
                out.set_result(self.vector())
            except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the future
                out.set_exception(e)

        self._features.add_done_callback(finish)
        return out


def unit_rows(a: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (a zero row stays zero): the text tower's native vectors."""
    a = np.asarray(a, dtype=np.float32)
    n = np.linalg.norm(a, axis=1, keepdims=True)
    return a / np.where(n > 0, n, 1.0)


def _rows(a: np.ndarray) -> list[np.ndarray]:
    a = np.ascontiguousarray(a, dtype=np.float32)
    a.flags.writeable = False  # cached vectors are shared: nobody may change them in place
    return list(a)
