"""The adapter seam: the base class every alignment adapter extends, and its saved format.

Every adapter (the plain heads in :mod:`vitrine.encoders.adapters`, the cross-modal MoE gate in
:mod:`vitrine.encoders.moe`) maps backbone features into one shared, L2-normalised space through
the same seam::

    out = adapter(image_feats | None, text_feats | None)
    out.image, out.text   per-modality embeddings (None for a missing modality)
    out.fused             the product/query vector: both modalities weighed together

and saves itself as ``config.json`` + ``model.safetensors``. The kinds and their loading live in
:mod:`vitrine.encoders.adapters`, which imports every kind; this module imports none of them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from vitrine.atomic import atomic_path, atomic_write_text
from vitrine.errors import ModelError

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


@dataclass
class AdapterOutput:
    image: torch.Tensor | None
    text: torch.Tensor | None
    fused: torch.Tensor
    aux: dict[str, Any] = field(default_factory=dict)


class Adapter(nn.Module):
    """Base class: per-modality standardisation, save/load, modality fusion."""

    kind: ClassVar[str] = "base"
    # Buffers (register_buffer): declared so they read as tensors, not nn.Module.__getattr__'s union.
    image_mean: torch.Tensor
    image_std: torch.Tensor
    text_mean: torch.Tensor
    text_std: torch.Tensor

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.config = dict(config)
        self.config["kind"] = self.kind
        self.image_dim = int(config["image_dim"])
        self.text_dim = int(config["text_dim"])
        self.dim = int(config.get("dim", 256))
        # Feature standardisation statistics (set from training data; identity by default).
        self.register_buffer("image_mean", torch.zeros(self.image_dim))
        self.register_buffer("image_std", torch.ones(self.image_dim))
        self.register_buffer("text_mean", torch.zeros(self.text_dim))
        self.register_buffer("text_std", torch.ones(self.text_dim))
        self.logit_scale = nn.Parameter(torch.tensor(float(config.get("logit_scale_init", 2.659))))

    # -- subclasses implement these two -------------------------------------------------
    def embed_image(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def embed_text(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- shared --------------------------------------------------------------------------
    def set_feature_stats(self, image: torch.Tensor | None, text: torch.Tensor | None) -> None:
        """Standardise inputs with statistics of the training features."""
        if image is not None:
            self.image_mean.copy_(image.mean(0))
            self.image_std.copy_(image.std(0).clamp_min(1e-4))
        if text is not None:
            self.text_mean.copy_(text.mean(0))
            self.text_std.copy_(text.std(0).clamp_min(1e-4))

    def norm_image(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.image_mean) / self.image_std

    def norm_text(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.text_mean) / self.text_std

    def fuse(self, image: torch.Tensor | None, text: torch.Tensor | None) -> torch.Tensor:
        """Product vector from both modalities; a missing one leaves the other alone."""
        if image is None:
            if text is None:
                raise ModelError("fuse needs at least one modality")
            return text
        if text is None:
            return image
        return self.mix(image, text)

    def mix(self, image: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """Both modalities into the product vector: a fixed photo weight (tuned on val)."""
        w = float(self.config.get("fuse_image_weight", 0.5))
        return F.normalize(w * image + (1.0 - w) * text, dim=-1)

    def forward(self, image: torch.Tensor | None = None, text: torch.Tensor | None = None) -> AdapterOutput:
        img = self.embed_image(image) if image is not None else None
        txt = self.embed_text(text) if text is not None else None
        return AdapterOutput(image=img, text=txt, fused=self.fuse(img, txt))

    def save_pretrained(self, folder: str | os.PathLike[str]) -> Path:
        """Write ``config.json`` + ``model.safetensors`` atomically into ``folder``."""
        from safetensors.torch import save_file

        from vitrine.encoders.factory import sha256_file  # imported here, as load_adapter does

        folder = Path(folder)
        # float16 on disk keeps shipped adapters small; they compute in float32 once loaded.
        state = {k: (v.detach().cpu().half() if v.is_floating_point() else v.detach().cpu()).contiguous()
                 for k, v in self.state_dict().items()}
        with atomic_path(folder / WEIGHTS_NAME) as tmp_w:
            save_file(state, str(tmp_w), metadata={"kind": self.kind, "dtype": "float16"})
            # The config pins its weights: load_adapter refuses a weights file that does not match.
            self.config["weights_sha256"] = sha256_file(tmp_w)
        atomic_write_text(folder / CONFIG_NAME, json.dumps(self.config, indent=2, sort_keys=True) + "\n")
        return folder
