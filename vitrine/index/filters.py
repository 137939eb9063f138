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

import numpy as np

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
        self._cols: dict[str, np.ndarray] = {f: np.full((0, 1), -1, dtype=np.int32) for f in self.fields}
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
            grown = np.full((new, col.shape[1]), -1, dtype=np.int32)
            grown[:cap] = col
            self._cols[f] = grown
        price = np.full(new, np.nan, dtype=np.float64)
        price[:cap] = self._price
        live = np.zeros(new, dtype=bool)
        live[:cap] = self._live
        self._price, self._live = price, live

    def _codes_of(self, f: str, vals: tuple[str, ...]) -> list[int]:
        codes = self._code[f]
        out = []
        for v in vals:
            c = codes.get(v)
            if c is None:
                c = codes[v] = len(self._value[f])
                self._value[f].append(v)
                if c >= len(self._count[f]):
                    grown = np.zeros(max(16, 2 * c), dtype=np.int64)
                    grown[:len(self._count[f])] = self._count[f]
                    self._count[f] = grown
            out.append(c)
        return out

    def upsert(self, iid: int, values: Mapping[str, Iterable[object]], price: float | None = None) -> None:
        with self._lock:
            self.delete(iid)
            self._cache.clear()
            self._edges = None
            self._grow(iid)
            for f in self.fields:
                raw = list(values.get(f, ()))
                # interned: a value is one str however many places hold it
                vals = tuple(dict.fromkeys(sys.intern(norm_value(v)) for v in raw if str(v).strip()))
                for r in raw:
                    self._display[f].setdefault(norm_value(r), str(r).strip())
                codes = self._codes_of(f, vals)
                col = self._cols[f]
                if len(codes) > col.shape[1]:  # a product with more values than any before
                    wide = np.full((len(col), len(codes)), -1, dtype=np.int32)
                    wide[:, :col.shape[1]] = col
                    self._cols[f] = col = wide
                col[iid] = -1
                col[iid, :len(codes)] = codes
                np.add.at(self._count[f], codes, 1)
            self._live[iid] = True
            self._n += 1
            if price is not None:
                self._price[iid] = float(price)
                self._n_priced += 1

    def delete(self, iid: int) -> None:
        with self._lock:
            if iid >= len(self._live) or not self._live[iid]:
                return
            self._cache.clear()
            self._edges = None
            for f, col in self._cols.items():
                codes = col[iid][col[iid] >= 0]
                np.subtract.at(self._count[f], codes, 1)
                col[iid] = -1
            if not np.isnan(self._price[iid]):
                self._n_priced -= 1
            self._price[iid] = np.nan
            self._live[iid] = False
            self._n -= 1

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
        if not codes:
            return np.zeros(len(col), dtype=bool)
        hit: np.ndarray = np.equal(col, codes[0]) if len(codes) == 1 else np.isin(col, codes)
        return hit[:, 0] if hit.shape[1] == 1 else np.any(hit, axis=1)

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
            codes = self._cols[field][self._known(iids)].ravel()
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
