"""Query understanding: intent label + probabilities (the Qwen2 classifier) and slots.

``IntentClassifier.load()`` builds the Qwen tokenizer (from ``qwen.tiktoken``, cached) and loads
the shipped classifier; ``predict(text)`` returns the label, every label's probability and
whether the prediction is confident enough to act on (else the caller does a plain search). The
label follows the decision rule saved beside the weights (vitrine/intent/decision.py): under the
confidence floor, or a non-search label on a query without any intent cue word, is a search.
"""

from __future__ import annotations

import logging
import os
import re
import time
import unicodedata
from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitrine import onnxrt
from vitrine.errors import InvalidInput, ModelError, VitrineError
from vitrine.intent import decision
from vitrine.intent import tokenizer as qtok
from vitrine.intent.cues import CueWords
from vitrine.intent.member import IntentMember
from vitrine.intent.model import DEFAULT_WEIGHTS, PAD, IntentModel, resolve_weights

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
    predicted: str | None           # the classifier's top label (None: the classifier did not run)
    scores: dict[str, float]
    confident: bool
    n_tokens: int = 0
    truncated: bool = False
    ms: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def confidence(self) -> float:
        return self.scores.get(self.predicted, 0.0) if self.predicted else 0.0


class IntentClassifier:
    """The intent ensemble behind one decision: its members' mean label probabilities (the first
    member is ``model``), a confidence floor, the decision rule and its cue words. Each member is an
    :class:`~vitrine.intent.member.IntentMember`; with onnxruntime all of them may run as one
    stacked graph (:mod:`vitrine.intent.stacked`)."""

    def __init__(self, model: IntentModel, tokenizer: Any, *, min_confidence: float = 0.5,
                 max_chars: int = 2000, runtime: str = "torch", onnx_dir: Path | None = None,
                 threads: int = 1) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.labels = list(model.labels)
        self.min_confidence = float(min_confidence)
        self.max_chars = int(max_chars)
        self.name = str(model.config.get("name", "intent"))
        self.first = IntentMember(model, tokenizer)
        self.runtime = self.first.serve(runtime, onnx_dir, threads)
        # the ensemble's other members (same tokenizer and labels): probabilities are averaged
        self._members: list[IntentMember] = []
        self._stacked: onnxrt.OnnxModule | None = None  # all members in one onnxruntime graph
        self._stack_offsets = np.zeros(1, dtype=np.int64)
        self._stack_rows: Any = None  # stacked.RowTable: token ids -> the stacked graph's inputs
        self.rule = decision.DecisionRule(lexical_prior=False)  # load() reads the weights' own rule
        self.cues: CueWords | None = None

    @property
    def members(self) -> list[IntentMember]:
        """The ensemble's members after the first (``model``)."""
        return self._members

    @members.setter
    def members(self, members: Sequence[IntentMember]) -> None:
        """New members: a stacked graph made for the old ones is dropped."""
        self._members = list(members)
        self._stacked, self._stack_rows = None, None

    @classmethod
    def load(cls, weights: str | os.PathLike[str] = DEFAULT_WEIGHTS, *, cache_dir: Path | None = None,
             min_confidence: float = 0.5, max_chars: int = 2000, runtime: str = "torch",
             threads: int = 1, members: int = 0, stack: bool = True,
             rule: decision.DecisionRule | None = None) -> "IntentClassifier":
        """``runtime``: torch, onnx (onnxruntime, checked against torch; raises when impossible)
        or auto (onnxruntime when installed, else torch). The ONNX graph is cached in ``cache_dir``.
        ``members``: use the ensemble's first N members (0: all; 1 is fastest and least accurate).
        ``stack``: with onnxruntime, run the members as one stacked graph (else one after another).
        ``rule``: the decision rule (default: ``decision.json`` beside the weights, else the default rule)."""
        if members < 0:
            raise InvalidInput("members must be 0 (all) or more")
        t0 = time.perf_counter()
        model = IntentModel.from_pretrained(weights)
        tok = qtok.load_tokenizer(cache_dir)
        out = cls(model, tok, min_confidence=min_confidence, max_chars=max_chars, runtime=runtime,
                  onnx_dir=cache_dir, threads=threads)
        root = resolve_weights(weights)
        out.rule = rule if rule is not None else decision.load(root)
        out.cues = out.rule.cues()
        others = []
        for rel in model.config.get("ensemble", [])[: members - 1 if members else None]:
            member = IntentModel.from_pretrained(root / rel)
            if list(member.labels) != out.labels:
                raise ModelError(f"ensemble member {root / rel} has labels {member.labels}, not {out.labels}")
            others.append(IntentMember(member, tok))
        out.members = others
        if out.runtime == "onnx" and out.members:
            out._serve_members(cache_dir, threads, stack)
        log.info("intent classifier %s loaded (%d member(s), %d parameters each, %s) in %.2fs", weights,
                 1 + len(out.members), model.n_parameters(), out.runtime, time.perf_counter() - t0)
        return out

    def _serve_members(self, onnx_dir: Path | None, threads: int, stack: bool = True) -> None:
        """The ensemble through onnxruntime: all members stacked into one graph (one pass of
        batched products, ~the cost of one member); if that cannot be built or does not match
        the members, each member gets its own graph and they run one after another."""
        from vitrine.intent.stacked import export_stacked, row_table

        if stack:
            everyone = [self.first, *self.members]
            try:
                self._stacked, self._stack_offsets = export_stacked(everyone, onnx_dir, threads)
                self._stack_rows = row_table(everyone, self._stack_offsets)
                return
            except VitrineError as e:
                log.warning("intent ensemble runs member by member: %s", e)
        for m in self.members:
            m.use_onnx(onnx_dir, threads)

    def _ensemble_probabilities(self, ids: list[list[int]], encs: list[Any]) -> np.ndarray:
        """The mean of the members' probabilities; each member maps the ids to its own vocabulary
        rows. With onnxruntime, all members in one stacked graph."""
        if not self.members:
            return self.first.probabilities(encs)
        if self._stacked is not None:
            from vitrine.intent.stacked import stack_inputs

            if self._stack_rows is not None:
                return self._stacked(*self._stack_rows([self.model.clip(i)[0] for i in ids]))
            rows = [[e.rows for e in encs]] + [[m.model.rows(i).rows for i in ids] for m in self.members]
            return self._stacked(*stack_inputs(rows, self._stack_offsets, PAD))
        probs = self.first.probabilities(encs)
        for m in self.members:
            probs = probs + m.probabilities([m.model.rows(i) for i in ids])
        return probs / (1 + len(self.members))

    def token_ids(self, text: str) -> list[int]:
        return qtok.encode(self.tokenizer, text)

    def predict(self, text: str | None, *, known: Container[str] = frozenset()) -> IntentResult:
        return self.predict_batch([text], known=known)[0]

    def decided_by_prior(self, text: str | None, *, known: Container[str] = frozenset()) -> IntentResult | None:
        """The label when the decision rule fixes it whatever the classifier would say, else None.

        Under the lexical prior a query holding no cue word of any non-search intent is a search
        (a confident non-search label needs a cue word; a search or an unsure label is a search
        anyway), so serving skips the ensemble for it: the label is the one :meth:`predict` gives
        (tests/test_intent_fastpath.py checks it on held-out queries), without the probabilities.
        An empty query is left to :meth:`predict` (it reports no confidence). ``known``: the
        catalogue's words, never read as typos of cue words (vitrine/intent/cues.py)."""
        if self.cues is None:
            return None
        s, cut = clean_query(text, self.max_chars)
        if not s or self.cues.has_cue(s, known):  # the text predict_batch checks for a cue word
            return None
        return IntentResult(label=FALLBACK_LABEL, predicted=None, scores={}, confident=True,
                            truncated=cut, extra={"by": "lexical_prior"})

    def predict_batch(self, texts: Sequence[str | None], *, prior: bool = True,
                      known: Container[str] = frozenset()) -> list[IntentResult]:
        """``prior``: apply the lexical prior of the decision rule (False: the confidence floor alone);
        ``known``: the catalogue's words, never read as typos of cue words."""
        t0 = time.perf_counter()
        cleaned = [clean_query(t, self.max_chars) for t in texts]
        ids = [self.token_ids(unicodedata.normalize("NFC", s)) if s else [] for s, _ in cleaned]
        encs = []
        for i, (_, cut) in zip(ids, cleaned):
            e = self.model.rows(i)
            e.truncated = e.truncated or cut
            encs.append(e)
        probs = self._ensemble_probabilities(ids, encs)
        out = []
        for (s, _), e, p in zip(cleaned, encs, probs):
            scores = {lab: round(float(v), 6) for lab, v in zip(self.labels, p)}
            top = max(scores, key=scores.__getitem__)
            confident = bool(s) and scores[top] >= self.min_confidence
            extra: dict[str, Any] = {}
            if confident and top != FALLBACK_LABEL and prior and self.cues is not None and not self.cues.has_cue(s, known):
                confident, extra = False, {"no_cue_word": True}  # a product phrase alone is a search
            out.append(IntentResult(label=top if confident else FALLBACK_LABEL, predicted=top, scores=scores,
                                    confident=confident, n_tokens=e.n_tokens, truncated=e.truncated,
                                    extra=extra))
        ms = (time.perf_counter() - t0) * 1000 / max(1, len(texts))
        for r in out:
            r.ms = ms
        return out

    def with_catalogue(self, text: str | None, result: IntentResult, known: Container[str]) -> IntentResult:
        """``result`` (of :meth:`predict` without ``known``) under the lexical prior with the
        catalogue's words ``known``: a non-search label whose only cue was a catalogue word read as
        a typo becomes a search (a micro-batched classification does not carry ``known``)."""
        if self.cues is None or result.label == FALLBACK_LABEL or not result.confident:
            return result
        s, _ = clean_query(text, self.max_chars)
        if self.cues.has_cue(s, known):
            return result
        return IntentResult(label=FALLBACK_LABEL, predicted=result.predicted, scores=result.scores, confident=False,
                            n_tokens=result.n_tokens, truncated=result.truncated, ms=result.ms,
                            extra={**result.extra, "no_cue_word": True})
