"""Indexes kept with each snapshot version beside the vectors, graph and filters that
:class:`~vitrine.search.state.IndexState` writes itself: the record store's in-memory BM25 postings
(``bm25.varr``) and the catalogue's suggestion index (``suggestions.varr``, vitrine/search/suggestions.py).

Each part names its file and gives a writer: called with the path in the version being published,
it writes the file and returns (its SHA-256, a note for the manifest's ``parts``), or None to keep
nothing this time. Opening a data dir, a part reads its file back from the version the indexes were
loaded from (:meth:`SnapshotParts.opened`); a version without it (older ones) means building it from
the records, as before. Rebuilding these reads every product: minutes at 1M, where loading them is
seconds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vitrine.errors import StorageError
from vitrine.index.bm25 import MemoryBM25
from vitrine.index.snapshots import Snapshot
from vitrine.index.store import RecordStoreAPI

log = logging.getLogger(__name__)

TEXT_INDEX_FILE = "bm25.varr"  # the record store's in-memory BM25 postings (SQLite stores)
PartWriter = Callable[[Path], "tuple[str, dict[str, Any]] | None"]


class SnapshotParts:
    """The parts kept with each snapshot version, and the version the data dir was opened from."""

    def __init__(self) -> None:
        self._writers: dict[str, PartWriter] = {}
        self.opened_from: Snapshot | None = None  # set by recovery (vitrine/search/recovery.py)

    def add(self, name: str, write: PartWriter) -> None:
        """Keep file ``name`` (written by ``write``) with every snapshot version from now on."""
        self._writers[name] = write

    def write(self, folder: Path) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
        """Write every part into a version being published: (file -> SHA-256, file -> note)."""
        files: dict[str, str] = {}
        notes: dict[str, dict[str, Any]] = {}
        for name, write in self._writers.items():
            got = write(folder / name)
            if got is not None:
                files[name], notes[name] = got
        return files, notes

    def opened(self, name: str) -> tuple[Path, str, dict[str, Any]] | None:
        """File ``name`` of the version the indexes were opened from (path, SHA-256, its note), or
        None when that version has none."""
        snap = self.opened_from
        m = (snap.manifest or {}) if snap is not None else {}
        if snap is None or name not in (m.get("files") or {}):
            return None
        return snap.file(name), snap.sha256(name), dict((m.get("parts") or {}).get(name) or {})


def keep_text_index(parts: SnapshotParts, records: RecordStoreAPI, built: Callable[[], None]) -> None:
    """Keep ``records``' in-memory BM25 postings (if it has them) with the snapshots; ``built`` is
    told when they are built from the full-text index (a new version is then worth writing)."""
    bm = records.text_index(build=False)
    if not isinstance(bm, MemoryBM25):
        return
    bm.on_rebuilt = built

    def write(path: Path) -> tuple[str, dict[str, Any]] | None:
        current = records.text_index(build=False)  # the store's own, adopted after a fork or not
        return current.save(path) if isinstance(current, MemoryBM25) else None

    parts.add(TEXT_INDEX_FILE, write)


def load_text_index(parts: SnapshotParts, records: RecordStoreAPI) -> bool:
    """Serve the BM25 postings kept with the version the indexes were opened from (the changes after
    them are read before the next query). Returns whether there were any to load."""
    part = parts.opened(TEXT_INDEX_FILE)
    bm = records.text_index(build=False)
    if part is None or not isinstance(bm, MemoryBM25):
        return False
    try:
        bm.load(part[0], part[1])
        return True
    except StorageError as e:
        log.warning("BM25 postings of snapshot %s not used (built from the full-text index instead): %s",
                    part[0].parent.name, e)
        return False
