"""SQLite files several processes open at once (a data dir's records, the feature cache).

Switching a file to write-ahead logging (``PRAGMA journal_mode=WAL``) takes an exclusive lock
that SQLite's busy timeout does not wait for: when two processes open a new file at the same
moment (an API writer and a replica started together), one gets "database is locked" at once
(4 processes opening a fresh file together: 5 failures in 40 tries). :func:`connect_wal` retries
the switch until the timeout.
"""

from __future__ import annotations

import os
import sqlite3
import time
from typing import Any


def connect_wal(path: str | os.PathLike[str], *, timeout: float = 30.0, synchronous: str = "NORMAL",
                **kwargs: Any) -> sqlite3.Connection:
    """``sqlite3.connect(path, timeout=timeout, **kwargs)`` in WAL mode with ``synchronous``; a
    lock held by another process's switch is waited for (up to ``timeout`` s), not raised."""
    conn = sqlite3.connect(path, timeout=timeout, **kwargs)
    deadline = time.monotonic() + timeout
    pause = 0.005
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() + pause > deadline:
                conn.close()
                raise
            time.sleep(pause)
            pause = min(pause * 2, 0.2)
    conn.execute(f"PRAGMA synchronous={synchronous}")
    return conn
