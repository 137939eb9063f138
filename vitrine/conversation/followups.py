"""Reading a session's follow-up query (docs/sessions.md): what it names (:func:`parse`: values to keep
or leave out, a relative price, references to shown products, the words left, in English and
Chinese) and whether it refines the standing query or starts a new search (:class:`Decider`, a
logistic regression over :func:`features` of the follow-up and the standing query).
"""

from __future__ import annotations

import json
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

FIELDS = ("gender", "colour", "brand", "category")  # the order the effective words are composed in


# -- cue words: the language of refinement (English and Chinese), not a catalogue's vocabulary ------
_NEG_EN = re.compile(
    r"\b(?:not|no|without|except|excluding|exclude|minus|non|nothing|anything but|but not|avoid)\s+"
    r"((?:in |from |by |any )?[^,;.!?]+?)(?=\s+(?:but|and|in|for|with|only|please|instead)\b|[,;.!?]|$)", re.IGNORECASE)
_NEG_ZH = re.compile(r"(?:不要|除了|别要|不想要|不是|别|不含|没有)([^,，。;；!！?？但要]+)")
_CHEAPER = re.compile(r"\b(?:cheaper|less expensive|lower[- ]priced?|more affordable|lower cost|budget|inexpensive|"
                      r"cheap|less pricey|less costly)\b|便宜|实惠|低价|划算|省钱", re.IGNORECASE)
_PRICIER = re.compile(r"\b(?:more expensive|pricier|costlier|premium|high[- ]end|higher[- ]end|fancier|"
                      r"luxur\w*|better quality)\b|贵一点|更贵|贵点|高档|高端", re.IGNORECASE)
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
_ZH_DIGITS = {"一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "1": 1, "2": 2, "3": 3, "4": 4, "5": 5,
              "6": 6}
_ORD_ZH = re.compile(r"第([一二三四五六1-6])(?:个|款|件|双|条)?|前([两二三四五2-5])(?:个|款|件)?|最后一(?:个|款|件)")
_STOP = frozenset(
    ["a", "an", "the", "in", "on", "of", "for", "with", "and", "or", "but", "to", "from", "by", "at", "as", "is", "are", "be", "do", "does", "did", "i", "me", "my", "we", "you", "it", "its", "this", "that", "these", "those", "them", "they", "one", "ones", "some", "any", "show", "find", "get", "see", "look", "looking", "want", "need", "please", "just", "only", "also", "now", "more", "less", "same", "other", "else", "than", "too", "bit", "little", "very", "maybe", "something", "anything", "what", "about", "how", "which", "there", "here", "again", "instead", "rather", "prefer", "have", "has", "got", "option", "options", "version", "like", "similar", "similarly", "make", "let", "lets", "us", "colour", "color", "shade", "kind", "type", "style", "pair", "pairs", "then", "thing", "things", "really", "lot", "much", "give"])


def _fold(text: str) -> str:
    from vitrine.intent.slots import key_norm

    return key_norm(text)


def _cjk(text: str) -> bool:
    return any("\u3040" <= c <= "\u9fff" for c in text)


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


def _refs(text: str) -> list[int]:
    out: list[int] = []
    for m in _ORD_RE.finditer(text):
        if m.group(1):
            first = _ORD_EN[m.group(1).lower()]
            n = _NUM_EN.get((m.group(2) or "").lower(), 0)
            out.extend(range(n) if n and first == 0 else [first])
        elif m.group(3):
            out.append(int(m.group(3)) - 1)
        elif m.group(4):
            out.extend(range(_NUM_EN[m.group(4).lower()]))
    for m in _ORD_ZH.finditer(text):
        if m.group(1):
            out.append(_ZH_DIGITS[m.group(1)] - 1)
        elif m.group(2):
            out.extend(range(_ZH_DIGITS[m.group(2)]))
        else:
            out.append(-1)
    return list(dict.fromkeys(out))


def slot_lists(values: Mapping[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for f in FIELDS:
        v = values.get(f)
        if v:
            out[f] = [v] if isinstance(v, str) else list(v)
    return out


def _residual(extractor: SlotExtractor, text: str) -> list[str]:
    """The content words of ``text`` that name no slot, price, reference or cue."""
    from vitrine.intent.slots import parse_prices

    low = text.casefold()
    _, _, spans = parse_prices(low)
    for a, b in sorted(spans, reverse=True):
        low = low[:a] + " " + low[b:]
    for rx in (_ORD_RE, _CHEAPER, _PRICIER, _LIKE, _COMPARE, _RESET):
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
    """Read ``text`` (a query in a session) against the catalogue's vocabulary."""
    text = " ".join((text or "").split())
    p = Parsed(text=text, cjk=_cjk(text))
    if not text:
        return p
    negs: list[str] = []
    positive = text
    for rx in (_NEG_EN, _NEG_ZH):
        for m in rx.finditer(positive):
            negs.append(m.group(1))
        positive = rx.sub(" ", positive)
    p.positive = " ".join(positive.split())
    slots = extractor.extract(_ORD_RE.sub(" ", positive))  # "the top two" names no category
    p.include = slot_lists(slots.values())
    p.price_min, p.price_max = slots.price_min, slots.price_max
    for seg in negs:
        for f, vals in slot_lists(extractor.extract(seg).values()).items():
            p.exclude.setdefault(f, [])
            p.exclude[f].extend(v for v in vals if v not in p.exclude[f])
        p.negated_words.extend(_residual(extractor, seg))
    p.price_rel = "lower" if _CHEAPER.search(text) else "higher" if _PRICIER.search(text) else None
    p.refs = _refs(text)
    p.like = bool(_LIKE.search(text))
    p.compare = bool(_COMPARE.search(text))
    p.reset = bool(_RESET.search(text))
    p.words = _residual(extractor, positive)
    p.tokens = len(_fold(text).split()) if not p.cjk else max(1, len(text) // 2)
    p.connector = bool(_CONNECT.search(text.strip()))
    p.anaphora = bool(_ANAPHORA.search(text.strip()))
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


@lru_cache(maxsize=2)
def decider(path: str) -> Decider:
    return Decider.load(Path(path))
