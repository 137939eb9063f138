"""The intent decision rule: from the ensemble's probabilities to the label the engine acts on.

1. The top label, if its probability reaches ``min_confidence``; else ``search``.
2. **The lexical prior** (vitrine/intent/cues.py): a non-search label stands only when the query
   holds a cue word of some non-search intent (or is Chinese text); a phrase of product words alone
   is a search.

The rule's setting (whether the prior is on, how many typo edits a cue word forgives, which
templates give the cue words) is saved beside the weights as ``decision.json`` and chosen by
:func:`choose` on data the measurement never reads: the taxonomy's *training* leaves typed as a
shopper would (vitrine/intent/taxonomy.py :func:`training_leaf_queries`) and the validation
queries (validation templates), with cue words from the training templates alone while choosing
(so the validation templates are unseen to it, as the test templates are to the shipped rule).
The held-out leaves and held-out test queries only measure it (`vitrine eval --protocol intent`).

``python -m vitrine.intent.decision [--weights DIR]`` chooses and writes ``decision.json``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitrine.atomic import atomic_write_bytes
from vitrine.intent.cues import CueWords, default_cues

if TYPE_CHECKING:
    from vitrine.intent.classifier import IntentClassifier

log = logging.getLogger(__name__)

FILE = "decision.json"
TYPO_CANDIDATES = (0, 1, 2)


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


def _labels(clf: IntentClassifier, texts: list[str], cues: CueWords | None, batch: int = 128) -> list[str]:
    """Labels under the confidence floor and ``cues`` (None: no prior)."""
    out: list[str] = []
    for i in range(0, len(texts), batch):
        for t, r in zip(texts[i:i + batch], clf.predict_batch(texts[i:i + batch], prior=False)):
            out.append(r.label if r.label == "search" or cues is None or cues.has_cue(t) else "search")
    return out


def choose(clf: IntentClassifier, *, seed: int = 0, val_per_label: int = 400) -> tuple[DecisionRule, dict[str, Any]]:
    """The rule maximising (training leaves read as search) + (validation accuracy), over: no
    prior, and the prior forgiving 0, 1 or 2 typo edits, with cue words from the training
    templates alone. The chosen rule ships with the validation templates' cue words added."""
    from vitrine.intent.generator import make_val  # noqa: PLC0415
    from vitrine.intent.taxonomy import training_leaf_queries  # noqa: PLC0415
    from vitrine.intent.training import catalogue_terms, default_source  # noqa: PLC0415

    leaves = [q for q, _ in training_leaf_queries(seed)]
    val = make_val(catalogue_terms(default_source()), per_label=val_per_label, seed=seed)
    gold = [e.label for e in val]
    texts = [e.text for e in val]
    table: dict[str, dict[str, float]] = {}
    best: tuple[float, DecisionRule] | None = None
    candidates = [DecisionRule(lexical_prior=False)] + [DecisionRule(typo_edits=e) for e in TYPO_CANDIDATES]
    for rule in candidates:
        cues = default_cues(("train",), rule.typo_edits) if rule.lexical_prior else None
        leaf_rate = sum(lab == "search" for lab in _labels(clf, leaves, cues)) / max(1, len(leaves))
        acc = sum(g == p for g, p in zip(gold, _labels(clf, texts, cues))) / max(1, len(gold))
        name = f"prior, {rule.typo_edits} typo edit(s)" if rule.lexical_prior else "no prior"
        table[name] = {"training_leaves_search_rate": round(leaf_rate, 4), "val_accuracy": round(acc, 4)}
        if best is None or leaf_rate + acc > best[0] + 1e-9:
            best = (leaf_rate + acc, rule)
    assert best is not None
    evidence = {"objective": "training-leaf search rate + validation accuracy (cue words of the training "
                             "templates while choosing)", "training_leaves": len(leaves), "val_queries": len(val),
                "candidates": table, "min_confidence": clf.min_confidence}
    return best[1], evidence


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - a maintainer's tool
    import argparse  # noqa: PLC0415

    from vitrine.intent.classifier import IntentClassifier  # noqa: PLC0415
    from vitrine.intent.model import DEFAULT_WEIGHTS, resolve_weights  # noqa: PLC0415

    ap = argparse.ArgumentParser(description="choose the intent decision rule and save it beside the weights")
    ap.add_argument("--weights", default=DEFAULT_WEIGHTS)
    ap.add_argument("--min-confidence", type=float, default=0.6)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    clf = IntentClassifier.load(args.weights, min_confidence=args.min_confidence, runtime="auto")
    rule, evidence = choose(clf)
    path = save(resolve_weights(args.weights), rule, evidence)
    log.info("chose %s on %s; wrote %s", rule, evidence["candidates"], path)


if __name__ == "__main__":  # pragma: no cover
    main()
