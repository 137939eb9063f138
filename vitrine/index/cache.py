"""A small cache of id sets (sorted, read-only numpy arrays) for indexes that drop it on change."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable

import numpy as np


class IdSetCache:
    """Answers by key, least recently used dropped first, bounded by the number of answers and by
    the ids they hold together. Not locked: its owner calls it under its own lock and calls
    :meth:`clear` on every change of what the answers are computed from."""

    def __init__(self, entries: int = 4096, ids: int = 2_000_000) -> None:
        self.entries, self.ids = entries, ids
        self._answers: OrderedDict[Hashable, np.ndarray | None] = OrderedDict()
        self._held = 0

    def clear(self) -> None:
        self._answers.clear()
        self._held = 0

    def get(self, key: Hashable, compute: Callable[[], np.ndarray | None]) -> np.ndarray | None:
        """The answer for ``key``, computed once (``compute``) until the next :meth:`clear`; the
        array is made read-only, as every caller with this key shares it."""
        if key in self._answers:
            self._answers.move_to_end(key)
            return self._answers[key]
        out = compute()
        if out is not None:
            out.flags.writeable = False
            self._held += len(out)
        self._answers[key] = out
        while len(self._answers) > self.entries or self._held > self.ids:
            _, old = self._answers.popitem(last=False)
            self._held -= 0 if old is None else len(old)
        return out
