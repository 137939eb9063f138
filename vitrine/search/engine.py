"""The engine: one write path (upsert/delete) and one read path (search).

write: validated products (+ photo bytes) -> encoder (towers -> adapter) -> one SQLite
       transaction (records + vectors + photos) -> in-memory vector and filter indexes.
read:  query -> encoder (query vectors) -> filters -> FAISS -> records -> hits with explanation.

The record store is the source of truth; the FAISS indexes are snapshotted with the change
sequence number they reflect, and catch up by replaying later changes when a data dir opens.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vitrine.encoders.batching import LRUCache
from vitrine.encoders.encoder import MultimodalEncoder
from vitrine.encoders.queries import QueryEncoder
from vitrine.errors import InvalidInput, NotFound, StorageError, VitrineError
from vitrine.index import taxonomy_map
from vitrine.index.bm25 import MemoryBM25
from vitrine.index.filters import FilterIndex
from vitrine.index.graph import GraphData, ProductGraph
from vitrine.index.records import SCHEMA_VERSION, RecordRow
from vitrine.index.store import open_stores
from vitrine.index.snapshots import Snapshot, SnapshotStore
from vitrine.index.vectors import VectorIndex
from vitrine.search.models import (
    CompareResponse,
    Explanation,
    FacetsResponse,
    FacetValue,
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
from vitrine.search import calibration, fusion, native, recommend
from vitrine.search import understanding
from vitrine.search import fallback
from vitrine.search import swap as hotswap
from vitrine.search import storefront
from vitrine.search.concurrency import StateLock, reads_state
from vitrine.search.settings import Settings

log = logging.getLogger(__name__)

FILTER_FIELDS = ("category", "gender", "colour", "brand")
INDEX_FIELDS = ("fused", "image")
MANIFEST = "manifest.json"
GRAPH_FILE = "graph.json"


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


def filter_values(doc: dict[str, Any]) -> tuple[dict[str, list[str]], float | None]:
    """The filterable facets of a stored product document."""
    attrs = {str(k).casefold(): v for k, v in (doc.get("attributes") or {}).items()}

    def first(*keys: str) -> list[str]:
        for k in keys:
            v = attrs.get(k)
            if v not in (None, "") and not isinstance(v, list):
                return [str(v)]
        return []

    values = {
        "category": list(doc.get("category") or []),
        "gender": first("gender"),
        "colour": first("colour", "color", "basecolour", "basecolor"),
        "brand": [doc["brand"]] if doc.get("brand") else [],
    }
    return values, doc.get("price")


class Engine:
    """Vitrine's search engine over one data dir. Build with :meth:`open`."""

    def __init__(self, settings: Settings, encoder: MultimodalEncoder) -> None:
        self.settings = settings
        self.encoder = encoder
        self.data_dir = Path(settings.data_dir)
        # SQLite in the data dir, or a shared PostgreSQL (settings.store; vitrine/index/store.py)
        self.records, self.images = open_stores(settings.store, self.data_dir)
        self.filters = FilterIndex(FILTER_FIELDS)
        self.graph_data = GraphData.load(settings.graph_dir, settings.taxonomy_file)
        mapper = taxonomy_map.mapper_for(  # maps the categories the reviewed mapping lacks
            self.graph_data.taxonomy, self.graph_data.taxonomy_sha256, encoder.text_features, encoder.towers.key,
            settings.taxonomy_vectors_file, settings.taxonomy_map_threshold)
        self.graph_data.use_mapper(mapper, mapper.identity)
        self.graph = ProductGraph(self.graph_data)
        self.vectors: dict[str, VectorIndex] = {}
        self.native = self._new_native()  # the text tower's own space (vitrine/search/native.py)
        self._write_lock = threading.Lock()
        self._state = StateLock()  # searches read together; the visible step of a write is exclusive
        self.snapshots = SnapshotStore(self.data_dir / "index", keep=settings.snapshot_keep)
        self.snapshot_version: str | None = None  # the snapshot the indexes were loaded from or last saved to
        self.recovery: dict[str, Any] = {}  # what opening the data dir found and did (logged, /health)
        self.swaps: list[dict[str, Any]] = []  # hot swaps tried by this process (newest last)
        self.model_spec = hotswap.ModelSpec(settings.model, settings.adapter, settings.pretrained)
        self.store_id = self._store_identity()
        self._index_seq = 0
        self._dirty = False
        self.model_key = encoder.model_key
        # the query fast path (micro-batched, cached query embeddings); built on first use
        self._query_cache: LRUCache[np.ndarray] = LRUCache(settings.query_cache_size)
        self._query_encoder: QueryEncoder | None = None
        self._query_encoder_lock = threading.Lock()
        MemoryBM25.typo_tolerance = settings.typo_tolerance  # one engine per process sets it
        self._load_indexes()
        self._calibration: calibration.Calibration | None = None
        self._calibration_seq = -1
        # query intent + slots (vitrine/intent), loaded here, never at import
        self.understanding = understanding.QueryUnderstanding(self, settings) if settings.intent else None

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def open(cls, settings: Settings, encoder: MultimodalEncoder | None = None) -> "Engine":
        """Load models (unless given) and open ``settings.data_dir``, recovering indexes.

        A data dir whose model was hot-swapped opens with that model (``follow_swap``); when its
        artifacts fail their checksums the configured model serves instead, and says so."""
        notes: list[str] = []
        if encoder is None:
            active = hotswap.read_active_model(Path(settings.data_dir) / "index") if settings.follow_swap else None
            if active and (active["model"], active["adapter"], active.get("pretrained")) != \
                    (settings.model, settings.adapter, settings.pretrained):
                swapped = settings.model_copy(update={
                    "model": active["model"], "adapter": active["adapter"], "pretrained": active.get("pretrained"),
                    "index_factory": active.get("index_factory") or settings.index_factory})
                try:
                    encoder = build_encoder(swapped)
                    log.warning("serving adapter %s / towers %s, activated by a hot swap (configured: %s / %s; "
                                "VITRINE_FOLLOW_SWAP=false serves the configured one)", active["adapter"],
                                active["model"], settings.adapter, settings.model)
                    settings = swapped
                except VitrineError as e:
                    notes.append(f"the hot-swapped model {active['adapter']} is unusable ({e}); "
                                 f"serving the configured {settings.adapter}")
                    log.error("%s", notes[-1])
            if encoder is None:
                encoder = build_encoder(settings)
        eng = cls(settings, encoder)
        if notes:
            eng.recovery.setdefault("notes", []).extend(notes)
        return eng

    def _new_index(self, field: str = "fused") -> VectorIndex:
        s = self.settings
        if s.vector_backend == "pgvector":  # vectors in the shared database (vitrine/index/pgvectors.py)
            if not s.store:
                raise InvalidInput("VITRINE_VECTOR_BACKEND=pgvector needs a postgresql:// store (VITRINE_STORE)")
            from vitrine.index.pgvectors import PgVectorIndex  # noqa: PLC0415 - psycopg is an extra

            return PgVectorIndex(s.store, field, self.encoder.dim, ef_search=s.ef_search)  # type: ignore[return-value]
        return VectorIndex(self.encoder.dim, s.index_factory, nprobe=s.nprobe, ef_search=s.ef_search)

    def _new_native(self) -> native.NativeSpace:
        s = self.settings
        return native.NativeSpace(self.encoder.towers.text_dim, self.encoder.towers.key, s.index_factory,
                                  nprobe=s.nprobe, ef_search=s.ef_search)

    @property
    def calibration(self) -> calibration.Calibration:
        """How text queries rank on this catalogue: the data dir's tuned settings while they fit
        the catalogue and model, else the floor (vitrine/search/calibration.py). Re-checked when
        the records change."""
        seq = self.records.recent_seq()
        cal = self._calibration
        if cal is None or seq != self._calibration_seq:
            s = self.settings
            cal = calibration.floor("settings: calibration=floor") if s.calibration == "floor" else \
                calibration.load(self.data_dir, self.records, self.store_id, self.model_key, s.tune_max_drift)
            self._calibration, self._calibration_seq = cal, seq
        return cal

    def slot_filters_on(self) -> bool:
        """Whether the intent classifier's slots filter results: configured on, and (unless
        calibration is off) found useful on this catalogue by `vitrine tune`."""
        s = self.settings
        return s.intent_slot_filters and (s.calibration == "off" or self.calibration.slot_filters)

    def set_calibration(self, cal: calibration.Calibration) -> None:
        """Serve ``cal`` until the records change or it is reloaded (tuning tries candidates)."""
        self._calibration, self._calibration_seq = cal, self.records.recent_seq()

    def reload_calibration(self) -> calibration.Calibration:
        """Read the data dir's tuned settings again (after `vitrine tune` wrote them)."""
        self._calibration = None
        return self.calibration

    def _store_identity(self) -> str:
        """A random id of this record store (its snapshots name it; another store's are refused)."""
        sid = self.records.get_meta("store_id")
        if sid is None:
            import uuid

            self.records.set_meta("store_id", uuid.uuid4().hex)
            sid = self.records.get_meta("store_id")
        return str(sid)

    def _load_indexes(self) -> None:
        """Open the data dir: the newest usable snapshot version (every file checked against its
        manifest's SHA-256), then the record store's changes since it; a refused version falls
        back to the previous one, and with none usable everything is rebuilt from the records.
        What was found and done goes to the log and to ``self.recovery`` (/health)."""
        t0 = time.time()
        # Read first: everything up to it is in what follows; later changes (other writers of a
        # shared store) are replayed by the next refresh. Read after the replay, it could claim a
        # change committed during it that the replay did not see.
        target = self.records.seq
        rec: dict[str, Any] = {"records_seq": target, "snapshot": None, "snapshot_seq": None,
                               "refused": [], "skipped": [], "partial": [p.name for p in self.snapshots.partials()]}
        loaded: Snapshot | None = None
        graph_loaded = False
        # pgvector: the vectors live in the database, nothing of them is snapshotted locally
        for snap in self.snapshots.candidates() if self.settings.vector_backend == "faiss" else []:
            why, fatal, graph_loaded = self._try_snapshot(snap)
            if why is None:
                loaded = snap
                break
            (rec["refused"] if fatal else rec["skipped"]).append({"version": snap.name, "reason": why})
            (log.warning if fatal else log.info)("index snapshot %s not used: %s", snap.name, why)
        if loaded is None:
            self.vectors = {f: self._new_index(f) for f in INDEX_FIELDS}
            self.native = self._new_native()
            self._index_seq = 0
            graph_loaded = False
        else:
            rec["snapshot"], rec["snapshot_seq"] = loaded.name, self._index_seq
            self.snapshot_version = loaded.name
        stale_model = 0
        replayed = 0
        if not graph_loaded:  # no usable graph snapshot: build it from every record
            self.graph = ProductGraph(self.graph_data)
            if self.graph.upsert_many((r.iid, r.id, r.doc) for r in self.records.iter_rows(with_vectors=False)):  # type: ignore[misc]
                self._dirty = True
        # Filters always rebuild from records; vectors and graph replay what the snapshot lacks.
        for row in self.records.iter_rows(with_vectors=False):
            values, price = filter_values(row.doc)
            self.filters.upsert(row.iid, values, price)  # type: ignore[arg-type]
            if row.model_key != self.model_key:
                stale_model += 1
        for batch in self._changes_since(self._index_seq, 5000):
            replayed += self._apply_rows_to_indexes(batch)
        self._index_seq = max(self._index_seq, target)
        if self.native.fill_missing(self):
            self._dirty = True
        if replayed or loaded is None:
            self._dirty = True
        rec.update(replayed=replayed, rebuilt=loaded is None, graph_rebuilt=not graph_loaded,
                   products=self.records.count(), stale_model=stale_model)
        if stale_model and self.settings.reembed_on_open:
            log.warning("%d products were embedded by another model; re-embedding them with %s",
                        stale_model, self.model_key)
            rec["reembedded"] = self.reembed(progress=True)
            stale_model = 0
        rec["seconds"] = round(time.time() - t0, 3)
        rec["summary"] = _recovery_summary(rec)
        self.recovery = rec
        (log.warning if rec["refused"] or rec["partial"] else log.info)(
            "opened %s: %d products in %.2fs; %s", self.data_dir, self.records.count(), time.time() - t0, rec["summary"])
        if stale_model:
            log.warning(
                "%d products were embedded by another model; run `vitrine reindex --data %s` to re-embed",
                stale_model, self.data_dir,
            )

    def _try_snapshot(self, snap: Snapshot) -> tuple[str | None, bool, bool]:
        """Load one snapshot version into the engine. Returns (why not, whether that is damage
        rather than a different model or index, whether its graph was loaded)."""
        m = snap.manifest
        if m is None:
            return snap.error or "no manifest", True, False
        if m.get("model_key") != self.model_key:
            return f"built by another model ({m.get('model_key')})", False, False
        if m.get("factory") != self.settings.index_factory:
            return f"a {m.get('factory')} index (configured: {self.settings.index_factory})", False, False
        try:
            seq = int(m["seq"])
        except (KeyError, TypeError, ValueError):
            return "manifest has no change sequence number", True, False
        if seq > self.records.seq:
            return (f"it reflects change {seq} but the record store is at {self.records.seq} "
                    "(the records were replaced by an older copy)"), True, False
        store = (m.get("records") or {}).get("store_id")
        if store and store != self.store_id:
            return "it belongs to another record store", True, False
        try:
            vectors = {f: VectorIndex.load(snap.file(f"{f}.vidx"), snap.sha256(f"{f}.vidx"),
                                           nprobe=self.settings.nprobe, ef_search=self.settings.ef_search)
                       for f in INDEX_FIELDS}
            graph = None
            same_graph = m.get("graph_fingerprint") in (None, self.graph_data.fingerprint)
            if GRAPH_FILE in (m.get("files") or {}) and same_graph:
                graph = ProductGraph.load(snap.file(GRAPH_FILE), self.graph_data, snap.sha256(GRAPH_FILE))
            nat = self._new_native()
            if native.FILE in (m.get("files") or {}) and m.get("native_towers") == nat.towers_key:
                nat.load(snap.file(native.FILE).parent, snap.sha256(native.FILE),
                         nprobe=self.settings.nprobe, ef_search=self.settings.ef_search)
        except StorageError as e:
            return str(e), True, False
        except (KeyError, ValueError, OSError) as e:
            return f"unreadable: {e}", True, False
        self.vectors, self._index_seq, self.native = vectors, seq, nat  # missing native: filled after replay
        if graph is not None:
            self.graph = graph
        return None, False, graph is not None

    def _apply_rows_to_indexes(self, rows: Sequence[RecordRow]) -> int:
        if not rows:
            return 0
        # the graph holds every live product, whichever model embedded it (a batch: its new
        # categories are mapped and its titles' brands learned together)
        self.graph.delete([r.id for r in rows if r.deleted])
        self.graph.upsert_many((r.iid, r.id, r.doc) for r in rows if not r.deleted)  # type: ignore[misc]
        lacking = self.native.apply(rows)
        if lacking:  # written by another model or before native vectors were kept
            self.native.fill(self, lacking)
        dead = [r.iid for r in rows if r.deleted or r.model_key != self.model_key]
        for f in INDEX_FIELDS:
            if dead:
                self.vectors[f].delete(dead)
            live = [r for r in rows if not r.deleted and r.model_key == self.model_key
                    and r.vectors and r.vectors.get(f) is not None]
            if live:
                self.vectors[f].upsert([r.iid for r in live], np.stack([r.vectors[f] for r in live]))  # type: ignore[index]
        return len(rows)

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
        with self._write_lock:
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
                    with self._state.write():  # searches see all of this write or none of it
                        seq, iids = self.records.upsert_many(rows)
                        for r, iid in zip(rows, iids):
                            r.iid, r.seq = iid, seq
                        self._apply_rows_to_indexes(rows)
                        for r in rows:
                            values, price = filter_values(r.doc)
                            self.filters.upsert(r.iid, values, price)  # type: ignore[arg-type]
                        self._advance_seq(seq)
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
        with self._write_lock:
            if versions is not None:
                existing = self.records.get_many(list(ids))
                keep = [(i, v) for i, v in zip(ids, versions)
                        if not (v is not None and i in existing and existing[i].version is not None
                                and v < existing[i].version)]  # type: ignore[operator]
                ids = [i for i, _ in keep]
                versions = [v for _, v in keep]
            with self._state.write():  # searches see all of this delete or none of it
                seq, iids = self.records.delete_many(list(ids), versions)
                if iids:
                    for f in INDEX_FIELDS:
                        self.vectors[f].delete(iids)
                    self.native.delete(iids)
                    for iid in iids:
                        self.filters.delete(iid)
                    self.graph.delete_iids(iids)
                if seq > self._index_seq:
                    self._advance_seq(seq)
            return len(iids)

    # -- several processes on one data dir (ingest workers, API replicas) -------------------------
    def _advance_seq(self, seq: int) -> None:
        """After this engine's own write committed at ``seq`` (write lock held). A gap in the
        sequence means another process wrote to the record store meanwhile: replay its changes,
        so ``_index_seq`` (what a snapshot claims to hold) never skips a change."""
        if seq > self._index_seq + 1:
            self._catch_up_locked()
        self._index_seq = max(self._index_seq, seq)
        self._dirty = True

    def _catch_up_locked(self) -> int:
        target = self.records.seq
        applied = sum(self._apply_changed_rows(b) for b in self._changes_since(self._index_seq, 2000))
        self._index_seq = max(self._index_seq, target)
        return applied

    def _changes_since(self, seq: int, size: int) -> Iterator[list[RecordRow]]:
        """Record-store rows changed after ``seq`` (deletions included), in batches of ``size``."""
        batch: list[RecordRow] = []
        for row in self.records.iter_rows(since_seq=seq, include_deleted=True):
            batch.append(row)
            if len(batch) >= size:
                yield batch
                batch = []
        yield batch

    def _apply_changed_rows(self, rows: Sequence[RecordRow]) -> int:
        self._apply_rows_to_indexes(rows)
        for r in rows:
            if r.deleted:
                self.filters.delete(r.iid)  # type: ignore[arg-type]
            else:
                values, price = filter_values(r.doc)
                self.filters.upsert(r.iid, values, price)  # type: ignore[arg-type]
        return len(rows)

    def refresh(self) -> int:
        """Catch up with what other processes wrote to this data dir (an ingest worker beside
        API replicas): replays the records changed since the indexes' sequence number. Cheap when
        nothing changed. Returns the number of changed records applied."""
        with self._write_lock:
            if self.records.seq <= self._index_seq:
                return 0
            with self._state.write():
                applied = self._catch_up_locked()
            self._dirty = True
            return applied

    @property
    def needs_snapshot(self) -> bool:
        """Whether the indexes changed since the last snapshot version."""
        return self._dirty

    def wait_for_writes(self) -> None:
        """Return once the write (or snapshot) in flight, if any, has finished."""
        with self._write_lock:
            pass

    def save(self) -> bool:
        """Publish a snapshot version of the indexes (vectors + graph, with the change sequence
        number they reflect and every file's SHA-256; vitrine/index/snapshots.py). Returns False
        if nothing changed since the last one."""
        with self._write_lock:
            if (not self._dirty and self.snapshot_version is not None) or self.settings.vector_backend != "faiss":
                return False
            with self.snapshots.publish() as pub:
                files = {f"{f}.vidx": self.vectors[f].save(pub.dir / f"{f}.vidx") for f in INDEX_FIELDS}
                files[GRAPH_FILE] = self.graph.save(pub.dir / GRAPH_FILE)
                files[native.FILE] = self.native.save(pub.dir)
                snap = pub.commit({
                    "seq": self._index_seq, "model_key": self.model_key, "factory": self.settings.index_factory,
                    "files": files, "created": time.time(), "count": len(self.vectors["fused"]),
                    "graph_fingerprint": self.graph_data.fingerprint, "model": self.model_spec.as_dict(),
                    "native_towers": self.native.towers_key,
                    # The records take part by reference: SQLite's own transactions keep them; this
                    # version reflects every change up to ``seq``, and opening replays the later ones.
                    "records": {"file": self.records.location if self.settings.store else "records.sqlite",
                                "seq": self._index_seq, "store_id": self.store_id,
                                "schema": SCHEMA_VERSION},
                    "artifacts": self.artifacts(),
                })
            self.snapshot_version = snap.name
            self._dirty = False
            return True

    def artifacts(self) -> dict[str, Any]:
        """SHA-256 of every model artifact serving this engine (towers, adapter, intent)."""
        try:
            return hotswap.model_artifacts(self.model_spec, self.encoder,
                                           self.settings.intent_model if self.settings.intent else None)
        except (OSError, ValueError, VitrineError) as e:
            return {"error": str(e)}

    def close(self) -> None:
        try:
            self.save()
        finally:
            for index in self.vectors.values():
                if hasattr(index, "close"):  # a pgvector index holds database connections
                    index.close()
            self.records.close()
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
        return self._product_out(row)

    def image_path(self, key: str) -> Path:
        path = self.images.path_for(key)
        if not path.is_file():
            raise NotFound("image", key)
        return path

    def _product_out(self, row: RecordRow) -> ProductOut:
        return ProductOut(**_product_fields(row), version=row.version)

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
                    self.encoder, cache=self._query_cache, max_batch=s.query_batch_max,
                    max_wait_ms=s.query_batch_wait_ms, text_precision=s.query_text_precision,
                    threads=s.query_threads, runtime=s.query_runtime, onnx_dir=s.cache_dir,
                )
                if qe is not None:
                    qe.close()
                self._query_encoder = qe = new
            return qe

    def allowed_ids(self, filters: Filters | None) -> np.ndarray | None:
        if filters is None or filters.is_empty():
            return None
        return self.filters.allowed(filters.terms(), filters.price_min, filters.price_max)

    @reads_state
    def search(self, req: SearchRequest, *, image: bytes | None = None) -> SearchResponse:
        """Search by text, photo (``image`` bytes or ``req.image_b64``) or both, with filters."""
        t0 = time.perf_counter()
        s = self.settings
        if req.k > s.max_k:
            raise InvalidInput(f"k must be between 1 and {s.max_k}")
        depth = storefront.pool_depth(s, req)  # the same pool for every page (vitrine/search/storefront.py)
        text = " ".join((req.text or "").split()) or None
        if text and len(text) > s.max_text_chars:
            text = text[: s.max_text_chars]
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
            hit = Hit(score=round(float(score), 6), **_product_fields(row))  # one validation per hit
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
        if not text or self.settings.fusion == "off" or not self.settings.fusion_signals:
            return fusion.rank(self, qv, text, k, allowed, depth=depth)
        try:
            return fusion.rank(self, qv, text, k, allowed, depth=depth,
                               deadline=time.perf_counter() + self.settings.fusion_timeout_ms / 1000)
        except Exception as e:  # noqa: BLE001 - a failing fusion degrades to the vector ranking
            log.warning("hybrid fusion skipped for this search: %s", e)
            if set(qv) == {"text"} and self.settings.calibration != "off":
                try:  # a text query falls back to the floor, not below it
                    nq = native.query_vector(self, text)  # type: ignore[arg-type]
                    if nq is not None:
                        scored, vs, _, terms = fusion.native_rank(self, nq, depth, allowed)
                        return scored, vs, ["fusion"], terms
                except Exception as e2:  # noqa: BLE001
                    log.warning("native fallback failed too: %s", e2)
            scored = self._rank(dict(qv), depth, allowed)
            from vitrine.index.graph import QueryTerms  # noqa: PLC0415

            return scored, {i: sc for i, sc, _ in scored}, ["fusion"], QueryTerms()

    def query_image_weight(self, qv: dict[str, np.ndarray]) -> float:
        """The photo's weight for a photo + words query: the aligner's per-query choice
        (``query_mix="gate"``, the MoE's modality gate) or the fixed ``query_image_weight``."""
        if self.settings.query_mix != "gate":
            return self.settings.query_image_weight
        return self.encoder.query_photo_weight(qv["image"], qv["text"], self.settings.query_image_weight)

    def _rank(
        self, qv: dict[str, np.ndarray], k: int, allowed: np.ndarray | None
    ) -> list[tuple[int, float, dict[str, float]]]:
        """Vector ranking. Text searches the fused product vectors, a photo searches photo
        vectors; with both, candidates of each are re-scored by the weighted sum."""
        if allowed is not None and len(allowed) == 0:
            return []
        if len(qv) == 1:
            mod, q = next(iter(qv.items()))
            field = "image" if mod == "image" else "fused"
            scores, ids = self.vectors[field].search(q[None], k, allowed)
            return [(int(i), float(sc), {f"{mod}->{field}": float(sc)})
                    for sc, i in zip(scores[0], ids[0]) if i >= 0]
        w = self.query_image_weight(qv)
        kk = k * self.settings.candidate_multiplier
        cand: set[int] = set()
        for mod, field in (("image", "image"), ("text", "fused")):
            _, ids = self.vectors[field].search(qv[mod][None], kk, allowed)
            cand.update(int(i) for i in ids[0] if i >= 0)
        if not cand:
            return []
        cids = np.fromiter(cand, dtype=np.int64)
        img_idx, fused_idx = self.vectors["image"], self.vectors["fused"]
        s_txt = fused_idx.get(cids) @ qv["text"]
        has_img = np.array([i in img_idx for i in cids.tolist()])
        s_img = np.zeros(len(cids), dtype=np.float32)
        if has_img.any():
            s_img[has_img] = img_idx.get(cids[has_img]) @ qv["image"]
        total = w * s_img + (1 - w) * s_txt
        order = np.argsort(-total)[:k]
        return [(int(cids[j]), float(total[j]), {"image->image": float(s_img[j]), "text->fused": float(s_txt[j])})
                for j in order]

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
        row = self.records.get(pid)
        if row is None:
            raise NotFound("product", pid)
        return self.vectors[field].get([row.iid])[0]  # type: ignore[list-item]

    @reads_state
    def facets(self, fields: Sequence[str] | None = None, limit: int = 50) -> FacetsResponse:
        """Filter values per field, most common first (at most ``limit`` each)."""
        fields = list(fields) if fields else list(FILTER_FIELDS)
        unknown = [f for f in fields if f not in FILTER_FIELDS]
        if unknown:
            raise InvalidInput(f"unknown facet field(s) {unknown}; known: {list(FILTER_FIELDS)}")
        if not 1 <= limit <= 1000:
            raise InvalidInput("limit must be between 1 and 1000")
        out = {}
        for f in fields:
            counts = sorted(self.filters.facet(f).items(), key=lambda kv: (-kv[1], kv[0].casefold()))
            out[f] = [FacetValue(value=v, count=n) for v, n in counts[:limit]]
        return FacetsResponse(facets=out, products=len(self))

    def stats(self) -> dict[str, Any]:
        clf = self.understanding.classifier if self.understanding is not None else None
        return {
            "products": len(self), "with_photo": len(self.vectors["image"]), "seq": self.records.seq,
            "model": self.model_key, "adapter": self.settings.adapter, "index": self.settings.index_factory,
            "data_dir": str(self.data_dir),
            # the intent classifier serving: its ensemble members and runtime (None: intent off or unavailable)
            "intent": {"model": self.settings.intent_model, "members": 1 + len(clf.members), "runtime": clf.runtime}
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
        with self._write_lock:
            todo = [(it, it.image, hashlib.sha256(it.image).hexdigest() if it.image else None) for it in items]
            report = UpsertReport()
            rows = self._encode_rows(todo, report, progress=progress)
            versions = {s.id: s.version for s in stale}
            for r in rows:  # (rows skip products whose photo failed: match by id, not position)
                r.version = versions.get(r.id)
            if not rows:
                return 0
            with self._state.write():
                seq, iids = self.records.upsert_many(rows)
                for r, iid in zip(rows, iids):
                    r.iid = iid
                self._apply_rows_to_indexes(rows)
                self._advance_seq(seq)
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
        with self._write_lock:
            hotswap.catch_up(self, cand)
            hotswap.write_active_model(self.data_dir / "index", cand)
            with self._state.write():
                self.encoder, self.model_key, self.vectors = cand.encoder, cand.model_key, cand.vectors
                self.model_spec = cand.spec
                self.settings.index_factory = cand.factory
                self._index_seq = max(self._index_seq, cand.seq)
                self._dirty = True
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


def _product_fields(row: RecordRow) -> dict[str, Any]:
    """A stored product's public fields (those of ProductOut but its version, and of a Hit)."""
    d = row.doc
    return {"id": row.id, "title": d.get("title", ""), "brand": d.get("brand"), "category": d.get("category") or [],
            "attributes": d.get("attributes") or {}, "price": d.get("price"), "currency": d.get("currency"),
            "description": d.get("description"),
            "image_url": f"/images/{row.image_key}" if row.image_key else None}


def _recovery_summary(rec: dict[str, Any]) -> str:
    parts = []
    if rec.get("snapshot"):
        parts.append(f"loaded snapshot {rec['snapshot']} (change {rec['snapshot_seq']})")
    else:
        parts.append("no usable snapshot: rebuilt from the records")
    parts.append(f"replayed {rec.get('replayed', 0)} later changes")
    for r in rec.get("refused", []):
        parts.append(f"refused {r['version']}: {r['reason']}")
    if rec.get("partial"):
        parts.append(f"ignored {len(rec['partial'])} half-written snapshot(s) left by a crash")
    if rec.get("reembedded"):
        parts.append(f"re-embedded {rec['reembedded']} products made by another model")
    return "; ".join(parts)


def _image_key(sha: str, data: bytes) -> str:
    ext = "png" if data[:8] == b"\x89PNG\r\n\x1a\n" else "webp" if data[8:12] == b"WEBP" else \
        "gif" if data[:4] == b"GIF8" else "jpg"
    return f"{sha}.{ext}"


def build_encoder(settings: Settings) -> MultimodalEncoder:
    """The encoder named by settings (towers + adapter), with the shared feature cache."""
    import torch

    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    if settings.search_threads:
        from vitrine.index.vectors import set_search_threads  # noqa: PLC0415

        set_search_threads(settings.search_threads)
    return MultimodalEncoder.create(
        settings.model,
        settings.adapter if settings.adapter != "none" else None,
        pretrained=settings.pretrained,
        device=settings.device,
        image_size=settings.image_size,
        cache_path=settings.feature_cache_path,
        batch_size=settings.encode_batch_size,
        max_image_bytes=settings.max_image_bytes,
        max_image_pixels=settings.max_image_pixels,
    )
