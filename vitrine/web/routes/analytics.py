"""Search analytics for merchants (vitrine/feedback/analytics.py): needs the API key; computed in
the reports' side process (vitrine/web/sideproc.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from vitrine.feedback import analytics
from vitrine.feedback.analytics import AnalyticsReport
from vitrine.web.deps import FeedbackJobsDep, KeyRequired
from vitrine.web.errors import errors_for

router = APIRouter(tags=["analytics"])


@router.get("/analytics", response_model=AnalyticsReport, dependencies=[KeyRequired], responses=errors_for(401))
async def get_analytics(
    jobs: FeedbackJobsDep,
    since: Annotated[str | None, Query(description="Start: Unix seconds, an ISO date, or a span back (7d, 12h); "
                                                   "default 30 days before until")] = None,
    until: Annotated[str | None, Query(description="End (excluded), same forms; default now")] = None,
    granularity: Annotated[analytics.Granularity, Query(description="Series buckets: hour or day (UTC)")] = "day",
    top: Annotated[int, Query(ge=1, le=1000, description="How many queries each list holds")] = 20,
) -> Response:
    """Searches, users, click-through, add-to-cart and conversion rates, mean click position,
    queries with no results and with no clicks, per time bucket and per query, over the logged
    API searches and their events."""
    body = await jobs.analytics_json(analytics.parse_time(since), analytics.parse_time(until), granularity, top)
    return Response(body, media_type="application/json")
