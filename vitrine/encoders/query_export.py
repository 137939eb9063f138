"""The query towers in other forms: onnxruntime graphs (exported, checked, int8) and torch copies in
reduced precision.

:class:`~vitrine.encoders.queries.QueryEncoder` serves queries through what this module builds:

- :func:`export_query_graphs`: the text tower and the image tower exported to ONNX
  (:meth:`~vitrine.onnxrt.OnnxModule.export`, checked against torch on probe inputs), and the text
  graph with int8 MatMuls when asked for (:func:`quantize_text_graph`);
- :func:`quantize_text_tower`: a torch copy of the text tower in ``bf16`` or dynamically
  quantised ``int8`` (queries only: product vectors are unchanged, so switching needs no
  re-indexing).
"""

from __future__ import annotations

import copy
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from vitrine.errors import InvalidInput, VitrineError
from vitrine.onnxrt import OnnxModule, eager_attention

if TYPE_CHECKING:  # pragma: no cover
    from vitrine.encoders.encoder import MultimodalEncoder

log = logging.getLogger(__name__)

# Queries the ONNX text graphs are checked on (short, long, one character, non-Latin).
PROBE_TEXTS = ("women red heels under 1500", "x", "nike", "men's navy blue slim fit cotton shirt for office",
               "红色 高跟鞋", "puma running shoes", "kids blue denim jacket with hood", "gold plated earrings")

Precision = Literal["fp32", "bf16", "int8"]
PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "int8")


def quantize_text_tower(module: torch.nn.Module, precision: str) -> torch.nn.Module:
    """A copy of a text tower in ``precision`` (the original is untouched); fp32 returns it as is."""
    if precision == "fp32":
        return module
    if precision == "bf16":
        return copy.deepcopy(module).to(torch.bfloat16).eval()
    if precision == "int8":
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        with warnings.catch_warnings():  # torch announces the deprecation of quantized tensors
            warnings.simplefilter("ignore")
            # per output channel: per-tensor scales lose noticeably more on MiniLM (measured)
            q = quantize_dynamic(copy.deepcopy(module).float().eval(), {torch.nn.Linear: per_channel_dynamic_qconfig},
                                 dtype=torch.qint8)
        return q.eval()
    raise InvalidInput(f"unknown text precision {precision!r}; use one of {', '.join(PRECISIONS)}")


@dataclass
class QueryGraphs:
    """The query towers as onnxruntime graphs; ``int8``: the text graph has int8 MatMuls."""

    text: OnnxModule
    image: OnnxModule
    int8: bool = False


def export_query_graphs(encoder: MultimodalEncoder, text_module: torch.nn.Module, *, precision: str,
                        onnx_dir: Path | None, threads: int) -> QueryGraphs:
    """Both query towers of ``encoder`` as checked onnxruntime graphs (cached in ``onnx_dir``);
    ``text_module`` is the fp32 Hugging Face text tower. ``precision`` int8 quantises the text graph
    (raises when it cannot), auto tries it and keeps float32 if it cannot be built. Raises
    :class:`~vitrine.errors.VitrineError` when a graph cannot be had."""
    text = export_text_tower(encoder, text_module, onnx_dir=onnx_dir, threads=threads)
    image = export_image_tower(encoder, onnx_dir=onnx_dir, threads=threads)
    if precision not in ("int8", "auto"):
        return QueryGraphs(text, image)
    try:
        return QueryGraphs(quantize_text_graph(text, encoder.towers.hf_tokenizer, threads=threads), image, int8=True)
    except VitrineError as e:
        if precision == "int8":
            raise
        log.warning("query text tower keeps float32: %s", e)
        return QueryGraphs(text, image)


def export_text_tower(encoder: MultimodalEncoder, module: torch.nn.Module, *, onnx_dir: Path | None,
                      threads: int) -> OnnxModule:
    """The text tower (token ids -> features) as a checked onnxruntime graph."""
    towers = encoder.towers
    tok = towers.hf_tokenizer

    def ids(texts: list[str]) -> torch.Tensor:
        return tok(texts, padding=True, truncation=True, max_length=towers.context_length,
                   return_tensors="pt")["input_ids"]

    probes = [(ids([PROBE_TEXTS[0]]),), (ids([PROBE_TEXTS[1]]),), (ids(list(PROBE_TEXTS[2:5])),)]
    config = getattr(getattr(module, "transformer", None), "config", None)
    with encoder.lock:  # the towers are shared with ingest; nobody encodes while we trace
        return OnnxModule.export(
            module, probes[0], key=f"text:{towers.key}", cache_dir=onnx_dir,
            input_names=["ids"], dynamic_axes={"ids": {0: "batch", 1: "tokens"}, "out": {0: "batch"}},
            probes=probes, threads=threads, prepare=eager_attention(config))


def quantize_text_graph(graph: OnnxModule, tokenizer: Any, *, threads: int) -> OnnxModule:
    """The text graph with int8 MatMuls, except the first encoder layer and the
    activation-by-activation products of attention: measured on the validation split, that
    recipe keeps KAGL R@10 and MRR@10 within 0.005 of float32 at about half the time per
    query (quantising every layer does not). Raises when it cannot be built or strays."""
    probes = [(tokenizer([t], return_tensors="np")["input_ids"].astype(np.int64),) for t in PROBE_TEXTS]
    probes.append((tokenizer(list(PROBE_TEXTS), padding=True, return_tensors="np")["input_ids"].astype(np.int64),))

    def keep_float(node: Any, weights: set[str]) -> bool:
        first_layer = any(f"{part}.0/" in node.name for part in ("layer", "layers", "resblocks"))
        return first_layer or not any(x in weights for x in node.input)

    # the cosine floor catches a broken graph; quality itself is measured by the bench
    return graph.quantized(key="int8-skip-first-layer", exclude=keep_float, probes=probes, min_cosine=0.97,
                           threads=threads)


def export_image_tower(encoder: MultimodalEncoder, *, onnx_dir: Path | None, threads: int) -> OnnxModule:
    """The image tower's trunk (pixels -> features before the colour histogram) as a checked
    onnxruntime graph."""
    towers = encoder.towers
    h, w = towers.preprocess.size
    gen = torch.Generator().manual_seed(0)
    probes = [(torch.randn(n, 3, h, w, generator=gen),) for n in (1, 3)]
    with encoder.lock:  # the block taps keep per-forward state: no other forward meanwhile
        return OnnxModule.export(
            towers.image_export_module().eval(), probes[0], key=f"image:{towers.key}",
            cache_dir=onnx_dir, input_names=["pixels"],
            dynamic_axes={"pixels": {0: "batch"}, "out": {0: "batch"}}, probes=probes, threads=threads)
