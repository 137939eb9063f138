"""``vitrine train``: the alignment adapters / MoE gate, and the intent classifier.

The commands parse their options into a training recipe and call the training layer
(vitrine/training/; docs/design.md, "Training"); heavy imports (torch, the encoders) happen
there, inside the functions, so that ``vitrine --help`` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from vitrine.cli.base import main, make_settings
from vitrine.training.recipe import DEFAULT_MOE_HIDDEN, DEFAULT_VIEWS, GateRecipe

_DEFAULT = GateRecipe()  # the shipped gate's recipe: the options' defaults


@main.group()
def train() -> None:
    """Train the adapters / MoE gate or the intent classifier."""


@train.command("gate")
@click.option("--kind", type=click.Choice(["linear", "mlp", "moe"]), default="moe", show_default=True,
              help="The aligner: the cross-modal MoE gate or the plain MLP / linear heads")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Output folder (default: the shipped weights folder of this kind)")
@click.option("--model", default=None, help="Tower config (default from settings)")
@click.option("--source", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Catalogue folder with styles.csv, splits.csv, images/ (default: bundled)")
@click.option("--epochs", type=int, default=None,
              help="Passes over the train split (default: 40, the shipped gate's schedule; with --data: 12)")
@click.option("--batch-size", type=int, default=1024, show_default=True)
@click.option("--lr", type=float, default=None,
              help="Learning rate (default 2e-3; with --data fine-tuning the served aligner: 5e-4)")
@click.option("--dim", type=int, default=256, show_default=True, help="Shared space width")
@click.option("--hidden", type=int, default=None,
              help=f"Hidden width of the experts / MLP heads (default {DEFAULT_MOE_HIDDEN} for the MoE, 512 otherwise)")
@click.option("--experts", type=int, default=_DEFAULT.experts, show_default=True, help="MoE: number of experts")
@click.option("--top-k", type=int, default=_DEFAULT.top_k, show_default=True, help="MoE: experts per token")
@click.option("--dynamic-k", is_flag=True, help="MoE: fewer experts for confident routes")
@click.option("--balance-weight", type=float, default=0.05, show_default=True,
              help="MoE: weight of the load-balancing loss")
@click.option("--balance", type=click.Choice(["bias", "loss"]), default="bias", show_default=True,
              help="MoE: even out expert load with a choice bias (loss-free, DeepSeek-V3 style) on top of "
                   "the balancing loss, or with the loss alone")
@click.option("--bias-rate", type=float, default=0.01, show_default=True,
              help="MoE: how far the choice bias moves per training step (--balance bias)")
@click.option("--queries/--no-queries", default=True, show_default=True,
              help="Also train on attribute pseudo-queries (MoE and MLP)")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--patience", type=int, default=None,
              help="Epochs without a better val score before stopping (default: as many as --epochs, i.e. "
                   "the whole cosine schedule runs and the best val epoch is kept, as for the shipped gate; "
                   "with --data: 4)")
@click.option("--name", default=None, help="Name recorded in the adapter config")
@click.option("--ema", type=float, default=0.0, show_default=True,
              help="Validate and keep an exponential moving average of the weights with this decay per "
                   "step (e.g. 0.99); 0 = off")
@click.option("--views", default=",".join(DEFAULT_VIEWS), show_default=True,
              help="Augmented photo views to train on (comma-separated: flip, crop<N>, gray, tiny, invert, tight<N>; "
                   "'' = none); their "
                   "features are computed once and cached")
@click.option("--view-prob", type=click.FloatRange(0.0, 1.0), default=_DEFAULT.view_prob, show_default=True,
              help="Chance that a training row sees one of the augmented views instead of its photo")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override an adapter config value, e.g. --set dropout=0.3 (repeatable; JSON values)")
@click.option("--degraded-share", type=click.FloatRange(0.0, 1.0), default=_DEFAULT.degraded_share, show_default=True,
              help="Share of the training photos that get the degraded views (gray, tiny, invert, tight<N>): "
                   "their features cost as much to compute as the photos'")
@click.option("--gumbel-tau", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
              help="MoE: straight-through Gumbel-softmax routing at this temperature while training; 0 = noisy top-k")
@click.option("--route-kl", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
              help="MoE: weight of a routing-agreement loss (symmetric KL between a product's photo and title routes)")
@click.option("--data", "data_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Train on this ingested data dir's catalogue (its photos + pseudo-queries; early-stops on "
                   "held-out products), then install it by hot swap and re-tune (docs/tuning.md)")
@click.option("--no-install", is_flag=True, help="With --data: train and save only")
@click.option("--init", "init", type=click.Choice(["auto", "fresh", "live"]), default="auto", show_default=True,
              help="With --data: train fresh weights, or fine-tune the aligner the data dir serves (same --kind); "
                   "auto: live for a text-only catalogue served by an aligner of --kind, else fresh")
@click.option("--lora", type=click.Choice(["text", "image", "both"]), default=None,
              help="Also train LoRA deltas of the towers with the gate (MiniLM's attention query/value; the image "
                   "tower's last stage), saved in OUT/lora (needs the `train` extra: peft)")
@click.option("--lora-rank", type=click.IntRange(1, 64), default=8, show_default=True, help="LoRA rank (alpha = 2 x rank)")
@click.option("--lora-text-layers", default="4,5", show_default=True,
              help="MiniLM layers with deltas (comma-separated, 'all' = every layer): the top ones cost least")
@click.option("--lora-lr-scale", type=float, default=0.25, show_default=True,
              help="The deltas' learning rate as a share of --lr")
@click.option("--train-limit", type=int, default=None,
              help="Train on a seeded subset of this many train products (val stays whole): short comparisons")
def train_gate(data_dir: Path | None, no_install: bool, out: Path | None, overrides: tuple[str, ...], views: str,
               lora_text_layers: str, **options: Any) -> None:
    """Train an alignment adapter over cached backbone features of the train split.

    Early-stops on the val split's title->photo MRR@10; writes config.json + model.safetensors,
    recipe.json, a training log (train_log.jsonl) and the val metrics. With no options: the MoE
    gate's recipe into vitrine/encoders/weights/moe (docs/models.md).
    """
    if options["lora"] and data_dir is not None:
        raise click.BadParameter("tower LoRA trains on the bundled (or --source) catalogue, not with --data",
                                 param_hint="--lora")
    if options["lora"] and options["kind"] != "moe":
        raise click.BadParameter("tower LoRA trains with the MoE gate only", param_hint="--lora")
    source = options.pop("source")
    recipe = GateRecipe(**options, source=None if source is None else str(source),
                        overrides=_parse_overrides(overrides), views=_parse_views(views),
                        lora_text_layers=None if lora_text_layers.strip() == "all" else _parse_layers(lora_text_layers))
    if data_dir is not None:
        from vitrine.training.gate_data import train_gate_on_data

        result = train_gate_on_data(make_settings(data_dir=data_dir), recipe, out=out, install=not no_install)
    else:
        from vitrine.training.gate import train_gate as run

        result = run(make_settings(model=recipe.model), recipe, out)
    click.echo(json.dumps(result, indent=2))


def _parse_overrides(items: tuple[str, ...]) -> dict[str, Any]:
    from vitrine.encoders.adapters import config_overrides
    from vitrine.errors import ModelError

    try:
        return config_overrides(items)
    except ModelError as e:
        raise click.BadParameter(str(e), param_hint="--set") from e


def _parse_layers(text: str) -> tuple[int, ...]:
    try:
        return tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not comma-separated layer numbers", param_hint="--lora-text-layers") from None


def _parse_views(text: str) -> tuple[str, ...]:
    from vitrine.encoders.images import check_view
    from vitrine.errors import InvalidInput

    views = tuple(v.strip() for v in text.split(",") if v.strip())
    try:
        return tuple(check_view(v) for v in views)
    except InvalidInput as e:
        raise click.BadParameter(str(e), param_hint="--views") from e


@train.command("intent")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=None)
@click.option("--init-from", type=click.Path(path_type=Path, exists=True), default=None,
              help="Start from a pretrained Qwen checkpoint (HF folder or GGUF file)")
@click.option("--epochs", type=int, default=None, help="Default: the training defaults (vitrine/training/intent.py)")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--config", default=None,
              help="Architecture config: a shipped name (vitrine/intent/configs) or a JSON file")
@click.option("--train-per-label", type=int, default=None, help="Generated training queries per label")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
              help="Override a training setting, e.g. --set token_dropout=0.15 (repeatable)")
@click.option("--members", type=click.IntRange(1, 9), default=None,
              help="Ensemble size: classifiers trained on their own draws of the queries, probabilities "
                   "averaged (default 5)")
@click.option("--no-heldout", is_flag=True, help="Measure on validation only (for tuning), not on held-out queries")
def train_intent(out: Path | None, init_from: Path | None, epochs: int | None, seed: int, config: str | None,
                 train_per_label: int | None, settings: tuple[str, ...], no_heldout: bool,
                 members: int | None) -> None:
    """Train the Qwen2-architecture intent classifier on generated queries.

    Model selection (best epoch) uses validation queries from templates kept out of training."""
    kwargs: dict[str, Any] = {"out": out, "init_from": init_from, "seed": seed, "heldout": not no_heldout}
    if epochs is not None:
        kwargs["epochs"] = epochs
    if config is not None:
        kwargs["config"] = config
    if train_per_label is not None:
        kwargs["train_per_label"] = train_per_label
    if members is not None:
        kwargs["members"] = members
    hparams: dict[str, float] = {}
    for item in settings:
        key, sep, value = item.partition("=")
        try:
            hparams[key.strip()] = float(value)
        except ValueError:
            raise click.BadParameter(f"{item!r} is not KEY=NUMBER", param_hint="--set") from None
        if not sep:
            raise click.BadParameter(f"{item!r} is not KEY=NUMBER", param_hint="--set")
    if hparams:
        kwargs["hparams"] = hparams
    try:
        from vitrine.training.intent import train_intent as run  # optional extra
    except ImportError as e:  # pragma: no cover
        raise click.ClickException(f"intent training is unavailable: {e}") from e
    # the converted Qwen tokenizer's cache
    kwargs.setdefault("cache_dir", make_settings().storage.cache_dir / "intent")
    click.echo(json.dumps(run(**kwargs), indent=2, ensure_ascii=False))
