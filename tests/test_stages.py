"""A newcomer's test of the rooms (docs/design.md, "Rooms"): a job around a search is one module
with a :class:`~vitrine.search.stages.Stage` and one line in the engine's list of stages; the read
path calls it without naming it."""

from __future__ import annotations


import numpy as np
import pytest
from conftest import copy_data_dir, engine_copy

from vitrine.index import stock
from vitrine.merchandising import patch
from vitrine.search.engine import STAGES
from vitrine.search.models import Ranked, SearchRequest
from vitrine.search.read_context import ReadContext
from vitrine.search.stages import Stage, Underway

QUERY = "women blue tops"


class HideOutOfStock(Stage):
    """The whole new module a newcomer writes: out-of-stock products never shown."""

    name = "hide_out_of_stock"

    def __init__(self, reader: ReadContext) -> None:
        self.reader = reader

    @classmethod
    def open(cls, reader: ReadContext, understanding: object = None) -> HideOutOfStock:
        return cls(reader)

    def after(self, underway: Underway, ranked: Ranked) -> Ranked:
        out = self.reader.state.filters.allowed({stock.FIELD: [stock.OUT]})
        gone = set(np.asarray(out).tolist()) if out is not None else set()
        return [r for r in ranked if r[0] not in gone]


@pytest.fixture(scope="module")
def engines(engine, settings_factory, encoder, tmp_path_factory):
    plain = engine_copy(engine, settings_factory, encoder, tmp_path_factory.mktemp("plain") / "data")
    from vitrine.search.engine import Engine

    dst = tmp_path_factory.mktemp("hiding") / "data"
    copy_data_dir(plain.data_dir, dst)
    # the one line: the engine's list plus the new stage
    hiding = Engine(settings_factory(dst), encoder, stages=(*STAGES, HideOutOfStock.open))
    yield plain, hiding
    plain.close()
    hiding.close()


def test_a_new_stage_is_one_module_and_one_line(engines) -> None:
    plain, hiding = engines
    first = plain.search(SearchRequest(text=QUERY, k=10)).results[0].id
    for eng in (plain, hiding):
        patch.patch_product(eng.writes, first, {"in_stock": False})
    shown_plain = [h.id for h in plain.search(SearchRequest(text=QUERY, k=100)).results]
    shown_hiding = [h.id for h in hiding.search(SearchRequest(text=QUERY, k=100)).results]
    assert first in shown_plain  # without the stage it is still shown (ranked last by default)
    assert first not in shown_hiding  # the stage hid it ...
    assert [i for i in shown_plain if i != first][:20] == shown_hiding[:20]  # ... and changed nothing else
    assert [type(s).__name__ for s in hiding.reads.stages][-1] == "HideOutOfStock"
