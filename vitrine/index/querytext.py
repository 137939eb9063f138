"""A query as Vitrine groups it (the feedback log, learned re-rankings, merchandising rules): NFKC,
casefolded, punctuation and whitespace collapsed to one space, no space between two CJK characters
("Red  Shoes!" and "red shoes" are one query; so are "夏季 连衣裙" and "夏季连衣裙")."""

from __future__ import annotations

import re
import unicodedata

CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_CJK_GAP = re.compile(f"(?<=[{CJK}]) (?=[{CJK}])")
_NON_WORD = re.compile(r"[\W_]+", re.UNICODE)


def normalise_query(text: str | None) -> str:
    """The normalised form of a query (see the module docstring); "" for none."""
    if not text:
        return ""
    return _CJK_GAP.sub("", _NON_WORD.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip())
