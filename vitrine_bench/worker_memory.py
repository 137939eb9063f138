"""Memory per API worker: RSS and PSS (proportional set size, /proc/PID/smaps_rollup: a page shared
by N processes counts 1/N in each) of every process of ``vitrine serve --workers N``, after a
warm-up of searches, for N = 1 and 2. What a second worker adds is the host's total PSS at two
workers minus at one.

``python -m vitrine_bench.worker_memory --data D [--workers 1,2] [--out DIR] [--queries Q --searches N]``

With ``--queries`` (a JSONL of ``{"text": ...}``, e.g. `vitrine make-catalogue`'s queries.jsonl) the
warm-up is N searches over those texts, half of them with brand and category facets, from 8
connections at once (so every worker serves its share): what a worker copies of the pages it
shares grows with the variety of what it is asked, not with a handful of repeated queries.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from vitrine_bench.common import Report, start_server


def smaps(pid: int) -> dict[str, float]:
    """RSS, PSS, shared and private memory of one process (MB) from smaps_rollup."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[-1] == "kB":
            key = parts[0].rstrip(":")
            if key in ("Rss", "Pss", "Shared_Clean", "Shared_Dirty", "Private_Clean", "Private_Dirty", "Swap"):
                out[key.lower() + "_mb"] = int(parts[1]) / 1024
    return out


WORDS = ["red dress", "men running shoes", "blue jeans", "leather handbag", "white shirt", "watch"]


def warm(url: str, n: int = 40, texts: list[str] | None = None, offset: int = 0) -> None:
    from vitrine.client import Client

    texts = texts or WORDS
    with Client(url, timeout=60) as c:
        for i in range(n):
            j = offset + i
            c.search(texts[j % len(texts)], facets=("brand", "category") if j % 2 and texts is not WORDS else ())


def warm_many(url: str, texts: list[str], searches: int, connections: int = 8) -> None:
    """``searches`` searches over ``texts`` from ``connections`` connections at once."""
    from concurrent.futures import ThreadPoolExecutor

    per = -(-searches // connections)
    with ThreadPoolExecutor(connections) as pool:
        list(pool.map(lambda k: warm(url, per, texts, k * per), range(connections)))


def measure(data_dir: Path, workers: int, texts: list[str] | None = None, searches: int = 0) -> dict[str, Any]:
    srv = start_server(data_dir, env={"VITRINE_WORKERS": str(workers), "OMP_WAIT_POLICY": "PASSIVE"},
                       timeout=3600)
    try:
        if texts:
            warm_many(srv.url, texts, searches)
        for _ in range(3):  # requests spread over the workers by the kernel: warm each
            warm(srv.url)
        time.sleep(1.0)
        procs = []
        for pid in srv.pids():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
                procs.append({"pid": pid, "cmd": cmd, **smaps(pid)})
            except OSError:
                continue
    finally:
        srv.stop()
    return {"workers": workers, "searches": searches + 120, "processes": procs, "total_pss_mb": sum(p.get("pss_mb", 0) for p in procs),
            "total_rss_mb": sum(p.get("rss_mb", 0) for p in procs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--out", type=Path, default=Path("bench-results"))
    ap.add_argument("--queries", type=Path, default=None, help="JSONL of {\"text\": ...}: the warm-up's texts")
    ap.add_argument("--searches", type=int, default=2000, help="searches over --queries before measuring")
    a = ap.parse_args()
    rep = Report("worker-memory", a.out, "Vitrine memory per API worker (RSS and PSS)")
    texts = [json.loads(x)["text"] for x in a.queries.read_text().splitlines() if x.strip()] if a.queries else None
    rows = [measure(a.data, int(w), texts, a.searches if texts else 0) for w in a.workers.split(",")]
    rep.add("runs", rows)
    table = []
    for r in rows:
        for p in r["processes"]:
            table.append({"workers": r["workers"], "pid": p["pid"], "rss_mb": p.get("rss_mb"), "pss_mb": p.get("pss_mb"),
                          "shared_mb": p.get("shared_clean_mb", 0) + p.get("shared_dirty_mb", 0),
                          "private_mb": p.get("private_clean_mb", 0) + p.get("private_dirty_mb", 0),
                          "cmd": p["cmd"][-60:]})
        table.append({"workers": r["workers"], "pid": "total", "rss_mb": r["total_rss_mb"], "pss_mb": r["total_pss_mb"]})
    rep.table(table, ["workers", "pid", "rss_mb", "pss_mb", "shared_mb", "private_mb", "cmd"], "Per process")
    if len(rows) >= 2:
        extra = rows[1]["total_pss_mb"] - rows[0]["total_pss_mb"]
        rep.add("second_worker_pss_mb", extra)
        rep.text(f"A second worker adds **{extra:.0f} MB** of PSS to the host (total PSS "
                 f"{rows[0]['total_pss_mb']:.0f} -> {rows[1]['total_pss_mb']:.0f} MB).")
    print(rep.write())
    print(json.dumps([{k: v for k, v in r.items() if k != "processes"} for r in rows]))


if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    main()
