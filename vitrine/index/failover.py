"""A shared record store that a crashed database does not take down: reads fall back to the
local mirror of its documents (vitrine/index/mirror.py), writes are refused at once.

:class:`FailoverRecordStore` is what a replica over PostgreSQL opens (vitrine/index/store.py).
While the database answers it is the PostgreSQL store itself, and the mirror follows it in the
background. When the database stops answering (:class:`~vitrine.index.storehealth.StoreHealth`:
a failed query, or the watcher's ``SELECT 1``), product reads come from the mirror, change
numbers are the last ones seen (so caches keyed on them stay valid), BM25 raises
``StorageError`` without waiting (the search drops that signal and says so), and every write
raises ``StorageError`` at once (the API answers 503: nothing is acknowledged that was not
stored). Searches say ``degraded: ["store"]`` with the seconds since the store last answered.

The mirror serves only once it finished its first full copy (before that, a read it would serve
raises ``StorageError``: 503, never a wrong "not found"). A product the mirror does not hold is
never "not found" while the store is down (it may have been acknowledged just before the crash,
after the mirror's last copy): ``StorageError`` (503 with ``Retry-After``); a product the mirror
holds as deleted is. Every row served by the mirror says so (``StoredRow.from_mirror``), also when
the store is "up" but one read failed, so the response that used it says ``degraded: ["store"]``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from vitrine.errors import StorageError
from vitrine.index.mirror import FILE, DocMirror, MirrorFollower
from vitrine.index.storehealth import StoreHealth

if TYPE_CHECKING:
    from vitrine.index.pgpool import StorePool
    from vitrine.index.pgstore import PgRecordStore
    from vitrine.index.records import RecordRow, StoredRow

log = logging.getLogger(__name__)
T = TypeVar("T")


class FailoverRecordStore:
    """The PostgreSQL record store, with reads from a local mirror while the database is down."""

    def __init__(self, primary: PgRecordStore, data_dir: str | Path, health: StoreHealth, *,
                 follow_s: float = 1.0) -> None:
        self.primary, self.health = primary, health
        self.mirror = DocMirror(Path(data_dir) / FILE)
        self._last_seq = 0
        self.follower = MirrorFollower(self, self.mirror, interval_s=follow_s).start()

    # -- what the store is -------------------------------------------------------------------
    @property
    def location(self) -> str:
        return self.primary.location

    @property
    def read_only(self) -> bool:
        """A streaming standby: reads only (vitrine/index/pgstore.py)."""
        return self.primary.read_only

    @property
    def pool(self) -> StorePool:
        """The database's connection pool, shared with the feedback log."""
        return self.primary.pool

    @property
    def degraded(self) -> bool:
        """Whether reads come from the mirror now (the database is down)."""
        return not self.health.up

    @property
    def stale_s(self) -> float:
        return self.health.stale_s

    def close(self) -> None:
        self.follower.close()
        self.mirror.close()
        self.primary.close()

    def _primary(self, what: str) -> PgRecordStore:
        self.health.check(what)
        return self.primary

    def _failed(self, e: StorageError) -> None:
        """A read from the database failed: it is served from the mirror this time. Whether the
        database is down is the health's to say (a lost connection tells it, vitrine/index/pgpool.py;
        a pool busy for its whole timeout under load is no outage)."""
        log.debug("record store read failed, served from the mirror: %s", e)

    # -- change numbers ----------------------------------------------------------------------
    @property
    def seq(self) -> int:
        if self.health.up:
            try:
                self._last_seq = self.primary.seq
                return self._last_seq
            except StorageError as e:
                self._failed(e)
        return max(self._last_seq, self.mirror.seq)

    def recent_seq(self, max_age_s: float = 1.0) -> int:
        if self.health.up:
            try:
                self._last_seq = self.primary.recent_seq(max_age_s)
                return self._last_seq
            except StorageError as e:
                self._failed(e)
        return max(self._last_seq, self.mirror.seq)

    # -- meta and writes: the database or nothing ------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        return self._call("store metadata", lambda s: s.get_meta(key))

    def set_meta(self, key: str, value: str) -> None:
        self._call("the record store", lambda s: s.set_meta(key, value))

    def upsert_many(self, rows: Sequence[RecordRow]) -> tuple[int, list[int]]:
        return self._call("the record store", lambda s: s.upsert_many(rows))

    def delete_many(self, ids: Sequence[str], versions: Sequence[int | None] | None = None) -> tuple[int, list[int]]:
        return self._call("the record store", lambda s: s.delete_many(ids, versions))

    def put_photos(self, items: Mapping[str, bytes]) -> None:
        if not items:
            return
        self._call("the photo store", lambda s: s.put_photos(items))

    def get_photo(self, key: str) -> bytes | None:
        return self._call("the photo store", lambda s: s.get_photo(key))

    def _call(self, what: str, fn: Callable[[PgRecordStore], T]) -> T:
        try:
            return fn(self._primary(what))
        except StorageError as e:
            self._failed(e)
            raise

    # -- reads: the mirror while the database is down ------------------------------------------
    def _read(self, primary: Callable[[PgRecordStore], T], mirror: Callable[[], T], *,
              only_primary: bool = False) -> T:
        """From the database while it answers, else from the mirror; ``only_primary`` (a read
        with vectors, which the mirror does not keep): the database or its ``StorageError``."""
        if self.health.up or only_primary:
            try:
                return primary(self._primary("the record store"))
            except StorageError as e:
                self._failed(e)
                if only_primary:
                    raise
        if not self.mirror.ready:
            raise StorageError("the record store is unavailable and this replica's mirror has not finished "
                               "its first copy: retry shortly")
        return mirror()

    def _mirror_get(self, pid: str, include_deleted: bool) -> StoredRow | None:
        """A product from the mirror while the store is down: deleted there is gone; missing there
        may be a product acknowledged after the mirror's last copy, so it is no 404 but a 503."""
        row = self.mirror.get(pid, include_deleted=True)
        if row is None:
            raise StorageError(f"product {pid!r} is not in this replica's mirror and the record store is "
                               "unavailable, so whether it exists cannot be said: retry shortly")
        return None if row.deleted and not include_deleted else row

    def get(self, pid: str, *, include_deleted: bool = False, with_vectors: bool = False) -> StoredRow | None:
        return self._read(lambda s: s.get(pid, include_deleted=include_deleted, with_vectors=with_vectors),
                          lambda: self._mirror_get(pid, include_deleted), only_primary=with_vectors)

    def get_many(self, pids: Sequence[str], *, with_vectors: bool = False,
                 include_deleted: bool = False) -> dict[str, StoredRow]:
        return self._read(lambda s: s.get_many(pids, with_vectors=with_vectors, include_deleted=include_deleted),
                          lambda: self.mirror.get_many(pids, include_deleted=include_deleted),
                          only_primary=with_vectors)

    def get_by_iids(self, iids: Sequence[int], *, with_vectors: bool = False) -> dict[int, StoredRow]:
        return self._read(lambda s: s.get_by_iids(iids, with_vectors=with_vectors),
                          lambda: self.mirror.get_by_iids(iids), only_primary=with_vectors)

    def iter_rows(self, *, since_seq: int = 0, with_vectors: bool = True, include_deleted: bool = False,
                  batch: int = 2000) -> Iterator[StoredRow]:
        src = self._primary("the record store")

        def rows() -> Iterator[StoredRow]:  # the pages are read as they are consumed
            try:
                yield from src.iter_rows(since_seq=since_seq, with_vectors=with_vectors,
                                         include_deleted=include_deleted, batch=batch)
            except StorageError as e:
                self._failed(e)
                raise

        return rows()

    def bm25(self, text: str, k: int, *, only: Sequence[int] | None = None) -> list[tuple[int, float]]:
        return self._call("BM25 (the record store)", lambda s: s.bm25(text, k, only=only))

    def bm25_scores(self, text: str) -> Mapping[int, float]:
        return self._call("BM25 (the record store)", lambda s: s.bm25_scores(text))

    def text_index(self, *, build: bool = True) -> object | None:
        """None: the shared database ranks text."""
        return None

    def adopt_text_index(self, index: object | None) -> None:
        """Nothing to adopt: the shared database ranks text."""

    def count(self) -> int:
        return self._read(lambda s: s.count(), self.mirror.count)

    def ids(self) -> list[str]:
        return self._read(lambda s: s.ids(), self.mirror.ids)
