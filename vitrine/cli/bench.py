"""``vitrine bench``: performance benchmarks (their code lives in ``vitrine_bench``, outside the library)."""

from __future__ import annotations

from pathlib import Path

import click

from vitrine.cli.base import main, make_settings

OUT = Path("bench-results")


BENCH_EXTRA = ("matplotlib", "aiohttp")  # pyproject.toml's `bench` extra


def _bench():
    """Fail with what to install when the benchmarks' dependencies are missing."""
    from importlib.util import find_spec

    missing = [m for m in ("vitrine_bench", *BENCH_EXTRA) if find_spec(m) is None]
    if missing:
        raise click.ClickException(f"benchmarks need {', '.join(missing)}: pip install 'vitrine[bench]' "
                                   "(in a checkout: pip install -e '.[bench]')")


@main.group()
def bench() -> None:
    """Performance benchmarks; each writes markdown + JSON + plots under --out."""


@bench.command("api")
@click.option("--data", "data_dir", type=click.Path(path_type=Path, file_okay=False), required=True)
@click.option("--concurrency", default="1,16,64", show_default=True, help="Client counts, comma-separated")
@click.option("--duration", type=float, default=15.0, show_default=True, help="Seconds per cell")
@click.option("--query-cache/--no-query-cache", default=False, show_default=True,
              help="Serve with the query-embedding cache on (repeated queries skip their encode)")
@click.option("--rates", default="", show_default=True,
              help="Also run each client count paced at these total request rates (per second, comma-separated)")
@click.option("--mixes", default="text,photo,mixed", show_default=True,
              help="Query mixes to run: text, text+facets (all facets and highlights), text-zh (Chinese text), photo, mixed")
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True,
              help="API worker processes of the server under test (vitrine serve --workers)")
@click.option("--repeats", type=click.IntRange(1, 20), default=1, show_default=True,
              help="Run every cell this many times (a shared machine's speed drifts): the report gives "
                   "each run and the median and range of p99 per cell")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=OUT, show_default=True)
def bench_api(data_dir: Path, concurrency: str, duration: float, query_cache: bool, rates: str, mixes: str,
              workers: int, repeats: int, out: Path) -> None:
    """API under load on loopback: QPS and p50/p95/p99 for text, photo and mixed queries."""
    _bench()
    from vitrine.bundled import bundled_dir
    from vitrine_bench import api

    path = api.run(data_dir, out, concurrency=[int(c) for c in concurrency.split(",")], duration=duration,
                   source=bundled_dir(), query_cache=query_cache,
                   rates=[float(r) for r in rates.split(",") if r.strip()],
                   mixes_wanted=[m.strip() for m in mixes.split(",") if m.strip()], workers=workers,
                   repeats=repeats)
    click.echo(f"report: {path}")


@bench.command("events")
@click.option("--data", "data_dir", type=click.Path(path_type=Path, file_okay=False), required=True)
@click.option("--duration", type=float, default=20.0, show_default=True, help="Seconds per cell")
@click.option("--repeats", type=click.IntRange(1, 20), default=3, show_default=True,
              help="Pairs of cells (searches alone, searches + flood), interleaved")
@click.option("--search-rate", type=float, default=100.0, show_default=True, help="Searches/s (paced, 16 clients)")
@click.option("--event-calls", type=float, default=20.0, show_default=True, help="POST /v1/events calls/s (paced)")
@click.option("--batch", type=click.IntRange(1, 1000), default=50, show_default=True, help="Events per call")
@click.option("--kill-after", type=float, default=6.0, show_default=True,
              help="Seconds into the last flood before the server gets SIGKILL (then restarted, events counted); "
                   "0: no kill")
@click.option("--analytics", is_flag=True, help="The flood cells also read GET /v1/analytics in a loop (side work)")
@click.option("--events-server", is_flag=True,
              help="Send the flood and the analytics reads to a second server on the same data dir, not to the one "
                   "searched (a deployment that routes /v1/events and /v1/analytics to their own process)")
@click.option("--name", default="events-load", show_default=True, help="Report name")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=OUT, show_default=True)
def bench_events(data_dir: Path, duration: float, repeats: int, search_rate: float, event_calls: float, batch: int,
                 kill_after: float, analytics: bool, events_server: bool, name: str, out: Path) -> None:
    """An events flood (POST /v1/events) beside paced searches: search p50/p99 with and without it,
    events answered 202 against events stored, and after a kill -9 of the server."""
    _bench()
    from vitrine.bundled import bundled_dir
    from vitrine_bench import events_load

    path = events_load.run(data_dir, out, source=bundled_dir(), duration=duration, repeats=repeats,
                           search_rate=search_rate, event_calls=event_calls, batch=batch, kill_after=kill_after,
                           name=name, analytics=analytics, events_server=events_server)
    click.echo(f"report: {path}")


@bench.command("typo")
@click.option("--data", "data_dir", type=click.Path(path_type=Path, file_okay=False, exists=True), required=True)
@click.option("--queries", type=click.Path(path_type=Path, dir_okay=False, exists=True), required=True,
              help="Qrels: the test split's exact-word queries (vitrine make-queries --kind words --split test), "
                   "or real queries (data/wands-dev/queries.jsonl)")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=OUT, show_default=True)
@click.option("--gains", type=click.Choice(["linear", "exponential"]), default="exponential", show_default=True,
              help="nDCG's gain for graded qrels (vitrine eval --gains)")
@click.option("--name", default="typo", show_default=True, help="Report name (NAME.md, NAME.json, NAME.png)")
def bench_typo(data_dir: Path, queries: Path, out: Path, gains: str, name: str) -> None:
    """nDCG@10 of queries given one or two typos: typo tolerance off, in BM25, and in every signal."""
    _bench()
    from vitrine.evals.datasets import load_qrels
    from vitrine.search.engine import Engine
    from vitrine_bench import storefront

    engine = Engine.open(make_settings(data_dir=data_dir))
    click.echo(f"report: {storefront.typo(engine, load_qrels(queries), out, gain=gains, name=name)}")


@bench.command("floor")
@click.option("--data", "data_dir", type=click.Path(path_type=Path, file_okay=False, exists=True), required=True)
@click.option("--queries", type=click.Path(path_type=Path, dir_okay=False, exists=True), required=True,
              help="Val qrels (vitrine make-queries --split val)")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=OUT, show_default=True)
def bench_floor(data_dir: Path, queries: Path, out: Path) -> None:
    """The relevance floor of sorted and faceted searches, from val queries."""
    _bench()
    from vitrine.evals.datasets import load_qrels
    from vitrine.search.engine import Engine
    from vitrine_bench import storefront

    click.echo(f"report: {storefront.floor(Engine.open(make_settings(data_dir=data_dir)), load_qrels(queries), out)}")


@bench.command("ingest")
@click.option("--n", type=int, default=2000, show_default=True, help="Products to ingest")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=OUT, show_default=True)
def bench_ingest(n: int, out: Path) -> None:
    """Batch ingest throughput (products/s with photos) from a cold feature cache."""
    _bench()
    from vitrine.bundled import bundled_dir
    from vitrine_bench import ingest

    click.echo(f"report: {ingest.run(out, n=n, source=bundled_dir())}")


@bench.command("ingest-profile")
@click.option("--n-text", type=int, default=4000, show_default=True, help="Products of the text-only catalogue")
@click.option("--n-photo", type=int, default=1000, show_default=True, help="Products of the catalogue with photos")
@click.option("--repeats", type=click.IntRange(1, 20), default=1, show_default=True)
@click.option("--label", default="", help="Suffix of the report's name (ingest-profile-LABEL.md)")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=OUT, show_default=True)
def bench_ingest_profile(n_text: int, n_photo: int, repeats: int, label: str, out: Path) -> None:
    """Ingest stage by stage (parse, towers, gate, SQLite, FTS5, graph, FAISS, snapshot), text-only and
    with photos, against the towers' own throughput in the same run."""
    _bench()
    from vitrine.bundled import bundled_dir
    from vitrine_bench import ingest_profile

    click.echo(f"report: {ingest_profile.run(out, source=bundled_dir(), n_text=n_text, n_photo=n_photo, repeats=repeats, label=label)}")


@bench.command("batch-precision")
@click.option("--catalog", "catalogue", type=click.Path(path_type=Path, dir_okay=False, exists=True), required=True,
              help="A text-only catalogue JSONL (e.g. from `vitrine make-catalogue`)")
@click.option("--n-text", type=int, default=2000, show_default=True, help="Texts of the catalogue for the towers alone")
@click.option("--n-photo", type=int, default=256, show_default=True, help="Bundled photos for the photo tower")
@click.option("--rounds", type=click.IntRange(1, 20), default=3, show_default=True)
@click.option("--ingest-rounds", type=click.IntRange(0, 20), default=2, show_default=True)
@click.option("--jobs", type=click.IntRange(1, 256), default=2, show_default=True, help="vitrine ingest --jobs")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=OUT, show_default=True)
def bench_batch_precision(catalogue: Path, n_text: int, n_photo: int, rounds: int, ingest_rounds: int, jobs: int,
                          out: Path) -> None:
    """The towers' batch precision, float32 vs bf16 autocast, in turn: texts/s and photos/s, how far the
    features move, and the whole text-only `vitrine ingest` command's wall clock."""
    _bench()
    import torch

    from vitrine.bundled import bundled_dir
    from vitrine_bench import batch_precision

    torch.set_num_threads(jobs)
    click.echo(f"report: {batch_precision.run(out, catalogue=catalogue, photos_dir=bundled_dir() / 'images', n_text=n_text, n_photo=n_photo, rounds=rounds, ingest_rounds=ingest_rounds, jobs=jobs)}")


@bench.command("ingest-floor")
@click.option("--catalog", "catalogue", type=click.Path(path_type=Path, dir_okay=False, exists=True), required=True,
              help="A text-only catalogue JSONL (e.g. from `vitrine make-catalogue`)")
@click.option("--n-text", type=int, default=6482, show_default=True, help="Texts of the catalogue for the tower alone")
@click.option("--rounds", type=click.IntRange(1, 20), default=3, show_default=True)
@click.option("--start-rounds", type=click.IntRange(1, 20), default=3, show_default=True)
@click.option("--ingest-rounds", type=click.IntRange(0, 20), default=2, show_default=True)
@click.option("--jobs", type=click.IntRange(1, 256), default=2, show_default=True, help="vitrine ingest --jobs")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=OUT, show_default=True)
def bench_ingest_floor(catalogue: Path, n_text: int, rounds: int, start_rounds: int, ingest_rounds: int, jobs: int,
                       out: Path) -> None:
    """What bounds a text-only `vitrine ingest` from below: start costs, the text tower per numeric form
    (with how far each moves the features), the whole command, and the floor they make."""
    _bench()
    from vitrine_bench import ingest_floor

    click.echo(f"report: {ingest_floor.run(out, catalogue=catalogue, n_text=n_text, rounds=rounds, start_rounds=start_rounds, ingest_rounds=ingest_rounds, jobs=jobs)}")


@bench.command("graph")
@click.option("--data", "data_dir", type=click.Path(path_type=Path, file_okay=False, exists=True), default=None,
              help="Also measure search latency with and without hybrid fusion on this data dir")
@click.option("--upserts", type=int, default=500, show_default=True, help="Single-product operations timed")
@click.option("--searches", type=int, default=200, show_default=True, help="Queries per fusion setting (--data)")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=OUT, show_default=True)
def bench_graph(data_dir: Path | None, upserts: int, searches: int, out: Path) -> None:
    """Knowledge graph + BM25: build over the full catalogue, single-product upsert (time, memory)."""
    _bench()
    from vitrine.bundled import bundled_dir
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
@click.option("--runtimes", default="torch,onnx,onnx-members", show_default=True,
              help="Runs: torch (default threads and 1), onnx (the served stacked graph, 1 thread), onnx-members")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=OUT, show_default=True)
def bench_intent(n: int, weights: str | None, runtimes: str, out: Path) -> None:
    """Intent classifier + slot extraction latency per query on CPU at batch 1 (p50/p95/p99)."""
    _bench()
    from vitrine.cli.base import make_settings
    from vitrine_bench import intent

    settings = make_settings()
    report = intent.run(out, n=n, weights=weights or settings.intent.intent_model,
                        cache_dir=settings.storage.cache_dir / "intent",
                        runtimes=tuple(r.strip() for r in runtimes.split(",") if r.strip()))
    click.echo(f"report: {report}")


@bench.command("gate")
@click.option("--adapters", default="moe,mlp,linear", show_default=True,
              help="Adapters to time, comma-separated (shipped names or NAME=FOLDER; a trained MoE: "
                   "moe=vitrine/encoders/weights/moe; FOLDER@KEY=VALUE sets an inference option, e.g. "
                   "moe@dynamic_k=true)")
@click.option("--n", type=int, default=2000, show_default=True, help="Queries timed per cell (batch 1)")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=OUT, show_default=True)
def bench_gate(adapters: str, n: int, out: Path) -> None:
    """What the adapter / MoE gate adds to a query: its forward per query on CPU (p50/p95/p99)."""
    _bench()
    from vitrine_bench import gate

    click.echo(f"report: {gate.run(out, [a.strip() for a in adapters.split(',') if a.strip()], n=n)}")


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
    from vitrine.bundled import bundled_dir
    from vitrine_bench import kafka

    path = kafka.run(out, n=n, source=bundled_dir(), freshness_events=freshness_events, rate=rate,
                     batch_size=batch_size)
    click.echo(f"report: {path}")



@bench.command("encoders")
@click.option("--batch-sizes", default="1,8,32,128", show_default=True, help="Batch sizes, comma-separated")
@click.option("--threads", default=None, help="torch thread counts, comma-separated (default: 1 and all cores)")
@click.option("--min-time", type=float, default=1.0, show_default=True, help="Seconds per measurement")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=OUT, show_default=True)
def bench_encoders(batch_sizes: str, threads: str | None, min_time: float, out: Path) -> None:
    """Photos/s and texts/s by batch size and thread count; FLOPs per item vs measured matmul FLOP/s."""
    _bench()
    import os

    from vitrine.bundled import bundled_dir
    from vitrine_bench import encoders

    cores = os.cpu_count() or 1
    th = [int(t) for t in threads.split(",")] if threads else sorted({1, cores})
    click.echo(f"report: {encoders.run(out, source=bundled_dir(), batch_sizes=[int(b) for b in batch_sizes.split(',')], threads=th, min_time=min_time)}")


@bench.command("index")
@click.option("--data", "data_dir", type=click.Path(path_type=Path, file_okay=False, exists=True), required=True,
              help="A full-catalogue data dir (its fused vectors are the real set)")
@click.option("--n-large", type=int, default=1_000_000, show_default=True,
              help="Size of the set grown from the catalogue's vectors")
@click.option("--queries", "n_queries", type=int, default=1000, show_default=True, help="Real text queries")
@click.option("--batch-size", type=int, default=1000, show_default=True, help="Queries per call in batch mode")
@click.option("--catalogue-factories", default="Flat;SQfp16;HNSW32;IVF256,Flat;IVF256,PQ32", show_default=True,
              help="FAISS factories for the catalogue, ';'-separated")
@click.option("--large-factories", default="Flat;HNSW32;IVF4096,Flat;IVF4096,PQ32", show_default=True,
              help="FAISS factories for the large set, ';'-separated")
@click.option("--single-budget", type=float, default=4.0, show_default=True,
              help="Seconds of one-query-at-a-time timing per setting")
@click.option("--skip-catalogue", is_flag=True)
@click.option("--skip-large", is_flag=True)
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=OUT, show_default=True)
def bench_index(data_dir: Path, n_large: int, n_queries: int, batch_size: int, catalogue_factories: str,
                large_factories: str, single_budget: float, skip_catalogue: bool, skip_large: bool,
                out: Path) -> None:
    """Flat / HNSW / IVF-Flat / IVF-PQ: build time, memory, recall@10 vs exact and queries/s
    (single and batched) on the catalogue's vectors and on 1M vectors grown from them."""
    _bench()
    from vitrine.bundled import bundled_dir
    from vitrine_bench import index

    path = index.run(data_dir, out, source=bundled_dir(), n_large=n_large, n_queries=n_queries,
                     batch_size=batch_size, catalogue_factories=catalogue_factories.split(";"),
                     large_factories=large_factories.split(";"), single_budget_s=single_budget,
                     skip_catalogue=skip_catalogue, skip_large=skip_large)
    click.echo(f"report: {path}")


@bench.command("gpu")
@click.option("--n-large", type=int, default=1_000_000, show_default=True,
              help="Vectors grown from the catalogue for the FAISS part (100k at most without a GPU)")
@click.option("--inputs", type=click.Path(path_type=Path, dir_okay=False, exists=True), default=None,
              help="Catalogue + query vectors (.npz from --export-inputs) for a machine without the models")
@click.option("--export-inputs", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Write catalogue + query vectors to this .npz and exit")
@click.option("--cpu-limit", type=int, default=500, show_default=True,
              help="Without CUDA: products encoded in the end-to-end part")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=OUT, show_default=True)
def bench_gpu(n_large: int, inputs: Path | None, export_inputs: Path | None, cpu_limit: int, out: Path) -> None:
    """The prepared GPU benchmark (a few minutes on a GPU machine; GPU parts skipped cleanly without one):
    device selection, encoders and the catalogue on CUDA, FAISS GPU vs CPU."""
    _bench()
    from vitrine.bundled import bundled_dir
    from vitrine_bench import gpu

    if export_inputs is not None:
        click.echo(f"wrote {gpu.export_inputs(export_inputs, bundled_dir())}")
        return
    click.echo(f"report: {gpu.run(out, source=bundled_dir(), n_large=n_large, inputs=inputs, cpu_limit=cpu_limit)}")


@bench.command("fastpath")
@click.option("--data", "data_dir", type=click.Path(path_type=Path, file_okay=False, exists=True), required=True,
              help="A full-catalogue data dir (quality of the text-precision options through the engine)")
@click.option("--duration", type=float, default=4.0, show_default=True, help="Seconds per concurrency cell")
@click.option("--attr-queries", type=int, default=300, show_default=True, help="Attribute queries (test split)")
@click.option("--sizes", default="128x96,80x60", show_default=True, help="Photo input sizes HxW to compare")
@click.option("--skip-quality", is_flag=True, help="Speed only")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=OUT, show_default=True)
def bench_fastpath(data_dir: Path, duration: float, attr_queries: int, sizes: str, skip_quality: bool,
                   out: Path) -> None:
    """The query fast path: micro-batching, cache, threads; bf16/int8 text tower and smaller photo
    input, each with its speed and its effect on retrieval quality."""
    _bench()
    from vitrine.bundled import bundled_dir
    from vitrine_bench import fastpath

    hw = [tuple(int(x) for x in s.lower().split("x")) for s in sizes.split(",")]
    path = fastpath.run(data_dir, out, source=bundled_dir(), duration=duration, n_attr=attr_queries,
                        skip_quality=skip_quality, sizes=hw)  # type: ignore[arg-type]  # "HxW" pairs: tuples of two ints
    click.echo(f"report: {path}")


@bench.command("soak")
@click.option("--data", "data_dir", type=click.Path(path_type=Path, file_okay=False, exists=True), required=True,
              help="A data dir to serve (writes go to soak-* ids in it)")
@click.option("--duration", type=float, default=600.0, show_default=True, help="Seconds of load")
@click.option("--clients", type=int, default=6, show_default=True, help="Concurrent client threads")
@click.option("--sample", "sample_s", type=float, default=5.0, show_default=True, help="Seconds per sample")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=OUT, show_default=True)
def bench_soak(data_dir: Path, duration: float, clients: int, sample_s: float, out: Path) -> None:
    """Mixed load (search, recommend, compare, upserts, deletes) for minutes: errors, and RSS and
    latency over time (does memory stop growing?)."""
    _bench()
    from vitrine.bundled import bundled_dir
    from vitrine_bench import soak

    path = soak.run(data_dir, out, source=bundled_dir(), duration=duration, clients=clients, sample_s=sample_s)
    click.echo(f"report: {path}")


@bench.command("pgvector")
@click.option("--data", "data_dir", type=click.Path(path_type=Path, file_okay=False), required=True,
              help="A SQLite data dir whose vectors are the base and the queries")
@click.option("--queries", type=int, default=300, show_default=True)
@click.option("--ef-search", type=int, default=128, show_default=True)
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=OUT, show_default=True)
def bench_pgvector(data_dir: Path, queries: int, ef_search: int, out: Path) -> None:
    """pgvector HNSW (iterative scan) vs FAISS Flat: recall@10, filtered k, latency."""
    _bench()
    from vitrine_bench import pgvector

    click.echo(f"report: {pgvector.run(data_dir, out, queries=queries, ef_search=ef_search)}")


@bench.command("scaleout")
@click.option("--n", type=int, default=400, show_default=True, help="Catalogue products (with photos)")
@click.option("--rate", type=float, default=50.0, show_default=True, help="Writes/s through replica A")
@click.option("--seconds", type=float, default=20.0, show_default=True, help="How long the writes run")
@click.option("--load-seconds", type=float, default=15.0, show_default=True, help="Seconds per API latency row")
@click.option("--concurrency", type=int, default=4, show_default=True, help="Closed-loop search clients")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=OUT, show_default=True)
def bench_scaleout(n: int, rate: float, seconds: float, load_seconds: float, concurrency: int, out: Path) -> None:
    """Replicas on a shared PostgreSQL: follow lag, ingest rate and API p99 vs SQLite."""
    _bench()
    from vitrine_bench import scaleout

    click.echo(f"report: {scaleout.run(out, n=n, rate=rate, write_s=seconds, load_s=load_seconds, concurrency=concurrency)}")


@bench.command("suggest")
@click.option("--data", "data_dir", type=click.Path(path_type=Path, file_okay=False), required=True)
@click.option("--rates", default="100", show_default=True, help="Paced request rates (per second, comma-separated)")
@click.option("--clients", type=int, default=8, show_default=True, help="Clients the paced requests are spread over")
@click.option("--duration", type=float, default=30.0, show_default=True, help="Seconds per rate")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=OUT, show_default=True)
def bench_suggest(data_dir: Path, rates: str, clients: int, duration: float, out: Path) -> None:
    """Search-as-you-type: GET /v1/suggest p50/p99 paced against a served data dir (keystroke prefixes,
    a third with a typo), and the suggestion index alone over the full bundled catalogue."""
    _bench()
    from vitrine.bundled import bundled_dir
    from vitrine_bench import suggest

    path = suggest.run(data_dir, out, source=bundled_dir(), rates=[float(r) for r in rates.split(",") if r.strip()],
                       clients=clients, duration=duration)
    click.echo(f"report: {path}")


@bench.command("suggest-zh")
@click.option("--n", "n", type=int, default=3000, show_default=True, help="Typed forms per kind")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=OUT, show_default=True)
@click.option("--data", "data_dir", type=click.Path(path_type=Path, file_okay=False, exists=True), default=None,
              help="A served data dir (a Chinese shop): time GET /v1/suggest on it instead, each typed form once")
def bench_suggest_zh(n: int, out: Path, data_dir: Path | None) -> None:
    """Suggestions for Chinese shoppers: the index alone (in process) over the bundled catalogue with
    its Chinese forms and over a Chinese-titled variant; lookup p50/p99 for whole pinyin, initials,
    mixed and homophone prefixes, English prefixes beside them. With --data: GET /v1/suggest on
    that data dir's own Chinese phrases (n typed forms per kind)."""
    _bench()
    from vitrine.bundled import bundled_dir
    from vitrine_bench import suggest_zh

    if data_dir is not None:
        click.echo(f"report: {suggest_zh.served(data_dir, out, n=n)}")
        return
    click.echo(f"report: {suggest_zh.run(bundled_dir(), out, n=n)}")


@bench.command("rules")
@click.option("--data", "data_dir", type=click.Path(path_type=Path, file_okay=False, exists=True), required=True)
@click.option("--n-rules", type=int, default=10_000, show_default=True, help="Rules stored")
@click.option("--queries", "n_queries", type=int, default=200, show_default=True, help="Text queries per round")
@click.option("--rounds", type=click.IntRange(1, 20), default=3, show_default=True,
              help="Interleaved rounds without and with the rules")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=OUT, show_default=True)
def bench_rules(data_dir: Path, n_rules: int, n_queries: int, rounds: int, out: Path) -> None:
    """Merchandising rules: p50/p99 of the rules step alone and of whole searches without and with
    N rules stored (a rule store of its own: the data dir's rules are left alone)."""
    _bench()
    from vitrine.search.engine import Engine
    from vitrine_bench import rules

    engine = Engine.open(make_settings(data_dir=data_dir))
    try:
        click.echo(f"report: {rules.run(engine, out, n_rules=n_rules, n_queries=n_queries, rounds=rounds)}")
    finally:
        engine.close()


def _numbers(text: str, kind: type = float) -> list:
    try:
        return [kind(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise click.BadParameter(f"a comma-separated list of numbers: {e}") from e


@bench.command("store-outage")
@click.option("--outages", default="2,20,120", show_default=True,
              help="Seconds the PostgreSQL store is kept down, one run each, comma-separated")
@click.option("--products", "n", type=int, default=200, show_default=True, help="Products the replica holds")
@click.option("--rate", type=float, default=20.0, show_default=True, help="Searches and product reads per second")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=OUT, show_default=True)
def bench_store_outage(outages: str, n: int, rate: float, out: Path) -> None:
    """A replica over PostgreSQL while the database is crashed (pg_ctl -m immediate) and back:
    status, degraded answers and latency of searches, product reads and writes per phase, when
    writes are taken again, acknowledged writes lost (a PostgreSQL of its own, tiny test towers)."""
    _bench()
    from vitrine_bench import store_outage

    click.echo(f"report: {store_outage.run(out, outages=_numbers(outages), n=n, rate=rate)}")


@bench.command("growth")
@click.option("--sizes", default="10000,100000", show_default=True,
              help="Catalogue sizes (products), comma-separated; e.g. 10000,100000,1000000")
@click.option("--work", type=click.Path(path_type=Path, file_okay=False), required=True,
              help="Folder for the generated catalogues and their data dirs (large at 1M)")
@click.option("--jobs", type=click.IntRange(1, 256), default=2, show_default=True, help="vitrine ingest --jobs")
@click.option("--queries", "n_queries", type=int, default=200, show_default=True, help="Test queries searched per size")
@click.option("--reuse", is_flag=True, help="Measure a size's catalogue and data dir a previous run left in WORK "
                                           "(with the ingest time it recorded) instead of making and ingesting again")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=OUT, show_default=True)
def bench_growth(sizes: str, work: Path, jobs: int, n_queries: int, reuse: bool, out: Path) -> None:
    """What a catalogue's size costs end to end, per size (`vitrine make-catalogue`): ingest time
    and products/s, data dir size, restart time, memory of a worker, search p50/p99, facets, a deep page."""
    _bench()
    from vitrine_bench import growth

    report = growth.run(out, sizes=_numbers(sizes, int), work=work, jobs=jobs, n_queries=n_queries, reuse=reuse)
    click.echo(f"report: {report}")
