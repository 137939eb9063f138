"""The bundled catalogue: Fashion Product Images (Small), ``styles.csv`` + photos -> JSONL.

``styles.csv`` columns: id, gender, masterCategory, subCategory, articleType, baseColour,
season, year, usage, productDisplayName. Titles may contain commas; the file was
written by a CSV writer, so they are quoted. See ``data/README.md``.
"""

from __future__ import annotations

import csv
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from vitrine.errors import InvalidInput

log = logging.getLogger(__name__)

COLUMNS = ["id", "gender", "masterCategory", "subCategory", "articleType", "baseColour", "season", "year",
           "usage", "productDisplayName"]


def bundled_dir() -> Path:
    """``data/fashion-small`` of this checkout."""
    for root in (Path(__file__).resolve().parents[2], Path.cwd()):
        d = root / "data" / "fashion-small"
        if (d / "styles.csv").is_file():
            return d
    raise InvalidInput("the bundled catalogue (data/fashion-small) is not here; run from a Vitrine checkout "
                       "or pass the catalogue folder explicitly")


def read_styles(source: Path) -> list[dict[str, str]]:
    """Rows of ``styles.csv`` (written by a real CSV writer, so quoted titles parse)."""
    rows = []
    with open(source / "styles.csv", encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        header = next(reader, [])
        if header != COLUMNS:
            raise InvalidInput(f"{source / 'styles.csv'} has unexpected columns {header}")
        for parts in reader:
            if not parts:
                continue
            if len(parts) > 10:  # an unquoted title with commas: the title is everything after column 9
                parts = parts[:9] + [",".join(parts[9:])]
            if len(parts) != 10:
                log.warning("skipping malformed styles.csv row at line %d", reader.line_num)
                continue
            rows.append(dict(zip(COLUMNS, parts)))
    return rows


def read_splits(source: Path) -> dict[str, str]:
    out = {}
    with open(source / "splits.csv", encoding="utf-8") as f:
        next(f)
        for line in f:
            pid, _, split = line.strip().partition(",")
            if pid:
                out[pid] = split
    return out


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


def convert(source: Path, out: Path, ids: Iterable[str] | None = None) -> int:
    """Write the catalogue as JSONL at ``out`` (photo paths relative to ``out``'s folder)."""
    source, out = Path(source), Path(out)
    rows = read_styles(source)
    if ids is not None:
        keep = set(ids)
        rows = [r for r in rows if r["id"] in keep]
    out.parent.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(source / "images", out.parent.resolve())
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(to_record(r, f"{rel}/{r['id']}.jpg"), ensure_ascii=False) + "\n")
    os.replace(tmp, out)
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
