"""``vitrine eval``: Recall@K / MRR / nDCG on qrels through the engine, and the built-in protocols."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import click

from vitrine.cli import main, make_settings, model_options

log = logging.getLogger("vitrine")

PROTOCOLS = ["kagl-t2i", "kagl-subcat", "photo-self", "qrels"]


@main.command("eval")
@click.option("--data", "data_dir", type=click.Path(path_type=Path), default=None,
              help="Data dir to search (qrels and photo-self protocols)")
@click.option("--queries", type=click.Path(path_type=Path, exists=True, dir_okay=False), default=None,
              help="Queries JSONL: {qid, text?, image?, relevant: {id: grade}}")
@click.option("--protocol", type=click.Choice(PROTOCOLS), default=None,
              help="Built-in protocol on the bundled catalogue (default: qrels when --queries is given)")
@click.option("--k", "ks", default="1,5,10", show_default=True, help="Cut-offs, comma-separated")
@click.option("--split", default="test", show_default=True, help="Split whose products seed the queries")
@click.option("--json", "json_out", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Write the result (with a flat 'metrics' object) here")
@model_options
def eval_cmd(data_dir: Path | None, queries: Path | None, protocol: str | None, ks: str, split: str,
             json_out: Path | None, **model: Any) -> None:
    """Measure retrieval quality: Recall@K, MRR, nDCG (and the KAGL protocols)."""
    from vitrine.evals.datasets import Catalog, load_qrels
    from vitrine.evals import protocols as P

    try:
        cutoffs = sorted({int(x) for x in ks.split(",") if x.strip()})
    except ValueError as e:
        raise click.BadParameter(f"--k must be integers like 1,5,10: {e}") from e
    if not cutoffs or cutoffs[0] < 1:
        raise click.BadParameter("--k needs positive cut-offs")
    protocol = protocol or ("qrels" if queries else None)
    if protocol is None:
        raise click.UsageError("give --queries QRELS (with --data) or --protocol")
    settings = make_settings(data_dir=data_dir, **model)
    if protocol in ("qrels", "photo-self"):
        if data_dir is None:
            raise click.UsageError(f"--protocol {protocol} searches a data dir: give --data")
        from vitrine.search.engine import Engine

        engine = Engine.open(settings)
        if protocol == "qrels":
            if queries is None:
                raise click.UsageError("--protocol qrels needs --queries")
            result = P.run_qrels(engine, load_qrels(queries), cutoffs)
        else:
            result = P.photo_self(engine, Catalog.load(), split=split)
    else:
        from vitrine.search.engine import build_encoder

        encoder = build_encoder(settings)
        catalog = Catalog.load()
        if protocol == "kagl-t2i":
            result = P.kagl_t2i(encoder, catalog, split=split)
        else:
            result = P.kagl_subcat(encoder, catalog)
        result["model"] = encoder.model_key
        if hasattr(encoder.adapter, "routing_stats"):
            result["routing"] = P.routing_report(encoder, catalog)
    result["adapter"] = settings.adapter
    text = json.dumps(result, indent=2)
    click.echo(text)
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(text + "\n")
