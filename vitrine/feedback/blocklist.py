"""Terms never suggested from the search log (`vitrine suggest block TERM`): kept as JSON in the
feedback log's meta table (SQLite or PostgreSQL: every worker reads the same list), applied each
time the popular queries are read again for suggestions (every ``refresh_s``, 60 s by default).

A term blocks every logged query that holds it: as whole words for a term in Latin letters
("cheap" blocks "cheap sofa", not "cheapest sofa"), anywhere for a term in CJK characters. The
catalogue's own suggestions (titles, brands, categories) are the merchant's and are not filtered.
"""

from __future__ import annotations

import json
import logging

from vitrine.errors import InvalidInput
from vitrine.feedback.types import EventLogAPI
from vitrine.index.querytext import normalise_query

log = logging.getLogger(__name__)

META_KEY = "suggest_blocklist"


def _cjk(text: str) -> bool:
    return any("\u3400" <= ch <= "\u9fff" or "\uf900" <= ch <= "\ufaff" for ch in text)


class Blocklist:
    """The blocked terms of one feedback log."""

    def __init__(self, events: EventLogAPI) -> None:
        self.log = events

    def terms(self) -> list[str]:
        raw = self.log.get_meta(META_KEY)
        if not raw:
            return []
        try:
            got = json.loads(raw)
        except ValueError:
            log.warning("the suggestion blocklist in the event log is unreadable: nothing blocked")
            return []
        return [str(t) for t in got] if isinstance(got, list) else []

    def block(self, term: str) -> str:
        """Block ``term`` (normalised as queries are); returns it as stored."""
        norm = normalise_query(term)
        if not norm:
            raise InvalidInput("term: nothing left to block once normalised")
        terms = self.terms()
        if norm not in terms:
            self.log.set_meta(META_KEY, json.dumps(sorted([*terms, norm]), ensure_ascii=False))
        return norm

    def unblock(self, term: str) -> bool:
        """Unblock ``term``; False when it was not blocked."""
        norm = normalise_query(term)
        terms = self.terms()
        if norm not in terms:
            return False
        self.log.set_meta(META_KEY, json.dumps([t for t in terms if t != norm], ensure_ascii=False))
        return True


def blocked(norm: str, terms: list[str]) -> bool:
    """Whether a normalised query holds a blocked term (the module docstring)."""
    padded = f" {norm} "
    return any((t in norm) if _cjk(t) else (f" {t} " in padded) for t in terms)
