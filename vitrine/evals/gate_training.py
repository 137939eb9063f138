"""`vitrine train gate --data DIR`: train the aligner on an ingested catalogue, whatever its domain.

The catalogue is read from the data dir (records + stored photos), so any JSONL/CSV ingest
serves, not only the bundled folder format. Training pairs:

- title <-> photo of every product with a photo (products sharing a title are interchangeable);
- pseudo-query <-> product (vitrine/evals/pseudo_queries.py: titles with words dropped, category
  names, brand + type, facet values + type), each query's relevant products its positives.

Products are split by a hash of their id: the held-out ones are never trained on, and their
pseudo title queries -> photo MRR@10 early-stops training. The adapter is trained by the
encoders' own training loop (vitrine/encoders/train.py); this module only builds its data. The
result is installed through the canary-checked hot swap (vitrine/search/swap.py), and the
catalogue is tuned again for the new shared space (vitrine/evals/tuning.py).

A catalogue without (enough) photos trains the aligner's text side alone: a product's vector is
its text token routed without a photo, exactly as the engine indexes a product without one
(``adapter(None, text).text``); the training pairs are a title variant (words dropped) <-> its
product's text and the same pseudo-queries -> the products' text vectors (every product matching
a query's key a positive); held-out products' pseudo title queries -> their text vectors early-stop
it. The canary checks and the re-tune decide whether the shared space is used at all: the text
tower's own ranking (the floor) stays the fallback.
"""

from __future__ import annotations

import copy
import json
import logging
import random
import time
from pathlib import Path
from typing import Any

import numpy as np

from vitrine.encoders.adapters import create_adapter
from vitrine.encoders.train import PairSet, TrainConfig, evaluate_pairs, kind_options, seed_everything, train_adapter
from vitrine.errors import InvalidInput
from vitrine.evals import pseudo_queries as pq
from vitrine.search.engine import Engine, product_text
from vitrine.search.models import Product

log = logging.getLogger(__name__)


def _leaf(doc: dict[str, Any]) -> str:
    cat = doc.get("category") or []
    return str(cat[-1]) if cat else ""


MIN_PRODUCTS = 50  # fewer photos than this: the text-only path; fewer products: nothing to train


def _with_photos(engine: Engine) -> tuple[list[Any], np.ndarray | None]:
    """The products whose stored photo decodes, and their photo features (None: too few, text-only)."""
    rows = [r for r in engine.records.iter_rows(with_vectors=False) if r.image_key]
    photos, keep = [], []
    for r in rows:
        data = engine.images.get(r.image_key)  # type: ignore[arg-type]
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
    docs = [{**r.doc, "id": r.id} for r in keep]
    txt = engine.encoder.text_features([product_text(Product.model_validate(r.doc)) for r in keep], progress=True)
    salt = f"vitrine-gate-{seed}"
    split = np.array([pq.split_of(d["id"], heldout, salt) for d in docs])  # noqa: SLF001 - same module family
    tr, ho = np.flatnonzero(split == "fit"), np.flatnonzero(split == "heldout")
    titles: dict[str, int] = {}
    group = np.array([titles.setdefault(str(d["title"]).casefold(), len(titles)) for d in docs], dtype=np.int64)

    # pseudo-queries: one "subset" per kind of key, each product's key under it (-1: none)
    queries = pq.generate(docs, counts=counts or {"title": 4000, "category": 400, "brand_type": 600,
                                                  "attributes": 1500}, heldout=0.0, seed=seed)
    keys: dict[str, int] = {}
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
    q_rows, q_sub, q_key, q_text = [], [], [], []
    sub_query: dict[int, pq.PseudoQuery] = {}  # one query of each subset: how its keys are made
    for q in queries:
        if q.kind == "photo" or not q.text:
            continue
        sig = q.kind if q.kind != "attributes" else "attributes:" + ",".join(sorted(q.meta.get("facets") or {}))
        s = sub_of.setdefault(sig, len(sub_of))
        src = [id_row[p] for p in q.relevant if p in id_row and id_row[p] in local]
        if not src:
            continue
        key = product_key(q.kind, docs[src[0]], q)
        if key is None:
            continue
        q_rows.append(local[src[0]])
        q_sub.append(s)
        q_key.append(keys.setdefault(f"{s}:{key}", len(keys)))
        q_text.append(q.text)
        sub_query.setdefault(s, q)
    pkeys = np.full((max(1, len(sub_of)), len(tr)), -1, dtype=np.int64)
    for s, q0 in sub_query.items():
        for j, i in enumerate(tr):
            key = product_key(q0.kind, docs[int(i)], q0)
            if key is not None and f"{s}:{key}" in keys:
                pkeys[s, j] = keys[f"{s}:{key}"]
    rng = random.Random(seed)

    def variants(rows: np.ndarray) -> np.ndarray:  # a title with words dropped (the title itself if short)
        return engine.encoder.text_features(
            [pq.title_variant(str(docs[int(i)]["title"]), rng) or str(docs[int(i)]["title"]) for i in rows])

    text_only = img is None
    train = PairSet(image=None if img is None else img[tr], text=txt[tr], group=group[tr],
                    variant=variants(tr) if text_only else None)
    if q_text:
        train.query_rows = np.array(q_rows, dtype=np.int64)
        train.query_subset = np.array(q_sub, dtype=np.int64)
        train.query_key = np.array(q_key, dtype=np.int64)
        train.query_text = engine.encoder.text_features(q_text, progress=True)
        train.product_keys = pkeys
    # early stopping: held-out products, found by a pseudo title query (words dropped) among their
    # photos (text-only: among their text vectors)
    vq = variants(ho)
    val = PairSet(image=None, text=txt[ho], group=group[ho], variant=vq) if text_only else \
        PairSet(image=img[ho], text=vq, group=group[ho])  # type: ignore[index]
    info = {"text_only": text_only, "products_with_photos": 0 if text_only else len(keep),
            "products": len(keep), "train_products": len(tr), "heldout_products": len(ho),
            "pseudo_queries": len(q_text), "query_subsets": sorted(sub_of, key=sub_of.get)}
    return train, val, info


def resolve_init(init: str, *, text_only: bool, served_kind: str, kind: str, overrides: bool) -> str:
    """``auto``: a text-only catalogue fine-tunes the served aligner when it is of ``kind`` (without
    config overrides): text pairs cannot train the photo side, and fresh weights would leave it
    untrained; a catalogue with photos trains fresh weights."""
    if init != "auto":
        return init
    return "live" if text_only and served_kind == kind and not overrides else "fresh"


def train_on_data(engine: Engine, out: Path, *, kind: str = "mlp", epochs: int = 20, patience: int = 4,
                  batch_size: int = 1024, lr: float | None = None, dim: int = 256, hidden: int = 512, seed: int = 0,
                  install: bool = True, retune: bool = True, overrides: dict[str, Any] | None = None,
                  counts: dict[str, int] | None = None, init: str = "auto") -> dict[str, Any]:
    """Train an aligner of ``kind`` on the engine's catalogue, save it to ``out``, and (``install``)
    hot-swap it in through the canary checks, then tune the catalogue again. ``counts``: pseudo-queries
    per kind (training and the re-tune; default: their defaults). ``init``: ``fresh`` weights, or
    ``live``: fine-tune the aligner the engine serves (same kind; its input standardisation kept), or
    ``auto``: :func:`resolve_init`. ``lr`` defaults to 2e-3 for fresh weights, 5e-4 to fine-tune."""
    t0 = time.time()
    seed_everything(seed)
    train, val, info = catalogue_pairs(engine, seed=seed, counts=counts)
    live = engine.encoder.adapter
    init = resolve_init(init, text_only=bool(info["text_only"]), served_kind=live.kind, kind=kind,
                        overrides=bool(overrides))
    before = evaluate_pairs(live, val)["MRR@10"]  # the served aligner on the same held-out queries
    if init == "live":
        if live.kind != kind or overrides:
            raise InvalidInput(f"--init live fine-tunes the served {live.kind} aligner as it is: ask for that kind, "
                               "without config overrides")
        adapter = copy.deepcopy(live)
        adapter.config["name"] = f"{kind}-{Path(engine.data_dir).name}"
    elif init == "fresh":
        towers = engine.encoder.towers
        cfg: dict[str, Any] = {"image_dim": towers.image_dim, "text_dim": towers.text_dim, "dim": dim,
                               "hidden": hidden, "towers_key": towers.key, "model": engine.settings.encoders.model,
                               "name": f"{kind}-{Path(engine.data_dir).name}"}
        cfg |= overrides or {}
        adapter = create_adapter(kind, **cfg)
    else:
        raise InvalidInput(f"init must be 'fresh' or 'live', not {init!r}")
    out.mkdir(parents=True, exist_ok=True)
    lr = lr if lr is not None else (5e-4 if init == "live" else 2e-3)
    tcfg = TrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, seed=seed, patience=patience,
                       feature_stats=init == "fresh", **kind_options(kind))  # text_text_weight: unused text-only
    result = train_adapter(adapter, train, val, tcfg, progress=True, log_path=out / "train_log.jsonl")
    adapter.save_pretrained(out)
    summary: dict[str, Any] = {"kind": kind, "init": init, "out": str(out), **info, "best_epoch": result.best_epoch,
                               "heldout_MRR@10": result.best_score, "heldout_MRR@10_served_before": before, "epochs_run": len(result.history),
                               "train_seconds": round(result.seconds, 1)}
    if install:
        from vitrine.search.swap import SwapRefused, SwapRequest  # noqa: PLC0415

        try:
            rep = engine.swap(SwapRequest(adapter=str(out)), progress=True)
            summary["swap"] = {"accepted": rep.accepted, "switched": rep.switched, "reason": rep.reason}
        except SwapRefused as e:
            summary["swap"] = {"accepted": False, "switched": False, "reason": str(e)}
        if summary["swap"]["switched"] and retune:
            from vitrine.evals.tuning import tune  # noqa: PLC0415

            res = tune(engine, seed=seed, counts=counts)
            summary["tune"] = {"accepted": res.calibration.accepted, "weights": res.calibration.text_weights,
                               **{k: res.calibration.summary.get(k) for k in ("heldout_floor", "heldout_fitted")}}
    summary["seconds"] = round(time.time() - t0, 1)
    (out / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
