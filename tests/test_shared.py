"""The shared leaf helpers: the one LRU and the one atomic write, against brute-force references."""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest

from vitrine.atomic import atomic_path, atomic_write_bytes, atomic_write_text
from vitrine.index.cache import IdSetCache
from vitrine.lru import LRU


def test_lru_matches_a_reference_under_random_use():
    rng = random.Random(0)
    lru: LRU[int] = LRU(5, max_weight=20, weight=lambda v: v)
    ref: list[tuple[int, int]] = []  # (key, value), least recent first
    for _ in range(2000):
        key = rng.randrange(12)
        if rng.random() < 0.5:
            value = rng.randrange(10)
            lru.put(key, value)
            ref = [kv for kv in ref if kv[0] != key] + [(key, value)]
            while len(ref) > 5 or sum(v for _, v in ref) > 20:
                ref.pop(0)
        else:
            got = lru.get(key)
            hit = [kv for kv in ref if kv[0] == key]
            assert got == (hit[0][1] if hit else None)
            if hit:
                ref = [kv for kv in ref if kv[0] != key] + hit
        assert [k for k, _ in ref] == list(lru._data)  # the test's own reference check


def test_lru_keeps_none_values_and_computes_once():
    lru: LRU[int | None] = LRU(3, locked=False)
    calls = []
    for _ in range(3):
        assert lru.get_or_compute("k", lambda: calls.append(1)) is None
    assert calls == [1] and lru.stats()["hits"] == 2
    off: LRU[int] = LRU(0)
    off.put("a", 1)
    assert off.get("a") is None and len(off) == 0
    with pytest.raises(ValueError):
        LRU(-1)


def test_id_set_cache_answers_are_read_only_and_bounded_by_ids():
    c = IdSetCache(entries=10, ids=5)
    a = c.get("a", lambda: np.arange(3))
    assert not a.flags.writeable
    c.get("b", lambda: np.arange(3))  # 6 ids held > 5: "a" goes
    assert c.get("a", lambda: np.arange(4)).tolist() == [0, 1, 2, 3]


def test_atomic_write_replaces_whole_or_not_at_all(tmp_path):
    target = tmp_path / "sub" / "f.json"
    atomic_write_text(target, "old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("crash mid-write")
    assert target.read_text() == "old"
    assert [p.name for p in target.parent.iterdir()] == ["f.json"]  # no temporary left behind

    def write(i: int) -> None:
        atomic_write_bytes(target, bytes([i]) * 1000)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    data = target.read_bytes()
    assert len(data) == 1000 and len(set(data)) == 1  # one writer's file, whole
