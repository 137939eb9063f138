"""Prometheus metrics of one app instance (own registry, so several apps can live in one process)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from vitrine.search.engine import Engine
    from vitrine.search.models import SearchResponse

_LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("vitrine_http_requests_total", "HTTP requests", ["method", "route", "status"],
                                registry=r)
        self.latency = Histogram("vitrine_http_request_seconds", "HTTP request latency", ["route"],
                                 buckets=_LATENCY_BUCKETS, registry=r)
        self.searches = Counter("vitrine_searches_total", "Searches by query modality", ["modality"], registry=r)
        self.search_seconds = Histogram("vitrine_search_seconds", "Engine time per search", ["modality"],
                                        buckets=_LATENCY_BUCKETS, registry=r)
        self.degraded = Counter("vitrine_degraded_total", "Searches answered by a fallback path", ["component"],
                                registry=r)
        self.products = Gauge("vitrine_products", "Products in the index", registry=r)
        self.swaps = Counter("vitrine_swaps_total", "Hot swaps by result (switched, dry_run, refused)", ["result"],
                             registry=r)
        self.recovery = Gauge("vitrine_recovery", "What opening the data dir found: refused and half-written "
                              "snapshots, changes replayed, whether it rebuilt from the records", ["what"], registry=r)
        self.with_photo = Gauge("vitrine_products_with_photo", "Products with a photo vector", registry=r)

    def bind_engine(self, engine: "Engine") -> None:
        self.products.set_function(lambda: len(engine))
        self.with_photo.set_function(lambda: len(engine.vectors["image"]))
        rec = getattr(engine, "recovery", None) or {}
        for what, fn in (("refused_snapshots", lambda: len(engine.recovery.get("refused", []))),
                         ("partial_snapshots", lambda: len(engine.recovery.get("partial", []))),
                         ("replayed_changes", lambda: float(engine.recovery.get("replayed", 0))),
                         ("rebuilt", lambda: float(bool(engine.recovery.get("rebuilt"))))):
            if rec:
                self.recovery.labels(what).set_function(fn)

    def bind_ingest(self, status: Callable[[], Mapping[str, Any] | Sequence[Mapping[str, Any]] | None]) -> None:
        """Export Kafka ingest status (``IngestWorker.status`` or a list of status dicts) with the app's metrics."""
        self.registry.register(IngestCollector(status))

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def observe_search(self, res: "SearchResponse", modality: str) -> None:
        self.searches.labels(modality).inc()
        self.search_seconds.labels(modality).observe(res.took_ms / 1000)
        for component in res.degraded:
            self.degraded.labels(component).inc()

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class IngestCollector(Collector):
    """Kafka ingest workers' status dicts as Prometheus metrics, read at scrape time: lag per
    partition, events by result, events/s, dead letters by kind, last-commit age, freshness.
    ``status`` returns one worker's dict (the worker in this process) or a list of them (the
    status files of the workers writing a data dir this API follows)."""

    def __init__(self, status: Callable[[], Mapping[str, Any] | Sequence[Mapping[str, Any]] | None]) -> None:
        self._status = status

    def describe(self) -> list[Metric]:
        return []  # collected lazily: nothing to describe up front

    def collect(self) -> Iterator[Metric]:
        got = self._status()
        workers = [got] if isinstance(got, Mapping) else list(got or [])
        names = ["topic", "group", "worker"]
        fams: dict[str, Any] = {
            "lag": GaugeMetricFamily("vitrine_ingest_lag", "Consumer lag per partition (highwater - position)",
                                     labels=[*names, "partition"]),
            "events": CounterMetricFamily("vitrine_ingest_events", "Events handled, by result",
                                          labels=[*names, "result"]),
            "dlq": CounterMetricFamily("vitrine_ingest_dead_letters", "Events sent to the dead-letter topic, by kind",
                                       labels=[*names, "kind"]),
            "events_per_s": GaugeMetricFamily("vitrine_ingest_events_per_second",
                                              "Events handled per second (last 30 s)", labels=names),
            "last_commit_age_s": GaugeMetricFamily("vitrine_ingest_last_commit_age_seconds",
                                                   "Seconds since the last offset commit", labels=names),
            "connected": GaugeMetricFamily("vitrine_ingest_connected", "1 when the worker is connected to the brokers",
                                           labels=names),
            "reconnects": CounterMetricFamily("vitrine_ingest_reconnects", "Broker reconnections", labels=names),
            "batches": CounterMetricFamily("vitrine_ingest_batches", "Batches applied and committed", labels=names),
            "commit_failures": CounterMetricFamily("vitrine_ingest_commit_failures", "Offset commits that failed",
                                                   labels=names),
            "freshness": GaugeMetricFamily("vitrine_ingest_freshness_seconds",
                                           "Event produced -> applied and durable (recent events)",
                                           labels=[*names, "quantile"]),
        }
        for s in workers:
            base = [str(s.get("topic", "")), str(s.get("group", "")), str(s.get("worker_id", ""))]
            for part, p in sorted((s.get("partitions") or {}).items()):
                if p.get("lag") is not None:
                    fams["lag"].add_metric([*base, str(part)], float(p["lag"]))
            for result, n in sorted((s.get("applied") or {}).items()):
                fams["events"].add_metric([*base, result], float(n))
            fams["events"].add_metric([*base, "dead_letter"], float(s.get("dlq", 0)))
            for kind, n in sorted((s.get("dlq_by_kind") or {}).items()):
                fams["dlq"].add_metric([*base, kind], float(n))
            for key in ("events_per_s", "last_commit_age_s"):
                if s.get(key) is not None:
                    fams[key].add_metric(base, float(s[key]))
            fams["connected"].add_metric(base, 1.0 if s.get("connected") else 0.0)
            for key in ("reconnects", "batches", "commit_failures"):
                fams[key].add_metric(base, float(s.get(key, 0)))
            for q, v in sorted((s.get("freshness_ms") or {}).items()):
                if q.startswith("p") and q[1:].isdigit() and v is not None:
                    fams["freshness"].add_metric([*base, str(int(q[1:]) / 100)], float(v) / 1000)
        yield from fams.values()
