"""The text tower's precision in batch encodes (ingest, re-embedding, training features, evals).

A product's vector is made once and kept, so its tower forward is the cost of ingesting it
(bench-results/ingest-profile.md: the text tower is ~85% of a text-only ingest). Where the CPU
multiplies bfloat16 natively (AVX512-BF16, AMX) a bf16 forward of the text tower runs 1.7-2x as
fast as a float32 one; under :func:`torch.autocast` the matrix products run in bf16 while layer
norms, softmax and reductions stay float32, so a text's features match float32's to a cosine of
0.99997 (measured on the shipped towers) and retrieval quality is unchanged within +-0.003
(bench-results/batch-precision-quality.md). Where bf16 is emulated it is slower than float32, so
``auto`` measures instead of assuming: one small matrix product of the text tower's shape in
each precision, once per process, on first use.

Photos stay float32. The photo tower gains as much (1.5-2.4x), but its features move more
(cosine 0.997 per photo, its pooled block taps through depthwise convolutions) and a shopper's
photo of a product, encoded per query in float32, must find that product's stored vector at its
full score (a photo searched as itself scored 0.989 instead of 1.0 under bf16; tests rely on
such exact matches to tell a torn index apart). Queries keep their own precision
(``query_text_precision``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Iterator

import torch

from vitrine.errors import InvalidInput

log = logging.getLogger(__name__)

BATCH_PRECISIONS: tuple[str, ...] = ("auto", "fp32", "bf16")
# bf16 is chosen where its matrix products beat float32's by this much: below it the saving does
# not pay for the casts around them (the tower is not only matrix products).
MIN_SPEEDUP = 1.3


def _best_seconds(fn: "functools.partial[torch.Tensor]", rounds: int = 5, calls: int = 2) -> float:
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t) / calls)
    return best


@functools.cache
def bf16_speedup(device_type: str) -> float:
    """How many times faster a bf16 matrix product of a text-tower layer's shape (256 tokens x
    384 -> 1536) runs than a float32 one on this device, best of five each (about 40 ms on a CPU;
    cached for the process). 0 where bf16 cannot run here."""
    if device_type == "cuda":
        return 2.0 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else 0.0
    if device_type != "cpu":
        return 0.0
    try:
        times = {}
        for dtype in (torch.float32, torch.bfloat16):
            a = torch.randn(256, 384).to(dtype)
            w = torch.randn(1536, 384).to(dtype)
            fn = functools.partial(torch.nn.functional.linear, a, w)
            fn()  # the first call picks and caches the kernel
            times[dtype] = _best_seconds(fn)
    except RuntimeError as e:  # a build without bf16 kernels
        log.info("bf16 matrix products do not run here (%s): batch encodes stay float32", e)
        return 0.0
    return times[torch.float32] / max(times[torch.bfloat16], 1e-9)


def resolve_batch_precision(requested: str, device_type: str) -> str:
    """``fp32`` or ``bf16`` for ``requested`` (``auto`` measures: :func:`bf16_speedup`)."""
    if requested not in BATCH_PRECISIONS:
        raise InvalidInput(f"unknown batch precision {requested!r}; use one of {', '.join(BATCH_PRECISIONS)}")
    if requested != "auto":
        return requested
    speedup = bf16_speedup(device_type)
    chosen = "bf16" if speedup >= MIN_SPEEDUP else "fp32"
    log.info("batch encodes in %s (bf16 matrix products %.2fx float32's on %s)", chosen, speedup, device_type)
    return chosen


@contextlib.contextmanager
def batch_autocast(precision: str, device_type: str) -> Iterator[None]:
    """The towers' forwards inside run in ``precision`` (``fp32``: as they are)."""
    if precision != "bf16":
        yield
        return
    with torch.autocast(device_type, dtype=torch.bfloat16):
        yield
