"""The merchandising rules as a stage of every search (vitrine/search/stages.py): after ranking,
the rules that hold re-order, pin, hide and filter the whole pool, so every page, sort and facet
agrees with them; each hit names the rules that moved it, and the response the rules that fired
(vitrine/merchandising/rules.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vitrine.merchandising.rules import Outcome, RuleBook
from vitrine.merchandising.store import open_rule_store
from vitrine.search import variants
from vitrine.search.models import Hit, Ranked, SearchResponse
from vitrine.search.read_context import ReadContext
from vitrine.search.stages import Stage, Underway

if TYPE_CHECKING:
    from vitrine.search.understanding import QueryUnderstanding


class RulesStage(Stage):
    """A shop's rules over the ranking; ``book`` is the rule book the API and CLI edit."""

    name = "rules"

    def __init__(self, reader: ReadContext, book: RuleBook) -> None:
        self.reader, self.book = reader, book

    @classmethod
    def open(cls, reader: ReadContext, understanding: QueryUnderstanding | None = None) -> RulesStage:
        s = reader.settings
        return cls(reader, RuleBook(open_rule_store(s.storage.store, s.storage.data_dir), reader.state, s.search))

    def after(self, underway: Underway, ranked: Ranked) -> Ranked:
        ruled = self.book.apply(self.reader, underway.req, underway.text, underway.plan, ranked,
                                variant=variants.rules_variant(), allowed=underway.allowed)
        underway.notes[self.name] = ruled
        if ruled.matching is not None:
            underway.matching = ruled.matching
        underway.response.update(ruled.response_fields())
        return ruled.ranked

    def mark(self, underway: Underway, hit: Hit, iid: int) -> None:
        ruled: Outcome | None = underway.notes.get(self.name)
        if ruled is not None:
            ruled.mark(hit, iid)

    def finish(self, underway: Underway, resp: SearchResponse) -> None:
        return None

    def close(self) -> None:
        self.book.store.close()  # the rule store's connection (vitrine/merchandising/store.py)
