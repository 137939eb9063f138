"""The engine: a facade over one write path and one read path of one data dir.

write (vitrine/search/writes.py): validated products (+ photo bytes) -> encoder (towers ->
       adapter) -> one SQLite transaction (records + vectors + photos) -> in-memory vector and
       filter indexes.
read (vitrine/search/reads.py): query -> encoder (query vectors) -> filters -> FAISS -> records
       -> hits with explanation.

Below both, one owner of the index state: :class:`~vitrine.search.state.IndexState`
(``engine.index``): the record store and every index over it, the serving model, their change
sequence and their locks (opening a data dir: vitrine/search/recovery.py). The read path's steps
(fusion, fallback, understanding, storefront, recommend) take a
:class:`~vitrine.search.read_context.ReadContext` over that state; hot swaps (vitrine/search/swap.py) take
the state, the settings and the write path's snapshot. None of them knows the engine: it builds
them and delegates, so its methods are the API the web app, the CLI, evals and benchmarks call.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from vitrine.encoders.encoder import MultimodalEncoder
from vitrine.encoders.queries import QueryEncoder, TextQuery
from vitrine.errors import NotFound, StorageError, VitrineError
from vitrine.index.bm25 import MemoryBM25
from vitrine.feedback.eventlog import open_event_log
from vitrine.index.failover import FailoverRecordStore
from vitrine.index.filters import FilterIndex
from vitrine.index.graph import ProductGraph
from vitrine.index.vocabulary import GraphData
from vitrine.index.snapshots import SnapshotStore
from vitrine.index.store import PhotoStoreAPI, RecordStoreAPI
from vitrine.index.vectors import VectorIndexAPI
from vitrine.search import native, recovery
from vitrine.feedback import learning
from vitrine.search import swap as hotswap
from vitrine.search.artifacts import ModelSpec, read_active_model, served_artifacts
from vitrine.search.calibration import Calibration
from vitrine.search.models import (
    CompareResponse,
    FacetsResponse,
    Filters,
    ProductOut,
    Ranked,
    RecommendResponse,
    SearchRequest,
    SearchResponse,
    UpsertReport,
)
from vitrine.experiments.runner import Experiments
from vitrine.feedback.intake import EventIn, Feedback
from vitrine.feedback.learning import LearnResult
from vitrine.search.read_context import ReadContext
from vitrine.search.reads import ReadPath
from vitrine.search.stages import Stage, StageFactory
from vitrine.search.state import IndexState, LoadedIndexes
from vitrine.search.suggestions import SuggestResponse, Suggestions
from vitrine.search.understanding import QueryUnderstanding
from vitrine.search.writes import ProductInput, WritePath
from vitrine.conversation.stage import SessionStage
from vitrine.feedback.explore import ExploreStage
from vitrine.feedback.stage import LearnedRerank
from vitrine.merchandising.rules import RuleBook
from vitrine.merchandising.stage import RulesStage
from vitrine.settings import Settings

log = logging.getLogger(__name__)

# The jobs around every search, in the order the read path calls them (vitrine/search/stages.py):
# a session's standing query first, then the re-ranking learned from clicks, then the shop's rules,
# which have the last word on the pool. A new job around a search is one module with a Stage and
# one line here (docs/design.md, "Rooms").
STAGES: tuple[StageFactory, ...] = (
    SessionStage.open,
    LearnedRerank.open,
    ExploreStage.open,
    RulesStage.open,
)
S = TypeVar("S", bound=Stage)


class Engine:
    """Vitrine's search engine over one data dir. Build with :meth:`open`."""

    def __init__(self, settings: Settings, encoder: MultimodalEncoder, loaded: LoadedIndexes | None = None,
                 stages: Sequence[StageFactory] = STAGES) -> None:
        self.settings = settings
        self.data_dir = Path(settings.storage.data_dir)
        enc = settings.encoders
        # the index state below the engine: stores, indexes, serving model, change sequence, locks
        self.index = IndexState(settings.storage, settings.index, encoder,
                                ModelSpec(enc.model, enc.adapter, enc.pretrained))
        self.writes = WritePath(self.index, settings)
        self.hotswap = hotswap.HotSwap(self.index, settings, save=self.writes.save)
        MemoryBM25.typo_tolerance = settings.index.typo_tolerance  # one engine per process sets it
        reembed = (lambda: self.writes.reembed(progress=True)) if settings.index.reembed_on_open else None
        recovery.open_indexes(self.index, reembed, loaded)
        self.reader = ReadContext(self.index, settings)
        if loaded is not None and loaded.suggestions is not None and self.index.recovery.get("shared"):
            self.reader.suggestions.adopt(loaded.suggestions)
        else:
            self.reader.suggestions.load_saved()
        # the read path; its query intent + slots (vitrine/intent) are loaded here, never at import
        self.reads = ReadPath(self.reader, stages)
        self._feedback: Feedback | None = None
        self._feedback_lock = threading.Lock()
        self._experiments: Experiments | None = None

    # -- the index state's parts (owned by self.index) -----------------------------------------
    @property
    def encoder(self) -> MultimodalEncoder:
        """The serving encoder (the state's; a hot swap replaces it with the vectors)."""
        return self.index.encoder

    @encoder.setter
    def encoder(self, encoder: MultimodalEncoder) -> None:
        self.index.encoder = encoder

    @property
    def model_spec(self) -> ModelSpec:
        return self.index.model_spec

    @property
    def records(self) -> RecordStoreAPI:
        return self.index.records

    @property
    def images(self) -> PhotoStoreAPI:
        return self.index.images

    @property
    def vectors(self) -> dict[str, VectorIndexAPI]:
        return self.index.vectors

    @property
    def native(self) -> native.NativeSpace:
        return self.index.native

    @property
    def filters(self) -> FilterIndex:
        return self.index.filters

    @property
    def graph(self) -> ProductGraph:
        return self.index.graph

    @property
    def graph_data(self) -> GraphData:
        return self.index.graph_data

    @property
    def snapshots(self) -> SnapshotStore:
        return self.index.snapshots

    @property
    def snapshot_version(self) -> str | None:
        return self.index.snapshot_version

    @property
    def recovery(self) -> dict[str, Any]:
        """What opening the data dir found and did (logged, /health)."""
        return self.index.recovery

    @property
    def store_id(self) -> str:
        return self.index.store_id

    @property
    def model_key(self) -> str:
        """The model the served vectors were made by."""
        return self.index.model_key

    @property
    def understanding(self) -> QueryUnderstanding | None:
        """The read path's intent classifier and slots (None: intent off)."""
        return self.reads.understanding

    def stage(self, kind: type[S]) -> S:
        """The read path's stage of type ``kind`` (vitrine/search/stages.py); NotFound when none."""
        for st in self.reads.stages:
            if isinstance(st, kind):
                return st
        raise NotFound("stage", kind.__name__)

    @property
    def rules(self) -> RuleBook:
        """The merchandising rules the API and CLI edit (vitrine/merchandising/rules.py)."""
        return self.stage(RulesStage).book

    @property
    def swaps(self) -> list[dict[str, Any]]:
        """Hot swaps tried by this process (newest last; the last 20)."""
        return self.hotswap.history

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def open(cls, settings: Settings, encoder: MultimodalEncoder | None = None, *,
             loaded: LoadedIndexes | None = None) -> "Engine":
        """Load models (unless given) and open ``settings.data_dir``, recovering indexes (or
        serving ``loaded``: those the process this one was forked from opened, :meth:`loaded_indexes`).

        A data dir whose model was hot-swapped opens with that model (``follow_swap``); when its
        artifacts fail their checksums the configured model serves instead, and says so."""
        notes: list[str] = []
        if encoder is None:
            active = read_active_model(Path(settings.storage.data_dir) / "index") \
                if settings.swap.follow_swap else None
            if active and (active["model"], active["adapter"], active.get("pretrained")) != \
                    (settings.encoders.model, settings.encoders.adapter, settings.encoders.pretrained):
                swapped = settings.updated(**{
                    "model": active["model"], "adapter": active["adapter"], "pretrained": active.get("pretrained"),
                    "index_factory": active.get("index_factory") or settings.index.index_factory})
                try:
                    encoder = build_encoder(swapped)
                    log.warning("serving adapter %s / towers %s, activated by a hot swap (configured: %s / %s; "
                                "VITRINE_FOLLOW_SWAP=false serves the configured one)", active["adapter"],
                                active["model"], settings.encoders.adapter, settings.encoders.model)
                    settings = swapped
                except VitrineError as e:
                    notes.append(f"the hot-swapped model {active['adapter']} is unusable ({e}); "
                                 f"serving the configured {settings.encoders.adapter}")
                    log.error("%s", notes[-1])
            if encoder is None:
                encoder = build_encoder(settings)
        eng = cls(settings, encoder, loaded)
        if notes:
            eng.recovery.setdefault("notes", []).extend(notes)
        return eng

    # -- calibration (the reader's) ------------------------------------------------------------
    @property
    def calibration(self) -> Calibration:
        """How text queries rank on this catalogue (vitrine/search/read_context.py)."""
        return self.reader.calibration

    def slot_filters_on(self) -> bool:
        """Whether the intent classifier's slots filter results on this catalogue."""
        return self.reader.slot_filters_on()

    def set_calibration(self, cal: Calibration) -> None:
        """Serve ``cal`` until the records change or it is reloaded (tuning tries candidates)."""
        self.reader.set_calibration(cal)

    def reload_calibration(self) -> Calibration:
        """Read the data dir's tuned settings again (after `vitrine tune` wrote them)."""
        return self.reader.reload_calibration()

    # -- writes (vitrine/search/writes.py) -------------------------------------------------------
    def upsert(self, items: Sequence[ProductInput], *, progress: bool = False) -> UpsertReport:
        """Encode and store products; unchanged and stale ones are skipped, bad ones reported."""
        return self.writes.upsert(items, progress=progress)

    def delete(self, ids: Sequence[str], versions: Sequence[int | None] | None = None) -> int:
        """Delete products by id; unknown ids are ignored. Returns how many were deleted.

        With ``versions``, a delete older than the stored version is ignored (stale)."""
        return self.writes.delete(ids, versions)

    def reembed(self, *, progress: bool = False, photo_loader: Callable[[str], bytes | None] | None = None) -> int:
        """Re-embed every product whose vectors came from another model (photos from the store)."""
        return self.writes.reembed(progress=progress, photo_loader=photo_loader)

    # -- several processes on one data dir (ingest workers, API replicas) -------------------------
    def refresh(self) -> int:
        """Catch up with what other processes wrote to this data dir (an ingest worker beside
        API replicas): replays the records changed since the indexes' sequence number. Cheap when
        nothing changed. Returns the number of changed records applied."""
        return self.index.refresh()

    @property
    def needs_snapshot(self) -> bool:
        """Whether the indexes changed since the last snapshot version."""
        return self.index.needs_snapshot

    def wait_for_writes(self) -> None:
        """Return once the write (or snapshot) in flight, if any, has finished."""
        self.index.wait_for_writes()

    def save(self) -> bool:
        """Publish a snapshot version of the indexes (vitrine/search/state.py). Returns False if
        nothing changed since the last one."""
        return self.writes.save()

    def artifacts(self) -> dict[str, Any]:
        """SHA-256 of every model artifact serving this engine (towers, adapter, intent)."""
        intent = self.settings.intent
        return served_artifacts(self.model_spec, self.encoder, intent.intent_model if intent.intent else None)

    def loaded_indexes(self) -> LoadedIndexes:
        """The in-memory indexes, for processes forked from this one to serve (``Engine.open(...,
        loaded=)``) without loading their own: their pages stay shared until a process changes them."""
        return dataclasses.replace(self.index.loaded(), suggestions=self.suggestions.shared_index())

    def close(self) -> None:
        try:
            self.reader.suggestions.settle()  # a suggestion build underway is kept by the last version
            self.save()
        finally:
            self.index.close()
            self.reader.close()
            self.reads.close()  # the stages' stores (sessions, rules)
            if self._feedback is not None:
                self._feedback.log.close()

    # -- reads (vitrine/search/reads.py) -----------------------------------------------------------
    def __len__(self) -> int:
        return len(self.index)

    def get(self, pid: str) -> ProductOut:
        return self.reads.get(pid)

    def image_path(self, key: str) -> Path:
        path = self.images.path_for(key)
        if not path.is_file():
            raise NotFound("image", key)
        return path

    def query_vectors(self, text: str | None, image: bytes | None, text_query: TextQuery | None = None,
                      *, timeout_s: float | None = None) -> dict[str, np.ndarray]:
        """Shared-space query vectors per modality present (vitrine/search/read_context.py)."""
        return self.reader.query_vectors(text, image, text_query, timeout_s=timeout_s)

    @property
    def query_encoder(self) -> QueryEncoder:
        """The query fast path over the current encoder (vitrine/search/read_context.py)."""
        return self.reader.query_encoder

    def allowed_ids(self, filters: Filters | None) -> np.ndarray | None:
        """The product ids ``filters`` allow (None: no filter)."""
        return self.reader.allowed_ids(filters)

    def search(self, req: SearchRequest, *, image: bytes | None = None, log_search: bool = False,
               client: str | None = None) -> SearchResponse:
        """Search by text, photo (``image`` bytes or ``req.image_b64``) or both, with filters.
        ``log_search``: log it (with ``client``, who asked) and give it a ``query_id`` (the API's)."""
        if not log_search:
            return self._mark_store(self.reads.search(req, image=image))
        # an API search: ranked as its experiment variant wants (vitrine/experiments/runner.py), then logged
        try:
            experiments = self.experiments
        except StorageError as e:  # the shared store is down and the log was never opened: search, unlogged
            log.debug("search not logged: %s", e)
            return self._mark_store(self.reads.search(req, image=image))
        res, assigned = experiments.search(req, lambda r: self.reads.search(r, image=image))
        try:
            self.feedback.log_search(req, res, experiment=assigned.experiment.name if assigned else None,
                                     client=client)
            experiments.after_log(assigned, res)
        except StorageError as e:  # the store is down: the search stands, unlogged (no query_id to send events for)
            log.debug("search not logged: %s", e)
        return self._mark_store(res)

    def store_status(self) -> tuple[bool, float]:
        """Whether reads come from the local copy of the documents because the shared store is
        down (vitrine/index/failover.py), and the seconds since it last answered."""
        rs = self.index.records
        if isinstance(rs, FailoverRecordStore) and rs.degraded:
            return True, rs.stale_s
        return False, 0.0

    def _mark_store(self, res: SearchResponse) -> SearchResponse:
        down, stale = self.store_status()
        if down:
            if "store" not in res.degraded:
                res.degraded.append("store")
            res.stale_s = stale
        return res

    @property
    def experiments(self) -> Experiments:
        """A/B experiments on ranking, kept in the feedback log's database (opened with it)."""
        ex = self._experiments
        if ex is None:
            log = self.feedback.log  # opened first: it takes the same lock
            with self._feedback_lock:
                ex = self._experiments
                if ex is None:
                    ex = self._experiments = Experiments(log, self.data_dir)
        return ex

    # -- shopper feedback (vitrine/feedback/intake.py) ---------------------------------------------
    @property
    def feedback(self) -> Feedback:
        """Search logging and event intake over this data dir's feedback log (opened on first use:
        SQLite ``events.sqlite`` in the data dir, or tables in the PostgreSQL store)."""
        fb = self._feedback
        if fb is None:
            with self._feedback_lock:
                fb = self._feedback
                if fb is None:
                    events = open_event_log(self.settings.storage.store, self.data_dir)
                    fb = self._feedback = Feedback(events, self.settings.feedback)
        return fb

    def learn_from_log(self, *, heldout: float = 0.3, now: float | None = None, save: bool = True) -> LearnResult:
        """Learn a per-query re-ranking from the search log, kept only if it beats what serves on
        a later slice of the log (vitrine/feedback/learning.py)."""
        return learning.learn_from_log(self.feedback.log, self.stage(LearnedRerank).learned, self._first_ids, self.settings.feedback,
                                       self.data_dir, heldout=heldout, now=now, save=save)

    def _first_ids(self, text: str) -> list[str]:
        return [h.id for h in self.search(SearchRequest(text=text, k=learning.POOL)).results]

    def record_events(self, events: Sequence[EventIn], client: str | None = None) -> tuple[int, int]:
        """Validate and store a batch of shopper events (all or none) from ``client``; (accepted, new)."""
        return self.feedback.record(events, client=client)

    def record_valid_events(self, events: Sequence[EventIn]) -> tuple[int, int, list[tuple[int, str]]]:
        """Store the valid events of a batch, name the invalid ones: (accepted, new, [(index,
        reason)]) (the Kafka worker's intake: bad events become dead letters)."""
        return self.feedback.record_valid(events)

    def warm_up(self) -> float:
        """Build what the first queries would otherwise build inside their time budgets (the
        query fast path, the in-memory BM25 postings, the slot vocabulary, the graph's caches,
        the suggestion index). Returns the seconds it took."""
        return self.reads.warm_up()

    # -- search-as-you-type (vitrine/search/suggestions.py) ----------------------------------------
    @property
    def suggestions(self) -> Suggestions:
        """The suggestion indexes; ``suggestions.set_popular(fn)`` adds logged queries."""
        return self.reader.suggestions

    def suggest(self, q: str, k: int = 8) -> SuggestResponse:
        """Completions of a search box's prefix ``q`` from the catalogue and the popular logged
        queries, typo tolerant; an empty ``q`` gives representative phrases (examples)."""
        return self.reader.suggestions.suggest(q, k)

    def rank_vectors(self, qv: dict[str, np.ndarray], k: int, allowed: np.ndarray | None) -> Ranked:
        """The plain vector ranking (vitrine/search/read_context.py)."""
        return self.reader.rank_vectors(qv, k, allowed)

    # -- recommendations and comparisons (vitrine/search/recommend.py) ---------------------------
    def recommend(self, pid: str, kind: str = "similar", k: int = 10) -> RecommendResponse:
        """Similar products (same category, nearest in the shared space, MMR-diversified) or
        complementary ones (complementary categories via the graph, colour-compatible, same
        gender); NotFound for an unknown id, InvalidInput for a bad kind or k."""
        return self.reads.recommend(pid, kind, k)

    def compare(self, ids: list[str]) -> CompareResponse:
        """Compare 2..5 distinct products: attributes, pairwise similarities, graph relation."""
        return self.reads.compare(ids)

    def compare_text(self, text: str) -> CompareResponse:
        """Compare what "A vs B" names: each side resolved by search, best match of each."""
        return self.reads.compare_text(text)

    def vector_of(self, pid: str, field: str = "fused") -> np.ndarray:
        return self.reads.vector_of(pid, field)

    def facets(self, fields: Sequence[str] | None = None, limit: int = 50) -> FacetsResponse:
        """Filter values per field, most common first (at most ``limit`` each)."""
        return self.reads.facets(fields, limit)

    def stats(self) -> dict[str, Any]:
        clf = self.understanding.classifier if self.understanding is not None else None
        return {
            "products": len(self), "with_photo": len(self.vectors["image"]), "seq": self.records.seq,
            "model": self.model_key, "adapter": self.settings.encoders.adapter,
            "index": self.settings.index.index_factory,
            "data_dir": str(self.data_dir),
            # the intent classifier serving: its ensemble members and runtime (None: intent off or unavailable)
            "intent": {"model": self.settings.intent.intent_model, "members": 1 + len(clf.members),
                       "runtime": clf.runtime}
            if clf is not None else None,
        }

    # -- hot swap (vitrine/search/swap.py) ---------------------------------------------------------
    def swap(self, req: "hotswap.SwapRequest", *, progress: bool = False) -> "hotswap.SwapReport":
        """Load a new model version or index snapshot beside the live one, check it on the canary
        queries, switch atomically; raises SwapRefused (saying why) and keeps serving otherwise."""
        return self.hotswap.swap(req, progress=progress)

    def install(self, cand: "hotswap.Candidate") -> list[str]:
        """Switch to a checked candidate: catch it up with the latest writes, then swap models and
        indexes in one exclusive step; remember the model in the data dir and snapshot it."""
        return self.hotswap.install(cand)

    def record_swap(self, report: "hotswap.SwapReport") -> None:
        self.hotswap.record(report)


def build_encoder(settings: Settings) -> MultimodalEncoder:
    """The encoder named by settings (towers + adapter), with the shared feature cache."""
    import torch

    if settings.encoders.torch_threads:
        torch.set_num_threads(settings.encoders.torch_threads)
    if settings.index.search_threads:
        from vitrine.index.vectors import set_search_threads

        set_search_threads(settings.index.search_threads)
    return MultimodalEncoder.create(
        settings.encoders.model,
        settings.encoders.adapter if settings.encoders.adapter != "none" else None,
        pretrained=settings.encoders.pretrained,
        device=settings.encoders.device,
        image_size=settings.encoders.image_size,
        cache_path=settings.storage.feature_cache_path,
        batch_size=settings.encoders.encode_batch_size,
        max_image_bytes=settings.encoders.max_image_bytes,
        max_image_pixels=settings.encoders.max_image_pixels,
        batch_precision=settings.encoders.batch_precision,
    )
