"""The batched search-log writer (vitrine/feedback/logwriter.py): a read of the log waits for the
searches queued before it, except what the search path itself reads (the experiments' specs), which
must never wait behind the events' commits for the file's write lock (issue 53, item 8)."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time

from vitrine.feedback.eventlog import EventLog
from vitrine.feedback.logwriter import BatchedSearchLog
from vitrine.feedback.types import SearchLog, new_query_id


def _search(text: str) -> SearchLog:
    now = time.time()
    return SearchLog(query_id=new_query_id(now), ts=now, text=text, norm=text, ids=("p1", "p2"), total=2)


def test_the_search_path_reads_experiments_without_waiting_for_queued_searches(tmp_path):
    path = tmp_path / "events.sqlite"
    log = BatchedSearchLog(EventLog(path, timeout_s=30.0))
    try:
        log.save_experiment("exp", '{"name": "exp"}', 1.0)
        with contextlib.closing(sqlite3.connect(path, timeout=30.0, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")  # an events commit holding the file's write lock
            log.log_search(_search("red shoes"))  # queued; its write waits for the lock
            got: list[list[str]] = []
            reader = threading.Thread(target=lambda: got.append([n for n, _, _ in log.experiment_specs()]))
            reader.start()
            reader.join(20.0)  # a read that flushed would wait here for the lock (30 s)
            answered = not reader.is_alive()
            assert log.written == 0  # the queued search is still waiting for the lock
            other.execute("COMMIT")
            reader.join()
        assert answered and got == [["exp"]]  # answered while the queued search waited
        assert log.counts()["searches"] == 1  # any other read waits for what queued before it
        assert log.written == 1
    finally:
        log.close()
