"""Reading a session's follow-up query (docs/sessions.md): what it names (:func:`parse`: values to keep
or leave out, a relative price, references to shown products, the words left, in English and
Chinese) and whether it refines the standing query or starts a new search (:class:`Decider`, a
logistic regression over :func:`features` of the follow-up and the standing query).
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vitrine.errors import VitrineError
from vitrine.resources import resource_path

if TYPE_CHECKING:
    from vitrine.intent.slots import SlotExtractor

log = logging.getLogger(__name__)

FIELDS = ("gender", "colour", "brand", "category")  # the order the effective words are composed in


# -- cue words: the language of refinement (English and Chinese), not a catalogue's vocabulary ------
_NEG_EN = re.compile(
    r"\b(?:not|no|without|except|excluding|exclude|minus|non|nothing|anything but|but not|avoid)\s+"
    r"((?:in |from |by |any )?[^,;.!?]+?)(?=\s+(?:but|and|in|for|with|only|please|instead)\b|[,;.!?]|$)", re.IGNORECASE)
# "别" is a cue at the start of a clause only (特别, 区别, 别针 hold it too)
_NEG_ZH = re.compile(r"(?:不要|除了|别要|不想要|不是|(?:^|(?<=[\s,，。;；!！?？]))别|不含|没有)([^,，。;；!！?？但要]+)")
_CHEAPER = re.compile(r"\b(?:cheaper|less expensive|lower[- ]priced?|more affordable|lower cost|budget|inexpensive|"
                      r"cheap|less pricey|less costly)\b|便宜|实惠|低价|划算|省钱", re.IGNORECASE)
_PRICIER = re.compile(r"\b(?:more expensive|pricier|costlier|premium|high[- ]end|higher[- ]end|fancier|"
                      r"luxur\w*|better quality)\b|贵一点|更贵|贵点|高档|高端", re.IGNORECASE)
# the plain forms of a price word: before a content word ("budget backpacks", "premium watches") they
# describe what the shopper now looks for, not a price relative to what was shown
_PRICE_ADJ = frozenset(["budget", "inexpensive", "cheap", "affordable", "premium", "high end", "high-end", "higher end",
                        "higher-end", "luxury", "luxurious", "better quality"])
_PRICE_ADJ_ZH_NEXT = re.compile(r"[一点些款的吗呢么]")
_LIKE = re.compile(r"\b(?:like|similar|same as|resembl\w*|more of)\b|类似|相似|像|差不多|一样", re.IGNORECASE)
_COMPARE = re.compile(r"\b(?:compare|comparison|vs|versus|difference|differ)\b|比较|对比|区别", re.IGNORECASE)
_CONNECT = re.compile(r"^(?:in|for|with|but|and|only|just|show(?: me)?|make it|now|what about|how about|any|also|"
                      r"maybe|same|then|instead|rather|prefer|the)\b|^(?:要|换|有没有|来|看看|还有|那)", re.IGNORECASE)
_ANAPHORA = re.compile(r"\b(?:ones?|those|these|them|it|that|same)\b|的$|的吗|的呢", re.IGNORECASE)
_RESET = re.compile(r"\b(?:new search|start over|forget|never ?mind|something else|different thing)\b|换个|重新|算了",
                    re.IGNORECASE)
_ORD_EN = {"first": 0, "1st": 0, "second": 1, "2nd": 1, "third": 2, "3rd": 2, "fourth": 3, "4th": 3, "fifth": 4,
           "5th": 4, "sixth": 5, "6th": 5, "last": -1}
_NUM_EN = {"two": 2, "2": 2, "three": 3, "3": 3, "four": 4, "4": 4, "five": 5, "5": 5}
_ORD_RE = re.compile(r"\b(first|1st|second|2nd|third|3rd|fourth|4th|fifth|5th|sixth|6th|last)\b"
                     r"(?:\s+(two|three|four|five|2|3|4|5)\b)?|\b(?:#|number|no\.?)\s*([1-6])\b|"
                     r"\btop\s+(two|three|four|five|2|3|4|5)\b", re.IGNORECASE)
# what may follow an ordinal that refers to a shown product ("the second one", "the first two", "2nd in
# black", "the last"): anything else that follows it is a content word ("first aid", "last season")
_REF_NEXT = frozenset(["one", "ones", "item", "items", "product", "products", "result", "results", "option",
                       "options", "pick", "choice", "shown", "listed", "here", "there", "but", "and", "in", "with",
                       "please", "instead", "too", "again", "also", "only", "just", "then", "vs", "versus", "or"])
_REF_OF = frozenset(["them", "those", "these", "the", "it", "what", "your", "you"])
_ZH_DIGITS = {"一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "1": 1, "2": 2, "3": 3, "4": 4, "5": 5,
              "6": 6}
# 第一次 (the first time), 第二代 (second generation), 前两天 (two days ago) are no references
_ORD_ZH = re.compile(r"第([一二三四五六1-6])(?![次季代名届期天年批手号位页集部回轮章节方])(?:个|款|件|双|条)?|"
                     r"前([两二三四五2-5])(?:个|款|件|双|条)|最后一(?:个|款|件|双|条)")
_STOP = frozenset(
    ["a", "an", "the", "in", "on", "of", "for", "with", "and", "or", "but", "to", "from", "by", "at", "as", "is", "are", "be", "do", "does", "did", "i", "me", "my", "we", "you", "it", "its", "this", "that", "these", "those", "them", "they", "one", "ones", "some", "any", "show", "find", "get", "see", "look", "looking", "want", "need", "please", "just", "only", "also", "now", "more", "less", "same", "other", "else", "than", "too", "bit", "little", "very", "maybe", "something", "anything", "what", "about", "how", "which", "there", "here", "again", "instead", "rather", "prefer", "have", "has", "got", "option", "options", "version", "like", "similar", "similarly", "make", "let", "lets", "us", "colour", "color", "shade", "kind", "type", "style", "pair", "pairs", "then", "thing", "things", "really", "lot", "much", "give"])


def _fold(text: str) -> str:
    from vitrine.intent.slots import key_norm

    return key_norm(text)


def _cjk(text: str) -> bool:
    return any("\u3040" <= c <= "\u9fff" for c in text)


LOOKALIKES_PATH = resource_path("sessions", "lookalikes.json")
_MASK = "_"  # a word character: a masked phrase stays one word and holds no cue


@lru_cache(maxsize=4)
def _lookalikes(path: str = str(LOOKALIKES_PATH)) -> re.Pattern[str] | None:
    """One pattern over the shipped look-alike phrases (English with word boundaries, hyphen or space
    alike; Chinese as written)."""
    try:
        d = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        log.warning("session look-alikes unreadable (%s): only the structural rules apply", e)
        return None
    alts = [r"(?<!\w)" + r"[\s-]*".join(re.escape(w) for w in re.split(r"[\s-]+", ph.strip())) + r"(?!\w)"
            for ph in d.get("en", []) if ph.strip()]
    alts += [re.escape(ph) for ph in d.get("zh", []) if ph.strip()]
    alts.sort(key=len, reverse=True)
    return re.compile("|".join(alts), re.IGNORECASE) if alts else None


def mask_lookalikes(text: str) -> str:
    """``text`` with every look-alike phrase (vitrine/resources/sessions/lookalikes.json) masked, its
    length kept, so the cue patterns run on the masked text and their spans cut the text as typed."""
    rx = _lookalikes()
    if rx is None:
        return text
    return rx.sub(lambda m: _MASK * len(m.group(0)), text)


_ZH_FUNCTION = re.compile(r"[的吗呢了啊吧么呀点些款个一]")


def _lookalike_heads(extractor: SlotExtractor | None, text: str, masked: str) -> bool:
    """Whether a look-alike phrase in ``text`` is followed by a word of its own ("不粘锅": 锅 after 不粘,
    "first aid kit"): the phrase then describes a thing sought, not a property of the standing query."""
    for m in re.finditer(f"{re.escape(_MASK)}+", masked):
        if text[m.start():m.end()] == masked[m.start():m.end()]:
            continue  # an underscore typed as such
        after = text[m.end():m.end() + 1]
        if after and _cjk(after):
            if not _ZH_FUNCTION.match(after):
                return True
        elif _content_word(extractor, next(iter(_next_words(text, m.end(), 1)), None)):
            return True
    return False


def _next_words(text: str, end: int, n: int = 2) -> list[str]:
    return re.findall(r"[^\W_]+|_+", text[end:].casefold())[:n]


def _content_word(extractor: SlotExtractor | None, w: str | None) -> bool:
    """Whether ``w`` is a word of the thing sought (not a function word, a count, a colour or gender)."""
    if not w or _cjk(w):
        return False
    if w.startswith(_MASK):
        return True
    if w in _STOP or w in _NUM_EN or w in _REF_NEXT or w.isdigit():
        return False
    if extractor is not None:
        vals = extractor.extract(w).values()
        if vals.get("colour") or vals.get("gender"):
            return False
    return len(w) >= 2


def _is_reference(extractor: SlotExtractor | None, text: str, end: int) -> bool:
    """An ordinal ending at ``end`` refers to a shown product unless a content word follows it."""
    nxt = _next_words(text, end)
    if not nxt:
        return True
    if nxt[0] == "of":
        return len(nxt) < 2 or nxt[1] in _REF_OF
    return not _content_word(extractor, nxt[0])


def _price_rel(extractor: SlotExtractor | None, masked: str) -> tuple[str | None, list[tuple[int, int]], bool]:
    """"lower" / "higher" when ``masked`` asks for a price relative to what was shown (and the cue's
    span); a plain price word before a content word ("budget backpacks", "高端手表") is part of the
    query instead (the third value says one was)."""
    modifier = False
    for rx, rel in ((_CHEAPER, "lower"), (_PRICIER, "higher")):
        for m in rx.finditer(masked):
            word = " ".join(m.group(0).casefold().split())
            if _cjk(word):
                after = masked[m.end():m.end() + 1]
                if after and _cjk(after) and not _PRICE_ADJ_ZH_NEXT.match(after):
                    modifier = True
                    continue
            elif word in _PRICE_ADJ and _content_word(extractor, next(iter(_next_words(masked, m.end(), 1)), None)):
                modifier = True
                continue
            return rel, [m.span()], modifier
    return None, [], modifier


def _blank(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` with ``spans`` replaced by spaces (its length kept, so other spans still apply)."""
    chars = list(text)
    for a, b in spans:
        chars[a:b] = " " * (b - a)
    return "".join(chars)


# -- parsing a follow-up -------------------------------------------------------------------------------
@dataclass
class Parsed:
    """What one query names, for a session."""

    text: str
    positive: str = ""  # the text less its negated segments
    include: dict[str, list[str]] = field(default_factory=dict)
    exclude: dict[str, list[str]] = field(default_factory=dict)
    price_min: float | None = None
    price_max: float | None = None
    price_rel: str | None = None  # "lower" / "higher": relative to what was shown
    refs: list[int] = field(default_factory=list)  # indices into the shown ids (-1: the last)
    like: bool = False
    compare: bool = False
    words: list[str] = field(default_factory=list)  # content words naming no slot
    negated_words: list[str] = field(default_factory=list)
    tokens: int = 0
    connector: bool = False
    anaphora: bool = False
    reset: bool = False
    cjk: bool = False
    modifier: bool = False  # a cue word read as a modifier of a word after it ("budget backpacks", "不粘锅")


def _refs(text: str, extractor: SlotExtractor | None = None) -> tuple[list[int], list[tuple[int, int]], bool]:
    """References to shown products in ``text`` (look-alikes masked), their spans, and whether an
    ordinal was read as a modifier of the word after it ("first aid kit")."""
    out: list[int] = []
    spans: list[tuple[int, int]] = []
    modifier = False
    for m in _ORD_RE.finditer(text):
        if not _is_reference(extractor, text, m.end()):
            modifier = True
            continue  # "first aid", "last season", "no. 5 perfume", "top 5 watches"
        spans.append(m.span())
        if m.group(1):
            first = _ORD_EN[m.group(1).lower()]
            n = _NUM_EN.get((m.group(2) or "").lower(), 0)
            out.extend(range(n) if n and first == 0 else [first])
        elif m.group(3):
            out.append(int(m.group(3)) - 1)
        elif m.group(4):
            out.extend(range(_NUM_EN[m.group(4).lower()]))
    for m in _ORD_ZH.finditer(text):
        spans.append(m.span())
        if m.group(1):
            out.append(_ZH_DIGITS[m.group(1)] - 1)
        elif m.group(2):
            out.extend(range(_ZH_DIGITS[m.group(2)]))
        else:
            out.append(-1)
    return list(dict.fromkeys(out)), spans, modifier


def _compound(extractor: SlotExtractor, cue: str, seg: str) -> tuple[bool, str]:
    """Whether a negated segment is a compound of the query, and the part of it to leave out.

    "non slip flip flops", "no show socks": "no"/"non" then a word naming no value then a category is
    a property of the thing sought, not an exclusion (nothing to leave out). "没有logo的T恤": the
    head after the last 的 names a category: only what precedes 的 is left out."""
    if _cjk(seg) and "的" in seg:
        head = seg.rsplit("的", 1)[1]
        if head and extractor.extract(head).values().get("category"):
            return True, seg.rsplit("的", 1)[0]
    if cue.casefold() in ("no", "non"):
        words = _fold(seg).split()
        vals = extractor.extract(seg).values()
        in_phrase = {w for ph in extractor.find_phrases(_fold(seg)) for w in ph.split()}
        if vals.get("category") and words and _content_word(extractor, words[0]) and words[0] not in in_phrase:
            return True, ""
    return False, seg


def slot_lists(values: Mapping[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for f in FIELDS:
        v = values.get(f)
        if v:
            out[f] = [v] if isinstance(v, str) else list(v)
    return out


def _residual(extractor: SlotExtractor, text: str, *, cues: bool = True) -> list[str]:
    """The content words of ``text`` that name no slot, price, reference or (``cues``) cue word."""
    from vitrine.intent.slots import parse_prices

    low = text.casefold()
    _, _, spans = parse_prices(low)
    for a, b in sorted(spans, reverse=True):
        low = low[:a] + " " + low[b:]
    for rx in (_ORD_RE, _CHEAPER, _PRICIER, _LIKE, _COMPARE, _RESET) if cues else ():
        low = rx.sub(" ", low)
    q = _fold(low)
    for surface in extractor.find_phrases(q):
        q = re.sub(rf"(?<!\w){re.escape(surface)}(?!\w)", " ", q, count=1)
    words = []
    for w in q.split():
        if _cjk(w) or w in _STOP or len(w) < 2 and not w.isdigit():
            continue
        words.append(w)
    return words


def parse(extractor: SlotExtractor, text: str | None) -> Parsed:
    """Read ``text`` (a query in a session) against the catalogue's vocabulary.

    The cue patterns run on the text with its look-alike phrases masked (:func:`mask_lookalikes`), and
    a cue counts only where it is one: an ordinal before a content word ("first aid kit"), a plain
    price word before one ("budget backpacks") or a negated modifier before a category ("non slip
    flip flops") are words of the query."""
    text = " ".join((text or "").split())
    p = Parsed(text=text, cjk=_cjk(text))
    if not text:
        return p
    masked = mask_lookalikes(text)
    negs: list[str] = []
    neg_spans: list[tuple[int, int]] = []
    for rx in (_NEG_EN, _NEG_ZH):
        for m in rx.finditer(_blank(masked, neg_spans)):
            seg = text[m.start(1):m.end(1)]
            compound, left_out = _compound(extractor, masked[m.start():m.start(1)].strip(), seg)
            if compound and not left_out:
                p.modifier = True
                continue  # the whole phrase is a property of the thing sought
            negs.append(left_out)
            # a compound keeps its head ("没有logo的T恤": T恤 stays wanted)
            neg_spans.append((m.start(), m.start(1) + len(left_out) + 1) if compound else m.span())
    p.positive = " ".join(_blank(text, neg_spans).split())
    p.refs, ref_spans, ord_modifier = _refs(masked, extractor)
    slots = extractor.extract(_blank(text, neg_spans + ref_spans))  # "the top two" names no category
    p.include = slot_lists(slots.values())
    p.price_min, p.price_max = slots.price_min, slots.price_max
    for seg in negs:
        for f, vals in slot_lists(extractor.extract(seg).values()).items():
            p.exclude.setdefault(f, [])
            p.exclude[f].extend(v for v in vals if v not in p.exclude[f])
        p.negated_words.extend(_residual(extractor, seg))
    p.price_rel, rel_spans, price_modifier = _price_rel(extractor, masked)
    p.modifier = p.modifier or ord_modifier or price_modifier or _lookalike_heads(extractor, text, masked)
    cue_spans = neg_spans + ref_spans + rel_spans
    for rx, name in ((_LIKE, "like"), (_COMPARE, "compare"), (_RESET, "reset")):
        found = [m.span() for m in rx.finditer(masked)]
        setattr(p, name, bool(found))
        cue_spans += found
    p.words = _residual(extractor, _blank(text, cue_spans), cues=False)
    p.tokens = len(_fold(text).split()) if not p.cjk else max(1, len(text) // 2)
    p.connector = bool(_CONNECT.search(masked.strip()))
    p.anaphora = bool(_ANAPHORA.search(masked.strip()))
    return p


# -- the refine-or-new-search classifier ---------------------------------------------------------------
FEATURES = ("tokens", "price_rel", "price_abs", "negation", "reference", "like", "compare", "connector", "anaphora",
            "names_category", "category_differs", "category_same", "attr_slot", "residual", "residual_ratio",
            "overlap", "only_attrs", "standing_photo", "standing_category", "cjk", "reset", "photo_now")
DECIDER_PATH = resource_path("sessions", "decider.json")


def features(p: Parsed, standing: Mapping[str, Any], *, photo: bool = False) -> dict[str, float]:
    """The decider's features of follow-up ``p`` given the standing query ``standing`` (a session state)."""
    st_slots: dict[str, list[str]] = standing.get("slots") or {}
    st_cats = {c.casefold() for c in st_slots.get("category", [])}
    cats = {c.casefold() for c in p.include.get("category", [])}
    attrs = any(p.include.get(f) for f in ("colour", "gender", "brand"))
    content = len(p.words) + sum(len(v) for v in p.include.values())
    st_words = set(_fold(standing.get("text") or "").split()) | {w.casefold() for v in st_slots.values() for w in v}
    overlap = (sum(1 for w in p.words if w in st_words) / len(p.words)) if p.words else 0.0
    return {
        "tokens": min(p.tokens, 8) / 8,
        "price_rel": float(p.price_rel is not None),
        "price_abs": float(p.price_min is not None or p.price_max is not None),
        "negation": float(bool(p.exclude or p.negated_words)),
        "reference": float(bool(p.refs)),
        "like": float(p.like),
        "compare": float(p.compare),
        "connector": float(p.connector),
        "anaphora": float(p.anaphora),
        "names_category": float(bool(cats)),
        "category_differs": float(bool(cats) and bool(st_cats) and not cats & st_cats),
        "category_same": float(bool(cats & st_cats)),
        "attr_slot": float(attrs),
        "residual": min(len(p.words), 4) / 4,
        "residual_ratio": len(p.words) / max(1, content),
        "overlap": overlap,
        "only_attrs": float(attrs and not cats and not p.words),
        "standing_photo": float(bool(standing.get("image"))),
        "standing_category": float(bool(st_cats)),
        "cjk": float(p.cjk),
        "reset": float(p.reset),
        "photo_now": float(photo),
    }


class Decider:
    """Logistic regression: P(refine | follow-up, standing query). Weights are plain JSON."""

    def __init__(self, weights: Mapping[str, float], bias: float, meta: Mapping[str, Any] | None = None) -> None:
        self.names = tuple(FEATURES)
        self.w = np.array([float(weights.get(n, 0.0)) for n in self.names])
        self.bias = float(bias)
        self.meta = dict(meta or {})

    def p_refine(self, feats: Mapping[str, float]) -> float:
        x = np.array([feats[n] for n in self.names])
        return float(1.0 / (1.0 + math.exp(-(float(self.w @ x) + self.bias))))

    def to_json(self) -> dict[str, Any]:
        return {"kind": "logistic_regression", "features": list(self.names),
                "weights": {n: round(float(v), 6) for n, v in zip(self.names, self.w)},
                "bias": round(self.bias, 6), **self.meta}

    @classmethod
    def load(cls, path: Path = DECIDER_PATH) -> Decider:
        try:
            d = json.loads(Path(path).read_text(encoding="utf-8"))
            return cls(d["weights"], d["bias"], {k: v for k, v in d.items() if k not in ("weights", "bias")})
        except (OSError, ValueError, KeyError) as e:
            raise VitrineError(f"session decider weights unreadable ({path}): {e}") from e

    @classmethod
    def fit(cls, X: np.ndarray, y: np.ndarray, *, l2: float = 1e-3, meta: Mapping[str, Any] | None = None) -> Decider:
        """The logistic regression minimising the mean log loss plus ``l2 / 2 * |w|^2`` (the bias
        unpenalised), rows of ``X`` in FEATURES order: scikit-learn's (the ``train`` extra,
        imported only here; serving reads the weights from JSON and needs none of it)."""
        from sklearn.linear_model import LogisticRegression

        # scikit-learn minimises C * sum(log loss) + |w|^2 / 2: the same optimum with C = 1 / (n * l2)
        model = LogisticRegression(C=1.0 / (len(y) * l2), solver="lbfgs", tol=1e-10, max_iter=10_000)
        model.fit(X, y)
        return cls(dict(zip(FEATURES, model.coef_[0].tolist())), float(model.intercept_[0]), meta)


def names_new_thing(p: Parsed, standing: Mapping[str, Any]) -> bool:
    """A follow-up that names something of its own through a cue-like modifier ("first aid kit",
    "budget laptops", "不粘锅", "无线耳机") and carries no cue of a refinement (no reference, relative
    price, exclusion, connector, pronoun, catalogue value, nor a word of the standing query) is a new
    search, whatever the decider makes of words it has no vocabulary for."""
    if not p.modifier or p.refs or p.price_rel or p.exclude or p.negated_words or p.connector or p.anaphora \
            or p.include or p.like or p.compare:
        return False
    st_words = set(_fold(standing.get("text") or "").split()) | set(standing.get("words") or [])
    return not any(w in st_words for w in p.words)


@lru_cache(maxsize=2)
def decider(path: str) -> Decider:
    return Decider.load(Path(path))
