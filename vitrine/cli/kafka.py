"""``vitrine publish`` and ``vitrine consume``: the Kafka catalogue stream, and the serving
topologies that go with it (``vitrine serve --consume`` / ``--follow``). The machinery lives in
:mod:`vitrine.ingest.kafka`; heavy imports happen inside the commands."""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click

from vitrine.cli.base import main, make_settings, model_options, store_option

log = logging.getLogger("vitrine")


def _stream_options(f):
    f = click.option("--bootstrap", "kafka_bootstrap", default=None,
                     help="Kafka bootstrap servers host:port[,host:port] (default from settings)")(f)
    f = click.option("--topic", "kafka_topic", default=None, help="Catalogue events topic (default from settings)")(f)
    return f


def _quiet_kafka() -> None:
    """kafka-python logs every failed connection attempt at ERROR; the worker reports outages
    itself (one warning per reconnect), so keep the client library quiet unless debugging."""
    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        logging.getLogger("kafka").setLevel(logging.CRITICAL)


def _parse_version(v: str | None) -> int | None:
    if v is None:
        return None
    if v == "now":
        return int(time.time() * 1000)
    try:
        n = int(v)
    except ValueError as e:
        raise click.BadParameter("expected an integer or 'now'", param_hint="--stamp-version") from e
    if n < 0:
        raise click.BadParameter("must not be negative", param_hint="--stamp-version")
    return n


@main.command()
@click.argument("catalog", required=False, type=click.Path(path_type=Path, exists=True, dir_okay=False))
@_stream_options
@click.option("--delete", "delete_ids", multiple=True, metavar="IDS",
              help="Publish deletes for these product ids (comma-separated; repeatable)")
@click.option("--stamp-version", default=None, metavar="N|now",
              help="Version for events that carry none (an integer, or 'now' = milliseconds since the epoch)")
@click.option("--photos", type=click.Choice(["embed", "reference"]), default="embed", show_default=True,
              help="embed: photos travel in the events as image_b64 (workers need no shared files); "
                   "reference: image paths/URLs go as they are")
@click.option("--partitions", type=int, default=None, help="Partitions if the topic has to be created")
@click.option("--limit", type=int, default=None, help="Publish only the first N records")
def publish(catalog: Path | None, kafka_topic: str | None, kafka_bootstrap: str | None, delete_ids: tuple[str, ...],
            stamp_version: str | None, photos: str, partitions: int | None, limit: int | None) -> None:
    """Publish a catalogue file (JSONL/CSV) as upsert events keyed by product id (acks=all), or
    deletes with --delete."""
    from vitrine.ingest.kafka.publisher import publish_catalog, publish_deletes

    if catalog is None and not delete_ids:
        raise click.UsageError("give a CATALOG file to publish, or --delete IDS")
    _quiet_kafka()
    settings = make_settings(kafka_topic=kafka_topic, kafka_bootstrap=kafka_bootstrap)
    version = _parse_version(stamp_version)
    failed = 0
    if catalog is not None:
        rep = publish_catalog(settings, catalog, embed_photos=photos == "embed", version=version, limit=limit,
                              progress=True, partitions=partitions)
        click.echo(f"published {rep.sent} upserts to {rep.topic} ({rep.bytes / 1e6:.1f} MB) in {rep.seconds:.1f}s; "
                   f"{len(rep.failed)} failed")
        for err in rep.failed[:50]:
            where = f"line {err.line}" if err.line else "record"
            click.echo(f"  {where} (id={err.id}): {err.reason}", err=True)
        if len(rep.failed) > 50:
            click.echo(f"  ... and {len(rep.failed) - 50} more", err=True)
        failed += len(rep.failed)
        if rep.failed and not rep.sent:
            sys.exit(1)
    ids = [i.strip() for chunk in delete_ids for i in chunk.split(",") if i.strip()]
    if ids:
        rep = publish_deletes(settings, ids, version=version)
        click.echo(f"published {rep.sent} deletes to {rep.topic}; {len(rep.failed)} failed")
        for err in rep.failed:
            click.echo(f"  id={err.id}: {err.reason}", err=True)
        if rep.failed:
            sys.exit(1)


@main.command("publish-events")
@click.argument("events_file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@_stream_options
@click.option("--partitions", type=int, default=None, help="Partitions if the topic has to be created")
@click.option("--limit", type=int, default=None, help="Publish only the first N events")
def publish_events_cmd(events_file: Path, kafka_topic: str | None, kafka_bootstrap: str | None,
                       partitions: int | None, limit: int | None) -> None:
    """Publish shopper events (JSONL: one POST /v1/events event object a line, or a {"events": [...]}
    body a line) as `op: event` messages keyed by query_id, acks=all, for `vitrine consume --events`
    (default topic vitrine.events)."""
    from vitrine.ingest.events import EVENTS_TOPIC
    from vitrine.ingest.kafka.publisher import publish_events

    _quiet_kafka()
    settings = make_settings(kafka_topic=kafka_topic or EVENTS_TOPIC, kafka_bootstrap=kafka_bootstrap)
    rep = publish_events(settings, events_file, limit=limit, partitions=partitions)
    click.echo(f"published {rep.sent} events to {rep.topic} in {rep.seconds:.1f}s; {len(rep.failed)} failed")
    for err in rep.failed[:50]:
        click.echo(f"  line {err.line}: {err.reason}", err=True)
    if rep.failed and not rep.sent:
        sys.exit(1)


@main.command()
@click.option("--data", "data_dir", type=click.Path(path_type=Path), default=None,
              help="Data dir the worker writes (records, photos, index)")
@_stream_options
@click.option("--group", "kafka_group", default=None, help="Consumer group (default from settings)")
@model_options
@store_option
@click.option("--dlq-topic", "kafka_dlq_topic", default=None, help="Dead-letter topic (default <topic>.dlq)")
@click.option("--batch-size", "kafka_batch_size", type=int, default=None, help="Most events per batch")
@click.option("--photo-root", "kafka_photo_root", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Folder that local photo paths in events resolve against")
@click.option("--snapshot-interval", "kafka_snapshot_interval_s", type=float, default=None,
              help="Seconds between index snapshots (0: after every batch)")
@click.option("--until-idle", type=float, default=None, metavar="SECONDS",
              help="Exit once caught up and idle this long (a batch job instead of a service)")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="Stop after this long in all; with --until-idle, exit 1 if not caught up by then "
                   "(a batch job that cannot reach its broker fails instead of waiting forever)")
@click.option("--metrics-port", type=int, default=None, help="Serve this worker's Prometheus metrics on this port")
@click.option("--status", "show_status", is_flag=True,
              help="Print the workers' status (lag, events/s, dead letters, last commit) and exit")
@click.option("--json", "as_json", is_flag=True, help="With --status: JSON out")
@click.option("--events", "shopper_events", is_flag=True,
              help="Consume shopper events (clicks, add-to-carts, ...) into the feedback log: topic "
                   "vitrine.events and group vitrine-events unless --topic/--group say otherwise")
def consume(data_dir: Path | None, until_idle: float | None, timeout: float | None, metrics_port: int | None,
            show_status: bool, as_json: bool, shopper_events: bool, **opts: Any) -> None:
    """Run a Kafka ingest worker (a consumer-group member): events -> index (and shopper events ->
    the feedback log), offsets committed only after the changes are durable. SIGTERM/SIGINT
    finish the batch, commit and exit."""
    given = {k: v for k, v in opts.items() if v is not None}
    if shopper_events:
        from vitrine.ingest.events import EVENTS_GROUP, EVENTS_TOPIC

        given.setdefault("kafka_topic", EVENTS_TOPIC)
        given.setdefault("kafka_group", EVENTS_GROUP)
    _quiet_kafka()
    if show_status:
        _print_status(data_dir, given, as_json)
        return
    if data_dir is None:
        raise click.UsageError("--data is required to consume")
    from vitrine.ingest.kafka.worker import IngestWorker
    from vitrine.search.engine import Engine

    settings = make_settings(data_dir=data_dir, **given)
    engine = Engine.open(settings)
    try:
        worker = IngestWorker(engine, settings)
        previous = worker.install_signal_handlers()
        if metrics_port is not None:
            from prometheus_client import CollectorRegistry, start_http_server

            from vitrine.web.metrics import IngestCollector

            registry = CollectorRegistry()
            registry.register(IngestCollector(worker.status))
            start_http_server(metrics_port, addr=settings.web.host, registry=registry)
            click.echo(f"metrics at http://{settings.web.host}:{metrics_port}/metrics", err=True)
        k = settings.ingest
        click.echo(f"consuming {k.kafka_topic} at {k.kafka_bootstrap} as group {k.kafka_group} "
                   f"into {data_dir} (Ctrl-C to stop)", err=True)
        try:
            st = worker.run(until_idle=until_idle, timeout=timeout)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        engine.close()
    applied = st.get("applied", {})
    click.echo(f"stopped: {st['events']} events, {applied.get('upserted', 0)} upserted, "
               f"{applied.get('unchanged', 0)} unchanged, {applied.get('stale', 0)} stale, "
               f"{applied.get('deleted', 0)} deleted, {applied.get('events_stored', 0)} shopper events stored "
               f"({applied.get('events_duplicate', 0)} already stored), {st['dlq']} dead letters; "
               f"{st['products']} products indexed")
    if st.get("timed_out") and until_idle is not None:
        raise click.ClickException(f"not caught up after {timeout:g}s (lag {st.get('lag')}, state {st.get('state')}, "
                                   f"last error {st.get('last_error')}); what was applied is kept")


def _print_status(data_dir: Path | None, opts: dict[str, Any], as_json: bool) -> None:
    from vitrine.ingest.kafka.status import group_lag, read_status

    if data_dir is None and "kafka_bootstrap" not in opts:
        raise click.UsageError("--status needs --data (workers' status files) and/or --bootstrap (the group's "
                               "committed offsets)")
    out: dict[str, Any] = {}
    if data_dir is not None:
        out["workers"] = read_status(data_dir, opts.get("kafka_group"))
    if "kafka_bootstrap" in opts:
        settings = make_settings(**{k: v for k, v in opts.items() if k.startswith("kafka_")})
        out["group"] = {"topic": settings.ingest.kafka_topic, "group": settings.ingest.kafka_group,
                        "partitions": group_lag(settings)}
    if as_json:
        click.echo(json.dumps(out, indent=2, default=str))
        return
    for w in out.get("workers", []):
        fresh = w.get("freshness_ms") or {}
        click.echo(f"worker {w['worker_id']} [{w['state']}{'' if w['alive'] else ', not running'}] "
                   f"topic={w['topic']} group={w['group']} updated {w['age_s']}s ago")
        click.echo(f"  lag={w.get('lag')} events={w['events']} events/s={w['events_per_s']} dlq={w['dlq']} "
                   f"{w.get('dlq_by_kind') or ''} last commit "
                   f"{str(w.get('last_commit_age_s')) + 's ago' if w.get('last_commit_age_s') is not None else 'never'}"
                   f" reconnects={w['reconnects']} freshness p50={_ms(fresh.get('p50'))} p99={_ms(fresh.get('p99'))}")
        click.echo(f"  applied {w.get('applied')}; products indexed {w.get('products')}")
        for p, v in sorted((w.get("partitions") or {}).items(), key=lambda kv: int(kv[0])):
            click.echo(f"    partition {p}: position={v['position']} highwater={v['highwater']} lag={v['lag']}")
    if "workers" in out and not out["workers"]:
        click.echo(f"no worker has written status to {data_dir}")
    if "group" in out:
        g = out["group"]
        total = sum(v["lag"] or 0 for v in g["partitions"].values())
        click.echo(f"group {g['group']} on {g['topic']} (from the brokers): total lag {total}")
        for p, v in sorted(g["partitions"].items()):
            click.echo(f"    partition {p}: committed={v['committed']} highwater={v['highwater']} lag={v['lag']}")


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}ms"


# -- serving topologies ---------------------------------------------------------------------------------
def serve_options(f):
    """``vitrine serve`` options for the two topologies (see README, "Kafka ingest")."""
    f = click.option("--follow", type=float, default=None, metavar="SECONDS",
                     help="API replica of a data dir that a `vitrine consume` worker writes: pick up its "
                          "changes every SECONDS")(f)
    f = click.option("--group", "kafka_group", default=None, help="With --consume: consumer group")(f)
    f = click.option("--bootstrap", "kafka_bootstrap", default=None,
                     help="With --consume: Kafka bootstrap servers host:port[,...]")(f)
    f = click.option("--topic", "kafka_topic", default=None, help="With --consume: catalogue events topic")(f)
    f = click.option("--consume", is_flag=True,
                     help="Also run a Kafka ingest worker in this process (serve and consume in one process)")(f)
    return f


def serve_with_stream(settings: Any, *, consume: bool, follow: float | None) -> None:
    """Serve the API over one engine that an in-process ingest worker writes (``consume``),
    and/or that catches up with another process's writes every ``follow`` seconds."""
    import uvicorn

    from vitrine.ingest.kafka.status import read_status
    from vitrine.ingest.kafka.worker import IngestWorker
    from vitrine.search.engine import Engine
    from vitrine.web.app import create_app

    _quiet_kafka()
    if follow:  # the API's own follow loop (vitrine/web/app.py) replays the other process's writes
        settings = settings.updated(follow_s=follow)
    engine = Engine.open(settings)
    app = create_app(settings, engine=engine, freeze_gc=True)
    threads: list[threading.Thread] = []
    worker = None
    if consume:
        worker = IngestWorker(engine, settings)
        app.state.metrics.bind_ingest(worker.status)
        threads.append(threading.Thread(target=worker.run, name="vitrine-ingest", daemon=True))
    if follow:
        app.state.metrics.bind_ingest(lambda: [w for w in read_status(settings.storage.data_dir) if w.get("alive")])
    for t in threads:
        t.start()
    mode = " + consuming " + settings.ingest.kafka_topic if consume else ""
    mode += f" + following the data dir every {follow}s" if follow else ""
    click.echo(f"Vitrine serving {settings.storage.data_dir}{mode} at http://{settings.web.host}:{settings.web.port}/ "
               f"(API docs at /docs)", err=True)
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then restores the previous handlers and
    # re-raises the signal: make that land here, so the worker and the engine close cleanly below.
    def noted(signum: int, _frame: Any) -> None:
        log.info("%s: stopping the ingest worker and closing the data dir", signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, noted) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        uvicorn.run(app, host=settings.web.host, port=settings.web.port, log_level="warning")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if worker is not None:
            worker.stop()
        for t in threads:
            t.join(timeout=120)
        engine.close()


