"""One-edit typos as shoppers make them: a swap, a dropped, doubled or neighbouring-key letter."""

from __future__ import annotations

import random
from collections.abc import Callable

KEYBOARD = "qwertyuiopasdfghjklzxcvbnm"


def typo(w: str, rng: random.Random) -> str:
    """``w`` with one edit inside it (never the first letter); words under 3 letters unchanged."""
    if len(w) < 3:
        return w
    i = rng.randrange(1, len(w) - 1)
    op = rng.random()
    if op < 0.3:
        return w[:i] + w[i + 1] + w[i] + w[i + 2:]
    if op < 0.55:
        return w[:i] + w[i + 1:]
    if op < 0.8:
        return w[:i] + w[i] + w[i:]
    return w[:i] + rng.choice(KEYBOARD) + w[i + 1:]


def typo_fn(rng: random.Random) -> Callable[[str], str]:
    return lambda w: typo(w, rng)
