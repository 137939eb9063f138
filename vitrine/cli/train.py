"""``vitrine train``: the alignment adapters / MoE gate, and the intent classifier."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import click

from vitrine.cli import main, make_settings

log = logging.getLogger("vitrine")

#: Augmented photo views the adapters train on by default (vitrine/encoders/images.py:
#: augment_view): a mirrored photo and five seeded crops, one of them in place of the photo for
#: 70% of the rows of a batch. Chosen on the val split (README, "Models").
DEFAULT_VIEWS: tuple[str, ...] = ("flip", "crop1", "crop2", "crop3", "crop4", "crop5")
DEFAULT_VIEW_PROB = 0.7


@main.group()
def train() -> None:
    """Train the adapters / MoE gate or the intent classifier."""


@train.command("gate")
@click.option("--kind", type=click.Choice(["linear", "mlp", "moe"]), default="mlp", show_default=True)
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Output folder (default: the shipped weights folder of this kind)")
@click.option("--model", default=None, help="Tower config (default from settings)")
@click.option("--source", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Catalogue folder with styles.csv, splits.csv, images/ (default: bundled)")
@click.option("--epochs", type=int, default=40, show_default=True)
@click.option("--batch-size", type=int, default=1024, show_default=True)
@click.option("--lr", type=float, default=2e-3, show_default=True)
@click.option("--dim", type=int, default=256, show_default=True, help="Shared space width")
@click.option("--hidden", type=int, default=512, show_default=True, help="Hidden width of MLP heads/experts")
@click.option("--experts", type=int, default=8, show_default=True, help="MoE: number of experts")
@click.option("--top-k", type=int, default=2, show_default=True, help="MoE: experts per token")
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
@click.option("--patience", type=int, default=6, show_default=True)
@click.option("--name", default=None, help="Name recorded in the adapter config")
@click.option("--ema", type=float, default=0.0, show_default=True,
              help="Validate and keep an exponential moving average of the weights with this decay per "
                   "step (e.g. 0.99); 0 = off")
@click.option("--views", default=",".join(DEFAULT_VIEWS), show_default=True,
              help="Augmented photo views to train on (comma-separated: flip, crop<N>; '' = none); their "
                   "features are computed once and cached")
@click.option("--view-prob", type=click.FloatRange(0.0, 1.0), default=DEFAULT_VIEW_PROB, show_default=True,
              help="Chance that a training row sees one of the augmented views instead of its photo")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override an adapter config value, e.g. --set dropout=0.3 (repeatable; JSON values)")
@click.option("--data", "data_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Train on this ingested data dir's catalogue (its photos + pseudo-queries; early-stops on "
                   "held-out products), then install it by hot swap and re-tune (docs/tuning.md)")
@click.option("--no-install", is_flag=True, help="With --data: train and save only")
def train_gate(kind: str, out: Path | None, model: str | None, source: Path | None, epochs: int, batch_size: int,
               lr: float, dim: int, hidden: int, experts: int, top_k: int, dynamic_k: bool, balance_weight: float,
               balance: str, bias_rate: float, queries: bool, seed: int, patience: int, name: str | None,
               ema: float, views: str, view_prob: float, overrides: tuple[str, ...], data_dir: Path | None = None,
               no_install: bool = False) -> None:
    """Train an alignment adapter over cached backbone features of the train split.

    Early-stops on the val split's title->photo MRR@10; writes config.json + model.safetensors,
    a training log (train_log.jsonl) and the val metrics.
    """
    if data_dir is not None:
        from vitrine.cli.tune import train_gate_on_data

        click.echo(json.dumps(train_gate_on_data(data_dir, kind=kind, out=out, epochs=epochs, patience=patience,
                                                 batch_size=batch_size, lr=lr, dim=dim, hidden=hidden, seed=seed,
                                                 install=not no_install, overrides=_parse_overrides(overrides)),
                              indent=2))
        return
    from vitrine.cli.training import train_gate_command

    settings = make_settings(model=model)
    result = train_gate_command(
        settings, kind=kind, out=out, source=source, epochs=epochs, batch_size=batch_size, lr=lr, dim=dim,
        hidden=hidden, experts=experts, top_k=top_k, dynamic_k=dynamic_k, balance_weight=balance_weight,
        balance=balance, bias_rate=bias_rate, queries=queries, seed=seed,
        patience=patience, name=name, ema_decay=ema, overrides=_parse_overrides(overrides),
        views=_parse_views(views), view_prob=view_prob,
    )
    click.echo(json.dumps(result, indent=2))


def _parse_overrides(items: tuple[str, ...]) -> dict[str, Any]:
    from vitrine.encoders.adapters import config_overrides
    from vitrine.errors import ModelError

    try:
        return config_overrides(items)
    except ModelError as e:
        raise click.BadParameter(str(e), param_hint="--set") from e


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
@click.option("--epochs", type=int, default=None, help="Default: the training defaults (vitrine/intent/training.py)")
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
    try:
        from vitrine.cli.training import train_intent_command
    except ImportError as e:  # pragma: no cover
        raise click.ClickException(f"intent training is unavailable: {e}") from e
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
    click.echo(json.dumps(train_intent_command(**kwargs), indent=2, ensure_ascii=False))
