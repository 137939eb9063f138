"""Shopping sessions: a follow-up query refines the session's standing query (docs/sessions.md).

A search with a ``session`` id reads the session's standing query (its words, photo vector,
slots, filters and exclusions, and the ids it last showed) from the session store
(vitrine/index/sessionstore.py), then reads the follow-up:

1. :func:`parse` finds what the follow-up names, over the catalogue's own vocabulary (the slot
   extractor of vitrine/intent/slots.py: brands, categories, colours, genders, prices, English and
   Chinese): values to keep (``in brown``, ``要棕色的``), values to leave out (``not nike``,
   ``不要耐克``: the segment after a negation cue), a price relative to what was shown (``cheaper``,
   ``便宜一点的``), references to shown products (``the second one``, ``第二个``, ``compare the first
   two``) and the words left (``leather ones``).
2. :class:`Decider` (a logistic regression over features of the follow-up and the standing query,
   trained on generated turns of the catalogue's train split: vitrine/evals/sessions.py, weights
   in ``vitrine/resources/sessions/decider.json``) gives the probability that it refines the
   standing query rather than starting a new search. ``new_search`` in the request overrules it.
3. A refinement is merged into the standing query (:func:`refine`): a named field replaces the
   standing value (``in brown`` after ``black bags``), exclusions add up, a relative price bounds
   the price below (or above) the median of the prices shown, a reference anchors the query on
   that product's photo vector. The effective query then runs as any search: its words composed
   from the slots and the words kept, its slots and exclusions as explicit filters.

What the search ran, and what changed, comes back in the response's ``session`` object, with
each part of the standing query as a removable chip (``session_drop``).
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vitrine.errors import VitrineError
from vitrine.index.backends import open_session_store
from vitrine.index.sessionstore import SessionStoreAPI
from vitrine.resources import resource_path
from vitrine.search.models import (
    CompareResponse,
    Filters,
    SearchRequest,
    SearchResponse,
)
from vitrine.search.reader import Reader

if TYPE_CHECKING:
    from vitrine.intent.slots import SlotExtractor
    from vitrine.search.understanding import QueryUnderstanding

log = logging.getLogger(__name__)

FIELDS = ("gender", "colour", "brand", "category")  # the order the effective words are composed in
STATE_VERSION = 1
SHOWN = 10  # ids of the first page kept for references ("the second one")
PHOTO_VOTES = 5  # of a photo's 10 nearest products, how many must agree for a category or gender to be its own

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


def _slot_lists(values: Mapping[str, Any]) -> dict[str, list[str]]:
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
    p.include = _slot_lists(slots.values())
    p.price_min, p.price_max = slots.price_min, slots.price_max
    for seg in negs:
        for f, vals in _slot_lists(extractor.extract(seg).values()).items():
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
    def fit(cls, X: np.ndarray, y: np.ndarray, *, l2: float = 1e-3, epochs: int = 3000, lr: float = 0.5,
            meta: Mapping[str, Any] | None = None) -> Decider:
        """Fit by full-batch gradient descent on the log loss (rows of ``X`` in FEATURES order)."""
        w = np.zeros(X.shape[1])
        b = 0.0
        n = len(y)
        for _ in range(epochs):
            z = np.clip(X @ w + b, -30, 30)
            p = 1.0 / (1.0 + np.exp(-z))
            g = p - y
            w -= lr * (X.T @ g / n + l2 * w)
            b -= lr * float(g.mean())
        return cls(dict(zip(FEATURES, w.tolist())), b, meta)


@lru_cache(maxsize=2)
def _decider(path: str) -> Decider:
    return Decider.load(Path(path))


# -- the standing query ------------------------------------------------------------------------------
def empty_state() -> dict[str, Any]:
    return {"v": STATE_VERSION, "text": None, "input": None, "plain": True, "slots": {}, "exclude": {},
            "price_min": None,
            "price_max": None, "words": [], "filters": {}, "image": False, "photo_slots": [], "shown": [],
            "turn": 0}


def compose_text(state: Mapping[str, Any]) -> str | None:
    """The effective words: the slots' canonical values and the words kept, in one order. With a
    photo, the words kept alone (the slots filter; their names would outweigh the photo)."""
    parts: list[str] = []
    slots = state.get("slots") or {}
    if state.get("image"):
        return " ".join(state.get("words") or []) or None
    for f in FIELDS:
        if f == "category":
            parts.extend(state.get("words") or [])
        parts.extend(slots.get(f) or [])
    text = " ".join(parts).strip()
    return text or None


def chips(state: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each part of the standing query the shopper may remove (its ``key`` goes in ``session_drop``)."""
    out: list[dict[str, Any]] = []
    if state.get("image"):
        out.append({"key": "photo", "kind": "photo", "label": "photo"})
    for f in FIELDS:
        for v in (state.get("slots") or {}).get(f, []):
            out.append({"key": f"{f}:{v}", "kind": "include", "field": f, "value": v, "label": v})
    for w in state.get("words") or []:
        out.append({"key": f"word:{w}", "kind": "word", "value": w, "label": w})
    for f, vals in (state.get("exclude") or {}).items():
        for v in vals:
            out.append({"key": f"not.{f}:{v}", "kind": "exclude", "field": f, "value": v, "label": f"not {v}"})
    for f, label in (("price_min", "from {:g}"), ("price_max", "under {:g}")):
        if state.get(f) is not None:
            out.append({"key": f, "kind": "price", "field": f, "value": state[f], "label": label.format(state[f])})
    for f, v in (state.get("filters") or {}).items():
        if f != "exclude":
            out.append({"key": f"filter.{f}", "kind": "filter", "field": f, "value": v, "label": f"{f}: {v}"})
    return out


def drop(state: dict[str, Any], keys: Sequence[str]) -> list[str]:
    """Remove the chips ``keys`` from ``state``; returns what changed."""
    changed: list[str] = []
    for key in keys:
        if key == "photo" and state.get("image"):
            state["image"] = False
            for f in state.get("photo_slots") or []:
                state["slots"].pop(f, None)
            state["photo_slots"] = []
            changed.append("photo")
        elif key.startswith("not."):
            f, _, v = key[4:].partition(":")
            vals = state["exclude"].get(f, [])
            if v in vals:
                vals.remove(v)
                if not vals:
                    state["exclude"].pop(f)
                changed.append(f"exclude.{f}")
        elif key.startswith("word:"):
            w = key[5:]
            if w in state["words"]:
                state["words"].remove(w)
                changed.append("words")
        elif key in ("price_min", "price_max"):
            if state.get(key) is not None:
                state[key] = None
                changed.append(key)
        elif key.startswith("filter."):
            if state["filters"].pop(key[7:], None) is not None:
                changed.append(key[7:])
        else:
            f, _, v = key.partition(":")
            vals = state["slots"].get(f, [])
            if v in vals or (not v and vals):
                state["slots"][f] = [x for x in vals if v and x != v]
                if not state["slots"][f]:
                    state["slots"].pop(f)
                changed.append(f)
    return list(dict.fromkeys(changed))


def refine(state: dict[str, Any], p: Parsed, *, shown_prices: Sequence[float] = ()) -> list[str]:
    """Merge follow-up ``p`` into ``state`` (in place); returns the fields it changed."""
    changed: list[str] = []
    slots = state.setdefault("slots", {})
    excl = state.setdefault("exclude", {})
    for f, vals in p.include.items():
        if [v.casefold() for v in slots.get(f, [])] != [v.casefold() for v in vals]:
            slots[f] = list(vals)
            changed.append(f)
        if f in state.get("photo_slots", []):
            state["photo_slots"].remove(f)  # the words named it now
        gone = {v.casefold() for v in vals}
        if f in excl:  # "in black" after "not black"
            excl[f] = [v for v in excl[f] if v.casefold() not in gone]
            if not excl[f]:
                excl.pop(f)
    for f, vals in p.exclude.items():
        cur = excl.setdefault(f, [])
        for v in vals:
            if v not in cur:
                cur.append(v)
                changed.append(f"exclude.{f}")
        keep = [v for v in slots.get(f, []) if v.casefold() not in {x.casefold() for x in vals}]
        if f in slots and keep != slots[f]:
            if keep:
                slots[f] = keep
            else:
                slots.pop(f)
            changed.append(f)
    for f in ("price_min", "price_max"):
        v = getattr(p, f)
        if v is not None and v != state.get(f):
            state[f] = v
            changed.append(f)
    prices = sorted(x for x in shown_prices if x is not None and not math.isnan(x))
    if p.price_rel and prices:
        mid = float(np.median(prices))
        if p.price_rel == "lower":
            state["price_max"] = round(mid * 0.999, 2) if state.get("price_max") is None else \
                min(state["price_max"], round(mid * 0.999, 2))
            changed.append("price_max")
        else:
            state["price_min"] = round(mid * 1.001, 2)
            changed.append("price_min")
    if p.words:
        new = [w for w in p.words if w not in state.setdefault("words", [])]
        if new:
            state["words"].extend(new)
            changed.append("words")
    if p.negated_words:
        state["words"] = [w for w in state.get("words", []) if w not in p.negated_words]
    return list(dict.fromkeys(changed))


def new_state(p: Parsed, client_filters: Mapping[str, Any]) -> dict[str, Any]:
    st = empty_state()
    refine(st, p)
    st["filters"] = {k: v for k, v in client_filters.items() if k != "exclude"}
    return st


def _same_photo(photo: np.ndarray | None, standing: np.ndarray | None, given: bool) -> bool:
    """Whether a request's photo is the standing one (a page of a photo search re-sends it)."""
    if not given:
        return True
    if photo is None or standing is None or photo.shape != standing.shape:
        return False
    den = float(np.linalg.norm(photo) * np.linalg.norm(standing))
    return den > 0 and float(photo @ standing) / den > 0.9999


# -- one turn --------------------------------------------------------------------------------------
@dataclass
class Turn:
    """One search in a session: the request as the search runs it, and what the response says."""

    sid: str
    state: dict[str, Any]
    req: SearchRequest
    text: str | None
    image: bytes | None
    vectors: dict[str, np.ndarray] = field(default_factory=dict)  # query vectors the session supplies
    vector: np.ndarray | None = None  # the photo vector the session keeps after this turn
    info: dict[str, Any] = field(default_factory=dict)
    compare_ids: list[str] = field(default_factory=list)
    record: bool = True  # False: a page or re-sort of the same query (the shown ids are kept)


class Sessions:
    """The read path's sessions over ``reader``'s catalogue, the session store opened on first use."""

    def __init__(self, reader: Reader, understanding: QueryUnderstanding | None) -> None:
        self.reader = reader
        self.understanding = understanding
        self.settings = reader.settings.search
        self._store: SessionStoreAPI | None = None
        self._lock = threading.Lock()
        self._extractor: Any = None

    @property
    def store(self) -> SessionStoreAPI:
        if self._store is None:
            with self._lock:
                if self._store is None:
                    records = self.reader.state.records
                    url = getattr(records, "url", None)
                    self._store = open_session_store(self.settings.session_store, data_dir=self.reader.data_dir,
                                                     database_url=url, ttl_s=self.settings.session_ttl_s,
                                                     max_sessions=self.settings.session_max)
        return self._store

    def close(self) -> None:
        with self._lock:
            store, self._store = self._store, None  # a later session search opens it again
        if store is not None:
            store.close()

    def extractor(self) -> SlotExtractor:
        if self.understanding is not None:
            return self.understanding.extractor()
        if self._extractor is None:  # intent off: the same vocabulary, built here
            from types import SimpleNamespace

            from vitrine.intent.slots import SlotExtractor
            from vitrine.search.understanding import QueryUnderstanding

            vocab = QueryUnderstanding.vocabulary(SimpleNamespace(reader=self.reader))  # type: ignore[arg-type]
            self._extractor = SlotExtractor(vocab)
        return self._extractor

    # -- before the search -------------------------------------------------------------------------------
    def begin(self, req: SearchRequest, text: str | None, image: bytes | None) -> Turn:
        """Read the session and the follow-up; the turn's effective request. Never raises for an
        unknown or expired session (it is a new search, said in the response)."""
        sid = req.session or ""
        stored = self.store.get(sid)
        ex = self.extractor()
        p = parse(ex, text)
        standing = stored.state if stored is not None and not stored.expired and stored.state else None
        info: dict[str, Any] = {"id": sid}
        client = req.filters.model_dump(exclude_none=True) if req.filters else {}
        vector: np.ndarray | None = None
        if standing is not None and stored is not None and stored.vector is not None:
            vector = np.frombuffer(stored.vector, dtype=np.float32).copy()
        photo_vec = self._photo_vector(image) if image is not None else None
        turn = Turn(sid, {}, req, text, image, info=info)
        if standing is None:
            info.update(new_search=True, decided_by="expired" if stored is not None and stored.expired else
                        "new_session", p_refine=None, p_new_search=None)
            if stored is not None and stored.expired:
                info["expired"] = True
            state, changed = new_state(p, client), []
        elif req.session_drop and not text and image is None:
            state = json.loads(json.dumps(standing))
            changed = drop(state, req.session_drop)
            info.update(new_search=False, decided_by="drop", p_refine=None, p_new_search=None)
        elif text == standing.get("input") and _same_photo(photo_vec, vector, image is not None) and \
                not req.session_drop and req.new_search is not True and \
                {k: v for k, v in client.items() if k != "exclude"} == (standing.get("filters") or {}):
            state, changed = json.loads(json.dumps(standing)), []  # a page or a re-sort of the same query
            info.update(new_search=False, decided_by="same_query", p_refine=None, p_new_search=None)
            turn.record = req.offset == 0
            photo_vec = None  # the standing photo vector serves
        else:
            feats = features(p, standing, photo=photo_vec is not None)
            try:
                pr = _decider(str(DECIDER_PATH)).p_refine(feats)
            except VitrineError as e:
                log.warning("%s: follow-ups read as refinements", e)
                pr = 0.5 + 0.5 * float(not feats["category_differs"])
            info.update(p_refine=round(pr, 4), p_new_search=round(1 - pr, 4))
            refining = pr >= 0.5 if req.new_search is None else not req.new_search
            info.update(new_search=not refining, decided_by="classifier" if req.new_search is None else "client")
            if refining:
                state = json.loads(json.dumps(standing))
                if req.session_drop:
                    drop(state, req.session_drop)
                # the request's filters are the storefront's current selection: they replace the session's
                state["filters"] = {k: v for k, v in client.items() if k != "exclude"}
                if photo_vec is not None and not p.refs:  # a photo dropped mid-session: its words' slots stay
                    state["words"] = []
                    state["image"] = True
                changed = refine(state, p, shown_prices=self._shown_prices(state) if p.price_rel else ())
                if (p.price_rel or p.price_min is not None or p.price_max is not None) and \
                        not self.reader.state.filters.has_prices():
                    info["notes"] = ["the catalogue has no prices: a price changes nothing"]
                if p.refs:
                    changed += self._reference(turn, state, p, vector)
                    vector = turn.vector if turn.vector is not None else vector
            else:
                state, changed = new_state(p, client), []
                vector = None
        if photo_vec is not None and not (p.refs and standing is not None):
            vector = photo_vec
            state["image"] = True
            changed += self._photo_slots(state, photo_vec, changed)
        if not state.get("image"):
            vector = None
        state["input"] = text
        if info["decided_by"] == "same_query":  # a page or a sort of the standing query: run as it ran
            plain = bool(state.get("plain"))
        else:
            plain = bool(info["new_search"])  # a new search runs as typed (its slots soft, as any search)
            state["turn"] = int(state.get("turn", 0)) + 1
            state["text"] = (p.positive or None) if plain else compose_text(state)
            if not state["text"] and not state.get("image") and text:  # nothing understood: the words as typed
                state["text"] = p.positive or text
        state["plain"] = plain
        turn.state, turn.vector, turn.image = state, vector, None if vector is not None else image
        if vector is not None:
            turn.vectors = {"image": vector}
        turn.text = state["text"]
        turn.req = req.model_copy(update={"text": turn.text, "filters": self.filters_of(state, plain, req.filters)})
        info["changed"] = list(dict.fromkeys(changed))
        return turn

    def filters_of(self, state: Mapping[str, Any], new_search: bool, given: Filters | None) -> Filters | None:
        """The effective filters: the client's, the standing slots (a refinement's; a new search's slots
        stay the plain search's soft slot filters), exclusions and price bounds."""
        merged: dict[str, Any] = dict(state.get("filters") or {})
        f_index = self.reader.state.filters
        if not new_search:
            for f, vals in (state.get("slots") or {}).items():
                if f not in f_index.fields or f in merged:
                    continue
                have = {v.casefold() for v in f_index.facet(f)}
                known = [v for v in vals if v.casefold() in have]
                if known:  # a brand the graph learned from titles stays in the words (slot filter)
                    merged[f] = known[0] if len(known) == 1 else known
            for f in ("price_min", "price_max"):  # a catalogue without prices: a price bound filters nothing
                if state.get(f) is not None and f not in merged and f_index.has_prices():
                    merged[f] = state[f]
        if state.get("exclude"):
            merged["exclude"] = {f: list(v) for f, v in state["exclude"].items() if v}
        if not merged:
            return None
        try:
            return Filters.model_validate(merged)
        except ValueError as e:
            log.info("session filters dropped (%s)", e)
            return given

    # -- the parts a turn may need -----------------------------------------------------------------------
    def _photo_vector(self, image: bytes) -> np.ndarray | None:
        try:
            return np.asarray(self.reader.query_vectors(None, image, timeout_s=self.settings.gate_timeout_ms / 1000)
                              ["image"], dtype=np.float32)
        except VitrineError:
            raise
        except Exception as e:  # noqa: BLE001 - the search's own guarded step encodes it (and degrades)
            log.warning("session photo not encoded here (%s)", e)
            return None

    def _photo_slots(self, state: dict[str, Any], vec: np.ndarray, changed: Sequence[str]) -> list[str]:
        """What a photo says of category and gender (its nearest products agreeing, 5 of 10): a
        photo-first session takes them as slots; a standing slot the photo contradicts gives way."""
        try:
            ranked = self.reader.rank_vectors({"image": vec}, 10, None)
            rows = self.reader.state.records.get_by_iids([i for i, _, _ in ranked])
        except Exception as e:  # noqa: BLE001
            log.warning("photo slots skipped: %s", e)
            return []
        votes: dict[str, Counter[str]] = {"category": Counter(), "gender": Counter()}
        for r in rows.values():
            cat = r.doc.get("category")
            if isinstance(cat, list) and cat:
                votes["category"][cat[-1]] += 1
            elif isinstance(cat, str) and cat:
                votes["category"][cat.split(">")[-1].strip()] += 1
            g = (r.doc.get("attributes") or {}).get("gender")
            if isinstance(g, str):
                votes["gender"][g] += 1
        out: list[str] = []
        slots = state.setdefault("slots", {})
        for f, c in votes.items():
            if not c:
                continue
            value, n = c.most_common(1)[0]
            if n < PHOTO_VOTES or f in changed:
                continue
            cur = slots.get(f)
            if cur and value.casefold() in {v.casefold() for v in cur}:
                continue
            if cur and f == "gender" and value.casefold() == "unisex":
                continue
            slots[f] = [value]
            state.setdefault("photo_slots", [])
            if f not in state["photo_slots"]:
                state["photo_slots"].append(f)
            out.append(f)
        return out

    def _shown(self, state: Mapping[str, Any]) -> dict[str, Any]:
        ids = list(state.get("shown") or [])
        return self.reader.state.records.get_many(ids) if ids else {}

    def _shown_prices(self, state: Mapping[str, Any]) -> list[float]:
        return [float(r.doc["price"]) for r in self._shown(state).values() if r.doc.get("price") is not None]

    def _reference(self, turn: Turn, state: dict[str, Any], p: Parsed, vector: np.ndarray | None) -> list[str]:
        shown = list(state.get("shown") or [])
        picked = [shown[i] for i in p.refs if -len(shown) <= i < len(shown)]
        if not picked:
            turn.info.setdefault("notes", []).append("no shown product to refer to")
            return []
        turn.info["reference"] = {"ids": picked, "action": "compare" if p.compare or len(picked) > 1 else "like"}
        if p.compare or len(picked) > 1:
            turn.compare_ids = picked[:5]
            return ["compare"]
        try:
            anchor = self.reader.state.vector_of(picked[0], "image")
        except (VitrineError, KeyError, IndexError) as e:
            turn.info.setdefault("notes", []).append(f"the referenced product has no photo vector ({e})")
            return []
        turn.vector = np.asarray(anchor, dtype=np.float32)
        state["image"] = True
        state["words"] = []
        changed = ["photo"]
        row = self.reader.state.records.get(picked[0])
        cat = row.doc.get("category") if row is not None else None
        leaf = cat[-1] if isinstance(cat, list) and cat else None
        if leaf and "category" not in p.include:
            if [leaf] != state["slots"].get("category"):
                changed.append("category")
            state["slots"]["category"] = [leaf]
        return changed

    # -- after the search --------------------------------------------------------------------------------
    def finish(self, turn: Turn, resp: SearchResponse, compare: Callable[[list[str]], CompareResponse]) -> None:
        """Keep the standing query (and the ids shown) and say it in the response."""
        state = turn.state
        if turn.info.get("new_search") and resp.slots:  # the plain search's slots are the standing ones
            for f, vals in _slot_lists(resp.slots).items():
                if f not in state["slots"] and not state.get("exclude", {}).get(f):
                    state["slots"][f] = vals
        if turn.record:
            state["shown"] = [h.id for h in resp.results[:SHOWN]]
        if turn.compare_ids:
            try:
                resp.compare = compare(turn.compare_ids)
            except VitrineError as e:
                turn.info.setdefault("notes", []).append(f"compare: {e}")
        vec = None if turn.vector is None else np.asarray(turn.vector, dtype=np.float32).tobytes()
        try:
            self.store.put(turn.sid, state, vec)
        except VitrineError as e:  # the search stands; the session is not kept this time
            log.warning("session %s not saved: %s", turn.sid[:16], e)
            turn.info.setdefault("notes", []).append("session not saved")
        eff = turn.req.filters.model_dump(exclude_none=True) if turn.req.filters else {}
        resp.session = {**turn.info, "turn": state["turn"], "text": turn.text, "image": bool(state.get("image")),
                        "filters": eff, "slots": {f: v for f, v in state["slots"].items()},
                        "chips": chips(state)}
