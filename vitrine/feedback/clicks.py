"""The click model behind learning from the search log: shoppers' clicks, add-to-carts and
purchases, corrected for position bias, into a per-query re-ranking (vitrine/feedback/learning.py
judges it, vitrine/feedback/intake.py serves it).

The click model is the position-based model (PBM): a shopper clicks a result when they examine
its position (probability ``theta[rank]``, the same for every query) and find the product
attractive (``gamma[query, product]``). Why this one: it is the simplest model that separates
"shown high" from "chosen", its estimates are inverse-propensity weights (each click counts
``1 / theta[rank]``), and it needs nothing the log lacks. ``theta`` is the usual prior
``theta[r] = 1 / (r + 1)`` unless ``learn_propensity`` is ``em``: then it is fitted by EM (the
standard PBM updates, Chuklin et al., *Click Models for Web Search*, 2015) when the log holds the
same product for the same query at several ranks. Not by default: a log where every product sat
at one rank cannot tell examination from attractiveness, and ranks that changed because learning
moved the chosen products up are confounded with attractiveness (simulated shoppers who examine
exactly ``1 / (r + 1)``: with EM, every re-learn after the first lost to what served; with the
prior, each one won and the true nDCG@10 went on rising). Fit it where ranks vary for reasons of
their own (interleaved experiments, randomised pages). The report says which was used.

Bounded influence (docs/learning.md, "Abuse"): evidence is counted per (query, product, unit),
where the unit is the user (the hashed token), else the session, else the client (a hashed
fingerprint of the address and user agent the API saw), never the search: a unit that saw a
product ten times is one exposure (at the best rank it saw it), a unit that clicked it twenty
times is one success (weighted by the strongest event: click 1, add-to-cart 1.5, purchase 2; a
product-page view 0.5). Units behind one client count together for at most ``client_share`` of a
query's evidence (a client with ``k`` units in a query weighs ``min(k, max(1, share / (1 - share)
* others))`` units, spread over its ``k``), so new user tokens from one machine add nothing. A
product moves only with successes (or, to sink, exposures) from ``min_users`` distinct clients,
and a query is learned only with successes from that many, so one client flooding clicks moves
nothing. A client that sent more than ``bot_per_minute`` events in any minute is a bot: all its
events are left out (analytics counts them). Evidence fades with age (``half_life_days``).

Context: a page in another order than relevance (``sort``) is no evidence for the words (its
ranks say nothing about relevance); a filtered page counts :data:`FILTERED_WEIGHT` (a choice
among what the filter left, not among all the words found).
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vitrine.feedback.types import FeedbackSlice, SearchLog
from vitrine.feedback.intake import LearnedTable

log = logging.getLogger(__name__)

EVENT_WEIGHT = {"click": 1.0, "add_to_cart": 1.5, "purchase": 2.0, "view": 0.5}
PRIOR_STRENGTH = 2.0
MAX_RANK = 100
Z_RANGE = (-1.0, 3.0)
FILTERED_WEIGHT = 0.5
SHRINK_CLIENTS = 20.0  # clients behind a product for half the clip
ANON = "anon"  # the one unit of every search that names no user, session or client


@dataclass
class Evidence:
    """Per (query, product): ``exposure`` (examination-weighted, one per unit), ``success``
    (event-weighted, one per unit), and the distinct clients behind each (a unit whose client
    is unknown stands for itself)."""

    exposure: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    success: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    exposed_users: dict[tuple[str, str], set[str]] = field(default_factory=lambda: defaultdict(set))
    success_users: dict[tuple[str, str], set[str]] = field(default_factory=lambda: defaultdict(set))
    query_users: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    queries: dict[str, str] = field(default_factory=dict)  # norm -> a text as typed
    propensity: str = "prior 1/(rank+1)"
    bots: dict[str, int] = field(default_factory=dict)  # clients the bot filter caught -> their events


def user_of(s: SearchLog, event_user: str | None = None) -> str:
    """The unit a search's evidence is capped by: the hashed user of the search, else of its
    events, else the session, else the client fingerprint, else one shared anonymous unit (never
    the search itself: 200 anonymous searches are one unit, not 200)."""
    if s.user or event_user:
        return f"u:{s.user or event_user}"
    if s.session:
        return f"s:{s.session}"
    return f"c:{s.client}" if s.client else ANON


def context_weight(s: SearchLog) -> float:
    """How much a page's evidence counts for its bare words (the module docstring, "Context")."""
    if s.sort and s.sort != "relevance":
        return 0.0
    return FILTERED_WEIGHT if s.filters else 1.0


def bot_clients(fb: FeedbackSlice, per_minute: int) -> dict[str, int]:
    """Clients that sent more than ``per_minute`` events in some minute -> their events in the
    slice (0 or less: no filter)."""
    if per_minute <= 0:
        return {}
    per: dict[tuple[str, int], int] = defaultdict(int)
    total: dict[str, int] = defaultdict(int)
    for e in fb.events:
        if e.client:
            per[(e.client, int(e.ts // 60))] += 1
            total[e.client] += 1
    flagged = {c for (c, _), n in per.items() if n > per_minute}
    return {c: total[c] for c in flagged}


def client_weights(units: dict[str, dict[str, str]], share: float) -> dict[tuple[str, str], float]:
    """Per (query, unit): the weight of its evidence so that one client's units together count
    at most ``share`` of the query's (``units``: query -> unit -> its client)."""
    out: dict[tuple[str, str], float] = {}
    ratio = share / (1.0 - share) if share < 1.0 else math.inf
    for q, of in units.items():
        per_client: dict[str, int] = defaultdict(int)
        for c in of.values():
            per_client[c] += 1
        n = len(of)
        for u, c in of.items():
            k = per_client[c]
            cap = max(1.0, ratio * (n - k))
            out[(q, u)] = min(1.0, cap / k)
    return out


def prior_theta(n: int = MAX_RANK) -> np.ndarray:
    return 1.0 / (np.arange(n) + 1.0)


def fit_theta(cells: dict[tuple[str, str, int], list[float]], *, iters: int = 50) -> np.ndarray | None:
    """PBM examination per rank by EM over ``(query, product, rank) -> [impressions, clicks]``,
    when enough (query, product) pairs were shown at two or more ranks (None otherwise)."""
    ranks_of: dict[tuple[str, str], set[int]] = defaultdict(set)
    for q, d, r in cells:
        ranks_of[(q, d)].add(r)
    if sum(1 for v in ranks_of.values() if len(v) > 1) < 20:
        return None
    keys = list(cells)
    pair_ix = {p: i for i, p in enumerate(ranks_of)}
    pi = np.array([pair_ix[(q, d)] for q, d, _ in keys])
    ri = np.array([min(r, MAX_RANK - 1) for _, _, r in keys])
    n = np.array([cells[k][0] for k in keys])
    c = np.minimum(np.array([cells[k][1] for k in keys]), n)
    theta = prior_theta()
    gamma = np.full(len(pair_ix), 0.3)
    for _ in range(iters):
        t, g = theta[ri], gamma[pi]
        denom = np.maximum(1 - t * g, 1e-9)
        e_exam = c + (n - c) * t * (1 - g) / denom
        e_attr = c + (n - c) * (1 - t) * g / denom
        num_t = np.bincount(ri, e_exam, MAX_RANK)
        den_t = np.bincount(ri, n, MAX_RANK)
        theta = np.where(den_t > 0, num_t / np.maximum(den_t, 1e-9), theta)
        gamma = np.clip(np.bincount(pi, e_attr, len(pair_ix)) / np.maximum(np.bincount(pi, n, len(pair_ix)), 1e-9),
                        1e-4, 1 - 1e-4)
    theta = np.clip(theta / max(theta[0], 1e-9), 1e-3, 1.0)  # only ratios are identified: rank 0 examined
    return theta


def gather(fb: FeedbackSlice, *, now: float | None = None, half_life_days: float = 30.0,
           theta: np.ndarray | None = None, em: bool = False, client_share: float = 0.2,
           bot_per_minute: int = 60) -> Evidence:
    """Per (query, product, unit) evidence from a slice of the log (see the module docstring)."""
    now = time.time() if now is None else now
    half = half_life_days * 86400.0
    bots = bot_clients(fb, bot_per_minute)
    by_id = {s.query_id: s for s in fb.searches if s.norm and not s.image and context_weight(s) > 0
             and s.client not in bots}
    events = [e for e in fb.events if e.client not in bots and e.query_id in by_id]
    event_user = {e.query_id: e.user for e in events if e.user}
    unit = {qid: user_of(s, event_user.get(qid)) for qid, s in by_id.items()}
    # each unit's client: the search's, else its events', else the unit stands for itself
    client: dict[str, str] = {}
    for e in events:
        if e.client:
            client.setdefault(unit[e.query_id], "c:" + e.client)
    for qid, s in by_id.items():
        if s.client:
            client[unit[qid]] = "c:" + s.client
    # best rank each unit saw each (query, product) at, when, and on a page of what weight
    seen: dict[tuple[str, str, str], tuple[int, float, float]] = {}
    for qid, s in by_id.items():
        u, cw = unit[qid], context_weight(s)
        for i, pid in enumerate(s.ids):
            r = s.offset + i
            key = (s.norm, pid, u)
            if key not in seen or r < seen[key][0]:
                seen[key] = (r, max(s.ts, seen.get(key, (0, 0.0, 0.0))[1]), max(cw, seen.get(key, (0, 0.0, 0.0))[2]))
    won: dict[tuple[str, str, str], tuple[float, float]] = {}
    for e in events:
        found = by_id[e.query_id]
        key = (found.norm, e.product_id, unit[e.query_id])
        w = EVENT_WEIGHT.get(e.type, 0.0) * context_weight(found)
        if key not in won or w > won[key][0]:
            won[key] = (w, e.ts)
        if key not in seen:  # an event under another token than the search's: its exposure is the search's
            seen[key] = (e.position, found.ts, context_weight(found))
    units: dict[str, dict[str, str]] = defaultdict(dict)
    for q, _, u in seen:
        units[q][u] = client.get(u, u)
    weight = client_weights(units, client_share)
    cells: dict[tuple[str, str, int], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for (q, d, u), (r, _, _) in seen.items():
        cell = cells[(q, d, r)]
        w = weight[(q, u)]
        cell[0] += w
        cell[1] += w if (q, d, u) in won else 0.0
    ev = Evidence()
    ev.bots = bots
    fitted = theta if theta is not None else fit_theta(cells) if em else None
    if fitted is not None and theta is None:
        ev.propensity = "PBM by EM"
    th = fitted if fitted is not None else prior_theta()
    for s in by_id.values():
        ev.queries.setdefault(s.norm, s.text or s.norm)
    for (q, d, u), (r, ts, cw) in seen.items():
        decay = 0.5 ** (max(0.0, now - ts) / half)
        ev.exposure[(q, d)] += decay * cw * weight[(q, u)] * float(th[min(r, MAX_RANK - 1)])
        ev.exposed_users[(q, d)].add(client.get(u, u))
    for (q, d, u), (w, ts) in won.items():
        decay = 0.5 ** (max(0.0, now - ts) / half)
        ev.success[(q, d)] += decay * w * weight[(q, u)]
        ev.success_users[(q, d)].add(client.get(u, u))
        ev.query_users[q].add(client.get(u, u))
    return ev


def scores(ev: Evidence, *, min_users: int = 3, max_queries: int = 10_000) -> tuple[dict[str, dict[str, float]],
                                                                                  dict[str, int], float]:
    """Per head query: product -> score (the module docstring); with each query's users and the
    catalogue-wide mean attractiveness ``p0``."""
    tot_e = sum(ev.exposure.values())
    p0 = (sum(ev.success.values()) / tot_e) if tot_e > 0 else 0.0
    p0 = min(max(p0, 1e-3), 0.9)
    heads = [q for q, users in ev.query_users.items() if len(users) >= min_users]
    heads.sort(key=lambda q: -len(ev.query_users[q]))
    heads = heads[:max_queries]
    out: dict[str, dict[str, float]] = {}
    for q in heads:
        out[q] = {}
    keys = set(ev.exposure) | set(ev.success)
    head_set = set(heads)
    for q, d in keys:
        if q not in head_set:
            continue
        e, s = ev.exposure.get((q, d), 0.0), ev.success.get((q, d), 0.0)
        a = (s + PRIOR_STRENGTH * p0) / (e + PRIOR_STRENGTH)
        z = float(np.clip((a - p0) / p0, *Z_RANGE))
        n = len(ev.success_users.get((q, d), ())) if z > 0 else len(ev.exposed_users.get((q, d), ()))
        if n < min_users:
            continue
        z *= n / (n + SHRINK_CLIENTS)  # few clients, a small move (the module docstring)
        if abs(z) >= 0.05:
            out[q][d] = round(z, 4)
    return {q: b for q, b in out.items() if b}, {q: len(ev.query_users[q]) for q in heads}, p0


def labels(ev: Evidence) -> dict[str, dict[str, float]]:
    """Per query: product -> how much its posterior success rate (successes per examination under
    a Beta prior of :data:`PRIOR_STRENGTH` examinations at the slice's mean ``p0``) exceeds
    ``p0`` (0 when it does not), for judging a ranking on a held-out slice of the log. The prior
    keeps a product seen a few times at a low rank from a label of 0 (or 1) that one missing (or
    lucky) click would give it: a raw rate there punished exactly the products a better ranking
    promotes. Gains above the mean only: a product chosen less often than average gains nothing
    by being ranked, so a ranking that sinks it is not blamed for it."""
    tot_e = sum(ev.exposure.values())
    p0 = min(max((sum(ev.success.values()) / tot_e) if tot_e > 0 else 0.0, 1e-3), 0.9)
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for (q, d), e in ev.exposure.items():
        if e > 0:
            out[q][d] = max(0.0, (ev.success.get((q, d), 0.0) + PRIOR_STRENGTH * p0) / (e + PRIOR_STRENGTH) - p0)
    return dict(out)


def learn(fb: FeedbackSlice, *, now: float | None = None, min_users: int = 3, half_life_days: float = 30.0,
          max_queries: int = 10_000, em: bool = False, client_share: float = 0.2,
          bot_per_minute: int = 60) -> LearnedTable:
    """The learned table of a slice of the log."""
    now = time.time() if now is None else now
    ev = gather(fb, now=now, half_life_days=half_life_days, em=em, client_share=client_share,
                bot_per_minute=bot_per_minute)
    queries, users, p0 = scores(ev, min_users=min_users, max_queries=max_queries)
    report: dict[str, Any] = {
        "searches": len(fb.searches), "events": len(fb.events), "queries_logged": len(ev.queries),
        "head_queries": len(queries), "boosted_products": sum(1 for b in queries.values() for v in b.values() if v > 0),
        "sunk_products": sum(1 for b in queries.values() for v in b.values() if v < 0),
        "mean_attractiveness": round(p0, 4), "propensity": ev.propensity, "min_users": min_users,
        "bot_clients": len(ev.bots), "bot_events": sum(ev.bots.values()), "client_share": client_share,
    }
    return LearnedTable(queries=queries, users={q: users[q] for q in queries}, created=now,
                        half_life_s=half_life_days * 86400.0, report=report)


def texts_of(fb: FeedbackSlice) -> dict[str, str]:
    """Normalised query -> the text as first typed."""
    out: dict[str, str] = {}
    for s in fb.searches:
        if s.norm and s.text:
            out.setdefault(s.norm, s.text)
    return out
