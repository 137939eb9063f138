"""Shopping sessions in PostgreSQL (vitrine_sessions): replicas on many hosts see one session."""

from __future__ import annotations

import numpy as np


def test_pg_sessions_shared_expiring_bounded(pg_url):
    from vitrine.conversation.store import SessionStore, open_session_store

    a = open_session_store("auto", data_dir="/nonexistent", database_url=pg_url, ttl_s=60, max_sessions=5)
    b = SessionStore(pg_url, ttl_s=60, max_sessions=5)  # another replica
    try:
        assert isinstance(a, SessionStore)
        vec = np.arange(4, dtype=np.float32)
        a.put("s1", {"turn": 1, "slots": {"colour": ["Brown"]}}, vec.tobytes())
        got = b.get("s1")
        assert got is not None and got.state["slots"] == {"colour": ["Brown"]}
        assert np.array_equal(np.frombuffer(got.vector, dtype=np.float32), vec)
        a.put("s1", {"turn": 2}, None)
        assert b.get("s1").state == {"turn": 2} and b.get("s1").vector is None
        for i in range(8):
            a.put(f"x{i}", {"turn": i}, None)
        a.purge()
        assert a.count() <= 5 and b.get("x7") is not None
        b.ttl_s = 0.0
        assert b.get("x7").expired and b.get("nope") is None
    finally:
        a.close()
        b.close()


def test_pg_session_writes_name_the_version_they_read(pg_url):
    """Two replicas' turns of one session: the write that read a stale version fails (compare-and-swap),
    so the session layer applies that turn again on what the other wrote (tests/test_sessions_trust.py)."""
    from vitrine.conversation.store import SessionStore

    a = SessionStore(pg_url, ttl_s=60, max_sessions=100)
    b = SessionStore(pg_url, ttl_s=60, max_sessions=100)
    try:
        assert a.put("cas", {"turn": 1}, None, expected=0)
        seen_a, seen_b = a.get("cas"), b.get("cas")
        assert seen_a.version == seen_b.version == 1
        assert b.put("cas", {"turn": 2, "by": "b"}, None, expected=seen_b.version)
        assert not a.put("cas", {"turn": 2, "by": "a"}, None, expected=seen_a.version)  # lost the race
        got = a.get("cas")
        assert got.state == {"turn": 2, "by": "b"} and got.version == 2
        assert a.put("cas", {"turn": 3}, None, expected=got.version) and b.get("cas").version == 3
        assert a.put("gone", {"turn": 4}, None, expected=3) and a.get("gone").version == 4  # purged meanwhile: written afresh
    finally:
        a.close()
        b.close()
