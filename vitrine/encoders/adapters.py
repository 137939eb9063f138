"""Alignment adapters: backbone features -> one shared, L2-normalised space.

The towers are frozen and not aligned with each other; an adapter maps image features and
text features into one space where a title lies near its photo. Every adapter has the same seam
(:class:`~vitrine.encoders.adapter_base.Adapter`), so the cross-modal MoE gate
(:mod:`vitrine.encoders.moe`) drops in beside the plain heads defined here.

This module knows every kind: :func:`create_adapter` builds one by name and :func:`load_adapter`
loads one saved as ``config.json`` + ``model.safetensors``, picking the class from the config's
``kind``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitrine.encoders.adapter_base import CONFIG_NAME, WEIGHTS_NAME, Adapter
from vitrine.encoders.moe import CrossModalMoE
from vitrine.errors import ModelError

log = logging.getLogger(__name__)

WEIGHTS_DIR = Path(__file__).parent / "weights"


def _mlp(in_dim: int, hidden: int, out_dim: int, dropout: float) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(in_dim, hidden),
        nn.GELU(),
        nn.Dropout(dropout),
        nn.Linear(hidden, out_dim),
    )


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


# Every adapter kind, by the name its config.json records.
KINDS: dict[str, type[Adapter]] = {cls.kind: cls for cls in (IdentityAdapter, LinearAdapter, MLPAdapter, CrossModalMoE)}


def adapter_kinds() -> list[str]:
    return sorted(KINDS)


def create_adapter(kind: str, **config: Any) -> Adapter:
    """A fresh adapter of ``kind`` (``linear``, ``mlp``, ``moe``, ``identity``)."""
    try:
        cls = KINDS[kind]
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
