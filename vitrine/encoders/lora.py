"""Light adaptation of the towers: LoRA deltas on MiniLM's attention and on the image tower's last
stage, trained jointly with the aligner (``vitrine train gate --lora text|image|both``).

The towers stay frozen; `peft` injects low-rank deltas (``W + B A``, ``B`` zero at the start, so
an untrained delta reproduces the frozen tower exactly):

- text: the query and value projections of every attention layer of MiniLM (rank ``rank``);
- image: the 1x1 convolutions of EfficientNet-Lite2's last stage (``blocks[6]``) and its
  ``conv_head``. Training reads the activations after ``blocks[5]`` (cached once per photo, 208x4x3
  at 128x96), so a step runs only that stage; the block taps (3-5) and the colour histogram of
  the backbone features come before it and do not change.

The deltas save beside the aligner as ``lora/config.json`` + ``lora/model.safetensors`` (the
config pins the weights' SHA-256). The native text space (the floor of text search) keeps the
*unadapted* text tower: only the inputs of the shared space go through the deltas.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np
import torch
from torch import nn

from vitrine.errors import MissingExtra, ModelError

if TYPE_CHECKING:  # pragma: no cover
    from vitrine.encoders.feature_cache import FeatureCache
    from vitrine.encoders.factory import Towers

log = logging.getLogger(__name__)

LORA_DIR = "lora"
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
TEXT_TARGETS = ("query", "value")
#: The image tower's stage whose output training caches; the stages after it carry the deltas.
IMAGE_CUT = 5
IMAGE_TARGETS = ("conv_pw", "conv_pwl", "conv_head")  # inside the last stage only (ImageStage)
#: Width of the image tower's own pooled output at the start of the backbone features (the block
#: taps and the colour histogram follow it and come from before the cut).
POOLED_DIM = 1280
MODES = ("text", "image", "both")


@dataclass
class LoraSpec:
    """Which towers carry deltas, and their shape."""

    text: bool = True
    image: bool = False
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    #: MiniLM layers that carry deltas (None: all six). The top layers alone cost a fraction of
    #: the backward pass: autograd stops below the lowest adapted layer.
    text_layers: list[int] | None = None

    @classmethod
    def from_mode(cls, mode: str, **kw: Any) -> "LoraSpec":
        if mode not in MODES:
            raise ModelError(f"unknown LoRA mode {mode!r}; one of {', '.join(MODES)}")
        return cls(text=mode in ("text", "both"), image=mode in ("image", "both"), **kw)

    @property
    def mode(self) -> str:
        return "both" if self.text and self.image else ("text" if self.text else "image")


def _peft() -> Any:
    try:
        import peft  # the `train` extra
    except ImportError as e:
        raise MissingExtra("LoRA tower deltas need the peft package: pip install 'vitrine[train]'") from e
    return peft


class ImageTrunk(Protocol):
    """The parts of a timm EfficientNet trunk the cut uses."""

    conv_stem: nn.Module
    bn1: nn.Module
    blocks: nn.Sequential
    conv_head: nn.Module
    bn2: nn.Module


def image_trunk(towers: Towers) -> ImageTrunk:
    """The image tower's timm trunk; :class:`TowerLora` checks it is EfficientNet-style."""
    return cast(ImageTrunk, towers.model.visual.trunk)


class ImageStage(nn.Module):
    """The image tower after the cut: the last stage, ``conv_head`` + its norm, average pooling."""

    def __init__(self, trunk: ImageTrunk) -> None:
        super().__init__()
        self.stage = copy.deepcopy(trunk.blocks[IMAGE_CUT + 1:])
        self.conv_head = copy.deepcopy(trunk.conv_head)
        self.bn2 = copy.deepcopy(trunk.bn2)

    def forward(self, act: torch.Tensor) -> torch.Tensor:
        return self.bn2(self.conv_head(self.stage(act))).mean(dim=(2, 3))


def image_prefix(trunk: ImageTrunk, pixels: torch.Tensor) -> torch.Tensor:
    """The frozen image tower up to the cut: activations after ``blocks[IMAGE_CUT]``.

    Calls the blocks one by one, so the block taps' hooks capture as in a full forward."""
    h = trunk.bn1(trunk.conv_stem(pixels))
    for b in trunk.blocks[: IMAGE_CUT + 1]:
        h = b(h)
    return h


class TowerLora(nn.Module):
    """Copies of the towers' parts that carry LoRA deltas (the originals are left untouched)."""

    def __init__(self, towers: Towers, spec: LoraSpec) -> None:
        super().__init__()
        if towers.hf_tokenizer is None and spec.text:
            raise ModelError("text LoRA needs a Hugging Face text tower (MiniLM)")
        peft = _peft()
        self.spec = spec
        self.tokenizer = towers.hf_tokenizer
        self.context_length = towers.context_length
        self.towers_key = towers.key
        self.text: nn.Module | None = None
        self.image: ImageStage | None = None
        common = {"r": spec.rank, "lora_alpha": spec.alpha, "lora_dropout": spec.dropout}
        if spec.text:
            self.text = copy.deepcopy(towers.model.text)
            layers = {"layers_to_transform": list(spec.text_layers), "layers_pattern": "layer"} \
                if spec.text_layers is not None else {}
            peft.inject_adapter_in_model(peft.LoraConfig(target_modules=list(TEXT_TARGETS), **common, **layers),
                                         self.text)
        if spec.image:
            trunk = image_trunk(towers)
            if getattr(trunk, "blocks", None) is None or len(trunk.blocks) <= IMAGE_CUT + 1:
                raise ModelError("image LoRA needs an EfficientNet-style timm trunk with its last stage after block 5")
            self.image = ImageStage(trunk)
            peft.inject_adapter_in_model(peft.LoraConfig(target_modules=list(IMAGE_TARGETS), **common), self.image)
        for name, p in self.named_parameters():
            p.requires_grad_("lora_" in name)
        self.eval()

    def train(self, mode: bool = True) -> "TowerLora":
        """The towers' norms and dropout stay as at inference: only the deltas learn."""
        return super().train(False)

    # -- features ------------------------------------------------------------------------------
    def text_features(self, texts: Sequence[str]) -> torch.Tensor:
        """The adapted text tower's features (differentiable when grad is on), (B, text_dim)."""
        if self.text is None:
            raise ModelError("these deltas do not adapt the text tower")
        dev = next(self.text.parameters()).device
        batch = self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.context_length,
                               return_tensors="pt")
        return self.text(batch["input_ids"].to(dev)).float()

    def image_pooled(self, act: torch.Tensor) -> torch.Tensor:
        """The adapted last stage on cut activations -> the tower's pooled output (B, 1280)."""
        if self.image is None:
            raise ModelError("these deltas do not adapt the image tower")
        return self.image(act.float())

    def image_features(self, act: torch.Tensor, frozen: torch.Tensor) -> torch.Tensor:
        """Backbone features with the adapted pooled output in front of the frozen taps/histogram."""
        return torch.cat([self.image_pooled(act), frozen[:, POOLED_DIM:].to(act.device)], dim=1)

    def pixel_features(self, towers: Towers, pixels: torch.Tensor) -> torch.Tensor:
        """Serving: backbone features of preprocessed photos with the adapted last stage (the
        frozen prefix, its block taps and the colour histogram as in ``Towers.image_features``)."""
        with torch.inference_mode():
            act = image_prefix(image_trunk(towers), pixels.to(towers.device))
            taps = towers.taps.pooled() if towers.taps is not None else []
            trunk = torch.cat([self.image_pooled(act), *taps], dim=1)
            return towers.with_histogram(trunk, pixels)

    # -- persistence ---------------------------------------------------------------------------
    def delta_state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.state_dict().items() if "lora_" in k}

    def load_delta_state(self, state: dict[str, torch.Tensor]) -> None:
        missing = [k for k in self.delta_state() if k not in state]
        if missing:
            raise ModelError(f"LoRA weights lack {missing[:3]}...")
        self.load_state_dict(state, strict=False)

    @property
    def key(self) -> str:
        """Names these deltas' weights (a feature cache key part: adapted features never mix)."""
        h = hashlib.sha256(self.towers_key.encode())
        for name, t in sorted(self.delta_state().items()):
            h.update(name.encode())
            h.update(t.cpu().float().numpy().tobytes())
        return f"{self.towers_key}+lora-{h.hexdigest()[:12]}"

    def save(self, folder: str | os.PathLike[str]) -> Path:
        """``lora/config.json`` + ``lora/model.safetensors`` under ``folder`` (the aligner's)."""
        from safetensors.torch import save_file

        from vitrine.encoders.factory import sha256_file

        out = Path(folder) / LORA_DIR
        out.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous().cpu() for k, v in self.delta_state().items()}, str(out / WEIGHTS_NAME),
                  metadata={"kind": "lora"})
        cfg = {"kind": "lora", **asdict(self.spec), "towers_key": self.towers_key, "text_targets": list(TEXT_TARGETS),
               "image_targets": list(IMAGE_TARGETS), "image_cut": IMAGE_CUT,
               "weights_sha256": sha256_file(out / WEIGHTS_NAME)}
        (out / CONFIG_NAME).write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return out


def has_lora(folder: str | os.PathLike[str]) -> bool:
    return (Path(folder) / LORA_DIR / CONFIG_NAME).is_file()


def load_lora(folder: str | os.PathLike[str], towers: Towers) -> TowerLora:
    """The deltas saved beside an aligner, on these towers (their key must be the training one)."""
    from safetensors.torch import load_file

    from vitrine.encoders.factory import verify_sha256

    d = Path(folder) / LORA_DIR
    try:
        cfg = json.loads((d / CONFIG_NAME).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ModelError(f"no readable LoRA config in {d}: {e}") from e
    if cfg.get("towers_key") != towers.key:
        raise ModelError(f"LoRA deltas in {d} were trained on towers {cfg.get('towers_key')}, these are {towers.key}")
    verify_sha256(d / WEIGHTS_NAME, cfg.get("weights_sha256"))
    spec = LoraSpec(**{k: cfg[k] for k in ("text", "image", "rank", "alpha", "dropout", "text_layers")})
    lora = TowerLora(towers, spec)
    lora.load_delta_state(load_file(str(d / WEIGHTS_NAME)))
    return lora.to(towers.device)


# -- cut activations for training -----------------------------------------------------------------
def photo_activations(towers: Towers, photos: Sequence[bytes], decode: Callable[[bytes], Any], *,
                      cache: FeatureCache | None = None, batch: int = 8,
                      progress: Callable[[int], None] | None = None) -> np.ndarray:
    """The frozen image tower's activations after the cut for these photos, (N, C, H, W) float16;
    cached in the feature cache under their own keys (one flat vector per photo)."""
    keys = [f"{towers.key}:act{IMAGE_CUT}:{hashlib.sha256(b).hexdigest()}" for b in photos]
    got = cache.get_many(keys) if cache is not None else {}
    trunk = image_trunk(towers)
    with torch.inference_mode():
        probe = image_prefix(trunk, torch.zeros(1, 3, *towers.preprocess.size, device=towers.device))
    shape = tuple(probe.shape[1:])
    if towers.taps is not None:
        towers.taps.pooled()  # the probe's captures: dropped
    out = np.zeros((len(photos), *shape), dtype=np.float16)
    todo = []
    for i, k in enumerate(keys):
        if k in got:
            out[i] = got[k].reshape(shape)
        else:
            todo.append(i)
    for s in range(0, len(todo), batch):
        chunk = todo[s:s + batch]
        px = torch.stack([towers.preprocess(decode(photos[i])) for i in chunk]).to(towers.device)
        with torch.inference_mode():
            act = image_prefix(trunk, px).cpu().numpy().astype(np.float16)
        if towers.taps is not None:
            towers.taps.pooled()
        out[chunk] = act
        if cache is not None:
            cache.put_many((keys[i], act[j].reshape(-1)) for j, i in enumerate(chunk))
        if progress:
            progress(len(chunk))
    return out
