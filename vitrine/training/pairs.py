"""The training pairs of the aligner (the adapters / MoE gate), from either kind of catalogue.

One :class:`PairSet` shape for both: aligned (photo, title) backbone features, optional
pseudo-queries with the products each one matches, hard negatives, augmented photo views, and
for a text-only catalogue a title variant per product in place of a photo.

- :func:`build_pairs`: a split (``train``, ``val``) of a catalogue folder in the bundled format
  (styles.csv, splits.csv, images/; vitrine/evals/datasets.py), with attribute pseudo-queries
  (vitrine/evals/attribute_queries.py): what ``vitrine train gate`` trains the shipped gate on.
- :func:`catalogue_pairs`: any ingested catalogue, read from a data dir's records and stored photos
  (JSONL / CSV ingest, whatever the domain), split by a hash of the product id, with the
  pseudo-queries of vitrine/evals/pseudo_queries.py: what ``vitrine train gate --data`` trains on.
  A catalogue without (enough) photos gets text-only pairs: a title variant (words dropped) <->
  its product's text (vitrine/training/gate_data.py's module doc).
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from vitrine.errors import InvalidInput
from vitrine.evals import pseudo_queries as pq

if TYPE_CHECKING:  # pragma: no cover
    from vitrine.encoders.encoder import MultimodalEncoder
    from vitrine.evals.datasets import Catalog
    from vitrine.search.engine import Engine

log = logging.getLogger(__name__)


@dataclass
class PairSet:
    """Aligned backbone features: row i of ``image`` and ``text`` describe the same product.

    ``group`` labels rows that are interchangeable (identical titles). Optional pseudo-queries:
    ``query_text[j]`` was made from product ``query_rows[j]`` naming the attribute subset
    ``query_subset[j]`` with value key ``query_key[j]``; ``product_keys[s, i]`` is product i's
    key under subset s (-1 if it lacks one), so every product matching a query counts as its
    positive. ``hard_negatives[i]`` lists rows that look alike but differ (-1 pads).

    Text-only (``image`` None): ``variant[i]`` holds the text features of a variant of product
    i's title (words dropped), the product's second view in place of a photo.
    """

    image: np.ndarray | None
    text: np.ndarray
    group: np.ndarray
    query_rows: np.ndarray | None = None
    query_text: np.ndarray | None = None
    query_subset: np.ndarray | None = None
    query_key: np.ndarray | None = None
    product_keys: np.ndarray | None = None
    hard_negatives: np.ndarray | None = None
    image_views: np.ndarray | None = None  # (V, N, image_dim): features of augmented photos (NaN rows: none)
    variant: np.ndarray | None = None  # text-only: a title variant's text features per row

    @property
    def text_only(self) -> bool:
        return self.image is None

    def __post_init__(self) -> None:
        other = self.variant if self.image is None else self.image
        if other is None:
            raise ValueError("a text-only PairSet (no image) needs variant: a title variant per row")
        if not (len(other) == len(self.text) == len(self.group)):
            raise ValueError("image (or variant), text and group must have the same number of rows")
        if self.image is None and (self.image_views is not None or self.hard_negatives is not None):
            raise ValueError("a text-only PairSet has no photo views or hard negatives")
        if self.image_views is not None and self.image is not None and self.image_views.shape[1:] != self.image.shape:
            raise ValueError("image_views must be (views, rows, image_dim) over the same rows")



@dataclass(frozen=True)
class KeyedQuery:
    """A pseudo-query made from product ``row`` (a row of its PairSet), naming the value ``key``
    under the kind of key ``subset`` (an attribute subset, a category, a brand + type ...)."""

    row: int
    subset: int
    key: str
    text: str


def attach_queries(ps: PairSet, queries: Sequence[KeyedQuery], product_keys: dict[int, list[str | None]],
                   n_subsets: int, encode: Callable[[list[str]], np.ndarray]) -> None:
    """Give ``ps`` its pseudo-queries, the same way for both builders: ``product_keys[s][j]`` is
    product j's key under subset s (None, or a subset not listed: it has none); every product
    whose key under a query's subset equals the query's is a positive of it. ``encode``: texts ->
    text-tower features."""
    ids: dict[tuple[int, str], int] = {}
    pkeys = np.full((max(1, n_subsets), len(ps.text)), -1, dtype=np.int64)
    for s, keys in product_keys.items():
        for j, k in enumerate(keys):
            if k is not None:
                pkeys[s, j] = ids.setdefault((s, k), len(ids))
    ps.query_rows = np.array([q.row for q in queries], dtype=np.int64)
    ps.query_subset = np.array([q.subset for q in queries], dtype=np.int64)
    ps.query_key = np.array([ids.setdefault((q.subset, q.key), len(ids)) for q in queries], dtype=np.int64)
    ps.query_text = encode([q.text for q in queries])
    ps.product_keys = pkeys


# -- a catalogue folder (the bundled format) ------------------------------------------------------------
def hard_negative_rows(rows: list[dict[str, str]], subset: np.ndarray, per_row: int = 4,
                       seed: int = 0) -> np.ndarray:
    """For each row of ``subset``: rows of the same article type but another colour or gender."""
    rng = np.random.default_rng(seed)
    by_type: dict[str, list[int]] = {}
    for j, r in enumerate(subset):
        by_type.setdefault(rows[r]["articleType"], []).append(j)
    out = np.full((len(subset), per_row), -1, dtype=np.int64)
    for j, r in enumerate(subset):
        same = by_type[rows[r]["articleType"]]
        if len(same) < 2:
            continue
        cand = rng.choice(same, size=min(len(same), 4 * per_row), replace=False)
        picked = [c for c in cand if rows[subset[c]]["baseColour"] != rows[r]["baseColour"]
                  or rows[subset[c]]["gender"] != rows[r]["gender"]][:per_row]
        out[j, : len(picked)] = picked
    return out


def build_pairs(catalog: Catalog, encoder: MultimodalEncoder, split: str, *, queries: bool, seed: int,
                progress: bool = True, views: tuple[str, ...] = (), degraded_share: float = 0.5,
                ) -> tuple[PairSet, np.ndarray]:
    """A split's (photo, title) pairs as a :class:`PairSet` (with the photo views' features and,
    with ``queries``, attribute pseudo-queries) and the catalogue rows they come from."""
    from vitrine.encoders.images import is_degraded_view
    from vitrine.evals import attribute_queries as aq

    img_f, txt_f = catalog.features(encoder, progress=progress)
    rows_idx = np.flatnonzero(catalog.split_mask(split))
    groups = catalog.title_groups()[rows_idx]
    image_views = None
    if views:
        log.info("augmented photo views %s of %d photos (cached after the first run)", ",".join(views), len(rows_idx))
        image_views = catalog.view_features(encoder, views, rows_idx, progress=progress,
                                            shares={v: degraded_share for v in views if is_degraded_view(v)},
                                            seed=seed)
    ps = PairSet(image=img_f[rows_idx], text=txt_f[rows_idx], group=groups, image_views=image_views)
    if queries:
        local = {int(r): j for j, r in enumerate(rows_idx)}
        pq = aq.pseudo_queries(catalog.rows, rows_idx.tolist(), per_product=3, seed=seed)
        attrs = [aq.attrs_of(catalog.rows[r]) for r in rows_idx]
        keys = {s: [aq.subset_key(sub, a) if aq.usable(sub, a) else None for a in attrs]
                for s, sub in enumerate(aq.SUBSETS)}
        attach_queries(ps, [KeyedQuery(local[q.row], q.subset, q.key, q.text) for q in pq], keys, len(aq.SUBSETS),
                       lambda texts: encoder.text_features(texts, progress=progress))
        ps.hard_negatives = hard_negative_rows(catalog.rows, rows_idx, seed=seed)
    return ps, rows_idx


# -- an ingested catalogue (a data dir) ------------------------------------------------------------------
def _leaf(doc: dict[str, Any]) -> str:
    cat = doc.get("category") or []
    return str(cat[-1]) if cat else ""


MIN_PRODUCTS = 50  # fewer photos than this: the text-only path; fewer products: nothing to train


def _with_photos(engine: Engine) -> tuple[list[Any], np.ndarray | None]:
    """The products whose stored photo decodes, and their photo features (None: too few, text-only)."""
    rows = [(r, key) for r in engine.records.iter_rows(with_vectors=False) if (key := r.image_key)]
    photos, keep = [], []
    for r, key in rows:
        data = engine.images.get(key)
        if data is not None:
            photos.append(data)
            keep.append(r)
    if len(keep) < MIN_PRODUCTS:
        return [], None
    errors: dict[int, str] = {}
    img = engine.encoder.image_features(photos, progress=True, errors=errors)
    ok = [i for i in range(len(keep)) if i not in errors]
    return [keep[i] for i in ok], img[ok]


def catalogue_pairs(engine: Engine, *, seed: int = 0, heldout: float = 0.15,
                    counts: dict[str, int] | None = None) -> tuple[PairSet, PairSet, dict[str, Any]]:
    """(train pairs with pseudo-queries, held-out pseudo title queries -> photo, what was used).

    With fewer than ``MIN_PRODUCTS`` photos: text-only pairs over every product (module doc)."""
    keep, img = _with_photos(engine)
    if img is None:
        keep = [r for r in engine.records.iter_rows(with_vectors=False) if (r.doc or {}).get("title")]
        if len(keep) < MIN_PRODUCTS:
            raise InvalidInput(f"{engine.data_dir} holds {len(keep)} products with a title and too few photos: "
                               f"the aligner needs at least {MIN_PRODUCTS} products to train on (such a small "
                               "catalogue ranks by the text tower's own floor and `vitrine tune`)")
    from vitrine.search.models import product_text
    from vitrine.search.models import Product

    docs = [{**r.doc, "id": r.id} for r in keep]
    txt = engine.encoder.text_features([product_text(Product.model_validate(r.doc)) for r in keep], progress=True)
    salt = f"vitrine-gate-{seed}"
    split = np.array([pq.split_of(d["id"], heldout, salt) for d in docs])
    tr, ho = np.flatnonzero(split == "fit"), np.flatnonzero(split == "heldout")
    titles: dict[str, int] = {}
    group = np.array([titles.setdefault(str(d["title"]).casefold(), len(titles)) for d in docs], dtype=np.int64)

    # pseudo-queries: one "subset" per kind of key, each product's key under it (-1: none)
    queries = pq.generate(docs, counts=counts or {"title": 4000, "category": 400, "brand_type": 600,
                                                  "attributes": 1500}, heldout=0.0, seed=seed)
    sub_of: dict[str, int] = {}

    def product_key(kind: str, d: dict[str, Any], q: pq.PseudoQuery) -> str | None:
        if kind == "title":
            return str(d["title"]).casefold()
        if kind == "category":
            return _leaf(d) or None
        if kind == "brand_type":
            return f"{d.get('brand')}|{_leaf(d)}" if d.get("brand") else None
        facets = q.meta.get("facets") or {}
        attrs = d.get("attributes") or {}
        vals = [str((d.get("brand") if k == "brand" else attrs.get(k)) or "").strip() for k in sorted(facets)]
        return "|".join(vals) + "|" + _leaf(d) if all(vals) else None

    local = {int(i): j for j, i in enumerate(tr)}
    id_row = {d["id"]: i for i, d in enumerate(docs)}
    keyed: list[KeyedQuery] = []
    sub_query: dict[int, pq.PseudoQuery] = {}  # one query of each subset: how its keys are made
    for q in queries:
        if q.kind == "photo" or not q.text:
            continue
        sig = q.kind if q.kind != "attributes" else "attributes:" + ",".join(sorted(q.meta.get("facets") or {}))
        s = sub_of.setdefault(sig, len(sub_of))
        src = [id_row[p] for p in q.relevant if p in id_row and id_row[p] in local]
        key = product_key(q.kind, docs[src[0]], q) if src else None
        if key is not None:
            keyed.append(KeyedQuery(local[src[0]], s, key, q.text))
            sub_query.setdefault(s, q)
    product_keys = {s: [product_key(q0.kind, docs[int(i)], q0) for i in tr] for s, q0 in sub_query.items()}
    rng = random.Random(seed)

    def variants(rows: np.ndarray) -> np.ndarray:  # a title with words dropped (the title itself if short)
        return engine.encoder.text_features(
            [pq.title_variant(str(docs[int(i)]["title"]), rng) or str(docs[int(i)]["title"]) for i in rows])

    text_only = img is None
    train = PairSet(image=None if img is None else img[tr], text=txt[tr], group=group[tr],
                    variant=variants(tr) if text_only else None)
    if keyed:
        attach_queries(train, keyed, product_keys, len(sub_of),
                       lambda texts: engine.encoder.text_features(texts, progress=True))
    # early stopping: held-out products, found by a pseudo title query (words dropped) among their
    # photos (text-only: among their text vectors)
    vq = variants(ho)
    val = PairSet(image=None, text=txt[ho], group=group[ho], variant=vq) if img is None else \
        PairSet(image=img[ho], text=vq, group=group[ho])
    info = {"text_only": text_only, "products_with_photos": 0 if text_only else len(keep),
            "products": len(keep), "train_products": len(tr), "heldout_products": len(ho),
            "pseudo_queries": len(keyed), "query_subsets": sorted(sub_of, key=sub_of.__getitem__)}
    return train, val, info
