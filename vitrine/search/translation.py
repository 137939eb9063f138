"""Reading a Chinese query on a catalogue written in English (docs/design.md "Languages").

The read path asks :meth:`QueryTranslation.read` for the text its ranking should search. A query
without Chinese characters is returned as it is, at no cost. A Chinese query on a catalogue whose
words are English is read as the catalogue's own English words (:class:`vitrine.lang.translate.
Translator`, over the catalogue's BM25 vocabulary and document frequencies), and that English runs
the same pipeline as an English query (text tower, BM25, graph, intent); on a catalogue whose
words are mostly Chinese the query stays as typed; on a mixed one it is searched as typed and as
read. The vocabulary is this module's cache: rebuilt when the catalogue changed and the slot
vocabulary's refresh interval has passed, like the slot extractor's.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from functools import lru_cache

from vitrine.index.bm25 import MemoryBM25, word_terms
from vitrine.intent.slots import lexicon
from vitrine.lang import segment
from vitrine.lang.translate import ToChinese, Translator, cjk_share
from vitrine.search.read_context import ReadContext
from vitrine.search.reading import Reading

log = logging.getLogger(__name__)

CHINESE_CATALOGUE = 0.5  # share of the catalogue's word occurrences that are Chinese: read Chinese as typed
MIXED_CATALOGUE = 0.1  # above this share (and below the one above): search both the typed and the read text


class QueryTranslation:
    """One read path's translator, over its catalogue's vocabulary (built on the first Chinese query)."""

    def __init__(self, reader: ReadContext) -> None:
        self.reader = reader
        self._lock = threading.Lock()
        self._translator: Translator | None = None
        self._share = 0.0
        self._key: tuple[int, int] | None = None
        self._at = -float("inf")
        self._to_chinese: tuple[Translator, ToChinese] | None = None

    def translator(self) -> tuple[Translator, float]:
        """The catalogue's translator and the Chinese share of its words (refreshed as the slot vocabulary is)."""
        now = time.monotonic()
        refresh_s = self.reader.settings.intent.intent_vocab_refresh_s
        current = self._translator
        if current is not None and now - self._at < refresh_s:
            return current, self._share
        state = self.reader.state
        key = (state.records.recent_seq(min(1.0, refresh_s)), len(state))
        with self._lock:
            if self._translator is None or key != self._key:
                t0 = time.perf_counter()
                terms = self._terms()
                self._translator = Translator(terms, word_terms, len(state), table=lexicon_words())
                self._share = cjk_share(terms)
                self._key = key
                log.info("query translation: %d catalogue terms (%.0f%% Chinese) in %.2fs", len(terms),
                         100 * self._share, time.perf_counter() - t0)
            self._at = now
            return self._translator, self._share

    def _terms(self) -> dict[str, int]:
        index = self.reader.state.records.text_index()
        if isinstance(index, MemoryBM25):
            return index.document_frequencies()
        # a store without in-memory postings: the catalogue's words, each counted once
        out: dict[str, int] = {}
        for w in self.reader.suggestions.words():
            for t in word_terms(w):
                out[t] = out.get(t, 0) + 1
        return out

    def to_chinese(self) -> ToChinese:
        """English onto this (Chinese) catalogue's words, built with the translator's vocabulary."""
        translator, _ = self.translator()
        with self._lock:
            if self._to_chinese is None or self._to_chinese[0] is not translator:
                self._to_chinese = (translator, ToChinese(translator.terms, word_terms, table=lexicon_words()))
            return self._to_chinese[1]

    def read(self, text: str | None) -> Reading:
        """The text to search for ``text`` (unchanged unless it holds Chinese, or the catalogue does)."""
        if not text:
            return Reading(text)
        if not segment.has_cjk(text):
            return self._read_english(text)
        try:
            translator, share = self.translator()
        except (OSError, ValueError, RuntimeError, KeyError, sqlite3.Error) as e:  # searched as typed then
            log.warning("query translation unavailable: %s", e)
            return Reading(text, "zh")
        if share >= CHINESE_CATALOGUE:
            return Reading(text, "zh")
        tr = translator.translate(text)
        if not tr.text.strip():
            return Reading(text, "zh", tr)
        searched = f"{text} {tr.text}" if share >= MIXED_CATALOGUE else tr.text
        return Reading(searched, "zh", tr)

    def _read_english(self, text: str) -> Reading:
        """An English query: as typed, and on a catalogue whose words are mostly Chinese also as the
        catalogue's Chinese words for it ("black handbag" -> "black handbag 黑色 手提包")."""
        try:
            _, share = self.translator()  # built once per catalogue change (warm-up builds it)
            if share < CHINESE_CATALOGUE:  # an English (or mixed) catalogue: the query as typed
                return Reading(text)
            tr = self.to_chinese().translate(text)
        except (OSError, ValueError, RuntimeError, KeyError, sqlite3.Error) as e:
            log.warning("query translation unavailable: %s", e)
            return Reading(text)
        if not tr.text.strip():
            return Reading(text)
        return Reading(f"{text} {tr.text}", "en", tr)


@lru_cache(maxsize=1)
def lexicon_words() -> dict[str, list[str]]:
    """The hand-written intent lexicon's Chinese forms, each read as its value's English forms
    ("女朋友" -> women, woman, ...; "米白色" -> off white): the words a shopper uses for a gender, a
    colour, a category, a brand, which the dictionary reads otherwise ("girl friend", "mother")."""
    out: dict[str, list[str]] = {}
    lex = lexicon()
    for field in ("gender", "colour", "category", "brand"):
        for value, forms in lex.get(field, {}).items():
            latin = [f for f in forms if not segment.has_cjk(f)] or [value.lower()]
            for form in forms:
                if segment.has_cjk(form):
                    out.setdefault(form.lower(), latin)
    return out


def query_fields(reading: Reading) -> dict[str, object]:
    """The response's ``query`` fields for a translated query: ``translated`` (the English searched)
    and ``translation`` (each word and the catalogue words it was read as); for a corrected one,
    ``corrected`` (the text searched) and ``corrections`` (each word and what it was read as)."""
    out: dict[str, object] = {}
    if reading.translation is not None:
        out |= {"translated": reading.translation.text, "translation": reading.translation.explain()}
    if reading.spelling is not None:
        out |= {"corrected": reading.spelling.text, "corrections": reading.spelling.explain()}
    return out
