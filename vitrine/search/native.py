"""The text tower's native space beside the shared one: every product's text as the text tower
embeds it (its L2-normalised output, before the aligner), in a vector index of its own.

It is the floor of text search (vitrine/search/calibration.py): ranking by native cosine is what
a plain sentence-embedding search over the product texts would return, and no learned part
(aligner, graph signals, slots) may rank below it. The vectors depend on the text tower only,
not on the aligner, so a hot swap of the aligner keeps them. They are stored with each record
(``vec_native``), saved in every index snapshot (``native.vidx``) and replayed like the others;
a data dir made before they existed gets them from its products' texts when it opens.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vitrine.encoders.queries import unit_rows
from vitrine.index.records import StoredRow
from vitrine.index.store import RecordStoreAPI
from vitrine.index.vectors import VectorIndex
from vitrine.search.models import Product, product_text

log = logging.getLogger(__name__)

FILE = "native.vidx"


class NativeSpace:
    """Products' native text vectors, for the text tower whose key is ``towers_key``."""

    def __init__(self, dim: int, towers_key: str, factory: str, *, nprobe: int, ef_search: int) -> None:
        self.towers_key = towers_key
        self.index = VectorIndex(dim, factory, nprobe=nprobe, ef_search=ef_search)

    def __len__(self) -> int:
        return len(self.index)

    def usable_with(self, towers_key: str) -> bool:
        """Whether queries embedded by ``towers_key`` may be compared with these vectors."""
        return towers_key == self.towers_key

    def apply(self, rows: Sequence[StoredRow]) -> list[StoredRow]:
        """Apply written rows; returns the live ones that came without a native vector of these
        towers (their vectors are to be computed from their texts)."""
        dead = [int(r.iid) for r in rows if r.deleted]
        if dead:
            self.index.delete(dead)
        have: list[tuple[int, np.ndarray]] = []
        lacking: list[StoredRow] = []
        for r in rows:
            if r.deleted:
                continue
            v = r.vectors.get("native")
            if v is not None and (r.model_key or "").startswith(self.towers_key + "+"):
                have.append((int(r.iid), v))
            else:
                lacking.append(r)
        if have:
            self.index.upsert([i for i, _ in have], np.stack([v for _, v in have]))
        return lacking

    def delete(self, iids: Iterable[int]) -> None:
        iids = list(iids)
        if iids:
            self.index.delete(iids)

    def fill(self, text_features: Callable[[list[str]], np.ndarray], rows: Sequence[StoredRow],
             batch: int = 2048) -> int:
        """Native vectors of ``rows`` computed from their texts by ``text_features`` (the text
        tower; the feature cache usually holds its output already: ingest computed it)."""
        done = 0
        for s in range(0, len(rows), batch):
            part = rows[s:s + batch]
            texts = [product_text(Product.model_validate(r.doc)) for r in part]
            vecs = unit_rows(text_features(texts))
            self.index.upsert([int(r.iid) for r in part], vecs)
            done += len(part)
        return done

    def fill_missing(self, records: RecordStoreAPI, text_features: Callable[[list[str]], np.ndarray],
                     live: np.ndarray) -> int:
        """Give every one of the ``live`` products (iids) lacking a native vector one (stored vector or
        from its text)."""
        missing = np.setdiff1d(np.asarray(live, dtype=np.int64), self.index.ids()).tolist()
        if not missing:
            return 0
        log.info("%d products lack a native text vector: filling them in", len(missing))
        rows = list(records.get_by_iids(missing, with_vectors=True).values())
        lacking = self.apply(rows)
        if lacking:
            self.fill(text_features, lacking)
        return len(rows)

    def save(self, folder: Path) -> str:
        return self.index.save(folder / FILE)

    def load(self, folder: Path, sha256: str | None, **kw: Any) -> None:
        self.index = VectorIndex.load(folder / FILE, sha256, **kw)
