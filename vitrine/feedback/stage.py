"""The re-ranking learned from shoppers' clicks as a stage of every search (vitrine/search/stages.py):
a text query that `vitrine tune` learned from is re-ordered by its products' evidence
(vitrine/feedback/intake.py serves the table, vitrine/feedback/learning.py fits it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vitrine.feedback.intake import LearnedQueries, rerank
from vitrine.feedback.rocchio import Generaliser
from vitrine.search import variants
from vitrine.search.models import Ranked
from vitrine.search.read_context import ReadContext
from vitrine.search.stages import Stage, Underway

if TYPE_CHECKING:
    from vitrine.search.understanding import QueryUnderstanding


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
        ranked = rerank(ranked, self.learned.boosts_for(underway.text, self._iids_of), weight)
        if weight <= 0:
            return ranked
        fs = self.reader.settings.feedback
        return self.past_page.apply(self.learned.table(), underway.text, ranked, underway.allowed,
                                    rocchio_weight=fs.learn_rocchio_weight, category_weight=fs.learn_category_weight,
                                    transfer_similarity=fs.learn_transfer_similarity)
