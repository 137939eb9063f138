"""Query understanding: intent label + probabilities (the Qwen2 classifier) and slots.

``IntentClassifier.load()`` builds the Qwen tokenizer (from ``qwen.tiktoken``, cached) and loads
the shipped classifier; ``predict(text)`` returns the label, every label's probability and
whether the prediction is confident enough to act on (else the caller does a plain search).
"""

from __future__ import annotations

import logging
import os
import re
import time
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitrine.intent import tokenizer as qtok
from vitrine.intent.model import DEFAULT_WEIGHTS, IntentModel

log = logging.getLogger(__name__)

LABELS = ("search", "compare", "recommend", "purchase_intent", "after_sales", "abandon")
FALLBACK_LABEL = "search"
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\u200b-\u200f\u2028-\u202e\ufeff]")


def clean_query(text: str | None, max_chars: int) -> tuple[str, bool]:
    """Control and zero-width characters out, whitespace collapsed, cut to ``max_chars``."""
    s = (text or "").encode("utf-8", "replace").decode("utf-8")  # lone surrogates from JSON escapes
    s = " ".join(_CONTROL.sub(" ", s).split())
    if len(s) > max_chars:
        return s[:max_chars], True
    return s, False


@dataclass
class IntentResult:
    label: str                      # the label acted on (the fallback when not confident)
    predicted: str                  # the classifier's top label
    scores: dict[str, float]
    confident: bool
    n_tokens: int = 0
    truncated: bool = False
    ms: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def confidence(self) -> float:
        return self.scores.get(self.predicted, 0.0)


class IntentClassifier:
    """Tokenizer + Qwen2 sequence classifier, with a confidence floor."""

    def __init__(self, model: IntentModel, tokenizer: Any, *, min_confidence: float = 0.5,
                 max_chars: int = 2000) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.labels = list(model.labels)
        self.min_confidence = float(min_confidence)
        self.max_chars = int(max_chars)
        self.name = str(model.config.get("name", "intent"))

    @classmethod
    def load(cls, weights: str | os.PathLike[str] = DEFAULT_WEIGHTS, *, cache_dir: Path | None = None,
             min_confidence: float = 0.5, max_chars: int = 2000) -> "IntentClassifier":
        t0 = time.perf_counter()
        model = IntentModel.from_pretrained(weights)
        tok = qtok.load_tokenizer(cache_dir)
        log.info("intent classifier %s loaded (%d parameters) in %.2fs", weights, model.n_parameters(),
                 time.perf_counter() - t0)
        return cls(model, tok, min_confidence=min_confidence, max_chars=max_chars)

    def token_ids(self, text: str) -> list[int]:
        return qtok.encode(self.tokenizer, text)

    def predict(self, text: str | None) -> IntentResult:
        return self.predict_batch([text])[0]

    def predict_batch(self, texts: list[str | None]) -> list[IntentResult]:
        t0 = time.perf_counter()
        cleaned = [clean_query(t, self.max_chars) for t in texts]
        encs = []
        for s, cut in cleaned:
            e = self.model.rows(self.token_ids(unicodedata.normalize("NFC", s)) if s else [])
            e.truncated = e.truncated or cut
            encs.append(e)
        probs = self.model.probabilities(encs)
        ms = (time.perf_counter() - t0) * 1000 / max(1, len(texts))
        out = []
        for (s, _), e, p in zip(cleaned, encs, probs):
            scores = {lab: round(float(v), 6) for lab, v in zip(self.labels, p)}
            top = max(scores, key=scores.__getitem__)
            confident = bool(s) and scores[top] >= self.min_confidence
            out.append(IntentResult(label=top if confident else FALLBACK_LABEL, predicted=top, scores=scores,
                                    confident=confident, n_tokens=e.n_tokens, truncated=e.truncated, ms=ms))
        return out
