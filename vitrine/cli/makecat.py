"""``vitrine make-catalogue``: a synthetic text-only catalogue of any size, with judged queries."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path

import click

from vitrine.cli.base import main

log = logging.getLogger("vitrine")


@main.command("make-catalogue")
@click.option("--n", "n", type=click.IntRange(min=1), required=True, help="Products to write (e.g. 1000000)")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), required=True,
              help="Folder for catalog.jsonl, queries.jsonl and README.md")
@click.option("--seed", type=int, default=0, show_default=True, help="The same seed writes the same files")
@click.option("--categories", type=click.IntRange(min=1), default=None,
              help="Google taxonomy leaf categories to spread products over (default: n/50, 20 to 4000)")
@click.option("--queries", type=click.IntRange(min=0), default=1000, show_default=True,
              help="Judged queries to write (half val, half test)")
def make_catalogue(n: int, out: Path, seed: int, categories: int | None, queries: int) -> None:
    """Write a synthetic text-only catalogue over Google's product taxonomy (brands, colours,
    materials, sizes, prices, descriptions) and queries judged from its attributes: for measuring
    ingest, memory and latency as a catalogue grows (bench-results/growth.md). Generated text, not
    shoppers' queries."""
    from vitrine.evals.synthetic import write_catalogue

    made = write_catalogue(out, n, seed=seed, categories=categories, queries=queries)
    click.echo(json.dumps(asdict(made), indent=2))
