"""``vitrine rules list|put|delete|import|export``: a data dir's merchandising rules
(docs/merchandising.md), without loading any model. Every API process of the data dir (or of the
PostgreSQL store) applies a change within ``rules_refresh_s``."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from vitrine.cli.base import data_option, main, make_settings, store_option
from vitrine.errors import InvalidInput, NotFound


@contextmanager
def _stores(data_dir: Path, store: str | None) -> Iterator[tuple[Any, Any, Any]]:
    from vitrine.merchandising.store import open_rule_store
    from vitrine.index.store import open_stores

    settings = make_settings(data_dir=data_dir, store=store)
    records, _ = open_stores(settings.storage.store, data_dir)
    rules = open_rule_store(settings.storage.store, data_dir)
    try:
        yield settings, records, rules
    finally:
        rules.close()
        records.close()


def _read_rule(text: str) -> Any:
    from pydantic import ValidationError

    from vitrine.merchandising.models import Rule

    try:
        return Rule.model_validate_json(text)
    except ValidationError as e:
        err = e.errors()[0]
        raise InvalidInput(f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}") from e


@main.group("rules")
def rules_group() -> None:
    """Merchandising rules: pins, boosts, buries, hides, filters, banners, redirects (docs/merchandising.md)."""


@rules_group.command("list")
@data_option
@store_option
def rules_list(data_dir: Path, store: str | None) -> None:
    """Every rule as JSON lines (id, conditions, consequences, enabled, updated, active)."""
    from pydantic import ValidationError

    from vitrine.merchandising.rules import RuleBook

    with _stores(data_dir, store) as (_, _, rules):
        for s in rules.all():
            try:
                click.echo(RuleBook.out(s).model_dump_json(by_alias=True, exclude_none=True))
            except ValidationError as e:  # stored by another version: shown, not fatal (delete it by id)
                click.echo(f"rule {s.id!r} does not read as a rule: {e.errors()[0]['msg']}", err=True)


@rules_group.command("put")
@data_option
@store_option
@click.argument("rule_id")
@click.argument("rule_json", required=False)
def rules_put(data_dir: Path, store: str | None, rule_id: str, rule_json: str | None) -> None:
    """Create or replace RULE_ID from RULE_JSON (or standard input): {"conditions": ..., "consequences": ...}."""
    from vitrine.merchandising.models import check_rule
    from vitrine.merchandising.rules import RuleBook

    rule = _read_rule(rule_json if rule_json is not None else sys.stdin.read())
    with _stores(data_dir, store) as (settings, records, rules):
        check_rule(rule, records, settings.search.max_k)
        stored = rules.put(rule_id, rule.body(), rule.enabled, max_rules=settings.search.max_rules)
        click.echo(RuleBook.out(stored).model_dump_json(by_alias=True, exclude_none=True))


@rules_group.command("delete")
@data_option
@store_option
@click.argument("rule_id")
def rules_delete(data_dir: Path, store: str | None, rule_id: str) -> None:
    """Delete RULE_ID."""
    with _stores(data_dir, store) as (_, _, rules):
        if not rules.delete(rule_id):
            raise NotFound("rule", rule_id)
    click.echo(json.dumps({"id": rule_id, "deleted": True}))


@rules_group.command("export")
@data_option
@store_option
@click.option("--out", "out", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="JSONL file (default: standard output)")
def rules_export(data_dir: Path, store: str | None, out: Path | None) -> None:
    """Every rule as JSON lines `vitrine rules import` reads back."""
    from vitrine.merchandising.models import dump_rules
    from vitrine.merchandising.rules import RuleBook

    with _stores(data_dir, store) as (_, _, rules):
        readable = []
        for s in rules.all():
            try:
                readable.append(RuleBook.out(s))
            except ValueError as e:  # a pydantic ValidationError: left out of the export, said why
                click.echo(f"rule {s.id!r} left out: it does not read as a rule ({e})", err=True)
        lines = [json.dumps(d, ensure_ascii=False) for d in dump_rules(readable)]
    text = "".join(line + "\n" for line in lines)
    if out is None:
        click.echo(text, nl=False)
    else:
        out.write_text(text, encoding="utf-8")
        click.echo(f"exported {len(lines)} rules to {out}", err=True)


@rules_group.command("import")
@data_option
@store_option
@click.argument("path", type=click.Path(path_type=Path, dir_okay=False, exists=True))
def rules_import(data_dir: Path, store: str | None, path: Path) -> None:
    """Create or replace every rule of a JSONL file (one {"id", ...rule} per line), all or none."""
    from vitrine.merchandising.models import check_rule, parse_rules

    items = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                items.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise InvalidInput(f"{path}:{n}: not JSON: {e}") from e
    parsed = parse_rules(items)
    with _stores(data_dir, store) as (settings, records, rules):
        for rid, rule in parsed:
            try:
                check_rule(rule, records, settings.search.max_k)
            except InvalidInput as e:
                raise InvalidInput(f"rule {rid!r}: {e}") from e
        n = rules.put_many([(rid, r.body(), r.enabled) for rid, r in parsed], max_rules=settings.search.max_rules)
    click.echo(json.dumps({"imported": n}))
