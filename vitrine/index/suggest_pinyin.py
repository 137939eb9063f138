"""Chinese phrases of a suggestion index found by pinyin, initials and homophones.

A Chinese shopper's search box holds what the input method let through: "shoubiao", "sb", "shoub",
"手b", or "手标" (the homophone it offered first) while the shopper wants 手表. :class:`PinyinIndex`
keys each Chinese phrase of a :class:`vitrine.index.suggest.SuggestIndex` by the initials of its
syllables (vitrine/lang/pinyin.py: each character's readings, heteronyms included) from each place
a typed form may start: the phrase's start, each space-separated word's start, and each character
of a short phrase (a category, brand or logged query: "sb" finds "男士手表" too); a title only from
its words' starts. A lookup turns what was typed into unit sequences (syllables, initials, and
its own characters' readings), takes the entries whose initials start with theirs (a sorted array
and a bisection) and keeps those whose syllables the units read as.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence

import numpy as np

from vitrine.lang import pinyin

_CJK = re.compile(f"[{pinyin.CJK}]")
MAX_CHARS = 12  # syllables kept per entry (what a typed form can reach from its start)
SHORT_PHRASE = 8  # a phrase up to this many characters is findable from each of its characters
MAX_CANDIDATES = 4000  # entries verified per lookup pass at most (the heaviest phrases first)
MIN_TYPED = 2  # a Latin query shorter than this is left to the prefix index (too many readings)


class PinyinIndex:
    """The Chinese phrases of a suggestion index by their readings (built from its keys)."""

    def __init__(self, keys: Sequence[str], kinds: Sequence[str]) -> None:
        rows: list[tuple[str, int, int]] = []  # (initials from the start, phrase id, start offset)
        self._sylls: dict[int, list[tuple[str, ...]]] = {}
        known: set[str] = set()
        for pid in np.flatnonzero([bool(_CJK.search(key)) for key in keys]).tolist():
            key = keys[pid]
            chars = key.replace(" ", "")
            sylls = pinyin.syllables(chars)
            self._sylls[pid] = sylls
            for opts in sylls:
                known.update(opts)
            starts = {0}
            pos = 0
            for word in key.split(" "):
                starts.add(pos)
                if kinds[pid] != "title" and len(chars) <= SHORT_PHRASE:
                    starts.update(pos + i for i, ch in enumerate(word) if pinyin.is_cjk_char(ch))
                pos += len(word)
            for s in sorted(starts):
                if s < len(sylls) and pinyin.is_cjk_char(chars[s]):
                    rows.append((pinyin.initials(sylls[s:s + MAX_CHARS]), pid, s))
        rows.sort()
        self._initials = [r[0] for r in rows]
        self._pids = np.asarray([r[1] for r in rows], dtype=np.int32)
        self._starts = np.asarray([r[2] for r in rows], dtype=np.int32)
        self.chinese = len(self._sylls) * 2 >= max(1, len(keys))  # mostly Chinese phrases: a Chinese shop
        self.known: frozenset[str] = frozenset(k for k in known if k.isascii() and k.isalpha())

    def __len__(self) -> int:
        return len(self._initials)

    def wanted(self, query: str) -> bool:
        """Whether ``query`` may be pinyin or hold Chinese for this index to read."""
        if not self._initials:
            return False
        q = query.strip()
        if pinyin.has_cjk(q):
            return True
        return pinyin.is_typed_pinyin(q) and len(pinyin.typed(q)) >= MIN_TYPED

    def _range(self, prefix: str) -> np.ndarray:
        lo = bisect.bisect_left(self._initials, prefix)
        hi = bisect.bisect_left(self._initials, prefix + "\x7f")
        return np.arange(lo, hi, dtype=np.int64)

    def lookup(self, query: str, k: int) -> list[tuple[int, bool]]:
        """Up to ``k`` phrase ids (heaviest first) ``query`` reads as the start of a Chinese word
        of, each with whether it reads as the phrase's own start. Phrases found from their start
        rank first: the entries at a phrase's start are verified first, heaviest first, then the
        others, each pass stopping once it has what it needs."""
        if not self.wanted(query) or k <= 0:
            return []
        seqs = pinyin.query_units(query, self.known)
        cands: list[np.ndarray] = []
        which: list[np.ndarray] = []
        for n, units in enumerate(seqs):
            heads = [""]
            for u in units:  # the initials the units stand for ("=xing|hang": x or h)
                firsts = sorted({r[0] for r in u[1:].split("|") if r}) if u.startswith("=") else [u[0]]
                heads = [h + f for h in heads for f in firsts][:8]
            # the heads of one sequence have one length: their ranges are disjoint (no np.unique)
            rows = np.concatenate([self._range(h) for h in heads]) if heads else np.zeros(0, np.int64)
            cands.append(rows)
            which.append(np.full(len(rows), n, dtype=np.int32))
        if not cands:
            return []
        rows, seq = np.concatenate(cands), np.concatenate(which)
        at_start = self._starts[rows] == 0
        found: dict[int, bool] = {}
        for start_pass in (True, False):  # phrases read from their start, then from a word inside
            sel = np.flatnonzero(at_start == start_pass)
            sel = sel[np.argsort(self._pids[rows[sel]], kind="stable")][:MAX_CANDIDATES]  # heaviest first
            for i in sel.tolist():
                r = int(rows[i])
                pid, start = int(self._pids[r]), int(self._starts[r])
                if pid in found:
                    continue
                if pinyin.matches(seqs[int(seq[i])], self._sylls[pid][start:start + MAX_CHARS]):
                    found[pid] = start_pass
                    if len(found) >= k:
                        break
            if len(found) >= k:
                break
        return sorted(found.items(), key=lambda kv: (not kv[1], kv[0]))[:k]
