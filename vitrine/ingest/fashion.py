"""The bundled catalogue (Fashion Product Images, Small) -> Vitrine's JSONL catalogue format.

Reading ``styles.csv``/``splits.csv`` lives in :mod:`vitrine.bundled`; this module converts.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from vitrine.atomic import atomic_path
from vitrine.bundled import read_styles

log = logging.getLogger(__name__)


def to_record(row: dict[str, str], image_ref: str) -> dict[str, Any]:
    attrs = {
        "gender": row["gender"], "colour": row["baseColour"], "season": row["season"],
        "year": row["year"], "usage": row["usage"], "articleType": row["articleType"],
    }
    return {
        "id": row["id"],
        "title": row["productDisplayName"],
        "category": [row["masterCategory"], row["subCategory"], row["articleType"]],
        "attributes": {k: v for k, v in attrs.items() if v and v != "NA"},
        "image": image_ref,
    }


def styles_of(source: Path, ids: Iterable[str] | None = None) -> list[dict]:
    """The bundled catalogue's style rows at ``source`` (those of ``ids`` only, when given)."""
    rows = read_styles(source)
    if ids is not None:
        keep = set(ids)
        rows = [r for r in rows if r["id"] in keep]
    return rows


def convert(source: Path, out: Path, ids: Iterable[str] | None = None, *, photo_base: Path | None = None) -> int:
    """Write the catalogue as JSONL at ``out``, photo paths relative to ``photo_base`` (default:
    ``out``'s folder; ingest reads photos only inside the folder it is given)."""
    source, out = Path(source), Path(out)
    rows = styles_of(source, ids)
    out.parent.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath((source / "images").resolve(), Path(photo_base or out.parent).resolve())
    with atomic_path(out, fsync=False) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(to_record(r, f"{rel}/{r['id']}.jpg"), ensure_ascii=False) + "\n")
    return len(rows)


def demo_subset(source: Path, n: int) -> list[str]:
    """A deterministic subset of ``n`` products that keeps every article type represented."""
    rows = read_styles(source)
    if n >= len(rows):
        return [r["id"] for r in rows]
    by_type: dict[str, list[str]] = {}
    for r in sorted(rows, key=lambda r: int(r["id"]) if r["id"].isdigit() else 0):
        by_type.setdefault(r["articleType"], []).append(r["id"])
    chosen: list[str] = []
    # round-robin over article types, in proportion to their size
    total = len(rows)
    for ids in by_type.values():
        take = max(1, round(n * len(ids) / total))
        step = max(1, len(ids) // take)
        chosen.extend(ids[::step][:take])
    return chosen[:n]
