"""Shopping sessions: a follow-up query refines the session's standing query (docs/sessions.md).

A search with a ``session`` id reads the session's standing query (its words, photo vector,
slots, filters and exclusions, and the ids it last showed) from the session store
(vitrine/conversation/store.py), then reads the follow-up:

1. :func:`~vitrine.conversation.followups.parse` finds what the follow-up names, over the catalogue's own vocabulary (the slot
   extractor of vitrine/intent/slots.py: brands, categories, colours, genders, prices, English and
   Chinese): values to keep (``in brown``, ``要棕色的``), values to leave out (``not nike``,
   ``不要耐克``: the segment after a negation cue), a price relative to what was shown (``cheaper``,
   ``便宜一点的``), references to shown products (``the second one``, ``第二个``, ``compare the first
   two``) and the words left (``leather ones``).
2. :class:`~vitrine.conversation.followups.Decider` (a logistic regression over features of the follow-up and the standing query,
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
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from vitrine.errors import StorageError, VitrineError
from vitrine.conversation.store import open_session_store
from vitrine.conversation.types import SessionStoreAPI
from vitrine.search.models import (
    CompareResponse,
    Filters,
    SearchRequest,
    SearchResponse,
)
from vitrine.conversation.followups import (
    DECIDER_PATH,
    FIELDS,
    Parsed,
    decider,
    features,
    names_new_thing,
    parse,
    slot_lists,
)
from vitrine.search.read_context import ReadContext

if TYPE_CHECKING:
    from vitrine.intent.slots import SlotExtractor
    from vitrine.search.understanding import QueryUnderstanding

log = logging.getLogger(__name__)

STATE_VERSION = 1
SHOWN = 10  # ids of the page the shopper saw kept for references ("the second one")
# A turn that lost the race to a concurrent turn of its session is applied again on what the winner
# wrote until it is saved, for at least CAS_MIN_TRIES tries and then while CAS_BUDGET_S lasts (a
# loaded machine slows every try; a fixed small count could run out while the winners kept writing)
CAS_MIN_TRIES = 5
CAS_BUDGET_S = 10.0
PHOTO_VOTES = 5  # of a photo's 10 nearest products, how many must agree for a category or gender to be its own


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
    version: int = 0  # the stored session's version this turn read (its write names it)
    asked: tuple[SearchRequest, str | None, bytes | None] | None = None  # the request as the shopper sent it


class Sessions:
    """The read path's sessions over ``reader``'s catalogue, the session store opened on first use."""

    def __init__(self, reader: ReadContext, understanding: QueryUnderstanding | None) -> None:
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
        try:
            stored = self.store.get(sid)
        except StorageError as e:  # the shared store is down: this turn is read as a new search
            log.warning("session %s unreadable: %s", sid[:16], e)
            stored = None
        ex = self.extractor()
        p = parse(ex, text)
        standing = stored.state if stored is not None and not stored.expired and stored.state else None
        info: dict[str, Any] = {"id": sid}
        client = req.filters.model_dump(exclude_none=True) if req.filters else {}
        vector: np.ndarray | None = None
        if standing is not None and stored is not None and stored.vector is not None:
            vector = np.frombuffer(stored.vector, dtype=np.float32).copy()
        photo_vec = self._photo_vector(image) if image is not None else None
        turn = Turn(sid, {}, req, text, image, info=info, version=stored.version if stored is not None else 0,
                    asked=(req, text, image))
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
            photo_vec = None  # the standing photo vector serves
        else:
            feats = features(p, standing, photo=photo_vec is not None)
            try:
                pr = decider(str(DECIDER_PATH)).p_refine(feats)
            except VitrineError as e:
                log.warning("%s: follow-ups read as refinements", e)
                pr = 0.5 + 0.5 * float(not feats["category_differs"])
            info.update(p_refine=round(pr, 4), p_new_search=round(1 - pr, 4))
            refining = pr >= 0.5 if req.new_search is None else not req.new_search
            info.update(new_search=not refining, decided_by="classifier" if req.new_search is None else "client")
            if p.reset and refining and req.new_search is None:  # "重新开始", "start over": the decider never saw one
                refining = False
                info.update(new_search=True, decided_by="reset")
            if req.new_search is None and refining and photo_vec is None and names_new_thing(p, standing):
                refining = False  # "first aid kit", "不粘锅": a thing of its own the vocabulary lacks
                info.update(new_search=True, decided_by="modifier")
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
    @staticmethod
    def _keep(turn: Turn, resp: SearchResponse) -> None:
        """What the response adds to the turn's state: a new search's slots, and the page the
        shopper saw (whatever its offset: "the second one" on page 2 is page 2's second)."""
        state = turn.state
        if turn.info.get("new_search") and resp.slots:  # the plain search's slots are the standing ones
            for f, vals in slot_lists(resp.slots).items():
                if f not in state["slots"] and not state.get("exclude", {}).get(f):
                    state["slots"][f] = vals
        state["shown"] = [h.id for h in resp.results[:SHOWN]]
        state["shown_offset"] = turn.req.offset

    def _save(self, turn: Turn, resp: SearchResponse) -> None:
        """Write the turn's state if the session is still at the version the turn read; else another
        turn of the session wrote in between: this turn is applied again on what that one wrote
        (compare-and-swap), so neither update is lost. The turn is applied again as the response
        reads it (a refinement stays one, a new search stays one: the decision is not taken again
        on a standing query the shopper never saw), until saved (:data:`CAS_BUDGET_S`)."""
        deadline = time.monotonic() + CAS_BUDGET_S
        tries = 0
        while True:
            tries += 1
            vec = None if turn.vector is None else np.asarray(turn.vector, dtype=np.float32).tobytes()
            if self.store.put(turn.sid, turn.state, vec, expected=turn.version):
                return
            if turn.asked is None or (tries >= CAS_MIN_TRIES and time.monotonic() > deadline):
                raise StorageError(f"session {turn.sid[:16]}: {tries} tries in a row lost to concurrent "
                                   "turns of the session")
            req, text, image = turn.asked
            again = self.begin(req.model_copy(update={"new_search": bool(turn.info.get("new_search"))}), text, image)
            self._keep(again, resp)
            turn.state, turn.vector, turn.version = again.state, again.vector, again.version
            turn.info["merged"] = True  # a concurrent turn of this session wrote first: this one applied on it

    def finish(self, turn: Turn, resp: SearchResponse, compare: Callable[[list[str]], CompareResponse]) -> None:
        """Keep the standing query (and the ids shown) and say it in the response."""
        self._keep(turn, resp)
        if turn.compare_ids:
            try:
                resp.compare = compare(turn.compare_ids)
            except VitrineError as e:
                turn.info.setdefault("notes", []).append(f"compare: {e}")
        try:
            self._save(turn, resp)
            turn.info["saved"] = True
        except VitrineError as e:  # the search stands; the session is not kept this time, and it says so
            log.warning("session %s not saved: %s", turn.sid[:16], e)
            turn.info["saved"] = False
            turn.info.setdefault("notes", []).append(f"session not saved: {e}")
        state = turn.state
        eff = turn.req.filters.model_dump(exclude_none=True) if turn.req.filters else {}
        resp.session = {**turn.info, "turn": state["turn"], "text": turn.text, "image": bool(state.get("image")),
                        "filters": eff, "slots": {f: v for f, v in state["slots"].items()},
                        "chips": chips(state)}
