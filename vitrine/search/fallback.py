"""Degrade, don't fail: the search's guarded steps and what answers when one of them breaks.

- The query embedding (towers -> adapter; with the MoE adapter, its gate) runs under a time
  budget (``gate_timeout_ms``). When it raises or runs out of time, the adapter's light path
  answers when it has one (an adapter may define ``forward_light(image, text)``: the same space
  without the part that failed, e.g. the MoE's skip path and an even mix of experts instead of
  the router); otherwise a query with words is ranked by BM25 and the knowledge graph alone
  (:func:`lexical_rank`). The response says ``degraded: ["gate"]``.
- Hybrid fusion (BM25 + graph signals, vitrine/search/fusion.py) runs under ``fusion_timeout``;
  when it raises or runs out of time the search is the plain vector ranking (``degraded:
  ["fusion"]``). Its retrievers already degrade one by one (``bm25``, ``graph``).
- The intent classifier degrades in vitrine/search/understanding.py (``degraded: ["intent"]``).

A text query ranked at the floor (the text tower's own cosine) waits for the text tower alone and
runs the adapter only if its shared-space vector is read after all (:class:`QueryVectors`), so a
broken gate costs it nothing.

Both budgets are kept without handing the step to another thread: the query encodes already run
in the fast path's batcher threads, and the search waits for them at most ``gate_timeout_ms``
(an abandoned encode finishes in the background); fusion runs in the searching thread, which
checks its deadline between stages (a stage in progress is not interrupted). A hand-off per
guarded step cost each request two more thread wake-ups, each waiting for the interpreter lock
under load.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from vitrine.encoders.queries import TextQuery
from vitrine.errors import InvalidInput, ModelError
from vitrine.index.vocabulary import QueryTerms
from vitrine.search.models import Ranked
from vitrine.search.read_context import ReadContext

log = logging.getLogger(__name__)


def query_vectors(reader: ReadContext, text: str | None, image: bytes | None, text_query: TextQuery | None = None,
                  *, lazy_text: bool = False) -> tuple[Mapping[str, np.ndarray], list[str]]:
    """The query's shared-space vectors and the degraded components (``["gate"]`` or none).

    ``lazy_text`` (a text-only query whose ranking may not read its shared-space vector: the
    floor ranks by the text tower's own cosine): wait for the text tower alone, and run the
    adapter only if the vector is read (:class:`QueryVectors`)."""
    budget_s = reader.settings.search.gate_timeout_ms / 1000
    try:
        if lazy_text and text and image is None:
            tq = text_query or reader.query_encoder.text_query(text)
            tq.wait(budget_s)
            return QueryVectors(reader, tq), []
        return reader.query_vectors(text, image, text_query, timeout_s=budget_s), []
    except InvalidInput:
        raise
    except TimeoutError:
        log.warning("query embedding took over %g ms; degrading to the light path", budget_s * 1000)
    except Exception as e:  # noqa: BLE001 - any failure of the gate degrades, never fails the search
        log.warning("query embedding failed (%s); degrading to the light path", e)
    try:
        return light_query_vectors(reader, text, image), ["gate"]
    except InvalidInput:
        raise
    except Exception as e:  # noqa: BLE001 - the last fallback: words alone still answer
        log.warning("the light query path failed too (%s); ranking by words alone", e)
        return {}, ["gate"]


class QueryVectors(Mapping[str, np.ndarray]):
    """A text query's shared-space vector, made when first read (the adapter in the reading
    thread). If the adapter fails then, the light path's vector answers and ``degraded`` says
    ``gate``; without a light path the read raises (the ranking's own guard degrades)."""

    def __init__(self, reader: ReadContext, text_query: TextQuery) -> None:
        self._reader = reader
        self._query = text_query
        self._vector: np.ndarray | None = None
        self.degraded: list[str] = []

    def __getitem__(self, modality: str) -> np.ndarray:
        if modality != "text":
            raise KeyError(modality)
        if self._vector is None:
            try:
                self._vector = self._query.vector(self._reader.settings.search.gate_timeout_ms / 1000)
            except Exception as e:  # the adapter failing here degrades like it does up front
                log.warning("query embedding failed (%s); degrading to the light path", e)
                self.degraded.append("gate")
                light = light_query_vectors(self._reader, self._query.text, None)
                if "text" not in light:
                    raise ModelError("the adapter failed and has no light path") from e
                self._vector = light["text"]
        return self._vector

    def __iter__(self) -> Iterator[str]:
        return iter(("text",))

    def __len__(self) -> int:
        return 1


def light_query_vectors(reader: ReadContext, text: str | None, image: bytes | None) -> dict[str, np.ndarray]:
    """Query vectors from the adapter's light path (``forward_light``), or none when it has none."""
    import torch

    enc = reader.encoder
    light = getattr(enc.adapter, "forward_light", None)
    if light is None:
        return {}
    out: dict[str, np.ndarray] = {}
    dev = enc.towers.device
    with torch.inference_mode():
        if text:
            tf = torch.from_numpy(enc.shared_text_features([text])).to(dev)
            res = light(None, tf)
            out["text"] = _unit(res.text if res.text is not None else res.fused)
        if image is not None:
            imf = torch.from_numpy(enc.shared_image_features([image])).to(dev)
            res = light(imf, None)
            out["image"] = _unit(res.image if res.image is not None else res.fused)
    return out


def _unit(t: Any) -> np.ndarray:
    v = t[0].detach().float().cpu().numpy()
    n = float(np.linalg.norm(v))
    if not np.isfinite(v).all() or n == 0:
        raise ModelError("the light path gave no usable vector")
    return (v / n).astype(np.float32)


def lexical_rank(reader: ReadContext, qv: Mapping[str, np.ndarray], text: str | None, k: int,
                 allowed: np.ndarray | None) -> tuple[Ranked, dict[int, float], list[str], QueryTerms]:
    """Ranking without query vectors: BM25 over titles, brands, categories and attributes, then
    the knowledge graph's products for the values the words name. Same shape as ``fusion.rank``."""
    if not text:
        raise ModelError("the query embedding failed and a photo-only query has no fallback; try again")
    if allowed is not None and len(allowed) == 0:
        return [], {}, [], QueryTerms()
    only = allowed.tolist() if allowed is not None else None
    hits = reader.state.records.bm25(text, k, only=only)
    out: Ranked = []
    best = max((s for _, s in hits), default=0.0) or 1.0
    for iid, s in hits:
        out.append((int(iid), float(s) / best, {"bm25": float(s) / best}))
    terms = QueryTerms()
    if len(out) < k:
        try:
            from vitrine.search.fusion import graph_candidate_ids

            terms = reader.state.graph.match_query(text)
            more = graph_candidate_ids(reader.state.graph, terms).tolist() if terms else []
            seen = {i for i, _, _ in out}
            allowed_set = set(only) if only is not None else None
            for iid in more:
                if len(out) >= k:
                    break
                if iid not in seen and (allowed_set is None or iid in allowed_set):
                    out.append((int(iid), 0.0, {"graph": 1.0}))
        except Exception as e:  # noqa: BLE001 - the graph is a bonus here
            log.warning("graph fallback failed: %s", e)
    return out, {}, [], terms
