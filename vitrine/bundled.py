"""The catalogues bundled with Vitrine, and how to read them.

- :func:`bundled_dir`: the full catalogue, ``data/fashion-small`` of a source checkout (see
  ``data/README.md``; 20,873 products), for training and evals. Not in the wheel.
- :func:`demo_dir`: the demo catalogue shipped in the package (``vitrine/resources/demo``;
  2,000 products covering every article type), what ``vitrine demo`` builds from.

A leaf module (it imports nothing else of Vitrine's but its errors and resources), so every layer that needs
the bundled data — ingest's converter, evals' protocols, intent's query generator — reads it
the same way without depending on each other.

``styles.csv`` columns: id, gender, masterCategory, subCategory, articleType, baseColour,
season, year, usage, productDisplayName. Titles may contain commas; the file was written by
a CSV writer, so they are quoted.
"""

from __future__ import annotations

import csv
import logging
from pathlib import Path

from vitrine import resources
from vitrine.errors import InvalidInput

log = logging.getLogger(__name__)

COLUMNS = ["id", "gender", "masterCategory", "subCategory", "articleType", "baseColour", "season", "year",
           "usage", "productDisplayName"]


def demo_dir() -> Path:
    """The demo catalogue shipped in the package (``styles.csv``, ``splits.csv``, ``images/``)."""
    return resources.demo_dir()


def bundled_dir() -> Path:
    """``data/fashion-small`` of this checkout (or of the working directory): the full catalogue."""
    for root in (Path(__file__).resolve().parents[1], Path.cwd()):
        d = root / "data" / "fashion-small"
        if (d / "styles.csv").is_file():
            return d
    raise InvalidInput("the full catalogue (data/fashion-small) is not here: it lives in a Vitrine source "
                       "checkout (run from there), or pass the catalogue folder explicitly; the installed "
                       "package ships the demo catalogue only")


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
