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
