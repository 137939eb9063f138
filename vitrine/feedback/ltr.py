"""A learned ranker over the fusion's signals and the log's features, trained from the click log
with inverse-propensity weights (docs/learning.md, "The learned ranker").

What it ranks: the first :data:`DEPTH` products of a text query's pool as the learned re-ranking's
stage leaves it (vitrine/feedback/stage.py), by a LightGBM lambdarank model (gradient-boosted
trees, the field's learning-to-rank tool: Vespa, OpenSearch and Elasticsearch serve such models)
over one row per product:

- the fusion's signals (each part of the fused score the read path carries, by name; 0 when a
  product has none), its fused score in units of the pool's top score spread and its fused rank;
- the log's features: the query's learned boost (vitrine/feedback/clicks.py), the product's rank
  after the learned re-ranking and Rocchio feedback, its Rocchio move (vitrine/feedback/rocchio.py),
  its popularity and its leaf category's popularity over every logged query (IPS click rates, vitrine/feedback/ltr_fit.py),
  the query's category affinity for the product's leaf, and whether the query was logged (1), or
  borrowed a logged query's profile (the transfer strength), or neither (0).

Only features that a never-logged query also has (signals, popularity, category popularity) can
carry what shoppers chose to queries nobody logged; the rest carry it to products nobody was shown.

Trained from the click log by vitrine/feedback/ltr_fit.py (inverse-propensity scored clicks).

Persisted as LightGBM's own text model format (``model.txt``) beside a ``config.json`` (feature
names, the popularity tables, the training report), never pickled; loading needs LightGBM only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitrine.atomic import atomic_write_bytes

log = logging.getLogger(__name__)

FORMAT = 1
DIR = "ltr"
MODEL_FILE = "model.txt"
CONFIG_FILE = "config.json"
DEPTH = 100  # the pool's first products the ranker orders (the rest keep their place below)
# the log's features, in model order (the fusion's signals follow, by name)
LOG_FEATURES = ("fused", "fused_rank", "learned_rank", "boost", "rocchio", "popularity",
                "category_popularity", "category_affinity", "logged")
@dataclass
class Row:
    """One pool product as the ranker sees it: its id, leaf category and named feature values
    (the log's features but the two popularity ones, which come from the ranker's own tables)."""

    pid: str
    leaf: str
    values: dict[str, float]


@dataclass
class Ranker:
    """A trained lambdarank model with what it needs to build its features."""

    booster: Any  # lightgbm.Booster
    signals: list[str]
    popularity: dict[str, float]
    categories: dict[str, float]
    report: dict[str, Any] = field(default_factory=dict)
    created: float = 0.0

    @property
    def features(self) -> list[str]:
        return [*LOG_FEATURES, *(f"signal:{s}" for s in self.signals)]

    def matrix(self, rows: Sequence[Row]) -> np.ndarray:
        return matrix(rows, self.features, self.popularity, self.categories)

    def predict(self, rows: Sequence[Row]) -> np.ndarray:
        if not rows:
            return np.zeros(0)
        return np.asarray(self.booster.predict(self.matrix(rows), num_threads=1), dtype=np.float64)

    def model_text(self) -> str:
        return str(self.booster.model_to_string())

    def config(self) -> dict[str, Any]:
        return {"format": FORMAT, "features": self.features, "signals": self.signals, "popularity": self.popularity,
                "categories": self.categories, "report": self.report, "created": self.created}

    def save(self, folder: Path) -> Path:
        """``model.txt`` (LightGBM's text format) and ``config.json`` in ``folder``."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(folder / MODEL_FILE, self.model_text().encode())
        atomic_write_bytes(folder / CONFIG_FILE, json.dumps(self.config(), ensure_ascii=False,
                                                            sort_keys=True).encode())
        return folder


def load(folder: Path) -> Ranker:
    """A ranker saved by :meth:`Ranker.save` (ValueError when it is not one this Vitrine reads)."""
    import lightgbm

    folder = Path(folder)
    cfg = json.loads((folder / CONFIG_FILE).read_text())
    if cfg.get("format") != FORMAT:
        raise ValueError(f"ranker config format {cfg.get('format')!r}, this Vitrine reads {FORMAT}")
    try:
        booster = lightgbm.Booster(model_str=(folder / MODEL_FILE).read_text())
    except lightgbm.basic.LightGBMError as e:
        raise ValueError(f"unreadable model: {e}") from e
    r = Ranker(booster, [str(s) for s in cfg.get("signals") or []],
               {str(k): float(v) for k, v in (cfg.get("popularity") or {}).items()},
               {str(k): float(v) for k, v in (cfg.get("categories") or {}).items()},
               dict(cfg.get("report") or {}), float(cfg.get("created") or 0.0))
    if list(cfg.get("features") or []) != r.features or booster.num_feature() != len(r.features):
        raise ValueError("ranker config's features do not match its model")
    return r


def matrix(rows: Sequence[Row], features: Sequence[str], pop: Mapping[str, float],
           cats: Mapping[str, float]) -> np.ndarray:
    out = np.zeros((len(rows), len(features)), dtype=np.float64)
    for i, r in enumerate(rows):
        vals = {**r.values, "popularity": pop.get(r.pid, 0.0), "category_popularity": cats.get(r.leaf, 0.0)}
        for j, f in enumerate(features):
            out[i, j] = vals.get(f, 0.0)
    return out


def reorder(ranked: Sequence[tuple[int, float, Mapping[str, float]]], scores: np.ndarray) -> list[
        tuple[int, float, Mapping[str, float]]]:
    """The pool's first ``len(scores)`` products re-ordered by the ranker's scores (ties keep their
    order), the rest below as they were; the n-th product keeps the n-th score, so totals, the
    relevance floor and facets stay as they were."""
    n = len(scores)
    order = sorted(range(n), key=lambda i: (-float(scores[i]), i))
    out = []
    for slot, i in enumerate(order):
        iid, _, parts = ranked[i]
        out.append((iid, float(ranked[slot][1]), {**parts, "ranker": round(float(scores[i]), 6)}))
    return out + list(ranked[n:])
