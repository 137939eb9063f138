"""Operations: health and Prometheus metrics."""

from __future__ import annotations

import os
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from vitrine import __version__
from vitrine.web.deps import EngineDep, MetricsDep, SettingsDep
from vitrine.web.errors import errors_for

router = APIRouter(tags=["ops"])


@router.get("/health", responses=errors_for(ok={
    "status": "ok", "version": "0.9.0", "pid": 4242, "products": 20873, "with_photo": 20873, "seq": 20873,
    "model": "effnet-minilm+mlp", "index": "SQfp16", "data_dir": "/srv/vitrine", "max_k": 100, "snapshot": "v000012",
    "recovery": {"summary": "loaded snapshot v000012 (change 20873); replayed 0 later changes"}, "swaps": []}))
def health(engine: EngineDep, settings: SettingsDep) -> dict[str, Any]:
    """Liveness and what is serving: products, model, snapshot, recovery, recent swaps, and the
    deepest result a search may ask for (``max_k``: offset + k)."""
    return {"status": "ok", "version": __version__, "pid": os.getpid(), **engine.stats(), "max_k": settings.search.max_k,
            "snapshot": engine.snapshot_version,
            "recovery": engine.recovery, "swaps": engine.swaps[-5:]}


@router.get("/metrics", response_class=Response, responses=errors_for(
    ok='vitrine_searches_total{modality="text"} 1024.0', ok_type="text/plain"))
def prometheus(metrics: MetricsDep) -> Response:
    """Prometheus metrics (text exposition format)."""
    body, ctype = metrics.render()
    return Response(body, media_type=ctype)
