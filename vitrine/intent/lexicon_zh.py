"""Chinese forms of any catalogue's vocabulary: its categories, colours, materials and brands.

The hand-written lexicon (``data/lexicon.json``) names fashion values only. This module gives
the Chinese forms of whatever values a catalogue holds, from three sources, the first winning:

1. the hand-written lexicon's own Chinese forms of the value;
2. **learned from the catalogue**: a value written with its Chinese name beside it, in a brand
   field or a title ("Nike/耐克", "耐克/Nike", "Nike（耐克）", "Nike 耐克" as a whole brand field):
   :func:`learn_pairs`;
3. where neither gives any, **the dictionary** (CC-CEDICT, vitrine/lang/cedict.py) read backwards: the Chinese words
   whose gloss is the value ("Sofas" -> sofa -> 沙发, "Wall Clocks" -> 挂钟, "Bookcases" -> 书柜),
   each side of an "A & B" value too. A gloss counts when it is the first sense of a word of at
   most four (or the second of two), unqualified (a sense with a note before it, "(government)
   cabinet", or a qualifying one after it, "bed (on a train)", is another sense; "sofa
   (loanword)" is the word); words of two characters or more (one character is part of too many words);
   a capitalised gloss (a name) only for a brand; at most :data:`MAX_DICT_FORMS` words.

:func:`merged_lexicon` returns the hand-written lexicon with these forms added, in its own shape,
for :class:`vitrine.intent.slots.SlotExtractor` (built once per catalogue vocabulary: the engine
builds the extractor when the catalogue loads or changes). :func:`chinese_forms` gives the forms
per field for other readers (suggestions). Nothing loads at import: the dictionary loads on
first use.
"""

from __future__ import annotations

import copy
import logging
import re
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from vitrine.intent.slots import Vocabulary, key_norm, lexicon
from vitrine.lang import cedict

log = logging.getLogger(__name__)

FIELDS = ("category", "colour", "brand", "material")
MAX_DICT_FORMS = 3
MAX_SENSES = 4
MAX_SLOT_WORD = 6  # characters of the longest lexicon word looked for after a brand's name (learn_pairs)
NAME_SHARE = 0.8  # of a brand's paired runs that share a head for it to belong to the name (learn_pairs)
_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_LATIN = r"[A-Za-z0-9][A-Za-z0-9&'.+\-]*(?: [A-Za-z0-9&'.+\-]+){0,4}"
_ZH = rf"[{_CJK}][{_CJK}·]{{0,9}}"
_PAIRS = (
    re.compile(rf"({_LATIN})\s*[/／|｜]\s*({_ZH})"),  # Nike/耐克
    re.compile(rf"({_LATIN})\s*[(（]\s*({_ZH})\s*[)）]"),  # Nike（耐克）
)
_PAIRS_ZH_FIRST = (
    re.compile(rf"({_ZH})\s*[/／|｜]\s*({_LATIN})"),  # 耐克/Nike
    re.compile(rf"({_ZH})\s*[(（]\s*({_LATIN})\s*[)）]"),  # 耐克（Nike）
)
_WHOLE = re.compile(rf"^({_LATIN})\s+({_ZH})$|^({_ZH})\s+({_LATIN})$")  # a brand field "Nike 耐克"
_QUALIFIER = re.compile(r"\((?:on|in|of|for|at|as|with|from|to|by|used|esp|i\.e|e\.g|old|of a|non)\b", re.IGNORECASE)
_lock = threading.Lock()


def _gloss_key(gloss: str) -> str:
    """A gloss as matched: "(hand)bag" -> "handbag"; a sense qualified by a note ("(government)
    cabinet", "a bed (on a train)") -> "" (another sense than the bare word)."""
    if re.search(r"^\([^)]*\)\s|\[", gloss) or _QUALIFIER.search(gloss):
        return ""
    g = re.sub(r"\s\([^)]*\)", "", gloss)  # a trailing note about the word ("sofa (loanword)")
    g = re.sub(r"[()]", "", g).strip()
    if g.casefold().startswith("to "):  # a verb ("to watch"): a catalogue names things
        return ""
    g = re.sub(r",?\s+(?:inc|ltd|co|corp|corporation|company|group)\.?$", "", g, flags=re.IGNORECASE)
    g = re.sub(r"^(?:a|an|the) ", "", g, flags=re.IGNORECASE)
    return key_norm(g)


@lru_cache(maxsize=1)
def reverse_dictionary() -> dict[str, list[tuple[str, bool]]]:
    """English gloss (normalised) -> the Chinese words glossed so, best first, each with whether
    the gloss is written as a name (capitalised). Built once from CC-CEDICT (~1 s)."""
    with _lock:
        d = cedict.dictionary()
        ranked: dict[str, list[tuple[int, int, str, bool]]] = {}
        for word, senses in d.glosses.items():
            if len(senses) > MAX_SENSES or len(word) < 2 or not re.fullmatch(rf"[{_CJK}A-Za-z]+", word) \
                    or not re.search(f"[{_CJK}]", word):
                continue
            for i, g in enumerate(senses[:2]):
                if i == 1 and len(senses) > 2:  # a second sense only of a two-sense word
                    continue
                k = _gloss_key(g)
                if k and len(k) <= 40:
                    ranked.setdefault(k, []).append((i, len(senses), word, g[:1].isupper()))
        out = {k: [(w, name) for _, _, w, name in sorted(v, key=lambda t: (t[0], t[1], len(t[2]) == 1, t[2]))]
               for k, v in ranked.items()}
        log.info("Chinese lexicon: %d English glosses reversed", len(out))
        return out


def _singular(k: str) -> list[str]:
    out = [k]
    if len(k) > 4 and k.endswith("ies"):
        out.append(k[:-3] + "y")
    if len(k) > 4 and k.endswith("es") and k[:-2].endswith(("sh", "ch", "ss", "x")):
        out.append(k[:-2])
    elif len(k) > 3 and k.endswith("s") and not k.endswith("ss"):
        out.append(k[:-1])
    return out


def dictionary_forms(value: str, field: str) -> list[str]:
    """The Chinese words CC-CEDICT glosses as ``value`` (or its singular; each side of "A & B")."""
    rev = reverse_dictionary()
    out: list[str] = []
    sides = [value] + (re.split(r"\s*[&,]\s*", value) if ("&" in value or "," in value) else [])
    for side in sides:
        for k in _singular(key_norm(side)):
            for word, name in rev.get(k, []):
                if name and field != "brand":
                    continue
                if word not in out:
                    out.append(word)
            if len(out) >= MAX_DICT_FORMS:
                return out[:MAX_DICT_FORMS]
    return out[:MAX_DICT_FORMS]


def learn_pairs(texts: Iterable[str], *, whole: bool = False) -> dict[str, Counter[str]]:
    """English words written with their Chinese name beside them in ``texts`` (brand fields,
    titles): normalised Latin (each run of its last words, so "Air Max Nike/耐克" teaches "nike"
    too) -> Chinese forms, counted. A pair needs its mark (a slash, brackets); ``whole``: each
    text is one value by itself (a brand field), so "Nike 耐克", the two names side by side, pairs
    too. A title never pairs that way: "Image 女士太阳镜" is a brand and what it sells ("women
    sunglasses"), not the brand's Chinese name. A title runs the name on into what the product
    is ("Nike/耐克女士黑色手表"): the name is the part of the run most of the brand's runs share
    (:func:`_names`)."""
    heads: dict[str, Counter[str]] = {}  # the name starts the run (written after the Latin)
    tails: dict[str, Counter[str]] = {}  # the name ends it (written before the Latin: "男士耐克/Nike")

    def add(latin: str, zh: str, from_end: bool) -> None:
        words = key_norm(latin).split()
        runs = [" ".join(words[i:]) for i in range(len(words))] if from_end else \
            [" ".join(words[:i]) for i in range(len(words), 0, -1)]
        for r in runs:
            if r and not r.isdigit():
                (heads if from_end else tails).setdefault(r, Counter())[zh] += 1

    for t in texts:
        if not t or not re.search(f"[{_CJK}]", t) or not re.search("[A-Za-z]", t):
            continue
        both = _WHOLE.match(t.strip()) if whole else None
        if both:
            if both.group(1):
                add(both.group(1), both.group(2), True)
            else:
                add(both.group(4), both.group(3), False)
        for rx in _PAIRS:
            for m in rx.finditer(t):
                add(m.group(1), m.group(2), True)
        for rx in _PAIRS_ZH_FIRST:
            for m in rx.finditer(t):
                add(m.group(2), m.group(1), False)
    out: dict[str, Counter[str]] = {}
    words = _slot_words() if heads or tails else frozenset()
    for runs, from_start in ((heads, True), (tails, False)):
        for latin, counted in runs.items():
            out.setdefault(latin, Counter()).update(_names(counted, from_start, words))
    return out


@lru_cache(maxsize=1)
def _slot_words() -> frozenset[str]:
    """The hand-written lexicon's Chinese forms of two characters or more (genders, colours,
    categories...): where a title runs a brand's name on into them, the name has ended."""
    return frozenset(f for per in lexicon().values() if isinstance(per, dict) for forms in per.values()
                     if isinstance(forms, list) for f in forms
                     if isinstance(f, str) and len(f) > 1 and re.fullmatch(f"[{_CJK}]+", f))


def _names(runs: Counter[str], from_start: bool, words: frozenset[str] = frozenset()) -> Counter[str]:
    """The Chinese name in each of a brand's ``runs`` (counted): the longest head (``from_start``,
    else tail) that at least :data:`NAME_SHARE` of the runs beginning (ending) with its first two
    characters share, cut shorter where a shorter head is itself a whole run ("李维斯男士" where
    "李维斯" stands alone elsewhere). "耐克女士", "耐克男士蓝色", "耐克" -> 耐克; a run seen once stays whole."""
    def side(x: str) -> str:
        return x if from_start else x[::-1]

    support: Counter[str] = Counter()
    for s, n in runs.items():
        r = side(s)
        for i in range(2, len(r) + 1):
            support[r[:i]] += n
    out: Counter[str] = Counter()
    for s, n in runs.items():
        r = side(s)
        end = min(2, len(r))
        while end < len(r) and support[r[:end + 1]] >= NAME_SHARE * support[r[:2]]:
            end += 1
        whole = [i for i in range(2, end) if side(r[:i]) in runs]  # the name seen alone ("李维斯 ...")
        end = whole[-1] if whole else end
        # a slot word where the name would go on: "李维斯男士..." -> 李维斯 (男士: a gender)
        slot = [i for i in range(2, end) if any((side(r[i:])[:k] if from_start else side(r[i:])[-k:]) in words
                                                for k in range(2, MAX_SLOT_WORD + 1))]
        out[side(r[:slot[0] if slot else end])] += n
    return out


def _own_forms(value: str) -> tuple[str | None, list[str]]:
    """A value written in both scripts ("Nike/耐克"): its Latin part and its Chinese forms."""
    learned = learn_pairs([value], whole=True)
    if not learned:
        return None, []
    latin = max(learned, key=len)
    return latin, list(learned[latin])


def chinese_forms(values: Mapping[str, Sequence[str]], texts: Iterable[str] = (),
                  base: Mapping[str, Any] | None = None, *, use_dictionary: bool = True) -> dict[str, dict[str, list[str]]]:
    """Per field (category, colour, brand, material), each value's Chinese forms: the
    hand-written lexicon's, then those learned from ``texts`` and from the value itself, then the
    dictionary's. A value with none is left out."""
    lex = base if base is not None else lexicon()
    learned = learn_pairs(texts)
    out: dict[str, dict[str, list[str]]] = {}
    for fld in FIELDS:
        hand = {key_norm(k): [f for f in v if re.search(f"[{_CJK}]", f)] for k, v in (lex.get(fld) or {}).items()}
        per: dict[str, list[str]] = {}
        for value in values.get(fld, ()):
            forms: list[str] = list(hand.get(key_norm(value), []))
            latin, own = _own_forms(value)
            forms += own
            for k in [key_norm(value)] + ([latin] if latin else []):
                forms += [zh for zh, _ in learned.get(k, Counter()).most_common(3)]
            if use_dictionary and not forms and not re.search(f"[{_CJK}]", value):  # the lexicon's win
                forms += dictionary_forms(value, fld)
            forms = [f for f in dict.fromkeys(forms) if f]
            if forms:
                per[value] = forms
        if per:
            out[fld] = per
    return out


_merged: dict[tuple[str, int], dict[str, Any]] = {}


def merged_lexicon(vocab: Vocabulary, texts: Iterable[str] = ()) -> dict[str, Any]:
    """The hand-written lexicon with the Chinese forms of ``vocab``'s values added (see the
    module docstring), in its own shape, for :class:`vitrine.intent.slots.SlotExtractor`. The
    last few are kept per (vocabulary, texts with pairs): an extractor rebuilt for the same
    catalogue reuses it."""
    paired = tuple(t for t in texts if t and re.search(f"[{_CJK}]", t) and re.search("[A-Za-z]", t))
    key = (vocab.fingerprint(), hash(paired))
    with _lock:
        got = _merged.get(key)
    if got is not None:
        return got
    lex = _merge(vocab, paired)
    with _lock:
        if len(_merged) >= 4:
            _merged.pop(next(iter(_merged)))
        _merged[key] = lex
    return lex


def _merge(vocab: Vocabulary, texts: Sequence[str]) -> dict[str, Any]:
    lex = copy.deepcopy(lexicon())
    values = {"category": vocab.categories, "colour": vocab.colours, "brand": vocab.brands}
    forms = chinese_forms(values, texts, lex)
    for fld, per in forms.items():
        table = lex.setdefault(fld, {})
        known = {key_norm(k): k for k in table}
        for value, zh in per.items():
            key = known.get(key_norm(value), value)
            latin, _ = _own_forms(value)  # "Nike/耐克" is named by "nike" alone too
            table[key] = list(dict.fromkeys([*table.get(key, []), *zh, *([latin] if latin else [])]))
    return lex
