"""API under load: a load generator on loopback against ``vitrine serve``.

For each concurrency level and query mix (text, photo, mixed), clients send requests
back-to-back for a fixed duration ("closed loop": the saturation throughput, and the latency a
queue of that many impatient clients sees); we record QPS and latency percentiles (client side,
the whole HTTP round trip) and the server's RSS.

With ``rates``, each concurrency level also runs paced ("open loop", as wrk2 does): requests are
scheduled at a fixed total rate spread over the clients, and each latency is measured from the
request's *scheduled* start, so a server that falls behind is charged for the wait it causes
(no coordinated omission). That is the latency shoppers see at a given traffic level.
"""

from __future__ import annotations

import asyncio
import base64
import random
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp

from vitrine.client import ApiError, Client, RetryPolicy, Unreachable
from vitrine.settings import Settings
from vitrine_bench.common import Report, Server, start_server, summary_ms
from vitrine_bench.encoders import matmul_flops


def query_pool(source: Path, n: int = 400, seed: int = 0) -> tuple[list[str], list[bytes]]:
    """Realistic queries from the bundled catalogue's test split: attribute queries and titles
    as text, product photos as photos."""
    from vitrine.evals import attribute_queries as aq
    from vitrine.bundled import read_splits, read_styles

    rows = read_styles(source)
    splits = read_splits(source)
    test = [i for i, r in enumerate(rows) if splits.get(r["id"]) == "test"]
    rng = random.Random(seed)
    texts = [q["text"] for q in aq.eval_queries(rows, test, n=n // 2, seed=seed)]
    texts += [rows[i]["productDisplayName"] for i in rng.sample(test, n // 2)]
    photos = [(source / "images" / f"{rows[i]['id']}.jpg").read_bytes() for i in rng.sample(test, n)]
    return texts, photos


def chinese_pool(source: Path, n: int = 400, seed: int = 0) -> list[str]:
    """Chinese text queries of the same kind: the Chinese twins of the test split's attribute queries
    ("男士黑色休闲鞋", vitrine/evals/chinese.py) and the hand-written Chinese fashion twins."""
    from vitrine.bundled import read_splits, read_styles
    from vitrine.evals import attribute_queries as aq
    from vitrine.evals import chinese

    rows = read_styles(source)
    splits = read_splits(source)
    test = [i for i, r in enumerate(rows) if splits.get(r["id"]) == "test"]
    texts = [q["zh"] for q in chinese.attribute_twins(aq.eval_queries(rows, test, n=n, seed=seed), seed=seed)]
    texts += [q["zh"] for q in chinese.hand_twins(rows)]
    random.Random(seed).shuffle(texts)
    return texts


def cue_share(texts: list[str]) -> float:
    """The share of ``texts`` holding a cue word of a non-search intent (the rest skip the intent
    ensemble under the shipped decision rule)."""
    from vitrine.intent import decision
    from vitrine.intent.classifier import clean_query
    from vitrine.intent.model import resolve_weights

    cues = decision.load(resolve_weights(Settings().intent.intent_model)).cues()  # the served rule's cue words
    if cues is None:  # no lexical prior: every query runs the ensemble
        return 1.0
    return sum(cues.has_cue(clean_query(t, 2000)[0]) for t in texts) / max(1, len(texts))


async def _send(session: aiohttp.ClientSession, request: tuple[str, str, dict[str, Any]]) -> bool:
    method, path, kwargs = request
    try:
        async with session.request(method, path, **kwargs) as r:
            await r.read()
            return r.status == 200
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return False


def _session(url: str, concurrency: int) -> aiohttp.ClientSession:
    # aiohttp, not httpx, as the load generator: 0.5 ms of client CPU per request instead of 2.4
    # (measured), and the generator shares the server's cores.
    return aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=concurrency),
                                 timeout=aiohttp.ClientTimeout(total=60))


async def _load(url: str, concurrency: int, duration: float, make_request) -> tuple[list[float], int, float]:
    """Closed loop: each client sends its next request when the last one answered."""
    lat: list[float] = []
    errors = 0
    stop = time.perf_counter() + duration
    async with _session(url, concurrency) as session:
        async def worker(wid: int) -> None:
            nonlocal errors
            i = wid
            while time.perf_counter() < stop:
                req = make_request(i)
                i += concurrency
                t0 = time.perf_counter()
                ok = await _send(session, req)
                if ok:
                    lat.append(time.perf_counter() - t0)
                else:
                    errors += 1

        t_start = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        elapsed = time.perf_counter() - t_start
    return lat, errors, elapsed


async def _paced(url: str, concurrency: int, rate: float, duration: float,
                 make_request) -> tuple[list[float], int, float]:
    """Open loop: request j is due at ``j / rate``; ``concurrency`` clients take the next due
    request in turn; latency counts from when it was due."""
    lat: list[float] = []
    errors = 0
    n_total = max(1, int(rate * duration))
    nxt = 0
    async with _session(url, concurrency) as session:
        t_start = time.perf_counter()

        async def worker() -> None:
            nonlocal errors, nxt
            while nxt < n_total:
                j = nxt
                nxt += 1
                due = t_start + j / rate
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if await _send(session, make_request(j)):
                    lat.append(time.perf_counter() - due)
                else:
                    errors += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t_start
    return lat, errors, elapsed


def _wait_for_workers(url: str, workers: int, timeout: float = 300) -> None:
    """Until every worker process answers (each loads the models; the first up answers /health
    first): concurrent health checks on fresh connections until ``workers`` pids are seen."""
    from concurrent.futures import ThreadPoolExecutor

    def pid(_: int) -> int | None:
        try:  # a fresh client (connection) each time: the OS spreads connections over the workers
            with Client(url, timeout=10, retry=RetryPolicy(attempts=1)) as c:
                return c.health().get("pid")
        except (ApiError, Unreachable):
            return None

    t_end = time.monotonic() + timeout
    seen: set[int] = set()
    with ThreadPoolExecutor(4 * workers) as pool:
        while time.monotonic() < t_end:
            seen |= {p for p in pool.map(pid, range(8 * workers)) if p is not None}
            if len(seen) >= workers:
                return
            time.sleep(1.0)
    raise RuntimeError(f"only {len(seen)} of {workers} worker processes answered within {timeout:g}s")


def run(data_dir: Path, out: Path, *, concurrency: list[int], duration: float, source: Path,
        server: Server | None = None, warmup: float = 8.0, query_cache: bool = False,
        rates: list[float] | None = None, mixes_wanted: list[str] | None = None, workers: int = 1,
        repeats: int = 1) -> Path:
    """``query_cache=False`` (the default) serves with the query-embedding cache off, so every
    request pays its encode, as distinct shoppers' queries do."""
    texts, photos = query_pool(source, n=2000)
    zh_texts = chinese_pool(source) if not mixes_wanted or "text-zh" in mixes_wanted else []
    b64 = [base64.b64encode(p).decode() for p in photos]
    store = {"facets": ["gender", "colour", "brand", "category", "price"], "highlight": True}
    mixes = {
        "text": lambda i: ("POST", "/v1/search", {"json": {"text": texts[i % len(texts)], "k": 10}}),
        # a storefront's text search: every facet counted and every hit highlighted
        "text+facets": lambda i: ("POST", "/v1/search", {"json": {"text": texts[i % len(texts)], "k": 10, **store}}),
        # every request in one of 1,000 shopping sessions (a session row read and written per search)
        "text+session": lambda i: ("POST", "/v1/search", {"json": {"text": texts[i % len(texts)], "k": 10,
                                                                   "session": f"bench-{i % 1000}"}}),
        # Chinese shoppers' text searches (on an English catalogue: read into its words first)
        "text-zh": lambda i: ("POST", "/v1/search", {"json": {"text": zh_texts[i % len(zh_texts)], "k": 10}}),
        "photo": lambda i: ("POST", "/v1/search", {"json": {"image_b64": b64[i % len(b64)], "k": 10}}),
        "mixed": lambda i: ("POST", "/v1/search", {"json": (
            {"text": texts[i % len(texts)], "k": 10} if i % 2 else {"image_b64": b64[i % len(b64)], "k": 10})}),
    }
    rep = Report("api_load" if workers == 1 else f"api_load_workers{workers}", out,
                 "Vitrine API under load" + (f" ({workers} worker processes)" if workers > 1 else ""))
    own = server is None
    env = {"VITRINE_WORKERS": str(workers)}
    if not query_cache:
        env["VITRINE_QUERY_CACHE_SIZE"] = "0"
    srv = server or start_server(data_dir, env=env)
    rows: list[dict[str, Any]] = []
    try:
        with Client(srv.url) as vc:
            health = vc.health()
        if workers > 1:
            _wait_for_workers(srv.url, workers)
        rep.add("server", health)
        # warm up at the busiest concurrency measured: every worker thread, its allocator arenas and
        # the batchers' larger batch shapes exist before the first timed cell (the first cell after
        # a 4-client warm-up ran ~30% below the same cell repeated)
        asyncio.run(_load(srv.url, max(concurrency), warmup, mixes["mixed"]))
        for mix, make in mixes.items():
            if mixes_wanted and mix not in mixes_wanted:
                continue
            cells = [(c, None) for c in concurrency] + [(c, r) for c in concurrency for r in (rates or [])]
            for n_cell, (c, rate) in enumerate([cell for _ in range(repeats) for cell in cells]):
                if rate is not None and c < 2:
                    continue  # one client cannot pace a rate over its own round trip
                # each cell starts elsewhere in the pool: a repeat must not replay the queries (and
                # warm the per-query caches) of the cell before it
                start = n_cell * 1009

                def shifted(i: int, make=make, start=start) -> tuple[str, str, dict[str, Any]]:
                    return make(start + i)

                gflops = matmul_flops(1, min_time=1.0) / 1e9  # this cell's machine speed (it drifts on a shared one)
                cpu0 = srv.cpu_s()
                if rate is None:
                    lat, errors, elapsed = asyncio.run(_load(srv.url, c, duration, shifted))
                else:
                    lat, errors, elapsed = asyncio.run(_paced(srv.url, c, rate, duration, shifted))
                row = {"mix": mix, "workers": workers, "clients": c, "load": "closed" if rate is None else f"paced {rate:g}/s",
                       "qps": len(lat) / elapsed, "errors": errors, **summary_ms(lat),
                       "server_cpu_ms_per_req": (srv.cpu_s() - cpu0) * 1000 / max(1, len(lat) + errors),
                       "server_rss_mb": srv.rss_mb(), "gflops_core": gflops}
                rows.append(row)
                print(f"{mix:6s} c={c:3d} {row['load']:>13s} qps={row['qps']:.1f} p50={row['p50_ms']:.1f}ms "
                      f"p99={row['p99_ms']:.1f}ms cpu/req={row['server_cpu_ms_per_req']:.1f}ms errors={errors} "
                      f"rss={row['server_rss_mb']:.0f}MB gflops/core={gflops:.0f}", flush=True)
    finally:
        if own:
            srv.stop()
    rep.add("results", rows)
    rep.text(f"Data dir: `{data_dir}` ({health.get('products')} products, index `{health.get('index')}`, "
             f"model `{health.get('model')}`). Each cell: {duration:.0f} s over loopback (aiohttp), k=10; latency "
             "is the client-side round trip. `closed`: every client sends its next request as soon as the last "
             "one answers (saturation). `paced R/s`: requests due at a fixed total rate R over the clients, "
             "latency counted from when each was due (a server that falls behind pays for the queue). "
             "`text+facets`: text searches asking for all five facet counts and highlights. `text+session`: text "
             "searches each in one of 1,000 shopping sessions (docs/sessions.md). `text-zh`: Chinese text searches, the "
             "Chinese twins of the attribute queries and the hand-written ones (vitrine/evals/chinese.py). The load generator is "
             "aiohttp, not vitrine.client: a fifth of httpx's client CPU per request, on cores the server shares. "
             "Query-embedding cache: "
             f"{'on' if query_cache else 'off (every request encodes its query)'}; the load generator shares the "
             "machine's cores with the server. `gflops_core`: fp32 matmul GFLOP/s of one core (`matmul_flops(1)` of "
             "`vitrine bench encoders`), measured just before each cell: server CPU per request scales with it. "
             f"Intent: {cue_share(texts):.0%} of the text queries hold an intent cue word and run the classifier "
             "ensemble; the rest are searches by the lexical prior and skip it (docs/intent.md)"
             + (", except that this server ran it on every query (VITRINE_INTENT_CLASSIFY_EVERY_QUERY)."
                if Settings().intent.intent_classify_every_query else "."))
    rep.table(rows, ["mix", "workers", "clients", "load", "qps", "p50_ms", "p95_ms", "p99_ms", "server_cpu_ms_per_req", "errors",
                     "server_rss_mb", "gflops_core"],
              "Results" + (f" ({repeats} runs of every cell, in turn)" if repeats > 1 else ""))
    if repeats > 1:
        spread = []
        for key in dict.fromkeys((r["mix"], r["clients"], r["load"]) for r in rows):
            same = [r for r in rows if (r["mix"], r["clients"], r["load"]) == key]
            p99 = sorted(r["p99_ms"] for r in same)
            spread.append({"mix": key[0], "clients": key[1], "load": key[2], "runs": len(same),
                           "p99_median_ms": statistics.median(p99), "p99_min_ms": p99[0], "p99_max_ms": p99[-1],
                           "qps_median": statistics.median(r["qps"] for r in same),
                           "cpu_ms_per_req_median": statistics.median(r["server_cpu_ms_per_req"] for r in same),
                           "gflops_core_median": statistics.median(r["gflops_core"] for r in same)})
        rep.add("spread", spread)
        rep.table(spread, ["mix", "clients", "load", "runs", "p99_median_ms", "p99_min_ms", "p99_max_ms", "qps_median",
                           "cpu_ms_per_req_median", "gflops_core_median"], "p99 across runs of the same cell")

    def draw(ax) -> None:
        for mix in mixes:
            pts = [r for r in rows if r["mix"] == mix and r["load"] == "closed"]
            ax.plot([r["qps"] for r in pts], [r["p99_ms"] for r in pts], marker="o", label=f"{mix} p99")
            for r in pts:
                ax.annotate(str(r["clients"]), (r["qps"], r["p99_ms"]), fontsize=8)
        ax.set_xlabel("throughput (queries/s)")
        ax.set_ylabel("p99 latency (ms)")
        ax.set_title("API: p99 latency vs throughput (labels: concurrent clients)")
        ax.legend()
        ax.grid(alpha=0.3)

    rep.plot(f"{rep.name}.png", draw)
    return rep.write()
