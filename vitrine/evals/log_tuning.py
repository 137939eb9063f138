"""`vitrine tune` on the search log (vitrine/feedback/learning.py learns and judges the per-query
re-ranking); here the whole log's head queries, with the products shoppers clearly chose, also
become labelled queries (kind ``shop:logs``) for the catalogue's fusion tune
(vitrine/evals/tuning.py), which holds out part of them by query and keeps a fitted mix only if
it does not lose to the floor there, so logged queries inform how never-logged queries rank too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from vitrine.evals import pseudo_queries as pq
from vitrine.search.engine import Engine
from vitrine.feedback.intake import LearnedTable

log = logging.getLogger(__name__)

CHOSEN = 0.5  # a product whose score is at least this is "clearly chosen" (a labelled relevant one)


@dataclass
class LogTuneResult:
    table: LearnedTable | None
    labelled: list[pq.PseudoQuery] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)


def tune_from_logs(engine: Engine, *, heldout: float = 0.3, now: float | None = None, save: bool = True,
                   seed: int = 0) -> LogTuneResult:
    """Learn from the engine's search log; the labelled queries its clear choices make."""
    res = engine.learn_from_log(heldout=heldout, now=now, save=save)
    rows = [(f"log:{q}", res.texts.get(q, q), {d: 1.0 for d, z in boosts.items() if z >= CHOSEN})
            for q, boosts in (res.full.queries.items() if res.full is not None else ())]
    labelled = pq.labelled(rows, kind="shop:logs", seed=seed)
    report = {**res.report, "labelled_queries": len(labelled)}
    return LogTuneResult(res.table, labelled, report)
