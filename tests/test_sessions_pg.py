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
