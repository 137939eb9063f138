"""Slot extraction: the brand, category, colour, gender and price bounds a query names.

The values come from the catalogue's own vocabulary (:class:`Vocabulary`, passed in as plain
data by the engine: the knowledge graph's brands and categories when it has them, else the
filter facets), matched in English and Chinese through ``data/lexicon.json`` (surface forms of
the catalogue's values: "navy" -> "Navy Blue", "跑步鞋" -> "Sports Shoes"), longest match first,
with a one-edit typo correction for long Latin words. Price bounds are parsed from English and
Chinese forms: "under ₹1,500", "below Rs. 999", "between 500 and 1000", "$50+", "2k or less",
"500元以下", "低于1000", "1000到2000元", "2000块以上".
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

SLOT_FIELDS = ("brand", "category", "colour", "gender")
LEXICON_PATH = Path(__file__).with_name("data") / "lexicon.json"


@lru_cache(maxsize=1)
def lexicon() -> dict[str, Any]:
    return json.loads(LEXICON_PATH.read_text(encoding="utf-8"))


# -- normalisation ---------------------------------------------------------------------------------
_DROP = re.compile(r"[’'`´.]")
_SPACE = re.compile(r"[\s\-_/,;:!?()\[\]{}\"“”‘，。！？、；：（）【】《》~]+")


def fold(text: str) -> str:
    """NFKC (full-width digits and letters become ASCII) and casefold, whitespace collapsed."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def key_norm(text: str) -> str:
    """The form phrases and queries are matched in: folded, apostrophes and dots dropped,
    punctuation as spaces ("U.S. Polo Assn." -> "us polo assn", "men's" -> "mens")."""
    return " ".join(_SPACE.sub(" ", _DROP.sub("", fold(text))).split())


def _is_cjk(ch: str) -> bool:
    return "\u3040" <= ch <= "\u9fff" or "\uac00" <= ch <= "\ud7af" or "\uf900" <= ch <= "\ufaff"


def _word_char(ch: str) -> bool:
    return ch.isalnum() and not _is_cjk(ch)


# -- vocabulary --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Vocabulary:
    """The catalogue's values per slot field, as the catalogue spells them."""

    brands: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    colours: tuple[str, ...] = ()
    genders: tuple[str, ...] = ()

    @classmethod
    def of(cls, brands: Iterable[str] = (), categories: Iterable[str] = (), colours: Iterable[str] = (),
           genders: Iterable[str] = ()) -> "Vocabulary":
        def clean(vals: Iterable[str]) -> tuple[str, ...]:
            seen: dict[str, str] = {}
            for v in vals:
                v = " ".join(str(v).split())
                if v and v.casefold() not in ("na", "n/a", "none", "null") and key_norm(v):
                    seen.setdefault(key_norm(v), v)
            return tuple(sorted(seen.values(), key=str.casefold))

        return cls(clean(brands), clean(categories), clean(colours), clean(genders))

    def values(self, field_name: str) -> tuple[str, ...]:
        return {"brand": self.brands, "category": self.categories, "colour": self.colours,
                "gender": self.genders}[field_name]

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for f in SLOT_FIELDS:
            h.update(json.dumps(self.values(f)).encode())
        return h.hexdigest()[:16]

    def __len__(self) -> int:
        return sum(len(self.values(f)) for f in SLOT_FIELDS)


GENDER_WORDS = {"men", "women", "boys", "girls", "unisex", "kids", "mens", "womens", "boy's", "girl's",
                "men's", "women's", "man", "woman", "boy", "girl"}


def learn_brands(titles: Iterable[str], *, min_count: int = 2, max_words: int = 4) -> list[str]:
    """Brands learned from titles that start with the brand ("Nike Men Blue Running Shoes"): the
    words before the first gender word, merged into a shorter known prefix ("Casio Edifice" ->
    "Casio"), spelling variants folded together ("Levi's"/"Levis"), kept when seen ``min_count`` times."""
    counts: Counter[str] = Counter()
    spell: dict[str, Counter[str]] = {}
    for t in titles:
        words = str(t).split()
        for i, w in enumerate(words[: max_words + 1]):
            if w.casefold() in GENDER_WORDS:
                if i:
                    cand = " ".join(words[:i])
                    k = _brand_key(cand)
                    if k:
                        counts[k] += 1
                        spell.setdefault(k, Counter())[cand] += 1
                break
    # merge sub-lines into a shorter brand that is itself common
    word_keys = {k: k.split() for k in counts}
    merged: Counter[str] = Counter()
    for k, n in sorted(counts.items(), key=lambda kv: len(kv[0])):
        parts = word_keys[k]
        target = k
        for j in range(1, len(parts)):
            pre = " ".join(parts[:j])
            if counts.get(pre, 0) >= max(min_count, 3):
                target = pre
                break
        merged[target] += n
        if target != k:
            spell.setdefault(target, Counter()).update(spell[k])
    # spelling variants without spaces ("ray ban"/"rayban") join the more common one
    by_tight: dict[str, str] = {}
    final: Counter[str] = Counter()
    for k, n in merged.most_common():
        tight = k.replace(" ", "")
        head = by_tight.setdefault(tight, k)
        final[head] += n
        if head != k:
            spell[head].update(spell[k])
    out = []
    for k, n in final.items():
        if n >= min_count:
            out.append(_display(spell[k], k))
    return sorted(out, key=str.casefold)


def _brand_key(s: str) -> str:
    return key_norm(s)


def _display(variants: Counter[str], key: str) -> str:
    # prefer the most common spelling whose own key is exactly this key
    exact = [(n, v) for v, n in variants.items() if _brand_key(v) == key]
    pool = exact or [(n, v) for v, n in variants.items()]
    return max(pool, key=lambda nv: (nv[0], nv[1]))[1]


# -- prices ---------------------------------------------------------------------------------------------
_NUM = r"(\d+(?:[.,]\d+)*)\s*(k\b|千|万)?"
_CUR_PRE = r"(?:₹|rs\.?|inr|\$|usd|¥|rmb|mrp)\s*"
_CUR_POST = r"(?:\s*(?:rupees?|rs\.?|inr|bucks|dollars?|usd|rmb|/-|元|块钱|块|美元))"
_MONEY = rf"(?:{_CUR_PRE})?{_NUM}{_CUR_POST}?"
_B = r"(?<![a-z0-9])"

_MAX_EN = (r"under|below|less than|lesser than|lower than|cheaper than|within|upto|up to|max|maximum|at most|"
           r"not more than|no more than|not over|not above|till|for less than|budget of|budget is|budget|"
           r"at max|under a budget of|no higher than|not exceeding|<=|<|≤")
_MIN_EN = (r"above|over|more than|greater than|higher than|at least|atleast|min|minimum|starting at|starting from|"
           r"starting|upwards of|costlier than|pricier than|no less than|not less than|from|>=|>|≥")
_MAX_ZH = r"低于|不超过|不高于|少于|不到|小于|最多|预算|价格低于|价位低于|便宜于|控制在"
_MIN_ZH = r"高于|超过|大于|不低于|至少|最少|起码"

PRICE_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    # ranges: "between 500 and 1000", "from ₹500 to ₹1000", "500-1000 rs", "1000到2000元", "在1000和2000之间"
    ("range", re.compile(rf"{_B}(?:between|from|price|prices|range|budget|priced)\s+{_MONEY}\s*"
                         rf"(?:and|to|-|–|~|till)\s*{_MONEY}")),
    ("range", re.compile(rf"在\s*{_MONEY}\s*(?:和|与|到|至|-|–|~)\s*{_MONEY}\s*之间|{_MONEY}\s*(?:到|至)\s*{_MONEY}")),
    ("range", re.compile(rf"{_B}{_CUR_PRE}{_NUM}\s*(?:-|–|~|to)\s*(?:{_CUR_PRE})?{_NUM}{_CUR_POST}?|"
                         rf"{_B}{_NUM}\s*(?:-|–|~|to)\s*{_NUM}{_CUR_POST}")),
    # a bare range of two amounts of at least 100 ("1499-3,000", "249 to 399"; not "size 8-10")
    ("bare_range", re.compile(rf"{_B}{_NUM}\s*(?:-|–|~|to)\s*{_NUM}(?![\d.,])")),
    # bounds with the cue first: "under 1500", "below rs 999", "低于1000"
    ("max", re.compile(rf"{_B}(?:{_MAX_EN})\s*(?:of\s+|than\s+)?{_MONEY}|(?:{_MAX_ZH})\s*{_MONEY}")),
    ("min", re.compile(rf"{_B}(?:{_MIN_EN})\s*(?:of\s+|than\s+)?{_MONEY}|(?:{_MIN_ZH})\s*{_MONEY}")),
    # bounds with the cue after: "1500 and below", "2k or less", "500元以下", "2000块以上", "$50+"
    ("max", re.compile(rf"{_B}{_MONEY}\s*(?:and below|and under|and less|or below|or less|or under|or lower|max|"
                       rf"at most|以下|以内|之内|封顶)")),
    ("min", re.compile(rf"{_B}{_MONEY}\s*(?:and above|and over|and more|or above|or more|or higher|onwards|plus|\+|"
                       rf"以上|起|往上)")),
]


def _num(digits: str, mult: str | None) -> float | None:
    d = digits.replace(",", "")
    if d.count(".") > 1:
        return None
    try:
        v = float(d)
    except ValueError:
        return None
    if mult in ("k", "千"):
        v *= 1000
    elif mult == "万":
        v *= 10000
    return v


def parse_prices(text: str) -> tuple[float | None, float | None, list[tuple[int, int]]]:
    """``(price_min, price_max, spans)`` from a folded query; spans are what was consumed."""
    lo: float | None = None
    hi: float | None = None
    spans: list[tuple[int, int]] = []
    work = text
    for kind, pat in PRICE_PATTERNS:
        for m in pat.finditer(work):
            groups = [g for g in m.groups()]
            nums = []
            for i in range(0, len(groups), 2):
                if groups[i] is not None:
                    v = _num(groups[i], groups[i + 1])
                    if v is not None:
                        nums.append(v)
            if not nums:
                continue
            if kind in ("range", "bare_range"):
                if len(nums) < 2 or (kind == "bare_range" and min(nums[:2]) < 100):
                    continue
                a, b = sorted(nums[:2])
                if a == b:
                    continue
                lo, hi = a, b
            elif kind == "max":
                hi = nums[0]
            else:
                if m.group(0).rstrip().endswith("+") and nums[0] < 100 and not re.search(_CUR_PRE, m.group(0)):
                    continue  # "18+" is an age or a brand, not a price
                lo = nums[0]
            spans.append(m.span())
        for a, b in spans:
            work = work[:a] + " " * (b - a) + work[b:]
    if lo is not None and hi is not None and lo > hi:
        lo, hi = hi, lo
    return lo, hi, spans


# -- the extractor --------------------------------------------------------------------------------------
@dataclass
class SlotMatch:
    field: str
    value: str
    surface: str


@dataclass
class Slots:
    """What a query names. ``values`` is the response's ``slots`` object."""

    brand: list[str] = field(default_factory=list)
    category: list[str] = field(default_factory=list)
    colour: list[str] = field(default_factory=list)
    gender: list[str] = field(default_factory=list)
    price_min: float | None = None
    price_max: float | None = None
    matches: list[SlotMatch] = field(default_factory=list)
    corrected: dict[str, str] = field(default_factory=dict)

    def values(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in SLOT_FIELDS:
            vals = getattr(self, f)
            if vals:
                out[f] = vals[0] if len(vals) == 1 else list(vals)
        if self.price_min is not None:
            out["price_min"] = self.price_min
        if self.price_max is not None:
            out["price_max"] = self.price_max
        return out

    def __bool__(self) -> bool:
        return bool(self.values())


def _singular_forms(value: str) -> list[str]:
    k = key_norm(value)
    forms = [k]
    if len(k) > 4 and k.endswith("es") and k[:-2].endswith(("sh", "ch", "ss", "x")):
        forms.append(k[:-2])
    elif len(k) > 4 and k.endswith("s") and not k.endswith("ss"):
        forms.append(k[:-1])
    return forms


def _damerau1(a: str, b: str) -> bool:
    """Whether two different words are one edit apart (insert, delete, substitute, transpose)."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        if len(diff) == 1:
            return True
        return len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]]
    if len(a) > len(b):
        a, b = b, a
    i = 0
    while i < len(a) and a[i] == b[i]:
        i += 1
    return a[i:] == b[i + 1:]


_ASCII_WORD = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")  # a phrase boundary is none of these
_END = ""  # the trie key marking that a phrase ends here (never a character of a query)


def _phrase_trie(phrases: Iterable[str]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for k in phrases:
        node = root
        for ch in k:
            node = node.setdefault(ch, {})
        node[_END] = True
    return root


def _deletes(w: str) -> set[str]:
    return {w[:i] + w[i + 1:] for i in range(len(w))}


class SlotExtractor:
    """Matches a query against a :class:`Vocabulary` (English and Chinese forms, prices)."""

    FUZZY_MIN_LEN = 5

    def __init__(self, vocab: Vocabulary, *, lexicon_data: dict[str, Any] | None = None) -> None:
        self.vocab = vocab
        lex = lexicon_data if lexicon_data is not None else lexicon()
        common = {key_norm(w) for w in lex.get("common_words", [])}
        phrases: dict[str, tuple[str, str] | None] = {}

        def add(form: str, fld: str, value: str) -> None:
            k = key_norm(form)
            if not k or (fld == "brand" and (len(k) < 2 or k in common)):
                return
            phrases.setdefault(k, (fld, value))

        # forms from the lexicon (only for values the catalogue has), then the values themselves
        # a value a mixed catalogue writes in two languages ("Men" and "男士"): a slot names both
        self.also: dict[tuple[str, str], list[str]] = {}
        for fld, lex_key in (("gender", "gender"), ("colour", "colour"), ("category", "category"), ("brand", "brand")):
            known = {key_norm(v): v for v in vocab.values(fld)}
            for canon, forms in lex.get(lex_key, {}).items():
                held = list(dict.fromkeys(known[key_norm(f)] for f in [canon, *forms] if key_norm(f) in known))
                value = known.get(key_norm(canon))
                if value is None:  # a catalogue that writes the value as one of its Chinese forms ("男士" for Men)
                    value = next((v for v in held if any(_is_cjk(ch) for ch in v)), None)
                if value is None:
                    continue
                if fld != "brand" and len(held) > 1 and any(_is_cjk(ch) for v in held for ch in v):
                    for v in held:
                        self.also.setdefault((fld, v), []).extend(o for o in held if o != v)
                for form in [canon, *forms]:
                    add(form, fld, value)
        for fld in ("gender", "colour", "category", "brand"):
            for v in vocab.values(fld):
                forms = _singular_forms(v) if fld == "category" else [key_norm(v)]
                for form in forms[:1] + [f for f in forms[1:] if f not in common]:
                    add(form, fld, v)
        # a category the catalogue names as "A & B" or "A, B" ("Sofas & Couches"): each side
        # names it too (after every whole value, which wins a clash), unless a common word
        for v in vocab.values("category"):
            if "&" in v or "," in v:
                for side in re.split(r"\s*[&,]\s*", v):
                    for form in _singular_forms(side) if key_norm(side) else []:
                        if form not in common and len(form) >= 3:
                            add(form, "category", v)
        for b in lex.get("blockers", []):
            phrases.setdefault(key_norm(b), None)
        self.phrases = phrases
        self._trie = _phrase_trie(phrases)
        # typo correction: long Latin words of the vocabulary's forms (colours and genders only from
        # six letters: "baack" is "back", not "black")
        self._known = common | {w for k in phrases for w in k.split()}
        self._fuzzy: dict[str, set[str]] = {}
        self._word_values: dict[str, set[str]] = {}
        min_len: dict[str, int] = {}
        for k, target in phrases.items():
            if target is None:
                continue
            words = k.split()
            for w in words:
                if not (w.isascii() and w.isalpha()) or w in common:
                    continue
                whole = len(words) == 1
                need = self.FUZZY_MIN_LEN + (1 if whole and target[0] in ("colour", "gender") else 0)
                min_len[w] = max(min_len.get(w, 0), need)
                # what correcting into w means: its own value when it is a whole phrase, else itself
                self._word_values.setdefault(w, set()).add(f"{target[0]}:{target[1]}" if whole else f"word:{w}")
        for w, need in min_len.items():
            if len(w) >= need:
                if any(v.startswith(("brand:", "category:", "colour:", "gender:")) for v in self._word_values[w]):
                    self._word_values[w] = {v for v in self._word_values[w] if not v.startswith("word:")}
                for d in _deletes(w) | {w}:
                    self._fuzzy.setdefault(d, set()).add(w)

    def _correct(self, text: str) -> tuple[str, dict[str, str]]:
        fixes: dict[str, str] = {}

        def fix(m: re.Match[str]) -> str:
            w = m.group(0)
            if len(w) < self.FUZZY_MIN_LEN or w in self._known:
                return w
            cands: set[str] = set()
            for d in _deletes(w) | {w}:
                cands |= self._fuzzy.get(d, set())
            cands = {c for c in cands if c[0] == w[0] and _damerau1(w, c)}
            meanings = set().union(*(self._word_values[c] for c in cands)) if cands else set()
            if cands and (len(cands) == 1 or len(meanings) == 1):  # "sandasl": "sandals" or "sandal", one value
                c = max(sorted(cands), key=len)
                fixes[w] = c
                return c
            return w

        return re.sub(r"[a-z]+", fix, text), fixes

    def extract(self, text: str) -> Slots:
        slots = Slots()
        folded = fold(text or "")
        lo, hi, spans = parse_prices(folded)
        slots.price_min, slots.price_max = lo, hi
        for a, b in spans:
            folded = folded[:a] + " " * (b - a) + folded[b:]
        q = key_norm(folded)
        q, slots.corrected = self._correct(q)
        for surface in self.find_phrases(q):
            target = self.phrases.get(surface)
            if target is None:
                continue
            fld, value = target
            vals = getattr(slots, fld)
            for v in [value, *self.also.get((fld, value), [])]:
                if v not in vals:
                    vals.append(v)
            slots.matches.append(SlotMatch(fld, value, surface))
        return slots

    def find_phrases(self, q: str) -> list[str]:
        """The vocabulary phrases (and blockers) a normalised query holds, left to right: at each
        position the longest phrase that starts and ends at a word boundary where it starts or
        ends with a word character (the regex alternation of every phrase, longest first, would
        find the same), then the scan goes on after it. One walk of a character trie per position
        instead of trying every phrase of the catalogue at every position."""
        out: list[str] = []
        i, n = 0, len(q)
        while i < n:
            end = -1
            if not (i and q[i - 1] in _ASCII_WORD and _word_char(q[i])):  # a word phrase starts a word
                node, j = self._trie, i
                while j < n:
                    child = node.get(q[j])
                    if child is None:
                        break
                    node = child
                    j += 1
                    if _END in node and (j == n or q[j] not in _ASCII_WORD or not _word_char(q[j - 1])):
                        end = j
            if end > 0:
                out.append(q[i:end])
                i = end
            else:
                i += 1
        return out


def slots_equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Exact match of two ``slots`` objects (list order ignored, prices compared as numbers)."""
    if set(a) != set(b):
        return False
    for k in a:
        x, y = a[k], b[k]
        if k in ("price_min", "price_max"):
            if abs(float(x) - float(y)) > 1e-6:
                return False
        else:
            xs = sorted([x] if isinstance(x, str) else x, key=str.casefold)
            ys = sorted([y] if isinstance(y, str) else y, key=str.casefold)
            if [s.casefold() for s in xs] != [s.casefold() for s in ys]:
                return False
    return True
