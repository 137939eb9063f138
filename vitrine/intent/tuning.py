"""The intent classifier learns a shop's own product names (the hook ``vitrine tune`` calls).

A catalogue's titles join the generated training queries: as bare searches (a title typed as a
query is a search) and as the product inside every intent's templates ("add <title> to my
cart", "how do I return <title>"), beside Google's taxonomy and the bundled catalogue's
vocabulary. The classifier is then retrained (the same generator, seed and held-out sets, so
its figures compare with the shipped ones) and written to ``out``, a folder that
``VITRINE_INTENT_MODEL`` can name. Retraining costs what ``vitrine train intent`` costs (about
six minutes of one core per member); ``members`` and ``epochs`` trade accuracy for time.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from vitrine.errors import InvalidInput

log = logging.getLogger(__name__)

MAX_TITLES = 20_000  # enough variety; more only slows the generator


def catalogue_titles(records: Iterable[dict[str, Any]], limit: int = MAX_TITLES) -> list[str]:
    """Distinct product titles of catalogue records (dicts with a ``title``), at most ``limit``
    (every n-th when there are more, so the whole catalogue is sampled)."""
    seen: dict[str, str] = {}
    for r in records:
        t = " ".join(str(r.get("title") or "").split())
        if t:
            seen.setdefault(t.casefold(), t)
    titles = list(seen.values())
    if len(titles) > limit:
        step = len(titles) / limit
        titles = [titles[int(i * step)] for i in range(limit)]
    return titles


def tune_intent(titles: Iterable[str], out: Path, *, members: int = 5, epochs: int | None = None,
                train_per_label: int | None = None, cache_dir: Path | None = None, seed: int = 0,
                threads: int = 1) -> dict[str, Any]:
    """Retrain the intent classifier with ``titles`` (a catalogue's product titles) added to the
    training queries; write it to ``out`` and return the training summary (validation,
    held-out accuracy, held-out titles and taxonomy leaves read as search)."""
    from vitrine.intent.training import DEFAULTS, train_intent  # noqa: PLC0415 - torch only when called

    extra = [t for t in (" ".join(str(t).split()) for t in titles) if t]
    if not extra:
        raise InvalidInput("no titles to tune the intent classifier on")
    log.info("retraining the intent classifier with %d catalogue titles (%d members)", len(extra), members)
    return train_intent(Path(out), seed=seed, epochs=epochs or DEFAULTS["epochs"], cache_dir=cache_dir,
                        train_per_label=train_per_label or DEFAULTS["train_per_label"], members=members,
                        extra_titles=extra[:MAX_TITLES], threads=threads, progress=False)
