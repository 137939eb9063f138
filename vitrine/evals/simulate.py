"""A shopper simulator for Vitrine's own tests and reports (`vitrine simulate`): users who search
with judged queries and click, add to cart and buy through the HTTP API, as the position-based
model of examination says real shoppers do.

A session: one user (a token ``sim-<n>``) searches a query (``POST /v1/search``, ONE page of
``k`` = 10: a shopper never sees what lies below it, so a simulator cannot teach learning about
products real logs never show), examines rank ``r`` with probability ``(1 / (r + 1)) ** eta``
(the position-based model: attention falls with rank), clicks an examined product with a
probability that grows with its judged grade (``click_floor`` for an irrelevant one,
``click_ceiling`` for the top grade), and adds to the cart and buys only an exact match (the
query's top grade); the session's events go to ``POST /v1/events`` in one batch with the search's
``query_id``.

Measurement searches (nDCG@10 of each query against its judgements) are made as one separate user
(``sim-eval``), so the evidence they add is capped at one user's and never clicked.

These are simulated shoppers over judged queries, not real ones: a gain measured here says the
loop works end to end, not how much real shoppers gain.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from vitrine.metrics import ndcg_at_k

log = logging.getLogger(__name__)

EVAL_USER = "sim-eval"


class Http(Protocol):
    """What the simulator needs of an HTTP client (httpx.Client, FastAPI's TestClient)."""

    def post(self, url: str, *, json: Any = None, headers: Any = None) -> Any: ...


@dataclass
class Shopper:
    """How simulated shoppers behave (see the module docstring)."""

    eta: float = 1.0
    click_floor: float = 0.03
    click_ceiling: float = 0.7
    cart: float = 0.4
    purchase: float = 0.25
    k: int = 10

    def examine(self, rank: int) -> float:
        return (1.0 / (rank + 1.0)) ** self.eta

    def click(self, grade: float) -> float:
        return self.click_floor + (self.click_ceiling - self.click_floor) * grade

    def page(self, results: Sequence[Any]) -> list[Any]:
        """What a shopper sees of a search: its first page (``k`` results), nothing below."""
        return list(results[:self.k])


@dataclass
class JudgedQuery:
    qid: str
    text: str
    relevant: dict[str, float]  # product id -> grade (higher is better)

    def gain(self, pid: str) -> float:
        """The grade scaled to [0, 1] by this query's top grade."""
        top = max(self.relevant.values(), default=1.0) or 1.0
        return max(0.0, self.relevant.get(pid, 0.0)) / top

    def exact(self, pid: str) -> bool:
        """Whether the product has the query's top grade (an exact match: what a shopper buys)."""
        return self.gain(pid) >= 1.0


@dataclass
class SessionLog:
    searches: int = 0
    clicks: int = 0
    carts: int = 0
    purchases: int = 0
    events_accepted: int = 0
    by_query: dict[str, int] = field(default_factory=dict)


def ndcg10(ranked: Sequence[str], q: JudgedQuery) -> float:
    return ndcg_at_k(list(ranked), q.relevant, 10)


def agent(user: str) -> dict[str, str]:
    """Each simulated shopper browses from a browser of their own: a client of their own to the
    API (vitrine/web/limits.py fingerprints address and user agent), as real shoppers are."""
    return {"User-Agent": f"vitrine-sim/{user}"}


def _search(http: Http, text: str, k: int, user: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    r = http.post("/v1/search", json={"text": text, "k": k, "user": user, **(extra or {})}, headers=agent(user))
    if r.status_code != 200:
        raise RuntimeError(f"search {text!r} answered {r.status_code}: {r.text[:300]}")
    return r.json()


def session(http: Http, q: JudgedQuery, user: str, shopper: Shopper, rng: random.Random, *,
            key: str | None, out: SessionLog, search_extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """One simulated session on ``q``; returns the search response."""
    res = _search(http, q.text, shopper.k, user, search_extra)
    out.searches += 1
    out.by_query[q.qid] = out.by_query.get(q.qid, 0) + 1
    events: list[dict[str, Any]] = []
    for rank, hit in enumerate(shopper.page(res.get("results", []))):
        if rng.random() >= shopper.examine(rank):
            continue
        g = q.gain(hit["id"])
        if rng.random() >= shopper.click(g):
            continue
        base = {"query_id": res["query_id"], "product_id": hit["id"], "position": res.get("offset", 0) + rank,
                "user": user}
        events.append({"type": "click", **base})
        out.clicks += 1
        if q.exact(hit["id"]) and rng.random() < shopper.cart:
            events.append({"type": "add_to_cart", **base})
            out.carts += 1
            if rng.random() < shopper.purchase / max(shopper.cart, 1e-9):
                events.append({"type": "purchase", **base})
                out.purchases += 1
    if events:
        r = http.post("/v1/events", json={"events": events}, headers={**agent(user), **({"X-API-Key": key} if key else {})})
        if r.status_code != 202:
            raise RuntimeError(f"events answered {r.status_code}: {r.text[:300]}")
        out.events_accepted += int(r.json().get("accepted", 0))
    return res


def simulate(http: Http, queries: Sequence[JudgedQuery], sessions_per_query: int, *, key: str | None,
             shopper: Shopper | None = None, seed: int = 0, first_user: int = 0,
             users: int | None = None, search_extra: dict[str, Any] | None = None,
             progress: Callable[[int, int], None] | None = None) -> SessionLog:
    """``sessions_per_query`` sessions on each query, interleaved over queries; users
    ``sim-<first_user>``..., each a new one unless ``users`` bounds the pool (then reused)."""
    shopper = shopper or Shopper()
    rng = random.Random(seed)
    out = SessionLog()
    total = sessions_per_query * len(queries)
    n = 0
    for _ in range(sessions_per_query):
        for q in queries:
            u = first_user + (n % users if users else n)
            session(http, q, f"sim-{u}", shopper, rng, key=key, out=out, search_extra=search_extra)
            n += 1
            if progress is not None:
                progress(n, total)
    return out


def evaluate(http: Http, queries: Sequence[JudgedQuery], *, k: int = 10) -> dict[str, float]:
    """nDCG@10 of each query as the API ranks it now (searched as the one evaluation user)."""
    return {q.qid: ndcg10([h["id"] for h in _search(http, q.text, k, EVAL_USER).get("results", [])], q)
            for q in queries}


def judged_queries(rows: Sequence[dict[str, Any]]) -> list[JudgedQuery]:
    """Text queries with at least one relevant product from eval-queries JSONL rows."""
    out = []
    for r in rows:
        rel = {str(p): float(g) for p, g in (r.get("relevant") or {}).items() if float(g) > 0}
        if r.get("text") and rel:
            out.append(JudgedQuery(str(r.get("qid") or r["text"]), str(r["text"]), rel))
    return out


def mean(v: dict[str, float]) -> float:
    return sum(v.values()) / len(v) if v else 0.0
