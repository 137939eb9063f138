"""Hybrid ranking: vector similarity, BM25 and knowledge-graph signals fused into one score.

Three retrievers fill one candidate pool for a text query:

- vectors: the plain vector ranking (text -> fused product vectors; with a photo, the
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

Beside them, ``native``: the cosine of the query and the product text in the text tower's own
space (vitrine/search/native.py). A text-only query is weighted by the catalogue's calibration
(vitrine/search/calibration.py): untuned, ``native`` alone (the floor: exactly the text tower's
cosine ranking, served straight from the native index); tuned, the mix `vitrine tune` found
better on held-out pseudo-queries. When that mix gives the native space no weight, it is neither
searched nor scored (its candidates only ever joined the pool: on the bundled catalogue's val
queries the tuned rankings were identical without them, and a Flat search of it is ~2 ms a query).
When it gives the shared space no weight, the native space retrieves in its place and the query's
adapter (the MoE gate) never runs (:func:`text_pool`). Queries with a photo use the configured weights.

Only the hits a search returns are explained: a candidate's per-signal dict is made when read
(:class:`Signals`), and its score is summed in the explanation's order, so it still adds up.

Queries without words (a photo alone) keep the plain vector ranking, so a photo still finds
its own product first.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vitrine.index.graph import ProductGraph
from vitrine.index.vectors import VectorIndexAPI
from vitrine.index.vocabulary import QueryTerms, norm_key
from vitrine.search.models import Ranked
from vitrine.search.read_context import ReadContext

log = logging.getLogger(__name__)

GRAPH_FIELDS = ("brand", "colour", "gender", "usage", "season")
# When no product holds every value a query names, drop the least telling field first.
_RELAX_ORDER = ("season", "usage", "colour", "brand", "gender")


# Graph signal columns of a pool, in the order a candidate's explanation lists them.
GRAPH_SIGNALS = ("graph:category", "graph:proximity", *(f"graph:{f}" for f in GRAPH_FIELDS))


@dataclass
class Pool:
    """A query's candidates with all their signals (before fusion), one numpy row per candidate.

    ``iids`` sorted; ``vector`` the plain vector score and ``parts`` its modality parts (columns
    ``part_names``); ``bm25`` the raw BM25 score (0: no match); ``graph`` one column per
    :data:`GRAPH_SIGNALS` (0: the signal is absent). Arrays, not objects: a pool of ~150
    candidates is scored and fused per search, and per-candidate Python was most of a hybrid
    search's CPU on a busy server."""

    iids: np.ndarray
    vector: np.ndarray
    bm25: np.ndarray
    graph: np.ndarray
    terms: QueryTerms
    parts: np.ndarray | None = None
    part_names: tuple[str, ...] = ()
    degraded: list[str] = field(default_factory=list)
    native: np.ndarray | None = None  # cosine in the text tower's own space (None: not computed)
    # the query's best BM25 over the whole catalogue when a filter kept the pool from holding it: BM25
    # is normalised by it, so a product scores the same filtered or not (a facet count = its filter's total)
    bm25_ref: float = 0.0

    def __len__(self) -> int:
        return len(self.iids)

    @classmethod
    def of(cls, rows: Mapping[int, tuple[float, float, Mapping[str, float]]], terms: QueryTerms | None = None) -> "Pool":
        """A pool from ``{iid: (vector, bm25, {graph signal: value})}`` (tests, tools)."""
        iids = np.array(sorted(rows), dtype=np.int64)
        graph = np.zeros((len(iids), len(GRAPH_SIGNALS)))
        for r, i in enumerate(iids.tolist()):
            for name, x in rows[i][2].items():
                graph[r, GRAPH_SIGNALS.index(name)] = x
        return cls(iids=iids, vector=np.array([rows[i][0] for i in iids.tolist()], dtype=np.float64),
                   bm25=np.array([rows[i][1] for i in iids.tolist()], dtype=np.float64), graph=graph,
                   terms=terms or QueryTerms())

    @property
    def bm25_max(self) -> float:
        return max(float(self.bm25.max()) if len(self.bm25) else 0.0, self.bm25_ref)

    def bm25_norm(self) -> np.ndarray:
        """BM25 over the pool's best (0 where none)."""
        bmax = self.bm25_max
        return self.bm25 / bmax if bmax > 0 else np.zeros_like(self.bm25)

    def signals(self, r: int) -> dict[str, float]:
        """Row ``r``'s signals by name: the vector score, BM25 (when it matched), graph signals present."""
        out = {"vector": float(self.vector[r])}
        if self.native is not None:
            out["native"] = float(self.native[r])
        b = self.bm25[r]
        if b > 0 and self.bm25_max > 0:
            out["bm25"] = float(b / self.bm25_max)
        for name, x in zip(GRAPH_SIGNALS, self.graph[r].tolist()):
            if x != 0.0:
                out[name] = x
        return out

    def vector_parts(self, r: int) -> dict[str, float]:
        if self.parts is None:
            return {}
        return dict(zip(self.part_names, self.parts[r].tolist()))


# -- graph signals --------------------------------------------------------------------------------
def graph_candidates(graph: ProductGraph, terms: QueryTerms) -> set[int]:
    """Products holding every value the query names (relaxed field by field when none do)."""
    return set(graph_candidate_array(graph, terms).tolist())


def graph_candidate_array(graph: ProductGraph, terms: QueryTerms) -> np.ndarray:
    """:func:`graph_candidates` as ascending iids, intersected as arrays (smallest first, through a
    mask over the iids), not Python sets: a named gender alone is half the catalogue."""
    sets: dict[str, np.ndarray] = {}
    for f in ("category", *GRAPH_FIELDS):
        vals = terms.get(f)
        if vals:
            sets[f] = graph.product_ids_with(f, vals)
    if not sets:
        return np.zeros(0, dtype=np.int64)
    fields = list(sets)
    while fields:
        out = _intersect([sets[f] for f in fields])
        if len(out):
            return out
        drop = next((f for f in _RELAX_ORDER if f in fields), None)
        if drop is None:
            break
        fields.remove(drop)
    return sets.get("category", np.zeros(0, dtype=np.int64))


def _intersect(arrays: list[np.ndarray]) -> np.ndarray:
    """The ids in every one of ``arrays`` (each ascending, distinct, non-negative), ascending."""
    arrays = sorted(arrays, key=len)
    out = arrays[0]
    for other in arrays[1:]:
        if not len(out):
            break
        mask = np.zeros(int(max(out[-1], other[-1] if len(other) else 0)) + 1, dtype=bool)
        mask[other] = True
        out = out[mask[out]]
    return out


def graph_candidate_ids(graph: ProductGraph, terms: QueryTerms) -> np.ndarray:
    """:func:`graph_candidates` as sorted iids, remembered per query terms until a product changes."""
    return graph.product_set(("graph_candidates", terms.key()), lambda: graph_candidate_array(graph, terms))


class GraphScorer:
    """Graph signals of candidates for one query's terms: a row of :data:`GRAPH_SIGNALS` values
    per product. Each signal reads one fact (the category, or one named field), so it is computed
    once per distinct value of that fact in the pool (a pool's candidates share a few), from the
    graph's fact codes in one numpy step."""

    def __init__(self, graph: ProductGraph, terms: QueryTerms) -> None:
        self.graph, self.terms = graph, terms
        self.cats = terms.get("category")
        self.leaves: set[str] = set()
        for c in self.cats:
            self.leaves |= graph.category_leaves(c)
        self.want = {f: {norm_key(v) for v in terms.get(f)} for f in GRAPH_FIELDS if terms.get(f)}
        self.want_families = {graph.data.colours.family_of(v) for v in terms.get("colour")} - \
            set(graph.data.colours.universal) - {None}
        # the facts the signals read, and the signal columns each one fills
        self.fields = (("category",) if self.cats else ()) + tuple(self.want)

    def rows(self, iids: np.ndarray) -> np.ndarray:
        """The signals of products ``iids``, (len(iids), len(GRAPH_SIGNALS)) (zeros for a product
        the graph lacks)."""
        out = np.zeros((len(iids), len(GRAPH_SIGNALS)))
        if not self.fields or not len(iids):
            return out
        codes = self.graph.fact_codes(iids, self.fields)
        for j, f in enumerate(self.fields):
            distinct, which = np.unique(codes[:, j], return_inverse=True)
            values = [self.graph.fact_value(f, c) for c in distinct.tolist()]
            if f == "category":
                table = np.array([self._category(v) for v in values], dtype=np.float64)
                out[:, _CATEGORY_COLUMNS] = table[which]
            else:
                out[:, GRAPH_SIGNALS.index(f"graph:{f}")] = np.array([self._match(f, v) for v in values])[which]
        return out

    def _category(self, category: str | None) -> tuple[float, float]:
        """(graph:category, graph:proximity) of a product in ``category``: 1 when it is, or is under,
        a category the query names, else the taxonomy proximity."""
        if not category:
            return 0.0, 0.0
        if self.graph.category_node(category) in self.leaves:
            return 1.0, 0.0
        return 0.0, max(0.0, self.graph.category_proximity(category, self.cats))

    def _match(self, f: str, v: str | None) -> float:
        """graph:``f`` of a product whose ``f`` is ``v``: 1 for a value the query names, 0.5 for a
        unisex product to a men/women query or a colour of a named colour's family."""
        if v is None:
            return 0.0
        want = self.want[f]
        if norm_key(v) in want:
            return 1.0
        if f == "gender" and v == "Unisex" and want & {"men", "women"}:
            return 0.5
        if f == "colour" and self.graph.data.colours.family_of(v) in self.want_families:
            return 0.5
        return 0.0


_CATEGORY_COLUMNS = [GRAPH_SIGNALS.index("graph:category"), GRAPH_SIGNALS.index("graph:proximity")]


# -- the pool ----------------------------------------------------------------------------------------
# A query vector's modality -> the name of its vector score's part. ``native``: a text query's
# vector in the text tower's own space, the pool's vector signal when the catalogue's mix gives the
# shared space no weight (:func:`text_pool`).
_PART_NAMES = {"image": "image->image", "text": "text->fused", "native": "text->native"}


def _space(reader: ReadContext, modality: str) -> VectorIndexAPI:
    """The product vectors a query vector of ``modality`` is compared with."""
    if modality == "native":
        return reader.state.native.index
    return reader.state.vectors["image" if modality == "image" else "fused"]


def vector_scores(reader: ReadContext, qv: Mapping[str, np.ndarray], iids: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[str, ...]]:
    """The plain vector score of given products, as its ranking computes it: (which of
    ``iids`` have one, their scores, their modality parts, the parts' names)."""
    fused, image = reader.state.vectors["fused"], reader.state.vectors["image"]
    if len(qv) == 1:
        mod, q = next(iter(qv.items()))
        have, vecs = _space(reader, mod).get_present(iids)
        sc = (vecs @ q).astype(np.float64)
        return have, sc, sc[:, None], (_PART_NAMES[mod],)
    w = reader.query_image_weight(dict(qv))
    have, vecs = fused.get_present(iids)
    s_txt = vecs @ qv["text"]
    has_img, img_vecs = image.get_present(iids[have])
    s_img = np.zeros(len(s_txt), dtype=np.float32)
    s_img[has_img] = img_vecs @ qv["image"]
    total = w * s_img + (1 - w) * s_txt  # in float32, as the plain vector ranking blends them
    return (have, total.astype(np.float64),
            np.stack([s_img, s_txt], axis=1).astype(np.float64), ("image->image", "text->fused"))


def _vector_ids(reader: ReadContext, qv: Mapping[str, np.ndarray], n: int, allowed: np.ndarray | None) -> np.ndarray:
    """Ids of the plain vector top ``n`` (scores are recomputed for the whole pool)."""
    if len(qv) == 1:
        mod, q = next(iter(qv.items()))
        if allowed is not None and len(allowed) == 0:
            return np.zeros(0, dtype=np.int64)
        _, ids = _space(reader, mod).search(q[None], n, allowed)
        return ids[0][ids[0] >= 0]
    return np.array([iid for iid, _, _ in reader.rank_vectors(dict(qv), n, allowed)], dtype=np.int64)


def _in_time(deadline: float | None) -> None:
    if deadline is not None and time.perf_counter() > deadline:
        raise TimeoutError("hybrid fusion ran past its time budget")


def build_pool(reader: ReadContext, qv: Mapping[str, np.ndarray], text: str, k: int,
               allowed: np.ndarray | None, *, signals: Iterable[str] | None = None,
               terms: QueryTerms | None = None, deadline: float | None = None, depth: int | None = None,
               native_q: np.ndarray | None = None) -> Pool:
    """Candidates from the vectors, BM25 and the graph, each with every signal (``depth``: each
    retriever's top that many; default from ``k``). ``deadline`` is checked before each stage (a
    running stage is not interrupted): past it, TimeoutError.

    The vectors that retrieve (the top ``n`` of all, and of the graph's candidates) are the query's
    shared-space ones (``qv``), or with ``native_q`` (a text query's native vector) the native
    space's, the shared space then only scoring the pool: on the bundled catalogue, tuned, the
    shared space retrieving too changed neither the held-out pseudo-queries' objective (0.8927 vs
    0.8931) nor the val split's attribute and exact-word nDCG@10 (0.9991 / 0.9845 vs 0.9992 /
    0.9844), and its scan was ~0.8 ms of a text query's ~9.5 ms of CPU."""
    s = reader.settings
    signals = set(s.search.fusion_signals if signals is None else signals)
    n = depth if depth is not None else max(s.search.fusion_candidates, k * s.search.candidate_multiplier)
    _in_time(deadline)
    retrieve = qv if native_q is None else {"native": native_q}
    found = [_vector_ids(reader, retrieve, n, allowed)]
    _in_time(deadline)
    degraded: list[str] = []
    bm25_scores: Mapping[int, float] = {}
    bm25_ref = 0.0
    if "bm25" in signals:
        try:  # one pass over the matches: the top n join the pool, the rest score other candidates
            bm25_scores = reader.state.records.bm25_scores(text)
            top = getattr(bm25_scores, "top", None)  # numpy top-n of the in-memory scores (same order)
            if top is not None:
                best = top(n, allowed)
            else:
                allowed_set = set(allowed.tolist()) if allowed is not None else None
                ranked = bm25_scores.items() if allowed_set is None else \
                    ((i, b) for i, b in bm25_scores.items() if i in allowed_set)
                best = heapq.nlargest(n, ranked, key=lambda t: (t[1], -t[0]))
            found.append(np.array([iid for iid, _ in best], dtype=np.int64))
            if allowed is not None:  # the unfiltered best: the scale BM25 is normalised by (see Pool)
                best_all = top(1, None) if top is not None else \
                    heapq.nlargest(1, bm25_scores.items(), key=lambda t: (t[1], -t[0]))
                bm25_ref = float(best_all[0][1]) if len(best_all) else 0.0
        except Exception as e:  # noqa: BLE001 - a failing retriever degrades, never fails the search
            log.warning("BM25 retrieval failed: %s", e)
            degraded.append("bm25")
    graph = reader.state.graph
    if terms is None:
        terms = QueryTerms()
        if "graph" in signals:
            try:
                terms = graph.match_query(text)
            except Exception as e:  # noqa: BLE001 - a failing signal degrades the search, not fails it
                log.warning("graph query matching failed: %s", e)
                degraded.append("graph")
    use_graph = "graph" in signals and bool(terms) and "graph" not in degraded
    _in_time(deadline)
    if use_graph:
        try:
            gids = graph_candidate_ids(graph, terms)
            if len(gids):
                if allowed is not None:
                    gids = np.intersect1d(gids, allowed, assume_unique=True)
                if len(gids):
                    found.append(_vector_ids(reader, retrieve, n, gids))
        except Exception as e:  # noqa: BLE001 - a failing signal degrades the search, not fails it
            log.warning("graph retrieval failed: %s", e)
            degraded.append("graph")
            use_graph = False
    iids = np.unique(np.concatenate(found))
    _in_time(deadline)
    have, vector, parts, part_names = vector_scores(reader, qv, iids)
    iids = iids[have]  # no vector (another model's, or deleted meanwhile): cannot be ranked
    bm25 = np.zeros(len(iids))
    if "bm25" in signals and "bm25" not in degraded and len(iids):
        many = getattr(bm25_scores, "get_many", None)  # one vectorised lookup for the whole pool
        bm25 = np.asarray(many(iids.tolist()) if many is not None else
                          [bm25_scores.get(i, 0.0) for i in iids.tolist()], dtype=np.float64)
    gmat = np.zeros((len(iids), len(GRAPH_SIGNALS)))
    if use_graph and len(iids):
        try:
            with graph.lock:
                gmat = GraphScorer(graph, terms).rows(iids)
        except Exception as e:  # noqa: BLE001 - a failing signal degrades the search, not fails it
            log.warning("graph signals failed: %s", e)
            degraded.append("graph")
            gmat = np.zeros((len(iids), len(GRAPH_SIGNALS)))
    nat = None
    if native_q is not None:
        nhave, nvecs = reader.state.native.index.get_present(iids)
        nat = np.zeros(len(iids))
        nat[nhave] = (nvecs @ native_q).astype(np.float64)
    return Pool(iids=iids, vector=vector, bm25=bm25, graph=gmat, terms=terms, parts=parts,
                part_names=part_names, degraded=degraded, native=nat, bm25_ref=bm25_ref)


# -- fusion ----------------------------------------------------------------------------------------
class Signals(Mapping[str, float]):
    """One candidate's explanation (signal -> contribution), made when first read: a search ranks
    a pool of a few hundred candidates and returns a page of them, and making every candidate's
    dict was a quarter of a tuned catalogue's CPU per query."""

    __slots__ = ("_make", "_row", "_made")

    def __init__(self, make: Callable[[int], dict[str, float]], row: int) -> None:
        self._make, self._row = make, row
        self._made: dict[str, float] | None = None

    def _get(self) -> dict[str, float]:
        if self._made is None:
            self._made = self._make(self._row)
        return self._made

    def __getitem__(self, name: str) -> float:
        return self._get()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())

    def __repr__(self) -> str:
        return repr(self._get())


def _explain(pool: Pool, order: np.ndarray, total: np.ndarray, contrib_of: Callable[[int], dict[str, float]],
             parts: bool) -> Ranked:
    """(iid, score, per-signal contributions) of the pool rows ``order``. ``total`` is summed in the
    order the explanation lists the signals, so an explanation always adds up to its score exactly.
    ``parts``: the explanation starts with the vector score's modality parts."""
    make = contrib_of
    if parts and pool.parts is not None:
        def make(r: int) -> dict[str, float]:
            return {**pool.vector_parts(r), **contrib_of(r)}
    rows = order.tolist()
    return [(iid, score, Signals(make, r))
            for iid, score, r in zip(pool.iids[order].tolist(), total[order].tolist(), rows)]


def fuse_weighted(pool: Pool, weights: Mapping[str, float], limit: int | None = None, *,
                  parts: bool = False) -> Ranked:
    """Weighted sum of each candidate's signals, best first (ties: smaller iid); with ``limit``
    only the best ``limit`` are returned (the same ones, with the same scores, as the head of
    the full list). ``parts``: explanations start with the vector score's modality parts."""
    if not len(pool):
        return []
    # the same additions, in the same order, as summing a candidate's explanation (pool.signals' order)
    total = weights.get("vector", 0.0) * pool.vector
    if pool.native is not None:
        total = total + weights.get("native", 0.0) * pool.native
    total = total + weights.get("bm25", 0.0) * pool.bm25_norm()
    for j, name in enumerate(GRAPH_SIGNALS):
        w = weights.get(name, 0.0)
        if w != 0.0:
            total = total + w * pool.graph[:, j]
    order = np.lexsort((pool.iids, -total))
    if limit is not None:
        order = order[:limit]

    def contrib_of(r: int) -> dict[str, float]:  # the per-signal explanation, when read
        c = {name: weights.get(name, 0.0) * x for name, x in pool.signals(r).items()}
        return {name: v for name, v in c.items() if v != 0.0 or name in ("vector", "native")}

    return _explain(pool, order, total, contrib_of, parts)


def fuse_rrf(pool: Pool, weights: Mapping[str, float], rrf_k: float, limit: int | None = None, *,
             parts: bool = False) -> Ranked:
    """Reciprocal-rank fusion: each signal ranks the candidates that have it (ties: better vector
    score, then smaller iid); a candidate gains ``w / (rrf_k + rank)`` from each. With ``limit``
    only the best ``limit`` are returned. ``parts``: as :func:`fuse_weighted`."""
    n = len(pool)
    if not n:
        return []
    cols = {"vector": pool.vector, "bm25": pool.bm25_norm(),
            **{name: pool.graph[:, j] for j, name in enumerate(GRAPH_SIGNALS)}}
    if pool.native is not None:
        cols["native"] = pool.native
    names = sorted(cols)  # summed in name order, as the explanation lists them
    contrib = np.zeros((n, len(names)))
    for j, name in enumerate(names):
        w = weights.get(name, 0.0)
        x = cols[name]
        if w == 0.0:
            continue
        have = np.arange(n) if name in ("vector", "native") else np.flatnonzero(x > 0)
        if not len(have):
            continue
        order = have[np.lexsort((pool.iids[have], -pool.vector[have], -x[have]))]
        contrib[order, j] = w / (rrf_k + np.arange(1, len(order) + 1))
    total = np.zeros(n)
    for j in range(len(names)):  # one addition at a time, in the explanation's order
        total = total + contrib[:, j]
    order = np.lexsort((pool.iids, -pool.vector, -total))
    if limit is not None:
        order = order[:limit]

    def contrib_of(r: int) -> dict[str, float]:
        return {name: float(contrib[r, j]) for j, name in enumerate(names) if contrib[r, j] != 0.0}

    return _explain(pool, order, total, contrib_of, parts)


def fuse(pool: Pool, method: str, *, weights: Mapping[str, float], rrf_k: float = 60.0,
         limit: int | None = None, parts: bool = False) -> Ranked:
    if method == "weighted":
        return fuse_weighted(pool, weights, limit, parts=parts)
    if method == "rrf":
        return fuse_rrf(pool, weights, rrf_k, limit, parts=parts)
    raise ValueError(f"unknown fusion method {method!r}")


def rank(reader: ReadContext, qv: Mapping[str, np.ndarray], text: str | None, k: int,
         allowed: np.ndarray | None, *, deadline: float | None = None, depth: int | None = None
         ) -> tuple[Ranked, dict[int, float], list[str], QueryTerms]:
    """The read path's ranking for a query: hybrid when it has words and fusion is on, else the
    plain vector ranking. Returns (iid, score, signals) best first, the vector score of each,
    the degraded components and the graph terms the query named. ``deadline`` (a
    ``time.perf_counter()`` value): past it, between two stages, TimeoutError. ``depth``: rank
    each retriever's top ``depth`` and return the whole pool's ranking, not only the top ``k``."""
    s = reader.settings
    weights, nq, degraded = text_weights(reader, qv, text)
    if not text or s.search.fusion == "off" or (weights is None and not s.search.fusion_signals):
        scored = reader.rank_vectors(dict(qv), depth or k, allowed)
        return scored, {i: sc for i, sc, _ in scored}, degraded, QueryTerms()
    if allowed is not None and len(allowed) == 0:
        return [], {}, degraded, QueryTerms()
    if weights is not None and nq is not None and {n for n, w in weights.items() if w} <= {"native"}:
        return native_rank(reader, nq, depth or k, allowed)  # the floor: the text tower's own cosine ranking
    if weights is not None and not weights.get("native", 0.0):
        nq = None  # the catalogue's mix gives the native space no weight: neither retrieved nor scored
    pool = text_pool(reader, qv, text, k, allowed, native_q=nq, shared=reads_shared_space(weights, nq),
                     deadline=deadline, depth=depth)
    pool.degraded = degraded + pool.degraded
    method = "weighted" if weights is not None else s.search.fusion
    if weights is None:
        weights = s.search.rrf_weights if s.search.fusion == "rrf" else s.search.fusion_weights
    ranked = fuse(pool, method, weights=weights, rrf_k=s.search.rrf_k, limit=None if depth else k, parts=True)
    return ranked, dict(zip(pool.iids.tolist(), pool.vector.tolist())), pool.degraded, pool.terms


def reads_shared_space(weights: Mapping[str, float] | None, native_q: np.ndarray | None) -> bool:
    """Whether a text query ranked with ``weights`` (None: the configured ones) reads its shared-
    space vector: not when the mix gives that space no weight and the native space can stand in."""
    return weights is None or native_q is None or bool(weights.get("vector", 0.0))


def text_pool(reader: ReadContext, qv: Mapping[str, np.ndarray], text: str, k: int, allowed: np.ndarray | None, *,
              native_q: np.ndarray | None, shared: bool = True, **kw: Any) -> Pool:
    """A text query's pool (:func:`build_pool`). ``shared=False`` (the mix gives the shared space
    no weight): the native space is the pool's vector retriever and score (``vector`` and
    ``native`` both its cosine), so neither the shared-space vector (the adapter, the MoE gate)
    nor its index is touched: on a tuned catalogue that was ~3 ms of a text query's ~14 ms of CPU."""
    if shared or native_q is None:
        return build_pool(reader, qv, text, k, allowed, native_q=native_q, **kw)
    pool = build_pool(reader, {"native": native_q}, text, k, allowed, **kw)
    pool.native = pool.vector
    return pool


def ranks_without_shared_space(reader: ReadContext, text: str | None, has_image: bool) -> bool:
    """True when :func:`rank` never reads this text query's shared-space vector (a text-only
    query, fusion on, a calibration whose mix gives the shared space no weight, as the floor's
    does, the native space usable): the search need not run the adapter for it."""
    s = reader.settings.search
    if not text or has_image or s.fusion == "off" or s.calibration == "off":
        return False
    if not reader.state.native.usable_with(reader.encoder.towers.key):
        return False
    return not reader.calibration.text_weights.get("vector", 0.0)


def text_weights(reader: ReadContext, qv: Mapping[str, np.ndarray], text: str | None
                 ) -> tuple[dict[str, float] | None, np.ndarray | None, list[str]]:
    """For a text-only query under a calibration: (its weighted-fusion weights, the query's
    native vector, []); otherwise (None: the configured weights, None, degraded components).
    When the native vector cannot be had, the configured weights (``degraded: native``)."""
    if not text or set(qv) != {"text"} or reader.settings.search.calibration == "off":
        return None, None, []
    try:
        nq = reader.native_query_vector(text)
    except Exception as e:  # noqa: BLE001 - a failing native space degrades to the shared one
        log.warning("native text vector failed: %s", e)
        nq = None
    if nq is None:
        return None, None, ["native"]
    return dict(reader.calibration.text_weights), nq, []


def native_rank(reader: ReadContext, nq: np.ndarray, k: int, allowed: np.ndarray | None
                ) -> tuple[Ranked, dict[int, float], list[str], QueryTerms]:
    """The text tower's own cosine ranking (the floor), with the filters ``allowed``."""
    scores, ids = reader.state.native.index.search(nq[None], k, allowed)
    out: Ranked = [(i, sc, {"native": sc}) for sc, i in zip(scores[0].tolist(), ids[0].tolist()) if i >= 0]
    return out, {i: sc for i, sc, _ in out}, [], QueryTerms()
