"""Which row of a vector index holds each id: a dict, and a dense array for vectorised lookups.

A search looks up a few hundred to a few thousand ids at a time (a pool's candidates, a filter's
allowed ids). Through the dict that is a Python loop, ~0.1 ms per thousand ids; through a dense
array indexed by id it is one numpy gather. Product ids are the record store's iids (small,
dense integers), so the array stays about as long as the catalogue. Ids that would make it
sparse (negative ones, or a largest id more than ``SPARSE_FACTOR`` times the live count and over
``DENSE_MIN``) turn the array off, and lookups go through the dict.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

DENSE_MIN = 1 << 16  # an array this long (512 KiB) is always fine
SPARSE_FACTOR = 8  # beyond DENSE_MIN, at most this many slots per live id


class RowMap:
    """id -> row. Not thread-safe: its owner (:class:`vitrine.index.vectors.VectorIndex`) locks."""

    def __init__(self) -> None:
        self._dict: dict[int, int] = {}
        self._dense: np.ndarray | None = np.full(0, -1, dtype=np.int64)

    @classmethod
    def from_rows(cls, ids: np.ndarray) -> RowMap:
        """The map of ``ids`` listed in row order (a negative id marks a dead row: skipped)."""
        out = cls()
        ids = np.asarray(ids, dtype=np.int64)
        rows = np.flatnonzero(ids >= 0)
        out._dict = dict(zip(ids[rows].tolist(), rows.tolist()))
        if len(rows):
            out._reserve(int(ids[rows].max()))
            if out._dense is not None:
                out._dense[ids[rows]] = rows
        return out

    def __len__(self) -> int:
        return len(self._dict)

    def __contains__(self, id_: int) -> bool:
        return int(id_) in self._dict

    def __iter__(self) -> Iterator[int]:
        return iter(self._dict)

    def __getitem__(self, id_: int) -> int:
        return self._dict[int(id_)]

    def set(self, id_: int, row: int) -> None:
        id_ = int(id_)
        self._dict[id_] = row
        if id_ < 0:
            self._dense = None
        elif self._dense is not None:
            self._reserve(id_)
            if self._dense is not None:
                self._dense[id_] = row

    def pop(self, id_: int) -> int | None:
        """Remove ``id_``; its row, or None when it was not here."""
        id_ = int(id_)
        row = self._dict.pop(id_, None)
        if row is not None and self._dense is not None and 0 <= id_ < len(self._dense):
            self._dense[id_] = -1
        return row

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """The row of each of ``ids`` (int64), -1 for an id not here."""
        ids = np.asarray(ids, dtype=np.int64)
        dense = self._dense
        if dense is None:
            get = self._dict.get
            return np.fromiter((get(i, -1) for i in ids.tolist()), dtype=np.int64, count=len(ids))
        inside = (ids >= 0) & (ids < len(dense))
        return np.where(inside, dense[np.where(inside, ids, 0)] if len(dense) else -1, -1)

    def _reserve(self, id_: int) -> None:
        """Room in the dense array for ``id_``, or no array when that would make it sparse."""
        assert self._dense is not None
        if id_ < len(self._dense):
            return
        if id_ >= DENSE_MIN and id_ >= SPARSE_FACTOR * max(1, len(self._dict)):
            self._dense = None
            return
        grown = np.full(max(1024, int((id_ + 1) * 1.5)), -1, dtype=np.int64)
        grown[:len(self._dense)] = self._dense
        self._dense = grown
