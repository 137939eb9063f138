"""Prometheus metrics of one app instance (own registry, so several apps can live in one process)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

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
        self.with_photo = Gauge("vitrine_products_with_photo", "Products with a photo vector", registry=r)

    def bind_engine(self, engine: "Engine") -> None:
        self.products.set_function(lambda: len(engine))
        self.with_photo.set_function(lambda: len(engine.vectors["image"]))

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
