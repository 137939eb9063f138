"""Products' facts as integer codes, for reading a whole candidate pool's facts in one numpy step.

A search reads the graph facts (category, brand, colour, ...) of every candidate in its pool: a
few hundred for a first page, thousands for a deep one. Looked up and scored one candidate at a
time in Python, a 2,000-candidate pool took 3.6 ms; read as codes and scored once per distinct
value, 1.1 ms. :class:`FactCodes` keeps, per fact field, each distinct value's code (in order of
first sight, never reused) and, per product id, one row of codes (``NONE``: the product has no
value for that field; ``ABSENT``: no such product). Product ids are the record store's row
numbers (dense, from 1), so the rows are an array indexed by id. Its owner (the product graph)
updates it on every write, under its own lock.

Which products hold a code (:meth:`FactCodes.postings`) is read from a per-field index (the ids
ordered by code, with each code's start), built on first use after a write: a scan of the code
column per query (``np.isin`` over every product) was ~1 ms of a fashion text search's CPU."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

FACT_FIELDS = ("category", "brand", "colour", "gender", "season", "usage")
NONE = -1  # the product has no value for the field
ABSENT = -2  # no product has this id
_COLUMN = {f: j for j, f in enumerate(FACT_FIELDS)}


class FactCodes:
    """Per product id (a small non-negative int, as the record store's are) a row of fact codes."""

    def __init__(self) -> None:
        self._codes: dict[str, dict[str, int]] = {}
        self._values: dict[str, list[str]] = {}
        self._rows = np.empty((0, len(FACT_FIELDS)), dtype=np.int32)
        # per field: (product ids ordered by code, ascending within a code; each code's first position)
        self._postings: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.clear()

    def clear(self) -> None:
        self._codes = {f: {} for f in FACT_FIELDS}
        self._values = {f: [] for f in FACT_FIELDS}
        self._rows = np.full((0, len(FACT_FIELDS)), ABSENT, dtype=np.int32)
        self._postings = {}

    def _code(self, field: str, value: str | None) -> int:
        if value is None:
            return NONE
        codes = self._codes[field]
        c = codes.get(value)
        if c is None:
            c = codes[value] = len(codes)
            self._values[field].append(value)
        return c

    def set(self, iid: int, facts: Sequence[str | None]) -> None:
        """Product ``iid``'s facts, one value (or None) per :data:`FACT_FIELDS` field."""
        if iid < 0:
            raise ValueError(f"product ids are non-negative, got {iid}")
        if iid >= len(self._rows):
            grown = np.full((max(1024, 2 * iid + 1), len(FACT_FIELDS)), ABSENT, dtype=np.int32)
            grown[: len(self._rows)] = self._rows
            self._rows = grown
        self._rows[iid] = [self._code(f, v) for f, v in zip(FACT_FIELDS, facts)]
        self._postings = {}

    def drop(self, iid: int) -> None:
        if 0 <= iid < len(self._rows):
            self._rows[iid] = ABSENT
            self._postings = {}

    def postings(self, field: str, codes: Sequence[int]) -> np.ndarray:
        """Ids of the products whose ``field`` is any of ``codes`` (codes >= 0), ascending int64:
        ``np.flatnonzero(np.isin(self.column(field), codes))``, from the field's index."""
        index = self._postings.get(field)
        if index is None:
            col = self.column(field)
            order = np.argsort(col, kind="stable")  # ids ascending within each code
            starts = np.searchsorted(col[order], np.arange(len(self._values[field]) + 1))
            order = order.astype(np.int64)
            order.flags.writeable = False  # handed out as slices: read only
            index = self._postings[field] = (order, starts)
        order, starts = index
        parts = [order[starts[c]:starts[c + 1]] for c in sorted(set(codes)) if 0 <= c < len(starts) - 1]
        if len(parts) == 1:
            return parts[0]
        out = np.sort(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)
        out.flags.writeable = False  # as a single code's slice of the index
        return out

    def of(self, iids: np.ndarray, fields: Sequence[str]) -> np.ndarray:
        """Codes of ``fields`` for each of ``iids``, (len(iids), len(fields)) int32 (``ABSENT`` rows
        for unknown ids)."""
        iids = np.asarray(iids, dtype=np.int64)
        cols = [_COLUMN[f] for f in fields]
        out = np.full((len(iids), len(cols)), ABSENT, dtype=np.int32)
        known = (iids >= 0) & (iids < len(self._rows))
        out[known] = self._rows[iids[known]][:, cols]
        return out

    def values(self, field: str) -> list[str]:
        """Every value ``field`` has had, in code order (the store's own list: read it only)."""
        return self._values[field]

    def column(self, field: str) -> np.ndarray:
        """Every product id's code of ``field`` (read-only view; ``ABSENT`` beyond the last id)."""
        return self._rows[:, _COLUMN[field]]

    def rows(self) -> np.ndarray:
        """The whole (ids, fields) matrix of codes, for saving."""
        return self._rows

    def restore(self, values: dict[str, list[str]], rows: np.ndarray) -> None:
        """Take codes :meth:`values` and :meth:`rows` gave (a saved graph)."""
        if set(values) != set(FACT_FIELDS) or rows.ndim != 2 or rows.shape[1] != len(FACT_FIELDS):
            raise ValueError("fact codes of other fields")
        for f in FACT_FIELDS:
            if len(rows) and int(rows[:, _COLUMN[f]].max(initial=NONE)) >= len(values[f]):
                raise ValueError(f"a {f} code has no value")
        self._values = {f: [str(v) for v in values[f]] for f in FACT_FIELDS}
        self._codes = {f: {v: c for c, v in enumerate(vs)} for f, vs in self._values.items()}
        self._rows = np.ascontiguousarray(rows, dtype=np.int32)
        self._postings = {}

    def value(self, field: str, code: int) -> str | None:
        """The value a code stands for (None for ``NONE`` and ``ABSENT``)."""
        return self._values[field][code] if code >= 0 else None
