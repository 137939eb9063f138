"""Search analytics for merchants: what shoppers searched, found, clicked and bought.

Every figure comes from the feedback log (vitrine/feedback/eventlog.py): the logged API searches
between two times and the events on them (an event counts with its search, whenever it came).
The counting runs in the store, as SQL (SQLite or PostgreSQL, the same queries), so a report over
millions of searches moves a few hundred rows; the store returns integer counts only and the rates
are divided here, so one host and many hosts sharing PostgreSQL give the same figures.

Definitions (docs/analytics.md):

- ``searches``: logged searches, a page (``offset`` > 0) or a re-sort of a search counted with it,
  not as a new one (vitrine/feedback/event_sql.py: the same shopper, words and filters, each within
  30 minutes of the previous); ``pages``: the result pages logged, those included;
  ``users``: distinct hashed user tokens among them;
- ``no_results``: searches whose page was empty or whose total was 0;
- ``ctr``: searches with at least one click / searches; ``add_to_cart_rate`` and ``conversion``:
  the same with an add-to-cart and a purchase;
- ``mean_click_position``: the mean 1-based rank of clicked products (1: the top result);
- per time bucket (``granularity``: hour or day, UTC) and per normalised query (the ``top``
  queries by searches), the queries with no results and those with results but no click.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from vitrine.errors import InvalidInput
from vitrine.feedback import explored
from vitrine.feedback.event_sql import ANALYTICS_FIELDS
from vitrine.feedback.types import EventLogAPI

Granularity = Literal["hour", "day"]
BUCKET_S: dict[str, float] = {"hour": 3600.0, "day": 86400.0}


class Figures(BaseModel):
    """The figures of a set of searches."""

    searches: int = Field(description="Searches: a page (offset > 0) or a re-sort of one counts with it")
    pages: int = Field(description="Result pages logged (a search's later pages and re-sorts included)")
    users: int = Field(description="Distinct (hashed) user tokens")
    no_results: int = Field(description="Searches with an empty page or a total of 0")
    clicked: int = Field(description="Searches with at least one click")
    added_to_cart: int = Field(description="Searches with at least one add-to-cart")
    purchased: int = Field(description="Searches with at least one purchase")
    clicks: int = Field(description="Click events")
    ctr: float | None = Field(description="Click-through rate: clicked / searches")
    add_to_cart_rate: float | None = Field(description="added_to_cart / searches")
    conversion: float | None = Field(description="purchased / searches")
    no_result_rate: float | None = Field(description="no_results / searches")
    mean_click_position: float | None = Field(description="Mean 1-based rank of the clicked products")


class BucketFigures(Figures):
    start: float = Field(description="The bucket's start (Unix seconds, UTC)")
    date: str = Field(description="The bucket's start, ISO 8601 UTC")


class QueryFigures(Figures):
    query: str = Field(description="The normalised query (casefolded words; empty: a photo alone)")


class QueryCount(BaseModel):
    query: str
    searches: int
    users: int


class AnalyticsReport(BaseModel):
    since: float
    until: float
    granularity: Granularity
    distinct_queries: int
    totals: Figures
    series: list[BucketFigures] = Field(description="Per time bucket, oldest first (buckets without searches left out)")
    top_queries: list[QueryFigures] = Field(description="The most searched queries with their figures")
    no_result_queries: list[QueryCount] = Field(description="Queries whose searches found nothing, most frequent first")
    no_click_queries: list[QueryCount] = Field(description="Queries with results but never a click, most frequent first")
    bots: dict[str, int] = Field(default_factory=dict, description=(
        "The bot filter in the window: clients with more than per_minute events in a minute (their events "
        "are ignored by learning and suggestions) and those clients' events"))
    exploration: dict[str, Any] = Field(default_factory=dict, description=(
        "Explored pages (a product from ranks 11-50 shown on page one, docs/learning.md): impressions, clicks on "
        "the explored product, ctr"))


def _rate(n: int, d: int) -> float | None:
    return round(n / d, 6) if d else None


def figures(counts: Sequence[int]) -> dict[str, float | int | None]:
    """Figures from the store's counts (in the order of ``ANALYTICS_FIELDS``)."""
    c = dict(zip(ANALYTICS_FIELDS, (int(v) for v in counts)))
    n = c["searches"]
    return {"searches": n, "pages": c["pages"], "users": c["users"], "no_results": c["no_results"], "clicked": c["clicked"],
            "added_to_cart": c["carted"], "purchased": c["bought"], "clicks": c["clicks"],
            "ctr": _rate(c["clicked"], n), "add_to_cart_rate": _rate(c["carted"], n),
            "conversion": _rate(c["bought"], n), "no_result_rate": _rate(c["no_results"], n),
            "mean_click_position": round(1 + c["click_pos"] / c["clicks"], 6) if c["clicks"] else None}


def report(log: EventLogAPI, *, since: float | None = None, until: float | None = None,
           granularity: str = "day", top: int = 20, bot_per_minute: int = 60) -> AnalyticsReport:
    """The analytics of the searches logged in [``since``, ``until``) (default: the last 30 days)."""
    if granularity not in BUCKET_S:
        raise InvalidInput(f"granularity: {granularity!r}; one of {', '.join(BUCKET_S)}")
    if not 1 <= top <= 1000:
        raise InvalidInput("top: between 1 and 1000")
    until = time.time() + 1.0 if until is None else float(until)
    since = until - 30 * 86400.0 if since is None else float(since)
    if since >= until:
        raise InvalidInput("since must be before until")
    bucket = BUCKET_S[granularity]
    rows = log.aggregate(since, until, bucket, top)
    total = rows["totals"][0] if rows["totals"] else (0,) * (len(ANALYTICS_FIELDS) + 1)
    caught = log.bots(since, until, bot_per_minute) if bot_per_minute > 0 else (0, 0)
    series = [BucketFigures(start=b * bucket, date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(b * bucket)),
                            **figures(r)) for b, *r in rows["buckets"]]
    return AnalyticsReport(
        since=since, until=until, granularity=granularity,
        distinct_queries=int(total[len(ANALYTICS_FIELDS)] or 0), totals=Figures(**figures(total[:len(ANALYTICS_FIELDS)])),
        series=series, top_queries=[QueryFigures(query=q, **figures(r)) for q, *r in rows["queries"]],
        no_result_queries=[QueryCount(query=q, searches=n, users=u) for q, n, u in rows["no_results"]],
        no_click_queries=[QueryCount(query=q, searches=n, users=u) for q, n, u in rows["no_clicks"]],
        bots={"per_minute": bot_per_minute, "clients": caught[0], "events": caught[1]},
        exploration=explored.figures(log, since, until))


def report_json(log: EventLogAPI, *, since: float | None, until: float | None, granularity: Granularity,
                top: int, bot_per_minute: int) -> bytes:
    """GET /v1/analytics's body: :func:`report`, validated as it was built, encoded."""
    return report(log, since=since, until=until, granularity=granularity, top=top,
                  bot_per_minute=bot_per_minute).model_dump_json().encode()


def parse_time(value: str | float | None) -> float | None:
    """A time given as Unix seconds, an ISO date (``2025-01-31``, UTC) or date-time, or a span
    back from now (``7d``, ``12h``, ``30m``)."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)):
        return float(value)
    v = str(value).strip()
    try:
        return float(v)
    except ValueError:
        pass
    units = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
    if v[-1:] in units:
        try:
            return time.time() - float(v[:-1]) * units[v[-1]]
        except ValueError:
            pass
    from datetime import datetime, timezone

    try:
        dt = datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError as e:
        raise InvalidInput(f"time {value!r}: Unix seconds, an ISO date (2025-01-31) or a span (7d, 12h)") from e
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()
