"""The leave-domain-out protocol's aligner training (vitrine/evals/domain_shift.py): an aligner of
the served adapter's kind and architecture, trained on the bundled catalogue's rows of the
domains left in (``vitrine eval --protocol domain-shift``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

DOMAIN_SHIFT_EPOCHS = 12  # 2 shared cores: the `train gate --data` schedule, early-stopped on val
DOMAIN_SHIFT_PATIENCE = 4
# what a served adapter's config.json says about its architecture (the rest is trained or measured)
ARCHITECTURE = ("dim", "hidden", "dropout", "experts", "top_k", "dynamic_k", "dynamic_threshold", "balance",
                 "balance_weight", "balance_target_cv", "bias_rate", "router_noise", "cross_dropout",
                 "input_dropout", "query_precision")


def served_architecture(settings: Any) -> tuple[str, dict[str, Any]]:
    """The configured adapter's kind and architecture (the shipped MoE gate by default), so that
    the protocol retrains what serves, not a stand-in."""
    from vitrine.encoders.adapters import load_adapter

    cfg = load_adapter(settings.encoders.adapter).config
    return str(cfg["kind"]), {k: cfg[k] for k in ARCHITECTURE if k in cfg}


def train_aligner_on_rows(settings: Any, rows: list[dict[str, str]], out: Path, *, kind: str | None = None,
                          epochs: int = DOMAIN_SHIFT_EPOCHS, seed: int = 0) -> Path:
    """An aligner of the served adapter's kind and architecture (``kind`` overrides), trained by
    the encoders' training code on the bundled catalogue's ``rows`` only (their train split;
    early-stopped on their val split; no augmented views, to fit 2 cores)."""
    from vitrine.encoders.adapters import create_adapter
    from vitrine.evals.datasets import Catalog
    from vitrine.training.adapter import TrainConfig, kind_options, seed_everything, train_adapter
    from vitrine.training.gate import features_encoder, tune_fuse_weight
    from vitrine.training.pairs import build_pairs

    if (out / "config.json").is_file():  # trained by an earlier run of the protocol
        return out
    served_kind, arch = served_architecture(settings)
    if kind is not None and kind != served_kind:
        arch = {"dim": arch.get("dim", 256), "hidden": 512}
    kind = kind or served_kind
    seed_everything(seed)
    full = Catalog.load()
    catalog = Catalog(source=full.source, rows=rows, splits=full.splits)
    encoder = features_encoder(settings)
    # title <-> photo pairs only: the attribute pseudo-queries (~40k texts per domain) are not in the feature
    # cache once a domain is left out, and encoding them would take longer than the training itself
    train, _ = build_pairs(catalog, encoder, "train", queries=False, seed=seed, progress=False)
    val, _ = build_pairs(catalog, encoder, "val", queries=False, seed=seed, progress=False)
    adapter = create_adapter(kind, image_dim=encoder.towers.image_dim, text_dim=encoder.towers.text_dim,
                             towers_key=encoder.towers.key, model=settings.encoders.model,
                             name=f"{kind}-{out.parent.name}", **({"dim": 256, "hidden": 512} | arch))
    out.mkdir(parents=True, exist_ok=True)
    train_adapter(adapter, train, val, TrainConfig(epochs=epochs, patience=DOMAIN_SHIFT_PATIENCE, seed=seed,
                                                   **kind_options(kind)),
                  progress=False, log_path=out / "train_log.jsonl")
    if kind != "moe":  # the MoE's modality gate weighs photo and text per product: nothing to tune
        adapter.config["fuse_image_weight"] = tune_fuse_weight(adapter, catalog, encoder)["best"]
    adapter.save_pretrained(out)
    return out
