"""The re-ranking learned from shoppers' clicks as a stage of every search (vitrine/search/stages.py):
a text query that `vitrine tune` learned from is re-ordered by its products' evidence
(vitrine/feedback/intake.py serves the table, vitrine/feedback/learning.py fits it), moved past the
page by what its shoppers chose (vitrine/feedback/rocchio.py), and, when the served table carries
one, ordered by the learned ranker (vitrine/feedback/ltr.py)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from vitrine.feedback import ltr
from vitrine.feedback.intake import LearnedQueries, LearnedTable, rerank
from vitrine.feedback.rocchio import Generaliser, leaf
from vitrine.index.querytext import normalise_query
from vitrine.search import variants
from vitrine.search.models import Ranked
from vitrine.search.read_context import ReadContext
from vitrine.search.stages import Stage, Underway

if TYPE_CHECKING:
    from vitrine.search.understanding import QueryUnderstanding

OWN_PARTS = ("learned", "past_page", "ranker")  # what learning adds to a product's parts: not fusion signals


class LearnedRerank(Stage):
    """Per head query, products moved by what shoppers chose; ``learned`` is the served table."""

    name = "learned"

    def __init__(self, reader: ReadContext, learned: LearnedQueries) -> None:
        self.reader, self.learned = reader, learned
        self.past_page = Generaliser(reader)  # what the table's choices say about unshown products, unlogged queries

    @classmethod
    def open(cls, reader: ReadContext, understanding: QueryUnderstanding | None = None) -> LearnedRerank:
        return cls(reader, LearnedQueries(reader.data_dir, reader.settings.feedback))

    def _iids_of(self, pids: list[str]) -> dict[str, int]:
        return {p: int(r.iid) for p, r in self.reader.state.records.get_many(pids).items() if r.iid is not None}

    def after(self, underway: Underway, ranked: Ranked) -> Ranked:
        if not underway.text or underway.image is not None:  # a text query's learned re-ranking only
            return ranked
        weight = variants.learn_weight(self.reader.settings.feedback.learn_weight)  # a variant's own
        boosts = self.learned.boosts_for(underway.text, self._iids_of)
        served = rerank(ranked, boosts, weight)
        if weight <= 0 or not ranked:
            return served
        fs = self.reader.settings.feedback
        table = self.learned.table()
        served = self.past_page.apply(table, underway.text, served, underway.allowed,
                                      rocchio_weight=fs.learn_rocchio_weight, category_weight=fs.learn_category_weight,
                                      transfer_similarity=fs.learn_transfer_similarity)
        sink = self.learned.captured()  # learning collects the rows a ranker trains on
        ranker = table.ranker if table is not None and fs.learn_ranker else None
        if ranker is None and sink is None:
            return served
        rows = self.rows(table, underway.text, ranked, served, boosts)
        if sink is not None:
            sink.append((normalise_query(underway.text), rows))
        return ltr.reorder(served, ranker.predict(rows)) if ranker is not None else served

    def rows(self, table: LearnedTable | None, text: str, fused: Ranked, served: Ranked,
             boosts: Mapping[int, float]) -> list[ltr.Row]:
        """The ranker's rows of ``served``'s first :data:`ltr.DEPTH` products (vitrine/feedback/ltr.py):
        ``fused`` is the pool as fusion ranked it, ``boosts`` the query's learned evidence."""
        pool = served[:ltr.DEPTH]
        recs = self.reader.state.records.get_by_iids([iid for iid, _, _ in pool])
        rank = {iid: n for n, (iid, _, _) in enumerate(fused)}
        score = {iid: (float(s), parts) for iid, s, parts in fused}
        top = [float(s) for _, s, _ in fused[:50]]
        spread = max(top[0] - top[-1], 1e-6)
        last = float(fused[-1][1])
        strength, affinity = 0.0, {}
        got = (self.past_page.source(table, text, self.reader.settings.feedback.learn_transfer_similarity)
               if table is not None else None)
        if table is not None and got is not None:
            prof = self.past_page.profile_of(table, got[0])
            strength, affinity = got[1], (prof.affinity if prof is not None else {})
        out = []
        for n, (iid, _, parts) in enumerate(pool):
            rec = recs.get(iid)
            cat = leaf(rec.doc) if rec is not None else ""
            s, own = score.get(iid, (last, {}))
            values = {"fused": (s - top[0]) / spread, "fused_rank": math.log1p(rank.get(iid, len(fused))),
                      "learned_rank": math.log1p(n), "boost": float(boosts.get(iid, 0.0)),
                      "rocchio": float(parts.get("past_page", 0.0)) / spread,
                      "category_affinity": strength * affinity.get(cat, 0.0), "logged": strength}
            values.update({f"signal:{k}": float(v) for k, v in own.items() if k not in OWN_PARTS})
            out.append(ltr.Row(rec.id if rec is not None else "", cat, values))
        return out
