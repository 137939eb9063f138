"""Choosing the intent decision rule (vitrine/intent/decision.py) on data the measurement never
reads: the taxonomy's training leaves typed as a shopper would and the validation queries, with
cue words from the training templates alone while choosing (see that module's doc).

``python -m vitrine.training.decision [--weights DIR]`` chooses and writes ``decision.json``
beside the weights.
"""

from __future__ import annotations

import logging
from typing import Any

from vitrine.intent.classifier import IntentClassifier
from vitrine.intent.cues import CueWords, default_cues
from vitrine.intent.decision import DecisionRule, save

log = logging.getLogger(__name__)

TYPO_CANDIDATES = (0, 1, 2)


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
    from vitrine.intent.taxonomy import training_leaf_queries
    from vitrine.training.intent import default_source
    from vitrine.training.intent_queries import catalogue_terms, make_val

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
    import argparse

    from vitrine.intent.model import DEFAULT_WEIGHTS, resolve_weights

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
