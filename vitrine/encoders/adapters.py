"""Alignment adapters: backbone features -> one shared, L2-normalised space.

The towers are frozen and not aligned with each other; an adapter maps image features and
text features into one space where a title lies near its photo. Every adapter has the same
seam, so the cross-modal MoE gate drops in beside the plain heads:

    out = adapter(image_feats | None, text_feats | None)
    out.image, out.text   per-modality embeddings (None for a missing modality)
    out.fused             the product/query vector: both modalities weighed together

Adapters save themselves as ``config.json`` + ``model.safetensors`` and load through
:func:`load_adapter`, which picks the class from the config's ``kind``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from vitrine.atomic import atomic_path, atomic_write_text
from vitrine.errors import ModelError

log = logging.getLogger(__name__)

WEIGHTS_DIR = Path(__file__).parent / "weights"
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"

_REGISTRY: dict[str, type["Adapter"]] = {}


def register(cls: type["Adapter"]) -> type["Adapter"]:
    _REGISTRY[cls.kind] = cls
    return cls


def adapter_kinds() -> list[str]:
    return sorted(_REGISTRY)


@dataclass
class AdapterOutput:
    image: torch.Tensor | None
    text: torch.Tensor | None
    fused: torch.Tensor
    aux: dict[str, Any] = field(default_factory=dict)


class Adapter(nn.Module):
    """Base class: per-modality standardisation, save/load, modality fusion."""

    kind: ClassVar[str] = "base"

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
        if image is None and text is None:
            raise ModelError("fuse needs at least one modality")
        if image is None:
            return text  # type: ignore[return-value]
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

        from vitrine.encoders.factory import sha256_file  # noqa: PLC0415 - as load_adapter does

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


def _mlp(in_dim: int, hidden: int, out_dim: int, dropout: float) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(in_dim, hidden),
        nn.GELU(),
        nn.Dropout(dropout),
        nn.Linear(hidden, out_dim),
    )


@register
class IdentityAdapter(Adapter):
    """For towers that are already aligned (a real CLIP checkpoint): just normalise."""

    kind = "identity"

    def __init__(self, config: dict[str, Any]) -> None:
        if int(config["image_dim"]) != int(config["text_dim"]):
            raise ModelError("the identity adapter needs towers of the same width")
        config = dict(config) | {"dim": int(config["image_dim"])}
        super().__init__(config)

    def embed_image(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x.float(), dim=-1)

    def embed_text(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x.float(), dim=-1)


@register
class LinearAdapter(Adapter):
    """One linear projection per modality."""

    kind = "linear"

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.image_proj = nn.Linear(self.image_dim, self.dim)
        self.text_proj = nn.Linear(self.text_dim, self.dim)

    def embed_image(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.image_proj(self.norm_image(x)), dim=-1)

    def embed_text(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.text_proj(self.norm_text(x)), dim=-1)


@register
class MLPAdapter(Adapter):
    """A two-layer MLP per modality, with a linear skip path."""

    kind = "mlp"

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        hidden = int(config.get("hidden", 1024))
        dropout = float(config.get("dropout", 0.1))
        self.image_proj = nn.Linear(self.image_dim, self.dim)
        self.text_proj = nn.Linear(self.text_dim, self.dim)
        self.image_mlp = _mlp(self.image_dim, hidden, self.dim, dropout)
        self.text_mlp = _mlp(self.text_dim, hidden, self.dim, dropout)

    def embed_image(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm_image(x)
        return F.normalize(self.image_proj(x) + self.image_mlp(x), dim=-1)

    def embed_text(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm_text(x)
        return F.normalize(self.text_proj(x) + self.text_mlp(x), dim=-1)


def create_adapter(kind: str, **config: Any) -> Adapter:
    """A fresh adapter of ``kind`` (``linear``, ``mlp``, ``moe``, ``identity``)."""
    _ensure_registered()
    try:
        cls = _REGISTRY[kind]
    except KeyError as e:
        raise ModelError(f"unknown adapter kind {kind!r}; known: {', '.join(adapter_kinds())}") from e
    return cls(config)


def config_overrides(items: Iterable[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings -> config values (JSON where it parses, else the plain string)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ModelError(f"expected KEY=VALUE, got {item!r}")
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw
    return out


def parse_adapter_spec(spec: str) -> tuple[str, str, dict[str, Any]]:
    """``[NAME=]PATH[@KEY=VALUE]...`` -> (label, folder or shipped name, config overrides).

    The overrides apply at load time, for inference options of the same weights, e.g.
    ``moe-dk=moe@dynamic_k=true@dynamic_threshold=0.7``."""
    head, *opts = spec.split("@")
    name, sep, path = head.partition("=")
    path = path if sep else name
    label = name if sep else Path(path).name
    return label, path, config_overrides(o for o in opts if o.strip())


def load_adapter(folder: str | os.PathLike[str], expected_sha256: str | None = None,
                 overrides: dict[str, Any] | None = None) -> Adapter:
    """Load an adapter saved by :meth:`Adapter.save_pretrained` (a folder or a shipped name);
    ``overrides`` replace config values first (inference options; the weights must still fit)."""
    from safetensors.torch import load_file

    from vitrine.encoders.factory import verify_sha256

    _ensure_registered()
    path = Path(folder)
    if not (path / CONFIG_NAME).is_file() and (WEIGHTS_DIR / str(folder) / CONFIG_NAME).is_file():
        path = WEIGHTS_DIR / str(folder)
    cfg_file, w_file = path / CONFIG_NAME, path / WEIGHTS_NAME
    if not cfg_file.is_file() or not w_file.is_file():
        shipped = ", ".join(list_shipped_adapters()) or "none"
        raise ModelError(f"no adapter at {folder} (needs {CONFIG_NAME} + {WEIGHTS_NAME}); shipped: {shipped}")
    try:
        config = json.loads(cfg_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ModelError(f"{cfg_file} is not valid JSON: {e}") from e
    pinned = config.get("weights_sha256")
    if expected_sha256 and pinned and expected_sha256 != pinned:
        raise ModelError(f"adapter {folder}: expected weights sha256 {expected_sha256}, its config pins {pinned}")
    verify_sha256(w_file, expected_sha256 or pinned)
    config |= overrides or {}
    adapter = create_adapter(config.get("kind", ""), **{k: v for k, v in config.items() if k != "kind"})
    state = {k: v.float() if v.is_floating_point() else v for k, v in load_file(str(w_file)).items()}
    try:
        adapter.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise ModelError(f"adapter weights in {w_file} do not fit its config: {e}") from e
    adapter.eval()
    return adapter


def list_shipped_adapters() -> list[str]:
    if not WEIGHTS_DIR.is_dir():
        return []
    return sorted(p.name for p in WEIGHTS_DIR.iterdir() if (p / CONFIG_NAME).is_file())


def _ensure_registered() -> None:
    # The MoE gate registers itself on import; import lazily to keep module load light.
    if "moe" not in _REGISTRY:
        try:
            import vitrine.encoders.moe  # noqa: F401
        except ImportError:
            pass
