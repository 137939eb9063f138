"""An events flood beside paced searches: does ``POST /v1/events`` at 1,000 events/s slow searches,
and is every event the API answered 202 for stored, even after a ``kill -9`` of the server?

One ``vitrine serve`` process (its own, over ``data_dir``). Searches: text queries from the
bundled catalogue's test split, paced at ``search_rate``/s over 16 clients (open loop: latency
counted from when each request was due, as ``vitrine bench api`` does). Events: ``event_calls``
calls/s of ``batch`` events each, paced the same way over 8 clients, on the pages of searches the
bench logged first (so every event is valid: 202 expected), each with its own ``event_id``. The
flood (and the analytics reader) run in a process of their own, so the client's own work for them
(building and sending the bodies, reading the answers) never runs in the searches' event loop,
where it could delay the searches' clocks and count as the server's latency (measured: it did not
change p99 on 12-07, but the bench no longer has to argue that).

Cells alternate ``alone`` (searches only) and ``flood`` (searches + events), the order flipped
each repeat, so a drift of the shared machine falls on both. After the cells the event log is
counted against the event ids answered 202. Then the crash check: the flood and the searches run,
the server gets SIGKILL in the middle, it is started again over the same data dir, and every
event id answered 202 before the kill must be in the log.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import random
import signal
import sqlite3
import statistics
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp

from vitrine_bench.api import query_pool
from vitrine_bench.common import Report, Server, start_server, summary_ms
from vitrine_bench.encoders import matmul_flops

KEY = "events-bench-key"
TYPES = ("view", "view", "view", "click", "click", "add_to_cart", "purchase")


class Flood:
    """Event batches on logged pages; remembers which event ids were answered 202."""

    def __init__(self, pages: list[tuple[str, list[str]]], batch: int, seed: int = 0) -> None:
        self.pages, self.batch = pages, batch
        self.rng = random.Random(seed)
        self.acked: set[str] = set()
        self.sent = 0
        self.lat: list[float] = []
        self.errors = 0

    def body(self) -> tuple[bytes, list[str]]:
        events, ids = [], []
        for _ in range(self.batch):
            qid, page = self.pages[self.rng.randrange(len(self.pages))]
            pos = self.rng.randrange(len(page))
            eid = uuid.uuid4().hex
            events.append({"type": self.rng.choice(TYPES), "query_id": qid, "product_id": page[pos],
                           "position": pos, "user": f"u{self.rng.randrange(500)}", "event_id": eid})
            ids.append(eid)
        return json.dumps({"events": events}).encode(), ids


async def _paced(session: aiohttp.ClientSession, clients: int, rate: float, duration: float, send) -> None:
    """Open loop: call j is due at ``j / rate``; ``clients`` take the next due call in turn."""
    n_total = max(1, int(rate * duration))
    nxt = 0
    t_start = time.perf_counter()

    async def worker() -> None:
        nonlocal nxt
        while nxt < n_total:
            j = nxt
            nxt += 1
            due = t_start + j / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await send(session, j, due)

    await asyncio.gather(*(worker() for _ in range(clients)))


def _session(url: str, limit: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=limit),
                                 timeout=aiohttp.ClientTimeout(total=60))


def _side(url: str, pages: list[tuple[str, list[str]]], batch: int, seed: int, duration: float,
          event_calls: float, analytics: bool) -> dict[str, Any]:
    """The flood (and the analytics reader) of one cell, in the side process: what the parent's
    :class:`Flood` and reads list take in."""
    flood = Flood(pages, batch, seed=seed)
    reads: list[float] | None = [] if analytics else None
    asyncio.run(_cell(url, [], 0, duration, 0.0, flood, event_calls, reads))
    return {"acked": sorted(flood.acked), "sent": flood.sent, "lat": flood.lat, "errors": flood.errors,
            "reads": reads or []}


def side_pool() -> ProcessPoolExecutor:
    """The side process (spawned: nothing of this process's state goes with it), started now so a
    cell's flood begins with its searches."""
    pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    pool.submit(time.sleep, 0).result()
    return pool


async def _cell(url: str, texts: list[str], start: int, duration: float, search_rate: float,
                flood: Flood | None, event_calls: float, analytics: list[float] | None = None,
                pool: ProcessPoolExecutor | None = None, side_url: str | None = None) -> tuple[list[float], int]:
    """Paced searches for ``duration`` s (none when ``search_rate`` is 0), with the ``flood`` beside
    them when given, and (``analytics`` a list: each read's seconds go there) GET /v1/analytics read in
    a loop, one read after another. With ``pool``, the flood and the reads run in its process."""
    lat: list[float] = []
    errors = 0

    async def read_analytics(session: aiohttp.ClientSession) -> None:
        assert analytics is not None
        end = time.perf_counter() + duration
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            try:
                async with session.get("/v1/analytics", headers={"X-API-Key": KEY}) as r:
                    await r.read()
                    if r.status == 200:
                        analytics.append(time.perf_counter() - t0)
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass

    async def search(session: aiohttp.ClientSession, j: int, due: float) -> None:
        nonlocal errors
        try:
            async with session.post("/v1/search", json={"text": texts[(start + j) % len(texts)], "k": 10}) as r:
                await r.read()
                ok = r.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):
            ok = False
        if ok:
            lat.append(time.perf_counter() - due)
        else:
            errors += 1

    async def events(session: aiohttp.ClientSession, j: int, due: float) -> None:
        assert flood is not None
        body, ids = flood.body()
        flood.sent += len(ids)
        try:
            async with session.post("/v1/events", data=body, headers={"X-API-Key": KEY,
                                                                      "Content-Type": "application/json"}) as r:
                got = await r.read()
                ok = r.status == 202
        except (aiohttp.ClientError, asyncio.TimeoutError):
            ok, got = False, b""
        if ok and json.loads(got)["accepted"] == len(ids):
            flood.acked.update(ids)
            flood.lat.append(time.perf_counter() - due)
        else:
            flood.errors += 1

    side = None
    if pool is not None and flood is not None:
        side = asyncio.get_running_loop().run_in_executor(
            pool, _side, side_url or url, flood.pages, flood.batch, start, duration, event_calls, analytics is not None)
    async with _session(url, 16) as s1, _session(url, 8) as s2, _session(url, 1) as s3:
        jobs = [_paced(s1, 16, search_rate, duration, search)] if search_rate > 0 else []
        if flood is not None and side is None:
            jobs.append(_paced(s2, 8, event_calls, duration, events))
            if analytics is not None:
                jobs.append(read_analytics(s3))
        await asyncio.gather(*jobs)
    if side is not None and flood is not None:
        got = await side
        flood.acked.update(got["acked"])
        flood.sent += got["sent"]
        flood.lat.extend(got["lat"])
        flood.errors += got["errors"]
        if analytics is not None:
            analytics.extend(got["reads"])
    return lat, errors


async def _pages(url: str, texts: list[str], n: int) -> list[tuple[str, list[str]]]:
    out = []
    async with _session(url, 4) as s:
        for t in texts[:n]:
            async with s.post("/v1/search", json={"text": t, "k": 10}) as r:
                d = await r.json()
            if d.get("results") and d.get("query_id"):
                out.append((d["query_id"], [h["id"] for h in d["results"]]))
    return out


def stored_ids(data_dir: Path) -> set[str]:
    with sqlite3.connect(f"file:{Path(data_dir) / 'events.sqlite'}?mode=ro", uri=True, timeout=30) as db:
        return {r[0] for r in db.execute("SELECT event_id FROM events")}


def run(data_dir: Path, out: Path, *, source: Path, duration: float = 20.0, repeats: int = 3,
        search_rate: float = 100.0, event_calls: float = 20.0, batch: int = 50, kill_after: float = 6.0,
        name: str = "events-load", analytics: bool = False, events_server: bool = False) -> Path:
    """``analytics``: the flood cells also read GET /v1/analytics in a loop (issue 53: search never
    waits for side work). ``events_server``: the flood and the reads go to a second server on the same
    data dir, not to the one searched (a deployment routing them to a process of their own; its CPU is
    not in ``server_cpu``). ``kill_after`` <= 0: no kill -9 part."""
    texts, _ = query_pool(source, n=2000)
    reads: list[float] | None = [] if analytics else None
    env = {"VITRINE_API_KEY": KEY, "VITRINE_QUERY_CACHE_SIZE": "0"}
    rep = Report(name, out, "An events flood beside paced searches (POST /v1/events at "
                            f"{event_calls * batch:,.0f} events/s, {search_rate:g} searches/s"
                            + (", GET /v1/analytics read in a loop" if analytics else "") + ")")
    before = stored_ids(data_dir) if (Path(data_dir) / "events.sqlite").is_file() else set()
    srv: Server = start_server(data_dir, env=env)
    rows: list[dict[str, Any]] = []
    pool: ProcessPoolExecutor | None = None
    srv_side: Server | None = None
    try:
        # a deployment that routes the events and analytics to a process of their own (docs/performance.md)
        srv_side = start_server(data_dir, env=env) if events_server else None
        side_url = srv_side.url if srv_side else None
        pages = asyncio.run(_pages(srv.url, texts[1000:], 300))
        flood = Flood(pages, batch)
        pool = side_pool()
        asyncio.run(_cell(srv.url, texts, 0, 8.0, search_rate, flood, event_calls, pool=pool, side_url=side_url))  # warm-up
        n_cell = 0
        for r in range(repeats):
            for mode in (("alone", "flood") if r % 2 == 0 else ("flood", "alone")):
                n_cell += 1
                gflops = matmul_flops(1, min_time=1.0) / 1e9
                cpu0 = srv.cpu_s()
                acked0, lat0, err0 = len(flood.acked), len(flood.lat), flood.errors
                reads0 = len(reads) if reads is not None else 0
                lat, errors = asyncio.run(_cell(srv.url, texts, n_cell * 1009, duration, search_rate,
                                                flood if mode == "flood" else None, event_calls, reads, pool, side_url))
                ev_lat = flood.lat[lat0:]
                row = {"repeat": r + 1, "mode": mode, "searches": len(lat), "search_errors": errors,
                       **{f"search_{k}": v for k, v in summary_ms(lat).items() if k != "n"},
                       "events_202": len(flood.acked) - acked0, "event_call_errors": flood.errors - err0,
                       "events_per_s": (len(flood.acked) - acked0) / duration,
                       "event_call_p99_ms": summary_ms(ev_lat)["p99_ms"] if ev_lat else None,
                       "server_cpu_s_per_s": (srv.cpu_s() - cpu0) / duration, "gflops_core": gflops,
                       "analytics_reads": (len(reads) - reads0) if reads is not None else None,
                       "analytics_read_p50_ms": (summary_ms(reads[reads0:])["p50_ms"]
                                                 if reads is not None and len(reads) > reads0 else None)}
                rows.append(row)
                print(f"{mode:5s} #{r + 1} search p50={row['search_p50_ms']:.1f} p99={row['search_p99_ms']:.1f}ms "
                      f"errors={errors} events 202={row['events_202']} ({row['events_per_s']:.0f}/s, call p99="
                      f"{row['event_call_p99_ms'] or 0:.1f}ms, errors={row['event_call_errors']}) "
                      f"server cpu={row['server_cpu_s_per_s']:.2f} cores gflops={gflops:.0f}", flush=True)
        stored = stored_ids(data_dir) - before
        count = {"events_sent": flood.sent, "events_202": len(flood.acked), "stored_new": len(stored),
                 "acked_missing": len(flood.acked - stored), "stored_not_acked": len(stored - flood.acked)}
        print("count after the cells:", count, flush=True)

        crash_row: dict[str, Any] = {}
        if srv_side is not None:
            srv_side.stop()
        if kill_after <= 0:
            srv.stop()
        # the crash: flood + searches, SIGKILL in the middle, restart, count
        crash = Flood(pages, batch, seed=1)

        async def flood_then_kill() -> tuple[list[float], int]:
            task = asyncio.ensure_future(_cell(srv.url, texts, 77_777, kill_after * 3, search_rate, crash,
                                               event_calls))
            await asyncio.sleep(kill_after)
            os.kill(srv.proc.pid, signal.SIGKILL)
            return await task

        if kill_after > 0:
            t_kill = time.time()
            asyncio.run(flood_then_kill())
            srv.proc.wait(30)
            srv2 = start_server(data_dir, env=env)
            restart_s = time.time() - t_kill
            try:
                after = stored_ids(data_dir)
                lost = crash.acked - after
                crash_row = {"events_sent": crash.sent, "events_202_before_kill": len(crash.acked),
                             "lost": len(lost), "calls_failed_by_the_kill": crash.errors,
                             "stored_from_unanswered_calls": len((after - before - stored) - crash.acked),
                             "kill_after_s": kill_after, "restart_s": round(restart_s, 1)}
                print("kill -9:", crash_row, flush=True)
            finally:
                srv2.stop()
    finally:
        if pool is not None:
            pool.shutdown()
        if srv_side is not None and srv_side.proc.poll() is None:
            srv_side.stop()
        if srv.proc.poll() is None:
            srv.stop()

    summary = []
    for mode in ("alone", "flood"):
        same = [r for r in rows if r["mode"] == mode]
        p99 = sorted(r["search_p99_ms"] for r in same)
        summary.append({"mode": mode, "runs": len(same), "search_p99_median_ms": statistics.median(p99),
                        "search_p99_min_ms": p99[0], "search_p99_max_ms": p99[-1],
                        "search_p50_median_ms": statistics.median(r["search_p50_ms"] for r in same),
                        "events_per_s_median": statistics.median(r["events_per_s"] for r in same),
                        "server_cpu_median": statistics.median(r["server_cpu_s_per_s"] for r in same)})
    base = summary[0]["search_p99_median_ms"]
    for s in summary:
        s["p99_vs_alone"] = round(s["search_p99_median_ms"] / base, 3) if base else None
    rep.add("config", {"data_dir": str(data_dir), "duration_s": duration, "repeats": repeats,
                       "analytics": analytics, "events_server": events_server,
                       "search_rate": search_rate, "event_calls_per_s": event_calls, "batch": batch})
    rep.add("cells", rows)
    rep.add("summary", summary)
    rep.add("count", count)
    rep.add("kill9", crash_row)
    rep.table(summary, ["mode", "runs", "search_p99_median_ms", "p99_vs_alone", "search_p99_min_ms", "search_p99_max_ms",
                        "search_p50_median_ms", "events_per_s_median", "server_cpu_median"],
              "Search latency with and without the flood (medians over the runs)")
    rep.table(rows, ["repeat", "mode", "searches", "search_errors", "search_p50_ms", "search_p95_ms",
                     "search_p99_ms", "events_202", "events_per_s", "event_call_p99_ms", "event_call_errors",
                     "server_cpu_s_per_s", "gflops_core", "analytics_reads", "analytics_read_p50_ms"],
              "Every cell, in the order run")
    rep.table([count], list(count), "Events answered 202 against events stored (after the cells)")
    if crash_row:
        rep.table([crash_row], list(crash_row), "kill -9 in the middle of the flood, restart, count")

    def draw(ax) -> None:
        for mode, colour in (("alone", "tab:blue"), ("flood", "tab:red")):
            same = [r for r in rows if r["mode"] == mode]
            ax.plot([r["repeat"] for r in same], [r["search_p99_ms"] for r in same], marker="o", color=colour,
                    label=f"search p99, {mode}")
            ax.plot([r["repeat"] for r in same], [r["search_p50_ms"] for r in same], marker=".", ls=":",
                    color=colour, label=f"search p50, {mode}")
        ax.axhline(60, color="grey", ls="--", lw=1, label="bar: p99 60 ms")
        ax.set_xlabel("repeat (cells interleaved)")
        ax.set_ylabel("latency (ms)")
        ax.set_title(f"{search_rate:g} searches/s, with and without {event_calls * batch:,.0f} events/s")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)

    rep.plot(f"{name}.png", draw)
    return rep.write()
