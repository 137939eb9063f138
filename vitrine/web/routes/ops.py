"""Operations: health and Prometheus metrics."""

from __future__ import annotations

import os
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from vitrine import __version__
from vitrine.web.deps import EngineDep, MetricsDep
from vitrine.web.errors import errors_for

router = APIRouter(tags=["ops"])


@router.get("/health", responses=errors_for())
def health(engine: EngineDep) -> dict[str, Any]:
    """Liveness and what is serving: products, model, snapshot, recovery, recent swaps."""
    return {"status": "ok", "version": __version__, "pid": os.getpid(), **engine.stats(),
            "snapshot": engine.snapshot_version,
            "recovery": engine.recovery, "swaps": engine.swaps[-5:]}


@router.get("/metrics", response_class=Response, responses=errors_for())
def prometheus(metrics: MetricsDep) -> Response:
    """Prometheus metrics (text exposition format)."""
    body, ctype = metrics.render()
    return Response(body, media_type=ctype)
