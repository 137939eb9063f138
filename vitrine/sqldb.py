"""One way to speak SQL to SQLite and PostgreSQL for the stores of the jobs around a search
(the feedback log, merchandising rules, shopping sessions): SQLAlchemy Core.

- :func:`open_db` gives a :class:`SqlDb`: one engine per store URL (or SQLite file and sync
  level) in a process, shared by every store on it and closed with the last of them. SQLite
  files run in WAL mode (vitrine/sqlite.py); a write transaction starts with ``BEGIN IMMEDIATE``
  so writers take turns instead of failing on an upgrade of their read lock. PostgreSQL goes
  through psycopg 3 (the ``postgres`` extra) and answers to the database's health
  (vitrine/index/storehealth.py): while it is known to be down a store is refused at once, and
  when it answers again the engine's pool drops its dead connections.
- Every database error becomes ``StorageError`` (the API answers 503), naming the store.
- **Schema versions**: a ``vitrine_schema`` table holds one version per store (``feedback``,
  ``rules``, ``sessions``). :meth:`SqlDb.ensure_schema` creates a new store's tables at the
  current version; a store made by an older Vitrine is upgraded step by step (:class:`Upgrade`)
  in one transaction (writers and other processes wait: SQLite's write lock, PostgreSQL's advisory
  lock), and a store from before versions existed counts as version 1. A store from a newer
  Vitrine, a failed step, or an old store on a read-only standby raise ``StorageError`` saying
  what to do.

Each store's tables, version and upgrades live in one module beside it:
vitrine/feedback/tables.py, vitrine/merchandising/tables.py, vitrine/conversation/tables.py.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from vitrine.errors import MissingExtra, StorageError
from vitrine.index.store import is_database_url
from vitrine.sqlite import connect_wal

log = logging.getLogger(__name__)

SQLITE_TRIES = 3
""":meth:`SqlDb.tried` on SQLite: a statement that failed runs again, 10 then 40 ms later (a
passing fault of the disk). PostgreSQL, known down through its health check, fails at once."""

T = TypeVar("T")

SCHEMA_TABLE = "vitrine_schema"
_meta = sa.MetaData()
schema_versions = sa.Table(
    SCHEMA_TABLE, _meta,
    sa.Column("store", sa.Text, primary_key=True),
    sa.Column("version", sa.Integer, nullable=False),
)


@dataclass(frozen=True)
class Upgrade:
    """One step from version ``to - 1`` to ``to``: ``what`` it does (said when it fails) and
    ``run(conn, db)``, inside the upgrade's transaction."""

    to: int
    what: str
    run: Callable[[Connection, SqlDb], None]


def redact(url: str) -> str:
    """``url`` without its password (for messages and logs)."""
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return "postgresql://?"


class _Shared:
    """An engine and how many open stores use it."""

    def __init__(self, engine: Engine, health: Any) -> None:
        self.engine, self.health, self.users = engine, health, 0


_engines: dict[tuple[str, str], _Shared] = {}
_engines_lock = threading.Lock()


def _keep_forever(obj: object) -> None:
    """A reference to ``obj`` that nothing drops, not even the interpreter's finalization at exit."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


def _forget_pools_after_fork() -> None:
    """A forked worker never uses its parent's pooled connections (SQLAlchemy's recipe: dispose
    without closing them, the parent still owns them); it connects anew on first use.

    Nor does it let them be garbage-collected, which closes a SQLite connection: SQLite forbids
    closing in the child a connection carried across ``fork()`` (sqlite.org/howtocorrupt.html,
    2.6). Where the parent's own locks on the file were gone (a ``close()`` of any descriptor of the
    file in the parent drops them all, 2.2: a plain copy of the live data dir did), the child's
    close took the exclusive lock, checkpointed and deleted the parent's live write-ahead log and
    shared memory; the parent's next new connection then read another log than the others wrote:
    "disk I/O error" (tests/test_sqlite.py). A reference in a list would not do: a child that exits
    normally frees it, and its connections close, at the interpreter's finalization."""
    global _engines_lock
    _engines_lock = threading.Lock()
    for shared in _engines.values():
        _keep_forever(shared.engine.pool)  # the pool holds the connections: never freed, never closed
        shared.engine.dispose(close=False)


os.register_at_fork(after_in_child=_forget_pools_after_fork)


def _sqlite_engine(path: Path, synchronous: str) -> Engine:
    engine = sa.create_engine(
        "sqlite://", creator=lambda: connect_wal(path, synchronous=synchronous, check_same_thread=False,
                                                 isolation_level=None),
        poolclass=sa.pool.QueuePool, pool_size=8, max_overflow=8)

    @sa.event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:  # pysqlite's own BEGIN is off (isolation_level=None)
        opts = conn.get_execution_options()
        if not opts.get("single"):  # one statement: SQLite runs it as its own transaction
            conn.exec_driver_sql("BEGIN IMMEDIATE" if opts.get("write") else "BEGIN")

    return engine


def _pg_engine(url: str, timeout_s: float) -> Engine:
    if importlib.util.find_spec("psycopg") is None:  # pragma: no cover - the `postgres` extra is not installed
        raise MissingExtra("a postgresql:// store needs psycopg 3: pip install 'vitrine[postgres]'")
    u = sa.engine.make_url(url).set(drivername="postgresql+psycopg")
    return sa.create_engine(u, pool_size=4, max_overflow=4, pool_timeout=timeout_s, pool_pre_ping=True,
                            connect_args={"connect_timeout": max(1, int(timeout_s))})


class SqlDb:
    """A store's handle on its database: transactions whose errors are ``StorageError``."""

    def __init__(self, target: str | os.PathLike[str], *, what: str, synchronous: str = "NORMAL",
                 timeout_s: float = 5.0) -> None:
        self.what, self.timeout_s = what, timeout_s
        self.postgres = is_database_url(str(target))
        self.location = redact(str(target)) if self.postgres else str(target)
        if self.postgres:
            self._key = (str(target), "")
        else:
            path = Path(target)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._key = (str(path.resolve()), synchronous)
        with _engines_lock:
            shared = _engines.get(self._key)
            if shared is None:
                if self.postgres:
                    from vitrine.index.storehealth import health_for

                    engine = _pg_engine(str(target), timeout_s)
                    shared = _Shared(engine, health_for(str(target)))
                    shared.health.on_recover(engine.dispose)
                else:
                    shared = _Shared(_sqlite_engine(Path(self._key[0]), synchronous), None)
                _engines[self._key] = shared
            shared.users += 1
        self._shared: _Shared | None = shared
        self.engine = shared.engine
        self.dialect = self.engine.dialect.name
        self.placeholder = "%s" if self.postgres else "?"

    def close(self) -> None:
        """Let go of the engine (disposed with its last store)."""
        with _engines_lock:
            shared, self._shared = self._shared, None
            if shared is None:
                return
            shared.users -= 1
            if shared.users == 0:
                _engines.pop(self._key, None)
                if shared.health is not None:
                    shared.health.off_recover(shared.engine.dispose)
                shared.engine.dispose()

    def check(self) -> None:
        """Raise StorageError now if the database is known to be down (PostgreSQL; SQLite never is)."""
        if self._shared is not None and self._shared.health is not None:
            self._shared.health.check(self.what)

    @contextmanager
    def tx(self, *, write: bool = False, single: bool = False) -> Iterator[Connection]:
        """A connection in one transaction, committed when the block ends (rolled back on error).
        ``write``: SQLite takes its write lock at the start (writers take turns). ``single``: the
        block runs one statement (or independent ones), each its own transaction in SQLite (no
        BEGIN and COMMIT round trips through SQLAlchemy: the hot paths)."""
        if self._shared is not None and self._shared.health is not None:
            self._shared.health.check(self.what)
        try:
            with self.engine.connect() as c:
                if write or single:
                    c = c.execution_options(write=write, single=single)
                if single and self.postgres:  # no BEGIN and COMMIT round trips to the server
                    c = c.execution_options(isolation_level="AUTOCOMMIT")
                with c.begin():
                    yield c
        except sa.exc.TimeoutError as e:
            raise StorageError(f"{self.what} unavailable: {str(e).strip()}") from e
        except sa.exc.DBAPIError as e:
            raise self._storage_error(e) from e

    def _storage_error(self, e: sa.exc.DBAPIError) -> StorageError:
        orig = e.orig if e.orig is not None else e
        if self.postgres and isinstance(e, sa.exc.OperationalError) and type(orig).__name__ != "QueryCanceled":
            if self._shared is not None and self._shared.health is not None:
                self._shared.health.failed(orig)  # a lost connection: the database is down
            return StorageError(f"{self.what} unavailable: {str(orig).strip()}")
        if self.postgres:
            return StorageError(f"{self.what} refused: {str(orig).strip()}")
        return StorageError(f"{self.what} ({self.location}): {str(orig).strip()}")

    def tried(self, fn: Callable[[], T]) -> T:
        """``fn()`` (one or more :meth:`tx` blocks), run again on SQLite after a StorageError
        (:data:`SQLITE_TRIES`), but not after "database is locked", which SQLite answers only once its
        own busy timeout ran out. A write run again must be safe to repeat (an upsert, or a
        compare-and-swap, whose second run fails as a lost race if the first did land)."""
        for attempt in range(SQLITE_TRIES):
            try:
                return fn()
            except StorageError as e:
                if self.postgres or "locked" in str(e) or attempt == SQLITE_TRIES - 1:
                    raise
                log.warning("%s: %s; trying again", self.what, e)
                time.sleep(0.01 * 4 ** attempt)
        raise AssertionError("unreachable")

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        """Rows of a statement in the driver's own SQL (``placeholder`` marks the parameters)."""
        with self.tx(single=True) as c:
            return [tuple(r) for r in c.exec_driver_sql(sql, tuple(params)).fetchall()]

    def insert(self, table: sa.Table) -> Any:
        """An INSERT with this dialect's ON CONFLICT clauses (``on_conflict_do_nothing`` / ``_update``)."""
        if self.postgres:
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            return pg_insert(table)
        from sqlalchemy.dialects.sqlite import insert as lite_insert

        return lite_insert(table)

    def read_only(self, c: Connection) -> bool:
        """Whether this database refuses writes (a PostgreSQL streaming standby)."""
        return bool(self.postgres and c.exec_driver_sql("SELECT pg_is_in_recovery()").scalar())

    # -- schema versions ------------------------------------------------------------------------
    def ensure_schema(self, store: str, metadata: sa.MetaData, version: int, upgrades: Sequence[Upgrade],
                      legacy_table: str) -> int:
        """Bring ``store``'s tables to ``version`` (see the module docstring); returns the version
        found. ``legacy_table``: a table whose presence without a version row means version 1."""
        try:
            with self.engine.connect() as c, c.execution_options(write=True).begin():
                if self.read_only(c):
                    found, _ = self._found(c, store, legacy_table)
                    if found != version:
                        raise StorageError(
                            f"the {self.what} ({self.location}) is a read-only standby at schema version "
                            f"{found or 'none'} of {store!r}; this Vitrine needs version {version}: open the "
                            "primary with this Vitrine first (it upgrades it), then the standby follows")
                    return found
                if self.postgres:
                    c.exec_driver_sql("SELECT pg_advisory_xact_lock(%s)", (0x76736368,))  # "vsch"
                schema_versions.create(c, checkfirst=True)
                found, stamped = self._found(c, store, legacy_table)
                if found > version:
                    raise StorageError(
                        f"the {self.what} ({self.location}) was made by a newer Vitrine: schema {store!r} is at "
                        f"version {found}, this Vitrine knows up to {version}; upgrade Vitrine (or open a "
                        "data dir made by this version)")
                if found == 0:
                    metadata.create_all(c)
                else:
                    for step in upgrades:
                        if found < step.to <= version:
                            try:
                                step.run(c, self)
                            except sa.exc.DBAPIError as e:
                                raise StorageError(
                                    f"cannot upgrade the {self.what} ({self.location}) from schema version "
                                    f"{step.to - 1} to {step.to} of {store!r} ({step.what}): {e.orig}; nothing "
                                    "was changed. Fix the cause (a full disk, a database user without ALTER "
                                    "rights) and open it again; the upgrade runs at every open until done") from e
                            log.info("%s: schema %r upgraded to version %d (%s)", self.location, store, step.to,
                                     step.what)
                    metadata.create_all(c)  # tables and indexes added by this version
                if found != version or not stamped:
                    self._stamp(c, store, version)
                return found
        except sa.exc.DBAPIError as e:
            raise self._storage_error(e) from e

    @staticmethod
    def _found(c: Connection, store: str, legacy_table: str) -> tuple[int, bool]:
        """The version ``store`` is at (0: none of its tables) and whether a row says so."""
        insp = sa.inspect(c)
        if insp.has_table(SCHEMA_TABLE):
            v = c.execute(sa.select(schema_versions.c.version).where(schema_versions.c.store == store)).scalar()
            if v is not None:
                return int(v), True
        return (1 if insp.has_table(legacy_table) else 0), False

    def _stamp(self, c: Connection, store: str, version: int) -> None:
        ins = self.insert(schema_versions).values(store=store, version=version)
        c.execute(ins.on_conflict_do_update(index_elements=["store"], set_={"version": version}))


def schema_version(db: SqlDb, store: str) -> int | None:
    """The version ``store`` is at in ``db`` (None: not made yet)."""
    with db.tx() as c:
        if not sa.inspect(c).has_table(SCHEMA_TABLE):
            return None
        v = c.execute(sa.select(schema_versions.c.version).where(schema_versions.c.store == store)).scalar()
    return None if v is None else int(v)


def add_missing_columns(c: Connection, table: sa.Table, names: Sequence[str]) -> None:
    """``ALTER TABLE ... ADD COLUMN`` for each of ``names`` the stored ``table`` lacks (an upgrade step)."""
    have = {col["name"] for col in sa.inspect(c).get_columns(table.name)}
    prep = c.dialect.identifier_preparer
    for name in names:
        if name not in have:
            col = table.c[name]
            default = col.server_default.arg if isinstance(col.server_default, sa.DefaultClause) else None
            extra = "" if default is None else f" NOT NULL DEFAULT {default}" if not col.nullable \
                else f" DEFAULT {default}"  # rows already there take the default
            c.exec_driver_sql(f"ALTER TABLE {prep.format_table(table)} ADD COLUMN {prep.format_column(col)} "
                              f"{col.type.compile(dialect=c.dialect)}{extra}")
