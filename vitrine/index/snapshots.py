"""Versioned index snapshots: a manifest naming a consistent set of files, published atomically.

Layout of a data dir's ``index/`` folder::

    snapshots/v00000012/manifest.json   one version: its manifest and the files it names
    snapshots/v00000012/fused.vidx      (vector indexes, the graph, ...), each with its SHA-256
    snapshots/.tmp-v00000013-4711/      a version being written (or left by a crash: ignored)
    manifest.json                       the newest version's manifest plus ``"dir"`` (for tools)
    .lock                               flock: one writer at a time, across processes

Publishing a version: every file is written into a fresh ``.tmp-*`` folder (each written to a
temp name, fsynced, renamed), the manifest last; the folder is fsynced and renamed to its version
name in one atomic step, its parent fsynced; then the pointer ``manifest.json`` is replaced
atomically and versions beyond the newest ``keep`` are removed. A crash at any point leaves every
published version intact: the half-written folder is never read (it has no version name) and the
next publish sweeps it away.

Loading is the caller's: :meth:`SnapshotStore.candidates` lists versions newest first (and a
pre-versioned layout last), and the caller verifies each file against the manifest's SHA-256 as it
loads it, falling back to the previous version when one is refused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitrine.atomic import atomic_write_bytes, fsync_dir
from vitrine.errors import StorageError

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT = 2
_VERSION_RE = re.compile(r"^v(\d{8,})$")
_TMP_PREFIX = ".tmp-"


def version_name(n: int) -> str:
    return f"v{n:08d}"


@dataclass
class Snapshot:
    """One stored version (or the pre-versioned layout, version 0)."""

    version: int
    path: Path
    manifest: dict[str, Any] | None = None
    error: str | None = None  # why its manifest could not be read
    legacy: bool = False

    @property
    def name(self) -> str:
        return "legacy" if self.legacy else version_name(self.version)

    def file(self, name: str) -> Path:
        if "/" in name or "\\" in name or name.startswith("."):
            raise StorageError(f"snapshot {self.name} names a bad file {name!r}")
        return self.path / name

    def sha256(self, name: str) -> str:
        """The manifest's SHA-256 for ``name``; StorageError when the manifest does not list it."""
        files = (self.manifest or {}).get("files") or {}
        sha = files.get(name)
        if not isinstance(sha, str) or len(sha) != 64:
            raise StorageError(f"snapshot {self.name}: its manifest lists no checksum for {name}")
        return sha

    def summary(self) -> dict[str, Any]:
        m = self.manifest or {}
        return {"version": self.name, "seq": m.get("seq"), "count": m.get("count"), "model_key": m.get("model_key"),
                "factory": m.get("factory"), "created": m.get("created"), "error": self.error}


@dataclass
class Publish:
    """A version being written: put files under :attr:`dir`, then :meth:`commit` the manifest."""

    store: "SnapshotStore"
    version: int
    dir: Path
    committed: Snapshot | None = None
    sizes: dict[str, int] = field(default_factory=dict)

    def commit(self, manifest: dict[str, Any]) -> Snapshot:
        files = manifest.get("files") or {}
        for name in files:
            p = self.dir / name
            if not p.is_file():
                raise StorageError(f"snapshot {version_name(self.version)}: {name} was not written")
            self.sizes[name] = p.stat().st_size
        body = {"format": FORMAT, "version": self.version, **manifest, "sizes": self.sizes,
                "created": manifest.get("created", time.time())}
        atomic_write_bytes(self.dir / MANIFEST, json.dumps(body, indent=2, sort_keys=True).encode())
        fsync_dir(self.dir)
        final = self.store.snapshots_dir / version_name(self.version)
        os.rename(self.dir, final)  # atomic: the version appears whole or not at all
        fsync_dir(self.store.snapshots_dir)
        pointer = dict(body, dir=f"snapshots/{final.name}")
        atomic_write_bytes(self.store.root / MANIFEST, json.dumps(pointer, indent=2, sort_keys=True).encode())
        self.committed = Snapshot(self.version, final, body)
        return self.committed


class SnapshotStore:
    """The versioned snapshots of one ``index/`` folder."""

    def __init__(self, root: str | os.PathLike[str], keep: int = 3) -> None:
        self.root = Path(root)
        self.snapshots_dir = self.root / "snapshots"
        self.keep = max(1, int(keep))

    # -- reading -----------------------------------------------------------------------------------
    def versions(self) -> list[Snapshot]:
        """Published versions, newest first (manifest parsed; ``error`` says why it could not be)."""
        out: list[Snapshot] = []
        if not self.snapshots_dir.is_dir():
            return out
        for p in self.snapshots_dir.iterdir():
            m = _VERSION_RE.match(p.name)
            if not m or not p.is_dir():
                continue
            snap = Snapshot(int(m.group(1)), p)
            try:
                snap.manifest = json.loads((p / MANIFEST).read_text(encoding="utf-8"))
                if not isinstance(snap.manifest, dict) or not isinstance(snap.manifest.get("files"), dict):
                    raise ValueError("not a snapshot manifest")
            except (OSError, ValueError) as e:
                snap.manifest, snap.error = None, f"manifest unreadable: {e}"
            out.append(snap)
        out.sort(key=lambda s: -s.version)
        return out

    def legacy(self) -> Snapshot | None:
        """The pre-versioned layout (files and manifest directly in ``index/``), if present."""
        path = self.root / MANIFEST
        if not path.is_file():
            return None
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            return Snapshot(0, self.root, None, f"manifest unreadable: {e}", legacy=True)
        if not isinstance(manifest, dict) or "dir" in manifest:
            return None  # the pointer of the versioned layout
        return Snapshot(0, self.root, manifest, legacy=True)

    def candidates(self) -> list[Snapshot]:
        """Everything a loader may try, in order: versions newest first, then the legacy layout."""
        out = self.versions()
        leg = self.legacy()
        if leg is not None:
            out.append(leg)
        return out

    def partials(self) -> list[Path]:
        """Folders of versions that were being written (by a live writer, or one that crashed)."""
        if not self.snapshots_dir.is_dir():
            return []
        return sorted(p for p in self.snapshots_dir.iterdir() if p.name.startswith(_TMP_PREFIX))

    def latest_version(self) -> int:
        vs = self.versions()
        return vs[0].version if vs else 0

    # -- writing -----------------------------------------------------------------------------------
    @contextmanager
    def lock(self, *, blocking: bool = True) -> Iterator[bool]:
        """An exclusive advisory lock on the folder (POSIX flock; a no-op elsewhere). Yields
        whether it is held (always True when blocking)."""
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            yield True
            return
        with open(self.root / ".lock", "a+b") as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    @contextmanager
    def publish(self) -> Iterator[Publish]:
        """Write a new version: yields a :class:`Publish` whose folder takes the files; call its
        ``commit(manifest)`` before leaving. Leaving without a commit (or with an error) discards
        the folder; a crash leaves it behind, ignored, for the next publish to sweep."""
        with self.lock():
            self.snapshots_dir.mkdir(parents=True, exist_ok=True)
            self.sweep_partials()
            version = max(self.latest_version(), _pointer_version(self.root)) + 1
            tmp = self.snapshots_dir / f"{_TMP_PREFIX}{version_name(version)}-{os.getpid()}"
            tmp.mkdir()
            pub = Publish(self, version, tmp)
            try:
                yield pub
            finally:
                if pub.committed is None:
                    shutil.rmtree(tmp, ignore_errors=True)
            if pub.committed is not None:
                self.prune(protect=pub.committed.version)

    def sweep_partials(self) -> list[str]:
        """Remove half-written versions (caller holds the lock, so no writer is mid-way)."""
        gone = []
        for p in self.partials():
            shutil.rmtree(p, ignore_errors=True)
            gone.append(p.name)
        if gone:
            log.info("removed %d half-written snapshot folder(s) left by a crash: %s", len(gone), ", ".join(gone))
        return gone

    def prune(self, protect: int | None = None) -> list[str]:
        """Keep the newest ``keep`` versions (and ``protect``); remove older ones and the legacy files."""
        removed = []
        for snap in self.versions()[self.keep:]:
            if snap.version == protect:
                continue
            shutil.rmtree(snap.path, ignore_errors=True)
            removed.append(snap.name)
        leg = self.legacy()
        if leg is not None or (self.root / MANIFEST).is_file():
            for name in ("fused.vidx", "image.vidx", "graph.json"):
                try:
                    (self.root / name).unlink()
                except FileNotFoundError:
                    pass
        if removed:
            fsync_dir(self.snapshots_dir)
        return removed


def read_verified(path: Path, expected_sha256: str | None, what: str) -> bytes:
    """A snapshot file's bytes; StorageError when unreadable or not matching its SHA-256."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise StorageError(f"cannot read {what} {path}: {e}") from e
    if expected_sha256 and hashlib.sha256(data).hexdigest() != expected_sha256:
        raise StorageError(f"{what} {path} failed its checksum")
    return data


def _pointer_version(root: Path) -> int:
    try:
        m = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
        return int(m.get("version", 0)) if isinstance(m, dict) and "dir" in m else 0
    except (OSError, ValueError, TypeError):
        return 0
