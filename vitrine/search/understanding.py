"""Query understanding on the read path: intent + slots -> filters and actions.

``plan()`` runs the intent classifier (under a time budget, in a worker thread) and the slot
extractor over the catalogue's vocabulary (the knowledge graph's brands, the filter facets'
categories, colours and genders), and turns the slots into filters. ``finish()`` adds what the
intent asks for: the comparison (compare), recommendations (recommend). After-sales queries get an
answer instead of products (``answer_response``) when the classifier is sure (at or above
``intent_answer_only_confidence``); under that bar the answer comes beside the products, so a
product phrase misread as after-sales still shows products. A slot filter never leaves fewer
than k results: the search without the slots fills the rest (``fill_to_k``), each such hit
marked ``backfill``. A classifier that is missing, fails or runs out
of time leaves a plain vector search marked ``degraded: ["intent"]``; a prediction under the
confidence floor is treated as a plain search.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vitrine.encoders.batching import MicroBatcher
from vitrine.errors import VitrineError
from vitrine.search.models import (
    AfterSalesAnswer,
    CompareResponse,
    Filters,
    IntentOut,
    RecommendResponse,
    SearchRequest,
    SearchResponse,
)
from vitrine.search.read_context import ReadContext

if TYPE_CHECKING:
    from vitrine.intent.classifier import IntentClassifier, IntentResult
    from vitrine.intent.slots import SlotExtractor, Vocabulary
    from vitrine.search.reading import Reading

log = logging.getLogger(__name__)

SLOT_FIELDS = ("brand", "category", "colour", "gender")  # as vitrine.intent.slots.SLOT_FIELDS (no import at load)
_COMPLEMENT_CUES = re.compile(
    r"go(?:es)? with|goes well|pairs? (?:well )?with|pair .* with|to match|matches|match with|wear .* with|"
    r"wear with|complete the look|outfit|style|complement|搭配|配什么|搭什么|适合配|搭的|配一", re.IGNORECASE)
_local = threading.local()
_batchers: dict[int, MicroBatcher[str, "IntentResult"]] = {}  # by classifier (loaded once, cached)
_executor_lock = threading.Lock()


def _reinit_lock_after_fork() -> None:
    global _executor_lock
    _executor_lock = threading.Lock()  # another thread may have held it at fork time


os.register_at_fork(after_in_child=_reinit_lock_after_fork)


@contextmanager
def nested() -> Iterator[None]:
    """Searches made while acting on an intent (compare resolves each side by search) skip intent."""
    prev = getattr(_local, "nested", False)
    _local.nested = True
    try:
        yield
    finally:
        _local.nested = prev


def _batcher(classifier: "IntentClassifier", threads: int, max_batch: int) -> MicroBatcher[str, "IntentResult"]:
    """The classifier's micro-batcher: queries arriving together are classified in one forward
    (under load, one padded batch instead of one forward per request), in a worker thread with
    its own torch thread count (OpenMP's is per thread)."""
    with _executor_lock:
        b = _batchers.get(id(classifier))
        if b is None:
            def init() -> None:
                import torch

                torch.set_num_threads(threads)

            def run(texts: list[str]) -> list["IntentResult"]:
                return [classifier.predict(texts[0])] if len(texts) == 1 else classifier.predict_batch(list(texts))

            b = _batchers[id(classifier)] = MicroBatcher(run, max_batch=max_batch, max_wait_s=0.0,
                                                         name="vitrine-intent", on_start=init)
        return b


@lru_cache(maxsize=4)
def _load_classifier(model: str, cache_dir: str, min_confidence: float, runtime: str = "torch",
                     threads: int = 1, members: int = 0) -> "IntentClassifier":
    from vitrine.intent.classifier import IntentClassifier  # optional extra

    return IntentClassifier.load(model, cache_dir=Path(cache_dir), min_confidence=min_confidence, runtime=runtime,
                                 threads=threads, members=members)


class QueryUnderstanding:
    """The read path's intent component: the classifier and a slot extractor over the catalogue
    of ``reader``'s index state."""

    def __init__(self, reader: ReadContext) -> None:
        self.reader = reader
        self.settings = reader.settings
        self._classifier: IntentClassifier | None = None
        self._error: str | None = None
        self._loaded = False
        self._load_lock = threading.Lock()
        self._extractor: SlotExtractor | None = None
        self._vocab_key: tuple[int, int] | None = None
        self._vocab_at = 0.0
        self._lock = threading.Lock()

    # -- the classifier, loaded on first use ----------------------------------------------------------
    def _load(self) -> None:
        """Loads the classifier once, when a search (or ``vitrine serve``'s warm-up) first needs it:
        a process that only writes (``vitrine ingest`` with tuning off) never pays its ~4 s."""
        with self._load_lock:
            if self._loaded:
                return
            s = self.settings
            try:
                self._classifier = _load_classifier(s.intent.intent_model, str(s.storage.cache_dir / "intent"),
                                                    s.intent.intent_min_confidence, s.encoders.query_runtime,
                                                    s.intent.intent_threads, s.intent.intent_members)
            except (VitrineError, ImportError, OSError, RuntimeError, ValueError) as e:
                self._error = str(e)
                log.error("intent classifier unavailable (%s); searches run without intent", e)
            self._loaded = True

    @property
    def classifier(self) -> IntentClassifier | None:
        """The intent classifier, None when it could not be loaded (:attr:`error` says why)."""
        if not self._loaded:
            self._load()
        return self._classifier

    @property
    def error(self) -> str | None:
        """Why the classifier could not be loaded (None: it serves)."""
        if not self._loaded:
            self._load()
        return self._error

    # -- vocabulary ---------------------------------------------------------------------------------------
    def vocabulary(self) -> "Vocabulary":
        from vitrine.intent.slots import Vocabulary

        state = self.reader.state
        f = state.filters
        # the catalogue's own facets: every filter field the slot extractor reads, with the values
        # this catalogue holds (a field the catalogue leaves empty names no slot)
        facets = {fld: set(f.facet(fld)) if fld in f.fields else set() for fld in SLOT_FIELDS}
        brands = facets["brand"]
        graph = state.graph
        lex = getattr(getattr(getattr(graph, "data", None), "brands", None), "by_key", None)
        if lex:
            for name in set(lex.values()):
                try:
                    if graph.products_with("brand", [name]):
                        brands.add(name)
                except Exception:  # noqa: BLE001 - the graph is optional here
                    break
        return Vocabulary.of(brands, facets["category"], facets["colour"], facets["gender"])

    def build_extractor(self) -> "SlotExtractor":
        """A slot extractor over the catalogue's vocabulary, reading its values' Chinese forms too
        (vitrine/intent/lexicon_zh.py: the lexicon's, those the catalogue writes beside them,
        "Nike/耐克", and the dictionary's)."""
        from vitrine.intent import lexicon_zh
        from vitrine.intent.slots import SlotExtractor

        vocab = self.vocabulary()
        return SlotExtractor(vocab, lexicon_data=lexicon_zh.merged_lexicon(vocab, self.reader.suggestions.texts()))

    def extractor(self) -> "SlotExtractor":

        now = time.monotonic()
        current = self._extractor
        refresh_s = self.settings.intent.intent_vocab_refresh_s
        if current is not None and now - self._vocab_at < refresh_s:
            return current  # fresh enough
        # the store's change number as of at most a second ago: no SQLite query per search
        key = (self.reader.state.records.recent_seq(min(1.0, refresh_s)), len(self.reader.state))
        with self._lock:
            extractor = self._extractor
            if extractor is None or (key != self._vocab_key and
                                     now - self._vocab_at >= self.settings.intent.intent_vocab_refresh_s):
                extractor = self._extractor = self.build_extractor()
                self._vocab_key, self._vocab_at = key, now
            return extractor

    # -- classification ----------------------------------------------------------------------------------
    def classify(self, text: str) -> "IntentResult":
        if self.classifier is None:
            raise RuntimeError(self.error or "no intent classifier")
        # the catalogue's words: a product word is never read as a typo of a cue word ("lever" ~ "leave")
        known = self.reader.suggestions.words()
        if not self.settings.intent.intent_classify_every_query:
            decided = self.classifier.decided_by_prior(text, known=known)
            if decided is not None:  # no cue word: a search whatever the ensemble says, so it does not run
                return decided
        fut = _batcher(self.classifier, self.settings.intent.intent_threads,
                       self.settings.encoders.query_batch_max).submit(text)
        try:
            return self.classifier.with_catalogue(text, fut.result(timeout=self.settings.intent.intent_timeout_ms / 1000),
                                                  known)
        except FutureTimeout as e:
            fut.cancel()
            raise TimeoutError(f"intent classifier took over {self.settings.intent.intent_timeout_ms:g} ms") from e


@dataclass
class Plan:
    """What the query understanding decided for one search."""

    intent: IntentOut | None = None
    slots: dict[str, Any] = field(default_factory=dict)
    applied: dict[str, Any] = field(default_factory=dict)
    filters: Filters | None = None
    brand_ids: np.ndarray | None = None
    degraded: list[str] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)
    answer: AfterSalesAnswer | None = None
    answer_only: bool = False  # the answer replaces the products (a confident after-sales query)
    backfill: set[int] = field(default_factory=set)  # hits added from the relaxed search (below k)
    relaxed_filters: dict[str, Any] = field(default_factory=dict)  # the filters those hits met
    ms: float = 0.0

    @property
    def label(self) -> str | None:
        return self.intent.label if self.intent else None

    def explanation(self, iid: int | None = None, filters: dict[str, Any] | None = None) -> dict[str, Any]:
        """A hit's explanation fields: the intent, the slots used as its filters, and the filters
        it met (``filters``); a backfilled hit met only the relaxed filters and no slot."""
        out: dict[str, Any] = {"intent": self.intent.model_dump() if self.intent else None,
                               "slots": dict(self.applied)}
        if filters is not None:
            out["filters"] = filters
        if iid is not None and iid in self.backfill:
            out.update(slots={}, backfill=True, filters=dict(self.relaxed_filters))
        return out

    def query_info(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.intent is not None:
            out["intent_ms"] = round(self.ms, 3)
        if self.applied:
            out["slot_filters"] = dict(self.applied)
        out.update(self.notes)
        return out


def plan(reader: ReadContext, qu: QueryUnderstanding | None, req: SearchRequest, text: str | None,
         reading: Reading | None = None) -> Plan:
    """Classify ``text`` (by ``qu``: None when intent is off) and turn its slots into filters;
    never raises (a failure degrades). ``reading``: a query read from another language (its slots
    come from the words as typed, and filter unless the tuning measured that language)."""
    p = Plan(filters=req.filters)
    if not text or not req.use_intent or getattr(_local, "nested", False) or not reader.settings.intent.intent:
        return p
    if qu is None or qu.classifier is None:
        p.degraded.append("intent")
        return p
    t0 = time.perf_counter()
    try:
        res = qu.classify(text)
        slots = qu.extractor().extract((reading.typed if reading is not None and reading.translation else None) or text)
    except Exception as e:  # noqa: BLE001 - any failure of the component degrades, never fails the search
        log.warning("intent skipped for this search: %s", e)
        p.degraded.append("intent")
        return p
    p.ms = (time.perf_counter() - t0) * 1000
    p.intent = IntentOut(label=res.label, scores=res.scores, predicted=res.predicted, confident=res.confident,
                         by=res.extra.get("by", "classifier"))
    p.slots = slots.values()
    if res.truncated:
        p.notes["intent_truncated"] = True
    if res.label == "after_sales":
        from vitrine.intent.aftersales import answer

        a = answer(text)
        p.answer = AfterSalesAnswer(**a.as_dict())
        # Only a sure after-sales query loses its products: under the answer-only bar the answer
        # comes with the ranking (a product phrase misread as after-sales still shows products).
        p.answer_only = res.scores.get("after_sales", 0.0) >= reader.settings.intent.intent_answer_only_confidence
        if p.answer_only:
            return p
        p.notes["answer_with_products"] = True
    if reader.slot_filters_on(reading.searched_language if reading is not None else "en") and p.slots:
        _slot_filters(reader, req, p)
    return p


def _slot_filters(reader: ReadContext, req: SearchRequest, p: Plan) -> None:
    explicit = req.filters.model_dump(exclude_none=True) if req.filters else {}
    merged = dict(explicit)
    for f in reader.state.filters.fields:  # the catalogue's facet fields (brand below: it may come from the graph)
        if f != "brand" and f in p.slots and f not in explicit:
            merged[f] = p.slots[f]
            p.applied[f] = p.slots[f]
    if "price_min" in p.slots or "price_max" in p.slots:
        if reader.state.filters.has_prices():
            for f in ("price_min", "price_max"):
                if f in p.slots and f not in explicit:
                    merged[f] = p.slots[f]
                    p.applied[f] = p.slots[f]
        else:
            p.notes["price_slots_ignored"] = "the catalogue has no prices"
    brand = p.slots.get("brand")
    if brand and "brand" not in explicit:
        names = [brand] if isinstance(brand, str) else list(brand)
        have = {v.casefold() for v in reader.state.filters.facet("brand")}
        if any(n.casefold() in have for n in names):
            merged["brand"] = names[0] if len(names) == 1 else names
            p.applied["brand"] = brand
        else:  # brands the graph learned from titles
            ids = reader.state.graph.products_with("brand", names)
            if ids:
                p.brand_ids = np.fromiter(sorted(ids), dtype=np.int64, count=len(ids))
                p.applied["brand"] = brand
    try:
        p.filters = Filters.model_validate(merged) if merged else None
    except ValueError:  # e.g. a slot price range against an explicit one: keep the explicit filters
        p.filters, p.applied, p.brand_ids = req.filters, {}, None


def allowed_ids(reader: ReadContext, p: Plan) -> np.ndarray | None:
    allowed = reader.allowed_ids(p.filters)
    if p.brand_ids is None:
        return allowed
    if allowed is None:
        return p.brand_ids
    return np.intersect1d(allowed, p.brand_ids, assume_unique=True)


def relax(reader: ReadContext, req: SearchRequest, p: Plan) -> np.ndarray | None:
    """Nothing matched every slot: drop the slot filters (keep the request's own)."""
    p.notes["slots_relaxed"] = dict(p.applied)
    p.applied, p.brand_ids, p.filters = {}, None, req.filters
    return reader.allowed_ids(req.filters)


Ranked = tuple[Any, dict[int, float], list[str], Any]  # (scored, vector scores, degraded, graph terms)


def fill_to_k(reader: ReadContext, req: SearchRequest, p: Plan, ranked: Ranked,
              rank: Callable[[np.ndarray | None], Ranked]) -> Ranked:
    """A slot filter never shrinks the results below k: under k filtered hits, the relaxed search
    (the request's own filters, no slot) fills the rest, after the filtered hits, each marked
    ``backfill`` in its explanation. No filtered hit at all: the search runs without the slots
    (``slots_relaxed``). ``rank`` ranks within allowed ids."""
    scored, vector_scores, degraded, terms = ranked
    if not p.applied or len(scored) >= req.k:
        return ranked
    if not scored:
        return rank(relax(reader, req, p))
    relaxed, r_vec, r_degraded, _ = rank(reader.allowed_ids(req.filters))
    have = {iid for iid, _, _ in scored}
    extra = [h for h in relaxed if h[0] not in have][: req.k - len(scored)]
    if not extra:
        return ranked
    p.backfill = {iid for iid, _, _ in extra}
    p.relaxed_filters = req.filters.model_dump(exclude_none=True) if req.filters else {}
    p.notes["slots_backfill"] = len(extra)
    merged_vec = dict(vector_scores)
    merged_vec.update({iid: r_vec[iid] for iid, _, _ in extra if iid in r_vec})
    return list(scored) + extra, merged_vec, list(dict.fromkeys(degraded + r_degraded)), terms


def answer_response(reader: ReadContext, req: SearchRequest, text: str | None, image: bool, p: Plan,
                    t0: float) -> SearchResponse:
    """After-sales: no product ranking, a structured answer."""
    return SearchResponse(
        results=[], took_ms=round((time.perf_counter() - t0) * 1000, 3), k=req.k,
        query={"text": text, "image": image, "filters": req.filters.model_dump(exclude_none=True) if req.filters
               else {}, **p.query_info()},
        model=reader.state.model_key, degraded=list(p.degraded), intent=p.intent, slots=p.slots, answer=p.answer,
    )


Recommend = Callable[[str, str, int], RecommendResponse]  # (product id, kind, k)
CompareText = Callable[[str], CompareResponse]  # "A vs B"


def finish(reader: ReadContext, req: SearchRequest, text: str | None, p: Plan, resp: SearchResponse, *,
           recommend: Recommend, compare_text: CompareText) -> SearchResponse:
    """Attach intent, slots and what the intent asks for (a comparison by ``compare_text``,
    recommendations by ``recommend``)."""
    resp.intent, resp.slots = p.intent, p.slots
    if p.answer is not None:  # an after-sales answer under the answer-only bar: beside the products
        resp.answer = p.answer
    if p.intent is None or not text:
        return resp
    with nested():
        if p.label == "compare":
            resp.compare = _compare(compare_text, text, p)
        elif p.label == "recommend" and resp.results:
            kind = "complementary" if _COMPLEMENT_CUES.search(text) else "similar"
            try:
                resp.recommendations = recommend(resp.results[0].id, kind, min(req.k, reader.settings.search.max_k))
                resp.query["recommend_kind"] = kind
            except (VitrineError, AttributeError) as e:
                resp.query["intent_action"] = f"recommend unavailable: {e}"
    return resp


def _compare(compare_text: CompareText, text: str, p: Plan) -> Any:
    try:
        return compare_text(text)
    except VitrineError as first:
        # "which is better, nike or puma running shoes": build the sides from the slots
        sides = _sides_from_slots(p.slots)
        if len(sides) >= 2:
            try:
                return compare_text(" vs ".join(sides))
            except VitrineError as e:
                log.info("compare intent: %s", e)
        log.info("compare intent could not resolve two products: %s", first)
        return None


def _sides_from_slots(slots: dict[str, Any]) -> list[str]:
    def vals(f: str) -> list[str]:
        v = slots.get(f)
        return [] if v is None else [v] if isinstance(v, str) else list(v)

    brands, cats = vals("brand"), vals("category")
    if len(brands) >= 2:
        rest = " ".join(cats[:1] + vals("gender")[:1])
        return [f"{b} {rest}".strip() for b in brands[:5]]
    if len(cats) >= 2:
        rest = " ".join(brands[:1] + vals("gender")[:1])
        return [f"{rest} {c}".strip() for c in cats[:5]]
    return []
