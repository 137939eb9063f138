"""The bundled catalogue (Fashion Product Images, Small) -> Vitrine's JSONL catalogue format.

Reading ``styles.csv``/``splits.csv`` lives in :mod:`vitrine.bundled`; this module converts.

Ingest reads a catalogue's photos only from inside the JSONL's folder (no path traversal), so a
JSONL written outside the source folder gets its photos beside it: hard-linked into ``images/``
next to the file (no bytes copied), copied where linking fails (another filesystem, no right to
link). A JSONL written where the source's ``images/`` lies inside its folder names them in place.
"""

from __future__ import annotations

import filecmp
import json
import logging
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vitrine.atomic import atomic_path
from vitrine.bundled import read_styles
from vitrine.errors import InvalidInput

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


@dataclass
class PlacedPhotos:
    """What :func:`place_photos` did with each product's photo."""

    linked: int = 0
    copied: int = 0
    kept: int = 0  # already there, the same file
    missing: int = 0  # no photo in the source (the record still names one: ingest reports it)


def place_photos(images: Path, dest: Path, ids: Iterable[str]) -> PlacedPhotos:
    """Put ``images/<id>.jpg`` of each id into ``dest``: a hard link, or a copy once linking fails.

    Each file is written under a temporary name and renamed into place, so a photo already in
    ``dest`` is replaced whole; one that is the same file (or the same bytes) is kept."""
    dest.mkdir(parents=True, exist_ok=True)
    placed = PlacedPhotos()
    link = True
    for pid in ids:
        src, dst = images / f"{pid}.jpg", dest / f"{pid}.jpg"
        if not src.is_file():
            placed.missing += 1
            continue
        if dst.is_file() and (os.path.samefile(src, dst) or filecmp.cmp(src, dst, shallow=True)):
            placed.kept += 1
            continue
        tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)
        try:
            if link:
                try:
                    os.link(src, tmp)
                    placed.linked += 1
                except OSError as e:  # another filesystem, or no right to link: copy from now on
                    log.info("cannot hard-link photos from %s into %s (%s): copying them", images, dest, e)
                    link = False
            if not link:
                shutil.copy2(src, tmp)
                placed.copied += 1
            os.replace(tmp, dst)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise InvalidInput(f"cannot place photo {src} in {dest}: {e}") from e
    if placed.missing:
        log.warning("%d products have no photo in %s", placed.missing, images)
    return placed


def photo_prefix(source: Path, out: Path, ids: Iterable[str], *, photo_base: Path | None = None) -> str:
    """The folder, relative to ``photo_base`` (default: ``out``'s folder), that the photo paths of a
    JSONL at ``out`` name; the photos are placed there first when the source's lie outside it.

    Ingest reads photos only inside the folder it is given, so no path this returns leaves it."""
    images = (Path(source) / "images").resolve()
    base = Path(photo_base or Path(out).parent).resolve()
    if images.is_relative_to(base):
        return images.relative_to(base).as_posix()
    if photo_base is not None:
        raise InvalidInput(f"the photos {images} lie outside {base}, the folder their paths are read from")
    dest = base / "images"
    if dest.exists() and not dest.resolve().is_relative_to(base):
        raise InvalidInput(f"{Path(out).parent / 'images'} leads outside the folder of {out} (a link?): ingest "
                           f"would refuse its photos; remove it or write the catalogue elsewhere")
    placed = place_photos(images, dest, ids)
    log.info("photos in %s: %d hard-linked, %d copied, %d already there", dest, placed.linked, placed.copied,
             placed.kept)
    return "images"


def convert(source: Path, out: Path, ids: Iterable[str] | None = None, *, photo_base: Path | None = None) -> int:
    """Write the catalogue as JSONL at ``out``, photo paths relative to ``photo_base`` (default:
    ``out``'s folder, where the photos are placed unless the source's already lie inside it:
    :func:`photo_prefix`)."""
    source, out = Path(source), Path(out)
    rows = styles_of(source, ids)
    out.parent.mkdir(parents=True, exist_ok=True)
    rel = photo_prefix(source, out, [r["id"] for r in rows], photo_base=photo_base)
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
    for r in sorted(rows, key=lambda r: int(r["id"]) if r["id"].isdecimal() else 0):
        by_type.setdefault(r["articleType"], []).append(r["id"])
    chosen: list[str] = []
    # round-robin over article types, in proportion to their size
    total = len(rows)
    for ids in by_type.values():
        take = max(1, round(n * len(ids) / total))
        step = max(1, len(ids) // take)
        chosen.extend(ids[::step][:take])
    return chosen[:n]
