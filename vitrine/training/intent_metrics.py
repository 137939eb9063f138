"""How well an intent classifier does: accuracy, macro-F1 and per-label scores on generated
queries (slot exact-match too), and the shares of real product titles and held-out taxonomy
leaves, typed as queries, that the deployed rule sends to search."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from vitrine.intent.classifier import LABELS, IntentClassifier
from vitrine.intent.slots import SlotExtractor, slots_equal
from vitrine.intent.taxonomy import heldout_leaf_queries
from vitrine.training.intent_queries import Example


def classification_metrics(gold: Sequence[str], pred: Sequence[str | None], labels: Sequence[str] = LABELS) -> dict[str, Any]:
    n = len(gold)
    acc = sum(g == p for g, p in zip(gold, pred)) / n if n else float("nan")
    per: dict[str, dict[str, float]] = {}
    for lab in labels:
        tp = sum(g == lab and p == lab for g, p in zip(gold, pred))
        fp = sum(g != lab and p == lab for g, p in zip(gold, pred))
        fn = sum(g == lab and p != lab for g, p in zip(gold, pred))
        prec = tp / (tp + fp) if tp + fp else 0.0
        rec = tp / (tp + fn) if tp + fn else 0.0
        f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
        per[lab] = {"precision": round(prec, 4), "recall": round(rec, 4), "f1": round(f1, 4), "support": tp + fn}
    macro = float(np.mean([per[lab]["f1"] for lab in labels if per[lab]["support"]])) if n else float("nan")
    confusion = {g: dict(Counter(p for gg, p in zip(gold, pred) if gg == g)) for g in labels}
    return {"accuracy": round(acc, 4), "macro_f1": round(macro, 4), "per_label": per, "confusion": confusion, "n": n}


def evaluate(classifier: IntentClassifier, examples: Sequence[Example], extractor: SlotExtractor | None = None,
             *, batch_size: int = 128) -> dict[str, Any]:
    """Accuracy, macro-F1, per-label scores on ``examples``; slot exact-match when given an extractor."""
    preds: list[str | None] = []
    for i in range(0, len(examples), batch_size):
        preds += [r.predicted for r in classifier.predict_batch([e.text for e in examples[i:i + batch_size]])]
    out = classification_metrics([e.label for e in examples], preds)
    by_lang: dict[str, Any] = {}
    for lang in sorted({e.lang for e in examples}):
        idx = [i for i, e in enumerate(examples) if e.lang == lang]
        m = classification_metrics([examples[i].label for i in idx], [preds[i] for i in idx])
        by_lang[lang] = {"accuracy": m["accuracy"], "macro_f1": m["macro_f1"], "n": m["n"]}
    out["by_language"] = by_lang
    if extractor is not None:
        labelled = [(e.text, e.slots) for e in examples if e.slots is not None]
        ok = [slots_equal(extractor.extract(text).values(), slots) for text, slots in labelled]
        with_slots = [o for o, (_, slots) in zip(ok, labelled) if slots]
        out["slot_exact_match"] = round(sum(ok) / len(ok), 4) if ok else float("nan")
        out["slot_exact_match_with_slots"] = round(sum(with_slots) / len(with_slots), 4) if with_slots else float("nan")
    errors = [{"text": e.text, "gold": e.label, "pred": p} for e, p in zip(examples, preds) if e.label != p]
    out["errors_sample"] = errors[:25]
    return out


def title_search_rate(classifier: IntentClassifier, titles: Sequence[str], *, batch_size: int = 128,
                      prior: bool = True) -> dict[str, Any]:
    """Share of real product titles, typed as queries, that the deployed rule sends to search
    (a title is always a search; another intent would show an answer instead of products)."""
    results = []
    for i in range(0, len(titles), batch_size):
        results += classifier.predict_batch(list(titles[i:i + batch_size]), prior=prior)
    wrong = [{"text": t, "label": r.label, "p": round(r.scores[r.label], 3)}
             for t, r in zip(titles, results) if r.label != "search"]
    n = len(titles)
    return {"n": n, "search_rate": round(1 - len(wrong) / n, 4) if n else float("nan"), "errors_sample": wrong[:15]}


def leaf_search_rate(classifier: IntentClassifier, seed: int = 0, *, batch_size: int = 128,
                     prior: bool = True) -> dict[str, Any]:
    """Share of Google-taxonomy leaves no training query had, typed as a shopper would (English,
    lower-cased, a third with a typo), that the deployed rule sends to search; overall and per
    top-level domain of the taxonomy."""
    from vitrine.intent.taxonomy import taxonomy_paths

    pairs = heldout_leaf_queries(seed)
    results = []
    for i in range(0, len(pairs), batch_size):
        results += classifier.predict_batch([q for q, _ in pairs[i:i + batch_size]], prior=prior)
    root: dict[str, str] = {}
    for path in taxonomy_paths():
        root.setdefault(path[-1], path[0])
    errors = [{"text": q, "leaf": leaf, "label": r.label, "p": round(r.scores[r.label], 3)}
              for (q, leaf), r in zip(pairs, results) if r.label != "search"]
    by_domain: dict[str, list[int]] = {}
    for (_, leaf), r in zip(pairs, results):
        n_ok = by_domain.setdefault(root.get(leaf, "?"), [0, 0])
        n_ok[0] += 1
        n_ok[1] += r.label == "search"
    n = len(pairs)
    return {"n": n, "search_rate": round(1 - len(errors) / n, 4) if n else float("nan"),
            "by_domain": {d: {"n": k, "search_rate": round(ok / k, 4)} for d, (k, ok) in sorted(by_domain.items())},
            "labels_of_errors": dict(Counter(e["label"] for e in errors)), "errors_sample": errors[:40]}
