"""Search analytics for merchants (vitrine/feedback/analytics.py): needs the API key; computed on
the side-work thread (vitrine/web/sidework.py)."""

from __future__ import annotations

import functools
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from vitrine.feedback import analytics
from vitrine.feedback.analytics import AnalyticsReport
from vitrine.web.deps import EngineDep, KeyRequired, SideWorkDep
from vitrine.web.errors import errors_for

router = APIRouter(tags=["analytics"])


@router.get("/analytics", response_model=AnalyticsReport, dependencies=[KeyRequired], responses=errors_for(401))
async def get_analytics(
    engine: EngineDep,
    side: SideWorkDep,
    since: Annotated[str | None, Query(description="Start: Unix seconds, an ISO date, or a span back (7d, 12h); "
                                                   "default 30 days before until")] = None,
    until: Annotated[str | None, Query(description="End (excluded), same forms; default now")] = None,
    granularity: Annotated[analytics.Granularity, Query(description="Series buckets: hour or day (UTC)")] = "day",
    top: Annotated[int, Query(ge=1, le=1000, description="How many queries each list holds")] = 20,
) -> Response:
    """Searches, users, click-through, add-to-cart and conversion rates, mean click position,
    queries with no results and with no clicks, per time bucket and per query, over the logged
    API searches and their events."""
    fn = functools.partial(analytics.report, engine.feedback.log, since=analytics.parse_time(since),
                           until=analytics.parse_time(until), granularity=granularity, top=top,
                           bot_per_minute=engine.feedback.settings.bot_events_per_minute)

    def body() -> bytes:  # validated as it was built: written out there too, off the searches' threads
        return fn().model_dump_json().encode()

    return Response(await side.run(body), media_type="application/json")
