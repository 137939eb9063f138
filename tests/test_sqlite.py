"""SQLite files that several processes open at once."""

from __future__ import annotations

import multiprocessing as mp
import time

from vitrine.sqlite import connect_wal


def _open(path: str, start: float) -> str:
    while time.time() < start:  # every process switches the new file to WAL at the same moment
        pass
    try:
        conn = connect_wal(path)
        conn.execute("CREATE TABLE IF NOT EXISTS t (a)")
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        conn.close()
        return mode
    except Exception as e:  # noqa: BLE001 - reported to the test
        return repr(e)


def test_processes_opening_a_new_file_together_all_get_wal(tmp_path):
    """Plain ``sqlite3.connect`` + ``PRAGMA journal_mode=WAL`` failed with "database is locked" in
    5 of 160 opens (4 processes, 40 new files); connect_wal waits for the other's switch."""
    with mp.get_context("spawn").Pool(4) as pool:
        for trial in range(20):
            start = time.time() + 0.2
            got = pool.starmap(_open, [(str(tmp_path / f"f{trial}.sqlite"), start)] * 4)
            assert got == ["wal"] * 4, got


FORK_AFTER_LOST_LOCKS = """
import gc, json, os, sys, threading
from pathlib import Path
import sqlalchemy as sa
from vitrine.errors import StorageError
from vitrine.sqldb import SqlDb

path = Path(sys.argv[1])
db = SqlDb(path, what="test store")
with db.tx(write=True) as c:
    c.exec_driver_sql("CREATE TABLE t (a INTEGER)")
    c.exec_driver_sql("INSERT INTO t VALUES (0)")
path.read_bytes()  # what a plain copy does: open and close the live file (this process's locks go)
pid = os.fork()
if pid == 0:  # the child: collect what its at-fork hook let go of, then leave normally (finalization runs)
    gc.collect()
    sys.exit(0)
os.waitpid(pid, 0)
wal = path.with_name(path.name + "-wal").exists()
gate, errors = threading.Barrier(4), []

def writer(i):  # four at once: the pool opens new connections
    gate.wait()
    try:
        for _ in range(25):
            with db.tx(write=True) as c:
                c.execute(sa.text("INSERT INTO t VALUES (:a)"), {"a": i})
    except StorageError as e:
        errors.append(str(e))

threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({"wal": wal, "errors": errors[:3], "rows": db.rows("SELECT count(*) FROM t")[0][0]}))
"""


def test_a_forked_child_never_closes_its_parents_sqlite_connections(tmp_path):
    """The cause of the concurrent session turns that once answered "disk I/O error" in the full
    suite: a test copied the live data dir with a plain file copy, which dropped this process's
    locks on the SQLite files (sqlite.org/howtocorrupt.html 2.2); a test then forked a child, whose
    at-fork hook let the inherited pooled connections be closed (2.6). Closing the last of them, the
    child took the exclusive lock, checkpointed and deleted the live write-ahead log; new
    connections of the parent then read another log. The child now keeps them, never closed, even
    when it exits normally (in a process of its own here: a forked pytest must not exit normally)."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", FORK_AFTER_LOST_LOCKS, str(tmp_path / "s.sqlite")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"wal": True, "errors": [], "rows": 101}, got
