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
from collections.abc import Container
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitrine import onnxrt
from vitrine.errors import InvalidInput, ModelError, VitrineError
from vitrine.intent import decision
from vitrine.intent import tokenizer as qtok
from vitrine.intent.cues import CueWords
from vitrine.intent.model import DEFAULT_WEIGHTS, EOS, PAD, UNK, IntentModel, resolve_weights

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
    """Tokenizer + Qwen2 sequence classifier, with a confidence floor."""

    def __init__(self, model: IntentModel, tokenizer: Any, *, min_confidence: float = 0.5,
                 max_chars: int = 2000, runtime: str = "torch", onnx_dir: Path | None = None,
                 threads: int = 1) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.labels = list(model.labels)
        self.min_confidence = float(min_confidence)
        self.max_chars = int(max_chars)
        self.name = str(model.config.get("name", "intent"))
        self._onnx: onnxrt.OnnxModule | None = None
        self.runtime = self._pick_runtime(runtime, onnx_dir, threads)
        # an ensemble's other members (same tokenizer and labels): probabilities are averaged
        self.members: list[IntentClassifier] = []
        self._stacked: onnxrt.OnnxModule | None = None  # all members in one onnxruntime graph
        self._stack_offsets = np.zeros(1, dtype=np.int64)
        self._stack_rows: Any = None  # stacked.RowTable: token ids -> the stacked graph's inputs
        self.rule = decision.DecisionRule(lexical_prior=False)  # load() reads the weights' own rule
        self.cues: CueWords | None = None

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
        for rel in model.config.get("ensemble", [])[: members - 1 if members else None]:
            member = IntentModel.from_pretrained(root / rel)
            if list(member.labels) != out.labels:
                raise ModelError(f"ensemble member {root / rel} has labels {member.labels}, not {out.labels}")
            out.members.append(cls(member, tok, min_confidence=min_confidence, max_chars=max_chars,
                                   runtime="torch", onnx_dir=cache_dir, threads=threads))
        if out._onnx is not None and out.members:
            out._serve_members(cache_dir, threads, stack)
        log.info("intent classifier %s loaded (%d member(s), %d parameters each, %s) in %.2fs", weights,
                 1 + len(out.members), model.n_parameters(), out.runtime, time.perf_counter() - t0)
        return out

    def _pick_runtime(self, runtime: str, onnx_dir: Path | None, threads: int) -> str:
        if runtime not in ("auto", "torch", "onnx"):
            raise InvalidInput(f"unknown intent runtime {runtime!r}; use auto, torch or onnx")
        if runtime == "torch" or (runtime == "auto" and not onnxrt.available()):
            return "torch"
        try:
            self._onnx = self._export(onnx_dir, threads)
            return "onnx"
        except VitrineError as e:
            if runtime == "onnx":
                raise
            log.warning("intent classifier runs in torch: %s", e)
            return "torch"

    def _export(self, onnx_dir: Path | None, threads: int) -> onnxrt.OnnxModule:
        import tempfile  # noqa: PLC0415

        import torch  # noqa: PLC0415

        net = self.model.model
        probes = [self.model.batch([self.model.rows(self.token_ids(t))]) for t in
                  ("women red heels under 1500", "x", "这个耳机和AirPods Pro 2比，降噪强吗？")]
        probes.append(self.model.batch([self.model.rows(self.token_ids(t)) for t in
                                        ("nike vs puma running shoes", "how do I return these sandals",
                                         "what goes with a navy blazer for a wedding in june")]))
        cfg = net.config

        class Logits(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.net = net

            def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
                return self.net(input_ids=ids, attention_mask=mask).logits

        def prepare():  # noqa: ANN202 - attention written out exports; sdpa agrees with it in torch
            old = cfg._attn_implementation
            cfg._attn_implementation = "eager"
            return lambda: setattr(cfg, "_attn_implementation", old)

        key = f"intent:{self.model.config.get('weights_sha256') or self.name}"
        return onnxrt.OnnxModule.export(
            Logits().eval(), probes[0], key=key, cache_dir=onnx_dir or Path(tempfile.gettempdir()),
            input_names=["ids", "mask"], dynamic_axes={"ids": {0: "batch", 1: "tokens"},
                                                       "mask": {0: "batch", 1: "tokens"}, "out": {0: "batch"}},
            probes=probes, threads=threads, prepare=prepare)

    def _serve_members(self, onnx_dir: Path | None, threads: int, stack: bool = True) -> None:
        """The ensemble through onnxruntime: all members stacked into one graph (one pass of
        batched products, ~the cost of one member); if that cannot be built or does not match
        the members, each member gets its own graph and they run one after another."""
        if stack:
            try:
                self._stacked = self._export_stacked(onnx_dir, threads)
                self._stack_rows = self._row_table()
                return
            except VitrineError as e:
                log.warning("intent ensemble runs member by member: %s", e)
        for m in self.members:
            m._onnx = m._export(onnx_dir, threads)
            m.runtime = "onnx"

    def _row_table(self) -> Any:
        """Every member's rows in one gather, when the members share the token limit and the id
        table's length (else None: each member looks up its own rows)."""
        from vitrine.intent.stacked import RowTable  # noqa: PLC0415

        everyone = [self, *self.members]
        if len({c.model.max_tokens for c in everyone}) != 1:
            return None
        try:
            return RowTable([c.model.row_of for c in everyone], self._stack_offsets, pad=PAD, unk=UNK, eos=EOS)
        except VitrineError as e:
            log.info("intent ensemble looks up each member's rows: %s", e)
            return None

    def _export_stacked(self, onnx_dir: Path | None, threads: int) -> onnxrt.OnnxModule:
        import tempfile  # noqa: PLC0415

        import torch  # noqa: PLC0415

        from vitrine.intent.stacked import StackedQwen2, stack_inputs  # noqa: PLC0415

        everyone = [self, *self.members]
        net = StackedQwen2([c.model.model for c in everyone]).eval()
        self._stack_offsets = net.row_offsets
        texts = ("women red heels under 1500", "x", "这个耳机和AirPods Pro 2比，降噪强吗？", "nike vs puma running shoes",
                 "how do I return these sandals", "what goes with a navy blazer for a wedding in june " * 4)
        probes = []
        for batch in (texts[:1], texts[1:2], texts[2:3], texts):
            ids = [self.token_ids(t) for t in batch]
            rows, last = stack_inputs([[c.model.rows(i).rows for i in ids] for c in everyone], net.row_offsets, PAD)
            with torch.inference_mode():
                got = net(torch.from_numpy(rows), torch.from_numpy(last)).numpy()
            want = np.mean([c.model.probabilities([c.model.rows(i) for i in ids]) for c in everyone], axis=0)
            if got.shape != want.shape or float(np.abs(got - want).max()) > 1e-5:
                raise ModelError(f"the stacked ensemble disagrees with its members on {batch[0]!r}")
            probes.append((torch.from_numpy(rows), torch.from_numpy(last)))
        key = "intent-stacked-2d:" + ",".join(str(c.model.config.get("weights_sha256") or c.name) for c in everyone)
        return onnxrt.OnnxModule.export(
            net, probes[0], key=key, cache_dir=onnx_dir or Path(tempfile.gettempdir()),
            input_names=["rows", "last"], dynamic_axes={"rows": {1: "batch", 2: "tokens"}, "last": {0: "batch"},
                                                        "out": {0: "batch"}},
            probes=probes, atol=1e-5, threads=threads)

    def _probabilities(self, encs: list[Any]) -> np.ndarray:
        if self._onnx is None:
            return self.model.probabilities(encs)
        width = max(len(e.rows) for e in encs)
        ids = np.full((len(encs), width), PAD, dtype=np.int64)
        mask = np.zeros((len(encs), width), dtype=np.int64)
        for i, e in enumerate(encs):  # as IntentModel.batch, without building torch tensors
            ids[i, : len(e.rows)] = e.rows
            mask[i, : len(e.rows)] = 1
        z = self._onnx(ids, mask).astype(np.float64)
        z = np.exp(z - z.max(axis=1, keepdims=True))
        return (z / z.sum(axis=1, keepdims=True)).astype(np.float32)

    def _ensemble_probabilities(self, ids: list[list[int]], encs: list[Any]) -> np.ndarray:
        """The mean of the members' probabilities; each member maps the ids to its own vocabulary
        rows. With onnxruntime, all members in one stacked graph."""
        if not self.members:
            return self._probabilities(encs)
        if self._stacked is not None:
            from vitrine.intent.stacked import stack_inputs  # noqa: PLC0415

            if self._stack_rows is not None:
                return self._stacked(*self._stack_rows([self.model.clip(i)[0] for i in ids]))
            rows = [[e.rows for e in encs]] + [[m.model.rows(i).rows for i in ids] for m in self.members]
            return self._stacked(*stack_inputs(rows, self._stack_offsets, PAD))
        probs = self._probabilities(encs)
        for m in self.members:
            probs = probs + m._probabilities([m.model.rows(i) for i in ids])
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

    def predict_batch(self, texts: list[str | None], *, prior: bool = True,
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
