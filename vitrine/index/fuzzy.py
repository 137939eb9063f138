"""Typo-tolerant word matching, shared by the word signals (BM25, highlighting; slot vocabularies
may use it too).

A word may differ from a vocabulary word by a few edits, more for longer words (as Algolia and
Typesense allow): none under 4 characters, one from 4, two from 8. The distance is the optimal
string alignment distance (insertions, deletions, substitutions, and a swap of two neighbours
counted as one edit), from rapidfuzz.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rapidfuzz import process
from rapidfuzz.distance import OSA

from vitrine.lru import LRU

MIN_ONE_EDIT = 4
MIN_TWO_EDITS = 8


def max_edits(word: str) -> int:
    """Edits allowed in a word of this length."""
    n = len(word)
    return 0 if n < MIN_ONE_EDIT else 1 if n < MIN_TWO_EDITS else 2


def distance(a: str, b: str) -> int:
    return int(OSA.distance(a, b))


def is_close(a: str, b: str, edits: int) -> bool:
    """Whether ``a`` and ``b`` are at most ``edits`` edits apart."""
    return a == b or (edits > 0 and OSA.distance(a, b, score_cutoff=edits) <= edits)


def nearest(word: str, vocabulary: Sequence[str], edits: int, *, limit: int = 20) -> list[tuple[str, int]]:
    """Vocabulary words within ``edits`` of ``word`` as (word, distance), closest first."""
    if edits <= 0 or not vocabulary:
        return []
    got = process.extract(word, vocabulary, scorer=OSA.distance, score_cutoff=edits, limit=limit)
    return [(w, int(d)) for w, d, _ in sorted(got, key=lambda t: (t[1], t[2]))]


class Corrections:
    """Best vocabulary match of unknown words: the closest, then the most frequent (``weight``);
    remembered until :meth:`clear` (call it when the vocabulary changes)."""

    def __init__(self, size: int = 20_000) -> None:
        self._memo: LRU[str | None] = LRU(size)
        self._near: LRU[list[tuple[str, int]]] = LRU(size)

    def clear(self) -> None:
        self._memo.clear()
        self._near.clear()

    def near(self, word: str, edits: int, vocabulary: Callable[[], Sequence[str]]) -> list[tuple[str, int]]:
        """:func:`nearest` over the vocabulary, remembered."""
        return self._near.get_or_compute((word, edits), lambda: nearest(word, vocabulary(), edits))

    def best(self, word: str, edits: int, vocabulary: Callable[[], Sequence[str]],
             weight: Callable[[str], float]) -> str | None:
        def compute() -> str | None:
            found = self.near(word, edits, vocabulary)  # the list the query's reading chose from
            if not found:
                return None
            d0 = found[0][1]
            return max((w for w, d in found if d == d0), key=lambda w: (weight(w), w))

        return self._memo.get_or_compute((word, edits), compute)
