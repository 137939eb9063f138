"""The file of one vector index (``*.vidx``), laid out so that every process can map it.

Layout (format 2, little-endian)::

    [the FAISS index as faiss.serialize_index writes it; absent while the index has none]
    [zeros to a 4 KiB boundary] [vectors: n x dim float32] [zeros] [ids: n int64] [zeros]
    [JSON: the index's meta and where each array lies] [u64: the JSON's length] [MAGIC]

FAISS reads an index from the start of a file and stops where it ends, so
``faiss.read_index(path, IO_FLAG_MMAP_IFC | IO_FLAG_READ_ONLY)`` maps the index's codes straight
from this file, and the float32 rows are a read-only ``numpy.memmap`` at their offset: the
processes serving one snapshot on a host (``serve --workers N``) share one copy of both in the
page cache instead of holding one each. A mapped FAISS index must never be added to (FAISS aborts
the process); :class:`~vitrine.index.vectors.VectorIndex` copies it into memory before it does.

The whole file is checked against its SHA-256 (streamed, not read into memory) before it is used.
Format 1 (an ``.npz`` with the same arrays and the FAISS blob) is still read, into memory.

The same layout without the FAISS part holds the other indexes a snapshot keeps as arrays (the
filter columns, the BM25 postings, the suggestion index): :func:`write_arrays` / :func:`read_arrays`,
named arrays and a JSON meta, with a magic of their own. Reading them is a few large reads, where
rebuilding them reads every record (minutes at 1M products).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from vitrine.atomic import atomic_path
from vitrine.errors import StorageError

FORMAT_VERSION = 2
MAGIC = b"VIDX\x02\x00\x00\x00"
ARRAYS_MAGIC = b"VARR\x01\x00\x00\x00"
ALIGN = 4096
_TRAILER = struct.Struct("<Q8s")
_CHUNK = 64 * 2**20


@dataclass
class VectorFile:
    """What a vector index file holds: its meta (dim, factory, n, indexed, nprobe, ef_search),
    rows, their ids, and the FAISS index (None when it had none)."""

    meta: dict[str, Any]
    vectors: np.ndarray
    ids: np.ndarray
    index: Any
    mapped: bool


def _faiss() -> Any:
    try:
        import faiss
    except ImportError as e:  # pragma: no cover - faiss-cpu is a core dependency
        raise StorageError("the vector index needs FAISS: pip install faiss-cpu (or faiss-gpu)") from e
    return faiss


class _HashingWriter:
    def __init__(self, f: BinaryIO) -> None:
        self.f, self.h, self.pos = f, hashlib.sha256(), 0

    def write(self, data: bytes | memoryview) -> None:
        self.h.update(data)
        self.f.write(data)
        self.pos += len(data)

    def pad(self) -> None:
        if self.pos % ALIGN:
            self.write(b"\0" * (ALIGN - self.pos % ALIGN))

    def array(self, a: np.ndarray) -> dict[str, Any]:
        self.pad()
        spec = {"offset": self.pos, "dtype": a.dtype.str, "shape": list(a.shape)}
        flat = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        for s in range(0, len(flat), _CHUNK):
            self.write(flat[s:s + _CHUNK].data)
        return spec


def write(path: str | os.PathLike[str], meta: dict[str, Any], vectors: np.ndarray, ids: np.ndarray,
          index: Any) -> str:
    """Write one index file atomically (temp file, fsync, rename); returns its SHA-256."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        w = _HashingWriter(f)
        if index is not None:
            w.write(_faiss().serialize_index(index).data)
        arrays = {"vectors": w.array(np.asarray(vectors, dtype=np.float32)),
                  "ids": w.array(np.asarray(ids, dtype=np.int64))}
        w.pad()
        trailer = json.dumps({**meta, "format": FORMAT_VERSION, "faiss": index is not None,
                              "arrays": arrays}).encode()
        w.write(trailer)
        w.write(_TRAILER.pack(len(trailer), MAGIC))
        f.flush()
        return w.h.hexdigest()


def verify(path: Path, expected_sha256: str | None, what: str) -> None:
    """StorageError unless ``path`` is readable and (when given) matches its SHA-256."""
    try:
        with open(path, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest() if expected_sha256 else None
    except OSError as e:
        raise StorageError(f"cannot read {what} {path}: {e}") from e
    if expected_sha256 and digest != expected_sha256:
        raise StorageError(f"{what} {path} failed its checksum")


def read(path: str | os.PathLike[str], expected_sha256: str | None = None, *, mmap: bool = True) -> VectorFile:
    """Read (``mmap``: map) an index file checked against ``expected_sha256``."""
    path = Path(path)
    verify(path, expected_sha256, "vector index")
    try:
        with open(path, "rb") as f:
            head = f.read(2)
            body = _trailer(f, MAGIC)
        if body is None:
            if head == b"PK":
                return _read_npz(path)
            raise ValueError("not a vector index file")
        meta = json.loads(body.decode())
        arrays = meta.pop("arrays")
        vectors = _array(path, arrays["vectors"], mmap=mmap)
        ids = _array(path, arrays["ids"], mmap=False)
        index = None
        if meta.pop("faiss"):
            faiss = _faiss()
            if mmap:
                index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY)
            else:
                index = faiss.read_index(str(path))
    except (ValueError, KeyError, OSError, RuntimeError) as e:
        raise StorageError(f"vector index {path} is unreadable: {e}") from e
    return VectorFile(meta, vectors, ids, index, mapped=mmap and isinstance(vectors, np.memmap))


def _trailer(f: BinaryIO, magic: bytes) -> bytes | None:
    """The JSON trailer of an open file that ends with ``magic`` (None: it ends otherwise)."""
    size = f.seek(0, os.SEEK_END)
    if size < _TRAILER.size:
        raise ValueError("too short")
    f.seek(size - _TRAILER.size)
    length, found = _TRAILER.unpack(f.read(_TRAILER.size))
    if found != magic:
        return None
    f.seek(size - _TRAILER.size - length)
    return f.read(length)


def verify_many(files: Sequence[tuple[Path, str]], what: str, threads: int = 2) -> None:
    """:func:`verify` several files at once (SHA-256 runs without the GIL): a 1M-product snapshot's
    5 GB of vector files are checked in about half the time. Raises the first file's StorageError."""
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(files)))) as pool:
        for done in [pool.submit(verify, p, sha, what) for p, sha in files]:
            done.result()


def _array(path: Path, spec: dict[str, Any], *, mmap: bool) -> np.ndarray:
    dtype, shape = np.dtype(spec["dtype"]), tuple(spec["shape"])
    count = int(np.prod(shape))
    if mmap and count:
        return np.memmap(path, dtype=dtype, mode="r", offset=int(spec["offset"]), shape=shape)
    out = np.fromfile(path, dtype=dtype, count=count, offset=int(spec["offset"]))
    if len(out) != count:
        raise ValueError(f"truncated: {len(out)} of {count} values")
    return out.reshape(shape)


def _read_npz(path: Path) -> VectorFile:
    """Format 1: an .npz with meta, vectors, ids and the FAISS blob, read into memory."""
    with np.load(io.BytesIO(path.read_bytes()), allow_pickle=False) as z:
        meta = json.loads(bytes(z["meta"]).decode())
        vectors = np.array(z["vectors"], dtype=np.float32)
        ids = np.array(z["ids"], dtype=np.int64)
        blob = np.array(z["faiss"]) if "faiss" in z.files else None
    if meta.get("format") != 1:
        raise StorageError(f"vector index {path} has format {meta.get('format')}, expected 1 or {FORMAT_VERSION}")
    index = _faiss().deserialize_index(blob) if blob is not None else None
    return VectorFile(meta, vectors, ids, index, mapped=False)


def write_arrays(path: str | os.PathLike[str], meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> str:
    """Write named arrays and a JSON-able ``meta`` to one file atomically; returns its SHA-256."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        w = _HashingWriter(f)
        specs = {name: w.array(np.asarray(a)) for name, a in arrays.items()}
        w.pad()
        trailer = json.dumps({"meta": meta, "arrays": specs}).encode()
        w.write(trailer)
        w.write(_TRAILER.pack(len(trailer), ARRAYS_MAGIC))
        f.flush()
        return w.h.hexdigest()


def is_array_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` ends as :func:`write_arrays` ends its files (OSError when unreadable)."""
    with open(path, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - len(ARRAYS_MAGIC)))
        return f.read() == ARRAYS_MAGIC


def read_arrays(path: str | os.PathLike[str], expected_sha256: str | None = None, *,
                what: str = "index file") -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The meta and arrays :func:`write_arrays` wrote (read into memory, writable), checked against
    ``expected_sha256``; StorageError when unreadable or damaged."""
    path = Path(path)
    verify(path, expected_sha256, what)
    try:
        with open(path, "rb") as f:
            trailer = _trailer(f, ARRAYS_MAGIC)
        if trailer is None:
            raise ValueError("not an array file")
        body = json.loads(trailer.decode())
        arrays = {name: _array(path, spec, mmap=False) for name, spec in body["arrays"].items()}
        return body["meta"], arrays
    except (ValueError, KeyError, TypeError, OSError) as e:
        raise StorageError(f"{what} {path} is unreadable: {e}") from e
