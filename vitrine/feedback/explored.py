"""What the search log keeps of an explored page (vitrine/feedback/explore.py, the stage that explores)
and what analytics reads of it: light, so a process that only reads the log (analytics, the intake of
events: vitrine/web/sideproc.py) never loads the search stack."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vitrine.feedback.types import EventLogAPI

EXPERIMENT = "explore"  # the search log's experiment name for an explored page


@dataclass(frozen=True)
class Explored:
    """One explored page: the product, the rank it came from, the page slot it took, its propensity."""

    product_id: str
    from_rank: int
    position: int
    propensity: float

    def variant(self) -> str:
        return variant_of(self.from_rank, self.position, self.propensity)

    @classmethod
    def of_variant(cls, product_id: str, variant: str) -> Explored | None:
        try:
            ranks, p = variant.split("@")
            a, b = ranks.split(">")
            return cls(product_id, int(a), int(b), float(p))
        except ValueError:
            return None


def variant_of(from_rank: int, position: int, propensity: float) -> str:
    """The search log's variant of an explored page (its experiment: :data:`EXPERIMENT`)."""
    return f"{from_rank}>{position}@{propensity:.6g}"


def figures(log: EventLogAPI, since: float, until: float) -> dict[str, Any]:
    """Explored pages in [since, until) and the clicks on their explored product (analytics). Only the
    explored searches and their clicks are read (``experiment_searches``, in the store): an analytics
    read never loads the whole log into this process (it would hold searches back while it did)."""
    rows, clicks = log.experiment_searches(EXPERIMENT, since, until)
    shown: dict[str, Explored] = {}
    for qid, ids, variant in rows:
        if variant:
            tag = Explored.of_variant("", variant)
            if tag is not None and 0 <= tag.position < len(ids):
                shown[qid] = Explored(ids[tag.position], tag.from_rank, tag.position, tag.propensity)
    clicked = {q for q, p in clicks if q in shown and p == shown[q].product_id}
    return {"impressions": len(shown), "clicks": len(clicked),
            "ctr": round(len(clicked) / len(shown), 6) if shown else None}
