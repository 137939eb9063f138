"""`vitrine train gate --data DIR`: train the aligner on an ingested catalogue, whatever its domain.

The catalogue is read from the data dir (records + stored photos), so any JSONL/CSV ingest
serves, not only the bundled folder format. Training pairs:

- title <-> photo of every product with a photo (products sharing a title are interchangeable);
- pseudo-query <-> product (vitrine/evals/pseudo_queries.py: titles with words dropped, category
  names, brand + type, facet values + type), each query's relevant products its positives.

Products are split by a hash of their id: the held-out ones are never trained on, and their
pseudo title queries -> photo MRR@10 early-stops training. The adapter is trained by the
training loop (vitrine/training/adapter.py) on the pairs of vitrine/training/pairs.py. The
result is installed only if its held-out MRR@10 beats the serving aligner's on the same held-out
queries (``installed`` and ``decision`` in the summary say which and why), through the
canary-checked hot swap (vitrine/search/swap.py), and the catalogue is tuned again for the new
shared space (vitrine/evals/tuning.py). The held-out products also early-stop the training, so the
new aligner's score there is its best epoch's: a slight edge in its favour, which the canary checks
of the swap (on the catalogue's own queries) still guard.

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
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from vitrine.encoders.adapter_base import Adapter
from vitrine.encoders.adapters import create_adapter
from vitrine.errors import InvalidInput
from vitrine.search.engine import Engine
from vitrine.settings import Settings
from vitrine.training.adapter import TrainConfig, evaluate_pairs, kind_options, seed_everything, train_adapter
from vitrine.training.pairs import catalogue_pairs
from vitrine.training.recipe import GateRecipe, save_recipe

log = logging.getLogger(__name__)


def resolve_init(init: str, *, text_only: bool, served_kind: str, kind: str, overrides: bool) -> str:
    """``auto``: a text-only catalogue fine-tunes the served aligner when it is of ``kind`` (without
    config overrides): text pairs cannot train the photo side, and fresh weights would leave it
    untrained; a catalogue with photos trains fresh weights."""
    if init != "auto":
        return init
    return "live" if text_only and served_kind == kind and not overrides else "fresh"


def train_on_data(engine: Engine, out: Path, recipe: GateRecipe, *, install: bool = True, retune: bool = True,
                  counts: dict[str, int] | None = None) -> dict[str, Any]:
    """Train an aligner by ``recipe`` (resolved for ``--data``: 12 epochs, patience 4) on the
    engine's catalogue, save it and its ``recipe.json`` to ``out``, and (``install``) hot-swap it in
    through the canary checks, then tune the catalogue again. ``counts``: pseudo-queries per kind
    (training and the re-tune; default: their defaults). ``recipe.init``: ``fresh`` weights, or
    ``live``: fine-tune the aligner the engine serves (same kind; its input standardisation kept), or
    ``auto``: :func:`resolve_init`. ``recipe.lr`` defaults to 2e-3 for fresh weights, 5e-4 to fine-tune."""
    t0 = time.time()
    recipe = recipe.resolved(data=True)
    seed_everything(recipe.seed)
    train, val, info = catalogue_pairs(engine, seed=recipe.seed, counts=counts)
    live = engine.encoder.adapter
    init = resolve_init(recipe.init, text_only=bool(info["text_only"]), served_kind=live.kind, kind=recipe.kind,
                        overrides=bool(recipe.overrides))
    before = evaluate_pairs(live, val)["MRR@10"]  # the served aligner on the same held-out queries
    adapter = _initial_adapter(engine, recipe, init)
    out.mkdir(parents=True, exist_ok=True)
    recipe = replace(recipe, model=engine.settings.encoders.model, init=init, lr=recipe.lr if recipe.lr is not None else (5e-4 if init == "live" else 2e-3))
    assert recipe.epochs is not None and recipe.patience is not None and recipe.lr is not None
    tcfg = TrainConfig(epochs=recipe.epochs, batch_size=recipe.batch_size, lr=recipe.lr, seed=recipe.seed,
                       patience=recipe.patience, feature_stats=init == "fresh",
                       **kind_options(recipe.kind))  # text_text_weight: unused text-only
    result = train_adapter(adapter, train, val, tcfg, progress=True, log_path=out / "train_log.jsonl")
    adapter.save_pretrained(out)
    save_recipe(out, recipe)
    summary: dict[str, Any] = {"kind": recipe.kind, "init": init, "out": str(out), **info,
                               "best_epoch": result.best_epoch, "heldout_MRR@10": result.best_score,
                               "heldout_MRR@10_served_before": before, "epochs_run": len(result.history),
                               "train_seconds": round(result.seconds, 1)}
    after = evaluate_pairs(adapter, val)["MRR@10"]  # the new one, measured as the served one was
    summary["heldout_MRR@10_new"] = after
    beats = after > before
    summary["installed"] = False
    if install and beats:
        summary |= install_and_retune(engine, out, seed=recipe.seed, retune=retune, counts=counts)
        summary["installed"] = bool(summary["swap"]["switched"])
    summary["decision"] = (
        f"{'installed' if summary['installed'] else 'not installed'}: the new aligner's held-out MRR@10 "
        f"{after:.4f} {'beats' if beats else 'does not beat'} the serving one's {before:.4f}"
        + ("" if install else " (--no-install)")
        + ("" if not (install and beats) or summary["installed"] else f"; the swap refused it: {summary['swap']['reason']}"))
    log.info("%s", summary["decision"])
    summary["seconds"] = round(time.time() - t0, 1)
    (out / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _initial_adapter(engine: Engine, recipe: GateRecipe, init: str) -> Adapter:
    """The served aligner to fine-tune (``live``) or fresh weights of the recipe's architecture."""
    kind = recipe.kind
    live = engine.encoder.adapter
    if init == "live":
        if live.kind != kind or recipe.overrides:
            raise InvalidInput(f"--init live fine-tunes the served {live.kind} aligner as it is: ask for that kind, "
                               "without config overrides")
        adapter = copy.deepcopy(live)
        adapter.config["name"] = f"{kind}-{Path(engine.data_dir).name}"
        return adapter
    if init != "fresh":
        raise InvalidInput(f"init must be 'fresh' or 'live', not {init!r}")
    towers = engine.encoder.towers
    cfg: dict[str, Any] = {"image_dim": towers.image_dim, "text_dim": towers.text_dim, "dim": recipe.dim,
                           "hidden": recipe.hidden, "towers_key": towers.key, "model": engine.settings.encoders.model,
                           "name": f"{kind}-{Path(engine.data_dir).name}"}
    return create_adapter(kind, **(cfg | recipe.overrides))


def install_and_retune(engine: Engine, out: Path, *, seed: int, retune: bool,
                       counts: dict[str, int] | None) -> dict[str, Any]:
    """Hot-swap the aligner in ``out`` in through the canary checks; once switched, tune the
    catalogue again for the new shared space."""
    from vitrine.errors import SwapRefused
    from vitrine.search.swap import SwapRequest

    got: dict[str, Any] = {}
    try:
        rep = engine.swap(SwapRequest(adapter=str(out)), progress=True)
        got["swap"] = {"accepted": rep.accepted, "switched": rep.switched, "reason": rep.reason}
    except SwapRefused as e:
        got["swap"] = {"accepted": False, "switched": False, "reason": str(e)}
    if got["swap"]["switched"] and retune:
        from vitrine.evals.tuning import tune

        res = tune(engine, seed=seed, counts=counts)
        got["tune"] = {"accepted": res.calibration.accepted, "weights": res.calibration.text_weights,
                       **{k: res.calibration.summary.get(k) for k in ("heldout_floor", "heldout_fitted")}}
    return got


def train_gate_on_data(settings: Settings, recipe: GateRecipe, *, out: Path | None = None,
                       install: bool = True) -> dict[str, Any]:
    """``vitrine train gate --data DIR``: open the engine of ``settings`` (its data dir), train on
    its catalogue (default output: DIR/adapters/<kind>-<time>), install, re-tune."""
    engine = Engine.open(settings)
    try:
        target = out if out is not None else Path(engine.data_dir) / "adapters" / f"{recipe.kind}-{int(time.time())}"
        return train_on_data(engine, target, recipe, install=install)
    finally:
        engine.close()
