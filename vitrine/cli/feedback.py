"""`vitrine analytics` and `vitrine experiment`: what shoppers did, and A/B tests of rankings,
over a data dir's feedback log (vitrine/search/analytics.py, vitrine/search/experiments.py).
They open only the event log (SQLite in --data, or the PostgreSQL store), never the models."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from vitrine.cli import data_option, main, make_settings, store_option


@contextmanager
def _event_log(data_dir: Path, store: str | None) -> Iterator[Any]:
    from vitrine.index.eventlog import open_event_log  # noqa: PLC0415

    settings = make_settings(data_dir=data_dir, store=store)
    log = open_event_log(settings.storage.store, settings.storage.data_dir)
    try:
        yield log
    finally:
        log.close()


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


@main.command("analytics")
@data_option
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
    from vitrine.search import analytics  # noqa: PLC0415

    with _event_log(data_dir, store) as log:
        rep = analytics.report(log, since=analytics.parse_time(since), until=analytics.parse_time(until),
                               granularity=granularity, top=top)
    if as_json:
        click.echo(rep.model_dump_json(indent=2))
        return
    t = rep.totals
    click.echo(f"{t.searches} searches by {t.users} users, {rep.distinct_queries} distinct queries; "
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
            for q in rows:
                click.echo(f"  {q.searches:>7}  {q.query or '(photo)'}  ({q.users} users)")
