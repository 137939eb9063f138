"""Map a catalogue's category paths onto Google's product taxonomy, each with a confidence.

A catalogue brings its own category paths (any depth, any domain: ``Home > Living Room > Sofas``).
Each leaf path is placed on the taxonomy node whose full path reads most like it:

- **meaning**: cosine of the text tower's (MiniLM) vectors of the two paths, both written
  ``A > B > C``; the vectors are passed in (this layer never loads a model): the taxonomy's
  from a shipped file or computed once by the caller's ``embed``, the catalogue's by ``embed``;
- **words**: the share of the leaf's words the node's name holds, and of the path's words the
  node's path holds (plurals folded), weighted ``lexical_weight``.

The **confidence** is ``(score + margin - 0.6) / 0.5`` clipped to [0, 1], where ``margin`` is
the lead of the best node over the best node outside its own lineage (a parent or child of
the best node is no rival: ``Shoes`` vs ``Shoes > Boots`` agree). Below ``threshold`` the category
stays unmapped: its own node, no taxonomy proximity. A reviewed mapping (``category_map.csv``)
overrides all of this.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vitrine.errors import StorageError

log = logging.getLogger(__name__)

DEFAULT_THRESHOLD = 0.5
LEXICAL_WEIGHT = 0.1
_CONF_OFFSET, _CONF_SPAN = 0.6, 0.5
_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset({"and", "the", "of", "for", "a", "in", "with", "other", "misc", "miscellaneous"})

Embed = Callable[[list[str]], np.ndarray]


def path_text(path: Sequence[str]) -> str:
    """How a category path is written for the text tower: ``A > B > C``."""
    return " > ".join(" ".join(str(p).split()) for p in path)


def _stem(w: str) -> str:
    if w.endswith("ies") and len(w) > 4:
        return w[:-3] + "y"
    if w.endswith("es") and len(w) > 4 and w[-3] in "sxz":
        return w[:-2]
    if w.endswith("s") and len(w) > 3 and not w.endswith("ss"):
        return w[:-1]
    return w


def words(text: str) -> frozenset[str]:
    return frozenset(_stem(w) for w in _WORD.findall(text.casefold()) if w not in _STOP)


@dataclass(frozen=True)
class CategoryMapping:
    """Where one catalogue category sits on the taxonomy, and how sure that is."""

    category: str
    path: tuple[str, ...]
    taxonomy_id: int | None  # None: unmapped (below the threshold, or no taxonomy)
    confidence: float
    source: str  # "reviewed" (category_map.csv), "auto", "name" (same name, no vectors), "unmapped"
    best_id: int | None = None  # the best node even when below the threshold
    score: float = 0.0
    margin: float = 0.0
    runner_up_id: int | None = None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"] = list(self.path)
        return d


def confidence(score: float, margin: float) -> float:
    return float(min(1.0, max(0.0, (score + margin - _CONF_OFFSET) / _CONF_SPAN)))


class TaxonomyVectors:
    """Google taxonomy paths with their text-tower vectors (rows L2-normalised)."""

    def __init__(self, ids: Sequence[int], vectors: np.ndarray, tower: str) -> None:
        v = np.asarray(vectors, dtype=np.float32)
        if v.ndim != 2 or len(v) != len(ids):
            raise StorageError(f"taxonomy vectors: {v.shape} for {len(ids)} ids")
        self.ids = [int(i) for i in ids]
        self.vectors = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
        self.tower = tower

    @classmethod
    def compute(cls, taxonomy: Mapping[int, tuple[str, ...]], embed: Embed, tower: str) -> "TaxonomyVectors":
        ids = sorted(taxonomy)
        return cls(ids, embed([path_text(taxonomy[t]) for t in ids]), tower)

    def save(self, path: str | Path, taxonomy_sha256: str) -> None:
        """safetensors (float16) with the tower key and the taxonomy file's SHA-256 as metadata."""
        from safetensors.numpy import save_file

        Path(path).parent.mkdir(parents=True, exist_ok=True)
        save_file({"vectors": self.vectors.astype(np.float16), "ids": np.asarray(self.ids, dtype=np.int64)},
                  str(path), metadata={"tower": self.tower, "taxonomy_sha256": taxonomy_sha256,
                                       "text": "taxonomy path joined by ' > '"})

    @classmethod
    def load(cls, path: str | Path, tower: str, taxonomy_sha256: str) -> "TaxonomyVectors | None":
        """The shipped vectors, or None when missing or made by another tower or taxonomy."""
        from safetensors import safe_open

        p = Path(path)
        if not p.is_file():
            return None
        try:
            with safe_open(str(p), framework="numpy") as f:
                meta = f.metadata() or {}
                if meta.get("tower") != tower or meta.get("taxonomy_sha256") != taxonomy_sha256:
                    log.info("taxonomy vectors %s were made by %s for taxonomy %s; recomputing",
                             p, meta.get("tower"), str(meta.get("taxonomy_sha256"))[:12])
                    return None
                return cls(f.get_tensor("ids").tolist(), f.get_tensor("vectors"), tower)
        except (OSError, ValueError) as e:  # a damaged file: recompute
            log.warning("taxonomy vectors %s unreadable (%s); recomputing", p, e)
            return None


class TaxonomyMapper:
    """Maps category paths to taxonomy nodes (see the module's docstring).

    ``vectors`` is called once, on the first category that needs it (a catalogue the reviewed
    mapping covers never loads them); ``embed`` gives the text tower's vectors of texts."""

    def __init__(self, taxonomy: Mapping[int, tuple[str, ...]], vectors: Callable[[], TaxonomyVectors],
                 embed: Embed, *, threshold: float = DEFAULT_THRESHOLD,
                 lexical_weight: float = LEXICAL_WEIGHT, tower: str = "") -> None:
        self.taxonomy = taxonomy
        self.tower = tower
        self._vectors_fn = vectors
        self._vectors: TaxonomyVectors | None = None
        self.embed = embed
        self.threshold = threshold
        self.lexical_weight = lexical_weight
        self._cache: dict[tuple[str, ...], CategoryMapping] = {}
        self._lex: tuple[list[frozenset[str]], list[frozenset[str]]] | None = None
        self._lineage: dict[int, frozenset[int]] | None = None

    @property
    def identity(self) -> str:
        """What decides this mapper's answers (the graph's fingerprint holds it)."""
        return f"taxonomy-map-1|{self.tower}|{self.threshold}|{self.lexical_weight}"

    def _tax(self) -> TaxonomyVectors:
        if self._vectors is None:
            self._vectors = self._vectors_fn()
        return self._vectors

    def _lexicon(self) -> tuple[list[frozenset[str]], list[frozenset[str]]]:
        if self._lex is None:
            ids = self._tax().ids
            self._lex = ([words(self.taxonomy[t][-1]) for t in ids], [words(" ".join(self.taxonomy[t])) for t in ids])
        return self._lex

    def lineage(self, tid: int) -> frozenset[int]:
        """The node, its ancestors and its descendants."""
        if self._lineage is None:
            by_path = {p: t for t, p in self.taxonomy.items()}
            anc = {t: {by_path[p[:i]] for i in range(1, len(p) + 1) if p[:i] in by_path}
                   for t, p in self.taxonomy.items()}
            lin: dict[int, set[int]] = {t: set(a) for t, a in anc.items()}
            for t, a in anc.items():
                for u in a:
                    lin[u].add(t)
            self._lineage = {t: frozenset(s) for t, s in lin.items()}
        return self._lineage.get(tid, frozenset({tid}))

    def lexical(self, path: Sequence[str]) -> np.ndarray:
        """Per taxonomy node: 0.7 x Jaccard of leaf words + 0.3 x share of the path's words."""
        leaf_w, all_w = self._lexicon()
        lw, aw = words(str(path[-1])), words(" ".join(map(str, path)))
        out = np.zeros(len(leaf_w), dtype=np.float32)
        if not lw and not aw:
            return out
        for j, (tl, ta) in enumerate(zip(leaf_w, all_w)):
            inter = len(lw & tl)
            share = len(aw & ta)
            if inter or share:
                out[j] = 0.7 * inter / max(1, len(lw | tl)) + 0.3 * share / max(1, len(aw))
        return out

    def scores(self, paths: Sequence[Sequence[str]]) -> np.ndarray:
        """(len(paths), taxonomy nodes) scores: cosine + lexical_weight x word overlap."""
        tax = self._tax()
        q = np.asarray(self.embed([path_text(p) for p in paths]), dtype=np.float32)
        q = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
        s = q @ tax.vectors.T
        if self.lexical_weight:
            s += self.lexical_weight * np.stack([self.lexical(p) for p in paths])
        return s

    def map_paths(self, paths: Sequence[Sequence[str]]) -> list[CategoryMapping]:
        """The mapping of each path (remembered per path)."""
        keys = [tuple(str(x) for x in p) for p in paths]
        todo = list(dict.fromkeys(k for k in keys if k and k not in self._cache))
        if todo:
            tax = self._tax()
            s = self.scores(todo)
            for k, row in zip(todo, s):
                best = int(np.argmax(row))
                tid = tax.ids[best]
                lin = self.lineage(tid)
                rivals = row.copy()
                rivals[[j for j, t in enumerate(tax.ids) if t in lin]] = -np.inf
                ru = int(np.argmax(rivals))
                margin = float(row[best] - rivals[ru]) if np.isfinite(rivals[ru]) else float(row[best])
                conf = confidence(float(row[best]), margin)
                ok = conf >= self.threshold
                self._cache[k] = CategoryMapping(
                    category=k[-1], path=k, taxonomy_id=tid if ok else None, confidence=round(conf, 4),
                    source="auto" if ok else "unmapped", best_id=tid, score=round(float(row[best]), 4),
                    margin=round(margin, 4), runner_up_id=tax.ids[ru])
        return [self._cache[k] for k in keys if k]

    def map_path(self, path: Sequence[str]) -> CategoryMapping:
        return self.map_paths([path])[0]


def mapping_report(mappings: Sequence[CategoryMapping], reviewed: Mapping[str, int],
                   taxonomy: Mapping[int, tuple[str, ...]], key: Callable[[str], str],
                   thresholds: Sequence[float] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
                   ) -> dict[str, Any]:
    """Automatic mappings measured against a reviewed one (category key -> taxonomy id):
    per confidence threshold, coverage (share mapped) and accuracy of those mapped (exact node;
    ``near``: the reviewed node, its parent or its child)."""
    by_path = {p: t for t, p in taxonomy.items()}

    def near(a: int, b: int) -> bool:
        pa, pb = taxonomy.get(a, ()), taxonomy.get(b, ())
        return a == b or (len(pa) == len(pb) + 1 and by_path.get(pa[:-1]) == b) or \
            (len(pb) == len(pa) + 1 and by_path.get(pb[:-1]) == a)

    rows = [(m, m.best_id, reviewed[key(m.category)]) for m in mappings
            if key(m.category) in reviewed and m.best_id is not None]
    curve = []
    for th in thresholds:
        kept = [(best, r) for m, best, r in rows if m.confidence >= th]
        curve.append({"threshold": th, "coverage": round(len(kept) / max(1, len(rows)), 4), "mapped": len(kept),
                      "accuracy": round(sum(best == r for best, r in kept) / max(1, len(kept)), 4),
                      "accuracy_near": round(sum(near(best, r) for best, r in kept) / max(1, len(kept)), 4)})
    return {"categories": len(rows), "curve": curve,
            "rows": [{"category": m.category, "path": " > ".join(m.path), "auto": best,
                      "auto_path": " > ".join(taxonomy.get(best, ())), "reviewed": r,
                      "reviewed_path": " > ".join(taxonomy.get(r, ())), "confidence": m.confidence,
                      "score": m.score, "margin": m.margin, "exact": best == r, "near": near(best, r)}
                     for m, best, r in sorted(rows, key=lambda t: -t[0].confidence)]}


def mapper_for(taxonomy: Mapping[int, tuple[str, ...]], taxonomy_sha256: str, embed: Embed, tower: str,
               vectors_file: str | Path | None, threshold: float = DEFAULT_THRESHOLD) -> TaxonomyMapper:
    """A mapper whose taxonomy vectors come from ``vectors_file`` when it was made by this
    ``tower`` for this taxonomy, else from ``embed`` (once, on first use: ~5,600 paths)."""

    def vectors() -> TaxonomyVectors:
        tv = TaxonomyVectors.load(vectors_file, tower, taxonomy_sha256) if vectors_file else None
        if tv is None:
            log.warning("embedding the %d taxonomy paths with %s to map categories (once per text tower)",
                        len(taxonomy), tower)
            tv = TaxonomyVectors.compute(taxonomy, embed, tower)
        return tv

    return TaxonomyMapper(taxonomy, vectors, embed, threshold=threshold, tower=tower)
