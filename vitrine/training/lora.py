"""The towers' LoRA deltas in the aligner's training loop (``train_adapter(..., towers=JointTowers)``).

Cached backbone features stay the loop's data; for the rows of a step, the adapted parts replace
them: titles (and the step's pseudo-queries) run through the LoRA'd text tower, photos through
the LoRA'd last stage from their cached cut activations. Both are differentiable, so one loss
trains the gate and the deltas together. Validation re-embeds the val split the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch

from vitrine.encoders.lora import TowerLora
from vitrine.training.pairs import PairSet

log = logging.getLogger(__name__)


class JointTowers:
    """The deltas plus what they read: each split's titles and cut activations, the pseudo-queries."""

    def __init__(self, lora: TowerLora, *, train_titles: Sequence[str], val_titles: Sequence[str],
                 query_texts: Sequence[str] = (), train_acts: np.ndarray | None = None,
                 val_acts: np.ndarray | None = None, lr_scale: float = 0.25, chunk: int = 256) -> None:
        self.lora = lora
        self.titles = {"train": list(train_titles), "val": list(val_titles)}
        self.acts = {"train": train_acts, "val": val_acts}
        self.query_texts = list(query_texts)
        self.lr_scale = lr_scale
        self.chunk = chunk
        if lora.spec.image and (train_acts is None or val_acts is None):
            raise ValueError("image LoRA needs the cut activations of the train and val photos")

    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.lora.parameters() if p.requires_grad]

    def state(self) -> dict[str, torch.Tensor]:
        return self.lora.delta_state()

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        self.lora.load_delta_state(state)

    def _image(self, split: str, rows: np.ndarray, frozen: torch.Tensor) -> torch.Tensor:
        acts = self.acts[split]
        assert acts is not None  # image LoRA: __init__ refuses to go without them
        act = torch.from_numpy(acts[rows]).to(frozen.device)
        return self.lora.image_features(act, frozen)

    def batch(self, idx: torch.Tensor, image: torch.Tensor, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A training step's rows through the adapted towers (with grad)."""
        rows = idx.cpu().numpy()
        if self.lora.spec.image:
            image = self._image("train", rows, image)
        if self.lora.spec.text:
            text = self.lora.text_features([self.titles["train"][r] for r in rows]).to(text.device)
        return image, text

    def queries(self, sel: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        """The step's pseudo-queries through the adapted text tower (with grad)."""
        if not self.lora.spec.text:
            return feats
        return self.lora.text_features([self.query_texts[q] for q in sel.cpu().tolist()]).to(feats.device)

    @torch.no_grad()
    def refresh(self, data: PairSet, split: str) -> PairSet:
        """``data`` (a split's pairs) with its features recomputed by the adapted towers."""
        assert data.image is not None  # tower LoRA trains with photos (train_adapter refuses text-only sets)
        image, text = data.image, data.text
        n = len(data.image)
        if self.lora.spec.image:
            frozen = torch.from_numpy(data.image)
            image = np.concatenate([self._image(split, np.arange(s, min(s + self.chunk * 4, n)),
                                                frozen[s:s + self.chunk * 4]).numpy()
                                    for s in range(0, n, self.chunk * 4)])
        if self.lora.spec.text:
            titles = self.titles[split]
            order = np.argsort([len(t) for t in titles])  # similar lengths per chunk: little padding
            text = np.zeros_like(data.text)
            for s in range(0, n, self.chunk):
                part = order[s:s + self.chunk]
                text[part] = self.lora.text_features([titles[r] for r in part]).numpy()
        return replace(data, image=image.astype(np.float32), text=text.astype(np.float32))
