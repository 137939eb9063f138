"""Search-as-you-type suggestions: a prefix index over normalised phrases with weights.

A :class:`SuggestIndex` holds phrases of a few kinds (``query``: popular logged queries that got
clicks; ``category``, ``brand``, ``facet``: the catalogue's filter values and its most common
brand/colour + category pairs; ``title``: product titles), each with a weight in (0, 1]: the kind's
base weight scaled by the log of its count (products holding it, or clicks), so a category
shared by 3,000 products outranks a title of one.

Normalisation: NFKD, diacritics dropped, case folded, words are runs of letters and digits; a run
of Chinese or Japanese characters (no spaces to split it) is one word of the phrase's key and is
indexed from each of its characters, so "连衣" finds "红色连衣裙".

Matching (:meth:`SuggestIndex.lookup`): every word of the query starts some word of the phrase
(any order), the last one as typed so far. The postings are precomputed per prefix (every
prefix of every word, up to :data:`MAX_PREFIX` characters): a lookup is one sorted-array
intersection per query word. Phrases are numbered heaviest first, so the lowest ids of an
intersection are the best ones. A phrase that starts with the whole query ranks first; phrases
found only through a typo rank last.

Chinese typed by pinyin (vitrine/index/suggest_pinyin.py): a Latin query that reads as pinyin,
whole, initials or mixed ("shoubiao", "sb", "shoub", "手b"), finds the Chinese phrases it spells
(in a mostly Chinese index 1 + weight from a phrase's start, else the weight alone; in an English
one, whose Chinese phrases are its values' Chinese forms, half the weight: after the English
matches), and a Chinese query whose characters
find nothing is read by their sound ("手标" -> 手表, a homophone the input method offered), ranked
as a typo. A mixed query, characters then pinyin letters ("手b": 手 turned by the input method, b
the start of the next syllable), is read by sound first: a phrase whose characters after the
typed ones spell the letters ranks as a prefix match from its start (2 + weight: 手表 for "手b"),
from a word inside it above a phrase that only holds a Latin word the letters start ("Baggit
手提包": both in the 1 + tier, the sound reading's half above the Latin word's).

Typo tolerance: a query word no phrase word starts with is read as the index's prefixes within
the edits its length allows (vitrine/index/fuzzy.py: none under 4 characters, one from 4, two
from 8; rapidfuzz's OSA distance over the prefixes with the same first letter and the same length
give or take those edits: shoppers rarely mistype a first letter, and the search stays under a
millisecond), the union of their postings. A word one edit from a real prefix is tried only when the word as
typed is not one.

This module knows nothing of the search layer: :func:`catalogue_phrases` turns product documents
into phrases, the search layer (vitrine/search/suggestions.py) decides when to build.
"""

from __future__ import annotations

import bisect
import math
import re
import threading
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vitrine.errors import StorageError
from vitrine.index import fuzzy, vector_files
from vitrine.index.suggest_pinyin import PinyinIndex
from vitrine.lang import pinyin as pinyin_text

KINDS = ("query", "category", "brand", "facet", "title")
KIND_BASE = {"query": 1.0, "category": 0.9, "brand": 0.85, "facet": 0.7, "title": 0.5}
MAX_PREFIX = 24  # prefixes indexed per word (a longer typed word is cut to this many characters)
MAX_CJK_RUN = 16  # characters of a Chinese/Japanese run indexed from each start
MAX_PHRASE_CHARS = 120
MAX_COMBOS = 3000  # brand/colour + category pairs kept (the most common)
MIN_COMBO = 2  # products a pair needs to be a suggestion
# a mixed query ("手b"): the 1 + tier split in halves, the phrases read by sound from a word inside
# them (1.5 + MIXED_SHARE x weight) above those holding a Latin word the letters start (1 + ...)
MIXED_SHARE = 0.45

_CJK_CHARS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_CJK = re.compile(f"[{_CJK_CHARS}]+")
_TOKEN = re.compile(rf"[{_CJK_CHARS}]+|[^\W_{_CJK_CHARS}]+(?:'[^\W_{_CJK_CHARS}]+)*")
_EMPTY = np.zeros(0, dtype=np.int32)


def normalise(text: str) -> str:
    """Case folded, diacritics dropped (NFKD), curly apostrophes straightened."""
    s = unicodedata.normalize("NFKD", text.replace("\u2019", "'")).casefold()
    return "".join(c for c in s if not unicodedata.combining(c))


def tokens(text: str) -> list[str]:
    """The words of ``text`` as the index keys them (a Chinese/Japanese run is one word)."""
    return _TOKEN.findall(normalise(text))


def is_cjk(word: str) -> bool:
    return bool(_CJK.fullmatch(word))


def _index_words(word: str) -> list[str]:
    """What a phrase word is findable by: itself, and a CJK run from each of its characters."""
    if is_cjk(word):
        return [word[i:i + MAX_CJK_RUN] for i in range(len(word))]
    return [word[:MAX_PREFIX]]


@dataclass(frozen=True)
class Phrase:
    """A phrase to suggest: its text as shown, its kind and its count (products or clicks)."""

    text: str
    kind: str
    count: float = 1.0
    example: bool = False  # may stand as a home page example (:meth:`SuggestIndex.top`)


@dataclass(frozen=True)
class Match:
    """A suggestion: the phrase, its kind and its score (2 + weight: the phrase starts with the
    query; 1 + weight: every query word starts a word of it; weight: found through a typo)."""

    text: str
    kind: str
    score: float
    key: str


class SuggestIndex:
    """Phrases by prefix; immutable once built (build a new one when the phrases change)."""

    def __init__(self, phrases: Iterable[Phrase]) -> None:
        best: dict[str, tuple[float, str, str, bool]] = {}  # key -> (weight, text, kind, example)
        peak: dict[str, float] = {}
        plist = [p for p in phrases if p.count > 0 and p.kind in KIND_BASE and p.text.strip()]
        for p in plist:
            peak[p.kind] = max(peak.get(p.kind, 0.0), float(p.count))
        for p in plist:
            text = " ".join(p.text.split())[:MAX_PHRASE_CHARS]
            key = " ".join(tokens(text))
            if not key:
                continue
            top = peak[p.kind]
            scale = math.log1p(float(p.count)) / math.log1p(top) if top > 0 else 1.0
            weight = KIND_BASE[p.kind] * (0.5 + 0.5 * min(1.0, scale))
            cur = best.get(key)
            if cur is None or weight > cur[0]:
                best[key] = (weight, text, p.kind, p.example or p.kind == "query" or (cur is not None and cur[3]))
            elif p.example and not cur[3]:
                best[key] = (*cur[:3], True)
        order = sorted(best.items(), key=lambda kv: (-kv[1][0], kv[0]))
        self.keys: list[str] = [k for k, _ in order]
        self.texts: list[str] = [v[1] for _, v in order]
        self.kinds: list[str] = [v[2] for _, v in order]
        self.weights = np.array([v[0] for _, v in order], dtype=np.float64)
        self.examples: list[bool] = [v[3] for _, v in order]
        acc: dict[str, list[int]] = {}
        words: set[str] = set()
        for pid, key in enumerate(self.keys):
            seen: set[str] = set()
            for w in key.split(" "):
                if not is_cjk(w):
                    words.add(w)
                for iw in _index_words(w):
                    for n in range(1, len(iw) + 1):
                        seen.add(iw[:n])
            for pre in seen:
                acc.setdefault(pre, []).append(pid)
        self.postings: dict[str, np.ndarray] = {p: np.asarray(ids, dtype=np.int32) for p, ids in acc.items()}
        self.words: frozenset[str] = frozenset(words)
        # whole-key prefix matches: keys sorted, with their phrase ids
        self._sorted_ids = np.asarray(sorted(range(len(self.keys)), key=self.keys.__getitem__), dtype=np.int32)
        self._derive()

    def _derive(self) -> None:
        """What lookups use besides the phrases and postings: near prefixes, the sorted keys."""
        near: dict[tuple[str, int], list[str]] = {}  # (first letter, length) -> prefixes
        for pre in self.postings:
            if len(pre) >= fuzzy.MIN_ONE_EDIT - 1 and not is_cjk(pre):
                near.setdefault((pre[0], len(pre)), []).append(pre)
        self._near = near
        self._sorted_keys = [self.keys[i] for i in self._sorted_ids.tolist()]
        self._pinyin: PinyinIndex | None = None  # built on the first lookup that may be pinyin
        self._pinyin_lock = threading.Lock()

    def pinyin(self) -> PinyinIndex:
        """The Chinese phrases by pinyin and sound (built on first use: pypinyin loads then)."""
        with self._pinyin_lock:
            if self._pinyin is None:
                self._pinyin = PinyinIndex(self.keys, self.kinds)
            return self._pinyin

    # -- persistence (kept with a snapshot: building reads every product, 2 minutes at 1M) ------------
    def save(self, path: str | Path, meta: Mapping[str, Any] | None = None) -> str:
        """Write the index (and the caller's ``meta``) to one array file; returns its SHA-256."""
        prefixes = list(self.postings)
        sizes = np.fromiter((len(self.postings[p]) for p in prefixes), dtype=np.int64, count=len(prefixes))
        offsets = np.zeros(len(prefixes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        ids = np.concatenate([self.postings[p] for p in prefixes]) if prefixes else _EMPTY
        body = {"keys": self.keys, "texts": self.texts, "kinds": KINDS, "prefixes": prefixes,
                "words": sorted(self.words), "meta": dict(meta or {})}
        kinds = np.array([KINDS.index(k) for k in self.kinds], dtype=np.int8)
        return vector_files.write_arrays(path, body, {
            "weights": self.weights, "kinds": kinds, "examples": np.asarray(self.examples, dtype=bool),
            "offsets": offsets, "ids": ids.astype(np.int32, copy=False), "sorted_ids": self._sorted_ids})

    @classmethod
    def load(cls, path: str | Path, expected_sha256: str | None) -> tuple["SuggestIndex", dict[str, Any]]:
        """An index :meth:`save` wrote and the meta saved with it; StorageError when damaged."""
        body, arrays = vector_files.read_arrays(path, expected_sha256, what="suggestion index")
        out = cls.__new__(cls)
        try:
            kinds = list(body["kinds"])
            out.keys, out.texts = list(body["keys"]), list(body["texts"])
            out.kinds = [kinds[k] for k in arrays["kinds"].tolist()]
            out.weights = arrays["weights"].astype(np.float64, copy=False)
            out.examples = arrays["examples"].astype(bool).tolist()
            offsets, ids = arrays["offsets"], arrays["ids"]
            out.postings = {p: ids[a:b] for p, a, b in zip(body["prefixes"], offsets[:-1].tolist(), offsets[1:].tolist())}
            out.words = frozenset(body["words"])
            out._sorted_ids = arrays["sorted_ids"].astype(np.int32, copy=False)
            if not (len(out.keys) == len(out.texts) == len(out.kinds) == len(out.weights) == len(out._sorted_ids)):
                raise ValueError("its arrays disagree in length")
            out._derive()
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise StorageError(f"suggestion index {path} is unreadable: {e}") from e
        return out, dict(body.get("meta") or {})

    def __len__(self) -> int:
        return len(self.keys)

    # -- lookups --------------------------------------------------------------------------------
    def _typo_postings(self, word: str) -> np.ndarray:
        """Phrases holding a word that starts within the allowed edits of ``word`` (not itself)."""
        edits = fuzzy.max_edits(word)
        if edits == 0:
            return _EMPTY
        near: list[str] = []
        for n in range(len(word) - edits, len(word) + edits + 1):  # the first letter as typed
            near += [w for w, _ in fuzzy.nearest(word, self._near.get((word[0], n), []), edits, limit=12)]
        arrays = [self.postings[w] for w in near if w != word]
        if not arrays:
            return _EMPTY
        return np.unique(np.concatenate(arrays)) if len(arrays) > 1 else arrays[0]

    def _word_postings(self, words: Sequence[str], typos: bool) -> np.ndarray:
        """Phrases every word of ``words`` starts a word of (``typos``: a word may be one of its
        near prefixes instead, when it itself starts none)."""
        out: np.ndarray | None = None
        for w in words:
            w = w[:MAX_PREFIX] if not is_cjk(w) else w[:MAX_CJK_RUN]
            ids = self.postings.get(w)
            if ids is None:
                if not typos:
                    return _EMPTY
                ids = self._typo_postings(w)
            out = ids if out is None else np.intersect1d(out, ids, assume_unique=True)
            if len(out) == 0:
                return _EMPTY
        return out if out is not None else _EMPTY

    def _phrase_prefix(self, key: str, k: int) -> np.ndarray:
        """The ``k`` heaviest phrases whose key starts with ``key``."""
        lo = bisect.bisect_left(self._sorted_keys, key)
        hi = bisect.bisect_left(self._sorted_keys, key + "\U0010ffff")
        ids = self._sorted_ids[lo:hi]
        if len(ids) > k:
            ids = np.partition(ids, k - 1)[:k]
        return np.sort(ids)

    def lookup(self, query: str, k: int) -> list[Match]:
        """The ``k`` best suggestions for what was typed so far (an empty query: :meth:`top`)."""
        words = tokens(query)
        if not words or k <= 0:
            return self.top(k)
        key = " ".join(words)
        got: dict[int, float] = {}
        for pid in self._phrase_prefix(key, k).tolist():
            got[pid] = 2.0 + float(self.weights[pid])
        # characters then letters ("手b"): the letters spell the characters after the typed ones
        # (手表), read before the Latin words they merely start ("Baggit 手提包")
        mixed = pinyin_text.is_mixed(query)
        if mixed:
            self._by_sound_mixed(query, k, got)
        if len(got) < k:
            for pid in self._word_postings(words, typos=False)[: 2 * k].tolist():
                w = float(self.weights[pid])
                got.setdefault(pid, 1.0 + (MIXED_SHARE * w if mixed else w))
        # a mostly Chinese index reads a Latin query as pinyin before as a mistyped word ("heise" is
        # 黑色 there, not "Heusen"); an English one after
        first = not mixed and not all(is_cjk(w) for w in words) and len(got) < k and self.pinyin().chinese
        if first:
            self._by_sound(query, words, k, got)
        if len(got) < k:
            for pid in self._word_postings(words, typos=True)[: 2 * k].tolist():
                got.setdefault(pid, float(self.weights[pid]))
        if not first and not mixed and len(got) < k:
            self._by_sound(query, words, k, got)
        best = sorted(got.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
        return [Match(self.texts[i], self.kinds[i], round(s, 4), self.keys[i]) for i, s in best]

    def _by_sound(self, query: str, words: Sequence[str], k: int, got: dict[int, float]) -> None:
        """Chinese phrases ``query`` reads as by pinyin, initials or sound, added to ``got``."""
        if not self.pinyin().wanted(query):
            return
        exact = all(is_cjk(w) for w in words)  # only characters typed: a match by sound is a typo
        chinese = self.pinyin().chinese  # else a Latin query is English first, its pinyin after
        for pid, start in self.pinyin().lookup(query, 2 * k):
            w = float(self.weights[pid])
            got.setdefault(pid, 0.9 * w if exact else (1.0 if start else 0.0) + w if chinese else 0.5 * w)

    def _by_sound_mixed(self, query: str, k: int, got: dict[int, float]) -> None:
        """Chinese phrases a mixed query ("手b") reads as, added to ``got``: from a phrase's start as
        a prefix match, from a word inside it in the upper half of the 1 + tier."""
        for pid, start in self.pinyin().lookup(query, 2 * k):
            w = float(self.weights[pid])
            got.setdefault(pid, 2.0 + w if start else 1.5 + MIXED_SHARE * w)

    def top(self, k: int, kinds: Sequence[str] = ("query", "facet", "category", "brand")) -> list[Match]:
        """Representative phrases (a home page's examples): the heaviest example phrase of each
        kind in turn (logged queries, brand or colour + category pairs, leaf categories, brands)."""
        per: dict[str, list[int]] = {kd: [] for kd in kinds}
        for pid, kd in enumerate(self.kinds):
            lst = per.get(kd) if self.examples[pid] else None
            if lst is not None and len(lst) < k:
                lst.append(pid)
        out: list[Match] = []
        while len(out) < k and any(per.values()):
            for kd in kinds:
                if per[kd] and len(out) < k:
                    pid = per[kd].pop(0)
                    out.append(Match(self.texts[pid], kd, round(float(self.weights[pid]), 4), self.keys[pid]))
        return out


def merge(results: Sequence[Sequence[Match]], k: int) -> list[Match]:
    """Suggestions of several indexes as one list: best score first, one per normalised phrase."""
    best: dict[str, Match] = {}
    for ms in results:
        for m in ms:
            if m.key not in best or m.score > best[m.key].score:
                best[m.key] = m
    return sorted(best.values(), key=lambda m: (-m.score, m.key))[:k]


def query_phrases(popular: Iterable[tuple[str, float]]) -> list[Phrase]:
    """Logged queries as phrases: only those with a positive weight (clicks), so a query that
    found nothing (nothing to click) is never suggested."""
    out = []
    for text, weight in popular:
        try:
            w = float(weight)
        except (TypeError, ValueError):
            continue
        if isinstance(text, str) and text.strip() and w > 0 and math.isfinite(w):
            out.append(Phrase(text.strip(), "query", w))
    return out


FACET_ATTRIBUTES: Mapping[str, Sequence[str]] = {"colour": ("colour", "color", "basecolour", "basecolor"),
                                                 "gender": ("gender",)}


def catalogue_phrases(docs: Iterable[Mapping[str, Any]], facets: Mapping[str, Sequence[str]] = FACET_ATTRIBUTES,
                      brand_of: Callable[[str], str | None] | None = None, examples: int = 12) -> list[Phrase]:
    """Phrases of a catalogue's product documents: titles, every category path level, brands
    (the ``brand`` field, else ``brand_of(title)``: a lexicon learned from titles), the
    ``facets`` attributes' values (field -> attribute keys, first present wins), and the most
    common brand + leaf category and colour + leaf category pairs. The ``examples`` most common
    pairs, leaf categories and brands may stand as a home page's examples."""
    titles: Counter[str] = Counter()
    cats: Counter[str] = Counter()
    brands: Counter[str] = Counter()
    values: Counter[str] = Counter()
    combos: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    for d in docs:
        title = str(d.get("title") or "").strip()
        if title:
            titles[title] += 1
        path = d.get("category") or []
        if isinstance(path, str):
            path = [p.strip() for p in path.split(">")]
        path = [str(p).strip() for p in path if str(p).strip()]
        for c in dict.fromkeys(path):
            cats[c] += 1
        leaf = path[-1] if path else None
        if leaf:
            leaves[leaf] += 1
        brand = str(d.get("brand") or "").strip() or (brand_of(title) if brand_of and title else None) or ""
        if brand:
            brands[brand] += 1
            if leaf:
                combos[f"{brand} {leaf}"] += 1
        attrs = {str(a).casefold(): v for a, v in (d.get("attributes") or {}).items()}
        for field, keys in facets.items():
            for a in keys:
                v = attrs.get(a)
                if v not in (None, "") and not isinstance(v, (list, dict)):
                    values[str(v).strip()] += 1
                    if field == "colour" and leaf:
                        combos[f"{v} {leaf}"] += 1
                    break
    shown = {c for c, _ in leaves.most_common(examples)} | {b for b, _ in brands.most_common(examples)}
    pairs = combos.most_common(MAX_COMBOS)
    shown |= {c for c, n in pairs[:examples] if n >= MIN_COMBO}
    out = [Phrase(t, "title", n) for t, n in titles.items()]
    out += [Phrase(c, "category", n, c in shown) for c, n in cats.items()]
    out += [Phrase(b, "brand", n, b in shown) for b, n in brands.items()]
    out += [Phrase(v, "facet", n) for v, n in values.items()]
    out += [Phrase(c, "facet", n, c in shown) for c, n in pairs if n >= MIN_COMBO]
    return out
