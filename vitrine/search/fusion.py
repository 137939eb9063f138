"""Hybrid ranking: vector similarity, BM25 and knowledge-graph signals fused into one score.

Three retrievers fill one candidate pool for a text query:

- vectors: the engine's vector ranking (text -> fused product vectors; with a photo, the
  photo/text blend), top ``fusion_candidates``;
- BM25: SQLite FTS5 over titles, brands, categories and attributes (exact words, brands and
  model names are never lost to the embedding);
- the graph: the query's words matched against the graph's vocabulary (category, brand,
  colour, gender, usage, season); products holding all the named values, best by vector.

Every candidate then gets every signal: ``vector`` (cosine), ``bm25`` (score / best score in
the pool), and graph signals ``graph:category`` (its category is, or is under, the one named),
``graph:proximity`` (taxonomy proximity when it is not), ``graph:brand``, ``graph:colour``,
``graph:gender``, ``graph:usage``, ``graph:season`` (1 for a match; 0.5 for a unisex product to a
men/women query or a same-family colour). Fusion is either a weighted sum of the signals or
reciprocal-rank fusion (each signal ranks the pool; a product gains ``w / (rrf_k + rank)`` from
each signal it has). Each signal's contribution goes into the hit explanation.

Queries without words (a photo alone) keep the plain vector ranking, so a photo still finds
its own product first.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from vitrine.index.graph import ProductFacts, ProductGraph, QueryTerms, norm_key

if TYPE_CHECKING:  # pragma: no cover
    from vitrine.search.engine import Engine

log = logging.getLogger(__name__)

GRAPH_FIELDS = ("brand", "colour", "gender", "usage", "season")
# When no product holds every value a query names, drop the least telling field first.
_RELAX_ORDER = ("season", "usage", "colour", "brand", "gender")


@dataclass
class Candidate:
    iid: int
    vector: float = float("nan")
    parts: dict[str, float] = field(default_factory=dict)
    bm25: float = 0.0
    graph: dict[str, float] = field(default_factory=dict)

    def signals(self, bm25_max: float) -> dict[str, float]:
        out = {"vector": self.vector}
        if self.bm25 > 0 and bm25_max > 0:
            out["bm25"] = self.bm25 / bm25_max
        out.update(self.graph)
        return out


@dataclass
class Pool:
    """A query's candidates with all their signals (before fusion)."""

    cands: dict[int, Candidate]
    terms: QueryTerms
    degraded: list[str] = field(default_factory=list)

    @property
    def bm25_max(self) -> float:
        return max((c.bm25 for c in self.cands.values()), default=0.0)


Ranked = list[tuple[int, float, dict[str, float]]]


# -- graph signals --------------------------------------------------------------------------------
def graph_candidates(graph: ProductGraph, terms: QueryTerms) -> set[int]:
    """Products holding every value the query names (relaxed field by field when none do)."""
    sets: dict[str, set[int]] = {}
    for f in ("category", *GRAPH_FIELDS):
        vals = terms.get(f)
        if vals:
            sets[f] = graph.products_with(f, vals)
    if not sets:
        return set()
    fields = list(sets)
    while fields:
        out = set.intersection(*(sets[f] for f in fields))
        if out:
            return out
        drop = next((f for f in _RELAX_ORDER if f in fields), None)
        if drop is None:
            break
        fields.remove(drop)
    return sets.get("category", set())


class GraphScorer:
    """Graph signals of candidates for one query's terms (caches per query)."""

    def __init__(self, graph: ProductGraph, terms: QueryTerms) -> None:
        self.graph, self.terms = graph, terms
        self.cats = terms.get("category")
        self.leaves: set[str] = set()
        for c in self.cats:
            self.leaves |= graph.category_leaves(c)
        self.want = {f: {norm_key(v) for v in terms.get(f)} for f in GRAPH_FIELDS if terms.get(f)}
        self.want_families = {graph.data.colours.family_of(v) for v in terms.get("colour")} - \
            set(graph.data.colours.universal) - {None}
        self._prox: dict[str | None, float] = {}

    def __call__(self, facts: ProductFacts | None) -> dict[str, float]:
        out: dict[str, float] = {}
        if facts is None:
            return out
        g = self.graph
        if self.cats and facts.category:
            if g.category_node(facts.category) in self.leaves:
                out["graph:category"] = 1.0
            else:
                p = self._prox.get(facts.category)
                if p is None:
                    p = self._prox[facts.category] = g.category_proximity(facts.category, self.cats)
                if p > 0:
                    out["graph:proximity"] = p
        for f, want in self.want.items():
            v = getattr(facts, f)
            if v is None:
                continue
            if norm_key(v) in want:
                out[f"graph:{f}"] = 1.0
            elif f == "gender" and v == "Unisex" and want & {"men", "women"}:
                out["graph:gender"] = 0.5
            elif f == "colour" and g.data.colours.family_of(v) in self.want_families:
                out["graph:colour"] = 0.5
        return out


# -- the pool ----------------------------------------------------------------------------------------
def vector_scores(engine: "Engine", qv: Mapping[str, np.ndarray], iids: list[int]) -> dict[int, tuple[float, dict]]:
    """The engine's vector score (and its modality parts) for given products."""
    out: dict[int, tuple[float, dict]] = {}
    if not iids:
        return out
    fused, image = engine.vectors["fused"], engine.vectors["image"]
    ids = np.asarray(iids, dtype=np.int64)
    if len(qv) == 1:
        mod, q = next(iter(qv.items()))
        index = image if mod == "image" else fused
        name = f"{mod}->{'image' if mod == 'image' else 'fused'}"
        have = [i for i in iids if i in index]
        if have:
            s = index.get(have) @ q
            for i, v in zip(have, s.tolist()):
                out[i] = (float(v), {name: float(v)})
        return out
    w = engine.settings.query_image_weight
    have = [i for i in iids if i in fused]
    if not have:
        return out
    ids = np.asarray(have, dtype=np.int64)
    s_txt = fused.get(ids) @ qv["text"]
    has_img = np.array([i in image for i in have])
    s_img = np.zeros(len(have), dtype=np.float32)
    if has_img.any():
        s_img[has_img] = image.get(ids[has_img]) @ qv["image"]
    for i, si, st in zip(have, s_img.tolist(), s_txt.tolist()):
        out[i] = (float(w * si + (1 - w) * st), {"image->image": float(si), "text->fused": float(st)})
    return out


def build_pool(engine: "Engine", qv: Mapping[str, np.ndarray], text: str, k: int,
               allowed: np.ndarray | None, *, signals: Iterable[str] | None = None,
               terms: QueryTerms | None = None) -> Pool:
    """Candidates from the vectors, BM25 and the graph, each with every signal."""
    s = engine.settings
    signals = set(s.fusion_signals if signals is None else signals)
    n = max(s.fusion_candidates, k * s.candidate_multiplier)
    allowed_set = set(allowed.tolist()) if allowed is not None else None
    cands: dict[int, Candidate] = {}
    for iid, score, parts in engine._rank(dict(qv), n, allowed):
        cands[iid] = Candidate(iid, score, dict(parts))
    degraded: list[str] = []
    bm25_scores: dict[int, float] = {}
    if "bm25" in signals:
        try:  # one pass over the matches: the top n join the pool, the rest score other candidates
            bm25_scores = engine.records.bm25_scores(text)
            top = getattr(bm25_scores, "top", None)  # numpy top-n of the in-memory scores (same order)
            if top is not None:
                best = top(n, allowed)
            else:
                ranked = bm25_scores.items() if allowed_set is None else \
                    ((i, b) for i, b in bm25_scores.items() if i in allowed_set)
                best = heapq.nlargest(n, ranked, key=lambda t: (t[1], -t[0]))
            for iid, _ in best:
                cands.setdefault(iid, Candidate(iid))
        except Exception as e:  # noqa: BLE001 - a failing retriever degrades, never fails the search
            log.warning("BM25 retrieval failed: %s", e)
            degraded.append("bm25")
    graph = engine.graph
    if terms is None:
        terms = QueryTerms()
        if "graph" in signals:
            try:
                terms = graph.match_query(text)
            except Exception as e:  # noqa: BLE001
                log.warning("graph query matching failed: %s", e)
                degraded.append("graph")
    if "graph" in signals and terms and "graph" not in degraded:
        try:
            with graph._lock:
                gset = graph_candidates(graph, terms)
            if allowed_set is not None:
                gset &= allowed_set
            if gset:
                for iid, score, parts in engine._rank(dict(qv), n, np.fromiter(sorted(gset), dtype=np.int64)):
                    c = cands.setdefault(iid, Candidate(iid))
                    c.vector, c.parts = score, dict(parts)
        except Exception as e:  # noqa: BLE001
            log.warning("graph retrieval failed: %s", e)
            degraded.append("graph")
    missing = [i for i, c in cands.items() if np.isnan(c.vector)]
    if missing:
        vs = vector_scores(engine, qv, missing)
        for i in missing:
            if i in vs:
                cands[i].vector, cands[i].parts = vs[i][0], vs[i][1]
            else:  # no vector (another model's, or deleted meanwhile): cannot be ranked
                cands.pop(i)
    if "bm25" in signals and "bm25" not in degraded:
        many = getattr(bm25_scores, "get_many", None)  # one vectorised lookup for the whole pool
        vals = many(list(cands)) if many is not None else [bm25_scores.get(i, 0.0) for i in cands]
        for c, v in zip(cands.values(), vals):
            c.bm25 = v
    if "graph" in signals and terms and "graph" not in degraded:
        try:
            with graph._lock:
                scorer = GraphScorer(graph, terms)
                for c in cands.values():
                    c.graph = scorer(graph.facts(c.iid))
        except Exception as e:  # noqa: BLE001
            log.warning("graph signals failed: %s", e)
            degraded.append("graph")
            for c in cands.values():
                c.graph = {}
    return Pool(cands=cands, terms=terms, degraded=degraded)


# -- fusion ----------------------------------------------------------------------------------------
def fuse_weighted(pool: Pool, weights: Mapping[str, float], limit: int | None = None) -> Ranked:
    """Weighted sum of each candidate's signals, best first; with ``limit`` only the best
    ``limit`` are returned (the same ones, with the same scores, as the head of the full list)."""
    bmax = pool.bm25_max
    w_vec, w_bm25 = weights.get("vector", 0.0), weights.get("bm25", 0.0)
    totals: list[tuple[float, int, Candidate]] = []
    for c in pool.cands.values():
        # the same additions, in the same order, as summing the explanation below
        t = w_vec * c.vector
        if c.bm25 > 0 and bmax > 0:
            t += w_bm25 * (c.bm25 / bmax)
        for name, x in c.graph.items():
            t += weights.get(name, 0.0) * x
        totals.append((-t, c.iid, c))
    head = heapq.nsmallest(limit, totals, key=lambda r: (r[0], r[1])) if limit is not None else \
        sorted(totals, key=lambda r: (r[0], r[1]))
    out: Ranked = []
    for _, _, c in head:  # the per-signal explanation, for the returned ones only
        contrib = {name: weights.get(name, 0.0) * x for name, x in c.signals(bmax).items()}
        contrib = {name: v for name, v in contrib.items() if v != 0.0 or name == "vector"}
        out.append((c.iid, float(sum(contrib.values())), contrib))
    return out


def fuse_rrf(pool: Pool, weights: Mapping[str, float], rrf_k: float) -> Ranked:
    bmax = pool.bm25_max
    sig = {c.iid: c.signals(bmax) for c in pool.cands.values()}
    vec = {c.iid: c.vector for c in pool.cands.values()}
    names = sorted({n for s in sig.values() for n in s})
    contrib: dict[int, dict[str, float]] = {i: {} for i in sig}
    for name in names:
        w = weights.get(name, 0.0)
        if w == 0.0:
            continue
        have = [i for i, s in sig.items() if s.get(name, 0.0) > 0 or name == "vector"]
        have.sort(key=lambda i: (-sig[i].get(name, 0.0), -vec[i], i))
        for rank, i in enumerate(have, start=1):
            contrib[i][name] = w / (rrf_k + rank)
    out = [(i, float(sum(c.values())), c) for i, c in contrib.items()]
    out.sort(key=lambda t: (-t[1], -vec[t[0]], t[0]))
    return out


def fuse(pool: Pool, method: str, *, weights: Mapping[str, float], rrf_k: float = 60.0,
         limit: int | None = None) -> Ranked:
    if method == "weighted":
        return fuse_weighted(pool, weights, limit)
    if method == "rrf":
        out = fuse_rrf(pool, weights, rrf_k)
        return out if limit is None else out[:limit]
    raise ValueError(f"unknown fusion method {method!r}")


def rank(engine: "Engine", qv: Mapping[str, np.ndarray], text: str | None, k: int,
         allowed: np.ndarray | None) -> tuple[Ranked, dict[int, float], list[str], QueryTerms]:
    """The engine's ranking for a query: hybrid when it has words and fusion is on, else the
    plain vector ranking. Returns (iid, score, signals) best first, the vector score of each,
    the degraded components and the graph terms the query named."""
    s = engine.settings
    if not text or s.fusion == "off" or not s.fusion_signals:
        scored = engine._rank(dict(qv), k, allowed)
        return scored, {i: sc for i, sc, _ in scored}, [], QueryTerms()
    if allowed is not None and len(allowed) == 0:
        return [], {}, [], QueryTerms()
    pool = build_pool(engine, qv, text, k, allowed)
    weights = s.rrf_weights if s.fusion == "rrf" else s.fusion_weights
    ranked = fuse(pool, s.fusion, weights=weights, rrf_k=s.rrf_k, limit=k)
    out: Ranked = []
    for iid, score, contrib in ranked:
        c = pool.cands[iid]
        out.append((iid, score, {**c.parts, **contrib}))
    return out, {i: c.vector for i, c in pool.cands.items()}, pool.degraded, pool.terms
