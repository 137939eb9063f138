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
