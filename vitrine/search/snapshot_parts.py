"""Indexes kept with each snapshot version beside the vectors, graph and filters that
:class:`~vitrine.search.state.IndexState` writes itself: the record store's in-memory BM25 postings
(``bm25.varr``) and the catalogue's suggestion index (``suggestions.varr``, vitrine/search/suggestions.py).

Each part names its file and gives two callables: ``current()``, what the part is now (an object
that is the same, ``is``-identical or equal, exactly while its content is: the suggestion index
object, the BM25 postings with the change they reflect; None: nothing to keep), and
``write(path)``, which writes the file and returns (its SHA-256, a note for the manifest's
``parts``). A part unchanged since the file an earlier version kept (written, or loaded when the data
dir opened) is hard-linked from that version instead of written again: versions never change their
files. Opening a data dir, a part reads its file back from the version the indexes were loaded from
(:meth:`SnapshotParts.opened`, then :meth:`SnapshotParts.loaded`); a version without it (older ones)
means building it from the records, as before. Rebuilding these reads every product: minutes at 1M,
where loading them is seconds.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vitrine.errors import StorageError
from vitrine.index.bm25 import MemoryBM25
from vitrine.index.snapshots import Snapshot, SnapshotStore
from vitrine.index.store import RecordStoreAPI

log = logging.getLogger(__name__)

TEXT_INDEX_FILE = "bm25.varr"  # the record store's in-memory BM25 postings (SQLite stores)
PartWriter = Callable[[Path], "tuple[str, dict[str, Any]] | None"]


class SnapshotParts:
    """The parts kept with each snapshot version, and the version the data dir was opened from."""

    def __init__(self, store: SnapshotStore) -> None:
        self.store = store
        self._parts: dict[str, tuple[Callable[[], object | None], PartWriter]] = {}
        self._kept: dict[str, tuple[object, str, dict[str, Any]]] = {}  # name -> (what, SHA-256, note) last kept
        self.opened_from: Snapshot | None = None  # set by recovery (vitrine/search/recovery.py)

    def add(self, name: str, current: Callable[[], object | None], write: PartWriter) -> None:
        """Keep file ``name`` with every snapshot version from now on (see the module docstring)."""
        self._parts[name] = (current, write)

    def loaded(self, name: str, what: object, sha256: str, note: dict[str, Any]) -> None:
        """The part is ``what`` as read from the opened version's file (so an unchanged one is linked)."""
        self._kept[name] = (what, sha256, note)

    def write(self, folder: Path) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
        """Write (or link) every part into a version being published: (file -> SHA-256, file -> note)."""
        files: dict[str, str] = {}
        notes: dict[str, dict[str, Any]] = {}
        for name, (current, write) in self._parts.items():
            what = current()
            if what is None:
                continue
            kept = self._kept.get(name)
            if kept is not None and (kept[0] is what or kept[0] == what) and self._link(name, kept[1], folder / name):
                files[name], notes[name] = kept[1], kept[2]
                continue
            got = write(folder / name)
            if got is not None:
                files[name], notes[name] = got
                self._kept[name] = (what, *got)
        return files, notes

    def _link(self, name: str, sha256: str, path: Path) -> bool:
        """Hard-link file ``name`` with this SHA-256 from a published version to ``path``. False when
        no version keeps it (pruned) or it cannot be linked (another file system)."""
        for snap in self.store.versions():
            if ((snap.manifest or {}).get("files") or {}).get(name) == sha256:
                try:
                    os.link(snap.file(name), path)
                    return True
                except OSError:
                    return False
        return False

    def opened(self, name: str) -> tuple[Path, str, dict[str, Any]] | None:
        """File ``name`` of the version the indexes were opened from (path, SHA-256, its note), or
        None when that version has none."""
        snap = self.opened_from
        m = (snap.manifest or {}) if snap is not None else {}
        if snap is None or name not in (m.get("files") or {}):
            return None
        return snap.file(name), snap.sha256(name), dict((m.get("parts") or {}).get(name) or {})


def _text_index(records: RecordStoreAPI) -> MemoryBM25 | None:
    bm = records.text_index(build=False)  # the store's own, adopted after a fork or not
    return bm if isinstance(bm, MemoryBM25) else None


def keep_text_index(parts: SnapshotParts, records: RecordStoreAPI, built: Callable[[], None]) -> None:
    """Keep ``records``' in-memory BM25 postings (if it has them) with the snapshots; ``built`` is
    told when they are built from the full-text index (a new version is then worth writing)."""
    bm = _text_index(records)
    if bm is None:
        return
    bm.on_rebuilt = built

    def current() -> object | None:
        now = _text_index(records)
        return (now, now.seq) if now is not None and now.built else None  # the postings change with seq

    def write(path: Path) -> tuple[str, dict[str, Any]] | None:
        now = _text_index(records)
        return now.save(path) if now is not None else None

    parts.add(TEXT_INDEX_FILE, current, write)


def load_text_index(parts: SnapshotParts, records: RecordStoreAPI) -> bool:
    """Serve the BM25 postings kept with the version the indexes were opened from (the changes after
    them are read before the next query). Returns whether there were any to load."""
    part = parts.opened(TEXT_INDEX_FILE)
    bm = _text_index(records)
    if part is None or bm is None:
        return False
    try:
        bm.load(part[0], part[1])
    except StorageError as e:
        log.warning("BM25 postings of snapshot %s not used (built from the full-text index instead): %s",
                    part[0].parent.name, e)
        return False
    parts.loaded(TEXT_INDEX_FILE, (bm, bm.seq), part[1], part[2])
    return True
