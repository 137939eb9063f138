"""A small file the server re-reads when it changes on disk (the learned table, the scoped keys).

One owner for the "check the file's stamp at most once a second, parse it again when its
modification time or size moved" pattern, so every reader of such a file gets the same
freshness and the same thread safety.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")

Stamp = tuple[float, int]


class WatchedFile(Generic[T]):
    """``path`` parsed by ``load``; ``missing`` while the file does not exist.

    :meth:`get` looks at the file's (mtime, size) at most every ``every`` seconds and parses it
    again when that changed; :meth:`invalidate` makes the next :meth:`get` look (after a write).
    """

    def __init__(self, path: Path, load: Callable[[], T], missing: T, *, every: float = 1.0) -> None:
        self.path = Path(path)
        self._parse = load
        self._missing = missing
        self._every = every
        self._lock = threading.Lock()
        self._value: T = missing
        self._stamp: Stamp | None = None
        self._checked = float("-inf")

    def invalidate(self) -> None:
        with self._lock:
            self._stamp, self._checked = None, float("-inf")

    def get(self) -> T:
        now = time.monotonic()
        if now - self._checked < self._every:
            return self._value
        with self._lock:
            self._checked = now
            try:
                st = self.path.stat()
                stamp: Stamp | None = (st.st_mtime, st.st_size)
            except OSError:
                stamp = None
            if stamp != self._stamp:
                self._stamp = stamp
                self._value = self._parse() if stamp else self._missing
            return self._value
