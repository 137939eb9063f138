"""Chinese word segmentation (jieba), loaded once on first use.

``has_cjk`` tells whether a text holds Chinese characters at all, so English-only text never pays
for the segmenter. ``words`` cuts a text into words in search-engine mode (a long word also
yields its shorter dictionary words: "四柱床" -> "四柱", "柱床", "四柱床"), dropping spaces and
punctuation; ``bigrams`` gives the overlapping character pairs of each Chinese run, the usual
recall net under a segmenter that misses a shop's own words.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

log = logging.getLogger(__name__)

CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CJK_CHAR = re.compile(f"[{CJK}]")
_CJK_RUN = re.compile(f"[{CJK}]+")
_lock = threading.Lock()
_tokenizer: Any = None


def has_cjk(text: str) -> bool:
    return bool(_CJK_CHAR.search(text or ""))


def cjk_runs(text: str) -> list[str]:
    return _CJK_RUN.findall(text or "")


def tokenizer() -> Any:
    """The process's one jieba tokenizer (its dictionary loads on the first call, ~1 s)."""
    global _tokenizer
    with _lock:
        if _tokenizer is None:
            import jieba

            jieba.setLogLevel(logging.WARNING)
            tok = jieba.Tokenizer()
            tok.initialize()
            _tokenizer = tok
        return _tokenizer


_added: set[str] = set()


def add_words(new: Iterable[str]) -> None:
    """Make ``new`` words the segmenter keeps whole (a shop's words jieba's dictionary lacks)."""
    todo = [w for w in new if segment_worthy(w) and w not in _added]
    if not todo:
        return
    tok = tokenizer()
    with _lock:
        for w in todo:
            tok.add_word(w)
            _added.add(w)
    _cut.cache_clear()


def segment_worthy(word: str) -> bool:
    return len(word) > 1 and has_cjk(word)


@lru_cache(maxsize=65536)
def _cut(text: str, search_mode: bool) -> tuple[str, ...]:
    tok = tokenizer()
    parts = tok.cut_for_search(text) if search_mode else tok.cut(text)
    return tuple(p.strip() for p in parts if p.strip() and not re.fullmatch(r"[\W_]+", p.strip()))


def words(text: str, search_mode: bool = False) -> list[str]:
    """The words of ``text``; English words pass through lower-cased, Chinese runs are segmented."""
    if not has_cjk(text):
        return [w for w in re.findall(r"\w+", (text or "").lower())]
    return [w.lower() for w in _cut(text, search_mode)]


def bigrams(text: str) -> list[str]:
    out: list[str] = []
    for run in cjk_runs(text):
        out.extend(run[i:i + 2] for i in range(len(run) - 1))
    return out
