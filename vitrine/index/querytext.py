"""A query as Vitrine groups it (the feedback log, analytics, learned re-rankings, merchandising
rules): NFKC (full-width letters, digits and punctuation as half-width), casefolded, punctuation
and whitespace collapsed to one space, no space between two CJK characters, traditional Chinese as
simplified ("Red  Shoes!" and "red shoes" are one query; so are "夏季 连衣裙" and "夏季连衣裙",
"男士手錶" and "男士手表", "ＮＩＫＥ　跑鞋" and "nike跑鞋")."""

from __future__ import annotations

import re
import unicodedata

from vitrine.lang.simplify import simplify

CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_CJK_GAP = re.compile(f"(?<=[{CJK}]) (?=[{CJK}])")
_NON_WORD = re.compile(r"[\W_]+", re.UNICODE)


def normalise_query(text: str | None) -> str:
    """The normalised form of a query (see the module docstring); "" for none."""
    if not text:
        return ""
    return simplify(_CJK_GAP.sub("", _NON_WORD.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()))
