"""The one atomic-write helper: a file is replaced whole or not at all.

Writers write a temporary file beside the target (same folder, so the rename stays on one
filesystem), flush it to disk, and rename it over the target; a reader or a crash sees the old
file or the new one, never half of either. A leaf module: it imports nothing of Vitrine's.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path


def _tmp_for(path: Path) -> Path:
    # unique per process and thread: concurrent writers of one target never share a temporary
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], *, fsync: bool = True) -> Iterator[Path]:
    """Yield a temporary path to write (by any library: safetensors, FAISS, ...); on success it is
    flushed and renamed over ``path``, on an exception removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_for(path)
    try:
        yield tmp
        if fsync:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, fsync: bool = True) -> None:
    with atomic_path(path, fsync=fsync) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8", fsync: bool = True) -> None:
    with atomic_path(path, fsync=fsync) as tmp:
        tmp.write_text(text, encoding=encoding)


def fsync_dir(folder: Path) -> None:
    """Flush a folder's entries (a rename into it) to disk; nothing when it cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
