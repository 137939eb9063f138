"""The backbone feature cache: tower outputs keyed by (towers key, content hash), in one SQLite file.

It sits below both :mod:`vitrine.encoders.encoder` (which caches photo and text features) and
:mod:`vitrine.encoders.lora` (which caches image-stage activations for LoRA training), so
neither has to import the other for it.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from vitrine.sqlite import connect_wal


class FeatureCache:
    """Backbone features keyed by (towers key, content hash), in one SQLite file.

    Re-ingesting a catalogue, retraining an adapter or re-running an eval never re-runs the
    towers on the same photo or text. Values are float16 arrays stored as raw bytes.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        with self._conn() as c:
            c.execute("CREATE TABLE IF NOT EXISTS feats (key TEXT PRIMARY KEY, dim INTEGER, vec BLOB)")

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect_wal(self.path)
            self._local.conn = conn
        return conn

    def get_many(self, keys: Sequence[str]) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        conn = self._conn()
        for i in range(0, len(keys), 500):
            chunk = list(keys[i:i + 500])
            q = f"SELECT key, dim, vec FROM feats WHERE key IN ({','.join('?' * len(chunk))})"
            for key, dim, blob in conn.execute(q, chunk):
                out[key] = np.frombuffer(blob, dtype=np.float16, count=dim).astype(np.float32)
        return out

    def put_many(self, items: Iterable[tuple[str, np.ndarray]]) -> None:
        rows = [(k, int(v.shape[-1]), np.asarray(v, dtype=np.float16).tobytes()) for k, v in items]
        if rows:
            conn = self._conn()
            with conn:
                conn.executemany("INSERT OR REPLACE INTO feats (key, dim, vec) VALUES (?, ?, ?)", rows)
