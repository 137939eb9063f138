"""Glue of ``vitrine train gate --lora``: the catalogue's titles, pseudo-queries and photos' cut
activations for the towers' LoRA deltas, and the val figures that compare a run with and
without them (docs/models.md, "Tower LoRA")."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from vitrine.encoders.adapter_base import Adapter
    from vitrine.encoders.encoder import MultimodalEncoder
    from vitrine.encoders.lora import LoraSpec
    from vitrine.training.lora import JointTowers
    from vitrine.training.pairs import PairSet
    from vitrine.evals.datasets import Catalog

log = logging.getLogger("vitrine.train")


def limited_catalog(source: Any, train_limit: int | None, seed: int) -> Catalog:
    """The catalogue, with a seeded ``train_limit`` of its train products (val and test whole)."""
    import numpy as np

    from vitrine.evals.datasets import Catalog

    catalog = Catalog.load(source)
    if not train_limit:
        return catalog
    train_rows = np.flatnonzero(catalog.split_mask("train"))
    if train_limit >= len(train_rows):
        return catalog
    keep = np.random.default_rng(seed).choice(train_rows, size=train_limit, replace=False)
    ids = {catalog.rows[int(r)]["id"] for r in keep} | {r["id"] for r, m in zip(catalog.rows, catalog.split_mask("train"))
                                                        if not m}
    return Catalog.load(source, limit_ids=ids)


def joint_towers(catalog: Catalog, encoder: MultimodalEncoder, spec: LoraSpec, *, train_rows: np.ndarray,
                 val_rows: np.ndarray, queries: bool, seed: int, lr_scale: float,
                 progress: bool = True) -> JointTowers:
    """The deltas and what they read for this split of the catalogue."""
    from vitrine.encoders.lora import TowerLora, photo_activations
    from vitrine.training.lora import JointTowers
    from vitrine.evals import attribute_queries as aq
    from vitrine.progress import progress_bar

    lora = TowerLora(encoder.towers, spec)
    titles = catalog.titles
    acts = {}
    if spec.image:
        for split, rows in (("train", train_rows), ("val", val_rows)):
            bar: Any = progress_bar(total=len(rows), desc=f"cut activations ({split})", unit="img", enabled=progress)
            acts[split] = photo_activations(encoder.towers, [catalog.photo(catalog.rows[int(r)]["id"]) for r in rows],
                                            encoder.decode, cache=encoder.cache, progress=bar.update)
            bar.close()
    # The same draw as build_pairs' (same rows, same seed): query j here is its query j.
    pq = aq.pseudo_queries(catalog.rows, train_rows.tolist(), per_product=3, seed=seed) if queries else []
    return JointTowers(lora, train_titles=[titles[int(r)] for r in train_rows],
                       val_titles=[titles[int(r)] for r in val_rows], query_texts=[q.text for q in pq],
                       train_acts=acts.get("train"), val_acts=acts.get("val"), lr_scale=lr_scale)


def val_figures(adapter: Adapter, val: PairSet, catalog: Catalog, encoder: MultimodalEncoder,
                towers: JointTowers | None, *, n_attr: int = 500, seed: int = 1) -> dict[str, Any]:
    """On the val split: title -> photo Hit@10 (any photo of that title in the top 10) / MRR@10 over
    val photos, and the text-only attribute
    protocol (attribute queries against val titles only) beside the text tower alone (the floor)."""
    import numpy as np
    import torch

    from vitrine.training.adapter import retrieval_scores
    from vitrine.evals import attribute_queries as aq
    from vitrine.metrics import mean_metrics

    t0 = time.time()
    data = towers.refresh(val, "val") if towers is not None else val
    adapter.eval()
    val_rows = np.flatnonzero(catalog.split_mask("val"))
    rows = [catalog.rows[int(r)] for r in val_rows]
    qs = aq.eval_queries(rows, list(range(len(rows))), n=n_attr, seed=seed)
    q_text = [q["text"] for q in qs]
    native_q = encoder.text_features(q_text)
    with torch.no_grad():
        q_feats = towers.lora.text_features(q_text).numpy() if towers is not None and towers.lora.spec.text \
            else native_q
        img = adapter(torch.from_numpy(data.image), None).image
        txt = adapter(None, torch.from_numpy(data.text)).text
        qv = adapter(None, torch.from_numpy(q_feats)).text
    g = torch.from_numpy(data.group)
    t2i = retrieval_scores(txt, img, g, g)
    pos = {r["id"]: j for j, r in enumerate(rows)}
    rel = [{pos[p]: 1.0 for p in q["relevant"] if p in pos} for q in qs]

    def ndcg(queries: torch.Tensor, gallery: torch.Tensor) -> float:
        top = (queries @ gallery.T).topk(10, dim=1).indices.tolist()
        return float(mean_metrics(list(zip(top, rel)), [10], ("nDCG",))["nDCG@10"])

    unit = torch.nn.functional.normalize
    return {"val_t2i_Hit@10": round(t2i["Hit@10"], 4), "val_t2i_MRR@10": round(t2i["MRR@10"], 4),
            "val_textonly_attr_nDCG@10": round(ndcg(qv, txt), 4),
            "val_textonly_attr_nDCG@10_text_tower": round(ndcg(unit(torch.from_numpy(native_q), dim=-1),
                                                               unit(torch.from_numpy(val.text), dim=-1)), 4),
            "attr_queries": len(qs), "seconds": round(time.time() - t0, 1)}
