"""Events on a search another process answered (issue 53: a sibling worker, or the API process when
events are stored by a process of their own): its background writer may not have written the search
yet when the event arrives, so a search made in the last seconds that the log lacks is waited for,
briefly (vitrine/feedback/intake.py ``Feedback.logged_searches``)."""

from __future__ import annotations

import threading
import time

import pytest

from vitrine.errors import InvalidInput
from vitrine.feedback.eventlog import EventLog
from vitrine.feedback.intake import FRESH_S, EventIn, Feedback
from vitrine.feedback.types import SearchLog, new_query_id
from vitrine.settings import FeedbackSettings


class CountingLog:
    """An event log that counts the lookups of searches (how often the intake read the log again)."""

    def __init__(self, inner: EventLog) -> None:
        self.inner, self.lookups = inner, 0

    def searches(self, query_ids):
        self.lookups += 1
        return self.inner.searches(query_ids)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture
def logs(tmp_path):
    ours, theirs = EventLog(tmp_path / "events.sqlite"), EventLog(tmp_path / "events.sqlite")
    yield CountingLog(ours), theirs
    ours.close()
    theirs.close()


def click(qid: str) -> EventIn:
    return EventIn(type="click", query_id=qid, product_id="p2", position=1)


def test_a_fresh_search_the_other_process_writes_late_is_waited_for(logs):
    ours, theirs = logs
    fb = Feedback(ours, FeedbackSettings(), batched=False)
    qid = new_query_id(time.time())
    late = threading.Timer(0.1, lambda: theirs.log_search(
        SearchLog(query_id=qid, ts=time.time(), text="lamp", norm="lamp", ids=("p1", "p2"))))
    late.start()
    assert fb.record([click(qid)]) == (1, 1)  # found on a later look, not refused
    late.join()
    assert ours.lookups >= 2
    assert [e.position for e in ours.inner.read().events] == [1]


def test_an_unknown_search_is_refused_and_only_a_fresh_one_is_waited_for(logs):
    ours, _ = logs
    fb = Feedback(ours, FeedbackSettings(), batched=False)
    old = new_query_id(time.time() - FRESH_S - 60)  # made long ago and never logged: no writer holds it
    with pytest.raises(InvalidInput, match=r"events\[0\]\.query_id: unknown query_id"):
        fb.record([click(old)])
    assert ours.lookups == 1  # refused at once
    fresh = new_query_id(time.time())  # made just now, never written by anyone: waited for, then refused
    with pytest.raises(InvalidInput, match=r"events\[0\]\.query_id: unknown query_id"):
        fb.record([click(fresh)])
    assert ours.lookups > 2
    assert ours.inner.counts()["events"] == 0
