"""Pinyin: how a Chinese shopper types before the input method turns letters into characters.

A search box sees what the input method lets through: whole pinyin ("shoubiao"), initials ("sb"),
a mix ("shoub", "sbiao", "shb"), characters followed by letters ("手b"), or the wrong character
of the right sound ("手标" for 手表: a homophone the input method offered first). This module
reads a Chinese text as the syllables each of its characters may be read as, and matches such
typed forms against them; pypinyin's dictionary (PyPI) gives the readings, loaded on first use.

- :func:`readings`: a character's toneless readings ("行" -> ("xing", "hang", ...)), ü written v;
- :func:`syllables`: a text's readings per character (a non-Chinese character reads as itself);
- :func:`initials`: the first letters of a syllable sequence ("手表" -> "sb");
- :func:`parses`: the ways a typed Latin run splits into syllables and initials ("shoub" ->
  ["shou", "b"]), over the syllables a caller knows (its catalogue's);
- :func:`matches`: whether a typed form reads as the start of a syllable sequence;
- :func:`is_mixed`: whether a typed form is characters followed by letters ("手b").
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from functools import lru_cache

CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CJK_CHAR = re.compile(f"[{CJK}]")
_TYPED = re.compile(r"^[a-zA-Z\u00fc\u00dc' ]+$")
_lock = threading.Lock()
MAX_READINGS = 4  # readings kept per character (the common ones come first in pypinyin)
MAX_PARSES = 16


def has_cjk(text: str) -> bool:
    return bool(_CJK_CHAR.search(text))


def is_cjk_char(ch: str) -> bool:
    return bool(_CJK_CHAR.fullmatch(ch))


@lru_cache(maxsize=65536)
def readings(ch: str) -> tuple[str, ...]:
    """The toneless readings of one character, the most common first (ü as v); a character
    pypinyin does not know (or a non-Chinese one) reads as itself, case folded."""
    if not is_cjk_char(ch):
        return (ch.casefold(),)
    with _lock:  # pypinyin builds its tables on first use
        from pypinyin import Style, pinyin

        got = pinyin(ch, style=Style.NORMAL, heteronym=True, v_to_u=False, errors="ignore")
    out = tuple(dict.fromkeys(r.replace("ü", "v").casefold() for r in (got[0] if got else []) if r))
    return out[:MAX_READINGS] or (ch,)


def syllables(text: str) -> list[tuple[str, ...]]:
    """Per character of ``text``: the syllables it may be read as (spaces dropped)."""
    return [readings(ch) for ch in text if not ch.isspace()]


def initials(sylls: Sequence[Sequence[str]]) -> str:
    """The first letters of a syllable sequence, each position's first reading ("手表" -> "sb")."""
    return "".join(s[0][0] for s in sylls if s and s[0])


def full(sylls: Sequence[Sequence[str]]) -> str:
    """The whole pinyin of a syllable sequence, each position's first reading ("手表" -> "shoubiao")."""
    return "".join(s[0] for s in sylls if s)


def is_typed_pinyin(text: str) -> bool:
    """Whether ``text`` could be pinyin as typed: Latin letters, apostrophes and spaces only."""
    return bool(text) and bool(_TYPED.match(text))


_MIXED = re.compile(rf"[{CJK}][\s']*[a-zA-Z\u00fc\u00dc][a-zA-Z\u00fc\u00dc' ]*$")


def is_mixed(text: str) -> bool:
    """Whether ``text`` ends in pinyin letters typed after Chinese characters ("手b", "男士 shoub"):
    the characters the input method already turned, then the letters of the next ones."""
    return bool(_MIXED.search(text.strip()))


def typed(text: str) -> str:
    """A typed form as matched: case folded, spaces and apostrophes (syllable marks) dropped, ü as v."""
    return re.sub(r"[\s']+", "", text.casefold()).replace("ü", "v")


_ZCS = ("zh", "ch", "sh")


def _units(s: str, i: int, known: frozenset[str]) -> list[str]:
    """The units a typed string may start with at ``i``: a known syllable (longest first), or an
    initial (zh/ch/sh, or one letter)."""
    out = [s[i:j] for j in range(min(len(s), i + 6), i, -1) if s[i:j] in known]
    if s[i:i + 2] in _ZCS and s[i:i + 2] not in out:
        out.append(s[i:i + 2])
    if s[i] not in out and s[i] not in "iuv":  # no syllable starts with i, u or v
        out.append(s[i])
    return out


def parses(text: str, known: frozenset[str]) -> list[list[str]]:
    """The ways a typed Latin run splits into units (known syllables, or initials), at most
    :data:`MAX_PARSES`; the last unit may be any start of a syllable (typing goes on)."""
    s = typed(text)
    out: list[list[str]] = []

    def walk(i: int, acc: list[str]) -> None:
        if len(out) >= MAX_PARSES:
            return
        if i == len(s):
            out.append(list(acc))
            return
        for u in _units(s, i, known):
            acc.append(u)
            walk(i + len(u), acc)
            acc.pop()
        # the last unit, a start of a syllable being typed ("shoubi" -> shou + bi(ao))
        rest = s[i:]
        if len(rest) > 1 and rest not in known and rest in starts:
            out.append([*acc, rest])

    starts = syllable_starts(known)
    walk(0, [])
    return out


@lru_cache(maxsize=8)
def syllable_starts(known: frozenset[str]) -> frozenset[str]:
    """Every start of a syllable of ``known`` (a set lookup per typed tail, not a scan of them all)."""
    return frozenset(k[:i] for k in known for i in range(1, len(k) + 1))


def query_units(text: str, known: frozenset[str]) -> list[list[str]]:
    """The unit sequences a typed query may stand for: its Chinese characters as their readings
    (each a set of alternatives joined by "|", so a homophone reads as the right word), its Latin
    runs as their :func:`parses`. "手b" -> [["=shou", "b"]], "sb" -> [["s", "b"]]."""
    seqs: list[list[str]] = [[]]
    for run in re.findall(f"[{CJK}]|[^{CJK}]+", text):
        if is_cjk_char(run):
            alts = "=" + "|".join(readings(run))
            seqs = [[*q, alts] for q in seqs]
            continue
        run = typed(run)
        if not run:
            continue
        ps = parses(run, known)
        if not ps:
            return []
        seqs = [[*q, *p] for q in seqs for p in ps][:MAX_PARSES]
    return [q for q in seqs if q]


def matches(units: Sequence[str], sylls: Sequence[Sequence[str]]) -> bool:
    """Whether :func:`query_units` ``units`` read as the start of ``sylls``: a typed unit is one
    of its position's readings or that reading's initial (its first letter, or zh/ch/sh), the last
    one any start of a reading (typing goes on); a character's unit ("=shou|...") one of its
    readings, whole."""
    if len(units) > len(sylls):
        return False
    last = len(units) - 1
    for i, u in enumerate(units):
        opts = sylls[i]
        if u.startswith("="):
            if not set(u[1:].split("|")) & set(opts):
                return False
        elif not any(r == u or (r.startswith(u) and (i == last or u == r[0] or u in _ZCS)) for r in opts):
            return False
    return True
