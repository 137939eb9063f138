"""One member of the intent ensemble: a trained :class:`~vitrine.intent.model.IntentModel` and what
runs it (torch, or its own checked onnxruntime graph of the logits).

:class:`~vitrine.intent.classifier.IntentClassifier` is the composite: its members' mean
probabilities (one stacked graph for all of them where onnxruntime runs it,
:mod:`vitrine.intent.stacked`), the decision rule and the cue words.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from vitrine import onnxrt
from vitrine.intent import tokenizer as qtok
from vitrine.intent.model import PAD, Encoded, IntentModel

# Queries the member's ONNX graph is checked on (short, one character, non-Latin; then a batch).
PROBE_QUERIES = ("women red heels under 1500", "x", "这个耳机和AirPods Pro 2比，降噪强吗？")
PROBE_BATCH = ("nike vs puma running shoes", "how do I return these sandals",
               "what goes with a navy blazer for a wedding in june")


class IntentMember:
    """``model`` with the query tokenizer; :meth:`probabilities` in torch, or in onnxruntime once
    :meth:`serve` or :meth:`use_onnx` built its graph."""

    def __init__(self, model: IntentModel, tokenizer: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self._onnx: onnxrt.OnnxModule | None = None

    @property
    def runtime(self) -> str:
        return "torch" if self._onnx is None else "onnx"

    def token_ids(self, text: str) -> list[int]:
        return qtok.encode(self.tokenizer, text)

    def serve(self, runtime: str, onnx_dir: Path | None, threads: int) -> str:
        """Run the model in ``runtime`` (torch, onnx or auto, as :func:`vitrine.onnxrt.choose`);
        returns the one it runs in."""
        self._onnx = onnxrt.choose(runtime, "intent", lambda: self.export(onnx_dir, threads))
        return self.runtime

    def use_onnx(self, onnx_dir: Path | None, threads: int) -> None:
        """Run the model through its onnxruntime graph (raises when it cannot be built)."""
        self._onnx = self.export(onnx_dir, threads)

    def export(self, onnx_dir: Path | None, threads: int) -> onnxrt.OnnxModule:
        """The model's logits as a checked onnxruntime graph, cached in ``onnx_dir``."""
        import torch

        net = self.model.model
        probes = [self.model.batch([self.model.rows(self.token_ids(t))]) for t in PROBE_QUERIES]
        probes.append(self.model.batch([self.model.rows(self.token_ids(t)) for t in PROBE_BATCH]))

        class Logits(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.net = net

            def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
                return self.net(input_ids=ids, attention_mask=mask).logits

        key = f"intent:{self.model.config.get('weights_sha256') or self.model.config.get('name', 'intent')}"
        return onnxrt.OnnxModule.export(
            Logits().eval(), probes[0], key=key, cache_dir=onnx_dir,
            input_names=["ids", "mask"], dynamic_axes={"ids": {0: "batch", 1: "tokens"},
                                                       "mask": {0: "batch", 1: "tokens"}, "out": {0: "batch"}},
            probes=probes, threads=threads, prepare=onnxrt.eager_attention(net.config))

    def probabilities(self, encs: list[Encoded]) -> np.ndarray:
        """Each query's label probabilities, [len(encs), labels]."""
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
