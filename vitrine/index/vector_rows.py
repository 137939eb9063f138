"""The float32 rows of a vector index: a read-only base and the rows appended since.

A snapshot's rows are a memory map of its file (``numpy.memmap``, read-only): every process on a
host that opens the same snapshot shares one copy of them in the page cache, so a second API
worker costs no second copy of the catalogue's vectors (docs/performance.md). Rows written after
the snapshot (upserts replayed from the record store) go to an in-memory tail, private to the
process, until it opens a newer snapshot that holds them. A fresh index has an empty base and
keeps every row in its tail; compaction (``VectorIndex.rebuild``) copies the live rows into a new
instance's tail.

Row numbers run over base then tail. Not thread-safe: the owning VectorIndex locks.
"""

from __future__ import annotations

import numpy as np


class VectorRows:
    """``n`` rows of ``dim`` float32s: ``base`` (any array, typically a read-only memory map) then
    an in-memory tail grown as rows are appended."""

    def __init__(self, dim: int, base: np.ndarray | None = None) -> None:
        self.dim = dim
        self._base = base if base is not None else np.zeros((0, dim), dtype=np.float32)
        self._nb = len(self._base)
        self._tail = np.zeros((0, dim), dtype=np.float32)
        self._nt = 0

    def __len__(self) -> int:
        return self._nb + self._nt

    @property
    def mapped(self) -> int:
        """Rows read from a memory-mapped file (shared with other processes mapping it)."""
        return self._nb if isinstance(self._base, np.memmap) else 0

    def append(self, vectors: np.ndarray) -> int:
        """Append ``vectors`` (n, dim) float32; returns the first new row's number."""
        start, need = len(self), len(vectors)
        if self._nt + need > len(self._tail):
            grown = np.zeros((max(1024, int((self._nt + need) * 1.5)), self.dim), dtype=np.float32)
            grown[: self._nt] = self._tail[: self._nt]
            self._tail = grown
        self._tail[self._nt: self._nt + need] = vectors
        self._nt += need
        return start

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The vectors of ``rows`` (any shape of row numbers; the result adds a last axis of dim)."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            return np.zeros((*rows.shape, self.dim), dtype=np.float32)
        lo, hi = int(rows.min()), int(rows.max())
        if hi < self._nb:
            return np.asarray(self._base[rows])
        if lo >= self._nb:
            return self._tail[rows - self._nb]
        flat = rows.reshape(-1)
        out = np.empty((len(flat), self.dim), dtype=np.float32)
        in_base = flat < self._nb
        out[in_base] = self._base[flat[in_base]]
        out[~in_base] = self._tail[flat[~in_base] - self._nb]
        return out.reshape(*rows.shape, self.dim)

    def slice(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop``: a view when they lie in one part, else a copy."""
        nb = self._nb
        if stop <= nb:
            return self._base[start:stop]
        if start >= nb:
            return self._tail[start - nb: stop - nb]
        return np.concatenate([self._base[start:nb], self._tail[: stop - nb]])

    def part(self, rows: np.ndarray) -> np.ndarray:
        """:meth:`take` for a sorted 1-d array of rows, as a view when they are one contiguous run."""
        if len(rows) and int(rows[-1]) - int(rows[0]) + 1 == len(rows):
            return self.slice(int(rows[0]), int(rows[-1]) + 1)
        return self.take(rows)
