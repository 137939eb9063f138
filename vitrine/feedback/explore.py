"""Exploration: a small share of head-query pages shows one product from below the fold, so the log
learns about what a ten-result page never shows (docs/learning.md, "Exploration").

A shopper can only click what was shown; a re-ranking learned from clicks never hears about a
relevant product at rank 30. On a share ``explore_share`` of a shopper's first pages (a search with a ``user`` or
``session``: where events come back; an anonymous API call, and a search in an A/B experiment (it would blur the comparison), are never explored, so scripted and
evaluation searches stay deterministic) of head queries (a query the served learned table holds,
or one this process has answered ``explore_head_searches`` times),
the stage moves one product, drawn uniformly from ranks 11-50 of the pool, into a slot of the page
drawn uniformly. That choice has a known probability (its propensity: ``share / (ranks) / k``),
logged with the search (``experiment`` ``explore``, ``variant`` ``<from rank>><slot>@<propensity>``)
and returned in the response's ``exploration``, so an inverse-propensity estimate can count a
click on it. The scores stay where they were (the n-th hit keeps the n-th best score), so totals
and facets do not move. ``explore_share`` 0 turns it off (per catalogue: its settings).
"""

from __future__ import annotations

import hashlib
import random
import threading
from collections import Counter
from typing import TYPE_CHECKING

from vitrine.feedback.intake import LearnedQueries
from vitrine.index.querytext import normalise_query
from vitrine.search.models import Hit, Ranked
from vitrine.search.read_context import ReadContext
from vitrine.search import variants
from vitrine.search.stages import Stage, Underway

if TYPE_CHECKING:
    from vitrine.search.understanding import QueryUnderstanding

LOW, HIGH = 10, 50  # 0-based ranks the explored product comes from (11-50)


def draw(rng: random.Random, share: float, pool: int, k: int) -> tuple[int, int, float] | None:
    """Whether this page explores, and if so (from rank, page slot, propensity); None when it does
    not (or the pool has nothing below the page)."""
    hi = min(HIGH, pool)
    if share <= 0 or hi <= max(LOW, k) or rng.random() >= share:
        return None
    lo = max(LOW, k)
    src, slot = rng.randrange(lo, hi), rng.randrange(k)
    return src, slot, share / (hi - lo) / k


def move(ranked: Ranked, src: int, slot: int) -> Ranked:
    """``ranked`` with its ``src``-th product in place ``slot``, the scores where they were."""
    order = list(ranked)
    item = order.pop(src)
    order.insert(slot, item)
    return [(iid, score, {**parts, "explored": 1.0} if n == slot else parts)
            for n, ((iid, _, parts), (_, score, _)) in enumerate(zip(order, ranked))]


class ExploreStage(Stage):
    """The exploration of head-query pages (see the module docstring)."""

    name = "explore"

    def __init__(self, reader: ReadContext, learned: LearnedQueries, rng: random.Random | None = None) -> None:
        self.reader, self.learned = reader, learned
        self.rng = rng or random.Random()
        # every replica draws the same for one shopper and query (a test may pass its own rng to vary it)
        self.salt = rng.getrandbits(64) if rng is not None else 0
        self._seen: Counter[str] = Counter()
        self._lock = threading.Lock()

    @classmethod
    def open(cls, reader: ReadContext, understanding: QueryUnderstanding | None = None) -> ExploreStage:
        return cls(reader, LearnedQueries(reader.data_dir, reader.settings.feedback))

    def head(self, norm: str) -> bool:
        """Whether ``norm`` is a head query: the served table holds it, or it was searched often here."""
        with self._lock:
            self._seen[norm] += 1
            n = self._seen[norm]
            if len(self._seen) > 100_000:  # bounded: forget the tail
                self._seen = Counter(dict(self._seen.most_common(10_000)))
        table = self.learned.table()
        return n >= self.reader.settings.feedback.explore_head_searches or (table is not None and norm in table.queries)

    def after(self, underway: Underway, ranked: Ranked) -> Ranked:
        req, fs = underway.req, self.reader.settings.feedback
        if (fs.explore_share <= 0 or not underway.text or underway.image is not None or req.offset != 0
                or req.sort != "relevance" or not (req.user or req.session) or variants.current() is not None
                or not self.head(normalise_query(underway.text))):
            return ranked
        # the draw is a function of the shopper and the words: the same shopper repeating a search sees
        # the same page (sticky, like an experiment's assignment), and the propensity holds over shoppers
        seed = hashlib.sha256(f"{req.user or ''}\x1f{req.session or ''}\x1f{normalise_query(underway.text)}"
                              f"\x1f{self.salt}".encode()).digest()
        got = draw(random.Random(seed), fs.explore_share, len(ranked), req.k)
        if got is None:
            return ranked
        src, slot, p = got
        underway.notes[self.name] = (ranked[src][0], src, slot, p)
        return move(ranked, src, slot)

    def mark(self, underway: Underway, hit: Hit, iid: int) -> None:
        note = underway.notes.get(self.name)
        if note is not None and note[0] == iid:
            underway.response["exploration"] = {"product_id": hit.id, "from_rank": note[1], "position": note[2],
                                                "propensity": note[3]}
