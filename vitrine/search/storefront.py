"""What a storefront needs of a ranking: pages, sort orders, facet counts and highlights.

The read path ranks a fixed pool of candidates for a query by relevance: the same pool for every
page of the same query and page size (``pool_depth``), so pages never overlap or skip while the
catalogue is unchanged; ``max_k`` bounds how deep a page may start. Over that ranking:

- the **relevance floor** keeps the candidates scoring at least ``relevance_floor`` times the top
  score (the top score of this query: the floor fits each query's scale). They are the *matching*
  products: their number is ``total`` (exact when every product within the filters was ranked,
  else an estimate), their values are counted for facets, and the price and newest orders sort
  them, so a price sort never surfaces junk from the pool's tail. The fraction is tuned on the val
  split's queries (vitrine_bench/floor.py; bench-results/relevance_floor.md). The relevance order
  itself is not cut (a page of it is the ranking as it always was);
- **sorts** keep relevance as the tie-break, so every order is total and stable;
- **facets** count each value among the matching products; price counts fall into ranges fitted
  to the catalogue's price quantiles;
- **highlights** are the spans of the query's words in a hit's title and description: a word of
  the field matches when its term (FTS5's stem) equals a query word's, or is within the edits
  the query word's length allows (typos forgiven as BM25 forgives them).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from vitrine.errors import InvalidInput
from vitrine.index import fuzzy
from vitrine.index.bm25 import word_terms
from vitrine.index.symbolic import query_words
from vitrine.lang import segment
from vitrine.search import brand_index
from vitrine.search.models import FacetValue, Ranked, SearchRequest, Span

if TYPE_CHECKING:  # pragma: no cover
    from vitrine.search.read_context import ReadContext
    from vitrine.settings import SearchSettings

_FIELD_WORD = re.compile(r"\w+", re.UNICODE)
_ZH_FUNCTION = frozenset("的了和与及或要不是在有我你他她它们吗呢吧啊个件款")  # one-character words never marked
FACET_LIMIT = 50


@dataclass
class Arranged:
    """One page of a ranking and what the response says about the rest."""

    page: Ranked
    total: int
    total_exact: bool
    pool: int
    facets: dict[str, list[FacetValue]] | None = None

    def response_fields(self, req: SearchRequest) -> dict[str, Any]:
        return {"offset": req.offset, "total": self.total, "total_exact": self.total_exact, "pool": self.pool,
                "sort": req.sort, "facets": self.facets}


def pool_depth(s: "SearchSettings", req: SearchRequest) -> int:
    """How many candidates to rank (``s``: the search settings): the same for every page of a
    query at one page size."""
    if req.offset + req.k > s.max_k:
        raise InvalidInput(f"offset + k must be at most {s.max_k} (max_k): offset {req.offset}, k {req.k}")
    return max(s.fusion_candidates, s.max_k, req.k * s.candidate_multiplier)


def above_floor(ranked: Ranked, fraction: float) -> int:
    """How many of the ranking's head score at least ``fraction`` of the top score (the head up to
    the first one below: hits backfilled after a slot-filtered ranking follow it, whatever their score)."""
    if not ranked:
        return 0
    scores = np.fromiter((s for _, s, _ in ranked), dtype=np.float64, count=len(ranked))
    top = scores[0]
    if top <= 0 or fraction <= 0:
        return len(ranked)
    below = np.flatnonzero(scores < fraction * top)
    return int(below[0]) if len(below) else len(ranked)


def floor_count(ranked: Ranked, fraction: float, top: float, stop: "set[int] | frozenset[int]" = frozenset()) -> int:
    """How many of the ranking's head score at least ``fraction`` of ``top``: the score of the same
    query's best product with no filter at all, so that the floor does not move with a filter (a
    facet value's count is then the total of the query filtered by that value). The head ends at
    the first product below the floor or in ``stop`` (hits backfilled after a slot-filtered ranking)."""
    if not ranked:
        return 0
    if top <= 0 or fraction <= 0:
        top = 0.0
    threshold = fraction * top if top > 0 else -np.inf
    for j, (iid, score, _) in enumerate(ranked):
        if score < threshold or iid in stop:
            return j
    return len(ranked)


def arrange(reader: "ReadContext", req: SearchRequest, ranked: Ranked, *, exhaustive: bool,
            matching: int | None = None) -> Arranged:
    """The page ``req`` asks for from the relevance ranking ``ranked`` (the whole pool), sorted as
    asked, with facet counts over the matching products. ``exhaustive``: the pool held every
    product within the filters (so the total is exact). ``matching``: how many of the ranking's
    head match, when a step after ranking decided it (merchandising rules); else the floor says."""
    n_match = above_floor(ranked, reader.relevance_floor) if matching is None else matching
    head = ranked[:n_match]
    if req.sort == "relevance":
        ordered = ranked
    else:
        ordered = sort(reader, head, req.sort)
    page = ordered[req.offset: req.offset + req.k]
    out = Arranged(page=page, total=n_match, total_exact=exhaustive, pool=len(ranked))
    if req.facets:
        out.facets = facet_counts(reader, [iid for iid, _, _ in head], req.facets)
    return out


def sort(reader: "ReadContext", ranked: Ranked, order: str) -> Ranked:
    """``ranked`` (best first) in ``order``; products without the sort key go last; ties keep the
    relevance order."""
    if not ranked:
        return ranked
    iids = [iid for iid, _, _ in ranked]
    if order in ("price_asc", "price_desc"):
        key = reader.state.filters.prices(iids)
        if order == "price_desc":
            key = -key
    elif order == "newest":
        rows = reader.state.records.get_by_iids(iids)
        key = np.array([-(rows[i].seq or 0) if i in rows else np.nan for i in iids], dtype=np.float64)
    else:
        raise InvalidInput(f"unknown sort {order!r}")
    missing = np.isnan(key)
    rank = np.arange(len(iids))
    order_ix = np.lexsort((rank, np.where(missing, 0.0, key), missing))
    return [ranked[j] for j in order_ix.tolist()]


def facet_counts(reader: "ReadContext", iids: Sequence[int], fields: Sequence[str]) -> dict[str, list[FacetValue]]:
    out: dict[str, list[FacetValue]] = {}
    for f in dict.fromkeys(fields):
        if f == "price":
            out[f] = price_ranges(reader.state.filters.prices(iids), reader.state.filters.price_edges())
            continue
        counts = brand_index.brand_counts(reader.state.graph, reader.state.filters, iids) if f == "brand" else reader.state.filters.counts(iids, f)
        top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0].casefold()))[:FACET_LIMIT]
        out[f] = [FacetValue(value=v, count=n) for v, n in top]
    return out


def price_ranges(prices: np.ndarray, edges: Sequence[float]) -> list[FacetValue]:
    """Counts per price range [lo, hi) (the last open); empty ranges included, so chips stay put."""
    prices = prices[~np.isnan(prices)]
    bounds = [0.0, *edges]
    out = []
    for j, lo in enumerate(bounds):
        hi = bounds[j + 1] if j + 1 < len(bounds) else None
        n = int(np.count_nonzero((prices >= lo) & (prices < hi))) if hi is not None else \
            int(np.count_nonzero(prices >= lo))
        label = f"{_fmt(lo)}-{_fmt(hi)}" if hi is not None else f"{_fmt(lo)}+"
        out.append(FacetValue(value=label, count=n, min=lo, max=hi))
    return out


def _fmt(x: float) -> str:
    return f"{x:g}" if x < 1e6 else f"{x:.0f}"


# -- highlighting -------------------------------------------------------------------------------------
class Highlighter:
    """Spans of a query's words in texts (built once per query)."""

    def __init__(self, text: str | None) -> None:
        self.words: list[tuple[str, str, int]] = []  # (casefolded word, its term, edits allowed)
        for w in query_words(text or ""):
            terms = word_terms(w)
            if len(terms) == 1:
                self.words.append((w, terms[0], fuzzy.max_edits(w)))
        # a field word's answer, remembered for this query: the hits' titles share most words
        self._seen: dict[str, bool] = {}
        # Chinese words of the query (jieba, search mode: "男士手表" -> 男士, 手表, 男士手表), found
        # anywhere in a text: Chinese titles run words together, so a span is an occurrence
        self.chinese: list[str] = []
        if text and segment.has_cjk(text):
            found = {w for w in segment.words(text, search_mode=True) if segment.has_cjk(w)}
            self.chinese = sorted((w for w in found if len(w) > 1 or w not in _ZH_FUNCTION), key=len, reverse=True)

    def __bool__(self) -> bool:
        return bool(self.words or self.chinese)

    def _chinese_spans(self, text: str) -> list[tuple[int, int]]:
        out = []
        for w in self.chinese:
            i = text.find(w)
            while i >= 0:
                out.append((i, i + len(w)))
                i = text.find(w, i + len(w))
        return out

    def _matches(self, word: str) -> bool:
        hit = self._seen.get(word)
        if hit is None:
            hit = self._seen[word] = self._match(word)
        return hit

    def _match(self, word: str) -> bool:
        low = word.casefold()
        terms = word_terms(low)
        term = terms[0] if len(terms) == 1 else low
        for w, t, edits in self.words:
            if term == t or low == w:
                return True
            # more edits apart in length than allowed: no alignment can be that close (skips the call)
            if edits and ((abs(len(low) - len(w)) <= edits and fuzzy.is_close(low, w, edits))
                          or (abs(len(term) - len(t)) <= edits and fuzzy.is_close(term, t, edits))):
                return True
        return False

    def spans(self, text: str | None) -> list[Span]:
        if not text or not self:
            return []
        got = [(m.start(), m.end()) for m in _FIELD_WORD.finditer(text)
               if not segment.has_cjk(m.group()) and self.words and self._matches(m.group())]
        if self.chinese and segment.has_cjk(text):
            got += self._chinese_spans(text)
        merged: list[list[int]] = []  # overlapping or touching spans as one
        for a, b in sorted(got):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        return [Span(start=a, end=b) for a, b in merged]

    def of(self, title: str | None, description: str | None) -> dict[str, list[Span]]:
        out = {"title": self.spans(title)}
        if description:
            out["description"] = self.spans(description)
        return out
