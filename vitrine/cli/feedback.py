"""`vitrine analytics` and `vitrine experiment`: what shoppers did, and A/B tests of rankings,
over a data dir's feedback log (vitrine/feedback/analytics.py, vitrine/experiments/runner.py).
They open only the event log (SQLite in --data, or the PostgreSQL store), never the models."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from vitrine.cli.base import main, make_settings, store_option


def _default_data_dir(_ctx: click.Context, _param: click.Parameter, value: Path | None) -> Path:
    return value if value is not None else Path(make_settings().storage.data_dir)


def feedback_data_option(f):
    """``--data``, optional here: the event log of the configured data dir (``VITRINE_DATA_DIR``, else
    .vitrine/data), so `vitrine experiment start --name N --variant ...` runs where the API serves."""
    return click.option("--data", "data_dir", type=click.Path(path_type=Path), default=None,
                        callback=_default_data_dir,
                        help="Data dir (default: VITRINE_DATA_DIR, else .vitrine/data)")(f)


@contextmanager
def _event_log(data_dir: Path, store: str | None) -> Iterator[Any]:
    from vitrine.feedback.eventlog import open_event_log

    settings = make_settings(data_dir=data_dir, store=store)
    log = open_event_log(settings.storage.store, settings.storage.data_dir)
    try:
        yield log
    finally:
        log.close()


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


@main.command("analytics")
@feedback_data_option
@store_option
@click.option("--since", default=None, help="Start: Unix seconds, ISO date (2025-01-31) or a span back (7d, 12h); "
                                            "default 30 days before --until")
@click.option("--until", default=None, help="End (excluded), same forms; default now")
@click.option("--granularity", type=click.Choice(["day", "hour"]), default="day", show_default=True)
@click.option("--top", type=int, default=20, show_default=True, help="Queries per list")
@click.option("--json", "as_json", is_flag=True, help="The whole report as JSON (as GET /v1/analytics)")
def analytics_cmd(data_dir: Path, store: str | None, since: str | None, until: str | None, granularity: str,
                  top: int, as_json: bool) -> None:
    """Searches, users, CTR, add-to-cart and conversion rates, mean click position, per day and
    per query, queries with no results and with no clicks (docs/analytics.md)."""
    from vitrine.feedback import analytics

    with _event_log(data_dir, store) as log:
        per_minute = make_settings(data_dir=data_dir, store=store).feedback.bot_events_per_minute
        rep = analytics.report(log, since=analytics.parse_time(since), until=analytics.parse_time(until),
                               granularity=granularity, top=top, bot_per_minute=per_minute)
    if as_json:
        click.echo(rep.model_dump_json(indent=2))
        return
    t = rep.totals
    click.echo(f"{t.searches} searches by {t.users} users ({t.pages} pages), {rep.distinct_queries} distinct queries; "
               f"bot filter: {rep.bots.get('clients', 0)} clients, {rep.bots.get('events', 0)} events; "
               f"CTR {_pct(t.ctr)}, add-to-cart {_pct(t.add_to_cart_rate)}, conversion {_pct(t.conversion)}, "
               f"no results {_pct(t.no_result_rate)}, mean click position "
               f"{'-' if t.mean_click_position is None else f'{t.mean_click_position:.2f}'}")
    if rep.series:
        click.echo(f"\nper {granularity}:")
        for b in rep.series:
            click.echo(f"  {b.date}  {b.searches:>7} searches {b.users:>6} users  CTR {_pct(b.ctr):>6}  "
                       f"conversion {_pct(b.conversion):>6}  no results {_pct(b.no_result_rate):>6}")
    if rep.top_queries:
        click.echo("\ntop queries:")
        for q in rep.top_queries:
            click.echo(f"  {q.searches:>7}  {q.query or '(photo)':<40} CTR {_pct(q.ctr):>6}  "
                       f"conversion {_pct(q.conversion):>6}  mean click position "
                       f"{'-' if q.mean_click_position is None else f'{q.mean_click_position:.2f}'}")
    for title, rows in (("no results", rep.no_result_queries), ("results but no clicks", rep.no_click_queries)):
        if rows:
            click.echo(f"\nqueries with {title}:")
            for qc in rows:
                click.echo(f"  {qc.searches:>7}  {qc.query or '(photo)'}  ({qc.users} users)")


@main.group("experiment")
def experiment_group() -> None:
    """A/B experiments on ranking, kept in the feedback log (docs/experiments.md). Servers on the
    same data dir or store follow a start, split change or stop within a second."""


def _experiments(log: Any, data_dir: Path) -> Any:
    from vitrine.experiments.runner import Experiments

    return Experiments(log, data_dir)


def _split_arg(text: str | None) -> list[float] | None:
    from vitrine.errors import InvalidInput

    if not text:
        return None
    try:
        return [float(x) for x in text.replace("/", ",").split(",")]
    except ValueError as e:
        raise InvalidInput(f"--split {text!r}: percentages like 50,50 or 95,5") from e


def _show(exp: Any) -> None:
    parts = ", ".join(f"{v} {s:g}%" for v, s in zip(exp.variants, exp.split))
    kind = "interleaved" if exp.interleave else parts
    click.echo(f"{exp.name}: {exp.status}, {kind}")
    for v, vs in exp.variants.items():
        click.echo(f"  {v}: {json.dumps(vs.model_dump(exclude_none=True)) or '{}'}")


@experiment_group.command("start")
@feedback_data_option
@store_option
@click.option("--name", required=True, help="Unique experiment name")
@click.option("--variant", "variant_args", multiple=True, required=True, metavar="NAME=SETTINGS",
              help="A variant, first the control: NAME=calibration=floor, NAME=tuning=path/tuning.json, "
                   "NAME=learn_weight=0, NAME=rules=tag, NAME='fusion_weights={\"native\":1,\"bm25\":0.2}', "
                   "NAME={json}; NAME= ranks as configured")
@click.option("--split", default=None, help="Percent of users per variant, in order (e.g. 95,5; default equal)")
@click.option("--interleave", is_flag=True, help="Team-draft interleaving of two variants in every search")
def experiment_start(data_dir: Path, store: str | None, name: str, variant_args: tuple[str, ...], split: str | None,
                     interleave: bool) -> None:
    """Start an experiment."""
    from vitrine.experiments.models import ExperimentCreate, parse_variant

    parsed = dict(parse_variant(v) for v in variant_args)
    with _event_log(data_dir, store) as log:
        exp = _experiments(log, data_dir).start(ExperimentCreate(name=name, variants=parsed, split=_split_arg(split),
                                                                 interleave=interleave))
    _show(exp)


@experiment_group.command("split")
@feedback_data_option
@store_option
@click.option("--name", required=True)
@click.option("--split", required=True, help="New percentages, in the experiment's variant order (e.g. 50,50)")
def experiment_split(data_dir: Path, store: str | None, name: str, split: str) -> None:
    """Widen (or narrow) a running experiment: a staged rollout."""
    with _event_log(data_dir, store) as log:
        _show(_experiments(log, data_dir).set_split(name, _split_arg(split) or []))


@experiment_group.command("stop")
@feedback_data_option
@store_option
@click.option("--name", required=True)
def experiment_stop(data_dir: Path, store: str | None, name: str) -> None:
    """Stop an experiment: searches rank as configured again."""
    with _event_log(data_dir, store) as log:
        _show(_experiments(log, data_dir).stop(name))


@experiment_group.command("list")
@feedback_data_option
@store_option
def experiment_list(data_dir: Path, store: str | None) -> None:
    """Every experiment, running and stopped."""
    with _event_log(data_dir, store) as log:
        for exp in _experiments(log, data_dir).all(fresh=True):
            _show(exp)


@experiment_group.command("status")
@feedback_data_option
@store_option
@click.option("--name", required=True)
@click.option("--json", "as_json", is_flag=True, help="The report as JSON (as GET /v1/experiments/{name})")
def experiment_status(data_dir: Path, store: str | None, name: str, as_json: bool) -> None:
    """Per variant: users, searches, CTR, conversion, MRR with 95% intervals, and the verdict."""
    with _event_log(data_dir, store) as log:
        rep = _experiments(log, data_dir).status(name)
    if as_json:
        click.echo(rep.model_dump_json(indent=2))
        return
    _show(rep.experiment)

    def iv(i: Any) -> str:
        if i.value is None:
            return "-"
        return f"{i.value:.4f}" + (f" [{i.low:.4f}, {i.high:.4f}]" if i.low is not None else "")

    for v in rep.variants:
        click.echo(f"  {v.variant}: {v.units} users, {v.searches} searches; CTR {iv(v.ctr)}; conversion "
                   f"{iv(v.conversion)}; MRR {iv(v.mrr)}")
    for c in rep.comparisons:
        click.echo(f"  {c.variant} - {c.control} {c.metric}: {iv(c.difference)} p={c.p_value}"
                   f"{' *' if c.significant else ''}")
    if rep.interleaving is not None:
        i = rep.interleaving
        click.echo(f"  interleaving: wins {i.wins}, ties {i.ties}, p={i.p_value}")
    click.echo(f"verdict: {rep.verdict}")
