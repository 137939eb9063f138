"""Per-catalogue ranking settings: the floor, and what `vitrine tune` fitted to this catalogue.

A text query is ranked by a weighted sum of signals (vitrine/search/fusion.py): ``native`` (cosine
in the text tower's own space), ``vector`` (cosine in the aligner's shared space), ``bm25`` and
the graph signals. Which of them count, and how much, depends on the catalogue: the shipped
defaults were tuned on fashion, and on a catalogue from another domain they ranked below plain
cosine of the text tower. So a catalogue starts at the **floor** (``native`` alone: exactly the
text tower's cosine ranking) and moves off it only when ``vitrine tune`` (vitrine/evals/tuning.py)
found, on held-out pseudo-queries generated from the catalogue itself, a mix that beats it.

The fitted settings live in ``<data dir>/tuning.json``, tied to the catalogue's version (the
record store's identity, change sequence number, product count and a digest of its contents)
and to the model that made the vectors. The file format is this module's; the fitting is
evals'. A file made for another store or model is ignored; one made before the catalogue moved
by more than ``tune_max_drift`` of its products is stale and ignored (the floor serves until
tune runs again, which `vitrine ingest` does when it is cheap).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vitrine.atomic import atomic_write_bytes

log = logging.getLogger(__name__)

FILE = "tuning.json"
FORMAT = 1
FLOOR_WEIGHTS: dict[str, float] = {"native": 1.0}


@dataclass
class Calibration:
    """How text queries are ranked on one catalogue.

    ``text_weights``: weighted-fusion weights of text-only queries (signals absent count 0);
    ``slot_filters``: whether the intent classifier's slots may filter queries in the languages of
    ``slot_languages`` (the ones the tuning measured: a query in another language keeps its slots,
    never switched off by a measurement that did not see it); ``accepted``: whether a
    fitted mix beat the floor on held-out pseudo-queries (False: ``text_weights`` is the floor);
    ``catalogue`` and ``model_key``: what it was fitted on; ``source``: floor, tuned, or why a
    tuned file was not used; ``summary``: the tuning's held-out figures; ``relevance_floor``: the
    share of a query's top score a product must reach to count as matching (``total``, facets,
    sorts), fitted to this catalogue's own score distributions (None: the settings' value)."""

    text_weights: dict[str, float] = field(default_factory=lambda: dict(FLOOR_WEIGHTS))
    slot_filters: bool = False
    slot_languages: tuple[str, ...] = ("en",)
    accepted: bool = False
    catalogue: dict[str, Any] = field(default_factory=dict)
    model_key: str | None = None
    source: str = "floor"
    created: float = 0.0
    summary: dict[str, Any] = field(default_factory=dict)
    relevance_floor: float | None = None

    @property
    def is_floor(self) -> bool:
        """True when text queries rank by the native cosine alone (the exact floor)."""
        return {k for k, w in self.text_weights.items() if w} <= {"native"}

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, **asdict(self)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Calibration":
        if d.get("format") != FORMAT:
            raise ValueError(f"tuning file format {d.get('format')!r}, this Vitrine reads {FORMAT}")
        weights = {str(k): float(v) for k, v in (d.get("text_weights") or {}).items()}
        if any(w < 0 for w in weights.values()) or not any(weights.values()):
            raise ValueError("tuning file has negative or no weights")
        return cls(text_weights=weights, slot_filters=bool(d.get("slot_filters", False)),
                   slot_languages=tuple(d.get("slot_languages") or ("en",)),
                   accepted=bool(d.get("accepted", False)), catalogue=dict(d.get("catalogue") or {}),
                   model_key=d.get("model_key"), source="tuned", created=float(d.get("created") or 0.0),
                   summary=dict(d.get("summary") or {}),
                   relevance_floor=None if d.get("relevance_floor") is None else float(d["relevance_floor"]))


def floor(reason: str = "floor") -> Calibration:
    """The untuned default: text queries rank exactly as the text tower's cosine, no slot filters."""
    return Calibration(source=reason)


def catalogue_version(records: Any, store_id: str) -> dict[str, Any]:
    """The catalogue a calibration is fitted on: store identity, change sequence, size, digest."""
    digest = getattr(records, "content_digest", None)
    return {"store_id": store_id, "seq": records.seq, "count": records.count(), "digest": digest() if digest else None}


def path(data_dir: Path) -> Path:
    return Path(data_dir) / FILE


def save(data_dir: Path, cal: Calibration) -> Path:
    cal.created = cal.created or time.time()
    p = path(data_dir)
    atomic_write_bytes(p, json.dumps(cal.to_json(), indent=2, sort_keys=True).encode())
    return p


def staleness(cal: Calibration, records: Any, store_id: str, model_key: str,
              max_drift: float) -> str | None:
    """Why a tuned calibration no longer fits this catalogue and model (None: it does)."""
    cat = cal.catalogue
    if cat.get("store_id") != store_id:
        return "fitted on another record store"
    if cal.model_key and cal.model_key != model_key:
        return f"fitted with model {cal.model_key}, serving {model_key}"
    seq = int(cat.get("seq", -1))
    if seq > records.seq:
        return "fitted on a newer copy of the records"
    if seq == records.seq:
        return None
    changed = getattr(records, "changed_since", None)  # a store without it: the size change bounds it below
    moved = changed(seq) if changed is not None else abs(records.count() - int(cat.get("count", 0)))
    count = max(1, records.count())
    if moved > max_drift * count:
        return f"{moved} of {count} products changed since it was fitted (more than {max_drift:.0%})"
    return None


def load(data_dir: Path, records: Any, store_id: str, model_key: str, max_drift: float) -> Calibration:
    """The data dir's tuned calibration if it fits this catalogue and model, else the floor
    (its ``source`` saying why)."""
    p = path(data_dir)
    if not p.is_file():
        return floor()
    try:
        cal = Calibration.from_json(json.loads(p.read_text()))
    except (OSError, ValueError, TypeError, AttributeError) as e:
        log.warning("%s unusable (%s): text queries rank at the floor (the text tower's cosine)", p, e)
        return floor(f"unreadable tuning file: {e}")
    why = staleness(cal, records, store_id, model_key, max_drift)
    if why is not None:
        log.warning("%s not used: %s; text queries rank at the floor until `vitrine tune` runs", p, why)
        return floor(f"stale: {why}")
    return cal
