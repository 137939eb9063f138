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
    def __init__(self, fields: Iterable[str]) -> None:
        self.fields = tuple(fields)
        self._postings: dict[str, dict[str, set[int]]] = {f: {} for f in self.fields}
        self._display: dict[str, dict[str, str]] = {f: {} for f in self.fields}
        self._values: dict[int, dict[str, tuple[str, ...]]] = {}
        self._price: dict[int, float] = {}
        self._lock = threading.RLock()
        # Answers of recent filters, dropped on any change: shoppers repeat the same few filters
        # (a gender, a category), and one over thousands of products costs a set union and a
        # sort per search.
        self._cache = IdSetCache(entries=4096, ids=2_000_000)  # at most 16 MB of ids
        self._edges: list[float] | None = None  # price_edges, until a product changes

    def __len__(self) -> int:
        return len(self._values)

    def upsert(self, iid: int, values: Mapping[str, Iterable[object]], price: float | None = None) -> None:
        with self._lock:
            self.delete(iid)
            self._cache.clear()
            self._edges = None
            stored: dict[str, tuple[str, ...]] = {}
            for f in self.fields:
                # interned: a value is one str however many products hold it
                vals = tuple(dict.fromkeys(sys.intern(norm_value(v)) for v in values.get(f, ()) if str(v).strip()))
                for raw in values.get(f, ()):
                    self._display[f].setdefault(norm_value(raw), str(raw).strip())
                for v in vals:
                    self._postings[f].setdefault(v, set()).add(iid)
                stored[f] = vals
            self._values[iid] = stored
            if price is not None:
                self._price[iid] = float(price)

    def delete(self, iid: int) -> None:
        with self._lock:
            old = self._values.pop(iid, None)
            self._price.pop(iid, None)
            if not old:
                return
            self._cache.clear()
            self._edges = None
            for f, vals in old.items():
                for v in vals:
                    s = self._postings[f].get(v)
                    if s is not None:
                        s.discard(iid)
                        if not s:
                            del self._postings[f][v]

    def allowed(
        self, terms: Mapping[str, Iterable[object]], price_min: float | None = None, price_max: float | None = None,
        exclude: Mapping[str, Iterable[object]] | None = None,
    ) -> np.ndarray | None:
        """Ids matching every field's terms and the price range, less those holding any value of
        ``exclude`` (sorted, read-only); ``None`` when nothing filters."""
        with self._lock:
            norm: list[tuple[str, tuple[str, ...]]] = []
            for f, vals in terms.items():
                if f not in self._postings:
                    raise KeyError(f)
                norm.append((f, tuple(sorted({norm_value(v) for v in vals}))))
            excl = self._norm_exclude(exclude)
            key = (tuple(sorted(norm)), price_min, price_max, excl)
            if not excl:
                return self._cache.get(key, lambda: self._allowed(norm, price_min, price_max))
            return self._cache.get(key, lambda: self._without(self._allowed(norm, price_min, price_max), excl))

    def _norm_exclude(self, exclude: Mapping[str, Iterable[object]] | None) -> tuple[tuple[str, tuple[str, ...]], ...]:
        out = []
        for f, vals in (exclude or {}).items():
            if f not in self._postings:
                raise KeyError(f)
            vs = tuple(sorted({norm_value(v) for v in vals}))
            if vs:
                out.append((f, vs))
        return tuple(sorted(out))

    def _without(self, ids: np.ndarray | None, excl: tuple[tuple[str, tuple[str, ...]], ...]) -> np.ndarray:
        """``ids`` (None: every product) less the products holding an excluded value."""
        gone: set[int] = set()
        for f, vals in excl:
            for v in vals:
                gone |= self._postings[f].get(v, set())
        base = ids.tolist() if ids is not None else self._values.keys()
        keep = sorted(i for i in base if i not in gone)
        return np.fromiter(keep, dtype=np.int64, count=len(keep))

    def _allowed(self, terms: list[tuple[str, tuple[str, ...]]], price_min: float | None,
                 price_max: float | None) -> np.ndarray | None:
        result: set[int] | None = None
        for f, vals in terms:
            if not vals:
                continue
            match: set[int] = set()
            for v in vals:
                match |= self._postings[f].get(v, set())
            result = match if result is None else (result & match)
            if not result:
                return np.zeros(0, dtype=np.int64)
        if price_min is not None or price_max is not None:
            lo = -np.inf if price_min is None else price_min
            hi = np.inf if price_max is None else price_max
            priced = {i for i, p in self._price.items() if lo <= p <= hi}
            result = priced if result is None else (result & priced)
        if result is None:
            return None
        return np.fromiter(sorted(result), dtype=np.int64, count=len(result))

    def facet(self, field: str) -> Counter[str]:
        """Display value -> number of products, for one field."""
        with self._lock:
            return Counter({self._display[field].get(v, v): len(s) for v, s in self._postings[field].items()})

    def has_prices(self) -> bool:
        return bool(self._price)

    def prices(self, iids: Iterable[int]) -> np.ndarray:
        """The price of each product (NaN where it has none)."""
        with self._lock:
            return np.array([self._price.get(int(i), np.nan) for i in iids], dtype=np.float64)

    def counts(self, iids: Iterable[int], field: str) -> Counter[str]:
        """Display value -> how many of ``iids`` hold it, for one field."""
        with self._lock:
            c: Counter[str] = Counter()
            disp = self._display[field]
            for i in iids:
                vals = self._values.get(int(i))
                if vals:
                    c.update(vals.get(field, ()))
            return Counter({disp.get(v, v): n for v, n in c.items()})

    def price_edges(self, buckets: int = 5) -> list[float]:
        """Price bucket boundaries that fit this catalogue: its price quantiles, rounded to two
        significant digits (so "1,000-1,500" rather than "987.3-1,512.9"), distinct, ascending."""
        with self._lock:
            if self._edges is not None and buckets == 5:
                return self._edges
            p = np.fromiter(self._price.values(), dtype=np.float64, count=len(self._price))
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
