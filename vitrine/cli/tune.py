"""`vitrine tune`: fit text ranking to a catalogue (vitrine/evals/tuning.py; docs/tuning.md)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import click

from vitrine.cli import data_option, main, make_settings, model_options

log = logging.getLogger("vitrine")


def run_tune(engine: Any, report_dir: Path | None, *, seed: int = 0) -> Any:
    """Tune ``engine``'s catalogue, save the settings in its data dir, write the report."""
    from vitrine.evals.tuning import tune, write_report  # noqa: PLC0415

    result = tune(engine, seed=seed)
    out = report_dir if report_dir is not None else Path(engine.data_dir) / "tuning-report"
    paths = write_report(result, out)
    r = result.report
    ho = r["heldout"]
    click.echo(f"tuned on {r['queries']['total']} pseudo-queries in {r['seconds']['total']} s: held-out objective "
               f"native-only {ho['native_only (floor)']['objective']:.4f}, fitted {ho['fitted']['objective']:.4f} "
               f"-> {'accepted ' + str(r['chosen']) if r['accepted'] else 'floor kept (native only)'}; "
               f"slot filters {'on' if result.calibration.slot_filters else 'off'}", err=True)
    click.echo(f"settings: {result.path}; report: {', '.join(str(p) for p in paths)}", err=True)
    return result


def maybe_tune_after_ingest(engine: Any) -> None:
    """After an ingest: tune when settings allow and the catalogue is small enough to be cheap."""
    s = engine.settings
    n = len(engine)
    if not s.tune_after_ingest or s.calibration != "auto" or n == 0:
        return
    if n > s.tune_auto_max_products:
        click.echo(f"not tuning automatically: {n} products > tune_auto_max_products "
                   f"({s.tune_auto_max_products}); run `vitrine tune --data {engine.data_dir}`", err=True)
        return
    cal = engine.calibration
    if cal.source == "tuned":
        return  # still fits this catalogue
    run_tune(engine, None)


@main.command("tune")
@data_option
@model_options
@click.option("--report", "report_dir", type=click.Path(path_type=Path), default=None,
              help="Folder for tuning.md/.json/.png (default: DATA/tuning-report)")
@click.option("--seed", type=int, default=0, show_default=True, help="Pseudo-query sampling seed")
def tune_cmd(data_dir: Path, report_dir: Path | None, seed: int, **model: Any) -> None:
    """Fit text ranking to this catalogue on pseudo-queries made from its own records; the fit is
    kept only if it beats the text tower's own ranking on held-out ones (docs/tuning.md)."""
    from vitrine.search.engine import Engine  # noqa: PLC0415

    engine = Engine.open(make_settings(data_dir=data_dir, **model))
    try:
        run_tune(engine, report_dir, seed=seed)
    finally:
        engine.close()
