"""`vitrine tune`: fit text ranking to a catalogue (vitrine/evals/tuning.py; docs/tuning.md)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import click

from vitrine.cli.base import data_option, main, make_settings, model_options

log = logging.getLogger("vitrine")


def labelled_queries(files: tuple[Path, ...] | list[Path], *, seed: int = 0) -> list[Any]:
    """The shop's own judged queries (``vitrine eval --queries`` JSONL) as tuning queries, one kind
    per file (``shop:<file stem>``); photo queries are skipped (tuning fits text ranking)."""
    from vitrine.evals.datasets import load_qrels
    from vitrine.evals.pseudo_queries import labelled
    from vitrine.evals.tuning import LABELLED_PREFIX

    out: list[Any] = []
    for f in files:
        qs = [(q.qid, q.text, q.relevant) for q in load_qrels(f) if q.text and q.image is None]
        out += labelled(qs, kind=LABELLED_PREFIX + Path(f).stem, seed=seed)
    return out


def run_tune(engine: Any, report_dir: Path | None, *, seed: int = 0, queries: tuple[Path, ...] = (),
             taxonomy_queries: int | None = None, samples: int | None = None, logs: bool = True) -> Any:
    """Tune ``engine``'s catalogue, save the settings in its data dir, write the report.
    ``queries``: the shop's own judged queries, fitted beside the pseudo-queries. ``logs``: first
    learn from the search log (vitrine/evals/log_tuning.py), and fit its clear choices too."""
    from vitrine.evals.tuning import tune
    from vitrine.evals.tuning_report import rounded, write_report

    labelled = labelled_queries(queries, seed=seed)
    if logs:
        from vitrine.evals.log_tuning import tune_from_logs

        got = tune_from_logs(engine, seed=seed)
        labelled += got.labelled
        j = got.report.get("judge", {})
        click.echo(f"search log: {got.report['searches']} searches, {got.report['events']} events; "
                   f"{got.report['outcome']}" + (f" ({j.get('queries', 0)} queries judged on the later slice)"
                                                  if j else ""), err=True)
    result = tune(engine, seed=seed, labelled=labelled, taxonomy_queries=taxonomy_queries, samples=samples)
    out = report_dir if report_dir is not None else Path(engine.data_dir) / "tuning-report"
    paths = write_report(result, out)
    r = result.report
    ho = r["heldout"]
    click.echo(f"tuned on {r['queries']['total']} pseudo-queries in {r['seconds']['total']} s: held-out objective "
               f"native-only {ho['native_only (floor)']['objective']:.4f}, fitted {ho['fitted']['objective']:.4f} "
               f"-> {'accepted ' + str(rounded(r['chosen'])) if r['accepted'] else 'floor kept (native only)'}; "
               f"slot filters {'on' if result.calibration.slot_filters else 'off'}", err=True)
    rf = r.get("relevance_floor") or {}
    if rf.get("fitted") is not None:
        click.echo(f"relevance floor: {rf['fitted']} of a query's top score (held-out pseudo-queries: precision "
                   f"{rf['precision']}, recall {rf['recall']}; configured {rf['configured']})", err=True)
    click.echo(f"evidence: held-out gain over the floor {r['evidence']}", err=True)
    for label, m in (r.get("labelled") or {}).get("heldout", {}).items():
        click.echo(f"  shop's held-out queries, {label}: nDCG@10 {m['nDCG@10']:.4f} (objective {m['objective']:.4f})",
                   err=True)
    click.echo(f"settings: {result.path}; report: {', '.join(str(p) for p in paths)}", err=True)
    return result


def maybe_tune_after_ingest(engine: Any) -> None:
    """After an ingest: tune when settings allow and the catalogue is small enough to be cheap."""
    s = engine.settings
    n = len(engine)
    if not s.search.tune_after_ingest or s.search.calibration != "auto" or n == 0:
        return
    if n > s.search.tune_auto_max_products:
        click.echo(f"not tuning automatically: {n} products > tune_auto_max_products "
                   f"({s.search.tune_auto_max_products}); run `vitrine tune --data {engine.data_dir}`", err=True)
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
@click.option("--queries", "queries", type=click.Path(path_type=Path, exists=True, dir_okay=False), multiple=True,
              help="The shop's own judged queries (query logs, judgements; the JSONL of `vitrine eval --queries`), "
                   "fitted together with the pseudo-queries; part held out for acceptance. Repeatable")
@click.option("--taxonomy-queries", type=click.IntRange(0, 100_000), default=None,
              help="This many pseudo-queries naming the Google-taxonomy nodes the categories map to, in other "
                   "words than the records' (default: VITRINE_TUNE_TAXONOMY_QUERIES, 200; 0: none; docs/tuning.md)")
@click.option("--samples", type=click.IntRange(1, 20), default=None,
              help="Samples of pseudo-queries fitted apart, the served mix their mean (default: VITRINE_TUNE_SAMPLES, "
                   "5; 1: one fit; docs/tuning.md)")
@click.option("--logs-only", is_flag=True, help="Only learn from the search log (the per-query re-ranking): "
              "seconds, not the catalogue's full tune")
@click.option("--logs/--no-logs", default=True, show_default=True,
              help="Learn from the search log first (clicks, add-to-carts, purchases posted to /v1/events): a "
                   "per-query re-ranking kept only if it beats what serves on a later slice of the log")
@click.option("--intent", "intent_members", type=int, default=0, show_default=True,
              help="Also fine-tune the shipped intent classifier's members on this catalogue's titles, this "
                   "many members (0: no), into DATA/intent-model")
def tune_cmd(data_dir: Path, report_dir: Path | None, seed: int, queries: tuple[Path, ...], taxonomy_queries: int | None,
             samples: int | None, intent_members: int, logs: bool, logs_only: bool, **model: Any) -> None:
    """Fit text ranking to this catalogue on pseudo-queries made from its own records; the fit is
    kept only if it beats the text tower's own ranking on held-out ones (docs/tuning.md)."""
    from vitrine.search.engine import Engine

    engine = Engine.open(make_settings(data_dir=data_dir, **model))
    try:
        if logs_only:
            from vitrine.evals.log_tuning import tune_from_logs

            got = tune_from_logs(engine, seed=seed)
            click.echo(f"search log: {got.report['searches']} searches, {got.report['events']} events; "
                       f"{got.report['outcome']}", err=True)
            click.echo(json.dumps(got.report, indent=2, default=str))
            return
        run_tune(engine, report_dir, seed=seed, queries=queries, taxonomy_queries=taxonomy_queries, samples=samples,
                 logs=logs)
        if intent_members:
            from vitrine.training.intent_tuning import catalogue_titles, tune_intent

            out = Path(data_dir) / "intent-model"
            titles = catalogue_titles(r.doc for r in engine.records.iter_rows(with_vectors=False))
            summary = tune_intent(titles, out, members=intent_members,
                                  cache_dir=engine.settings.storage.cache_dir / "intent", seed=seed)
            click.echo(f"intent classifier with {len(titles)} catalogue titles: {out} "
                       f"(serve it with VITRINE_INTENT_MODEL={out}); held-out: "
                       f"{ {k: v for k, v in summary.items() if isinstance(v, (int, float))} }", err=True)
    finally:
        engine.close()


def domain_shift_command(settings: Any, work_dir: Path, n_attr: int, retrain: bool) -> dict[str, Any]:
    from vitrine.evals.datasets import Catalog
    from vitrine.evals.domain_shift import domain_shift
    from vitrine.index.vocabulary import GraphData
    from vitrine.training.domain_shift import train_aligner_on_rows

    full = Catalog.load()
    brands = GraphData.load(settings.index.graph_dir, settings.index.taxonomy_file).brands
    return domain_shift(settings, full.rows, full.splits, full.photo,
                        lambda rows, out: train_aligner_on_rows(settings, rows, out), work_dir,
                        n_attr=n_attr, n_words=max(1, n_attr // 2), brand_fn=brands.from_title, retrain=retrain)
