"""The intent decision rule: from the ensemble's probabilities to the label the engine acts on.

1. The top label, if its probability reaches ``min_confidence``; else ``search``.
2. **The lexical prior** (vitrine/intent/cues.py): a non-search label stands only when the query
   holds a cue word of some non-search intent (or is Chinese text); a phrase of product words alone
   is a search.

The rule's setting (whether the prior is on, how many typo edits a cue word forgives, which
templates give the cue words) is saved beside the weights as ``decision.json`` and chosen by
:func:`vitrine.training.decision.choose` on data the measurement never reads: the taxonomy's
*training* leaves typed as a shopper would (vitrine/intent/taxonomy.py :func:`training_leaf_queries`) and the validation
queries (validation templates), with cue words from the training templates alone while choosing
(so the validation templates are unseen to it, as the test templates are to the shipped rule).
The held-out leaves and held-out test queries only measure it (`vitrine eval --protocol intent`).

``python -m vitrine.training.decision [--weights DIR]`` chooses and writes ``decision.json``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vitrine.atomic import atomic_write_bytes
from vitrine.intent.cues import CueWords, default_cues


FILE = "decision.json"


@dataclass(frozen=True)
class DecisionRule:
    """``lexical_prior``: a non-search label needs a cue word; ``typo_edits``: edits a cue word
    forgives (one more from 8 letters); ``cue_splits``: the template sets giving the cue words."""

    lexical_prior: bool = True
    typo_edits: int = 1
    cue_splits: tuple[str, ...] = ("train", "val")

    def cues(self) -> CueWords | None:
        return default_cues(tuple(self.cue_splits), self.typo_edits) if self.lexical_prior else None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "cue_splits": list(self.cue_splits)}


def load(weights_dir: Path) -> DecisionRule:
    """The rule saved beside the weights; the default rule when there is none."""
    p = Path(weights_dir) / FILE
    if not p.is_file():
        return DecisionRule()
    d = json.loads(p.read_text(encoding="utf-8")).get("rule", {})
    return DecisionRule(lexical_prior=bool(d.get("lexical_prior", True)), typo_edits=int(d.get("typo_edits", 1)),
                        cue_splits=tuple(d.get("cue_splits", ("train", "val"))))


def save(weights_dir: Path, rule: DecisionRule, evidence: dict[str, Any]) -> Path:
    p = Path(weights_dir) / FILE
    atomic_write_bytes(p, json.dumps({"rule": rule.to_json(), "chosen_on": evidence}, indent=2).encode())
    return p
