"""The one least-recently-used map every layer uses (query embeddings, filter and graph id sets,
BM25 query-word tokens). A leaf module: it imports nothing of Vitrine's.

Bounded by entries and, optionally, by a total weight (``weight(value)`` summed over the held
values, e.g. the ids an answer holds); the least recently used entries go first. Thread-safe unless
``locked=False`` (for owners that call it under their own lock). ``size=0`` disables it.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

V = TypeVar("V")


class LRU(Generic[V]):
    """A bounded least-recently-used map with hit/miss counts."""

    def __init__(self, size: int, *, max_weight: int | None = None, weight: Callable[[V], int] | None = None,
                 locked: bool = True) -> None:
        if size < 0:
            raise ValueError("cache size must be >= 0")
        self.size = size
        self.max_weight = max_weight
        self._weight = weight
        self._data: OrderedDict[Hashable, V] = OrderedDict()
        self._held = 0
        self._lock: threading.Lock | contextlib.nullcontext[None] = (
            threading.Lock() if locked else contextlib.nullcontext())
        self.hits = 0
        self.misses = 0

    def _lookup(self, key: Hashable) -> list[V]:
        """``[value]`` held for ``key`` (now the most recently used), or ``[]``; counts the hit or miss."""
        if self.size == 0:
            self.misses += 1
            return []
        with self._lock:
            if key not in self._data:
                self.misses += 1
                return []
            self._data.move_to_end(key)
            self.hits += 1
            return [self._data[key]]

    def get(self, key: Hashable, default: V | None = None) -> V | None:
        """The value held for ``key`` (now the most recently used), or ``default``."""
        found = self._lookup(key)
        return found[0] if found else default

    def put(self, key: Hashable, value: V) -> None:
        if self.size == 0:
            return
        with self._lock:
            if key in self._data:
                old = self._data.pop(key)
                if self._weight is not None:
                    self._held -= self._weight(old)
            self._data[key] = value
            if self._weight is not None:
                self._held += self._weight(value)
            while self._data and (len(self._data) > self.size
                                  or (self.max_weight is not None and self._held > self.max_weight)):
                _, dropped = self._data.popitem(last=False)
                if self._weight is not None:
                    self._held -= self._weight(dropped)

    def get_or_compute(self, key: Hashable, compute: Callable[[], V]) -> V:
        """The value for ``key``, computed (outside the lock) and kept when it is not held."""
        found = self._lookup(key)
        if found:
            return found[0]
        out = compute()
        self.put(key, out)
        return out

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._held = 0

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._data

    def stats(self) -> dict[str, Any]:
        total = self.hits + self.misses
        return {"size": len(self._data), "capacity": self.size, "hits": self.hits, "misses": self.misses,
                "hit_rate": self.hits / total if total else 0.0}
