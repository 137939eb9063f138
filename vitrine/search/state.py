"""The index state below the engine, and its one owner: :class:`IndexState`.

It holds everything a write changes and a search reads: the record store (the source of truth)
and photo store, the vector indexes of the shared space, the text tower's native space, the
filter/facet index, the product graph, the change sequence number the indexes reflect, and
the locks and flag that keep them consistent:

- ``write_lock`` serialises writers (the write path's upserts and deletes, catching up with
  other processes, snapshots, hot swaps);
- ``lock`` (vitrine/search/concurrency.py) lets searches read together and makes the visible
  step of each write exclusive, so a search never sees half a write;
- ``needs_snapshot``: the indexes changed since the last snapshot version.

It also holds the model its vectors are made by: the serving encoder, the :class:`ModelSpec` it
was built from and its ``model_key``. A hot swap replaces them together with the vectors in one
exclusive step, so a query is always encoded by the model whose vectors it searches.

The record store is the source of truth; the in-memory indexes are snapshotted with the change
sequence number they reflect (vitrine/index/snapshots.py) and catch up by replaying the later
changes when a data dir opens (vitrine/search/recovery.py) or another process wrote
(:meth:`IndexState.refresh`). Encoding is not done here: writers hand over encoded rows.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vitrine.encoders.encoder import MultimodalEncoder
from vitrine.errors import InvalidInput, NotFound
from vitrine.index import taxonomy_map
from vitrine.index.filters import FilterIndex
from vitrine.index.graph import ProductGraph
from vitrine.index.vocabulary import GraphData
from vitrine.index.records import SCHEMA_VERSION, RecordRow, StoredRow
from vitrine.index.snapshots import SnapshotStore
from vitrine.index.store import open_stores
from vitrine.index.vectors import VectorIndex, VectorIndexAPI
from vitrine.search import brand_index, native
from vitrine.index import stock
from vitrine.search.artifacts import ModelSpec, served_artifacts
from vitrine.search.concurrency import StateLock
from vitrine.search.snapshot_parts import SnapshotParts, keep_text_index
from vitrine.search.models import FacetsResponse, FacetValue, Filters, ProductOut, Ranked
from vitrine.settings import IndexSettings, StorageSettings

log = logging.getLogger(__name__)

FILTER_FIELDS = ("category", "gender", "colour", "brand")
INDEX_FIELDS = ("fused", "image")
GRAPH_FILE = "graph.varr"
LEGACY_GRAPH_FILE = "graph.json"  # format 1, in versions written before: still read
FILTERS_FILE = "filters.varr"


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
        stock.FIELD: stock.stock_values(doc),  # hidden: not a facet (vitrine/index/stock.py)
    }
    return values, doc.get("price")


def product_fields(row: RecordRow) -> dict[str, Any]:
    """A stored product's public fields (those of ProductOut but its version, and of a Hit)."""
    d = row.doc
    return {"id": row.id, "title": d.get("title", ""), "brand": d.get("brand"), "category": d.get("category") or [],
            "attributes": d.get("attributes") or {}, "price": d.get("price"), "currency": d.get("currency"),
            "description": d.get("description"),
            "image_url": f"/images/{row.image_key}" if row.image_key else None}


def product_out(row: RecordRow) -> ProductOut:
    """A stored record as the API shows a product."""
    return ProductOut(**product_fields(row), version=row.version)


@dataclass(frozen=True)
class LoadedIndexes:
    """The in-memory indexes one process opened, as of change ``seq``: processes forked from it
    serve them instead of loading their own (:meth:`IndexState.adopt`), so their pages stay shared
    copy-on-write until a process changes them (``vitrine serve --workers N``)."""

    vectors: dict[str, VectorIndexAPI]
    native: native.NativeSpace
    graph: ProductGraph
    graph_data: GraphData
    filters: FilterIndex
    seq: int
    snapshot_version: str | None
    model_key: str
    store_id: str
    text_index: object | None = None  # the record store's in-memory BM25 postings
    suggestions: tuple[Any, int, float] | None = None  # the catalogue's suggestion index (Suggestions.adopt)


class IndexState:
    """The record store and every index over it, for vectors made by ``encoder`` (built from
    ``spec``; its ``model_key``).

    The serving text tower embeds texts here (the native space of rows that came without a native
    vector, and the taxonomy mapper's category vectors)."""

    def __init__(self, storage: StorageSettings, options: IndexSettings, encoder: MultimodalEncoder,
                 spec: ModelSpec) -> None:
        self.storage, self.options = storage, options  # the settings' storage and index sections
        self.encoder, self.model_spec = encoder, spec
        self.dim, self.towers_key, self.text_dim = encoder.dim, encoder.towers.key, encoder.towers.text_dim
        self.model_key = encoder.model_key
        self.data_dir = Path(storage.data_dir)
        # SQLite in the data dir, or a shared PostgreSQL (storage.store; vitrine/index/store.py)
        self.records, self.images = open_stores(storage.store, self.data_dir, mirror=storage.store_mirror)
        self.filters = FilterIndex((*FILTER_FIELDS, stock.FIELD))  # + the hidden stock field
        self.graph_data = GraphData.load(options.graph_dir, options.taxonomy_file)
        mapper = taxonomy_map.mapper_for(  # maps the categories the reviewed mapping lacks
            self.graph_data.taxonomy, self.graph_data.taxonomy_sha256, self.text_features, self.towers_key,
            options.taxonomy_vectors_file, options.taxonomy_map_threshold)
        self.graph_data.use_mapper(mapper, mapper.identity)
        self.graph = ProductGraph(self.graph_data)
        self.vectors: dict[str, VectorIndexAPI] = {}
        self.native = self.new_native()  # the text tower's own space (vitrine/search/native.py)
        self.write_lock = threading.Lock()
        self.lock = StateLock()  # searches read together; the visible step of a write is exclusive
        self.snapshots = SnapshotStore(self.data_dir / "index", keep=storage.snapshot_keep)
        self.parts = SnapshotParts(self.snapshots)  # other indexes kept with each version (BM25, suggestions)
        self.snapshot_version: str | None = None  # the snapshot the indexes were loaded from or last saved to
        self.recovery: dict[str, Any] = {}  # what opening the data dir found and did (logged, /health)
        self.store_id = self._store_identity()
        keep_text_index(self.parts, self.records, self.mark_changed)
        self._seq = 0
        self._dirty = False
        self._filters_at_seq = False  # the filters were loaded with the indexes (else rebuilt from every record)

    def text_features(self, texts: list[str]) -> np.ndarray:
        """The serving text tower's features of ``texts`` (the native space's vectors, unnormalised)."""
        return self.encoder.text_features(texts)

    # -- construction ------------------------------------------------------------------------------
    def new_index(self, field: str = "fused") -> VectorIndexAPI:
        """An empty vector index of the shared space, as configured."""
        s, store = self.options, self.storage.store
        if s.vector_backend == "pgvector":  # vectors in the shared database (vitrine/index/pgvectors.py)
            if not store:
                raise InvalidInput("VITRINE_VECTOR_BACKEND=pgvector needs a postgresql:// store (VITRINE_STORE)")
            from vitrine.index.pgvectors import PgVectorIndex  # psycopg is an extra

            return PgVectorIndex(store, field, self.dim, ef_search=s.ef_search)
        return VectorIndex(self.dim, s.index_factory, nprobe=s.nprobe, ef_search=s.ef_search)

    def new_native(self) -> native.NativeSpace:
        """An empty native text space for the serving text tower."""
        s = self.options
        return native.NativeSpace(self.text_dim, self.towers_key, s.index_factory, nprobe=s.nprobe, ef_search=s.ef_search)

    def _store_identity(self) -> str:
        """A random id of this record store (its snapshots name it; another store's are refused)."""
        sid = self.records.get_meta("store_id")
        if sid is None:
            import uuid

            self.records.set_meta("store_id", uuid.uuid4().hex)
            sid = self.records.get_meta("store_id")
        return str(sid)

    def restore(self, vectors: dict[str, VectorIndexAPI], nat: native.NativeSpace, graph: ProductGraph | None,
                seq: int, version: str | None, filters: FilterIndex | None = None) -> None:
        """Take indexes loaded from a snapshot version (or fresh ones: ``version`` None, ``seq`` 0)
        as they were at change ``seq``; a None ``graph`` keeps the current one, None ``filters``
        are rebuilt from every record by :meth:`replay`."""
        self.vectors, self.native, self._seq = vectors, nat, seq
        if graph is not None:
            self.graph = graph
        self._filters_at_seq = filters is not None
        if filters is not None:
            self.filters = filters
        if version is not None:
            self.snapshot_version = version

    def rebuild_graph(self) -> None:
        """The product graph built again from every record."""
        self.graph = ProductGraph(self.graph_data)
        if self.graph.upsert_many((r.iid, r.id, r.doc) for r in self.records.iter_rows(with_vectors=False)):
            self._dirty = True

    def replay(self, target: int) -> tuple[int, int]:
        """Vectors, graph and filters given the changes after their sequence number (filters not
        loaded with them: rebuilt from every record); native vectors filled in where missing.
        ``target``: the record store's sequence number read before (the indexes then reflect at
        least it). Returns (changes replayed, live products embedded by another model)."""
        if self._filters_at_seq:
            replayed = sum(self._apply_changed_rows(b) for b in self.changes_since(self._seq, 5000))
            live = self.filters.live_ids()
            # live products without a vector of this model: embedded by another one (apply_rows
            # keeps those out of the vector indexes)
            stale_model = len(np.setdiff1d(live, self.vectors["fused"].ids(), assume_unique=True))
        else:
            live, stale_model = self._rebuild_filters()
            replayed = sum(self.apply_rows(batch) for batch in self.changes_since(self._seq, 5000))
        self._seq = max(self._seq, target)
        if self.native.fill_missing(self.records, self.text_features, live):
            self._dirty = True
        if replayed:
            self._dirty = True
        return replayed, stale_model

    def _rebuild_filters(self) -> tuple[np.ndarray, int]:
        """The filters built from every record; returns (the live iids, how many of them another
        model embedded)."""
        stale_model = 0
        live: list[int] = []
        pending: list[tuple[int, dict[str, list[str]], float | None]] = []  # filter rows, written 5,000 at a time
        for row in self.records.iter_rows(with_vectors=False):
            pending.append((row.iid, *filter_values(row.doc)))
            if len(pending) >= 5000:
                self.filters.upsert_many(pending)
                pending = []
            live.append(row.iid)
            if row.model_key != self.model_key:
                stale_model += 1
        self.filters.upsert_many(pending)
        self._filters_at_seq = True
        return np.asarray(live, dtype=np.int64), stale_model

    def loaded(self) -> LoadedIndexes:
        """The indexes as they are now, for processes forked from this one (:meth:`adopt`)."""
        with self.write_lock:
            return LoadedIndexes(dict(self.vectors), self.native, self.graph, self.graph_data, self.filters,
                                 self._seq, self.snapshot_version, self.model_key, self.store_id,
                                 self.records.text_index())

    def adopt(self, loaded: LoadedIndexes) -> int:
        """Serve indexes the process this one was forked from opened (``loaded``, made by this
        model over this record store), then apply the record store's changes after them. Returns
        the number of changes applied. This process's own changes copy only the pages they touch."""
        # the forking process's category mapper embeds with its text tower: map with this one's
        loaded.graph_data.mapper = self.graph_data.mapper
        with self.write_lock, self.lock.write():
            self.vectors, self.native, self.graph = dict(loaded.vectors), loaded.native, loaded.graph
            self.graph_data, self.filters = loaded.graph_data, loaded.filters
            self._filters_at_seq = True
            self._seq, self.snapshot_version = loaded.seq, loaded.snapshot_version
            self.records.adopt_text_index(loaded.text_index)
            keep_text_index(self.parts, self.records, self.mark_changed)
            return self._catch_up_locked()

    def mark_changed(self) -> None:
        """The indexes differ from every snapshot version (a new one is due)."""
        self._dirty = True

    # -- applying changes --------------------------------------------------------------------------
    def apply_rows(self, rows: Sequence[StoredRow]) -> int:
        """Apply written rows to the vector indexes, native space and graph (not the filters)."""
        if not rows:
            return 0
        # the graph holds every live product, whichever model embedded it (a batch: its new
        # categories are mapped and its titles' brands learned together)
        self.graph.delete([r.id for r in rows if r.deleted])
        self.graph.upsert_many((r.iid, r.id, r.doc) for r in rows if not r.deleted)
        lacking = self.native.apply(rows)
        if lacking:  # written by another model or before native vectors were kept
            self.native.fill(self.text_features, lacking)
        dead = [r.iid for r in rows if r.deleted or r.model_key != self.model_key]
        for f in INDEX_FIELDS:
            if dead:
                self.vectors[f].delete(dead)
            live = [(r.iid, v) for r in rows if not r.deleted and r.model_key == self.model_key
                    and (v := r.vectors.get(f)) is not None]
            if live:
                self.vectors[f].upsert([i for i, _ in live], np.stack([v for _, v in live]))
        return len(rows)

    def commit(self, rows: list[RecordRow]) -> int:
        """The visible step of a write of encoded rows (``write_lock`` held): one record-store
        transaction, then every index, all in one exclusive step. Returns the change sequence
        number."""
        with self.lock.write():  # searches see all of this write or none of it
            seq, iids = self.records.upsert_many(rows)
            stored = [StoredRow.written(r, iid, seq) for r, iid in zip(rows, iids)]
            self.apply_rows(stored)
            self.filters.upsert_many((r.iid, *filter_values(r.doc)) for r in stored)
            self._advance_seq(seq)
        return seq

    def delete(self, ids: Sequence[str], versions: Sequence[int | None] | None = None) -> int:
        """Delete products by id; unknown ids are ignored. Returns how many were deleted.

        With ``versions``, a delete older than the stored version is ignored (stale)."""
        with self.write_lock:
            if versions is not None:
                existing = self.records.get_many(list(ids))
                keep = [(i, v) for i, v in zip(ids, versions)
                        if not (v is not None and (old := existing.get(i)) is not None and old.version is not None
                                and v < old.version)]
                ids = [i for i, _ in keep]
                versions = [v for _, v in keep]
            with self.lock.write():  # searches see all of this delete or none of it
                seq, iids = self.records.delete_many(list(ids), versions)
                if iids:
                    for f in INDEX_FIELDS:
                        self.vectors[f].delete(iids)
                    self.native.delete(iids)
                    for iid in iids:
                        self.filters.delete(iid)
                    self.graph.delete_iids(iids)
                if seq > self._seq:
                    self._advance_seq(seq)
            return len(iids)

    def swap_in(self, vectors: dict[str, VectorIndexAPI], encoder: MultimodalEncoder, spec: ModelSpec,
                model_key: str, seq: int) -> None:
        """Serve a hot-swapped model and its vectors (``write_lock`` and ``lock.write()`` held)."""
        self.vectors, self.model_key = vectors, model_key
        self.encoder, self.model_spec = encoder, spec
        self._seq = max(self._seq, seq)
        self._dirty = True

    # -- several processes on one data dir (ingest workers, API replicas) -------------------------
    def _advance_seq(self, seq: int) -> None:
        """After this process's own write committed at ``seq`` (write lock held). A gap in the
        sequence means another process wrote to the record store meanwhile: replay its changes,
        so ``seq`` (what a snapshot claims to hold) never skips a change."""
        if seq > self._seq + 1:
            self._catch_up_locked()
        self._seq = max(self._seq, seq)
        self._dirty = True

    def _catch_up_locked(self) -> int:
        target = self.records.seq
        applied = sum(self._apply_changed_rows(b) for b in self.changes_since(self._seq, 2000))
        self._seq = max(self._seq, target)
        return applied

    def changes_since(self, seq: int, size: int) -> Iterator[list[StoredRow]]:
        """Record-store rows changed after ``seq`` (deletions included), in batches of ``size``."""
        batch: list[StoredRow] = []
        for row in self.records.iter_rows(since_seq=seq, include_deleted=True):
            batch.append(row)
            if len(batch) >= size:
                yield batch
                batch = []
        yield batch

    def _apply_changed_rows(self, rows: Sequence[StoredRow]) -> int:
        self.apply_rows(rows)
        for r in rows:
            if r.deleted:
                self.filters.delete(r.iid)
        self.filters.upsert_many((r.iid, *filter_values(r.doc)) for r in rows if not r.deleted)
        return len(rows)

    def refresh(self) -> int:
        """Catch up with what other processes wrote to this data dir (an ingest worker beside
        API replicas): replays the records changed since the indexes' sequence number. Cheap when
        nothing changed. Returns the number of changed records applied."""
        with self.write_lock:
            if self.records.seq <= self._seq:
                return 0
            with self.lock.write():
                applied = self._catch_up_locked()
            self._dirty = True
            return applied

    @property
    def filters_loaded(self) -> bool:
        """Whether the filters came with the indexes (a snapshot, or a process this one was forked
        from) rather than from reading every record."""
        return self._filters_at_seq

    @property
    def seq(self) -> int:
        """The change sequence number the in-memory indexes reflect."""
        return self._seq

    @property
    def needs_snapshot(self) -> bool:
        """Whether the indexes changed since the last snapshot version."""
        return self._dirty

    def wait_for_writes(self) -> None:
        """Return once the write (or snapshot) in flight, if any, has finished."""
        with self.write_lock:
            pass

    # -- snapshots -----------------------------------------------------------------------------------
    def save(self, intent_model: str | None = None) -> bool:
        """Publish a snapshot version of the indexes (vectors + graph + native space, with the
        change sequence number they reflect and every file's SHA-256; vitrine/index/snapshots.py),
        naming the serving model and its artifacts (``intent_model``'s too). Returns False if
        nothing changed since the last one."""
        with self.write_lock:
            if (not self._dirty and self.snapshot_version is not None) or self.options.vector_backend != "faiss":
                return False
            with self.snapshots.publish() as pub:
                files = {f"{f}.vidx": self.vectors[f].save(pub.dir / f"{f}.vidx") for f in INDEX_FIELDS}
                files[GRAPH_FILE] = self.graph.save(pub.dir / GRAPH_FILE)
                files[FILTERS_FILE] = self.filters.save(pub.dir / FILTERS_FILE)
                files[native.FILE] = self.native.save(pub.dir)
                part_files, parts = self.parts.write(pub.dir)
                files.update(part_files)
                snap = pub.commit({
                    "parts": parts,
                    "seq": self._seq, "model_key": self.model_key, "factory": self.options.index_factory,
                    "files": files, "created": time.time(), "count": len(self.vectors["fused"]),
                    "graph_fingerprint": self.graph_data.fingerprint, "model": self.model_spec.as_dict(),
                    "native_towers": self.native.towers_key,
                    # The records take part by reference: SQLite's own transactions keep them; this
                    # version reflects every change up to ``seq``, and opening replays the later ones.
                    "records": {"file": self.records.location if self.storage.store else "records.sqlite",
                                "seq": self._seq, "store_id": self.store_id,
                                "schema": SCHEMA_VERSION},
                    "artifacts": served_artifacts(self.model_spec, self.encoder, intent_model),
                })
            self.snapshot_version = snap.name
            self._dirty = False
            return True

    def close(self) -> None:
        """Close the database connections (the caller saved first, if it wanted to)."""
        for index in self.vectors.values():
            if hasattr(index, "close"):  # a pgvector index holds database connections
                index.close()
        self.records.close()

    # -- reads ---------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.vectors["fused"])

    def allowed(self, filters: Filters | None) -> np.ndarray | None:
        """The product ids ``filters`` allow (None: no filter)."""
        if filters is None or filters.is_empty():
            return None
        excl = filters.excluded()
        brands = (terms := filters.terms()).pop("brand", None)
        ids = self.filters.allowed(terms, filters.price_min, filters.price_max, exclude=excl)
        if brands:  # the record's brand or the one the graph learned from its title (one notion of brand)
            have = brand_index.brand_ids(self.graph, self.filters, brands)
            ids = have if ids is None else np.intersect1d(ids, have, assume_unique=True)
        if excl.get("brand") and ids is not None:  # brands the graph learned from titles are left out too
            gone = self.graph.products_with("brand", excl["brand"])
            if gone:
                ids = np.setdiff1d(ids, np.fromiter(gone, dtype=np.int64, count=len(gone)), assume_unique=True)
        return ids

    def vector_of(self, pid: str, field: str = "fused") -> np.ndarray:
        row = self.records.get(pid)
        if row is None:
            raise NotFound("product", pid)
        return self.vectors[field].get([row.iid])[0]

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
            got = brand_index.live_counts(self.graph, self.filters) if f == "brand" else self.filters.facet(f)
            counts = sorted(got.items(), key=lambda kv: (-kv[1], kv[0].casefold()))
            out[f] = [FacetValue(value=v, count=n) for v, n in counts[:limit]]
        return FacetsResponse(facets=out, products=len(self))

    def rank(self, qv: dict[str, np.ndarray], k: int, allowed: np.ndarray | None, *,
             image_weight: float, multiplier: int) -> Ranked:
        """Vector ranking. Text searches the fused product vectors, a photo searches photo
        vectors; with both, ``multiplier * k`` candidates of each are re-scored by the weighted
        sum (``image_weight`` for the photo)."""
        if allowed is not None and len(allowed) == 0:
            return []
        if len(qv) == 1:
            mod, q = next(iter(qv.items()))
            field = "image" if mod == "image" else "fused"
            scores, ids = self.vectors[field].search(q[None], k, allowed)
            return [(int(i), float(sc), {f"{mod}->{field}": float(sc)})
                    for sc, i in zip(scores[0], ids[0]) if i >= 0]
        w = image_weight
        kk = k * multiplier
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
