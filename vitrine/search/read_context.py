"""What every step of the read path shares: :class:`ReadContext` (the ``reader`` the steps take).

A reader is the index state (vitrine/search/state.py) seen by a query, plus the parts a ranking
needs beside it:

- the settings (the search, intent, encoders and storage sections are read);
- the query fast path (vitrine/encoders/queries.py) over the state's serving encoder: concurrent
  queries encoded in one forward, an LRU cache of query embeddings; rebuilt when a hot swap
  replaces the encoder;
- the catalogue's calibration (vitrine/search/calibration.py): how text queries rank here;
- the plain vector ranking, and the ids a filter allows;
- the search-as-you-type suggestions (vitrine/search/suggestions.py), whose catalogue words the
  intent rule also reads.

The steps of a search (fusion, fallback, understanding, storefront, recommend) take a reader;
none of them knows the engine. The search that composes them is vitrine/search/reads.py.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import numpy as np

from vitrine.encoders.batching import LRUCache
from vitrine.encoders.encoder import MultimodalEncoder
from vitrine.encoders.queries import QueryEncoder, TextQuery
from vitrine.search import calibration, variants
from vitrine.search.calibration import Calibration
from vitrine.search.models import Filters, Ranked
from vitrine.search.state import IndexState
from vitrine.search.suggestions import Suggestions
from vitrine.settings import Settings

log = logging.getLogger(__name__)


class ReadContext:
    """The index state as a query sees it, with the query encoder and the calibration."""

    def __init__(self, state: IndexState, settings: Settings) -> None:
        self.state = state
        self.settings = settings
        self.data_dir = Path(settings.storage.data_dir)
        self._query_cache: LRUCache[np.ndarray] = LRUCache(settings.encoders.query_cache_size)
        self._query_encoder: QueryEncoder | None = None
        self._query_encoder_lock = threading.Lock()
        self._calibration: Calibration | None = None
        self._calibration_seq = -1
        # search-as-you-type phrases, and the catalogue's words the intent rule reads
        self.suggestions = Suggestions(state)

    @property
    def encoder(self) -> MultimodalEncoder:
        """The serving encoder (the state's: a hot swap replaces it with the vectors)."""
        return self.state.encoder

    # -- the query fast path ---------------------------------------------------------------------
    @property
    def query_encoder(self) -> QueryEncoder:
        """The query fast path over the current encoder: concurrent queries encoded in one forward,
        an LRU cache of query embeddings keyed by model key. Rebuilt when the encoder is swapped."""
        qe = self._query_encoder
        if qe is not None and qe.encoder is self.encoder:
            return qe
        with self._query_encoder_lock:
            qe = self._query_encoder
            if qe is None or qe.encoder is not self.encoder:
                s = self.settings
                new = QueryEncoder(
                    self.encoder, cache=self._query_cache, max_batch=s.encoders.query_batch_max,
                    max_wait_ms=s.encoders.query_batch_wait_ms, text_precision=s.encoders.query_text_precision,
                    threads=s.encoders.query_threads, runtime=s.encoders.query_runtime, onnx_dir=s.storage.cache_dir,
                )
                if qe is not None:
                    qe.close()
                self._query_encoder = qe = new
            return qe

    @property
    def query_encoder_built(self) -> bool:
        """Whether the query fast path exists yet (it is built on first use, or by warming up)."""
        return self._query_encoder is not None

    def reset_query_encoder(self, *, clear_cache: bool = False) -> None:
        """Drop the query fast path (the next query builds it again from the current settings);
        ``clear_cache``: forget the cached query embeddings too."""
        with self._query_encoder_lock:
            qe, self._query_encoder = self._query_encoder, None
        if qe is not None:
            qe.close()
        if clear_cache:
            self._query_cache.clear()

    def close(self) -> None:
        self.reset_query_encoder()

    def query_vectors(self, text: str | None, image: bytes | None, text_query: TextQuery | None = None,
                      *, timeout_s: float | None = None) -> dict[str, np.ndarray]:
        """Shared-space query vectors per modality present (``text_query``: the text's encode,
        started earlier with ``query_encoder.text_query``). Both encodes run in the query fast
        path's batcher threads while this one waits for them, at most ``timeout_s`` in all
        (TimeoutError past it; the abandoned encodes finish in the background)."""
        deadline = None if timeout_s is None else time.perf_counter() + timeout_s
        qe = self.query_encoder
        futures: dict[str, Future[np.ndarray]] = {}
        if text:
            futures["text"] = (text_query or qe.text_query(text)).shared_future()
        if image is not None:
            futures["image"] = qe.image_future(image)  # a photo that cannot be decoded raises here
        return {m: f.result(None if deadline is None else max(0.0, deadline - time.perf_counter()))
                for m, f in futures.items()}

    def native_query_vector(self, text: str) -> np.ndarray | None:
        """The query's vector in the text tower's own space (vitrine/search/native.py), or None
        when the native space cannot serve this encoder."""
        if not self.state.native.usable_with(self.encoder.towers.key):
            return None
        return self.query_encoder.native(text)

    # -- calibration -------------------------------------------------------------------------------
    @property
    def calibration(self) -> Calibration:
        """How text queries rank on this catalogue: the data dir's tuned settings while they fit
        the catalogue and model, else the floor (vitrine/search/calibration.py). Re-checked when
        the records change."""
        override = variants.calibration()  # this search's experiment variant (vitrine/search/variants.py)
        if override is not None:
            return override
        records = self.state.records
        seq = records.recent_seq()
        cal = self._calibration
        if cal is None or seq != self._calibration_seq:
            s = self.settings
            cal = calibration.floor("settings: calibration=floor") if s.search.calibration == "floor" else \
                calibration.load(self.data_dir, records, self.state.store_id, self.state.model_key,
                                 s.search.tune_max_drift)
            self._calibration, self._calibration_seq = cal, seq
        return cal

    def set_calibration(self, cal: Calibration) -> None:
        """Serve ``cal`` until the records change or it is reloaded (tuning tries candidates)."""
        self._calibration, self._calibration_seq = cal, self.state.records.recent_seq()

    def reload_calibration(self) -> Calibration:
        """Read the data dir's tuned settings again (after `vitrine tune` wrote them)."""
        self._calibration = None
        return self.calibration

    @property
    def relevance_floor(self) -> float:
        """The share of a query's top score that a product must reach to count as matching: the one
        `vitrine tune` fitted to this catalogue (``relevance_floor_tuned``), else the settings'."""
        s = self.settings.search
        fitted = self.calibration.relevance_floor if s.relevance_floor_tuned and s.calibration != "off" else None
        return s.relevance_floor if fitted is None else fitted

    def slot_filters_on(self, language: str = "en") -> bool:
        """Whether the intent classifier's slots filter results: configured on, and (unless
        calibration is off) found useful on this catalogue by `vitrine tune` for queries in
        ``language``; a language the tuning did not measure keeps them on."""
        s = self.settings
        if not s.intent.intent_slot_filters or s.search.calibration == "off":
            return s.intent.intent_slot_filters
        cal = self.calibration
        return cal.slot_filters or language not in cal.slot_languages

    # -- the plain vector ranking -----------------------------------------------------------------
    def query_image_weight(self, qv: dict[str, np.ndarray]) -> float:
        """The photo's weight for a photo + words query: the aligner's per-query choice
        (``query_mix="gate"``, the MoE's modality gate) or the fixed ``query_image_weight``."""
        if self.settings.search.query_mix != "gate":
            return self.settings.search.query_image_weight
        return self.encoder.query_photo_weight(qv["image"], qv["text"], self.settings.search.query_image_weight)

    def rank_vectors(self, qv: dict[str, np.ndarray], k: int, allowed: np.ndarray | None) -> Ranked:
        """Vector ranking. Text searches the fused product vectors, a photo searches photo
        vectors; with both, candidates of each are re-scored by the weighted sum."""
        return self.state.rank(qv, k, allowed, image_weight=self.query_image_weight(qv) if len(qv) > 1 else 0.0,
                               multiplier=self.settings.search.candidate_multiplier)

    def allowed_ids(self, filters: Filters | None) -> np.ndarray | None:
        """The product ids ``filters`` allow (None: no filter)."""
        return self.state.allowed(filters)
