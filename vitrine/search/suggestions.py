"""Search-as-you-type suggestions over the index state: :class:`Suggestions`.

Two prefix indexes (vitrine/index/suggest.py) answer together:

- the catalogue's: titles, categories, brands (the ``brand`` field, else the graph's brand
  lexicon reading the title), facet values, brand/colour + category pairs. It follows the
  record store's change sequence as the other derived indexes do (``records.recent_seq``): a
  lookup that sees a newer sequence rebuilds it, in line when the last build was quick (a small
  catalogue: tests, a shop of a few hundred products), else in a background thread while the
  old index keeps answering (the full 20,873-product catalogue builds in about 0.6 s);
- the logged queries': ``popular`` (a callable giving (query, weight) pairs, e.g. clicks per
  query, from the event log) read again every ``refresh_s`` seconds in the background; a query
  with no positive weight (nothing clicked: it found nothing) is never suggested. None: no
  logged queries.

Results are cached per (prefix, k) until either index changes. The catalogue's words
(:meth:`Suggestions.words`) also tell the intent rule which query words are product words
(vitrine/intent/cues.py: a catalogue word is never read as a typo of a cue word).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from vitrine.errors import InvalidInput, StorageError
from vitrine.index import suggest
from vitrine.intent import lexicon_zh
from vitrine.lang.segment import has_cjk
from vitrine.lru import LRU
from vitrine.search.state import IndexState

log = logging.getLogger(__name__)

PopularQueries = Callable[[], Sequence[tuple[str, float]]]
MAX_K = 50
MAX_PREFIX_CHARS = 200
INLINE_BUILD_S = 0.02  # a catalogue that built faster than this is rebuilt inside the lookup
INLINE_FIRST_BUILD = 2000  # products: a first build inside a search (the intent rule's words) up to this
# A rebuild reads every product (2 minutes at 1M products): after a write, the catalogue's index is
# rebuilt at most once per REBUILD_SPACING builds' time, so a stream of writes costs each worker at
# most ~1/REBUILD_SPACING of a core for suggestions, however large the catalogue.
REBUILD_SPACING = 10
SNAPSHOT_FILE = "suggestions.varr"  # the catalogue's index, kept with each snapshot version
SuggestKind = Literal["query", "title", "category", "brand", "facet"]


class SuggestionOut(BaseModel):
    text: str = Field(description="The phrase to complete the search box with")
    kind: SuggestKind = Field(description="query (a logged query that got clicks), title, category, brand or facet")
    score: float = Field(description="2+: the phrase starts with the prefix; 1+: every word of the prefix "
                                     "starts a word of it; under 1: found through a typo")


class SuggestResponse(BaseModel):
    q: str
    suggestions: list[SuggestionOut]
    took_ms: float


ZH_FORMS_PER_VALUE = 2  # Chinese phrases suggested per English category, brand or facet value


def chinese_phrases(phrases: Sequence[suggest.Phrase]) -> list[suggest.Phrase]:
    """Chinese forms of a catalogue's categories, brands and facet values (colours) as phrases of
    the same kind and count (vitrine/intent/lexicon_zh.py): a shopper typing Chinese or pinyin on
    an English catalogue is offered 沙发 for its Sofas; a Chinese catalogue's values are its own."""
    fields = {"category": "category", "brand": "brand", "facet": "colour"}
    values: dict[str, list[str]] = {f: [] for f in fields.values()}
    counts: dict[tuple[str, str], suggest.Phrase] = {}
    for p in phrases:
        fld = fields.get(p.kind)
        if fld and not has_cjk(p.text) and (fld != "colour" or " " not in p.text):
            values[fld].append(p.text)
            counts[(fld, p.text)] = p
    out: list[suggest.Phrase] = []
    for fld, per in lexicon_zh.chinese_forms(values, (p.text for p in phrases if p.kind in ("title", "brand"))).items():
        for value, forms in per.items():
            src = counts.get((fld, value))
            if src is not None:
                out += [suggest.Phrase(zh, src.kind, src.count) for zh in forms[:ZH_FORMS_PER_VALUE]]
    return out


class Suggestions:
    """The catalogue's and the logged queries' suggestion indexes over ``state``."""

    def __init__(self, state: IndexState, popular: PopularQueries | None = None, *, refresh_s: float = 60.0,
                 cache_size: int = 4096) -> None:
        self.state = state
        self.popular = popular
        self.refresh_s = refresh_s
        self._catalogue: suggest.SuggestIndex | None = None
        self._catalogue_seq = -1
        self._build_s = 0.0
        self._built_at = -float("inf")  # time.monotonic() when the catalogue's index was last built
        self._queries = suggest.SuggestIndex(())
        self._queries_at = -float("inf")
        self._lock = threading.Lock()  # one catalogue build at a time
        self._building = False
        self._build_thread: threading.Thread | None = None
        self._refreshing = False
        self._cache: LRU[list[suggest.Match]] = LRU(cache_size)
        state.parts.add(SNAPSHOT_FILE, lambda: self._catalogue, self._save_part)

    # -- the popular-queries provider --------------------------------------------------------------
    def set_popular(self, popular: PopularQueries | None, refresh_s: float | None = None) -> None:
        """Suggest the logged queries ``popular`` gives (read now, then every ``refresh_s``)."""
        self.popular = popular
        if refresh_s is not None:
            self.refresh_s = refresh_s
        self.refresh_queries()

    def refresh_queries(self) -> int:
        """Read the popular queries again now; returns how many are suggested."""
        popular = self.popular
        self._queries_at = time.monotonic()
        if popular is None:
            index = suggest.SuggestIndex(())
        else:
            try:
                index = suggest.SuggestIndex(suggest.query_phrases(popular()))
            except Exception as e:  # noqa: BLE001 - the event log failing must not fail suggestions
                log.warning("popular queries unavailable for suggestions: %s", e)
                return len(self._queries)
        self._queries = index
        self._cache.clear()
        return len(index)

    def _queries_due(self) -> None:
        if self.popular is None or self._refreshing or time.monotonic() - self._queries_at < self.refresh_s:
            return
        self._refreshing = True

        def run() -> None:
            try:
                self.refresh_queries()
            finally:
                self._refreshing = False

        threading.Thread(target=run, name="vitrine-suggest-queries", daemon=True).start()

    # -- the catalogue's index -----------------------------------------------------------------------
    def _docs(self) -> Iterator[dict[str, Any]]:
        for row in self.state.records.iter_rows(with_vectors=False):
            yield row.doc

    def _build(self) -> None:
        """Build the catalogue's index at the store's current sequence (``_lock`` held)."""
        seq = self.state.records.seq
        if seq == self._catalogue_seq and self._catalogue is not None:
            return
        lexicon_zh.reverse_dictionary()  # loaded once per process (~2 s), not part of a build's time
        t0 = time.perf_counter()
        brands = getattr(self.state.graph_data, "brands", None)
        brand_of = brands.from_title if brands is not None and len(brands) else None
        phrases = suggest.catalogue_phrases(self._docs(), brand_of=brand_of)
        index = suggest.SuggestIndex(phrases + chinese_phrases(phrases))
        self._catalogue, self._catalogue_seq = index, seq
        self._build_s = time.perf_counter() - t0
        self._built_at = time.monotonic()
        self._cache.clear()
        self.state.mark_changed()  # the next snapshot version keeps it (a restart then loads it)
        log.info("suggestions: %d catalogue phrases at change %d in %.2fs", len(index), seq, self._build_s)

    def _build_in_background(self) -> None:
        if self._building:
            return
        self._building = True

        def run() -> None:
            try:
                with self._lock:
                    self._build()
            except Exception as e:  # noqa: BLE001 - the old index keeps answering
                log.warning("suggestion index not rebuilt: %s", e)
            finally:
                self._building = False

        self._build_thread = threading.Thread(target=run, name="vitrine-suggest-build", daemon=True)
        self._build_thread.start()

    def settle(self, timeout_s: float = 30.0) -> bool:
        """Wait (up to ``timeout_s``) for a catalogue build running in the background to finish, so
        a snapshot taken next keeps it; returns whether none is running now. A build slower than
        :data:`INLINE_BUILD_S` (a large catalogue, or a loaded machine) always runs in the background."""
        thread = self._build_thread
        if thread is not None:
            thread.join(timeout_s)
        return thread is None or not thread.is_alive()

    def catalogue(self, *, wait: bool = True) -> suggest.SuggestIndex | None:
        """The catalogue's index, following the record store (``wait``: build it now if none
        exists yet; else None until the background build is done)."""
        current = self._catalogue
        if current is not None and self.state.records.recent_seq(1.0) == self._catalogue_seq:
            return current
        if current is None and not wait:
            self._build_in_background()
            return None
        if current is None or self._build_s < INLINE_BUILD_S:
            with self._lock:
                self._build()
            return self._catalogue
        if time.monotonic() - self._built_at >= REBUILD_SPACING * self._build_s:
            self._build_in_background()
        return current

    def shared_index(self) -> tuple[suggest.SuggestIndex, int, float] | None:
        """The catalogue's index (built now if need be), the change it reflects and its build's
        seconds, for processes forked from this one (:meth:`adopt`)."""
        index = self.catalogue()
        return None if index is None else (index, self._catalogue_seq, self._build_s)

    def adopt(self, shared: tuple[suggest.SuggestIndex, int, float]) -> None:
        """Serve the catalogue index the process this one was forked from built (rebuilt as
        usual once the catalogue moves on)."""
        with self._lock:
            self._catalogue, self._catalogue_seq, self._build_s = shared
            self._built_at = -float("inf")  # built in another process: due for a rebuild once it is behind
            self._cache.clear()

    # -- kept with the index snapshots ------------------------------------------------------------
    def _save_part(self, path: Path) -> tuple[str, dict[str, Any]] | None:
        """Write the catalogue's index for a snapshot version (vitrine/search/snapshot_parts.py).
        None: none built yet, or it failed (logged: suggestions never fail a snapshot)."""
        index, seq, build_s = self._catalogue, self._catalogue_seq, self._build_s  # the index first: a
        # build finishing meanwhile pairs it with an older seq, which only makes it look stale sooner
        if index is None:
            return None
        try:
            return index.save(path), {"seq": seq, "build_s": round(build_s, 3), "phrases": len(index)}
        except (OSError, StorageError, ValueError) as e:
            log.warning("suggestion index not kept with the snapshot: %s", e)
            path.unlink(missing_ok=True)
            return None

    def load_saved(self) -> bool:
        """Serve the catalogue's index kept with the snapshot version the data dir was opened from
        (rebuilt as usual once the catalogue moves past it). Returns whether there was one."""
        part = self.state.parts.opened(SNAPSHOT_FILE)
        if part is None:
            return False
        path, sha, note = part
        try:
            t0 = time.perf_counter()
            index, _ = suggest.SuggestIndex.load(path, sha)
            seq, build_s = int(note["seq"]), float(note["build_s"])
        except (StorageError, KeyError, TypeError, ValueError) as e:
            log.warning("suggestion index of snapshot %s not used (rebuilt instead): %s", path.parent.name, e)
            return False
        with self._lock:
            self._catalogue, self._catalogue_seq, self._build_s = index, seq, build_s
            self._built_at = -float("inf")  # due for a rebuild as soon as the catalogue is past it
            self._cache.clear()
        self.state.parts.loaded(SNAPSHOT_FILE, index, sha, note)
        log.info("suggestions: %d catalogue phrases at change %d from snapshot %s in %.2fs", len(index), seq,
                 path.parent.name, time.perf_counter() - t0)
        return True

    def warm(self) -> float:
        """Build the indexes before the first lookup; returns the seconds it took."""
        t0 = time.perf_counter()
        index = self.catalogue()
        if index is not None:
            index.pinyin()  # its Chinese phrases by pinyin (pypinyin loads now, not in a lookup)
        if self.popular is not None:
            self.refresh_queries()
        return time.perf_counter() - t0

    def words(self) -> frozenset[str]:
        """The catalogue's words (titles, categories, brands, facet values), case folded. A
        catalogue of over :data:`INLINE_FIRST_BUILD` products never builds its index inside the
        caller (a search): empty until the background build is done (warm-up builds it first)."""
        index = self.catalogue(wait=len(self.state) <= INLINE_FIRST_BUILD)
        return index.words if index is not None else frozenset()

    def texts(self) -> list[str]:
        """The catalogue's titles and brands as written (where a brand's Chinese name stands
        beside it, "Nike/耐克", vitrine/intent/lexicon_zh.py learns it); empty until built."""
        index = self.catalogue(wait=len(self.state) <= INLINE_FIRST_BUILD)
        if index is None:
            return []
        return [t for t, kd in zip(index.texts, index.kinds) if kd in ("title", "brand")]

    def language(self) -> str:
        """The catalogue's language as its titles read: "zh" when at least half of them hold
        Chinese characters, else "en" (the UI's text and examples follow it)."""
        index = self.catalogue(wait=len(self.state) <= INLINE_FIRST_BUILD)
        if index is None:
            return "en"
        titles = [t for t, kd in zip(index.texts, index.kinds) if kd == "title"][:5000]
        zh = sum(1 for t in titles if has_cjk(t))
        return "zh" if titles and zh * 2 >= len(titles) else "en"

    # -- lookups -------------------------------------------------------------------------------------
    def lookup(self, q: str, k: int = 8) -> list[suggest.Match]:
        if not 1 <= k <= MAX_K:
            raise InvalidInput(f"k must be between 1 and {MAX_K}")
        if len(q) > MAX_PREFIX_CHARS:
            raise InvalidInput(f"q must be at most {MAX_PREFIX_CHARS} characters")
        self._queries_due()
        cat = self.catalogue()
        key = (" ".join(suggest.tokens(q)), k, id(cat), id(self._queries))
        got = self._cache.get(key)
        if got is None:
            if not key[0]:  # examples: logged queries first, then the catalogue's, in their order
                seen: dict[str, suggest.Match] = {m.key: m for m in self._queries.top(k)}
                for m in cat.top(k) if cat is not None else []:
                    seen.setdefault(m.key, m)
                got = list(seen.values())[:k]
            else:
                parts = [self._queries.lookup(q, k)]
                if cat is not None:
                    parts.append(cat.lookup(q, k))
                got = suggest.merge(parts, k)
            self._cache.put(key, got)
        return got

    def suggest(self, q: str, k: int = 8) -> SuggestResponse:
        """Completions of ``q`` (what the shopper typed so far), best first; an empty ``q``:
        representative phrases (popular queries, then the catalogue's common pairs, categories
        and brands: a home page's examples)."""
        t0 = time.perf_counter()
        got = self.lookup(q, k)
        return SuggestResponse(q=q, suggestions=[SuggestionOut(text=m.text, kind=m.kind, score=m.score) for m in got],
                               took_ms=round((time.perf_counter() - t0) * 1000, 3))
