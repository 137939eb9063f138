"""Vectors in PostgreSQL (pgvector): an HNSW index in the database instead of FAISS in each
process, for catalogues beyond one node's memory (``VITRINE_VECTOR_BACKEND=pgvector``).

One table per vector field, ``vitrine_vec_<field> (iid BIGINT PRIMARY KEY, v vector(dim))``,
with an HNSW index on inner product (``vector_ip_ops``: the vectors are L2-normalised, so that
is cosine). Searches set ``hnsw.ef_search`` and ``hnsw.iterative_scan = relaxed_order``
(pgvector >= 0.8): a filtered search (``iid = ANY(allowed)``) keeps scanning the graph until it
has ``k`` rows that pass the filter (up to ``hnsw.max_scan_tuples``), instead of returning fewer
than ``k`` as a plain HNSW scan followed by a filter does; the ``k`` results are then sorted
exactly by score. A filter of at most ``exact_max`` ids is scored exactly (no index).

It satisfies :class:`~vitrine.index.vectors.VectorIndexAPI`, as the FAISS index does. Writes
are idempotent (an unchanged vector is not rewritten), so every replica replaying the change
sequence costs the database a read per product, not a write; on a read-only standby they are
skipped (the primary's writer wrote them). bench-results/pgvector.md measures recall@10
against FAISS Flat and the latency.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np

from vitrine.errors import InvalidInput, MissingExtra, StorageError

try:
    import psycopg
    from psycopg_pool import ConnectionPool, PoolTimeout
except ImportError as e:  # pragma: no cover
    raise MissingExtra("the pgvector backend needs psycopg 3 and psycopg_pool: pip install 'vitrine[postgres]'") from e

from vitrine.index.pgpool import scalar

log = logging.getLogger(__name__)


def _lit(v: np.ndarray) -> str:
    return "[" + ",".join(f"{x:.7g}" for x in np.asarray(v, dtype=np.float32).tolist()) + "]"


class PgVectorIndex:
    """Nearest neighbours by inner product in a pgvector HNSW index."""

    def __init__(self, url: str, field: str, dim: int, *, ef_search: int = 128, m: int = 16,
                 ef_construction: int = 64, exact_max: int = 2000, pool: ConnectionPool | None = None) -> None:
        if not field.isidentifier():
            raise InvalidInput(f"bad vector field {field!r}")
        self.dim, self.field, self.ef_search, self.exact_max = dim, field, ef_search, exact_max
        self.factory = "pgvector"
        self.table = f"vitrine_vec_{field}"
        self._own_pool = pool is None
        self.pool = pool or ConnectionPool(url, min_size=1, max_size=8, open=True, name=f"vitrine-vec-{field}",
                                           kwargs={"autocommit": True, "connect_timeout": 3},
                                           check=ConnectionPool.check_connection, timeout=5.0)
        with self._conn() as c:
            self.read_only = bool(scalar(c.execute("SELECT pg_is_in_recovery()")))
            if not self.read_only:
                with c.transaction():
                    c.execute("SELECT pg_advisory_xact_lock(%s)", (0x76656374,))
                    c.execute("CREATE EXTENSION IF NOT EXISTS vector")
                    c.execute(f"CREATE TABLE IF NOT EXISTS {self.table} (iid BIGINT PRIMARY KEY, v vector({dim}))")
                    c.execute(f"CREATE INDEX IF NOT EXISTS {self.table}_hnsw ON {self.table} USING hnsw "
                              f"(v vector_ip_ops) WITH (m = {int(m)}, ef_construction = {int(ef_construction)})")

    def close(self) -> None:
        if self._own_pool:
            self.pool.close()

    @contextmanager
    def _conn(self) -> Iterator[psycopg.Connection]:
        try:
            with self.pool.connection() as c:
                yield c
        except (psycopg.Error, PoolTimeout) as e:
            raise StorageError(f"pgvector index {self.table} unavailable: {str(e).strip()}") from e

    # -- bookkeeping ---------------------------------------------------------------------------
    def __len__(self) -> int:
        with self._conn() as c:
            return int(scalar(c.execute(f"SELECT count(*) FROM {self.table}")))

    def __contains__(self, id_: int) -> bool:
        with self._conn() as c:
            return c.execute(f"SELECT 1 FROM {self.table} WHERE iid=%s", (int(id_),)).fetchone() is not None

    def ids(self) -> np.ndarray:
        with self._conn() as c:
            return np.array([r[0] for r in c.execute(f"SELECT iid FROM {self.table}")], dtype=np.int64)

    def get_present(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ids = np.asarray(ids, dtype=np.int64)
        with self._conn() as c:
            got = {int(i): v for i, v in c.execute(f"SELECT iid, v::real[] FROM {self.table} WHERE iid = ANY(%s)",
                                                   (ids.tolist(),))}
        have = np.array([int(i) in got for i in ids.tolist()], dtype=bool)
        vecs = np.array([got[int(i)] for i in ids[have].tolist()], dtype=np.float32).reshape(-1, self.dim)
        return have, vecs

    def get(self, ids: np.ndarray | list[int]) -> np.ndarray:
        have, vecs = self.get_present(np.asarray(ids, dtype=np.int64))
        if not have.all():
            raise KeyError(f"{int((~have).sum())} ids not in {self.table}")
        return vecs

    # -- writes --------------------------------------------------------------------------------
    def upsert(self, ids: np.ndarray | list[int], vectors: np.ndarray) -> None:
        if self.read_only:
            return
        vectors = np.asarray(vectors, dtype=np.float32)
        with self._conn() as c, c.transaction(), c.cursor() as cur:
            cur.executemany(
                f"""INSERT INTO {self.table} AS t (iid, v) VALUES (%s, %s::vector) ON CONFLICT (iid)
                    DO UPDATE SET v = excluded.v WHERE t.v IS DISTINCT FROM excluded.v""",
                [(int(i), _lit(v)) for i, v in zip(np.asarray(ids).tolist(), vectors)])

    def delete(self, ids: np.ndarray | list[int]) -> int:
        if self.read_only:
            return 0
        with self._conn() as c:
            cur = c.execute(f"DELETE FROM {self.table} WHERE iid = ANY(%s)", ([int(i) for i in ids],))
            return int(cur.rowcount)

    # -- search --------------------------------------------------------------------------------
    def search(self, queries: np.ndarray, k: int,
               allowed: np.ndarray | Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` ids and inner-product scores per query (``-1`` pads); ``allowed`` filters."""
        q = np.atleast_2d(np.asarray(queries, dtype=np.float32))
        if q.shape[1] != self.dim:
            raise InvalidInput(f"query vectors must be {self.dim}-d, got {q.shape[1]}")
        if k <= 0:
            raise InvalidInput("k must be positive")
        out_s = np.full((len(q), k), -np.inf, dtype=np.float32)
        out_i = np.full((len(q), k), -1, dtype=np.int64)
        allow = None if allowed is None else [int(i) for i in np.asarray(allowed).tolist()]
        if allow is not None and not allow:
            return out_s, out_i
        where = "" if allow is None else "WHERE iid = ANY(%(allow)s)"
        exact = allow is not None and len(allow) <= self.exact_max
        with self._conn() as c, c.transaction():
            if exact:  # a small filter: score its vectors directly (no index scan)
                c.execute("SET LOCAL enable_indexscan = off")
            else:
                c.execute(f"SET LOCAL hnsw.ef_search = {max(int(self.ef_search), k)}")
                c.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
            for n, qv in enumerate(q):
                rows = c.execute(
                    f"""SELECT iid, s FROM (SELECT iid, -(v <#> %(q)s::vector) AS s FROM {self.table} {where}
                        ORDER BY v <#> %(q)s::vector LIMIT %(k)s) t ORDER BY s DESC""",
                    {"q": _lit(qv), "k": int(k), "allow": allow}).fetchall()
                for j, (iid, s) in enumerate(rows):
                    out_i[n, j], out_s[n, j] = int(iid), float(s)
        return out_s, out_i

    def save(self, path: object) -> str:  # pragma: no cover - the database is its own snapshot
        raise StorageError("a pgvector index lives in the database; there is nothing to snapshot")
