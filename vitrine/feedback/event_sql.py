"""The SQL the feedback log (vitrine/feedback/eventlog.py) runs on SQLite and PostgreSQL beyond
what SQLAlchemy Core writes for it (``{p}`` is the driver's placeholder): a logged search and an
event as rows of their tables (vitrine/feedback/tables.py), the analytics and experiment
aggregations, popular searches.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from vitrine.feedback.types import EventRecord, SearchLog


def search_row(s: SearchLog) -> dict[str, Any]:
    """A search as the columns of the searches table (vitrine/feedback/tables.py)."""
    return {"query_id": s.query_id, "ts": s.ts, "text": s.text, "norm": s.norm,
            "ids": json.dumps(list(s.ids), ensure_ascii=False), "offset": s.offset, "total": s.total,
            "image": int(s.image), "user_hash": s.user, "session": s.session, "experiment": s.experiment,
            "variant": s.variant, "client": s.client, "sort": s.sort, "filters": s.filters}


def search_from_row(r: Sequence) -> SearchLog:
    qid, ts, text, norm, ids, offset, total, image, user, session, exp, variant, client, sort, filters = r
    ids_list = ids if isinstance(ids, list) else json.loads(ids)
    return SearchLog(query_id=qid, ts=float(ts), text=text, norm=norm, ids=tuple(ids_list), offset=int(offset),
                     total=total, image=bool(image), user=user, session=session, experiment=exp, variant=variant,
                     client=client, sort=sort, filters=filters)


def event_row(e: EventRecord) -> dict[str, Any]:
    """An event as the columns of the events table."""
    return {"event_id": e.event_id, "query_id": e.query_id, "type": e.type, "product_id": e.product_id,
            "position": e.position, "ts": e.ts, "user_hash": e.user, "session": e.session, "client": e.client}


def event_from_row(r: Sequence) -> EventRecord:
    eid, qid, etype, pid, pos, ts, user, session, client = r
    return EventRecord(event_id=eid, query_id=qid, type=etype, product_id=pid, position=int(pos), ts=float(ts),
                       user=user, session=session, client=client)


# -- analytics and experiments (vitrine/feedback/analytics.py, vitrine/experiments/runner.py) ---------
# Aggregations run in the store, so a report over millions of searches moves a few hundred rows.
# Every figure is an integer count (or a sum of integers) here; rates are divided in Python, so
# SQLite and PostgreSQL give the same figures for the same log. ``{p}``: the placeholder, ``{bucket}``:
# the time bucket of a search (whole ``bucket_s`` periods since the epoch, UTC), ``{c}``: a
# byte-order collation for ties (PostgreSQL's default collation sorts by locale).
# A page (``offset`` > 0) or a re-sort of a search is not a new search: the logged searches of one
# shopper (session, else user, else client; a search without any is its own) with the same words and
# filters form one search while each follows the previous within CONTINUE_S and is a later page or
# another sort of it. The group's first search gives its query, user, time bucket and emptiness; the
# events on any of its pages count with it; ``pages`` counts its logged pages.
CONTINUE_S = 1800
# One statement gives every part of a report (``part``: totals, buckets, queries, no_results,
# no_clicks), from one materialised table of search groups ``j``: each search joined once to its
# events (read from the covering index on (query_id, type, position), vitrine/feedback/tables.py),
# then the groups. Five statements over the same CTE read the log five times.
_ANALYTICS_BASE = """
WITH s0 AS (
    SELECT s.query_id, s.norm, s.user_hash, s.ts, {bucket} AS bucket,
           CASE WHEN s.total = 0 OR s.ids = '[]' THEN 1 ELSE 0 END AS nores,
           COALESCE(s.session, s.user_hash, s.client, '~' || s.query_id) AS who, COALESCE(s.filters, '') AS fl,
           COALESCE(s.sort, '') AS so, s."offset" AS off,
           MAX(CASE WHEN e.type = 'click' THEN 1 ELSE 0 END) AS clicked,
           MAX(CASE WHEN e.type = 'add_to_cart' THEN 1 ELSE 0 END) AS carted,
           MAX(CASE WHEN e.type = 'purchase' THEN 1 ELSE 0 END) AS bought,
           SUM(CASE WHEN e.type = 'click' THEN 1 ELSE 0 END) AS clicks,
           SUM(CASE WHEN e.type = 'click' THEN e.position ELSE 0 END) AS click_pos
    FROM {searches} s LEFT JOIN {events} e ON e.query_id = s.query_id
    WHERE s.ts >= {p} AND s.ts < {p}
    GROUP BY s.query_id),
s1 AS (
    SELECT s0.*, LAG(ts) OVER w AS prev_ts, LAG(so) OVER w AS prev_so
    FROM s0 WINDOW w AS (PARTITION BY who, norm, fl ORDER BY ts, query_id)),
s2 AS (
    SELECT s1.*, CASE WHEN prev_ts IS NULL OR ts - prev_ts >= %(continue_s)d OR (off = 0 AND so = prev_so) THEN 1
                      ELSE 0 END AS new
    FROM s1),
s AS (
    SELECT s2.*, SUM(new) OVER (PARTITION BY who, norm, fl ORDER BY ts, query_id ROWS UNBOUNDED PRECEDING) AS grp
    FROM s2),
j AS MATERIALIZED (
    SELECT MAX(norm) AS norm,
           MAX(CASE WHEN new = 1 THEN user_hash END) AS user_hash,
           MAX(CASE WHEN new = 1 THEN bucket END) AS bucket,
           MAX(CASE WHEN new = 1 THEN nores ELSE 0 END) AS nores,
           MAX(clicked) AS clicked, MAX(carted) AS carted, MAX(bought) AS bought,
           SUM(clicks) AS clicks, SUM(click_pos) AS click_pos, COUNT(*) AS pages
    FROM s GROUP BY who, norm, fl, grp)
""" % {"continue_s": CONTINUE_S}
ANALYTICS_FIELDS = ("searches", "users", "no_results", "clicked", "carted", "bought", "clicks", "click_pos", "pages")
_AGG = ("COUNT(*), COUNT(DISTINCT user_hash), SUM(nores), SUM(clicked), SUM(carted), SUM(bought), SUM(clicks), "
        "SUM(click_pos), SUM(pages)")
_NONE = "CAST(NULL AS BIGINT)"  # PostgreSQL types a bare NULL in a sub-select as text
_COUNTS = "COUNT(*), COUNT(DISTINCT user_hash), " + ", ".join([_NONE] * (len(ANALYTICS_FIELDS) - 2))
# every row: (part, query, bucket, the ANALYTICS_FIELDS counts, distinct queries); no_results and
# no_clicks fill searches and users only
_ANALYTICS_PARTS = f"""
SELECT 'totals', CAST(NULL AS TEXT), CAST(NULL AS BIGINT), {_AGG}, COUNT(DISTINCT norm) FROM j
UNION ALL SELECT 'buckets', CAST(NULL AS TEXT), bucket, {_AGG}, {_NONE} FROM j GROUP BY bucket
UNION ALL SELECT * FROM (SELECT 'queries', norm, {_NONE}, {_AGG}, {_NONE} FROM j GROUP BY norm
                         ORDER BY COUNT(*) DESC, norm {{c}} LIMIT {{p}}) q
UNION ALL SELECT * FROM (SELECT 'no_results', norm, {_NONE}, {_COUNTS}, {_NONE} FROM j WHERE nores = 1 GROUP BY norm
                         ORDER BY COUNT(*) DESC, norm {{c}} LIMIT {{p}}) r
UNION ALL SELECT * FROM (SELECT 'no_clicks', norm, {_NONE}, {_COUNTS}, {_NONE} FROM j WHERE nores = 0 GROUP BY norm
                         HAVING SUM(clicked) = 0 ORDER BY COUNT(*) DESC, norm {{c}} LIMIT {{p}}) c
"""

# per experiment unit (the hashed user, else the session) and variant: searches, searches with a
# click / add-to-cart / purchase, and the sum over searches of 1 / (1 + the first click's rank)
EXPERIMENT_UNITS_SQL = """
WITH s AS (
    SELECT query_id, variant, COALESCE(user_hash, 'session:' || session) AS unit
    FROM {searches} WHERE experiment = {p} AND ts >= {p} AND ts < {p} AND (user_hash IS NOT NULL OR session IS NOT NULL)),
f AS (
    SELECT e.query_id,
           MAX(CASE WHEN e.type = 'click' THEN 1 ELSE 0 END) AS clicked,
           MAX(CASE WHEN e.type = 'add_to_cart' THEN 1 ELSE 0 END) AS carted,
           MAX(CASE WHEN e.type = 'purchase' THEN 1 ELSE 0 END) AS bought,
           MIN(CASE WHEN e.type = 'click' THEN e.position END) AS first_click
    FROM {events} e JOIN s ON s.query_id = e.query_id GROUP BY e.query_id)
SELECT s.variant, s.unit, COUNT(*), SUM(COALESCE(f.clicked, 0)), SUM(COALESCE(f.carted, 0)),
       SUM(COALESCE(f.bought, 0)),
       SUM(CASE WHEN f.first_click IS NULL THEN 0.0 ELSE 1.0 / (1 + f.first_click) END)
FROM s LEFT JOIN f ON f.query_id = s.query_id GROUP BY s.variant, s.unit ORDER BY s.variant, s.unit {c}
"""
EXPERIMENT_CLICKS_SQL = """
SELECT t.query_id, t.teams, e.product_id FROM {teams} t JOIN {events} e ON e.query_id = t.query_id
WHERE t.experiment = {p} AND e.type = 'click' AND e.ts >= {p} ORDER BY t.query_id, e.ts
"""
def analytics_sql(*, p: str, bucket: str, c: str, searches: str = "searches", events: str = "events") -> str:
    """The analytics statement in one SQL dialect (see the comment above ``_ANALYTICS_BASE``)."""
    return _ANALYTICS_BASE.format(p=p, bucket=bucket, searches=searches, events=events) + _ANALYTICS_PARTS.format(p=p, c=c)


# clients the bot filter catches in a window (more than {p} events in one minute: vitrine/feedback/clicks.py)
# and all their events there; ``{minute}``: the minute of an event (the dialect's bucket of 60 s)
BOTS_SQL = """
WITH b AS (SELECT DISTINCT client FROM {events} WHERE client IS NOT NULL AND ts >= {p} AND ts < {p}
           GROUP BY client, {minute} HAVING COUNT(*) > {p})
SELECT (SELECT COUNT(*) FROM b),
       (SELECT COUNT(*) FROM {events} WHERE ts >= {p} AND ts < {p} AND client IN (SELECT client FROM b))
"""


# the searches of one experiment in a window (query_id, ids, variant) and the clicks on them (query_id,
# product_id): what the exploration figures of analytics need, without reading the whole log
EXPERIMENT_SEARCHES_SQL = ("SELECT query_id, ids, variant FROM {searches} WHERE experiment = {p} AND ts >= {p} "
                           "AND ts < {p}")
EXPERIMENT_SEARCH_CLICKS_SQL = ("SELECT e.query_id, e.product_id FROM {events} e JOIN {searches} s ON s.query_id = "
                                "e.query_id WHERE s.experiment = {p} AND s.ts >= {p} AND s.ts < {p} AND e.type = 'click'")


def bot_params(since: float, until: float, per_minute: int) -> tuple:
    return (since, until, 60.0, per_minute, since, until)


def _ints(row: Sequence) -> tuple:
    return tuple(int(v or 0) if not isinstance(v, str) else v for v in row)


def analytics_rows(run: Callable[[str, tuple], list[tuple]], sql: str, since: float, until: float,
                   bucket_s: float, top: int) -> dict[str, list[tuple]]:
    """Run the analytics statement with ``run(sql, params)``: integer rows per part, as the parts
    were written one statement each: ``totals`` (the counts, distinct queries), ``buckets`` (bucket,
    the counts) and ``queries`` (query, the counts) in order; ``no_results`` and ``no_clicks``
    (query, searches, users), most searched first (ties by the query's code points, as the store's
    byte-order collation sorts them)."""
    n = len(ANALYTICS_FIELDS)
    out: dict[str, list[tuple]] = {"totals": [], "buckets": [], "queries": [], "no_results": [], "no_clicks": []}
    for part, query, bucket, *counts in run(sql, (bucket_s, since, until, top, top, top)):
        if part == "totals":
            out[part].append(_ints(counts))
        elif part == "buckets":
            out[part].append(_ints((bucket, *counts[:n])))
        elif part == "queries":
            out[part].append(_ints((query, *counts[:n])))
        else:
            out[part].append(_ints((query, *counts[:2])))
    out["buckets"].sort()
    for part in ("queries", "no_results", "no_clicks"):
        out[part].sort(key=lambda r: (-r[1], r[0]))
    return out


def experiment_unit_rows(rows: list[tuple]) -> list[tuple]:
    return [(v, u, int(n), int(c or 0), int(a or 0), int(b or 0), float(rr or 0.0)) for v, u, n, c, a, b, rr in rows]


POPULAR_SQL = """
SELECT MIN(s.text), COUNT(DISTINCT COALESCE(s.client, e.client, e.user_hash, s.user_hash)) AS users
FROM {events} e JOIN {searches} s ON s.query_id = e.query_id
WHERE e.type IN ('click', 'add_to_cart', 'purchase') AND s.ts >= {p} AND s.norm <> '' AND s.text IS NOT NULL
  AND s.norm NOT IN (SELECT norm FROM {searches} WHERE total = 0 OR ids = '[]')
  AND COALESCE(e.client, '') NOT IN (SELECT client FROM {events} WHERE client IS NOT NULL AND ts >= {p}
                                      GROUP BY client, CAST(ts / 60 AS INTEGER) HAVING COUNT(*) > {p})
GROUP BY s.norm HAVING COUNT(DISTINCT COALESCE(s.client, e.client, e.user_hash, s.user_hash)) >= {p}
ORDER BY users DESC, MIN(s.text) LIMIT {p}
"""
