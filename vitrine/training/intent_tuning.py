"""The intent classifier learns a shop's own product names (the hook ``vitrine tune`` calls).

A catalogue's titles join the generated training queries: as bare searches (a title typed as a
query is a search) and as the product inside every intent's templates ("add <title> to my
cart", "how do I return <title>"), beside Google's taxonomy and the bundled catalogue's
vocabulary (half of the titles drawn are the shop's). The classifier then learns them (the same
generator and held-out sets, so its figures compare with the shipped ones) and is written to
``out``, a folder that ``VITRINE_INTENT_MODEL`` can name. By default the shipped members are fine-tuned (a few
core-minutes each); retraining from scratch costs what ``vitrine train intent`` costs (about six
core-minutes per member).
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


def tune_intent(titles: Iterable[str], out: Path, *, base: str | Path = "default", retrain: bool = False,
                members: int = 5, epochs: int | None = None, train_per_label: int | None = None,
                cache_dir: Path | None = None, seed: int = 0, threads: int = 1) -> dict[str, Any]:
    """Teach the intent classifier a catalogue's product titles (``titles``) and write it to
    ``out``; returns the summary (validation, held-out accuracy, held-out titles and taxonomy
    leaves read as search).

    By default the members of ``base`` are fine-tuned on a fresh draw of the generator with the
    titles in it (:mod:`vitrine.training.intent_finetune`, a few core-minutes per member), then measured and
    shipped together (:func:`vitrine.training.intent.assemble_members`). ``retrain=True`` trains
    ``members`` new members from scratch instead (about six core-minutes per member)."""
    extra = [t for t in (" ".join(str(t).split()) for t in titles) if t][:MAX_TITLES]
    if not extra:
        raise InvalidInput("no titles to tune the intent classifier on")
    log.info("teaching the intent classifier %d catalogue titles (%s)", len(extra),
             "retraining" if retrain else f"fine-tuning {base}")
    if retrain:
        from vitrine.training.intent import DEFAULTS, train_intent  # torch only when called

        return train_intent(Path(out), seed=seed, epochs=epochs or DEFAULTS["epochs"], cache_dir=cache_dir,
                            train_per_label=train_per_label or DEFAULTS["train_per_label"], members=members,
                            extra_titles=extra, threads=threads, progress=False)
    import torch

    from vitrine.training.intent_finetune import FINETUNE_DEFAULTS, finetune_members
    from vitrine.training.intent import assemble_members

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        finetune_members(base, Path(out), seed=seed, cache_dir=cache_dir, extra_titles=extra,
                         epochs=epochs or FINETUNE_DEFAULTS["epochs"],
                         train_per_label=train_per_label or FINETUNE_DEFAULTS["train_per_label"])
        return assemble_members(Path(out), cache_dir=cache_dir, extra_titles=extra)
    finally:
        torch.set_num_threads(before)
