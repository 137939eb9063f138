"""In-memory inverted index over filterable fields (keywords and a numeric price).

Values are matched case-insensitively. A product may hold several values of a field (each
level of its category path, say). A filter on a field matches any of its listed values;
filters on different fields must all match.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from vitrine.errors import StorageError
from vitrine.index import vector_files
from vitrine.index.cache import IdSetCache


def norm_value(v: object) -> str:
    return " ".join(str(v).split()).casefold()


class FilterIndex:
    """Per field, each product's values as small integer codes in a numpy column (a row per
    product id, as wide as the most values one product holds; -1 pads), prices in a float column
    (NaN: none) and a live mask. A filter is a vectorised scan of the columns it names (cached until
    the next change), a facet a count per code kept as products come and go. No Python object per
    product: about 30 bytes per product and field at 1M products instead of ~1 KB of sets, dicts and
    tuples, and a worker forked after the index was built reads it without copying its pages
    (vitrine/web/workers.py; reading a Python object writes its reference count)."""

    def __init__(self, fields: Iterable[str]) -> None:
        self.fields = tuple(fields)
        self._code: dict[str, dict[str, int]] = {f: {} for f in self.fields}  # value (normalised) -> code
        self._value: dict[str, list[str]] = {f: [] for f in self.fields}  # code -> value
        self._display: dict[str, dict[str, str]] = {f: {} for f in self.fields}
        # per field: [value slot, product id] -> code (-1: none); each slot a contiguous row, so a
        # filter scans one vector per slot
        self._cols: dict[str, np.ndarray] = {f: np.full((1, 0), -1, dtype=np.int32) for f in self.fields}
        self._raw: dict[str, dict[object, int]] = {f: {} for f in self.fields}  # value as given -> code
        self._count: dict[str, np.ndarray] = {f: np.zeros(0, dtype=np.int64) for f in self.fields}  # per code
        self._price = np.zeros(0, dtype=np.float64)
        self._live = np.zeros(0, dtype=bool)
        self._n = 0
        self._n_priced = 0
        self._lock = threading.RLock()
        # Answers of recent filters, dropped on any change: shoppers repeat the same few filters
        # (a gender, a category), and each is a scan of the catalogue's columns.
        self._cache = IdSetCache(entries=4096, ids=2_000_000)  # at most 16 MB of ids
        self._edges: list[float] | None = None  # price_edges, until a product changes

    def __len__(self) -> int:
        return self._n

    def _grow(self, iid: int) -> None:
        cap = len(self._live)
        if iid < cap:
            return
        new = max(iid + 1, int(cap * 1.5) + 1024)
        for f, col in self._cols.items():
            grown = np.full((col.shape[0], new), -1, dtype=np.int32)
            grown[:, :cap] = col
            self._cols[f] = grown
        price = np.full(new, np.nan, dtype=np.float64)
        price[:cap] = self._price
        live = np.zeros(new, dtype=bool)
        live[:cap] = self._live
        self._price, self._live = price, live

    def _code_for(self, f: str, v: str) -> int:
        """The code of normalised value ``v`` of ``f``, given one if it has none yet."""
        c = self._code[f].get(v)
        if c is None:
            c = self._code[f][v] = len(self._value[f])
            self._value[f].append(v)
            if c >= len(self._count[f]):
                grown = np.zeros(max(16, 2 * c), dtype=np.int64)
                grown[:len(self._count[f])] = self._count[f]
                self._count[f] = grown
        return c

    def upsert(self, iid: int, values: Mapping[str, Iterable[object]], price: float | None = None) -> None:
        self.upsert_many([(iid, values, price)])

    def _normalised(self, f: str, values: Mapping[str, Iterable[object]]) -> list[int]:
        """The codes of a product's values of ``f`` (each once, in order; blank values dropped)."""
        known = self._raw[f]
        out: list[int] = []
        for r in values.get(f, ()):
            c = known.get(r) if isinstance(r, str) else None
            if c is None:
                if not str(r).strip():
                    continue
                v = sys.intern(norm_value(r))  # interned: a value is one str however many places hold it
                self._display[f].setdefault(v, str(r).strip())
                c = self._code_for(f, v)
                if isinstance(r, str) and len(known) < 1_000_000:
                    known[r] = c
            if c not in out:
                out.append(c)
        return out

    def upsert_many(self, items: Iterable[tuple[int, Mapping[str, Iterable[object]], float | None]]) -> None:
        """Upsert (product id, field values, price) items together: one vectorised write of the
        columns per call (opening a data dir writes every product at once; a write a batch)."""
        with self._lock:
            rows = {iid: (values, price) for iid, values, price in items}  # the last of an id wins
            if not rows:
                return
            iids = np.fromiter(rows, dtype=np.int64, count=len(rows))
            self._cache.clear()
            self._edges = None
            self._drop(iids)
            self._grow(int(iids.max()))
            for f in self.fields:
                codes = [self._normalised(f, values) for values, _ in rows.values()]
                width = max(map(len, codes), default=0)
                col = self._cols[f]
                if width > col.shape[0]:  # a product with more values than any before
                    wide = np.full((width, col.shape[1]), -1, dtype=np.int32)
                    wide[:col.shape[0]] = col
                    self._cols[f] = col = wide
                block = np.full((col.shape[0], len(codes)), -1, dtype=np.int32)
                for j, cs in enumerate(codes):
                    block[:len(cs), j] = cs
                col[:, iids] = block
                used = block[block >= 0]
                if len(used):
                    self._count[f][: len(self._value[f])] += np.bincount(used, minlength=len(self._value[f]))
            self._live[iids] = True
            self._n += len(iids)
            prices = np.array([np.nan if p is None else float(p) for _, p in rows.values()], dtype=np.float64)
            self._price[iids] = prices
            self._n_priced += int(np.count_nonzero(~np.isnan(prices)))

    def delete(self, iid: int) -> None:
        with self._lock:
            self._drop(np.array([iid], dtype=np.int64))

    def live_ids(self) -> np.ndarray:
        """The ids of every product the index holds, ascending."""
        with self._lock:
            return np.flatnonzero(self._live)

    # -- persistence (a snapshot's ``filters.varr``) ---------------------------------------------------
    def save(self, path: str | Path) -> str:
        """Write the columns, counts, prices and value names to one array file (atomically);
        returns its SHA-256."""
        with self._lock:
            meta = {"fields": list(self.fields), "values": self._value, "display": self._display,
                    "n": self._n, "n_priced": self._n_priced}
            arrays = {"price": self._price, "live": self._live}
            for i, f in enumerate(self.fields):
                arrays[f"col{i}"] = self._cols[f]
                arrays[f"count{i}"] = self._count[f]
            return vector_files.write_arrays(path, meta, arrays)

    @classmethod
    def load(cls, path: str | Path, expected_sha256: str | None, fields: Iterable[str]) -> "FilterIndex":
        """An index :meth:`save` wrote; StorageError when it is damaged or holds other ``fields``."""
        meta, arrays = vector_files.read_arrays(path, expected_sha256, what="filter index")
        out = cls(fields)
        if meta.get("fields") != list(out.fields):
            raise StorageError(f"filter index {path} holds fields {meta.get('fields')}, expected {list(out.fields)}")
        try:
            for i, f in enumerate(out.fields):
                out._value[f] = [sys.intern(v) for v in meta["values"][f]]
                out._code[f] = {v: c for c, v in enumerate(out._value[f])}
                out._display[f] = dict(meta["display"][f])
                out._cols[f] = arrays[f"col{i}"].astype(np.int32, copy=False)
                out._count[f] = arrays[f"count{i}"].astype(np.int64, copy=False)
            out._price = arrays["price"].astype(np.float64, copy=False)
            out._live = arrays["live"].astype(bool, copy=False)
            out._n, out._n_priced = int(meta["n"]), int(meta["n_priced"])
        except (KeyError, TypeError, ValueError) as e:
            raise StorageError(f"filter index {path} is unreadable: {e}") from e
        lengths = {len(out._price), len(out._live), *(c.shape[1] for c in out._cols.values())}
        if len(lengths) != 1 or int(out._live.sum()) != out._n:
            raise StorageError(f"filter index {path} is inconsistent")
        return out

    def _drop(self, iids: np.ndarray) -> None:
        """Remove the live ones of ``iids`` (lock held)."""
        iids = iids[(iids >= 0) & (iids < len(self._live))]
        iids = iids[self._live[iids]]
        if not len(iids):
            return
        self._cache.clear()
        self._edges = None
        for f, col in self._cols.items():
            rows = col[:, iids]
            used = rows[rows >= 0]
            if len(used):
                self._count[f][: len(self._value[f])] -= np.bincount(used, minlength=len(self._value[f]))
            col[:, iids] = -1
        self._n_priced -= int(np.count_nonzero(~np.isnan(self._price[iids])))
        self._price[iids] = np.nan
        self._live[iids] = False
        self._n -= len(iids)

    def allowed(
        self, terms: Mapping[str, Iterable[object]], price_min: float | None = None, price_max: float | None = None,
        exclude: Mapping[str, Iterable[object]] | None = None,
    ) -> np.ndarray | None:
        """Ids matching every field's terms and the price range, less those holding any value of
        ``exclude`` (sorted, read-only); ``None`` when nothing filters."""
        with self._lock:
            norm: list[tuple[str, tuple[str, ...]]] = []
            for f, vals in terms.items():
                if f not in self._cols:
                    raise KeyError(f)
                norm.append((f, tuple(sorted({norm_value(v) for v in vals}))))
            excl = self._norm_exclude(exclude)
            key = (tuple(sorted(norm)), price_min, price_max, excl)
            return self._cache.get(key, lambda: self._allowed(norm, price_min, price_max, excl))

    def _norm_exclude(self, exclude: Mapping[str, Iterable[object]] | None) -> tuple[tuple[str, tuple[str, ...]], ...]:
        out = []
        for f, vals in (exclude or {}).items():
            if f not in self._cols:
                raise KeyError(f)
            vs = tuple(sorted({norm_value(v) for v in vals}))
            if vs:
                out.append((f, vs))
        return tuple(sorted(out))

    def _holding(self, f: str, vals: tuple[str, ...]) -> np.ndarray:
        """Mask of the products holding any of ``vals`` in field ``f``."""
        codes = [c for v in vals if (c := self._code[f].get(v)) is not None]
        col = self._cols[f]
        hit = np.zeros(col.shape[1], dtype=bool)
        for slot in col if codes else ():
            if len(codes) <= 8:  # a few values: comparisons beat isin's sort
                for c in codes:
                    hit |= slot == c
            else:
                hit |= np.isin(slot, codes)
        return hit

    def _allowed(self, terms: list[tuple[str, tuple[str, ...]]], price_min: float | None,
                 price_max: float | None, excl: tuple[tuple[str, tuple[str, ...]], ...]) -> np.ndarray | None:
        mask: np.ndarray | None = None
        for f, vals in terms:
            if vals:
                m = self._holding(f, vals)
                mask = m if mask is None else (mask & m)
        if price_min is not None or price_max is not None:
            p = self._price
            m = (p >= (-np.inf if price_min is None else price_min)) & (p <= (np.inf if price_max is None else price_max))
            mask = m if mask is None else (mask & m)
        if mask is None and not excl:
            return None
        mask = self._live.copy() if mask is None else (mask & self._live)
        for f, vals in excl:
            mask &= ~self._holding(f, vals)
        return np.flatnonzero(mask).astype(np.int64)

    def facet(self, field: str) -> Counter[str]:
        """Display value -> number of products, for one field."""
        with self._lock:
            counts, names, disp = self._count[field], self._value[field], self._display[field]
            return Counter({disp.get(names[c], names[c]): int(counts[c]) for c in np.flatnonzero(counts > 0)})

    def has_prices(self) -> bool:
        return self._n_priced > 0

    def _known(self, iids: Iterable[int]) -> np.ndarray:
        ids = np.asarray(iids if isinstance(iids, np.ndarray) else list(iids), dtype=np.int64)
        return ids[(ids >= 0) & (ids < len(self._live))]

    def prices(self, iids: Iterable[int]) -> np.ndarray:
        """The price of each product (NaN where it has none)."""
        with self._lock:
            ids = np.asarray(iids if isinstance(iids, np.ndarray) else list(iids), dtype=np.int64)
            out = np.full(len(ids), np.nan, dtype=np.float64)
            ok = (ids >= 0) & (ids < len(self._price))
            out[ok] = self._price[ids[ok]]
            return out

    def counts(self, iids: Iterable[int], field: str) -> Counter[str]:
        """Display value -> how many of ``iids`` hold it, for one field."""
        with self._lock:
            codes = self._cols[field][:, self._known(iids)].ravel()
            codes = codes[codes >= 0]
            names, disp = self._value[field], self._display[field]
            n = np.bincount(codes, minlength=0) if len(codes) else np.zeros(0, dtype=np.int64)
            return Counter({disp.get(names[c], names[c]): int(n[c]) for c in np.flatnonzero(n)})

    def price_edges(self, buckets: int = 5) -> list[float]:
        """Price bucket boundaries that fit this catalogue: its price quantiles, rounded to two
        significant digits (so "1,000-1,500" rather than "987.3-1,512.9"), distinct, ascending."""
        with self._lock:
            if self._edges is not None and buckets == 5:
                return self._edges
            p = self._price[self._live]
            p = p[~np.isnan(p)]
            edges: list[float] = []
            if len(p):
                for q in np.quantile(p, [j / buckets for j in range(1, buckets)]).tolist():
                    e = _round2(q)
                    if e > 0 and (not edges or e > edges[-1]):
                        edges.append(e)
            if buckets == 5:
                self._edges = edges
            return edges


def _round2(x: float) -> float:
    """``x`` to two significant digits."""
    if x <= 0:
        return 0.0
    mag = 10 ** (int(np.floor(np.log10(x))) - 1)
    return float(round(x / mag) * mag)
