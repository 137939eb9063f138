"""The intent classifier: transformers' ``Qwen2ForSequenceClassification`` over Qwen token ids.

Architecture from a JSON config (``configs/*.json``) through :func:`create_model`; the model
saves itself as ``config.json`` + ``model.safetensors`` (float16 on disk, float32 in memory, the
weights' SHA-256 recorded in the config and checked on load).

Reduced embedding matrix: a query is tokenised with the full Qwen vocabulary (151,851 ids), and
each id is mapped to a row of a small embedding table holding only the ids seen in training
(``keep_ids``, stored beside the weights); any other id maps to the UNK row. Rows 0/1/2 are
PAD/UNK/EOS. The EOS row (Qwen's ``<|endoftext|>``) ends every sequence: Qwen2's sequence
classifier reads the last non-pad position, which under causal attention has seen the whole query.
A full 151k x 192 table would be 58 MB in float16 for ids the training never touches.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vitrine.atomic import atomic_path, atomic_write_text
from vitrine.errors import InvalidInput, MissingExtra, ModelError

log = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
CONFIGS_DIR = Path(__file__).with_name("configs")
WEIGHTS_DIR = Path(__file__).with_name("weights")
DEFAULT_CONFIG = "qwen2-intent-tiny"
DEFAULT_WEIGHTS = "default"
MEMBERS_DIR = "members"  # an ensemble's other members: <weights>/members/<i>/ (each config.json + safetensors)
PAD, UNK, EOS = 0, 1, 2
N_SPECIAL_ROWS = 3
KEEP_IDS_KEY = "vitrine.keep_ids"


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:  # pragma: no cover - torch is a core dependency
        raise MissingExtra("the intent classifier needs torch") from e
    return torch


def load_arch_config(name_or_path: str | os.PathLike[str] = DEFAULT_CONFIG) -> dict[str, Any]:
    """An architecture config: a shipped name (``configs/NAME.json``) or a JSON file path."""
    p = Path(name_or_path)
    if not p.is_file():
        p = CONFIGS_DIR / f"{name_or_path}.json"
    if not p.is_file():
        shipped = ", ".join(sorted(x.stem for x in CONFIGS_DIR.glob("*.json")))
        raise ModelError(f"no intent architecture config {name_or_path!r}; shipped: {shipped}")
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ModelError(f"{p} is not valid JSON: {e}") from e
    cfg["config_name"] = p.stem
    return {k: v for k, v in cfg.items() if not k.startswith("_")}


def qwen2_config(arch: dict[str, Any], vocab_rows: int, num_labels: int) -> Any:
    from transformers import Qwen2Config

    kw = dict(arch["qwen2"])
    rope_theta = kw.pop("rope_theta", None)
    # num_labels and attn_implementation: PretrainedConfig keywords Qwen2Config takes at run time, though
    # its dataclass-style hints list only its own fields
    cfg = Qwen2Config(vocab_size=vocab_rows, num_labels=num_labels,  # type: ignore[call-arg]
                      pad_token_id=PAD, bos_token_id=None, eos_token_id=EOS,
                      attn_implementation=arch.get("attn_implementation", "sdpa"), **kw)
    if rope_theta is not None:
        rp = getattr(cfg, "rope_parameters", None)
        if isinstance(rp, dict):
            rp["rope_theta"] = float(rope_theta)
        else:  # transformers 4.x
            cfg.rope_theta = float(rope_theta)
    return cfg


@dataclass
class Encoded:
    rows: list[int]
    n_tokens: int
    truncated: bool


class IntentModel:
    """A Qwen2 sequence classifier plus its token-id -> embedding-row table."""

    def __init__(self, config: dict[str, Any], keep_ids: np.ndarray, model: Any | None = None) -> None:
        torch = _torch()
        from transformers import Qwen2ForSequenceClassification

        self.config = dict(config)
        self.labels: list[str] = list(config["labels"])
        self.max_tokens = int(config.get("max_tokens", 64))
        keep = np.asarray(keep_ids, dtype=np.int64)
        if keep.ndim != 1 or len(np.unique(keep)) != len(keep) or (len(keep) and keep.min() < 0):
            raise ModelError("keep_ids must be distinct non-negative token ids")
        self.keep_ids = keep
        vocab_size = int(config.get("tokenizer", {}).get("vocab_size", 151851))
        self._row_of = np.full(max(vocab_size, int(keep.max()) + 1 if len(keep) else 1), UNK, dtype=np.int64)
        self._row_of[keep] = np.arange(N_SPECIAL_ROWS, N_SPECIAL_ROWS + len(keep))
        self.config["vocab_rows"] = N_SPECIAL_ROWS + len(keep)
        if model is None:
            model = Qwen2ForSequenceClassification(qwen2_config(config, self.config["vocab_rows"], len(self.labels)))
        self.model = model
        self.model.eval()
        self._torch = torch

    # -- ids ----------------------------------------------------------------------------------------
    @property
    def row_of(self) -> np.ndarray:
        """Qwen token id -> embedding row (UNK for an id outside the kept table); read-only."""
        view = self._row_of.view()
        view.flags.writeable = False
        return view

    def clip(self, token_ids: list[int]) -> tuple[list[int], bool]:
        """The ids a query keeps (at most ``max_tokens - 1``: head and tail) and whether it was cut."""
        n = len(token_ids)
        limit = self.max_tokens - 1
        if n <= limit:
            return token_ids, False
        head = (limit * 3) // 4
        return token_ids[:head] + token_ids[n - (limit - head):], True

    def rows(self, token_ids: list[int]) -> Encoded:
        """Embedding rows for a query's Qwen ids: truncated (head and tail kept), EOS appended."""
        n = len(token_ids)
        token_ids, truncated = self.clip(token_ids)
        ids = np.asarray(token_ids, dtype=np.int64)
        ok = (ids >= 0) & (ids < len(self._row_of))
        rows = np.where(ok, self._row_of[np.clip(ids, 0, len(self._row_of) - 1)], UNK)
        return Encoded(rows.tolist() + [EOS], n, truncated)

    def batch(self, encoded: list[Encoded]) -> tuple[Any, Any]:
        torch = self._torch
        width = max(len(e.rows) for e in encoded)
        ids = torch.full((len(encoded), width), PAD, dtype=torch.long)
        mask = torch.zeros((len(encoded), width), dtype=torch.long)
        for i, e in enumerate(encoded):
            ids[i, : len(e.rows)] = torch.tensor(e.rows)
            mask[i, : len(e.rows)] = 1
        return ids, mask

    def logits(self, encoded: list[Encoded]) -> Any:
        ids, mask = self.batch(encoded)
        if len(encoded) == 1:
            return self.model(input_ids=ids).logits
        return self.model(input_ids=ids, attention_mask=mask).logits

    def probabilities(self, encoded: list[Encoded]) -> np.ndarray:
        torch = self._torch
        with torch.inference_mode():
            return torch.softmax(self.logits(encoded).float(), dim=-1).numpy()

    def n_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    # -- persistence ----------------------------------------------------------------------------------
    def save_pretrained(self, folder: str | os.PathLike[str]) -> Path:
        """``config.json`` + ``model.safetensors`` (float16), written atomically."""
        torch = self._torch
        from safetensors.torch import save_file

        folder = Path(folder)
        state = {k: (v.detach().cpu().half() if v.is_floating_point() else v.detach().cpu()).contiguous()
                 for k, v in self.model.state_dict().items()}
        state[KEEP_IDS_KEY] = torch.from_numpy(self.keep_ids.astype(np.int32))
        cfg = dict(self.config)
        with atomic_path(folder / WEIGHTS_NAME) as tmp_w:
            save_file(state, str(tmp_w), metadata={"architecture": "Qwen2ForSequenceClassification", "dtype": "float16"})
            cfg["weights_sha256"] = _sha256(tmp_w)
        atomic_write_text(folder / CONFIG_NAME, json.dumps(cfg, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
        return folder

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike[str]) -> "IntentModel":
        """Load a saved classifier: a folder, or a shipped name under ``weights/``."""
        from safetensors.torch import load_file

        path = resolve_weights(folder)
        cfg_file, w_file = path / CONFIG_NAME, path / WEIGHTS_NAME
        try:
            config = json.loads(cfg_file.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise ModelError(f"intent classifier config {cfg_file} is unreadable: {e}") from e
        want = config.get("weights_sha256")
        got = _sha256(w_file)
        if want and got != want:
            raise ModelError(f"{w_file} has SHA-256 {got}, its config says {want}: refusing altered weights")
        try:
            state = load_file(str(w_file))
        except Exception as e:  # safetensors raises several types
            raise ModelError(f"cannot read {w_file}: {e}") from e
        keep = state.pop(KEEP_IDS_KEY, None)
        if keep is None:
            raise ModelError(f"{w_file} has no {KEEP_IDS_KEY} table")
        obj = cls(config, keep.numpy().astype(np.int64))
        state = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
        try:
            obj.model.load_state_dict(state, strict=True)
        except RuntimeError as e:
            raise ModelError(f"intent weights in {w_file} do not fit their config: {e}") from e
        obj.model.eval()
        return obj


def resolve_weights(folder: str | os.PathLike[str]) -> Path:
    p = Path(folder)
    if (p / CONFIG_NAME).is_file() and (p / WEIGHTS_NAME).is_file():
        return p
    q = WEIGHTS_DIR / str(folder)
    if (q / CONFIG_NAME).is_file() and (q / WEIGHTS_NAME).is_file():
        return q
    shipped = ", ".join(sorted(x.name for x in WEIGHTS_DIR.iterdir() if (x / CONFIG_NAME).is_file())) \
        if WEIGHTS_DIR.is_dir() else "none"
    raise ModelError(f"no intent classifier at {folder} (needs {CONFIG_NAME} + {WEIGHTS_NAME}); shipped: {shipped}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def init_from_pretrained(path: Path, arch: dict[str, Any], keep_ids: np.ndarray, labels: list[str]) -> IntentModel:
    """A classifier initialised from a pretrained Qwen checkpoint: a Hugging Face folder
    (config.json + safetensors) or a GGUF file (read by transformers' GGUF support, which needs
    the ``gguf`` package). The checkpoint's architecture replaces the small config; its embedding
    rows for ``keep_ids`` become the reduced table (PAD/UNK/EOS rows from its ``<|endoftext|>``)."""
    torch = _torch()
    from transformers import AutoConfig, Qwen2ForSequenceClassification

    path = Path(path)
    kwargs: dict[str, Any] = {"num_labels": len(labels)}
    if path.is_file() and path.suffix.lower() == ".gguf":
        if importlib.util.find_spec("gguf") is None:  # transformers reads the file with it
            raise MissingExtra("--init-from a GGUF file needs the `gguf` package (pip install gguf); "
                               "or convert the checkpoint to a Hugging Face folder")
        src, kwargs["gguf_file"] = path.parent, path.name
    elif path.is_dir() and (path / "config.json").is_file():
        src = path
    else:
        raise InvalidInput(f"--init-from {path}: expected a Hugging Face Qwen folder (config.json + weights) "
                           "or a .gguf file")
    try:
        hf_cfg = AutoConfig.from_pretrained(str(src), local_files_only=True,
                                            **({"gguf_file": kwargs["gguf_file"]} if "gguf_file" in kwargs else {}))
    except Exception as e:  # transformers raises many kinds
        raise ModelError(f"cannot read a model config from {path}: {e}") from e
    if getattr(hf_cfg, "model_type", None) not in ("qwen2", "qwen3"):
        raise InvalidInput(f"--init-from {path} is a {getattr(hf_cfg, 'model_type', '?')} model, not Qwen2")
    try:
        base = Qwen2ForSequenceClassification.from_pretrained(str(src), local_files_only=True,
                                                              torch_dtype=torch.float32, **kwargs)
    except Exception as e:
        raise ModelError(f"cannot load Qwen weights from {path}: {e}") from e
    weight = base.get_input_embeddings().weight
    if not isinstance(weight, torch.Tensor):
        raise ModelError(f"{path} has no token embedding matrix")
    full = weight.detach()
    keep = np.asarray(keep_ids, dtype=np.int64)
    if len(keep) and int(keep.max()) >= full.shape[0]:
        raise ModelError(f"{path} has {full.shape[0]} token embeddings; the Qwen tokenizer needs ids up to "
                         f"{int(keep.max())}")
    eot = 151643 if full.shape[0] > 151643 else 0
    rows = torch.cat([full[eot:eot + 1].clone(), full[eot:eot + 1].clone(), full[eot:eot + 1].clone(),
                      full[torch.from_numpy(keep)]], dim=0)
    emb = torch.nn.Embedding(rows.shape[0], rows.shape[1], padding_idx=None)
    emb.weight.data.copy_(rows)
    base.set_input_embeddings(emb)
    base.config.vocab_size = rows.shape[0]
    base.config.pad_token_id = PAD
    base.config.eos_token_id = EOS
    qcfg = {k: v for k, v in base.config.to_dict().items()
            if k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                     "intermediate_size", "hidden_act", "max_position_embeddings", "rms_norm_eps",
                     "attention_dropout", "initializer_range", "use_sliding_window", "sliding_window",
                     "max_window_layers")}
    qcfg.update(tie_word_embeddings=False, use_cache=False)
    rp = getattr(base.config, "rope_parameters", None)
    theta = (rp or {}).get("rope_theta") if isinstance(rp, dict) else getattr(base.config, "rope_theta", None)
    if theta is not None:
        qcfg["rope_theta"] = float(theta)
    config = dict(arch, qwen2=qcfg, labels=list(labels), init_from=str(path))
    return IntentModel(config, keep, model=base)
