"""Traditional Chinese as simplified: one query, however a shopper's input method writes it.

"男士手錶" and "男士手表" are one query for analytics, rules and the feedback log. :func:`simplify`
rewrites each run of Chinese characters word by word through CC-CEDICT's traditional -> simplified
pairs (vitrine/lang/cedict.py), the longest traditional word first (a character's simplified form
can depend on its word), a character alone where no word covers it. Text without Chinese
characters is returned as it is, without loading the dictionary.
"""

from __future__ import annotations

import re
from functools import lru_cache

from vitrine.lang import cedict

CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_RUN = re.compile(f"[{CJK}]+")
MAX_WORD = 4


def _run(run: str) -> str:
    table = cedict.dictionary().to_simplified
    out: list[str] = []
    i = 0
    while i < len(run):
        for n in range(min(MAX_WORD, len(run) - i), 0, -1):
            piece = run[i:i + n]
            simple = table.get(piece)
            if simple is not None and len(simple) == n:
                out.append(simple)
                i += n
                break
        else:
            out.append(run[i])
            i += 1
    return "".join(out)


@lru_cache(maxsize=65536)
def simplify(text: str) -> str:
    """``text`` with its traditional Chinese characters simplified ("男士手錶" -> "男士手表")."""
    if not text or not _RUN.search(text):
        return text
    return _RUN.sub(lambda m: _run(m.group()), text)
