"""Admin actions (need the API key): hot swap and index snapshots."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from vitrine.errors import SwapRefused
from vitrine.search.swap import SwapReport, SwapRequest
from vitrine.web.deps import EngineDep, KeyRequired, MetricsDep, SettingsDep
from vitrine.web.errors import errors_for

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[KeyRequired])


@router.post("/swap", response_model=SwapReport, responses=errors_for(401, 409))
def admin_swap(req: SwapRequest, engine: EngineDep, settings: SettingsDep, metrics: MetricsDep) -> SwapReport:
    """Hot swap: load a model version (`adapter`, `model`), index (`index_factory`) or stored
    snapshot (`snapshot`) beside the live one, check it on the canary queries, switch atomically.
    409 with the report when a check fails (the live version keeps serving)."""
    if settings.web.workers > 1:  # the other worker processes would keep the old model
        raise SwapRefused(f"hot swap switches one process; this API runs {settings.web.workers} workers. "
                          "Serve with --workers 1 to swap, or restart the workers on the new version.")
    try:
        report = engine.swap(req)
    except SwapRefused:
        metrics.swaps.labels("refused").inc()
        raise
    metrics.swaps.labels("switched" if report.switched else "dry_run").inc()
    return report


@router.get("/snapshots", responses=errors_for(401, ok={
    "current": "v000012", "versions": [{"name": "v000012", "seq": 20873, "count": 20873}], "partial": [],
    "recovery": {}}))
def admin_snapshots(engine: EngineDep) -> dict[str, Any]:
    """Stored snapshot versions (newest first), the one serving, and what start-up recovered."""
    return {"current": engine.snapshot_version, "versions": [v.summary() for v in engine.snapshots.versions()],
            "partial": [p.name for p in engine.snapshots.partials()], "recovery": engine.recovery}


@router.post("/snapshot", responses=errors_for(401, ok={"saved": True, "version": "v000013"}))
def admin_snapshot(engine: EngineDep) -> dict[str, Any]:
    """Publish a snapshot version of the indexes now (when they changed since the last one)."""
    saved = engine.save()
    return {"saved": saved, "version": engine.snapshot_version}
