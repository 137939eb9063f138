"""The ranking configuration of one search in an experiment (vitrine/experiments/runner.py).

A search in an experiment runs with its variant's overrides set in a :class:`contextvars.ContextVar`
for the duration of that search only (the search runs in one worker thread from start to end), so
concurrent searches in other variants, or in none, are never affected. The read path consults it
in three places: :attr:`ReadContext.calibration <vitrine.search.read_context.ReadContext.calibration>` (the text
ranking's weights: ``calibration=floor``, a ``tuning`` file, ``fusion_weights``), the learned
per-query re-ranking's weight (``learn_weight``), and the merchandising rules' ``variant``
condition (the variant's ``rules`` tag, else its name).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from vitrine.search.calibration import Calibration


@dataclass(frozen=True)
class RankingOverride:
    """What a variant changes in the ranking (None: as configured)."""

    experiment: str
    variant: str
    calibration: Calibration | None = None
    learn_weight: float | None = None
    rules: str | None = None


_CURRENT: ContextVar[RankingOverride | None] = ContextVar("vitrine_ranking_override", default=None)


def current() -> RankingOverride | None:
    """The override of the search running in this context (None: not in an experiment)."""
    return _CURRENT.get()


@contextmanager
def ranking(override: RankingOverride | None) -> Iterator[None]:
    """Rank with ``override`` inside the block (this context only)."""
    token = _CURRENT.set(override)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def calibration() -> Calibration | None:
    ov = _CURRENT.get()
    return ov.calibration if ov is not None else None


def learn_weight(default: float) -> float:
    """The learned re-ranking's weight for this search (the variant's, else ``default``)."""
    ov = _CURRENT.get()
    return default if ov is None or ov.learn_weight is None else ov.learn_weight


def rules_variant() -> str | None:
    """What merchandising rules' ``variant`` condition matches for this search: the variant's
    ``rules`` tag, else its name (None: not in an experiment)."""
    ov = _CURRENT.get()
    return None if ov is None else (ov.rules or ov.variant)
