"""What every session store shares (memory, SQLite and PostgreSQL: vitrine/conversation/store.py):
a session as stored and the store's interface.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


PURGE_EVERY = 500  # writes between two purges of expired and surplus sessions


@dataclass
class StoredSession:
    """A session as stored: its JSON state, its photo vector bytes (float32), when it was written and
    its version (the number of writes: a write that names the version it read fails if another turn of
    the session wrote in between, so concurrent turns never lose an update)."""

    state: dict[str, Any]
    vector: bytes | None
    touched: float
    expired: bool = False
    version: int = 0


@runtime_checkable
class SessionStoreAPI(Protocol):
    def get(self, sid: str) -> StoredSession | None: ...

    def put(self, sid: str, state: dict[str, Any], vector: bytes | None, expected: int | None = None) -> bool:
        """Write the session; with ``expected`` only if its stored version is still that (0: none
        stored), else nothing is written and False comes back (compare-and-swap)."""
        ...

    def delete(self, sid: str) -> None: ...

    def count(self) -> int: ...

    def purge(self) -> int: ...

    def close(self) -> None: ...
