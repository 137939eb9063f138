"""FAISS vector index keyed by integer product ids, with filters, deletes and atomic save.

``VectorIndex`` keeps every vector in its own row store and a FAISS index built by factory
string (``Flat``, ``SQfp16``, ``HNSW32``, ``IVF{n},Flat``, ``IVF{n},PQ{m}``) over those rows:

- ``SQfp16`` is an exhaustive scan like ``Flat`` over float16 copies of the vectors (half the
  memory read per query: a single-query Flat search is bound by memory bandwidth), whose top
  ``k + RESCORE_EXTRA`` hits are then scored again exactly from the float32 rows: scores are
  Flat's, and so is the top ``k`` up to the order of exact ties, unless float16 rounding (~1e-3 of
  a cosine) pushes one of its hits below all the extra ones (bench-results/index-sqfp16/);

- upsert replaces: the old row of an id is tombstoned and a new row appended;
- rows added since the FAISS index was (re)built, and every row of an IVF index that has not
  been trained yet, are searched exactly, so nothing is ever invisible;
- a filter is a set of allowed ids. When it is selective the search is exact over just those
  rows (always correct); otherwise FAISS searches with an ``IDSelector`` and falls back to
  exact search if it returns fewer hits than exist;
- tombstones are compacted away once they make up a quarter of the rows;
- ``save`` writes one file (temp file, fsync, rename; vitrine/index/vector_files.py), ``load``
  verifies its checksum and by default maps it read-only: the rows and FAISS's codes of a loaded
  snapshot are shared by every process on the host that maps it, rows written since are kept in
  memory (vitrine/index/vector_rows.py) and searched exactly until there are ``MAPPED_TAIL_MAX``
  of them, when the index is copied into memory and takes them in.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from vitrine.errors import InvalidInput, StorageError
from vitrine.index import index_choice, vector_files
from vitrine.index.rowmap import RowMap
from vitrine.index.vector_rows import VectorRows

log = logging.getLogger(__name__)

_FACTORY_RE = re.compile(r"^(Flat|SQfp16|HNSW\d+(,Flat)?|IVF\d+,(Flat|PQ\d+(x\d+)?|SQ8|SQfp16)|IVF\d+_HNSW\d+,(Flat|PQ\d+))$")
# exhaustive scans: every row is added as it comes (no training, no tail searched apart)
_SCANS = ("Flat", "SQfp16")
RESCORE_EXTRA = 16  # an SQfp16 search asks FAISS for this many more hits than it returns, then rescores
# rows written after a mapped snapshot was loaded, searched exactly beside it, before the index is
# copied into memory to take them in (which ends its sharing with other processes)
MAPPED_TAIL_MAX = 50_000
GPU_TEMP_MEMORY = 256 * 2**20  # scratch memory per GPU index copy (FAISS's default takes ~18% of the GPU)
TRAIN_PER_LIST = 64  # IVF training sample per inverted list (FAISS warns below 39)


def _faiss():
    try:
        import faiss
    except ImportError as e:  # pragma: no cover - faiss-cpu is a core dependency
        raise StorageError("the vector index needs FAISS: pip install faiss-cpu (or faiss-gpu)") from e
    return faiss


_search_threads: int | None = None  # set_search_threads' choice; None: OpenMP's own default
_omp_local = threading.local()  # the OpenMP thread count this thread was given (see _pin_threads)


def set_search_threads(n: int) -> None:
    """Threads one search may use, process-wide: FAISS's OpenMP threads and the BLAS threads of
    numpy and FAISS (exact scoring of candidates is a numpy product). A server runs many searches
    side by side, one per request: one thread each costs 2.5x less CPU per query than two on a
    2-core machine (1.1 vs 2.7 ms for a Flat search over 20,873 vectors), and an idle OpenBLAS
    worker spins after each product (4 ms of CPU per API request, measured per thread).

    OpenMP's thread count is per calling thread (``omp_set_num_threads`` sets the caller's own),
    so each thread that searches applies it again on its first search (:func:`_pin_threads`):
    set here only, the API's request threads kept OpenMP's default of one thread per core, and
    the idle second thread cost 3-4 ms of CPU per text search (bench-results/storefront-api/)."""
    global _search_threads
    n = max(1, int(n))
    _search_threads = n
    _faiss().omp_set_num_threads(n)
    _omp_local.n = n
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=n, user_api="blas")
    except ImportError:  # pragma: no cover - a dependency; without it BLAS keeps its default
        log.warning("threadpoolctl is not installed: BLAS keeps its default thread count")


def _pin_threads() -> None:
    """Give the calling thread the OpenMP thread count of :func:`set_search_threads` (once per
    thread; nothing when it was never called)."""
    n = _search_threads
    if n is not None and getattr(_omp_local, "n", None) != n:
        _faiss().omp_set_num_threads(n)
        _omp_local.n = n


def gpu_count() -> int:
    faiss = _faiss()
    try:
        return int(faiss.get_num_gpus()) if hasattr(faiss, "get_num_gpus") else 0
    except Exception:  # noqa: BLE001 - a broken GPU runtime means CPU
        return 0


@runtime_checkable
class VectorIndexAPI(Protocol):
    """What the engine needs from a vector index of one space, keyed by integer product id
    (``iid``): :class:`VectorIndex` (FAISS, in process, snapshotted to the data dir) and
    :class:`~vitrine.index.pgvectors.PgVectorIndex` (pgvector, in the shared database)."""

    def __len__(self) -> int: ...

    def __contains__(self, id_: int) -> bool: ...

    def ids(self) -> np.ndarray: ...

    def get(self, ids: np.ndarray | list[int]) -> np.ndarray: ...

    def get_present(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

    def upsert(self, ids: np.ndarray | list[int], vectors: np.ndarray) -> None: ...

    def delete(self, ids: np.ndarray | list[int]) -> int: ...

    def search(self, queries: np.ndarray, k: int,
               allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]: ...

    def save(self, path: str | os.PathLike[str]) -> str: ...


class VectorIndex:
    """Approximate nearest neighbours over L2-normalised vectors (inner product = cosine)."""

    def __init__(
        self,
        dim: int,
        factory: str = "Flat",
        *,
        nprobe: int = 16,
        ef_search: int = 128,
        exact_fraction: float = 0.05,
        exact_min: int = 4096,
        use_gpu: str = "auto",
    ) -> None:
        if not (factory == index_choice.AUTO or _FACTORY_RE.match(factory)):
            raise InvalidInput(
                f"unsupported index factory {factory!r}; use auto, Flat, SQfp16, HNSW<M>, IVF<n>,Flat or IVF<n>,PQ<m>"
            )
        if dim <= 0:
            raise InvalidInput("dim must be positive")
        self.dim = dim
        # auto: the factory follows the catalogue's size, re-chosen at each save (index_choice.py)
        self.auto = factory == index_choice.AUTO
        self.factory = index_choice.SCAN if self.auto else factory
        self.nprobe = nprobe
        self.ef_search = ef_search
        self.exact_fraction = exact_fraction
        self.exact_min = exact_min
        self._gpu = _GpuCopier(use_gpu)
        self._lock = threading.RLock()
        self._rows = VectorRows(dim)
        self._row_ids = np.zeros(0, dtype=np.int64)  # id stored in each row, -1 = dead
        self._row_of = RowMap()
        self._index: Any = None  # faiss index over rows [0, self._indexed) (faiss has no type hints)
        self._gpu_index: Any = None
        self._indexed = 0
        self._index_mapped = False  # self._index reads its codes from a mapped file: never add to it
        self._writes = 0  # upserts and deletes so far (a factory switch checks nothing came between)

    # -- bookkeeping ---------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._row_of)

    def __contains__(self, id_: int) -> bool:
        return int(id_) in self._row_of

    @property
    def _n(self) -> int:
        """Rows used (live and dead)."""
        return len(self._rows)

    @property
    def mapped_rows(self) -> int:
        """Rows read from a memory-mapped snapshot file (shared with other processes)."""
        return self._rows.mapped

    @property
    def dead_rows(self) -> int:
        return self._n - len(self._row_of)

    def ids(self) -> np.ndarray:
        with self._lock:
            return np.fromiter(iter(self._row_of), dtype=np.int64, count=len(self._row_of))

    def get(self, ids: np.ndarray | list[int]) -> np.ndarray:
        """Vectors of ``ids`` (KeyError for an unknown id)."""
        with self._lock:
            rows = np.array([self._row_of[int(i)] for i in ids], dtype=np.int64)
            return self._rows.take(rows).copy()

    def get_present(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Which of ``ids`` are here (a boolean mask) and their vectors, in order."""
        with self._lock:
            rows = self._row_of.rows(ids)
            have = rows >= 0
            return have, self._rows.take(rows[have])

    def _grow(self, need: int) -> None:
        cap = len(self._row_ids)
        if self._n + need <= cap:
            return
        rid = np.full(max(1024, int((self._n + need) * 1.5)), -1, dtype=np.int64)
        rid[: self._n] = self._row_ids[: self._n]
        self._row_ids = rid

    # -- writes ----------------------------------------------------------------------------
    def upsert(self, ids: np.ndarray | list[int], vectors: np.ndarray) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise InvalidInput(f"vectors must be (n, {self.dim}), got {vectors.shape}")
        if len(ids) != len(vectors):
            raise InvalidInput("ids and vectors differ in length")
        if len(set(ids.tolist())) != len(ids):
            raise InvalidInput("duplicate ids in one upsert")
        if not np.isfinite(vectors).all():
            raise InvalidInput("vectors contain NaN or infinity")
        with self._lock:
            self._writes += 1
            for i in ids:
                old = self._row_of.pop(int(i))
                if old is not None:
                    self._row_ids[old] = -1
            self._grow(len(ids))
            start = self._rows.append(vectors)
            self._row_ids[start:start + len(ids)] = ids
            for j, i in enumerate(ids):
                self._row_of.set(int(i), start + j)
            self._maybe_maintain()

    def delete(self, ids: np.ndarray | list[int]) -> int:
        removed = 0
        with self._lock:
            self._writes += 1
            for i in ids:
                row = self._row_of.pop(int(i))
                if row is not None:
                    self._row_ids[row] = -1
                    removed += 1
            self._maybe_maintain()
        return removed

    def _maybe_maintain(self) -> None:
        dead = self.dead_rows
        if dead > 1000 and dead > 0.25 * self._n:
            self.rebuild()
        elif self._n - self._indexed >= self._pending_limit():
            self._extend_index()

    def _pending_limit(self) -> int:
        """Rows searched exactly before they are folded into the ANN index. A CPU Flat index
        takes rows as they come (adding is a copy): a tail searched apart cost a second scan and
        a merge on every search, ~0.3 ms of 1.3 over 20,873 vectors. A mapped index keeps its
        tail apart (adding would end its sharing) up to ``MAPPED_TAIL_MAX`` rows."""
        if self._index_mapped:
            return MAPPED_TAIL_MAX
        if self.factory in _SCANS and self._gpu_index is None and (self.use_gpu == "never" or gpu_count() == 0):
            return 1
        return max(256, min(20_000, self._n // 20))

    def rebuild(self) -> None:
        """Compact tombstones and rebuild the FAISS index from the live rows."""
        with self._lock:
            live = np.flatnonzero(self._row_ids[: self._n] >= 0)
            vecs = self._rows.take(live)
            ids = self._row_ids[live]
            self._rows = VectorRows(self.dim)
            self._rows.append(vecs)
            self._row_ids = np.full(max(1024, len(ids)), -1, dtype=np.int64)
            self._row_ids[: len(ids)] = ids
            self._row_of = RowMap.from_rows(ids)
            self._index, self._gpu_index, self._indexed, self._index_mapped = None, None, 0, False
            self._extend_index()

    def _needs_training(self) -> bool:
        return self.factory.startswith("IVF")

    def _train_size(self) -> int:
        m = re.match(r"IVF(\d+)", self.factory)
        return 39 * int(m.group(1)) if m else 0

    def _extend_index(self) -> None:
        faiss = _faiss()
        if self._index is None:
            if self._needs_training() and self._n < self._train_size():
                return  # too few rows to train: stay exact until there are enough
            self._index = faiss.index_factory(self.dim, self.factory, faiss.METRIC_INNER_PRODUCT)
            if not self._index.is_trained:
                live = np.flatnonzero(self._row_ids[: self._n] >= 0)
                rng = np.random.default_rng(0)
                # 64 points per list: k-means 4x faster than FAISS's 256 and no recall lost on
                # catalogue-grown vectors (bench-results/index.md)
                most = TRAIN_PER_LIST * self._train_size() // 39
                if len(live) > most:
                    live = np.sort(rng.choice(live, most, replace=False))
                self._index.train(np.ascontiguousarray(self._rows.take(live)))
            self._configure(self._index)
        if self._n > self._indexed:
            if self._index_mapped:  # FAISS aborts on adding to mapped codes: take a private copy first
                log.info("copying a mapped %s index of %d rows into memory to add %d rows",
                         self.factory, self._indexed, self._n - self._indexed)
                self._index = faiss.deserialize_index(faiss.serialize_index(self._index))
                self._configure(self._index)
                self._index_mapped = False
            self._index.add(np.ascontiguousarray(self._rows.slice(self._indexed, self._n)))
            self._indexed = self._n
        self._gpu_index = self._to_gpu(self._index)

    def _configure_nprobe(self, nprobe: int) -> None:
        self.nprobe = nprobe
        self._configure(self._index)

    def _configure(self, index) -> None:
        faiss = _faiss()
        if "IVF" in self.factory:
            faiss.extract_index_ivf(index).nprobe = self.nprobe
        if self.factory.startswith("HNSW"):
            index.hnsw.efSearch = self.ef_search

    def _to_gpu(self, index: Any) -> Any:
        return self._gpu.copy(index, self.factory)

    @property
    def use_gpu(self) -> str:
        return self._gpu.use_gpu

    @property
    def on_gpu(self) -> bool:
        """Whether unfiltered searches run on a GPU copy of the index."""
        return self._gpu_index is not None

    # -- reads -------------------------------------------------------------------------------
    def search(
        self, queries: np.ndarray, k: int, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` ids and inner-product scores per query; ``-1`` pads missing hits.

        ``allowed`` restricts results to those ids (a filter).
        """
        q = np.ascontiguousarray(np.atleast_2d(queries), dtype=np.float32)
        if q.shape[1] != self.dim:
            raise InvalidInput(f"query vectors must be {self.dim}-d, got {q.shape[1]}")
        if k <= 0:
            raise InvalidInput("k must be positive")
        _pin_threads()
        with self._lock:
            n_live = len(self._row_of)
            if (allowed is None and self._index is not None and self._indexed == self._n == n_live
                    and k <= n_live):
                # The common case (no filter, every row live and in the ANN index): one FAISS call
                # and the id lookup, nothing else, so the wrapper stays close to raw FAISS speed
                # (bench-results/index.md: VectorIndex.search over raw FAISS search).
                s, r = self._unfiltered_search(q, k)
                if r.min() >= 0:
                    return s, self._row_ids[r]
                # an ANN search that came up short: the general path below makes up the rest exactly
            nq = len(q)
            out_s = np.full((nq, k), -np.inf, dtype=np.float32)
            out_i = np.full((nq, k), -1, dtype=np.int64)
            if not self._row_of:
                return out_s, out_i
            allowed_rows = None
            if allowed is not None:
                allowed_rows = self._row_of.rows(allowed)
                allowed_rows = allowed_rows[allowed_rows >= 0]
                if len(allowed_rows) == 0:
                    return out_s, out_i
                if self._index is None or len(allowed_rows) <= max(self.exact_min, self.exact_fraction * self._n):
                    s, r = self._exact(q, k, allowed_rows)
                    return s, self._rows_to_ids(r)
            if self._index is None:
                s, r = self._exact(q, k, None)
                return s, self._rows_to_ids(r)
            s, r = self._ann(q, k, allowed_rows)
            if self._indexed < self._n:  # rows not yet in the ANN index: search them exactly
                tail = np.arange(self._indexed, self._n)
                if allowed_rows is not None:
                    tail = np.intersect1d(tail, allowed_rows)
                if len(tail):
                    s2, r2 = self._exact(q, k, tail)
                    s, r = _merge(s, r, s2, r2, k)
            expected = min(k, len(allowed_rows) if allowed_rows is not None else len(self._row_of))
            short = (r >= 0).sum(1) < expected
            if short.any():  # the ANN search came up short under a filter: be exact
                s3, r3 = self._exact(q[short], k, allowed_rows)
                s[short], r[short] = s3, r3
            return s, self._rows_to_ids(r)

    def _rows_to_ids(self, rows: np.ndarray) -> np.ndarray:
        ids = np.where(rows >= 0, self._row_ids[np.maximum(rows, 0)], -1)
        return ids

    def _exact(self, q: np.ndarray, k: int, rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Exact top ``k`` over ``rows`` (None: every live row), dead rows skipped."""
        rows = np.flatnonzero(self._row_ids[: self._n] >= 0) if rows is None else rows[self._row_ids[rows] >= 0]
        return _exact(self._rows, q, k, rows)

    def _unfiltered_search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if self.factory != "SQfp16":
            return self._unfiltered_index(k).search(q, k)
        return self._rescored_search(q, k)

    def _rescored_search(self, q: np.ndarray, k: int, **kw: object) -> tuple[np.ndarray, np.ndarray]:
        """An SQfp16 search: ``RESCORE_EXTRA`` more hits than asked for, then :func:`_rescored`."""
        _, r = self._index.search(q, min(self._indexed, k + RESCORE_EXTRA), **kw)
        return _rescored(self._rows, q, k, r)

    def _unfiltered_index(self, k: int):
        """The GPU copy when there is one (FAISS GPU answers at most 2048 neighbours), else the index."""
        return self._gpu_index if self._gpu_index is not None and k <= 2048 else self._index

    def _ann(self, q: np.ndarray, k: int, allowed_rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        faiss = _faiss()
        has_dead = self.dead_rows > 0
        if allowed_rows is None and not has_dead:
            return self._unfiltered_search(q, k)
        mask = np.zeros(self._indexed, dtype=bool)
        if allowed_rows is None:
            mask[:] = self._row_ids[: self._indexed] >= 0
        else:
            ar = allowed_rows[allowed_rows < self._indexed]
            mask[ar] = True
            mask &= self._row_ids[: self._indexed] >= 0
        bits = np.packbits(mask, bitorder="little")
        sel = faiss.IDSelectorBitmap(len(mask), faiss.swig_ptr(bits))
        if "IVF" in self.factory:
            params = faiss.SearchParametersIVF(sel=sel, nprobe=self.nprobe)
        elif self.factory.startswith("HNSW"):
            params = faiss.SearchParametersHNSW(sel=sel, efSearch=max(self.ef_search, 2 * k))
        else:
            params = faiss.SearchParameters(sel=sel)
        if self.factory == "SQfp16":
            return self._rescored_search(q, k, params=params)
        s, r = self._index.search(q, k, params=params)
        return s, r

    # -- persistence -------------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> str:
        """Write the index to one file atomically (vitrine/index/vector_files.py); returns its
        SHA-256. Every row is in the saved FAISS index (a mapped index's tail is added to a copy)."""
        faiss = _faiss()
        want = index_choice.choose(len(self), self.factory) if self.auto else self.factory
        if want != self.factory:
            try:
                self._switch(want)
            except (RuntimeError, ValueError, MemoryError) as e:  # the snapshot goes on with the index as it is
                log.error("could not make the index of %d rows %s (%s); it stays %s", len(self), want, e, self.factory)
        with self._lock:
            if self.dead_rows:
                self.rebuild()
            index = self._index
            if index is not None and self._indexed < self._n:
                if self._index_mapped:
                    index = faiss.deserialize_index(faiss.serialize_index(index))
                    index.add(np.ascontiguousarray(self._rows.slice(self._indexed, self._n)))
                else:
                    self._extend_index()
                    index = self._index
            meta = {"dim": self.dim, "factory": self.factory, "n": self._n,
                    "indexed": self._n if index is not None else 0,
                    "nprobe": self.nprobe, "ef_search": self.ef_search}
            return vector_files.write(Path(path), meta, self._rows.slice(0, self._n),
                                      self._row_ids[: self._n], index)

    def _switch(self, factory: str) -> None:
        """Become a ``factory`` index. The new index is built (an IVF one trained) from a copy of
        the live rows outside the lock, so searches go on meanwhile; it replaces this one only if
        nothing was written since the copy (else the next save tries again)."""
        with self._lock:
            writes, live = self._writes, np.flatnonzero(self._row_ids[: self._n] >= 0)
            ids, vecs = self._row_ids[live], self._rows.take(live)
        new = VectorIndex(self.dim, factory, nprobe=self.nprobe, ef_search=self.ef_search, use_gpu=self.use_gpu)
        new.upsert(ids, vecs)
        new._extend_index()
        if new._index is not None and "IVF" in factory:  # lists searched: enough for the recall target
            new.nprobe = index_choice.calibrate_nprobe(lambda q, k: new._index.search(q, k)[1],
                                                       lambda q, k: new._exact(q, k, None)[1], new._configure_nprobe,
                                                       vecs, new._train_size() // 39, self.nprobe)
        with self._lock:
            if self._writes != writes:
                return
            log.info("the index of %d rows is now %s (was %s)", len(ids), factory, self.factory)
            self.factory, self._rows, self._row_ids, self._row_of = factory, new._rows, new._row_ids, new._row_of
            self.nprobe = new.nprobe
            self._index, self._gpu_index, self._indexed, self._index_mapped = new._index, new._gpu_index, new._indexed, False

    @classmethod
    def load(cls, path: str | os.PathLike[str], expected_sha256: str | None = None, *, mmap: bool = True,
             auto: bool = False, **kwargs: Any) -> "VectorIndex":
        """The index saved at ``path``, checked against ``expected_sha256``; ``mmap`` maps its rows and
        FAISS codes read-only (shared with other processes) instead of reading them into memory;
        ``auto``: the index was configured ``auto`` and keeps choosing its factory by size."""
        got = vector_files.read(path, expected_sha256, mmap=mmap)
        meta = got.meta
        opts = {"nprobe": meta["nprobe"], "ef_search": meta["ef_search"]} | kwargs
        idx = cls(meta["dim"], meta["factory"], **opts)
        idx.auto = auto
        if auto:  # the lists its build found necessary for the recall target (index_choice.calibrate_nprobe)
            idx.nprobe = max(idx.nprobe, int(meta["nprobe"]))
        n = int(meta["n"])
        if got.vectors.shape != (n, idx.dim) or got.ids.shape != (n,):
            raise StorageError(f"vector index {path} is unreadable: its arrays do not match its meta")
        idx._rows = VectorRows(idx.dim, got.vectors)
        idx._row_ids = np.full(max(1024, n), -1, dtype=np.int64)
        idx._row_ids[:n] = got.ids
        idx._row_of = RowMap.from_rows(got.ids)
        if got.index is not None:
            idx._index = got.index
            idx._index_mapped = got.mapped
            idx._configure(idx._index)
            idx._indexed = int(meta["indexed"])
            idx._gpu_index = idx._to_gpu(idx._index)
        if idx._n > idx._indexed and idx._pending_limit() == 1:
            idx._extend_index()
        return idx

class _GpuCopier:
    """GPU copies of one VectorIndex's FAISS index, when FAISS has a GPU (HNSW and a flat SQfp16
    scan have no GPU version). One ``StandardGpuResources`` per VectorIndex, kept for its lifetime
    and reused across rebuilds (each one reserves GPU scratch memory, and FAISS wants one per calling
    thread: the index's searches are serialised by its lock)."""

    def __init__(self, use_gpu: str) -> None:
        self.use_gpu = use_gpu
        self._res: Any = None  # faiss.StandardGpuResources, created on the first copy

    def copy(self, index: Any, factory: str) -> Any:
        """A GPU copy of ``index``, or None (no GPU, a factory without one, or a failed copy: then
        never again for this index)."""
        if self.use_gpu == "never" or factory.startswith(("HNSW", "SQ")) or gpu_count() == 0:
            return None
        faiss = _faiss()
        try:
            if self._res is None:
                res = faiss.StandardGpuResources()
                res.setTempMemory(GPU_TEMP_MEMORY)
                self._res = res
            return faiss.index_cpu_to_gpu(self._res, 0, index)
        except Exception as e:  # noqa: BLE001 - CPU fallback whenever the GPU path fails
            log.warning("FAISS GPU unavailable (%s); searching on CPU", e)
            self.use_gpu = "never"
            return None


def _exact(store: VectorRows, q: np.ndarray, k: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Top ``k`` of ``rows`` of ``store`` by inner product with each of ``q``, in chunks."""
    nq = len(q)
    out_s = np.full((nq, k), -np.inf, dtype=np.float32)
    out_r = np.full((nq, k), -1, dtype=np.int64)
    kk = min(k, len(rows))
    for s in range(0, len(rows), 262_144):
        part = rows[s:s + 262_144]
        sims = q @ store.part(part).T
        top = np.argpartition(-sims, kk - 1, axis=1)[:, :kk] if kk < len(part) else np.tile(np.arange(len(part)), (nq, 1))
        out_s, out_r = _merge(out_s, out_r, np.take_along_axis(sims, top, axis=1), part[top], k)
    return out_s, out_r


def _rescored(rows: VectorRows, q: np.ndarray, k: int, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The top ``k`` of FAISS's approximate hits ``r`` (row numbers) scored exactly from the float32
    ``rows`` (ties: the earlier row first)."""
    exact = np.einsum("qkd,qd->qk", rows.take(np.maximum(r, 0)), q)
    exact = np.where(r >= 0, exact, -np.inf).astype(np.float32)
    order = np.lexsort((np.where(r >= 0, r, np.iinfo(np.int64).max), -exact), axis=1)[:, :k]
    out_s, out_r = np.take_along_axis(exact, order, axis=1), np.take_along_axis(r, order, axis=1)
    if out_s.shape[1] < k:  # fewer rows than k: pad as FAISS does
        pad = k - out_s.shape[1]
        out_s = np.pad(out_s, ((0, 0), (0, pad)), constant_values=-np.inf)
        out_r = np.pad(out_r, ((0, 0), (0, pad)), constant_values=-1)
    return out_s, out_r


def _merge(s1: np.ndarray, r1: np.ndarray, s2: np.ndarray, r2: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    s = np.concatenate([s1, s2], axis=1)
    r = np.concatenate([r1, r2], axis=1)
    s = np.where(r >= 0, s, -np.inf)
    order = np.argsort(-s, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(s, order, axis=1), np.take_along_axis(r, order, axis=1)

