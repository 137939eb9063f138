"""``vitrine bench``: performance benchmarks (their code lives in ``vitrine_bench``, outside the library)."""

from __future__ import annotations

from pathlib import Path

import click

from vitrine.cli import main

OUT = Path("bench-results")


def _bench():  # noqa: ANN202
    try:
        import vitrine_bench  # noqa: F401
    except ImportError as e:  # pragma: no cover
        raise click.ClickException("benchmarks need the vitrine_bench package from a Vitrine checkout") from e


@main.group()
def bench() -> None:
    """Performance benchmarks; each writes markdown + JSON + plots under --out."""


@bench.command("api")
@click.option("--data", "data_dir", type=click.Path(path_type=Path, file_okay=False), required=True)
@click.option("--concurrency", default="1,16,64", show_default=True, help="Client counts, comma-separated")
@click.option("--duration", type=float, default=15.0, show_default=True, help="Seconds per cell")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=OUT, show_default=True)
def bench_api(data_dir: Path, concurrency: str, duration: float, out: Path) -> None:
    """API under load on loopback: QPS and p50/p95/p99 for text, photo and mixed queries."""
    _bench()
    from vitrine.ingest.fashion import bundled_dir
    from vitrine_bench import api

    path = api.run(data_dir, out, concurrency=[int(c) for c in concurrency.split(",")], duration=duration,
                   source=bundled_dir())
    click.echo(f"report: {path}")


@bench.command("ingest")
@click.option("--n", type=int, default=2000, show_default=True, help="Products to ingest")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=OUT, show_default=True)
def bench_ingest(n: int, out: Path) -> None:
    """Batch ingest throughput (products/s with photos) from a cold feature cache."""
    _bench()
    from vitrine.ingest.fashion import bundled_dir
    from vitrine_bench import ingest

    click.echo(f"report: {ingest.run(out, n=n, source=bundled_dir())}")


@bench.command("graph")
@click.option("--data", "data_dir", type=click.Path(path_type=Path, file_okay=False, exists=True), default=None,
              help="Also measure search latency with and without hybrid fusion on this data dir")
@click.option("--upserts", type=int, default=500, show_default=True, help="Single-product operations timed")
@click.option("--searches", type=int, default=200, show_default=True, help="Queries per fusion setting (--data)")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=OUT, show_default=True)
def bench_graph(data_dir: Path | None, upserts: int, searches: int, out: Path) -> None:
    """Knowledge graph + BM25: build over the full catalogue, single-product upsert (time, memory)."""
    _bench()
    from vitrine.ingest.fashion import bundled_dir
    from vitrine_bench import graph

    click.echo(f"report: {graph.run(out, source=bundled_dir(), data_dir=data_dir, upserts=upserts, searches=searches)}")


@bench.command("fusion")
@click.option("--data", "data_dir", type=click.Path(path_type=Path, file_okay=False, exists=True), required=True)
@click.option("--queries", type=click.Path(path_type=Path, dir_okay=False, exists=True), required=True, multiple=True,
              help="Qrels to tune on, repeatable (the val split's: `vitrine make-queries --split val`)")
@click.option("--limit", type=int, default=None, help="Only the first N queries")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=OUT, show_default=True)
def bench_fusion(data_dir: Path, queries: tuple[Path, ...], limit: int | None, out: Path) -> None:
    """Tune the hybrid-ranking weights (weighted and reciprocal-rank fusion) on a qrels file."""
    _bench()
    from vitrine_bench import fusion

    click.echo(f"report: {fusion.run(data_dir, list(queries), out, limit=limit)}")


@bench.command("intent")
@click.option("--n", type=int, default=2000, show_default=True, help="Queries timed (batch 1)")
@click.option("--weights", default=None, help="Intent classifier name or folder (default from settings)")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=OUT, show_default=True)
def bench_intent(n: int, weights: str | None, out: Path) -> None:
    """Intent classifier + slot extraction latency per query on CPU at batch 1 (p50/p95/p99)."""
    _bench()
    from vitrine.cli import make_settings
    from vitrine_bench import intent

    settings = make_settings()
    click.echo(f"report: {intent.run(out, n=n, weights=weights or settings.intent_model, cache_dir=settings.cache_dir / 'intent')}")


@bench.command("kafka")
@click.option("--n", type=int, default=1000, show_default=True, help="Products per throughput case")
@click.option("--freshness-events", type=int, default=100, show_default=True, help="Events timed for freshness")
@click.option("--rate", type=float, default=5.0, show_default=True, help="Freshness events per second")
@click.option("--batch-size", type=int, default=64, show_default=True)
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=OUT, show_default=True)
def bench_kafka(n: int, freshness_events: int, rate: float, batch_size: int, out: Path) -> None:
    """Kafka ingest against a local Tansu broker: events/s with and without photo encoding, and
    freshness (event produced -> searchable) p50/p99."""
    _bench()
    from vitrine.ingest.fashion import bundled_dir
    from vitrine_bench import kafka

    path = kafka.run(out, n=n, source=bundled_dir(), freshness_events=freshness_events, rate=rate,
                     batch_size=batch_size)
    click.echo(f"report: {path}")

