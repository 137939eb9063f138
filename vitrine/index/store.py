"""What the engine needs from a record store, and how one is chosen.

Two implementations keep the same things (products with their vectors, the change sequence,
tombstones, the text index for BM25, content-addressed photos):

- :class:`~vitrine.index.records.RecordStore`: SQLite (WAL) in the data dir, the embedded
  default: one host, any number of processes on it.
- :class:`~vitrine.index.pgstore.PgRecordStore`: PostgreSQL (``--store postgresql://...``),
  shared by API replicas and ingest workers on any number of hosts; the data dir then holds only
  what can be rebuilt (index snapshots, the feature cache, a photo cache).

Both assign every write batch one change sequence number in one transaction, and a reader that
sees number ``s`` sees every change up to ``s``: derived indexes (FAISS, graph, filters) follow
a store by replaying :meth:`RecordStoreAPI.iter_rows` since the number they reflect.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from vitrine.index.records import RecordRow, StoredRow


@runtime_checkable
class RecordStoreAPI(Protocol):
    """Products keyed by string id, each with a stable integer id (``iid``) for the indexes."""

    @property
    def seq(self) -> int: ...

    @property
    def location(self) -> str: ...

    def close(self) -> None: ...

    def get_meta(self, key: str) -> str | None: ...

    def set_meta(self, key: str, value: str) -> None: ...

    def recent_seq(self, max_age_s: float = 1.0) -> int: ...

    def upsert_many(self, rows: Sequence["RecordRow"]) -> tuple[int, list[int]]: ...

    def delete_many(self, ids: Sequence[str],
                    versions: Sequence[int | None] | None = None) -> tuple[int, list[int]]: ...

    def get(self, pid: str, *, include_deleted: bool = False, with_vectors: bool = False) -> "StoredRow | None": ...

    def get_many(self, pids: Sequence[str], *, with_vectors: bool = False,
                 include_deleted: bool = False) -> dict[str, "StoredRow"]: ...

    def get_by_iids(self, iids: Sequence[int], *, with_vectors: bool = False) -> dict[int, "StoredRow"]: ...

    def iter_rows(self, *, since_seq: int = 0, with_vectors: bool = True, include_deleted: bool = False,
                  batch: int = 2000) -> Iterator["StoredRow"]: ...

    def bm25(self, text: str, k: int, *, only: Sequence[int] | None = None) -> list[tuple[int, float]]: ...

    def bm25_scores(self, text: str) -> Mapping[int, float]: ...

    def text_index(self, *, build: bool = True) -> object | None:
        """In-memory text postings a process forked from this one can serve (None: none);
        ``build``: build them now if they were not (else they may be unbuilt)."""
        ...

    def adopt_text_index(self, index: object | None) -> None:
        """Serve the postings the process this one was forked from built (``text_index``)."""
        ...

    def count(self) -> int: ...

    def ids(self) -> list[str]: ...


@runtime_checkable
class PhotoStoreAPI(Protocol):
    """Content-addressed photo bytes (``<sha256>.<ext>`` keys)."""

    def path_for(self, key: str) -> Path: ...

    def put(self, key: str, data: bytes) -> None: ...

    def put_many(self, items: Mapping[str, bytes]) -> None: ...

    def get(self, key: str) -> bytes | None: ...


def is_database_url(store: str | None) -> bool:
    return bool(store) and str(store).split("://", 1)[0] in ("postgresql", "postgres")


def open_stores(store: str | None, data_dir: str | os.PathLike[str], *, pool_size: int = 8, timeout_s: float = 3.0,
                mirror: bool = False) -> tuple[RecordStoreAPI, PhotoStoreAPI]:
    """The record store and photo store of a data dir: SQLite in it (``store`` empty), or the
    PostgreSQL database ``store`` names, with ``data_dir`` as the local, rebuildable cache.
    ``mirror`` (a serving replica): the PostgreSQL store keeps a local copy of its documents in
    ``data_dir`` and reads from it while the database is down (vitrine/index/failover.py)."""
    data = Path(data_dir)
    if is_database_url(store):
        from vitrine.index.pgstore import PgImageStore, PgRecordStore  # psycopg is an extra

        pg = PgRecordStore(str(store), pool_size=pool_size, timeout_s=timeout_s)
        if not mirror:
            return pg, PgImageStore(pg, data / "images")
        from vitrine.index.failover import FailoverRecordStore

        rs = FailoverRecordStore(pg, data, pg.pool.health)
        return rs, PgImageStore(rs, data / "images")
    if store:
        from vitrine.errors import InvalidInput

        raise InvalidInput(f"unknown record store {store!r}: give a postgresql://... URL, or none for SQLite "
                           "in the data dir")
    from vitrine.index.records import ImageStore, RecordStore

    return RecordStore(data / "records.sqlite"), ImageStore(data / "images")
