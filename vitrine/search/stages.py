"""Stages: the jobs a shop does around a ranking, as the read path sees them (docs/design.md, "Rooms").

The read path ranks; what a shop does around a search (a shopping session's standing query, the
re-ranking learned from clicks, merchandising rules, and whatever comes next) lives in packages of
its own (vitrine/conversation, vitrine/feedback, vitrine/merchandising) and reaches a search through
this one interface. The read path calls every stage of its list at the same four points, in list
order, without naming any of them:

- :meth:`Stage.before`: before ranking; may rewrite the search (``underway.req``, ``.text``,
  ``.image``) and add query vectors (``underway.vectors``);
- :meth:`Stage.after`: on the ranked pool (every page's candidates, best first); returns the pool,
  re-ordered, shortened or extended; may say how many of its head match (``underway.matching``);
- :meth:`Stage.mark`: on each hit of the page (``iid`` is the product's internal id);
- :meth:`Stage.finish`: on the response, before it is returned.

Each hook defaults to doing nothing, so a stage implements only what it needs. A stage never breaks
a search: what it cannot do it logs and skips. The list itself is the engine's (``STAGES`` in
vitrine/search/engine.py): adding a job around a search is one module with a :class:`Stage`
and one line there. What a stage needs per search travels in the :class:`Underway` it is handed
(``notes`` keeps a stage's own per-search values under its ``name``), never in globals.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from vitrine.search.models import Hit, Ranked, SearchRequest, SearchResponse
from vitrine.search.read_context import ReadContext

if TYPE_CHECKING:
    from vitrine.search.understanding import Plan, QueryUnderstanding


@dataclass
class Underway:
    """One search as it passes the stages: the request as it will run, and what stages add."""

    req: SearchRequest
    text: str | None
    image: bytes | None
    vectors: dict[str, np.ndarray] = field(default_factory=dict)  # query vectors a stage supplies
    plan: Plan | None = None  # intent + slots, once read
    allowed: np.ndarray | None = None  # the ids the search's own filters allow (None: all)
    matching: int | None = None  # how many of the pool's head match (None: the relevance floor says)
    response: dict[str, Any] = field(default_factory=dict)  # fields stages add to the response
    notes: dict[str, Any] = field(default_factory=dict)  # a stage's own per-search values, by stage name


class Stage:
    """A job around a search (see the module docstring). Subclasses override the hooks they need."""

    name = "stage"

    def before(self, underway: Underway) -> None:
        """Before ranking: rewrite the search or add query vectors."""

    def after(self, underway: Underway, ranked: Ranked) -> Ranked:
        """After ranking: the pool, as this stage leaves it."""
        return ranked

    def mark(self, underway: Underway, hit: Hit, iid: int) -> None:
        """Each hit of the page, once built."""

    def finish(self, underway: Underway, resp: SearchResponse) -> None:
        """The response, before it is returned."""

    def close(self) -> None:
        """Release what the stage holds (a store's connection)."""


# A stage is built once per read path from the read context and the query understanding (None: intent off).
StageFactory = Callable[[ReadContext, "QueryUnderstanding | None"], Stage]
