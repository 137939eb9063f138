"""Dataset adapters for evaluation and training: the bundled catalogue and qrels files."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitrine.encoders.encoder import MultimodalEncoder
from vitrine.errors import InvalidInput
from vitrine.bundled import bundled_dir, read_splits, read_styles

log = logging.getLogger(__name__)


@dataclass
class Catalog:
    """The bundled catalogue's rows, splits and (lazily) backbone features."""

    source: Path
    rows: list[dict[str, str]]
    splits: dict[str, str]
    _image: np.ndarray | None = None
    _text: np.ndarray | None = None
    _key: str | None = None

    @classmethod
    def load(cls, source: Path | None = None, limit_ids: set[str] | None = None) -> "Catalog":
        source = Path(source) if source else bundled_dir()
        rows = read_styles(source)
        if limit_ids is not None:
            rows = [r for r in rows if r["id"] in limit_ids]
        return cls(source=source, rows=rows, splits=read_splits(source))

    @property
    def ids(self) -> list[str]:
        return [r["id"] for r in self.rows]

    @property
    def titles(self) -> list[str]:
        return [r["productDisplayName"] for r in self.rows]

    def split_mask(self, split: str) -> np.ndarray:
        return np.array([self.splits.get(r["id"]) == split for r in self.rows])

    def photo(self, pid: str) -> bytes:
        return (self.source / "images" / f"{pid}.jpg").read_bytes()

    def features(self, encoder: MultimodalEncoder, *, progress: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Backbone (image, title) features of every row, from the encoder's cache when present."""
        if self._key != encoder.towers.key or self._image is None or self._text is None:  # set together
            photos = [self.photo(pid) for pid in self.ids]
            self._image = encoder.image_features(photos, progress=progress)
            self._text = encoder.text_features(self.titles, progress=progress)
            self._key = encoder.towers.key
        return self._image, self._text

    def view_features(self, encoder: MultimodalEncoder, views: Sequence[str], rows: np.ndarray, *,
                      progress: bool = True, shares: dict[str, float] | None = None, seed: int = 0) -> np.ndarray:
        """Backbone features of augmented views (``flip``, ``crop<N>``, ...) of these rows' photos,
        (views, rows, image_dim), for training; cached like the plain features. Each photo is
        read once for all views. ``shares``: a view made for a seeded share of the rows only
        (the other rows' are NaN)."""
        photos = [self.photo(self.rows[int(r)]["id"]) for r in rows]
        out = np.full((len(views), len(photos), encoder.towers.image_dim), np.nan, dtype=np.float32)
        for i, view in enumerate(views):
            share = (shares or {}).get(view, 1.0)
            if share >= 1.0:
                out[i] = encoder.image_features(photos, progress=progress, view=view)
                continue
            pick = np.sort(np.random.default_rng(seed).permutation(len(photos))[: int(round(share * len(photos)))])
            out[i, pick] = encoder.image_features([photos[j] for j in pick], progress=progress, view=view)
        return out

    def title_groups(self) -> np.ndarray:
        """Integer label per row; rows with identical titles share it."""
        ids: dict[str, int] = {}
        return np.array([ids.setdefault(t, len(ids)) for t in self.titles], dtype=np.int64)


@dataclass
class EvalQuery:
    qid: str
    text: str | None
    image: bytes | None
    relevant: dict[str, float]
    meta: dict[str, Any] = field(default_factory=dict)


def load_qrels(path: str | Path) -> list[EvalQuery]:
    """Eval queries JSONL: ``{"qid", "text"?, "image"?, "relevant": {"product_id": grade}}``.

    ``image`` is a path relative to the queries file, or base64 under ``image_b64``.
    """
    from vitrine.search.models import decode_b64

    path = Path(path)
    if not path.is_file():
        raise InvalidInput(f"queries file {path} does not exist")
    out: list[EvalQuery] = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise InvalidInput(f"{path}:{n}: not valid JSON: {e.msg}") from e
            if not isinstance(obj, dict) or "qid" not in obj or not isinstance(obj.get("relevant"), dict):
                raise InvalidInput(f"{path}:{n}: a query needs 'qid' and a 'relevant' object")
            img = None
            if obj.get("image"):
                ip = (path.parent / obj["image"]).resolve()
                if not ip.is_relative_to(path.parent.resolve()):
                    raise InvalidInput(f"{path}:{n}: image path points outside the queries folder")
                img = ip.read_bytes()
            elif obj.get("image_b64"):
                img = decode_b64(obj["image_b64"])
            if not obj.get("text") and img is None:
                raise InvalidInput(f"{path}:{n}: a query needs text or an image")
            out.append(EvalQuery(
                qid=str(obj["qid"]), text=obj.get("text"), image=img,
                relevant={str(k): float(v) for k, v in obj["relevant"].items()},
                meta={k: v for k, v in obj.items() if k not in {"qid", "text", "image", "image_b64", "relevant"}},
            ))
    if not out:
        raise InvalidInput(f"{path} holds no queries")
    return out
