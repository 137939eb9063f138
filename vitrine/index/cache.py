"""A small cache of id sets (sorted, read-only numpy arrays) for indexes that drop it on change."""

from __future__ import annotations

from collections.abc import Callable, Hashable

import numpy as np

from vitrine.lru import LRU


def _n_ids(answer: np.ndarray | None) -> int:
    return 0 if answer is None else len(answer)


class IdSetCache:
    """Answers by key, least recently used dropped first, bounded by the number of answers and by
    the ids they hold together. Not locked: its owner calls it under its own lock and calls
    :meth:`clear` on every change of what the answers are computed from."""

    def __init__(self, entries: int = 4096, ids: int = 2_000_000) -> None:
        self.entries, self.ids = entries, ids
        self._answers: LRU[np.ndarray | None] = LRU(entries, max_weight=ids, weight=_n_ids, locked=False)

    def clear(self) -> None:
        self._answers.clear()

    def get(self, key: Hashable, compute: Callable[[], np.ndarray | None]) -> np.ndarray | None:
        """The answer for ``key``, computed once (``compute``) until the next :meth:`clear`; the
        array is made read-only, as every caller with this key shares it."""
        def frozen() -> np.ndarray | None:
            out = compute()
            if out is not None:
                out.flags.writeable = False
            return out

        return self._answers.get_or_compute(key, frozen)
