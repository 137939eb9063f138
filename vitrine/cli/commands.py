"""CLI commands. Heavy imports happen inside commands so ``vitrine --help`` stays instant."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import click

from vitrine.cli.base import data_option, main, make_settings, model_options, store_option
from vitrine.cli.kafka import serve_options  # also registers publish/consume

log = logging.getLogger("vitrine")


def _engine(settings):
    from vitrine.search.engine import Engine

    return Engine.open(settings)


def _print_report(report) -> None:
    click.echo(
        f"upserted {report.upserted}, unchanged {report.unchanged}, stale {report.stale}, "
        f"failed {len(report.failed)} in {report.seconds:.1f}s"
    )
    for err in report.failed[:50]:
        where = f"line {err.line}" if err.line else "record"
        click.echo(f"  {where} (id={err.id}): {err.reason}", err=True)
    if len(report.failed) > 50:
        click.echo(f"  ... and {len(report.failed) - 50} more", err=True)


@main.command()
@click.argument("catalog", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@data_option
@model_options
@store_option
@click.option("--limit", type=int, default=None, help="Ingest only the first N records")
@click.option("--batch-size", type=int, default=512, show_default=True)
@click.option("--jobs", type=click.IntRange(1, 256), default=None,
              help="Cores the encoders use (torch intra-op threads, VITRINE_TORCH_THREADS; default: all). "
                   "Reading and photo fetching run beside them in threads of their own")
def ingest(catalog: Path, data_dir: Path, limit: int | None, batch_size: int, jobs: int | None,
           **model: Any) -> None:
    """Batch-ingest a JSONL or CSV catalogue file into a data dir."""
    from vitrine.ingest.catalog import ingest_file

    settings = make_settings(data_dir=data_dir, torch_threads=jobs, **model)
    engine = _engine(settings)
    try:
        report = ingest_file(engine, catalog, batch_size=batch_size, limit=limit, progress=True)
        if report.upserted:
            from vitrine.cli.tune import maybe_tune_after_ingest

            maybe_tune_after_ingest(engine)
    finally:
        engine.close()
    _print_report(report)
    if report.failed and not report.upserted and not report.unchanged:
        sys.exit(1)


@main.command()
@data_option
@model_options
@store_option
@click.option("--host", default=None, help="Bind address (default 127.0.0.1)")
@click.option("--port", type=int, default=None, help="Port (default 8000)")
@click.option("--workers", type=click.IntRange(1, 64), default=None,
              help="API worker processes (default 1). One Python process tops out near one core; each worker "
                   "loads the models and follows the data dir, so writes through any are seen by all")
@serve_options
def serve(data_dir: Path, host: str | None, port: int | None, workers: int | None, consume: bool,
          follow: float | None, **model: Any) -> None:
    """Serve the search API and UI over a data dir."""
    settings = make_settings(data_dir=data_dir, host=host, port=port, workers=workers, **model)
    _serve(settings, consume=consume, follow=follow)


def _serve(settings, *, consume: bool = False, follow: float | None = None) -> None:
    if consume or follow:
        if settings.web.workers > 1:
            raise click.UsageError("--workers runs API processes only; run `vitrine consume` beside them "
                                   "(they follow the data dir it writes)")
        from vitrine.cli.kafka import serve_with_stream

        return serve_with_stream(settings, consume=consume, follow=follow)
    import uvicorn

    if settings.web.workers > 1:
        from vitrine.web.workers import serve_shared

        web = settings.web
        click.echo(f"Vitrine serving {settings.storage.data_dir} at http://{web.host}:{web.port}/ with "
                   f"{web.workers} worker processes sharing one copy of the indexes (API docs at /docs)", err=True)
        serve_shared(settings)
        return
    from vitrine.web.app import create_app

    app = create_app(settings)
    click.echo(f"Vitrine serving {settings.storage.data_dir} at http://{settings.web.host}:{settings.web.port}/ "
               f"(API docs at /docs)", err=True)
    uvicorn.run(app, host=settings.web.host, port=settings.web.port, log_level="warning")


@main.command()
@click.option("--data", "data_dir", type=click.Path(path_type=Path), default=Path(".vitrine/demo"),
              show_default=True, help="Where the demo data dir is built")
@click.option("--full", is_flag=True, help="The full catalogue of a source checkout (data/fashion-small, 20,873 "
                                           "products) instead of the shipped demo catalogue (2,000)")
@click.option("--limit", type=int, default=None, help="A stratified subset of N products of the catalogue")
@click.option("--host", default=None)
@click.option("--port", type=int, default=None)
@click.option("--no-serve", is_flag=True, help="Build the demo data dir and exit")
def demo(data_dir: Path, full: bool, limit: int | None, host: str | None, port: int | None, no_serve: bool) -> None:
    """Build the demo data dir (once) from the shipped demo catalogue, then serve API + UI."""
    from vitrine.ingest.catalog import ingest_records, read_catalog
    from vitrine.bundled import bundled_dir, demo_dir
    from vitrine.ingest.fashion import convert, demo_subset

    settings = make_settings(data_dir=data_dir, host=host, port=port)
    source = bundled_dir() if full else demo_dir()
    marker = data_dir / "demo.json"
    want = ("full" if full else "demo") + (f"-{limit}" if limit else "")
    state = json.loads(marker.read_text()) if marker.is_file() else {}
    if state.get("catalog") != want:
        t0 = time.time()
        ids = demo_subset(source, limit) if limit else None
        # the converted catalogue goes into the data dir (the package folder may be read-only); its
        # photo paths are relative to the catalogue folder, the only folder ingest reads photos from
        out = data_dir / "catalog-source.jsonl"
        n = convert(source, out, ids, photo_base=source)
        click.echo(f"building the demo data dir {data_dir} from {n} bundled products (once)...", err=True)
        engine = _engine(settings)
        try:
            report = ingest_records(engine, read_catalog(out), source, progress=True, total=n)
        finally:
            engine.close()
        _print_report(report)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"catalog": want, "products": n, "seconds": round(time.time() - t0, 1)}))
        click.echo(f"demo built in {time.time() - t0:.0f}s", err=True)
    else:
        click.echo(f"reusing the demo data dir {data_dir} ({state.get('products')} products)", err=True)
    if not no_serve:
        _serve(settings)


@main.command("convert-fashion")
@click.option("--source", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Folder with styles.csv + images/ (default: the bundled catalogue)")
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), required=True,
              help="JSONL to write, anywhere: its photo paths are relative to its folder, and when the "
                   "source's images/ is not inside that folder the photos are hard-linked (copied "
                   "across filesystems) into an images/ folder beside it, so `vitrine ingest FILE` reads them")
@click.option("--split", type=click.Choice(["train", "val", "test"]), multiple=True,
              help="Only these splits (repeatable)")
@click.option("--limit", type=int, default=None, help="A stratified subset of N products")
@click.option("--language", type=click.Choice(["en", "zh"]), default="en", show_default=True,
              help="zh: titles, categories and attributes written in Chinese (same ids and photos)")
def convert_fashion(source: Path | None, out: Path, split: tuple[str, ...], limit: int | None, language: str) -> None:
    """Convert the Fashion Product Images styles.csv + photos to Vitrine's JSONL catalogue format
    (``--language zh``: a Chinese-titled variant of it, vitrine/ingest/fashion_zh.py)."""
    from vitrine.bundled import bundled_dir, read_splits
    from vitrine.ingest.fashion import convert, demo_subset
    from vitrine.ingest.fashion_zh import convert_zh

    source = source or bundled_dir()
    ids: set[str] | None = None
    if limit:
        ids = set(demo_subset(source, limit))
    if split:
        sp = read_splits(source)
        in_split = {i for i, s in sp.items() if s in split}
        ids = in_split if ids is None else ids & in_split
    n = convert_zh(source, out, ids) if language == "zh" else convert(source, out, ids)
    click.echo(f"wrote {n} products to {out}")


@main.command()
@data_option
@model_options
@click.argument("text", required=False)
@click.option("--image", type=click.Path(path_type=Path, exists=True, dir_okay=False), default=None)
@click.option("-k", type=int, default=10, show_default=True)
@click.option("--filter", "filters", multiple=True, help="field=value (category, gender, colour, brand, "
                                                         "price_min, price_max); repeatable")
@click.option("--explain", is_flag=True)
def search(data_dir: Path, text: str | None, image: Path | None, k: int, filters: tuple[str, ...],
           explain: bool, **model: Any) -> None:
    """Search a data dir from the command line (JSON out)."""
    from vitrine.search.models import Filters, SearchRequest

    flt: dict[str, Any] = {}
    for f in filters:
        key, _, val = f.partition("=")
        if not val:
            raise click.BadParameter(f"--filter {f!r}: expected field=value")
        flt.setdefault(key, []).append(val) if key not in ("price_min", "price_max") else flt.update({key: val})
    settings = make_settings(data_dir=data_dir, **model)
    engine = _engine(settings)
    res = engine.search(
        SearchRequest(text=text, k=k, explain=explain, filters=Filters.model_validate(flt) if flt else None),
        image=image.read_bytes() if image else None,
    )
    click.echo(res.model_dump_json(indent=2, exclude_none=True))


@main.command()
@data_option
@model_options
def reindex(data_dir: Path, **model: Any) -> None:
    """Re-embed products whose vectors came from another model (after changing the adapter)."""
    settings = make_settings(data_dir=data_dir, **model)
    engine = _engine(settings)
    try:
        n = engine.reembed(progress=True)
    finally:
        engine.close()
    click.echo(f"re-embedded {n} products")


@main.command()
@data_option
def info(data_dir: Path) -> None:
    """What a data dir holds (no models loaded)."""
    from vitrine.index.records import RecordStore

    if not (data_dir / "records.sqlite").is_file():
        raise click.BadParameter(f"{data_dir} is not a Vitrine data dir", param_hint="--data")
    rs = RecordStore(data_dir / "records.sqlite")
    manifest = data_dir / "index" / "manifest.json"
    click.echo(json.dumps({
        "products": rs.count(), "seq": rs.seq,
        "index": json.loads(manifest.read_text()) if manifest.is_file() else None,
    }, indent=2))


