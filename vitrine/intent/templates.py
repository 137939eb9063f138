"""The intent templates (``data/templates.json``): the labels, the train / val / test template
sets and the compositional frames. The runtime reads them (the decision rule's cue words,
vitrine/intent/cues.py); the training query generator (vitrine/training/intent_queries.py)
fills them.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

LABELS: tuple[str, ...] = ("search", "compare", "recommend", "purchase_intent", "after_sales", "abandon")
TEMPLATES_PATH = Path(__file__).with_name("data") / "templates.json"
VAL_SALT = "vitrine-intent-val-v1"
VAL_PERCENT = 18  # share (in percent) of the train templates / compositional frames kept for validation
SPLITS = ("train", "val", "test")


@lru_cache(maxsize=1)
def templates() -> dict[str, Any]:
    data = json.loads(TEMPLATES_PATH.read_text(encoding="utf-8"))
    return {k: v for k, v in data.items() if not k.startswith("_")}


def norm_template(t: str) -> str:
    return " ".join(t.split()).casefold()


def is_val_template(key: str, template: str) -> bool:
    """Whether a ``train`` template (or compositional frame) is kept for validation: a stable salted
    hash of ``key`` (label and language, or "frame") and the normalised text."""
    h = hashlib.sha256(f"{VAL_SALT}:{key}:{norm_template(template)}".encode()).digest()
    return int.from_bytes(h[:4], "big") % 100 < VAL_PERCENT


@lru_cache(maxsize=1)
def compositional_templates() -> dict[str, list[str]]:
    """English training templates: shared frames x each intent's cue verbs (see templates.json).
    Frames kept for validation are left out, and a filled frame that equals any test or validation
    template is dropped (no test or validation template leaks into training)."""
    comp = templates().get("compositional") or {}
    test = {norm_template(t) for lab in LABELS for lang in ("en", "zh") for t in templates()[lab]["test"][lang]}
    test |= {norm_template(t) for lab in LABELS for lang in ("en", "zh") for t in template_sets("val")[lab][lang]}
    out: dict[str, list[str]] = {}
    for label in LABELS:
        made: list[str] = []
        for frame in comp.get("frames", []):
            if is_val_template("frame", frame):
                continue
            for base, ing in comp.get("verbs", {}).get(label, []):
                t = frame.replace("{VING}", ing).replace("{V}", base)
                if label == "compare":
                    t = t.replace("{P}", "{PA} and {PB}")
                if norm_template(t) not in test and t not in made:
                    made.append(t)
        out[label] = made
    return out


@lru_cache(maxsize=3)
def template_sets(split: str) -> dict[str, dict[str, list[str]]]:
    """The templates of ``split`` per label and language: "test" is the held-out set; "train" and
    "val" partition the ``train`` lists of templates.json (see :func:`is_val_template`)."""
    if split == "test":
        return {label: templates()[label]["test"] for label in LABELS}
    if split not in ("train", "val"):
        raise ValueError(f"split must be one of {SPLITS}")
    want_val = split == "val"
    return {label: {lang: [t for t in tpls if is_val_template(f"{label}:{lang}", t) == want_val]
                    for lang, tpls in templates()[label]["train"].items()} for label in LABELS}


DETERMINERS = ["a", "the", "some", "a pair of", "two", "these", "this", "my"]
