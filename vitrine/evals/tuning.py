"""`vitrine tune`: fit text ranking to one catalogue on pseudo-queries made from it.

1. Pseudo-queries from the catalogue's records (vitrine/evals/pseudo_queries.py), split into fit
   and held-out.
2. Each query's candidate pool is built once, as the engine builds it (vitrine/search/fusion.py:
   shared-space, native-space, BM25 and graph retrievers), and kept as a matrix of signals.
3. Coordinate descent over a grid of weights per signal (``native``, ``vector`` = the shared
   space, ``bm25``, each graph signal), maximising nDCG@10 on the fit queries, averaged per query
   kind so that no kind dominates. Rankings are computed exactly as the engine's weighted fusion
   ranks (same signals, same tie order), vectorised over all pools at once. With several samples
   of pseudo-queries (``tune_samples``, each from its own seed) each sample is fitted apart and the
   mix served is the mean of their mixes, each scaled to sum 1.
4. The guard: the fitted mix is accepted only if it beats native-only (the floor) on the
   held-out queries by ``margin``; otherwise the floor stays.
5. Slot filters: held-out queries of every kind (taken round-robin over kinds) searched end to
   end through the engine, with the intent classifier's slot filters on and off; on only if that
   gains on held-out, averaged per kind as the fit objective.
6. The settings are saved in the data dir (vitrine/search/calibration.py, tied to the
   catalogue's version) and a report written: markdown + JSON + plot.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitrine.evals import pseudo_queries as pq
from vitrine.evals.tuning_report import rounded
from vitrine.search import calibration, fusion
from vitrine.search.engine import Engine
from vitrine.search.models import SearchRequest

log = logging.getLogger(__name__)

SIGNALS = ("native", "vector", "bm25", *fusion.GRAPH_SIGNALS)
GRID = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0)
K = 10
LABELLED_PREFIX = "shop:"  # kinds of the shop's own judged queries (``vitrine tune --queries``)
LABELLED_SHARE = 0.5  # their share of the objective: real queries are what serving is judged on


@dataclass
class Pools:
    """Every query's candidate pool as one padded array: ``x`` (Q, N, S) signals, ``rel`` (Q, N)
    relevance, ``valid`` (Q, N), ``n_rel`` relevant products per query (in the pool or not)."""

    x: np.ndarray
    rel: np.ndarray
    valid: np.ndarray
    n_rel: np.ndarray
    kinds: np.ndarray
    kind_weights: dict[str, float] | None = None  # a kind's share of the objective (absent: equal shares)
    ideal: np.ndarray | None = None  # each query's ideal DCG@10 (linear gains; absent: binary, from n_rel)

    def subset(self, rows: np.ndarray) -> "Pools":
        return Pools(self.x[rows], self.rel[rows], self.valid[rows], self.n_rel[rows], self.kinds[rows],
                     self.kind_weights, None if self.ideal is None else self.ideal[rows])


def build_pools(engine: Engine, queries: list[pq.PseudoQuery], *, batch: int = 64) -> Pools:
    """Candidate pools of text queries with every signal, as the engine's hybrid ranking sees them;
    ``rel`` holds each candidate's grade (graded pseudo-queries, a shop's judged queries) and
    ``ideal`` each query's ideal DCG@10 over all its relevant products, with linear gains."""
    texts = [q.text or "" for q in queries]
    shared = np.concatenate([engine.query_encoder.text(texts[s:s + batch]) for s in range(0, len(texts), batch)]) \
        if texts else np.zeros((0, engine.encoder.dim), np.float32)
    native = np.stack([engine.query_encoder.native(t) for t in texts]) if texts else None
    id_to_iid = {r.id: int(r.iid) for r in engine.records.iter_rows(with_vectors=False)}
    rows: list[tuple[np.ndarray, np.ndarray]] = []
    n_rel = np.zeros(len(queries))
    ideal = np.zeros(len(queries))
    disc = 1.0 / np.log2(np.arange(2, K + 2))
    for i, q in enumerate(queries):
        pool = fusion.build_pool(engine.reader, {"text": shared[i]}, texts[i], K, None, signals=("bm25", "graph"),
                                 native_q=native[i])  # type: ignore[index]  # native is None only when there are no texts
        cols = np.column_stack([pool.native if pool.native is not None else np.zeros(len(pool)), pool.vector,
                                pool.bm25_norm(), pool.graph])
        grade = {id_to_iid[p]: float(g) for p, g in q.relevant.items() if p in id_to_iid and g > 0}
        rows.append((cols, np.array([grade.get(int(iid), 0.0) for iid in pool.iids], dtype=np.float64)))
        n_rel[i] = len(grade)
        top = sorted(grade.values(), reverse=True)[:K]
        ideal[i] = float(np.dot(top, disc[:len(top)]))
    n = max((len(r[1]) for r in rows), default=1)
    x = np.zeros((len(rows), n, len(SIGNALS)))
    rel = np.zeros((len(rows), n))
    valid = np.zeros((len(rows), n), dtype=bool)
    for i, (cols, r) in enumerate(rows):  # pool rows are in iid order: the engine's tie order
        x[i, :len(r)], rel[i, :len(r)], valid[i, :len(r)] = cols, r, True
    return Pools(x, rel, valid, n_rel, np.array([q.kind for q in queries]), ideal=ideal)


def per_query(pools: Pools, w: np.ndarray) -> dict[str, np.ndarray]:
    """nDCG@10 (linear gains: a candidate earns its grade), R@10 and MRR@10 of every query under
    weights ``w``; with binary relevance nDCG is the same with either gain."""
    score = pools.x @ w
    score = np.where(pools.valid, score, -np.inf)
    order = np.argsort(-score, axis=1, kind="stable")[:, :K]  # ties: earlier row = smaller iid
    gains = np.take_along_axis(pools.rel, order, axis=1) * np.take_along_axis(pools.valid, order, axis=1)
    disc = 1.0 / np.log2(np.arange(2, K + 2))
    ideal = pools.ideal if pools.ideal is not None else np.array([disc[:int(min(K, r))].sum() for r in pools.n_rel])
    dcg = (gains * disc).sum(1)
    ndcg = np.divide(dcg, ideal, out=np.zeros_like(dcg), where=ideal > 0)
    hits = (gains > 0).astype(np.float64)
    recall = np.divide(hits.sum(1), pools.n_rel, out=np.zeros_like(dcg), where=pools.n_rel > 0)
    first = np.where(hits.any(1), hits.argmax(1), -1)
    mrr = np.divide(1.0, first + 1.0, out=np.zeros_like(dcg), where=first >= 0)
    return {"nDCG@10": ndcg, "R@10": recall, "MRR@10": mrr}


def objective(pools: Pools, w: np.ndarray) -> float:
    """Mean nDCG@10 per query kind, averaged over kinds (each kind counts the same, or as
    ``pools.kind_weights`` says)."""
    nd = per_query(pools, w)["nDCG@10"]
    if not len(nd):
        return 0.0
    kinds = np.unique(pools.kinds)
    share = np.array([(pools.kind_weights or {}).get(str(k), 1.0) for k in kinds])
    return float(np.average([nd[pools.kinds == k].mean() for k in kinds], weights=share))


def kind_means(pools: Pools, w: np.ndarray) -> dict[str, float]:
    """Mean nDCG@10 of each query kind under ``w``."""
    nd = per_query(pools, w)["nDCG@10"]
    return {str(k): float(nd[pools.kinds == k].mean()) for k in np.unique(pools.kinds)}


class Robust:
    """The objective the tune maximises by default: the mean over kinds (as :func:`objective`)
    minus ``penalty`` times each kind's loss to the floor (native only) on the same queries.

    Why: pseudo-queries of one kind can reward a signal that real shoppers' queries punish. On a
    furniture catalogue with real queries and judgements, the plain mean over kinds took graph
    category and proximity (0.15 each) and BM25 (0.16) because category pseudo-queries gained a
    lot from them, and real queries' nDCG@10 fell from 0.787 (the floor) to 0.744. Real queries
    are an unknown mixture of the kinds: a mix that loses on one kind to win on another is a bet on
    that mixture, so a loss counts ``penalty`` times what a gain earns and the fit prefers mixes
    that every kind agrees on."""

    def __init__(self, floor_w: np.ndarray, penalty: float) -> None:
        self.floor_w, self.penalty = floor_w, penalty
        # id(pools.x) -> (pools.x, its floors): the array is held so that its id cannot be reused by
        # another pool's (a freed subset's id went to the next sample's, which got the wrong floors)
        self._floors: dict[int, tuple[np.ndarray, dict[str, float]]] = {}

    def floor_of(self, pools: Pools) -> dict[str, float]:
        key = id(pools.x)
        hit = self._floors.get(key)
        if hit is None or hit[0] is not pools.x:
            hit = self._floors[key] = (pools.x, kind_means(pools, self.floor_w))
        return hit[1]

    def __call__(self, pools: Pools, w: np.ndarray) -> float:
        base = objective(pools, w)
        if self.penalty <= 0:
            return base
        floor = self.floor_of(pools)
        got = kind_means(pools, w)
        kinds = list(got)
        share = np.array([(pools.kind_weights or {}).get(k, 1.0) for k in kinds])
        loss = np.array([max(0.0, floor[k] - got[k]) for k in kinds])
        return base - self.penalty * float(np.average(loss, weights=share))


def losing_kinds(pools: Pools, w: np.ndarray, floor_w: np.ndarray, tol: float) -> dict[str, float]:
    """Kinds on which ``w`` loses to the floor by more than ``tol`` (kind -> loss)."""
    got, floor = kind_means(pools, w), kind_means(pools, floor_w)
    return {k: round(floor[k] - got[k], 4) for k in got if floor[k] - got[k] > tol}


def summary(pools: Pools, w: np.ndarray) -> dict[str, Any]:
    m = per_query(pools, w)
    out: dict[str, Any] = {name: round(float(v.mean()), 4) if len(v) else 0.0 for name, v in m.items()}
    out["objective"] = round(objective(pools, w), 4)
    out["by_kind"] = {str(k): round(float(m["nDCG@10"][pools.kinds == k].mean()), 4) for k in np.unique(pools.kinds)}
    return out


def weights_vec(d: dict[str, float]) -> np.ndarray:
    return np.array([float(d.get(s, 0.0)) for s in SIGNALS])


def weights_dict(w: np.ndarray) -> dict[str, float]:
    return {s: float(x) for s, x in zip(SIGNALS, w) if x != 0.0}


Objective = Callable[[Pools, np.ndarray], float]


def coordinate_descent(pools: Pools, start: np.ndarray, *, passes: int = 3,
                       active: tuple[int, ...] | None = None, obj: Objective = objective) -> tuple[np.ndarray, float]:
    """Improve ``start`` one weight at a time over :data:`GRID` (a change must gain > 1e-4)."""
    w, best = start.copy(), obj(pools, start)
    active = active if active is not None else tuple(range(len(SIGNALS)))
    for _ in range(passes):
        moved = False
        for j in active:
            for g in GRID:
                if g == w[j]:
                    continue
                trial = w.copy()
                trial[j] = g
                if not trial[:2].any():  # some vector space must rank
                    continue
                val = obj(pools, trial)
                if val > best + 1e-4:
                    w, best, moved = trial, val, True
        if not moved:
            break
    return w, best


def prune(pools: Pools, w: np.ndarray, best: float, obj: Objective = objective) -> tuple[np.ndarray, float]:
    """Switch off the signals the fit does not need (removing them costs <= 1e-4 on fit)."""
    w = w.copy()
    for j in np.flatnonzero(w)[::-1]:
        trial = w.copy()
        trial[j] = 0.0
        if trial[:2].any():
            val = obj(pools, trial)
            if val >= best - 1e-4:
                w, best = trial, max(best, val)
    return w, best


def fit_once(pools: Pools, starts: list[np.ndarray], active: tuple[int, ...],
             obj: Objective = objective) -> tuple[np.ndarray, float]:
    """Coordinate descent from each start, the best on ``pools``, pruned."""
    return prune(pools, *max((coordinate_descent(pools, w, active=active, obj=obj) for w in starts),
                             key=lambda c: c[1]), obj=obj)


def averaged_fit(pools: Pools, samples: list[np.ndarray], starts: list[np.ndarray],
                 active: tuple[int, ...], obj: Objective = objective) -> tuple[np.ndarray, list[np.ndarray]]:
    """One fit per sample of pseudo-queries (``samples``: their rows in ``pools``), each mix scaled
    to sum 1 (a ranking depends only on the weights' ratios), and their mean; with the mixes. A
    fit's weights swing with the sample its queries came from (five samples of the bundled
    catalogue: five mixes far apart, val attribute nDCG@10 0.984-0.998); the mean of the five
    scored 0.999 (docs/tuning.md)."""
    mixes = []
    for rows in samples:
        w, _ = fit_once(pools.subset(rows), starts, active, obj)
        mixes.append(w / w.sum())
    return np.mean(mixes, axis=0), mixes


def usable_signals(pools: Pools) -> tuple[int, ...]:
    """Signals present in some fit pool (a graph signal this catalogue never fires stays 0)."""
    return tuple(j for j in range(len(SIGNALS)) if np.abs(pools.x[:, :, j][pools.valid]).max(initial=0.0) > 0)


def slot_sample(queries: list[pq.PseudoQuery], rows: np.ndarray, n: int) -> list[pq.PseudoQuery]:
    """Up to ``n`` of the queries at ``rows``, taken round-robin over their kinds (in row order
    within a kind), so that the slot-filter check sees every kind the fit objective averages over
    (the rows come grouped by kind: a plain prefix would be title queries alone)."""
    by_kind: dict[str, list[pq.PseudoQuery]] = {}
    for i in rows:
        by_kind.setdefault(queries[int(i)].kind, []).append(queries[int(i)])
    out: list[pq.PseudoQuery] = []
    lists = list(by_kind.values())
    for j in range(max((len(v) for v in lists), default=0)):
        for v in lists:
            if j < len(v) and len(out) < n:
                out.append(v[j])
    return out


def _search_ndcg(engine: Engine, queries: list[pq.PseudoQuery], slots: bool,
                 kind_weights: dict[str, float] | None = None) -> tuple[float, dict[str, float]]:
    """nDCG@10 of held-out queries searched end to end (intent on), slot filters on/off: averaged
    per query kind, then over kinds (as the fit objective), and by kind."""
    from vitrine.evals.metrics import ndcg_at_k

    cal = engine.calibration
    engine.set_calibration(calibration.Calibration(**{**cal.__dict__, "slot_filters": slots}))
    try:
        vals: dict[str, list[float]] = {}
        for q in queries:
            r = engine.search(SearchRequest(text=q.text, k=K, use_intent=True))
            vals.setdefault(q.kind, []).append(ndcg_at_k([h.id for h in r.results], q.relevant, K, "linear"))
        by_kind = {k: round(float(np.mean(v)), 4) for k, v in sorted(vals.items())}
        share = [(kind_weights or {}).get(k, 1.0) for k in vals]
        return (float(np.average([np.mean(v) for v in vals.values()], weights=share)) if vals else 0.0), by_kind
    finally:
        engine.set_calibration(cal)


def catalogue_docs(engine: Engine) -> list[dict[str, Any]]:
    """Every live product document with its id; a product without a brand field gets the brand
    the knowledge graph learned for it (from its title), so brand queries are generated too."""
    out = []
    for r in engine.records.iter_rows(with_vectors=False):
        doc = {**r.doc, "id": r.id}
        if not doc.get("brand"):
            facts = engine.graph.facts(int(r.iid))
            if facts is not None and facts.brand:
                doc["brand"] = facts.brand
        out.append(doc)
    return out


def category_taxonomy(engine: Engine) -> dict[str, list[str]]:
    """Each mapped category leaf's Google-taxonomy path (names, root first), from the graph."""
    return {str(m["category"]): str(m["taxonomy_path"]).split(" > ")
            for m in engine.graph.mapping() if m.get("taxonomy_path")}


@dataclass
class TuneResult:
    calibration: calibration.Calibration
    report: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None


def labelled_weights(queries: list[pq.PseudoQuery], share: float) -> dict[str, float] | None:
    """Kind weights giving the shop's labelled kinds (``shop:*``) ``share`` of the objective
    together, the generated kinds the rest (equal within each group); None without labelled ones."""
    kinds = sorted({q.kind for q in queries})
    shop = [k for k in kinds if k.startswith(LABELLED_PREFIX)]
    gen = [k for k in kinds if not k.startswith(LABELLED_PREFIX)]
    if not shop:
        return None
    if not gen:
        return {k: 1.0 for k in shop}
    per_shop = share / (1.0 - share) * len(gen) / len(shop) if share < 1.0 else 1e6
    return {**{k: 1.0 for k in gen}, **{k: per_shop for k in shop}}


SHRINK = (1.0, 0.75, 0.5, 0.25)


def kind_guard(ho: Pools, fitted: np.ndarray, floor_w: np.ndarray, tol: float) -> tuple[np.ndarray, dict[str, Any]]:
    """The fitted mix, shrunk toward the floor (``lam * fitted + (1 - lam) * floor``, each scaled
    to sum 1) by the largest of :data:`SHRINK` at which no held-out kind loses to the floor by
    more than ``tol``; with what it found. None of them: the mix as fitted, its losing kinds
    reported (the tune then keeps the floor)."""
    f = fitted / max(fitted.sum(), 1e-12)
    fl = floor_w / max(floor_w.sum(), 1e-12)
    first: dict[str, float] = {}
    for lam in SHRINK:
        w = lam * f + (1 - lam) * fl
        losing = losing_kinds(ho, w, floor_w, tol)
        if lam == SHRINK[0]:
            first = losing
        if not losing:
            return w, {"shrink": lam, "losing_as_fitted": first}
    return fitted, {"shrink": None, "losing": first}


def bootstrap_gain(ho: Pools, w: np.ndarray, floor_w: np.ndarray, *, draws: int = 1000,
                   seed: int = 0) -> dict[str, float]:
    """The held-out objective's gain of ``w`` over the floor, with a paired bootstrap over queries
    (each draw resamples the queries of every kind apart, so the kind-averaged objective keeps its
    shape): ``mean``, ``lower`` and ``upper`` (5th and 95th percentiles) and ``p_loss`` (share of
    draws where ``w`` does not gain). The same queries score both mixes, so their difference per
    query is what varies."""
    diff = per_query(ho, w)["nDCG@10"] - per_query(ho, floor_w)["nDCG@10"]
    kinds = [str(k) for k in np.unique(ho.kinds)]
    if not kinds:
        return {"mean": 0.0, "lower": 0.0, "upper": 0.0, "p_loss": 1.0}
    share = np.array([(ho.kind_weights or {}).get(k, 1.0) for k in kinds])
    share = share / share.sum()
    rng = np.random.default_rng(seed)
    total = np.zeros(draws)
    for k, sh in zip(kinds, share):
        d = diff[ho.kinds == k]
        total += sh * d[rng.integers(0, len(d), size=(draws, len(d)))].mean(1)
    mean = float(sum(sh * diff[ho.kinds == k].mean() for k, sh in zip(kinds, share)))
    return {"mean": round(mean, 4), "lower": round(float(np.percentile(total, 5)), 4),
            "upper": round(float(np.percentile(total, 95)), 4), "p_loss": round(float((total <= 0).mean()), 4)}


SHOPPER_KINDS = ("shopper",)  # pseudo-queries shaped as shoppers type them (and a shop's own: ``shop:*``)


def hurting_signals(pools: Pools, w: np.ndarray, *, seed: int = 0) -> dict[str, dict[str, float]]:
    """The signals of ``w`` that shopper-like queries in ``pools`` rank better without, with evidence:
    the bootstrap's 95th percentile of ``w``'s gain over ``w`` without the signal is below 0. The
    other kinds name a category or a value as the records do, so they reward a signal that ranks a
    whole category high; a shopper's short query ("bunk bed") matched to the wrong category ("Beds"
    rather than "Kids Beds") is punished by it. Measured on WANDS's catalogue: graph category and
    colour hurt its shopper pseudo-queries with evidence, as they hurt its real dev queries."""
    kinds = pools.kinds.astype(str)
    rows = np.flatnonzero(np.isin(kinds, SHOPPER_KINDS) | np.char.startswith(kinds, LABELLED_PREFIX))
    if not len(rows):
        return {}
    sub = pools.subset(rows)
    out = {}
    for j in np.flatnonzero(w):
        if SIGNALS[j] == "native":
            continue
        without = w.copy()
        without[j] = 0.0
        if not without[:2].any():
            continue
        ev = bootstrap_gain(sub, w, without, seed=seed)
        if ev["upper"] < 0:
            out[SIGNALS[j]] = ev
    return out


def fit_leaving_out(fit: Pools, samples: list[np.ndarray], starts: list[np.ndarray], active: tuple[int, ...],
                    obj: Objective, *, seed: int = 0, leave_out: tuple[str, ...] = ()
                    ) -> tuple[np.ndarray, list[np.ndarray], dict[str, dict[str, Any]]]:
    """:func:`averaged_fit` with the signals shopper-like queries rank better without left out: each
    sample's mix is checked on its own fit rows (:func:`hurting_signals`, bootstrap seed ``seed`` +
    its number, as a one-sample tune of that seed checks it) and a signal that hurts in any sample
    leaves every sample, the starts included (a start is where descent begins: a left-out signal
    kept there stayed in the mix), and all are fitted again, until none hurts. So a signal left out
    weighs 0 in every sample's mix and in their mean, and a several-sample fit is the mean of the
    one-sample fits made with the same signals left out. Returns the mean, the mixes and the
    signals left out (with their evidence and the sample that showed it)."""
    left = {SIGNALS.index(s) for s in leave_out}
    hurting: dict[str, dict[str, Any]] = {}
    while True:
        keep = np.array([j not in left for j in range(len(SIGNALS))])
        begin = [w * keep for w in starts if (w * keep)[:2].any()]
        mean, mixes = averaged_fit(fit, samples, begin, tuple(j for j in active if j not in left), obj)
        found = {sig: {**ev, "sample": b} for b, (rows, w) in reversed(list(enumerate(zip(samples, mixes))))
                 for sig, ev in hurting_signals(fit.subset(rows), w, seed=seed + b).items()}
        if not found:
            return mean, mixes, hurting
        hurting.update(found)
        left |= {SIGNALS.index(s) for s in found}


def signal_ablation(ho: Pools, fitted: np.ndarray, ho_fitted: float) -> dict[str, float]:
    """What each signal of the fitted mix gains on held-out: the objective without it."""
    ablation = {}
    for j in np.flatnonzero(fitted):
        w = fitted.copy()
        w[j] = 0.0
        if w[:2].any():
            ablation[SIGNALS[j]] = round(ho_fitted - objective(ho, w), 4)
    return ablation


def slots_and_floor(engine: Engine, cal: calibration.Calibration, queries: list[pq.PseudoQuery],
                    ho_rows: np.ndarray, *, slot_queries: int, floor_queries: int,
                    kind_weights: dict[str, float] | None, margin: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """With the chosen mix in place: whether slot filters help (on held-out pseudo-queries) and the
    relevance floor this catalogue's scores support; both set on ``cal``."""
    slots: dict[str, Any] = {"tested": False}
    if engine.understanding is not None and engine.settings.intent.intent_slot_filters and slot_queries:
        sq = slot_sample(queries, ho_rows, slot_queries)
        engine.set_calibration(cal)
        try:
            (off, off_k) = _search_ndcg(engine, sq, False, kind_weights)
            (on, on_k) = _search_ndcg(engine, sq, True, kind_weights)
        finally:
            engine.reload_calibration()
        cal.slot_filters = on > off + margin
        slots = {"tested": True, "queries": len(sq), "nDCG@10_off": round(off, 4), "nDCG@10_on": round(on, 4),
                 "on": cal.slot_filters, "by_kind_off": off_k, "by_kind_on": on_k}
    floor_fit: dict[str, Any] = {"fitted": None}
    if floor_queries:  # the share of a query's top score that counts as matching, on this catalogue
        from vitrine.evals import relevance_floor

        engine.set_calibration(cal)
        try:
            floor_fit = relevance_floor.fit(engine, queries, floor_queries)
        finally:
            engine.reload_calibration()
        cal.relevance_floor = floor_fit["fitted"]
    return slots, floor_fit


def tune(engine: Engine, *, seed: int = 0, heldout: float = 0.4, counts: dict[str, int] | None = None,
         margin: float = 0.005, slot_queries: int = 150, save: bool = True,
         labelled: list[pq.PseudoQuery] | None = None, labelled_share: float = LABELLED_SHARE,
         taxonomy_queries: int | None = None, samples: int | None = None,
         kind_penalty: float | None = None, floor_queries: int = 200, leave_out: tuple[str, ...] = ()) -> TuneResult:
    """Fit the catalogue's text ranking (see the module doc); saves it in the data dir.
    ``labelled``: the shop's own judged queries (kinds ``shop:*``, split fit / held-out,
    :func:`vitrine.evals.pseudo_queries.labelled`), fitted together with the pseudo-queries with
    ``labelled_share`` of the objective; then the fit must also not lose to the floor on their
    held-out part. ``taxonomy_queries``: that many pseudo-queries naming the Google-taxonomy nodes
    the categories map to, in other words than the records' (pseudo_queries ``taxonomy`` kind;
    None: ``tune_taxonomy_queries`` of the engine's settings). ``samples``: fit that many samples of
    pseudo-queries (seeds ``seed``, ``seed + 1``, ...) apart and serve the mean of their mixes (None:
    ``tune_samples`` of the engine's settings; 1: one fit, scaled to sum 1 as each sample's is).
    ``floor_queries``: held-out pseudo-queries the relevance floor is fitted on, searched with the
    chosen mix (vitrine/evals/relevance_floor.py; 0: none, the settings' floor serves). ``leave_out``:
    signals no sample may use (as if the refit had left them out)."""
    t0 = time.time()
    if taxonomy_queries is None:
        taxonomy_queries = engine.settings.search.tune_taxonomy_queries
    docs = catalogue_docs(engine)
    version = calibration.catalogue_version(engine.records, engine.store_id)
    samples = max(1, engine.settings.search.tune_samples if samples is None else samples)
    counts = {**(counts or {}), "taxonomy": taxonomy_queries} if taxonomy_queries else counts
    taxonomy = category_taxonomy(engine) if taxonomy_queries else None
    phrasings = engine.graph.phrasings()
    queries: list[pq.PseudoQuery] = []
    sample_of: list[int] = []  # which sample each query is from (-1: the shop's own, in every sample)
    for b in range(samples):
        got = [q for q in pq.generate(docs, counts=counts, heldout=heldout, seed=seed + b, taxonomy=taxonomy,
                                      phrasings=phrasings) if q.text]
        queries += got
        sample_of += [b] * len(got)
    shop_queries = [q for q in (labelled or []) if q.text]
    queries += shop_queries
    sample_of += [-1] * len(shop_queries)
    kind_weights = labelled_weights(queries, labelled_share)
    fit_rows = np.array([i for i, q in enumerate(queries) if q.split == "fit"], dtype=np.int64)
    ho_rows = np.array([i for i, q in enumerate(queries) if q.split == "heldout"], dtype=np.int64)
    log.info("tune: %d products, %d pseudo-queries (%d fit, %d held out)", len(docs), len(queries),
             len(fit_rows), len(ho_rows))
    pools = build_pools(engine, queries)
    pools.kind_weights = kind_weights
    t_pools = time.time() - t0
    fit, ho = pools.subset(fit_rows), pools.subset(ho_rows)
    floor_w = weights_vec(calibration.FLOOR_WEIGHTS)
    shared_w = weights_vec({"vector": 1.0})
    configured = weights_vec(engine.settings.search.fusion_weights)
    active = usable_signals(fit)
    fit_of = np.array(sample_of, dtype=np.int64)[fit_rows]  # one sample: every fit row, one fit
    penalty = engine.settings.search.tune_kind_penalty if kind_penalty is None else kind_penalty
    fitted, mixes, hurting = fit_leaving_out(fit, [np.flatnonzero((fit_of == b) | (fit_of == -1)) for b in range(samples)],
                                             [floor_w, shared_w, configured], active, Robust(floor_w, penalty),
                                             seed=seed, leave_out=leave_out)
    averaged = fitted  # the mean of the samples' fits, as fitted; ``fitted`` from here on: after the kind guard
    fitted, guard = kind_guard(ho, fitted, floor_w, margin) if penalty > 0 else (fitted, {"off": True})
    fit_obj = objective(fit, fitted)
    ho_floor, ho_fitted = objective(ho, floor_w), objective(ho, fitted)
    # evidence before moving away from the floor: the held-out gain's bootstrap lower bound must be
    # above 0 (not only its mean above ``margin``), or the floor stays
    evidence = bootstrap_gain(ho, fitted, floor_w, seed=seed) if len(ho_rows) else {"lower": 0.0}
    accepted = bool(len(ho_rows)) and ho_fitted > ho_floor + margin and evidence["lower"] > 0 \
        and not guard.get("losing")
    shop: dict[str, Any] = {}
    if kind_weights is not None:
        shop_rows = np.flatnonzero(np.char.startswith(ho.kinds.astype(str), LABELLED_PREFIX))
        shop_ho = ho.subset(shop_rows)
        shop = {"share": labelled_share, "kind_weights": kind_weights,
                "queries": {k: {"fit": int(((fit.kinds == k)).sum()), "heldout": int((ho.kinds == k).sum())}
                            for k in kind_weights if k.startswith(LABELLED_PREFIX)},
                "heldout": {"native_only (floor)": summary(shop_ho, floor_w),
                            "configured_defaults": summary(shop_ho, configured),
                            "fitted": summary(shop_ho, fitted)} if len(shop_rows) else {}}
        if len(shop_rows):  # the shop's own held-out queries must not lose to the floor either
            accepted = accepted and objective(shop_ho, fitted) >= objective(shop_ho, floor_w)
    chosen = fitted if accepted else floor_w
    # what each choice gained on held-out: the fitted mix without each of its signals
    ablation = signal_ablation(ho, fitted, ho_fitted)
    weights = weights_dict(chosen)
    cal = calibration.Calibration(text_weights=weights, slot_filters=False, accepted=accepted,
                                  catalogue=version, model_key=engine.model_key, source="tuned",
                                  created=time.time())
    slots, floor_fit = slots_and_floor(engine, cal, queries, ho_rows, slot_queries=slot_queries,
                                       floor_queries=floor_queries, kind_weights=kind_weights, margin=margin)
    report = {
        "catalogue": version, "model_key": engine.model_key, "products": len(docs),
        "queries": {"total": len(queries), "fit": len(fit_rows), "heldout": len(ho_rows),
                    "by_kind": {str(k): int((pools.kinds == k).sum()) for k in np.unique(pools.kinds)}},
        "signals_seen": [SIGNALS[j] for j in active],
        "fitted": weights_dict(averaged), "guarded": weights_dict(fitted), "fit_objective": round(fit_obj, 4),
        "accepted": accepted, "margin": margin,
        "samples": [rounded(weights_dict(w)) for w in mixes],
        "chosen": weights,
        "heldout": {"native_only (floor)": summary(ho, floor_w), "shared_only": summary(ho, shared_w),
                    "configured_defaults": summary(ho, configured), "fitted": summary(ho, fitted)},
        "fit": {"native_only (floor)": summary(fit, floor_w), "fitted": summary(fit, fitted)},
        "heldout_gain_per_signal": ablation, "slot_filters": slots, "labelled": shop, "relevance_floor": floor_fit,
        "kind_guard": {"penalty": penalty, **guard}, "evidence": evidence, "signals_left_out": hurting,
        "seconds": {"pools": round(t_pools, 1), "total": round(time.time() - t0, 1)},
    }
    cal.summary = {"heldout_floor": round(ho_floor, 4), "heldout_fitted": round(ho_fitted, 4),
                   "queries": len(queries), "slot_filters": slots,
                   "relevance_floor": {k: v for k, v in floor_fit.items() if k != "curve"},
                   "labelled": {k: v for k, v in shop.items() if k in ("share", "queries")}}
    out = TuneResult(cal, report)
    if save:
        out.path = calibration.save(engine.data_dir, cal)
        engine.reload_calibration()
    log.info("tune: fitted %s; held-out objective floor %.4f, fitted %.4f: %s (%.0fs)", weights_dict(fitted),
             ho_floor, ho_fitted, "accepted" if accepted else "floor kept", time.time() - t0)
    return out
