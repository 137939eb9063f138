"""Shopping sessions as a stage of every search (vitrine/search/stages.py): before ranking, a search
with a ``session`` becomes the session's standing query refined by this turn; after it, the
standing query is kept and the response says it (vitrine/conversation/sessions.py)."""

from __future__ import annotations

from vitrine.conversation.sessions import Sessions, Turn
from vitrine.search import recommend
from vitrine.search.models import SearchResponse
from vitrine.search.read_context import ReadContext
from vitrine.search.stages import Stage, Underway
from vitrine.search.understanding import QueryUnderstanding


class SessionStage(Stage):
    """The sessions of one read path; ``sessions`` keeps their store."""

    name = "session"

    def __init__(self, reader: ReadContext, sessions: Sessions) -> None:
        self.reader, self.sessions = reader, sessions

    @classmethod
    def open(cls, reader: ReadContext, understanding: QueryUnderstanding | None = None) -> SessionStage:
        return cls(reader, Sessions(reader, understanding))

    def before(self, underway: Underway) -> None:
        if not underway.req.session:
            return
        turn = self.sessions.begin(underway.req, underway.text, underway.image)
        underway.notes[self.name] = turn
        underway.req, underway.text, underway.image = turn.req, turn.text, turn.image
        underway.vectors.update(turn.vectors)

    def finish(self, underway: Underway, resp: SearchResponse) -> None:
        turn: Turn | None = underway.notes.get(self.name)
        if turn is not None:  # keep the standing query, say it in the response
            self.sessions.finish(turn, resp, lambda ids: recommend.compare(self.reader, ids))

    def close(self) -> None:
        self.sessions.close()  # the session store's connection (vitrine/conversation/store.py)
