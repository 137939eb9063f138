"""The MoE gate's float16 query weights (:class:`~vitrine.encoders.moe.CrossModalMoE`,
``query_precision="float16"``).

At inference the gate's input projections and experts read float16 copies of their weights (the
outputs stay float32): unless the weights already sit in the CPU's caches, a query's time in the
gate goes on reading them, and float16 halves the bytes. The copies are made once per set of
weights; every batch size uses the same copies, so a query's vector does not depend on what it
was batched with.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class HalfWeights:
    """float16 copies of named Linear layers, made on first use from ``layers()`` and kept until
    :meth:`clear` (the gate clears them whenever its weights may change)."""

    def __init__(self, layers: Callable[[], dict[str, nn.Linear]]) -> None:
        self._layers = layers
        self.copies: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None

    def clear(self) -> None:
        self.copies = None

    def get(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        if self.copies is None:
            with torch.inference_mode(False), torch.no_grad():  # plain tensors, usable in any mode
                self.copies = {k: (lin.weight.detach().half(), lin.bias.detach().half())
                               for k, lin in self._layers().items()}
        return self.copies

    def linear(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """Layer ``name``'s product in float16; the output is float32."""
        w, b = self.get()[name]
        return F.linear(x.half(), w, b).float()

    def mlp(self, first: str, second: str, x: torch.Tensor) -> torch.Tensor:
        """Two layers with a GELU between them, in float16 end to end between the two products: the
        hidden layer is rounded to float16 for the second product anyway, and torch's float16 GELU
        is several times faster on CPU than a float32 round trip (it differs from
        GELU-in-float32-then-rounded in about 1 hidden value in 10^6, by one float16 step)."""
        (w1, b1), (w2, b2) = self.get()[first], self.get()[second]
        return F.linear(F.gelu(F.linear(x.half(), w1, b1)), w2, b2).float()
