"""Chinese text rendered as English words for the English text tower (docs/design.md "Languages").

The text tower (MiniLM) never learned Chinese. A product title written in Chinese, and a Chinese
query on a catalogue written in Chinese, are therefore embedded by their *English rendering*: each
Chinese run is cut into the dictionary's words and each word is written as its usual English
(the shop-word table first, then CC-CEDICT's first sense), with no catalogue vocabulary in the
loop: a product and a query meet in the same rendering whatever catalogue they belong to.

Only Chinese runs are rendered: text without Chinese characters comes back unchanged (an English
catalogue's embeddings stay bit-identical), and the English, digits and brand names around a run
are kept in place ("Nike/耐克 男士黑色跑步鞋" -> "Nike/nike men black running shoes").
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Mapping
from functools import lru_cache

from vitrine.lang import segment
from vitrine.lang.translate import Translator

RENDERING = 1  # the rendering's version: a product hashed under another is re-embedded on re-ingest
_lock = threading.Lock()
_translator: Translator | None = None


class OpenVocabulary(Mapping[str, int]):
    """A vocabulary that holds every word once: the translator then reads each Chinese word by
    its dictionary order alone (first table gloss, first sense), not by what a catalogue holds."""

    def __getitem__(self, key: str) -> int:
        return 1

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def _stem(word: str) -> list[str]:
    return [word]


def translator() -> Translator:
    """The process's one dictionary-order translator (one English phrase per Chinese word)."""
    global _translator
    with _lock:
        if _translator is None:
            # the dictionary's order alone, as the rendering was made (RENDERING 1): no catalogue prior,
            # function characters and decades as the dictionary reads them
            _translator = Translator(OpenVocabulary(), _stem, 1, second_share=None, sense_prior=0.0, grammar=False)
        return _translator


def for_tower(text: str) -> str:
    """What the English text tower reads for ``text``: ``text`` itself unless it holds Chinese
    (no cost for English), else :func:`to_english`."""
    return to_english(text) if segment.has_cjk(text) else text


@lru_cache(maxsize=65536)
def to_english(text: str) -> str:
    """``text`` with each Chinese run written as English words (unchanged without Chinese)."""
    if not segment.has_cjk(text):
        return text
    tr = translator()
    out: list[str] = []
    for part in re.split(f"([{segment.CJK}]+)", text):
        if not part:
            continue
        if not segment.has_cjk(part):
            out.append(part)
            continue
        words: list[str] = []
        for piece in tr.pieces(part):
            eng = tr.word(piece)[0]
            words.extend(eng if eng else [piece])  # a word the dictionary lacks stays as written
        out.append(f" {' '.join(words)} ")
    return " ".join("".join(out).split())
