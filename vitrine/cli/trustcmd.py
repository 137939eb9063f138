"""`vitrine keys create|list|revoke` (scoped API keys, vitrine/web/keys.py) and `vitrine suggest
block|unblock|list` (terms never suggested from the search log, vitrine/feedback/blocklist.py).
Neither opens the models: both run beside a serving API, which sees the change within a second
(keys) or at its next read of the popular queries (blocklist, ``refresh_s``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import click

from vitrine.cli.base import data_option, main, make_settings, store_option

if TYPE_CHECKING:
    from vitrine.feedback.blocklist import Blocklist


@main.group("keys")
def keys_group() -> None:
    """Scoped API keys: limited to routes (events, search, suggest), expiring, with their own rate."""


@keys_group.command("create")
@data_option
@click.option("--routes", "routes", multiple=True, required=True, type=click.Choice(["events", "search", "suggest"]),
              help="A route the key may call (repeatable)")
@click.option("--expires-in", "expires_in", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds until the key expires (default: never)")
@click.option("--rate", "rate", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Calls a minute the key may make, over all its clients (default: only the per-client rates)")
@click.option("--description", default="", help="What the key is for")
def create_cmd(data_dir: Path, routes: tuple[str, ...], expires_in: float | None, rate: float | None,
               description: str) -> None:
    """Make a scoped key; prints it once (only its hash is kept, in DATA/keys.json)."""
    from vitrine.web.keys import ScopedKeys

    settings = make_settings(data_dir=data_dir)
    key, rec = ScopedKeys(settings.storage.data_dir).create(list(routes), expires_in_s=expires_in,
                                                             rate_per_minute=rate, description=description)
    click.echo(json.dumps({**rec.public(), "key": key}))


@keys_group.command("list")
@data_option
def list_cmd(data_dir: Path) -> None:
    """The scoped keys (ids, routes, expiry, rate; never the keys)."""
    from vitrine.web.keys import ScopedKeys

    settings = make_settings(data_dir=data_dir)
    for k in ScopedKeys(settings.storage.data_dir).list():
        click.echo(json.dumps(k.public()))


@keys_group.command("revoke")
@data_option
@click.argument("key_id")
def revoke_cmd(data_dir: Path, key_id: str) -> None:
    """Revoke a scoped key by id."""
    from vitrine.web.keys import ScopedKeys

    settings = make_settings(data_dir=data_dir)
    ScopedKeys(settings.storage.data_dir).revoke(key_id)
    click.echo(f"revoked {key_id}")


@main.group("suggest")
def suggest_group() -> None:
    """Search-box suggestions from the search log: terms never suggested."""


@contextmanager
def _blocklist(data_dir: Path, store: str | None) -> Iterator[Blocklist]:
    """The data dir's (or store's) blocklist, its event log closed after use."""
    from vitrine.feedback.blocklist import Blocklist
    from vitrine.feedback.eventlog import open_event_log

    settings = make_settings(data_dir=data_dir, store=store)
    log = open_event_log(settings.storage.store, settings.storage.data_dir)
    try:
        yield Blocklist(log)
    finally:
        log.close()


@suggest_group.command("block")
@data_option
@store_option
@click.argument("term")
def block_cmd(data_dir: Path, store: str | None, term: str) -> None:
    """Never suggest a logged query that holds TERM (whole words; anywhere for Chinese)."""
    with _blocklist(data_dir, store) as bl:
        click.echo(f"blocked {bl.block(term)!r}")


@suggest_group.command("unblock")
@data_option
@store_option
@click.argument("term")
def unblock_cmd(data_dir: Path, store: str | None, term: str) -> None:
    """Suggest logged queries with TERM again."""
    with _blocklist(data_dir, store) as bl:
        click.echo(f"unblocked {term!r}" if bl.unblock(term) else f"{term!r} was not blocked")


@suggest_group.command("list")
@data_option
@store_option
def blocked_cmd(data_dir: Path, store: str | None) -> None:
    """The blocked terms, one a line."""
    with _blocklist(data_dir, store) as bl:
        for t in bl.terms():
            click.echo(t)
