"""The read path: search, recommendations, comparisons and product reads, over one index state.

search: query -> intent + slots (vitrine/search/understanding.py) -> query vectors (guarded:
        vitrine/search/fallback.py) -> hybrid ranking (vitrine/search/fusion.py, guarded) ->
        storefront page, sort and facets (vitrine/search/storefront.py) -> records -> hits.

Every read runs under the state lock's read side (``state.lock``): searches read together, and
never see half a write or half a hot swap. The parts every step shares (state, settings, query
encoder, calibration) are a :class:`~vitrine.search.read_context.ReadContext`; the steps take it, never
this class nor the engine.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from vitrine.encoders.queries import TextQuery
from vitrine.errors import InvalidInput, NotFound
from vitrine.index.vocabulary import QueryTerms
from vitrine.search import fallback, fusion, recommend, spelling, storefront, translation, understanding
from vitrine.search.models import (
    CompareResponse,
    Explanation,
    FacetsResponse,
    Hit,
    ProductOut,
    RecommendResponse,
    SearchRequest,
    SearchResponse,
    decode_b64,
)
from vitrine.search.read_context import ReadContext
from vitrine.search.stages import Stage, StageFactory, Underway
from vitrine.search.state import product_fields, product_out

log = logging.getLogger(__name__)


class ReadPath:
    """Searches and the other reads of ``reader``'s index state. ``understanding``: the intent
    classifier and slots (loaded here when intent is on, never at import)."""

    def __init__(self, reader: ReadContext, stages: Sequence[StageFactory] = ()) -> None:
        self.reader = reader
        self.state = reader.state
        self.settings = reader.settings
        self.understanding = understanding.QueryUnderstanding(reader) if self.settings.intent.intent else None
        self.translation = translation.QueryTranslation(reader)  # Chinese queries -> the catalogue's words
        # the jobs around a search (sessions, learned re-ranking, rules ...), called in this order at
        # each point of a search without being named here (vitrine/search/stages.py)
        self.stages: list[Stage] = [make(reader, self.understanding) for make in stages]

    def close(self) -> None:
        for stage in self.stages:
            stage.close()

    # -- product reads ---------------------------------------------------------------------------
    def get(self, pid: str) -> ProductOut:
        with self.state.lock.read():
            row = self.state.records.get(pid)
        if row is None:
            raise NotFound("product", pid)
        out = product_out(row)
        if row.from_mirror:  # the shared store could not answer: this replica's copy, said so
            out.degraded = ["store"]
        return out

    def vector_of(self, pid: str, field: str = "fused") -> np.ndarray:
        with self.state.lock.read():
            return self.state.vector_of(pid, field)

    def facets(self, fields: Sequence[str] | None = None, limit: int = 50) -> FacetsResponse:
        """Filter values per field, most common first (at most ``limit`` each)."""
        with self.state.lock.read():
            return self.state.facets(fields, limit)

    # -- recommendations and comparisons (vitrine/search/recommend.py) ---------------------------
    def recommend(self, pid: str, kind: str = "similar", k: int = 10) -> RecommendResponse:
        with self.state.lock.read():
            return recommend.recommend(self.reader, pid, kind, k)

    def compare(self, ids: list[str]) -> CompareResponse:
        with self.state.lock.read():
            return recommend.compare(self.reader, ids)

    def compare_text(self, text: str) -> CompareResponse:
        with self.state.lock.read():
            return recommend.compare_text(self.reader, text, self.search)

    # -- search ----------------------------------------------------------------------------------
    def search(self, req: SearchRequest, *, image: bytes | None = None) -> SearchResponse:
        """Search by text, photo (``image`` bytes or ``req.image_b64``) or both, with filters."""
        with self.state.lock.read():
            return self._search(req, image)

    def _search(self, req: SearchRequest, image: bytes | None) -> SearchResponse:
        t0 = time.perf_counter()
        s, rd = self.settings, self.reader
        if req.k > s.search.max_k:
            raise InvalidInput(f"k must be between 1 and {s.search.max_k}")
        depth = storefront.pool_depth(s.search, req)  # the same pool for every page (vitrine/search/storefront.py)
        text = " ".join((req.text or "").split()) or None
        if text and len(text) > s.search.max_text_chars:
            text = text[: s.search.max_text_chars]
        if image is None and req.image_b64:
            image = decode_b64(req.image_b64)
        now = Underway(req, text, image)
        for stage in self.stages:  # before ranking: a session's standing query, ...
            stage.before(now)
        req, text, image = now.req, now.text, now.image
        if not text and image is None and not now.vectors:
            raise InvalidInput("empty query: give text, a photo, or both")
        self.prepare_query_encoder()
        typed, reading = text, self.translation.read(text)  # a Chinese query: the catalogue's words for it
        reading = spelling.read(self.reader, reading)  # misspelt, run-together words: the catalogue's
        text = reading.text
        early = self._encode_early(req, text)  # the text's encode runs while the classifier does
        plan = now.plan = understanding.plan(rd, self.understanding, req, text, reading)  # intent + slots -> filters
        if plan.answer is not None and plan.answer_only:  # a sure after-sales query: an answer, no ranking
            return understanding.answer_response(rd, req, text, image is not None, plan, t0)
        # degrades (gate), never fails; when the catalogue's text mix gives the shared space no weight (the
        # floor's gives none), a text query runs its adapter only if its vector is read after all
        qv, gate = fallback.query_vectors(rd, text, image, early,
                                          lazy_text=fusion.ranks_without_shared_space(
                                              rd, text, image is not None or bool(now.vectors)))
        if now.vectors:  # a stage's query vectors (a session's photo, a referenced product's)
            qv = {**qv, **now.vectors}
        allowed = now.allowed = understanding.allowed_ids(rd, plan)
        window = req.model_copy(update={"k": req.offset + req.k})  # slots fill every page up to this one
        scored, vector_scores, degraded, terms = understanding.fill_to_k(  # slots never leave fewer than k
            rd, window, plan, self._guarded_rank(qv, text, req.k, allowed, depth),
            lambda ids: self._guarded_rank(qv, text, req.k, ids, depth))
        degraded = gate + getattr(qv, "degraded", []) + degraded
        for stage in self.stages:  # after ranking, on the whole pool: learned re-ranking, rules ...
            scored = stage.after(now, scored)  # so every page, sort and facet below agrees with them
        if now.matching is None:  # the floor at the unfiltered query's top: it does not move with a filter
            now.matching = storefront.floor_count(scored, rd.relevance_floor,
                                                  self._floor_top(qv, text, scored, allowed, depth), plan.backfill)
        view = storefront.arrange(rd, req, scored, matching=now.matching,
                                  exhaustive=allowed is not None and len(allowed) <= depth and not plan.backfill)
        rows = self.state.records.get_by_iids([iid for iid, _, _ in view.page])
        if any(r.from_mirror for r in rows.values()) and "store" not in degraded:  # documents from the mirror
            degraded = [*degraded, "store"]
        hits: list[Hit] = []
        applied = plan.filters.model_dump(exclude_none=True) if plan.filters else {}
        marks = storefront.Highlighter(text) if req.highlight else None
        for iid, score, parts in view.page:
            row = rows.get(iid)
            if row is None:  # deleted between ranking and fetching
                continue
            hit = Hit(score=round(float(score), 6), **product_fields(row))  # one validation per hit
            if marks is not None:
                hit.highlights = marks.of(hit.title, hit.description)
            if req.explain:
                hit.explanation = Explanation(
                    vector_score=round(float(vector_scores.get(iid, score)), 6),
                    signals={k: round(float(v), 6) for k, v in parts.items()},
                    modalities=sorted(qv), **plan.explanation(iid, applied),
                    translated=reading.translation.explain() if reading.translation else [],
                )
            for stage in self.stages:
                stage.mark(now, hit, iid)
            hits.append(hit)
        resp = SearchResponse(
            results=hits, took_ms=round((time.perf_counter() - t0) * 1000, 3), k=req.k,
            query={"text": typed, "image": image is not None, "filters": applied, **translation.query_fields(reading),
                   **({"graph_terms": terms.phrases} if terms else {}), **plan.query_info()},
            model=self.state.model_key, degraded=degraded + plan.degraded, **view.response_fields(req),
            **now.response,
        )
        resp = understanding.finish(rd, req, text, plan, resp, recommend=self.recommend,
                                    compare_text=self.compare_text)
        for stage in self.stages:  # keep a session's standing query, ...
            stage.finish(now, resp)
        return resp

    def warm_up(self) -> float:
        """Build what the first queries would otherwise build inside their time budgets (the
        read indexes of :meth:`prepare`, the query fast path, the slot vocabulary, the graph's
        caches): a first search took 0.8 s on the full catalogue, and could degrade. Runs a few
        real searches; returns the seconds it took."""
        t0 = time.perf_counter()
        try:  # text queries at the floor skip BM25; queries with a photo still use it
            self.prepare()
        except Exception as e:  # noqa: BLE001 - warming is best effort: real requests report errors
            log.warning("warm-up of the read indexes failed: %s", e)
        self.prepare_query_encoder()
        # the Chinese dictionary, segmenter and catalogue vocabulary (~2 s), before a first Chinese query
        # (read() never raises: a failure searches the query as typed)
        self.translation.read("男士手表")
        for text in ("red shoes", "nike vs puma running shoes", "women blue shirt under 1500"):
            try:
                self.search(SearchRequest(text=text, k=5))
            except Exception as e:  # noqa: BLE001 - warming is best effort: real requests report errors
                log.warning("warm-up search %r failed: %s", text, e)
        took = time.perf_counter() - t0
        log.info("warmed up in %.2fs", took)
        return took

    def prepare(self) -> float:
        """Build the read-side indexes a first search would otherwise build (the suggestion index,
        the in-memory BM25 postings), so that the snapshot written next keeps them and the first
        ``vitrine serve`` loads them instead of building them (about two minutes at 1M products).
        A batch ingest calls it before its snapshot, :meth:`warm_up` before a server's first
        query. Returns the seconds it took."""
        t0 = time.perf_counter()
        self.reader.suggestions.warm()
        self.state.records.bm25_scores("warm up")
        return time.perf_counter() - t0

    def prepare_query_encoder(self) -> None:
        """Build the query fast path (an ONNX export, or loading one and checking it against torch)
        before the query's time budget starts: one-time set-up is not the query's latency, and a
        first query must not degrade for it. A failure here is left to the guarded step, which
        degrades."""
        try:
            self.reader.query_encoder  # noqa: B018 - the property builds it once and keeps it
        except Exception as e:  # noqa: BLE001
            log.warning("query fast path not built: %s", e)

    def _encode_early(self, req: SearchRequest, text: str | None) -> TextQuery | None:
        """Start the query text's encode before intent classification when both will run (an
        after-sales query then wastes one encode; every other query waits for the slower of the
        two instead of their sum). None: encode later, in the guarded query-vector step."""
        if not text or self.understanding is None or not req.use_intent:
            return None
        try:
            return self.reader.query_encoder.text_query(text)
        except Exception as e:  # noqa: BLE001 - the guarded step retries and degrades if need be
            log.warning("early query encode not started: %s", e)
            return None

    def _floor_top(self, qv: Mapping[str, np.ndarray], text: str | None, scored: Any, allowed: np.ndarray | None,
                   depth: int) -> float:
        """The relevance floor's reference: the best score of this query over the whole catalogue (its
        own top when nothing filters it)."""
        own = float(scored[0][1]) if scored else 0.0
        if allowed is None:
            return own
        try:
            best, _, _, _ = self._guarded_rank(qv, text, 1, None, min(depth, 50))
        except Exception as e:  # noqa: BLE001 - the query's own top then (the floor as before)
            log.warning("unfiltered top for the floor not found: %s", e)
            return own
        return max(own, float(best[0][1])) if best else own

    def _guarded_rank(self, qv: Mapping[str, np.ndarray], text: str | None, k: int,
                      allowed: np.ndarray | None, depth: int) -> tuple[Any, dict[int, float], list[str], Any]:
        """Hybrid ranking of a pool of ``depth`` candidates per retriever under a time budget (the
        whole pool, best first); when fusion raises or overstays, the plain vector ranking
        (``degraded: fusion``). Without query vectors (the gate failed), words alone."""
        rd, s = self.reader, self.settings.search
        if not qv:
            return fallback.lexical_rank(rd, qv, text, depth, allowed)
        if not text or s.fusion == "off" or not s.fusion_signals:
            return fusion.rank(rd, qv, text, k, allowed, depth=depth)
        try:
            return fusion.rank(rd, qv, text, k, allowed, depth=depth,
                               deadline=time.perf_counter() + s.fusion_timeout_ms / 1000)
        except Exception as e:  # noqa: BLE001 - a failing fusion degrades to the vector ranking
            log.warning("hybrid fusion skipped for this search: %s", e)
            if set(qv) == {"text"} and s.calibration != "off":
                try:  # a text query falls back to the floor, not below it
                    nq = rd.native_query_vector(text)
                    if nq is not None:
                        scored, vs, _, terms = fusion.native_rank(rd, nq, depth, allowed)
                        return scored, vs, ["fusion"], terms
                except Exception as e2:  # noqa: BLE001
                    log.warning("native fallback failed too: %s", e2)
            scored = rd.rank_vectors(dict(qv), depth, allowed)
            return scored, {i: sc for i, sc, _ in scored}, ["fusion"], QueryTerms()
