"""The engine: one write path (upsert/delete) and one read path (search).

write: validated products (+ photo bytes) -> encoder (towers -> adapter) -> one SQLite
       transaction (records + vectors + photos) -> in-memory vector and filter indexes.
read:  query -> encoder (query vectors) -> filters -> FAISS -> records -> hits with explanation.

The engine is a facade: the record store and every index over it, their change sequence and
their locks belong to one owner, :class:`~vitrine.search.state.IndexState` (``engine.index``;
opening a data dir: vitrine/search/recovery.py). The engine encodes, ranks and explains.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vitrine.encoders.batching import LRUCache
from vitrine.encoders.encoder import MultimodalEncoder
from vitrine.encoders.queries import QueryEncoder
from vitrine.errors import InvalidInput, NotFound, StorageError, VitrineError
from vitrine.index.bm25 import MemoryBM25
from vitrine.index.filters import FilterIndex
from vitrine.index.graph import GraphData, ProductGraph
from vitrine.index.records import RecordRow
from vitrine.index.snapshots import SnapshotStore
from vitrine.index.store import PhotoStoreAPI, RecordStoreAPI
from vitrine.index.vectors import VectorIndex
from vitrine.search.models import (
    CompareResponse,
    Explanation,
    FacetsResponse,
    Filters,
    Hit,
    ItemError,
    Product,
    ProductOut,
    RecommendResponse,
    SearchRequest,
    SearchResponse,
    UpsertReport,
    decode_b64,
)
from vitrine.search import calibration, fusion, native, recommend, recovery
from vitrine.search import understanding
from vitrine.search import fallback
from vitrine.search import swap as hotswap
from vitrine.search import storefront
from vitrine.search.concurrency import reads_state
from vitrine.settings import Settings
from vitrine.search.state import (  # noqa: F401 - FILTER_FIELDS, INDEX_FIELDS, filter_values: re-exported
    FILTER_FIELDS,
    INDEX_FIELDS,
    IndexState,
    Ranked,
    filter_values,
    product_fields,
    product_out,
)

log = logging.getLogger(__name__)

@dataclass
class ProductInput:
    """A validated product and its photo bytes (resolved by the caller), or why there are none."""

    product: Product
    image: bytes | None = None
    image_error: str | None = None
    line: int | None = None


def product_text(p: Product) -> str:
    """The words a product is embedded by: its title, plus brand and category leaf when the
    title does not already say them."""
    parts = [p.title]
    low = p.title.casefold()
    if p.brand and p.brand.casefold() not in low:
        parts.append(p.brand)
    if p.category and p.category[-1].casefold() not in low:
        parts.append(p.category[-1])
    return " ".join(parts)


class Engine:
    """Vitrine's search engine over one data dir. Build with :meth:`open`."""

    def __init__(self, settings: Settings, encoder: MultimodalEncoder) -> None:
        self.settings = settings
        self.encoder = encoder
        self.data_dir = Path(settings.storage.data_dir)
        # the index state below the engine: stores, indexes, change sequence, locks (vitrine/search/state.py)
        self.index = IndexState(settings.storage, settings.index, dim=encoder.dim, towers_key=encoder.towers.key,
                                text_dim=encoder.towers.text_dim, model_key=encoder.model_key,
                                text_features=lambda texts: self.encoder.text_features(texts))
        self.swaps: list[dict[str, Any]] = []  # hot swaps tried by this process (newest last)
        enc = settings.encoders
        self.model_spec = hotswap.ModelSpec(enc.model, enc.adapter, enc.pretrained)
        # the query fast path (micro-batched, cached query embeddings); built on first use
        self._query_cache: LRUCache[np.ndarray] = LRUCache(settings.encoders.query_cache_size)
        self._query_encoder: QueryEncoder | None = None
        self._query_encoder_lock = threading.Lock()
        MemoryBM25.typo_tolerance = settings.index.typo_tolerance  # one engine per process sets it
        reembed = (lambda: self.reembed(progress=True)) if settings.index.reembed_on_open else None
        recovery.open_indexes(self.index, reembed)
        self._calibration: calibration.Calibration | None = None
        self._calibration_seq = -1
        # query intent + slots (vitrine/intent), loaded here, never at import
        self.understanding = understanding.QueryUnderstanding(self, settings) if settings.intent.intent else None

    # -- the index state's parts (owned by self.index) -----------------------------------------
    @property
    def records(self) -> RecordStoreAPI:
        return self.index.records

    @property
    def images(self) -> PhotoStoreAPI:
        return self.index.images

    @property
    def vectors(self) -> dict[str, VectorIndex]:
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

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def open(cls, settings: Settings, encoder: MultimodalEncoder | None = None) -> "Engine":
        """Load models (unless given) and open ``settings.data_dir``, recovering indexes.

        A data dir whose model was hot-swapped opens with that model (``follow_swap``); when its
        artifacts fail their checksums the configured model serves instead, and says so."""
        notes: list[str] = []
        if encoder is None:
            active = hotswap.read_active_model(Path(settings.storage.data_dir) / "index") \
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
        eng = cls(settings, encoder)
        if notes:
            eng.recovery.setdefault("notes", []).extend(notes)
        return eng

    @property
    def calibration(self) -> calibration.Calibration:
        """How text queries rank on this catalogue: the data dir's tuned settings while they fit
        the catalogue and model, else the floor (vitrine/search/calibration.py). Re-checked when
        the records change."""
        seq = self.records.recent_seq()
        cal = self._calibration
        if cal is None or seq != self._calibration_seq:
            s = self.settings
            cal = calibration.floor("settings: calibration=floor") if s.search.calibration == "floor" else \
                calibration.load(self.data_dir, self.records, self.store_id, self.model_key, s.search.tune_max_drift)
            self._calibration, self._calibration_seq = cal, seq
        return cal

    def slot_filters_on(self) -> bool:
        """Whether the intent classifier's slots filter results: configured on, and (unless
        calibration is off) found useful on this catalogue by `vitrine tune`."""
        s = self.settings
        return s.intent.intent_slot_filters and (s.search.calibration == "off" or self.calibration.slot_filters)

    def set_calibration(self, cal: calibration.Calibration) -> None:
        """Serve ``cal`` until the records change or it is reloaded (tuning tries candidates)."""
        self._calibration, self._calibration_seq = cal, self.records.recent_seq()

    def reload_calibration(self) -> calibration.Calibration:
        """Read the data dir's tuned settings again (after `vitrine tune` wrote them)."""
        self._calibration = None
        return self.calibration

    # -- writes ---------------------------------------------------------------------------------
    def upsert(self, items: Sequence[ProductInput], *, progress: bool = False) -> UpsertReport:
        """Encode and store products; unchanged and stale ones are skipped, bad ones reported."""
        t0 = time.time()
        report = UpsertReport()
        # One product per id per call: the last occurrence wins, as it would in a stream.
        by_id: dict[str, ProductInput] = {}
        for it in items:
            by_id.pop(it.product.id, None)
            by_id[it.product.id] = it
        todo: list[tuple[ProductInput, bytes | None, str | None]] = []
        with self.index.write_lock:
            existing = self.records.get_many(list(by_id), include_deleted=True)
            for pid, it in by_id.items():
                img = it.image
                if img is None and it.product.image_b64:
                    try:
                        img = decode_b64(it.product.image_b64)
                    except InvalidInput as e:
                        report.failed.append(ItemError(id=pid, line=it.line, reason=str(e)))
                        continue
                if it.image_error:
                    report.failed.append(ItemError(id=pid, line=it.line, reason=it.image_error))
                    continue
                img_sha = hashlib.sha256(img).hexdigest() if img is not None else None
                h = it.product.content_hash(img_sha)
                old = existing.get(pid)
                if old is not None:
                    if it.product.version is not None and old.version is not None and it.product.version < old.version:
                        report.stale += 1
                        continue
                    if not old.deleted and old.content_hash == h and old.model_key == self.model_key \
                            and old.version == it.product.version:
                        report.unchanged += 1
                        continue
                todo.append((it, img, img_sha))
            if todo:
                rows = self._encode_rows(todo, report, progress=progress)
                if rows:
                    photos = {it.product.id: img for it, img, _ in todo if img is not None}
                    # photos first: a record never points at a missing file
                    self.images.put_many({r.image_key: photos[r.id] for r in rows if r.image_key})
                    seq = self.index.commit(rows)  # searches see all of this write or none of it
                    report.upserted += len(rows)
                    report.seq = seq
        report.seconds = time.time() - t0
        return report

    def _encode_rows(
        self, todo: list[tuple[ProductInput, bytes | None, str | None]], report: UpsertReport, *, progress: bool
    ) -> list[RecordRow]:
        texts = [product_text(it.product) for it, _, _ in todo]
        with_img = [i for i, (_, img, _) in enumerate(todo) if img is not None]
        img_errors: dict[int, str] = {}
        img_feats = np.full((len(todo), self.encoder.towers.image_dim), np.nan, dtype=np.float32)
        if with_img:
            feats = self.encoder.shared_image_features([todo[i][1] for i in with_img],  # type: ignore[misc]
                                                       progress=progress, errors=img_errors)
            img_feats[with_img] = feats
        txt_feats = self.encoder.text_features(texts, progress=progress)
        bad = {with_img[j] for j in img_errors}
        keep = [i for i in range(len(todo)) if i not in bad]
        for j, reason in img_errors.items():
            it = todo[with_img[j]][0]
            report.failed.append(ItemError(id=it.product.id, line=it.line, reason=f"photo: {reason}"))
        if not keep:
            return []
        shared_txt = self.encoder.shared_text_features([texts[i] for i in keep], native=txt_feats[keep])
        emb = self.encoder.embed(img_feats[keep], shared_txt)
        native_vecs = native.unit_rows(txt_feats[keep])
        rows: list[RecordRow] = []
        for n, i in enumerate(keep):
            it, img, sha = todo[i]
            has_img = img is not None
            rows.append(RecordRow(
                id=it.product.id,
                doc=it.product.document(),
                content_hash=it.product.content_hash(sha),
                version=it.product.version,
                image_key=_image_key(sha, img) if has_img else None,  # type: ignore[arg-type]
                model_key=self.model_key,
                vectors={
                    "fused": emb.fused[n],
                    "image": emb.image[n] if has_img and emb.image is not None else None,
                    "text": emb.text[n] if emb.text is not None else None,
                    "native": native_vecs[n],
                },
            ))
        return rows

    def delete(self, ids: Sequence[str], versions: Sequence[int | None] | None = None) -> int:
        """Delete products by id; unknown ids are ignored. Returns how many were deleted.

        With ``versions``, a delete older than the stored version is ignored (stale)."""
        return self.index.delete(ids, versions)

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
        return self.index.save(self.model_spec.as_dict(), self.artifacts)

    def artifacts(self) -> dict[str, Any]:
        """SHA-256 of every model artifact serving this engine (towers, adapter, intent)."""
        try:
            return hotswap.model_artifacts(self.model_spec, self.encoder,
                                           self.settings.intent.intent_model if self.settings.intent.intent else None)
        except (OSError, ValueError, VitrineError) as e:
            return {"error": str(e)}

    def close(self) -> None:
        try:
            self.save()
        finally:
            self.index.close()
            if self._query_encoder is not None:
                self._query_encoder.close()


    # -- reads -----------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.vectors["fused"])

    @reads_state
    def get(self, pid: str) -> ProductOut:
        row = self.records.get(pid)
        if row is None:
            raise NotFound("product", pid)
        return product_out(row)

    def image_path(self, key: str) -> Path:
        path = self.images.path_for(key)
        if not path.is_file():
            raise NotFound("image", key)
        return path

    def product_out(self, row: RecordRow) -> ProductOut:
        """A stored record as the API shows a product."""
        return product_out(row)


    def query_vectors(self, text: str | None, image: bytes | None, text_vector: Future[np.ndarray] | None = None,
                      *, timeout_s: float | None = None) -> dict[str, np.ndarray]:
        """Shared-space query vectors per modality present (``text_vector``: the text's encode,
        started earlier with ``query_encoder.text_future``). Both encodes run in the query fast
        path's batcher threads while this one waits for them, at most ``timeout_s`` in all
        (TimeoutError past it; the abandoned encodes finish in the background)."""
        deadline = None if timeout_s is None else time.perf_counter() + timeout_s
        qe = self.query_encoder
        futures: dict[str, Future[np.ndarray]] = {}
        if text:
            futures["text"] = text_vector if text_vector is not None else qe.text_future(text)
        if image is not None:
            futures["image"] = qe.image_future(image)  # a photo that cannot be decoded raises here
        return {m: f.result(None if deadline is None else max(0.0, deadline - time.perf_counter()))
                for m, f in futures.items()}

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

    def allowed_ids(self, filters: Filters | None) -> np.ndarray | None:
        """The product ids ``filters`` allow (None: no filter)."""
        return self.index.allowed(filters)


    @reads_state
    def search(self, req: SearchRequest, *, image: bytes | None = None) -> SearchResponse:
        """Search by text, photo (``image`` bytes or ``req.image_b64``) or both, with filters."""
        t0 = time.perf_counter()
        s = self.settings
        if req.k > s.search.max_k:
            raise InvalidInput(f"k must be between 1 and {s.search.max_k}")
        depth = storefront.pool_depth(s.search, req)  # the same pool for every page (vitrine/search/storefront.py)
        text = " ".join((req.text or "").split()) or None
        if text and len(text) > s.search.max_text_chars:
            text = text[: s.search.max_text_chars]
        if image is None and req.image_b64:
            image = decode_b64(req.image_b64)
        if not text and image is None:
            raise InvalidInput("empty query: give text, a photo, or both")
        self._prepare_query_encoder()
        early = self._encode_early(req, text)  # the text's encode runs while the classifier does
        plan = understanding.plan(self, req, text)  # intent + slots -> filters; degrades, never raises
        if plan.answer is not None and plan.answer_only:  # a sure after-sales query: an answer, no ranking
            return understanding.answer_response(self, req, text, image is not None, plan, t0)
        qv, gate = fallback.query_vectors(self, text, image, early)  # degrades (gate), never fails
        allowed = understanding.allowed_ids(self, plan)
        window = req.model_copy(update={"k": req.offset + req.k})  # slots fill every page up to this one
        scored, vector_scores, degraded, terms = understanding.fill_to_k(  # slots never leave fewer than k
            self, window, plan, self._guarded_rank(qv, text, req.k, allowed, depth),
            lambda ids: self._guarded_rank(qv, text, req.k, ids, depth))
        degraded = gate + degraded
        view = storefront.arrange(self, req, scored,
                                  exhaustive=allowed is not None and len(allowed) <= depth and not plan.backfill)
        rows = self.records.get_by_iids([iid for iid, _, _ in view.page])
        hits: list[Hit] = []
        applied = plan.filters.model_dump(exclude_none=True) if plan.filters else {}
        marks = storefront.Highlighter(text) if req.highlight else None
        for iid, score, parts in view.page:
            row = rows.get(iid)
            if row is None:  # deleted between ranking and fetching
                continue
            hit = Hit(score=round(float(score), 6), **product_fields(row))  # one validation per hit
            if marks is not None:
                hit.highlights = marks.of(hit.title, hit.description)
            if req.explain:
                hit.explanation = Explanation(
                    vector_score=round(float(vector_scores.get(iid, score)), 6),
                    signals={k: round(float(v), 6) for k, v in parts.items()},
                    modalities=sorted(qv), **plan.explanation(iid, applied),
                )
            hits.append(hit)
        resp = SearchResponse(
            results=hits, took_ms=round((time.perf_counter() - t0) * 1000, 3), k=req.k,
            query={"text": text, "image": image is not None, "filters": applied,
                   **({"graph_terms": terms.phrases} if terms else {}), **plan.query_info()},
            model=self.model_key, degraded=degraded + plan.degraded, **view.response_fields(req),
        )
        return understanding.finish(self, req, text, plan, resp)

    def warm_up(self) -> float:
        """Build what the first queries would otherwise build inside their time budgets (the
        query fast path, the in-memory BM25 postings, the slot vocabulary, the graph's caches):
        a first search took 0.8 s on the full catalogue, and could degrade. Runs a few real
        searches; returns the seconds it took."""
        t0 = time.perf_counter()
        self._prepare_query_encoder()
        for text in ("red shoes", "nike vs puma running shoes", "women blue shirt under 1500"):
            try:
                self.search(SearchRequest(text=text, k=5))
            except Exception as e:  # noqa: BLE001 - warming is best effort: real requests report errors
                log.warning("warm-up search %r failed: %s", text, e)
        try:  # text queries at the floor skip BM25; queries with a photo still use it
            self.records.bm25_scores("warm up")
        except Exception as e:  # noqa: BLE001
            log.warning("warm-up BM25 failed: %s", e)
        took = time.perf_counter() - t0
        log.info("warmed up in %.2fs", took)
        return took

    def _prepare_query_encoder(self) -> None:
        """Build the query fast path (an ONNX export, or loading one and checking it against torch)
        before the query's time budget starts: one-time set-up is not the query's latency, and a
        first query must not degrade for it. A failure here is left to the guarded step, which
        degrades."""
        try:
            self.query_encoder  # noqa: B018 - the property builds it once and keeps it
        except Exception as e:  # noqa: BLE001
            log.warning("query fast path not built: %s", e)

    def _encode_early(self, req: SearchRequest, text: str | None) -> Future[np.ndarray] | None:
        """Start the query text's encode before intent classification when both will run (an
        after-sales query then wastes one encode; every other query waits for the slower of the
        two instead of their sum). None: encode later, in the guarded query-vector step."""
        if not text or self.understanding is None or not req.use_intent:
            return None
        try:
            return self.query_encoder.text_future(text)
        except Exception as e:  # noqa: BLE001 - the guarded step retries and degrades if need be
            log.warning("early query encode not started: %s", e)
            return None

    def _guarded_rank(self, qv: dict[str, np.ndarray], text: str | None, k: int,
                      allowed: np.ndarray | None, depth: int) -> tuple[Any, dict[int, float], list[str], Any]:
        """Hybrid ranking of a pool of ``depth`` candidates per retriever under a time budget (the
        whole pool, best first); when fusion raises or overstays, the plain vector ranking
        (``degraded: fusion``). Without query vectors (the gate failed), words alone."""
        if not qv:
            return fallback.lexical_rank(self, qv, text, depth, allowed)
        if not text or self.settings.search.fusion == "off" or not self.settings.search.fusion_signals:
            return fusion.rank(self, qv, text, k, allowed, depth=depth)
        try:
            return fusion.rank(self, qv, text, k, allowed, depth=depth,
                               deadline=time.perf_counter() + self.settings.search.fusion_timeout_ms / 1000)
        except Exception as e:  # noqa: BLE001 - a failing fusion degrades to the vector ranking
            log.warning("hybrid fusion skipped for this search: %s", e)
            if set(qv) == {"text"} and self.settings.search.calibration != "off":
                try:  # a text query falls back to the floor, not below it
                    nq = native.query_vector(self, text)  # type: ignore[arg-type]
                    if nq is not None:
                        scored, vs, _, terms = fusion.native_rank(self, nq, depth, allowed)
                        return scored, vs, ["fusion"], terms
                except Exception as e2:  # noqa: BLE001
                    log.warning("native fallback failed too: %s", e2)
            scored = self.rank_vectors(dict(qv), depth, allowed)
            from vitrine.index.graph import QueryTerms  # noqa: PLC0415

            return scored, {i: sc for i, sc, _ in scored}, ["fusion"], QueryTerms()

    def query_image_weight(self, qv: dict[str, np.ndarray]) -> float:
        """The photo's weight for a photo + words query: the aligner's per-query choice
        (``query_mix="gate"``, the MoE's modality gate) or the fixed ``query_image_weight``."""
        if self.settings.search.query_mix != "gate":
            return self.settings.search.query_image_weight
        return self.encoder.query_photo_weight(qv["image"], qv["text"], self.settings.search.query_image_weight)

    def rank_vectors(self, qv: dict[str, np.ndarray], k: int, allowed: np.ndarray | None) -> Ranked:
        """Vector ranking. Text searches the fused product vectors, a photo searches photo
        vectors; with both, candidates of each are re-scored by the weighted sum."""
        return self.index.rank(qv, k, allowed, image_weight=self.query_image_weight(qv) if len(qv) > 1 else 0.0,
                               multiplier=self.settings.search.candidate_multiplier)


    # -- recommendations and comparisons (vitrine/search/recommend.py) ---------------------------
    @reads_state
    def recommend(self, pid: str, kind: str = "similar", k: int = 10) -> RecommendResponse:
        """Similar products (same category, nearest in the shared space, MMR-diversified) or
        complementary ones (complementary categories via the graph, colour-compatible, same
        gender); NotFound for an unknown id, InvalidInput for a bad kind or k."""
        return recommend.recommend(self, pid, kind, k)

    @reads_state
    def compare(self, ids: list[str]) -> CompareResponse:
        """Compare 2..5 distinct products: attributes, pairwise similarities, graph relation."""
        return recommend.compare(self, ids)

    @reads_state
    def compare_text(self, text: str) -> CompareResponse:
        """Compare what "A vs B" names: each side resolved by search, best match of each."""
        return recommend.compare_text(self, text)

    @reads_state
    def vector_of(self, pid: str, field: str = "fused") -> np.ndarray:
        return self.index.vector_of(pid, field)

    @reads_state
    def facets(self, fields: Sequence[str] | None = None, limit: int = 50) -> FacetsResponse:
        """Filter values per field, most common first (at most ``limit`` each)."""
        return self.index.facets(fields, limit)


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

    # -- maintenance -------------------------------------------------------------------------------
    def reembed(self, *, progress: bool = False, photo_loader: Callable[[str], bytes | None] | None = None) -> int:
        """Re-embed every product whose vectors came from another model (photos from the store)."""
        stale = [r for r in self.records.iter_rows(with_vectors=False) if r.model_key != self.model_key]
        if not stale:
            return 0
        items = []
        for r in stale:
            doc = dict(r.doc)
            img = self.images.get(r.image_key) if r.image_key else None
            items.append(ProductInput(Product.model_validate(doc), image=img))
        with self.index.write_lock:
            todo = [(it, it.image, hashlib.sha256(it.image).hexdigest() if it.image else None) for it in items]
            report = UpsertReport()
            rows = self._encode_rows(todo, report, progress=progress)
            versions = {s.id: s.version for s in stale}
            for r in rows:  # (rows skip products whose photo failed: match by id, not position)
                r.version = versions.get(r.id)
            if not rows:
                return 0
            self.index.commit(rows)
        return len(rows)

    # -- hot swap (vitrine/search/swap.py) ---------------------------------------------------------
    def swap(self, req: "hotswap.SwapRequest", *, progress: bool = False) -> "hotswap.SwapReport":
        """Load a new model version or index snapshot beside the live one, check it on the canary
        queries, switch atomically; raises SwapRefused (saying why) and keeps serving otherwise."""
        return hotswap.swap(self, req, progress=progress)

    def install(self, cand: "hotswap.Candidate") -> list[str]:
        """Switch to a checked candidate: catch it up with the latest writes, then swap models and
        indexes in one exclusive step; remember the model in the data dir and snapshot it."""
        warnings: list[str] = []
        with self.index.write_lock:
            hotswap.catch_up(self, cand)
            hotswap.write_active_model(self.data_dir / "index", cand)
            with self.index.lock.write():
                self.encoder, self.model_spec = cand.encoder, cand.spec
                self.index.swap_in(cand.vectors, cand.model_key, cand.seq)
                self.settings.index.index_factory = cand.factory
        try:
            self.save()
        except (StorageError, OSError) as e:  # the switch stands; the records still hold every change
            warnings.append(f"switched, but the snapshot of the new version failed: {e}")
            log.error("%s", warnings[-1])
        return warnings

    def record_swap(self, report: "hotswap.SwapReport") -> None:
        self.swaps.append({"at": time.time(), "accepted": report.accepted, "switched": report.switched,
                           "reason": report.reason, "model_key": report.candidate.get("model_key")})
        del self.swaps[:-20]


def _image_key(sha: str, data: bytes) -> str:
    ext = "png" if data[:8] == b"\x89PNG\r\n\x1a\n" else "webp" if data[8:12] == b"WEBP" else \
        "gif" if data[:4] == b"GIF8" else "jpg"
    return f"{sha}.{ext}"


def build_encoder(settings: Settings) -> MultimodalEncoder:
    """The encoder named by settings (towers + adapter), with the shared feature cache."""
    import torch

    if settings.encoders.torch_threads:
        torch.set_num_threads(settings.encoders.torch_threads)
    if settings.index.search_threads:
        from vitrine.index.vectors import set_search_threads  # noqa: PLC0415

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
    )
