"""A local, read-only copy of a shared store's product documents, for reads while it is down.

A replica over PostgreSQL holds its vectors, graph and filters locally but read each hit's
document (title, price, attributes ...) from the database: with the database down, no search
could answer. The mirror is a SQLite file in the replica's data dir (``store-mirror.sqlite``)
holding every product's document and bookkeeping (no vectors: those the replica holds), kept
current by :class:`MirrorFollower` from the store's change numbers (``seq``), as the index
follows. Only reads use it, and only while the store is down (vitrine/index/failover.py).
Processes sharing a data dir share the file; one of them (an ``flock``) follows.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Protocol

from vitrine.errors import StorageError
from vitrine.index.records import StoredRow, doc_json
from vitrine.sqlite import connect_wal

log = logging.getLogger(__name__)

FILE = "store-mirror.sqlite"
_COLS = "iid, id, doc, content_hash, version, image_key, seq, deleted, model_key"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS docs (iid INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, doc TEXT NOT NULL,
  content_hash TEXT, version INTEGER, image_key TEXT, seq INTEGER NOT NULL, deleted INTEGER NOT NULL,
  model_key TEXT);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class DocMirror:
    """The mirror file: documents by ``iid`` and ``id``, and the change number copied up to."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        with self._conn() as c:
            c.executescript(_SCHEMA)

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = self._local.conn = connect_wal(self.path, check_same_thread=False)
            except sqlite3.Error as e:
                raise StorageError(f"the store mirror {self.path} cannot be opened: {e}") from e
        return conn

    @property
    def seq(self) -> int:
        row = self._conn().execute("SELECT value FROM meta WHERE key='seq'").fetchone()
        return int(row[0]) if row else 0

    @property
    def ready(self) -> bool:
        """Whether the mirror finished its first full copy of the store (only then may it serve:
        a half-copied mirror would answer "no such product" for products that exist)."""
        row = self._conn().execute("SELECT value FROM meta WHERE key='complete'").fetchone()
        return row is not None or self.seq > 0

    def mark_complete(self) -> None:
        with self._conn() as c:
            c.execute("INSERT OR IGNORE INTO meta VALUES ('complete', '1')")

    def apply(self, rows: Iterable[StoredRow], seq: int) -> int:
        """Copy ``rows`` (documents as stored, tombstones included) and record that the mirror
        holds every change up to ``seq``; returns the rows copied."""
        data = [(r.iid, r.id, doc_json(r.doc), r.content_hash, r.version, r.image_key, r.seq, int(r.deleted),
                 r.model_key) for r in rows]
        with self._conn() as c:
            if data:  # a row replaces the one with its iid, and any other row holding its id
                c.executemany(f"INSERT OR REPLACE INTO docs ({_COLS}) VALUES (?,?,?,?,?,?,?,?,?)", data)
            c.execute("INSERT INTO meta VALUES ('seq', ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value "
                      "WHERE CAST(excluded.value AS INTEGER) > CAST(meta.value AS INTEGER)", (str(seq),))
        return len(data)

    def _select(self, where: str, args: Sequence[object]) -> list[StoredRow]:
        rows = self._conn().execute(f"SELECT {_COLS} FROM docs WHERE {where}", tuple(args)).fetchall()
        return [StoredRow(id=pid, doc=json.loads(doc), content_hash=h, version=ver, image_key=img, model_key=mk,
                          iid=iid, seq=seq, deleted=bool(deleted), from_mirror=True)
                for iid, pid, doc, h, ver, img, seq, deleted, mk in rows]

    def get(self, pid: str, *, include_deleted: bool = False) -> StoredRow | None:
        rows = self._select("id=?", (pid,))
        if not rows or (rows[0].deleted and not include_deleted):
            return None
        return rows[0]

    def get_many(self, pids: Sequence[str], *, include_deleted: bool = False) -> dict[str, StoredRow]:
        rows = self._select("id IN (SELECT value FROM json_each(?))", (json.dumps(list(pids)),)) if pids else []
        return {r.id: r for r in rows if include_deleted or not r.deleted}

    def get_by_iids(self, iids: Sequence[int]) -> dict[int, StoredRow]:
        if not len(iids):
            return {}
        rows = self._select("iid IN (SELECT value FROM json_each(?)) AND NOT deleted",
                            (json.dumps([int(i) for i in iids]),))
        return {r.iid: r for r in rows}

    def count(self) -> int:
        return int(self._conn().execute("SELECT count(*) FROM docs WHERE NOT deleted").fetchone()[0])

    def ids(self) -> list[str]:
        return [r[0] for r in self._conn().execute("SELECT id FROM docs WHERE NOT deleted ORDER BY iid")]

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


class ChangeFeed(Protocol):
    """What the follower reads from the store: its latest change number and the rows changed since."""

    def recent_seq(self, max_age_s: float = 1.0) -> int: ...

    def iter_rows(self, *, since_seq: int = 0, with_vectors: bool = True, include_deleted: bool = False,
                  batch: int = 2000) -> Iterator[StoredRow]: ...


class MirrorFollower:
    """Keeps a :class:`DocMirror` current from the store: every ``interval_s``, the changes after
    the mirror's ``seq`` (without vectors), when this process holds the data dir's follow lock."""

    def __init__(self, store: ChangeFeed, mirror: DocMirror, *, interval_s: float = 1.0,
                 ready: threading.Event | None = None) -> None:
        self.store, self.mirror, self.interval_s = store, mirror, interval_s
        self._stop = threading.Event()
        self._lock_file: IO[bytes] | None = None
        self._thread = threading.Thread(target=self._run, name="vitrine-store-mirror", daemon=True)
        self.ready = ready or threading.Event()

    def start(self) -> MirrorFollower:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        if self._lock_file is not None:
            self._lock_file.close()

    def _holds_lock(self) -> bool:
        if self._lock_file is not None:
            return True
        f = open(self.mirror.path.with_suffix(".lock"), "ab")  # held while following
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            return False
        self._lock_file = f
        return True

    def sync_once(self) -> int:
        """Copy the changes the mirror lacks; returns the rows copied."""
        have, head = self.mirror.seq, self.store.recent_seq(self.interval_s / 2)
        if head <= have:
            if not self.mirror.ready:  # an empty store, copied in full
                self.mirror.mark_complete()
            return 0
        copied, batch = 0, []
        for row in self.store.iter_rows(since_seq=have, with_vectors=False, include_deleted=True):
            batch.append(row)
            if len(batch) >= 2000:
                copied += self.mirror.apply(batch, have)
                batch = []
        copied += self.mirror.apply(batch, head)
        self.mirror.mark_complete()
        return copied

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._holds_lock():
                    n = self.sync_once()
                    if n:
                        log.debug("store mirror: %d rows copied (seq %d)", n, self.mirror.seq)
                self.ready.set()
            except StorageError as e:  # the store is down: try again next round
                log.debug("store mirror: %s", e)
            except Exception:  # the follower must outlive a bad round
                log.exception("store mirror: a round failed")
            self._stop.wait(self.interval_s)
