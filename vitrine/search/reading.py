"""What the ranking searches for a query: :class:`Reading`, the query as typed and as read into the
catalogue's words, by translation (vitrine/search/translation.py) or by spelling
(vitrine/search/spelling.py, :class:`Correction`)."""

from __future__ import annotations

from dataclasses import dataclass

from vitrine.lang.translate import Translation

CATALOGUE_LANGUAGE = "en"  # the language of the catalogue words a query is read into


@dataclass(frozen=True)
class Correction:
    """``source``: the query as typed; ``text``: as read; ``words``: (typed word, read as)."""

    source: str
    text: str
    words: tuple[tuple[str, str], ...]

    def explain(self) -> list[dict[str, str]]:
        return [{"word": typed, "read_as": read} for typed, read in self.words]


@dataclass
class Reading:
    """What the ranking searches for one query: ``text``; ``language`` of the query as typed
    ("zh" when it holds Chinese); ``translation`` when it was read into the catalogue's words,
    ``spelling`` when its misspelt or run-together words were (vitrine/search/spelling.py;
    ``typed``: the query as typed)."""

    text: str | None
    language: str = "en"
    translation: Translation | None = None
    spelling: Correction | None = None

    @property
    def searched_language(self) -> str:
        """The language the ranking reads, whose slot-filter decision applies: a query read in full
        into an English catalogue's words is searched as English (the tune measured that); one read
        in part, or searched as typed, stays in its own language, and its slots filter (the text
        side cannot read all of it)."""
        tr = self.translation
        read = self.spelling.source if self.spelling is not None else self.text  # before any word was corrected
        if tr is not None and tr.text.strip() and read == tr.text and tr.read_share >= 1.0:
            return CATALOGUE_LANGUAGE
        return self.language

    @property
    def typed(self) -> str | None:
        """The query as the shopper typed it."""
        if self.translation is not None:
            return self.translation.source
        return self.spelling.source if self.spelling is not None else self.text
