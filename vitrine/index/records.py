"""Product records, their vectors and their photos, durable in SQLite (WAL) and on disk.

SQLite is the source of truth of a data dir: every write is one transaction that bumps a
change sequence number, so a crash leaves the batch either fully applied or not at all.
Deletes leave a tombstone with their sequence number, so derived indexes saved at sequence
``s`` catch up by replaying :meth:`RecordStore.changes_since` ``s``.

Photos are stored content-addressed (``images/ab/<sha256>.<ext>``): the same photo is
stored once, and a file is never rewritten in place.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitrine.atomic import atomic_write_bytes
from vitrine.errors import StorageError
from vitrine.index import symbolic
from vitrine.index.bm25 import MemoryBM25
from vitrine.sqlite import connect_wal

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
VECTOR_FIELDS = ("fused", "image", "text", "native")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS products (
    iid INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    doc TEXT,
    content_hash TEXT,
    version INTEGER,
    image_key TEXT,
    seq INTEGER NOT NULL,
    deleted INTEGER NOT NULL DEFAULT 0,
    model_key TEXT,
    vec_fused BLOB,
    vec_image BLOB,
    vec_text BLOB,
    vec_native BLOB
);
CREATE INDEX IF NOT EXISTS products_seq ON products(seq);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


@dataclass
class RecordRow:
    """One product to write: its document, vectors and the model that made them.

    ``vectors`` maps an index field (:data:`VECTOR_FIELDS`) to its vector, or None where the
    product has none (no photo: no image vector)."""

    id: str
    doc: dict[str, Any]
    content_hash: str
    version: int | None = None
    image_key: str | None = None
    model_key: str | None = None
    vectors: dict[str, np.ndarray | None] = field(default_factory=dict)


@dataclass
class StoredRow(RecordRow):
    """One product as stored: a :class:`RecordRow` with the store's bookkeeping, its integer id
    for the indexes (``iid``) and the change sequence number that last wrote it (``seq``).
    ``vectors`` is empty when it was read without them (``with_vectors=False``), and so is a
    tombstone's (``deleted``). A stored row can be written again (copied to another store)."""

    _: KW_ONLY
    iid: int
    seq: int
    deleted: bool = False
    from_mirror: bool = False  # read from a replica's local mirror, not the store (vitrine/index/failover.py)

    @classmethod
    def written(cls, row: RecordRow, iid: int, seq: int) -> StoredRow:
        """``row`` as a store holds it once written at change ``seq`` under ``iid``."""
        return cls(id=row.id, doc=row.doc, content_hash=row.content_hash, version=row.version,
                   image_key=row.image_key, model_key=row.model_key, vectors=row.vectors, iid=iid, seq=seq)


def vector_blob(v: np.ndarray | None) -> bytes | None:
    """A vector as stored: float32 bytes (None stays None)."""
    return None if v is None else np.asarray(v, dtype=np.float32).tobytes()


def blob_vector(b: bytes | None) -> np.ndarray | None:
    return None if b is None else np.frombuffer(b, dtype=np.float32).copy()


def doc_json(doc: dict[str, Any]) -> str:
    """A product document as stored (compact JSON, Unicode kept)."""
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def keyset_pages(page_after: Callable[[int], list[StoredRow]]) -> Iterator[StoredRow]:
    """Rows streamed page by page in iid order: ``page_after(iid)`` is the next page of rows
    after ``iid`` (keyset pagination: no OFFSET, and writes meanwhile never repeat a row)."""
    last = 0
    while True:
        rows = page_after(last)
        if not rows:
            return
        yield from rows
        last = rows[-1].iid


def row_from_tuple(r: Sequence[Any], with_vectors: bool) -> StoredRow:
    """A StoredRow from ``iid, id, doc, content_hash, version, image_key, seq, deleted, model_key,
    vec_fused, vec_image, vec_text[, vec_native]`` (the column order both record stores select)."""
    iid, pid, doc, h, ver, img, seq, deleted, mk, vf, vi, vt, *rest = r
    vn = rest[0] if rest else None  # vec_native: the SQLite store keeps it; without it the engine recomputes
    return StoredRow(
        id=pid, doc=json.loads(doc) if doc else {}, content_hash=h, version=ver, image_key=img,
        model_key=mk, iid=iid, seq=seq, deleted=bool(deleted),
        vectors={"fused": blob_vector(vf), "image": blob_vector(vi), "text": blob_vector(vt),
                 "native": blob_vector(vn)} if with_vectors else {},
    )


class RecordStore:
    """Products keyed by string id, each with a stable integer id (``iid``) for the indexes."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.location = str(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        try:
            self._conn = connect_wal(self.path, synchronous="FULL", check_same_thread=False, isolation_level=None)
            self._conn.executescript(_SCHEMA)
            row = self._conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None:
                # OR IGNORE: several processes may create the same new data dir at once
                self._conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) != SCHEMA_VERSION:
                raise StorageError(f"{self.path} has schema {row[0]}, this Vitrine reads {SCHEMA_VERSION}")
            _add_native_column(self._conn)
            self.fts = symbolic.ensure(self._conn)  # BM25 words, same file, same transactions
            self._bm25: MemoryBM25 | None = None  # exact BM25 scores from memory (bm25_scores)
            self._bm25_lock = threading.Lock()
            self._seq_seen: tuple[float, int] = (-1e9, 0)  # (monotonic time, seq) for recent_seq
        except sqlite3.DatabaseError as e:
            raise StorageError(f"cannot open record store {self.path}: {e}") from e

    def close(self) -> None:
        with self._lock:
            self._conn.close()
            bm25 = getattr(self, "_bm25", None)  # (absent when __init__ failed before it)
            if bm25 is not None:
                bm25.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    # -- meta ---------------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        with self._lock:
            row = self._conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        with self._tx() as c:
            c.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    @property
    def seq(self) -> int:
        seq = int(self.get_meta("seq") or 0)
        self._saw_seq(seq)
        return seq

    def recent_seq(self, max_age_s: float = 1.0) -> int:
        """The change sequence number as of at most ``max_age_s`` ago: this store's own writes at
        once, other processes' within ``max_age_s`` (the API workers follow each other every
        second anyway). A search asks for it; a SQLite query under the connection lock per search
        was 4% of a text search's CPU under load."""
        at, seq = self._seq_seen
        if time.monotonic() - at < max_age_s:
            return seq
        return self.seq

    def _saw_seq(self, seq: int) -> None:
        self._seq_seen = (time.monotonic(), max(seq, self._seq_seen[1]))  # never back: a slow read loses

    # -- writes ---------------------------------------------------------------------------------
    def upsert_many(self, rows: Sequence[RecordRow]) -> tuple[int, list[int]]:
        """Write rows in one transaction; returns (new sequence number, iids in order)."""
        if not rows:
            return self.seq, []
        iids: list[int] = []
        with self._tx() as c:
            seq = int((c.execute("SELECT value FROM meta WHERE key='seq'").fetchone() or [0])[0]) + 1
            for r in rows:
                v = r.vectors
                c.execute(
                    """INSERT INTO products (id, doc, content_hash, version, image_key, seq, deleted, model_key,
                                             vec_fused, vec_image, vec_text, vec_native)
                       VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?, ?)
                       ON CONFLICT(id) DO UPDATE SET doc=excluded.doc, content_hash=excluded.content_hash,
                         version=excluded.version, image_key=excluded.image_key, seq=excluded.seq, deleted=0,
                         model_key=excluded.model_key, vec_fused=excluded.vec_fused,
                         vec_image=excluded.vec_image, vec_text=excluded.vec_text,
                         vec_native=excluded.vec_native""",
                    (r.id, doc_json(r.doc), r.content_hash,
                     r.version, r.image_key, seq, r.model_key,
                     vector_blob(v.get("fused")), vector_blob(v.get("image")), vector_blob(v.get("text")),
                     vector_blob(v.get("native"))),
                )
                iids.append(int(c.execute("SELECT iid FROM products WHERE id=?", (r.id,)).fetchone()[0]))
                if self.fts:
                    symbolic.write(c, iids[-1], r.doc)
            c.execute("INSERT OR REPLACE INTO meta VALUES ('seq', ?)", (str(seq),))
        self._saw_seq(seq)
        return seq, iids

    def delete_many(self, ids: Sequence[str], versions: Sequence[int | None] | None = None) -> tuple[int, list[int]]:
        """Tombstone products; returns (the sequence number of this change, iids actually deleted).
        The sequence number is 0 when nothing was written: the store's current number may be
        another process's change, which the caller must not take for its own."""
        deleted: list[int] = []
        tombstoned = False
        with self._tx() as c:
            seq = int((c.execute("SELECT value FROM meta WHERE key='seq'").fetchone() or [0])[0]) + 1
            for n, pid in enumerate(ids):
                row = c.execute("SELECT iid, deleted FROM products WHERE id=?", (pid,)).fetchone()
                ver = versions[n] if versions else None
                if row is None or row[1]:
                    # A versioned delete of an absent product still records its version, so an older
                    # upsert arriving late stays stale instead of resurrecting the product.
                    if ver is not None and row is None:
                        c.execute("INSERT INTO products (id, version, seq, deleted) VALUES (?, ?, ?, 1)",
                                  (pid, ver, seq))
                        tombstoned = True
                    elif ver is not None:
                        c.execute("UPDATE products SET version=? WHERE iid=? AND (version IS NULL OR version < ?)",
                                  (ver, row[0], ver))
                    continue
                c.execute(
                    """UPDATE products SET deleted=1, doc=NULL, vec_fused=NULL, vec_image=NULL, vec_text=NULL, vec_native=NULL,
                       seq=?, version=COALESCE(?, version) WHERE iid=?""",
                    (seq, ver, row[0]),
                )
                deleted.append(int(row[0]))
                if self.fts:
                    symbolic.remove(c, int(row[0]))
            if deleted or tombstoned:
                c.execute("INSERT OR REPLACE INTO meta VALUES ('seq', ?)", (str(seq),))
            else:
                seq = 0
        if seq:
            self._saw_seq(seq)
        return seq, deleted

    # -- reads ------------------------------------------------------------------------------------
    _COLS = "iid, id, doc, content_hash, version, image_key, seq, deleted, model_key"

    def _select(self, where: str, args: Sequence[Any], with_vectors: bool) -> list[StoredRow]:
        cols = self._COLS + (", vec_fused, vec_image, vec_text, vec_native" if with_vectors
                             else ", NULL, NULL, NULL, NULL")
        with self._lock:
            rows = self._conn.execute(f"SELECT {cols} FROM products WHERE {where}", args).fetchall()
        return [row_from_tuple(r, with_vectors) for r in rows]

    def get(self, pid: str, *, include_deleted: bool = False, with_vectors: bool = False) -> StoredRow | None:
        rows = self._select("id=?", (pid,), with_vectors)
        if not rows or (rows[0].deleted and not include_deleted):
            return None
        return rows[0]

    def get_many(self, pids: Sequence[str], *, with_vectors: bool = False,
                 include_deleted: bool = False) -> dict[str, StoredRow]:
        out: dict[str, StoredRow] = {}
        for i in range(0, len(pids), 500):
            chunk = list(pids[i:i + 500])
            for r in self._select(f"id IN ({','.join('?' * len(chunk))})", chunk, with_vectors):
                if include_deleted or not r.deleted:
                    out[r.id] = r
        return out

    def get_by_iids(self, iids: Sequence[int], *, with_vectors: bool = False) -> dict[int, StoredRow]:
        out: dict[int, StoredRow] = {}
        for i in range(0, len(iids), 500):
            chunk = [int(x) for x in iids[i:i + 500]]
            for r in self._select(f"iid IN ({','.join('?' * len(chunk))}) AND deleted=0", chunk, with_vectors):
                out[r.iid] = r
        return out

    def iter_rows(self, *, since_seq: int = 0, with_vectors: bool = True, include_deleted: bool = False,
                  batch: int = 2000) -> Iterator[StoredRow]:
        """Rows changed after ``since_seq`` (all live rows when 0), in iid order, streamed."""
        where = "iid > ? AND seq > ?" + ("" if include_deleted else " AND deleted=0")
        return keyset_pages(lambda last: self._select(f"{where} ORDER BY iid LIMIT {int(batch)}",
                                                      (last, since_seq), with_vectors))

    def bm25(self, text: str, k: int, *, only: Sequence[int] | None = None) -> list[tuple[int, float]]:
        """Top-``k`` (iid, BM25 score) for ``text`` over titles, brands, categories and
        attributes, best first; ``only`` scores just those iids. Empty without FTS5."""
        if not self.fts:
            return []
        with self._lock:
            return symbolic.search(self._conn, text, k, only=only)

    def bm25_scores(self, text: str) -> Mapping[int, float]:
        """BM25 score of every live product matching ``text`` (iid -> score). Empty without FTS5."""
        if not self.fts:
            return {}
        mem = self._memory_bm25()
        if mem is not None:
            try:  # same numbers as FTS5's bm25(), from memory, without holding the connection lock
                res = mem.scores(text, self.recent_seq())
            except sqlite3.Error as e:
                log.warning("in-memory BM25 failed (%s); asking SQLite", e)
                res = None
            if res is not None:
                return res
        with self._lock:
            return symbolic.scores(self._conn, text)

    def _memory_bm25(self) -> MemoryBM25 | None:
        if self._bm25 is None:
            with self._bm25_lock:
                if self._bm25 is None:
                    try:
                        self._bm25 = MemoryBM25(self.path)
                    except sqlite3.Error as e:  # pragma: no cover - the file opened a moment ago
                        log.warning("in-memory BM25 unavailable (%s)", e)
                        return None
        return self._bm25

    def text_index(self, *, build: bool = True) -> MemoryBM25 | None:
        """The in-memory BM25 postings (for processes forked after this one:
        :meth:`adopt_text_index`; for snapshots), built now if they were not unless ``build`` is
        False. None without FTS5."""
        if not self.fts:
            return None
        if build:
            self.bm25_scores("warm up")
        return self._memory_bm25()

    def adopt_text_index(self, index: object | None) -> None:
        """Serve BM25 from postings the process this one was forked from built over this file
        (:meth:`text_index`), caught up with later changes when first asked."""
        if isinstance(index, MemoryBM25) and self.fts and index.path == str(self.path):
            with self._bm25_lock:
                self._bm25 = index.reopened()

    def changed_since(self, seq: int) -> int:
        """Products written or deleted after change ``seq`` (how far the catalogue moved since)."""
        with self._lock:
            return int(self._conn.execute("SELECT COUNT(*) FROM products WHERE seq > ?", (seq,)).fetchone()[0])

    def content_digest(self) -> str:
        """SHA-256 over every live product's id and content hash, in id order: the catalogue's
        identity (two stores holding the same products have the same digest)."""
        import hashlib

        h = hashlib.sha256()
        with self._lock:
            for pid, ch in self._conn.execute("SELECT id, content_hash FROM products WHERE deleted=0 ORDER BY id"):
                h.update(f"{pid}\t{ch}\n".encode())
        return h.hexdigest()

    def count(self) -> int:
        with self._lock:
            return int(self._conn.execute("SELECT COUNT(*) FROM products WHERE deleted=0").fetchone()[0])

    def ids(self) -> list[str]:
        with self._lock:
            return [r[0] for r in self._conn.execute("SELECT id FROM products WHERE deleted=0 ORDER BY iid")]


def _add_native_column(conn: sqlite3.Connection) -> None:
    """Stores made before the text tower's native vectors were kept get the column (NULL: the
    engine fills those products' native vectors in from their texts when it opens)."""
    cols = {r[1] for r in conn.execute("PRAGMA table_info(products)")}
    if "vec_native" not in cols:
        try:
            conn.execute("ALTER TABLE products ADD COLUMN vec_native BLOB")
        except sqlite3.OperationalError as e:  # another process added it meanwhile
            if "duplicate column" not in str(e):
                raise


class ImageStore:
    """Content-addressed photo files under one folder."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path_for(self, key: str) -> Path:
        if not key or "/" in key or "\\" in key or key.startswith("."):
            raise StorageError(f"bad image key {key!r}")
        return self.root / key[:2] / key

    def put(self, key: str, data: bytes) -> None:
        path = self.path_for(key)
        if path.exists():
            return
        atomic_write_bytes(path, data)

    def put_many(self, items: Mapping[str, bytes]) -> None:
        """Store photos, each flushed to disk before this returns. In threads: every photo waits
        for its own fsync, and waits side by side overlap (an ingest batch's photos took 0.5 ms
        each in turn on a quiet disk, 9 ms on a busy one: bench-results/ingest-profile)."""
        if len(items) <= 1:
            for key, data in items.items():
                self.put(key, data)
            return
        with ThreadPoolExecutor(max_workers=min(8, len(items))) as pool:
            for _ in pool.map(lambda kv: self.put(*kv), items.items()):
                pass

    def get(self, key: str) -> bytes | None:
        try:
            return self.path_for(key).read_bytes()
        except (OSError, StorageError):
            return None
