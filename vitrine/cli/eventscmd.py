"""`vitrine events purge|count`: retention and a count of a data dir's feedback log (the searches
the API logged and the shopper events on them). Opens only the event log (SQLite ``events.sqlite``
in --data, or the PostgreSQL store), never the models, so it can run beside a serving API."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from vitrine.cli.base import data_option, main, make_settings, store_option


@main.group("events")
def events_group() -> None:
    """The feedback log: forget what is older than the retention, count what it holds."""


@events_group.command("purge")
@data_option
@store_option
@click.option("--retention-days", "events_retention_days", type=click.FloatRange(min=0, min_open=True),
              default=None, help="Forget searches and events older than this (default: events_retention_days, "
                                 "env VITRINE_EVENTS_RETENTION_DAYS)")
def purge_cmd(data_dir: Path, store: str | None, events_retention_days: float | None) -> None:
    """Forget logged searches and shopper events older than the retention (events on a search
    that is gone are refused from then on). Safe beside a serving API: one short transaction."""
    from vitrine.feedback.eventlog import open_event_log
    from vitrine.feedback.intake import Feedback

    over = {"events_retention_days": events_retention_days} if events_retention_days is not None else {}
    settings = make_settings(data_dir=data_dir, store=store, **over)
    log = open_event_log(settings.storage.store, settings.storage.data_dir)
    try:
        before = log.counts()
        removed = Feedback(log, settings.feedback, batched=False).purge()
        after = log.counts()
    finally:
        log.close()
    days = settings.feedback.events_retention_days
    click.echo(f"purged {removed} rows older than {days:g} days "
               f"(cut-off {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(time.time() - days * 86400))}): "
               f"searches {before['searches']} -> {after['searches']}, events {before['events']} -> {after['events']}")


@events_group.command("count")
@data_option
@store_option
@click.option("--json", "as_json", is_flag=True, help="JSON out")
def count_cmd(data_dir: Path, store: str | None, as_json: bool) -> None:
    """How many searches and shopper events the feedback log holds."""
    from vitrine.feedback.eventlog import open_event_log

    settings = make_settings(data_dir=data_dir, store=store)
    log = open_event_log(settings.storage.store, settings.storage.data_dir)
    try:
        counts = log.counts()
    finally:
        log.close()
    click.echo(json.dumps(counts) if as_json else f"{counts['searches']} searches, {counts['events']} events")
