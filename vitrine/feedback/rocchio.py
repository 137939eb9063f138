"""Learning from clicks past the page: what shoppers chose for a query carried to products nobody
was shown, and to queries nobody logged (docs/learning.md, "Past the page").

A shopper who is shown ten results can only click those ten, so a per-query re-ranking of what was
shown (vitrine/feedback/clicks.py) cannot reach the relevant products below the fold. Three
effects, applied by the learned re-ranking's stage (vitrine/feedback/stage.py) from the same
served table, so the acceptance test of vitrine/feedback/learning.py judges them with it:

- **Rocchio feedback** (Rocchio, 1971): a logged query's vector is moved toward the mean of its
  chosen products' vectors in the text tower's own space (weighted by their evidence). Products
  near that centroid, shown or not, rise: the centroid's nearest products join the pool and every
  pool product's key moves by ``rocchio_weight`` times its similarity to the centroid (scaled to
  [-1, 1] within the pool: the most similar +1), in units of the pool's top score spread.
- **Category affinity**: the share of a query's chosen evidence in each leaf category; a product
  of that category moves by ``category_weight`` times that share.
- **Transfer**: a query nobody logged borrows the centroid and affinity of its nearest logged query
  (cosine of the two queries' text-tower vectors) when that similarity reaches
  ``transfer_similarity``, weighted by how far above it the similarity is (0 at the threshold,
  1 at identical), so a loosely related query is barely moved.

Scores stay where they were (the n-th hit keeps the n-th best score; products the centroid
brought in take the pool's last score), so the relevance floor and totals move as little as a
re-ranking does.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from vitrine.feedback import clicks
from vitrine.feedback.intake import LearnedTable
from vitrine.index.querytext import normalise_query
from vitrine.search.models import Ranked
from vitrine.search.read_context import ReadContext

log = logging.getLogger(__name__)

NEIGHBOURS = 50  # the centroid's nearest products that join the pool


@dataclass
class Profile:
    """What one logged query's choices say: a unit centroid in the text tower's space and the share
    of its chosen evidence per leaf category."""

    centroid: np.ndarray
    affinity: dict[str, float]
    # how far the evidence reaches the clip (its strongest product's score / the clip, at most 1):
    # a few clients' shrunk scores (vitrine/feedback/clicks.py) move the profile as little as the table
    confidence: float = 1.0


def leaf(doc: Mapping[str, object]) -> str:
    """A product's leaf category (the last element of its category path), '' when it has none."""
    cat = doc.get("category")
    if isinstance(cat, (list, tuple)):
        return str(cat[-1]) if cat else ""
    return str(cat or "")


def unit(v: np.ndarray) -> np.ndarray:
    n = float(np.linalg.norm(v))
    return v / n if n > 0 else v


def profile(reader: ReadContext, chosen: Mapping[str, float]) -> Profile | None:
    """The profile of a query's chosen products (product id -> positive evidence), None when none
    of them is in the index."""
    rows = reader.state.records.get_many(list(chosen))
    iids = [int(r.iid) for r in rows.values() if r.iid is not None]
    if not iids:
        return None
    vecs = reader.state.native.index.get(iids)
    by_iid = {int(r.iid): p for p, r in rows.items() if r.iid is not None}
    w = np.array([chosen[by_iid[i]] for i in iids], dtype=np.float32)
    centroid = unit((w[:, None] * np.asarray(vecs, dtype=np.float32)).sum(0))
    total = float(w.sum())
    affinity: dict[str, float] = {}
    for p, r in rows.items():
        c = leaf(r.doc)
        if c:
            affinity[c] = affinity.get(c, 0.0) + chosen[p] / total
    return Profile(centroid, affinity, min(1.0, max(chosen.values()) / clicks.Z_RANGE[1]))


class Generaliser:
    """Profiles of a served table's queries, built on first use and kept while that table serves."""

    def __init__(self, reader: ReadContext) -> None:
        self.reader = reader
        self._lock = threading.Lock()
        self._table: LearnedTable | None = None
        self._profiles: dict[str, Profile | None] = {}
        self._logged: tuple[list[str], np.ndarray] | None = None

    def _for(self, table: LearnedTable) -> None:
        with self._lock:
            if table is not self._table:
                self._table, self._profiles, self._logged = table, {}, None

    def profile_of(self, table: LearnedTable, norm: str) -> Profile | None:
        self._for(table)
        if norm not in self._profiles:
            chosen = {p: v for p, v in table.queries.get(norm, {}).items() if v > 0}
            self._profiles[norm] = profile(self.reader, chosen) if chosen else None
        return self._profiles[norm]

    def nearest(self, table: LearnedTable, text: str) -> tuple[str, float] | None:
        """The logged query nearest ``text`` in the text tower's space, with its cosine."""
        self._for(table)
        rd = self.reader
        q = rd.native_query_vector(text)
        if q is None or not table.queries:
            return None
        if self._logged is None:
            norms = [n for n in table.queries if any(v > 0 for v in table.queries[n].values())]
            if not norms:
                return None
            mat = np.stack([unit(np.asarray(rd.native_query_vector(n), dtype=np.float32)) for n in norms])
            self._logged = (norms, mat)
        norms, mat = self._logged
        sims = mat @ unit(np.asarray(q, dtype=np.float32))
        best = int(np.argmax(sims))
        return norms[best], float(sims[best])

    def source(self, table: LearnedTable, text: str, transfer_similarity: float) -> tuple[str, float] | None:
        """The logged query whose profile ``text`` takes, with the strength it takes it at: itself at
        1 when logged, else its nearest logged query at ``(cosine - threshold) / (1 - threshold)``
        when the cosine reaches ``transfer_similarity``; None when neither."""
        norm = normalise_query(text)
        if norm in table.queries:
            return norm, 1.0
        if transfer_similarity >= 1.0:
            return None
        near = self.nearest(table, text)
        if near is None or near[1] < transfer_similarity:
            return None
        return near[0], (near[1] - transfer_similarity) / max(1.0 - transfer_similarity, 1e-6)

    def apply(self, table: LearnedTable | None, text: str, ranked: Ranked, allowed: np.ndarray | None, *,
              rocchio_weight: float, category_weight: float, transfer_similarity: float) -> Ranked:
        """``ranked`` moved by the profile of ``text``'s logged query, or of its nearest logged one
        (see the module docstring); as it was when neither applies."""
        if table is None or not ranked or (rocchio_weight <= 0 and category_weight <= 0):
            return ranked
        got = self.source(table, text, transfer_similarity)
        if got is None:
            return ranked
        source, strength = got
        prof = self.profile_of(table, source)
        if prof is None or strength <= 0:
            return ranked
        return shift(self.reader, ranked, prof, allowed, strength * prof.confidence * table.decay(),
                     rocchio_weight=rocchio_weight, category_weight=category_weight)


def shift(reader: ReadContext, ranked: Ranked, prof: Profile, allowed: np.ndarray | None, strength: float, *,
          rocchio_weight: float, category_weight: float) -> Ranked:
    """The pool, extended by the centroid's nearest products and re-keyed (the module docstring)."""
    native = reader.state.native.index
    present = {iid for iid, _, _ in ranked}
    extra: list[int] = []
    if rocchio_weight > 0:
        _, ids = native.search(prof.centroid[None].astype(np.float32), NEIGHBOURS, allowed)
        extra = [int(i) for i in ids[0].tolist() if i >= 0 and int(i) not in present]
    last = float(ranked[-1][1])
    pool = list(ranked) + [(i, last, {}) for i in extra]
    iids = [iid for iid, _, _ in pool]
    top = [float(s) for _, s, _ in ranked[:50]]
    spread = max(top[0] - top[-1], 1e-6)
    move = np.zeros(len(pool))
    if rocchio_weight > 0:
        sims = np.asarray(native.get(iids), dtype=np.float32) @ prof.centroid
        mid = float(np.median(sims))
        scale = max(float(sims.max()) - mid, 1e-6)
        move += rocchio_weight * np.clip((sims - mid) / scale, -1.0, 1.0)
    if category_weight > 0 and prof.affinity:
        rows = reader.state.records.get_by_iids(iids)
        move += category_weight * np.array([prof.affinity.get(leaf(rows[i].doc), 0.0) if i in rows else 0.0
                                            for i in iids])
    move *= strength * spread
    keyed = sorted(range(len(pool)), key=lambda n: (-(float(pool[n][1]) + move[n]), n))
    scores = sorted((float(s) for _, s, _ in pool), reverse=True)
    out: Ranked = []
    for score, n in zip(scores, keyed):
        iid, _, parts = pool[n]
        out.append((iid, score, {**parts, "past_page": round(float(move[n]), 6)} if move[n] else parts))
    return out
