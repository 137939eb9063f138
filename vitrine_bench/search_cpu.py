"""CPU per text search in process (Engine.search, query-embedding cache off), two checkouts of the
code interleaved on the same data dirs, so a shared, noisy machine loads both alike.

    python vitrine_bench/search_cpu.py compare --before /tmp/base --after . DATA_DIR... [--out bench-results/search-cpu]

Each (checkout, data dir) runs in its own process (``PYTHONPATH`` = the checkout): it opens the
engine, warms on 50 queries, then times ``--n`` searches of the API bench's query pool ``--repeats``
times, and prints JSON: the CPU of the searching thread (``time.thread_time``: the read path, which
waits for the query encode in the encoders' batcher thread) and of the whole process
(``time.process_time``: the encode, the intent classifier and the search log's writer too). Run as
a file, not a module, so that the ``before`` checkout need not have this script.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def measure(data_dir: Path, n: int, repeats: int, log_search: bool, pre_encode: bool = False) -> dict[str, Any]:
    from vitrine.bundled import bundled_dir
    from vitrine.cli.base import make_settings
    from vitrine.search.engine import Engine
    from vitrine.search.models import SearchRequest
    from vitrine_bench.api import query_pool

    texts, _ = query_pool(bundled_dir(), n=2000)
    eng = Engine.open(make_settings(data_dir=data_dir, query_cache_size=4096 if pre_encode else 0))
    for t in texts[:50]:
        eng.search(SearchRequest(text=t, k=10), log_search=log_search)
    batch = texts[100:100 + n]
    if pre_encode:  # the query vectors cached beforehand: no encode runs beside the read path
        for t in batch:
            eng.reader.query_vectors(t, None)
            eng.reader.native_query_vector(t)
    process_ms, main_ms = [], []
    for _ in range(repeats):
        t0, m0 = time.process_time(), time.thread_time()
        for t in batch:
            eng.search(SearchRequest(text=t, k=10), log_search=log_search)
        process_ms.append((time.process_time() - t0) / len(batch) * 1000)
        main_ms.append((time.thread_time() - m0) / len(batch) * 1000)
    eng.close()
    return {"process_cpu_ms": process_ms, "main_thread_cpu_ms": main_ms,
            "process_median_ms": statistics.median(process_ms), "read_path_ms": statistics.median(main_ms),
            "read_path_first_ms": main_ms[0],
            "other_threads_ms": statistics.median(p - m for p, m in zip(process_ms, main_ms))}


def _run(checkout: Path, data_dir: Path, a: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "measure", str(data_dir), "--n", str(a.n),
           "--repeats", str(a.repeats)] + (["--log-search"] if a.log_search else []) + \
        (["--pre-encode"] if a.pre_encode else [])
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=str(checkout))
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _git(checkout: Path) -> str:
    r = subprocess.run(["git", "-C", str(checkout), "log", "-1", "--format=%h"], capture_output=True, text=True)
    return r.stdout.strip() or str(checkout)


def compare(a: argparse.Namespace) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    for rnd in range(a.rounds):
        for data_dir in a.data_dirs:
            for label, checkout in (("before", a.before), ("after", a.after)):
                load = os.getloadavg()
                r = _run(checkout, data_dir, a)
                runs.append({"round": rnd, "data_dir": str(data_dir), "code": label, "load_before": load, **r})
                if a.out:  # as it goes: a long comparison cut short keeps its finished runs
                    a.out.with_suffix(".runs.json").write_text(json.dumps(runs, indent=1))
                sys.stderr.write(f"{label} {data_dir}: read path {r['read_path_ms']:.2f} ms (first repeat "
                                 f"{r.get('read_path_first_ms', float('nan')):.2f}), process "
                                 f"{r['process_median_ms']:.2f} ms (load {load[0]:.2f})\n")
    summary = {}
    for data_dir in a.data_dirs:
        cell = {}
        for label in ("before", "after"):
            mine = [r for r in runs if r["data_dir"] == str(data_dir) and r["code"] == label]
            cell[label] = {k: statistics.median(r[k] for r in mine)
                           for k in ("read_path_ms", "read_path_first_ms", "process_median_ms", "other_threads_ms")
                           if all(k in r for r in mine)}
        cell["read_path_speedup"] = cell["before"]["read_path_ms"] / max(cell["after"]["read_path_ms"], 1e-9)
        summary[str(data_dir)] = cell
    return {"before": {"checkout": str(a.before), "commit": _git(a.before)},
            "after": {"checkout": str(a.after), "commit": _git(a.after)},
            "n": a.n, "repeats": a.repeats, "rounds": a.rounds, "log_search": a.log_search,
            "pre_encode": a.pre_encode,
            "cpu_count": os.cpu_count(), "summary": summary, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("data_dir", type=Path)
    c = sub.add_parser("compare")
    c.add_argument("data_dirs", type=Path, nargs="+")
    c.add_argument("--before", type=Path, required=True)
    c.add_argument("--after", type=Path, required=True)
    c.add_argument("--rounds", type=int, default=2, help="before/after alternations per data dir")
    c.add_argument("--out", type=Path, help="write OUT.json")
    for q in (m, c):
        q.add_argument("--n", type=int, default=300)
        q.add_argument("--repeats", type=int, default=3)
        q.add_argument("--log-search", action="store_true", help="log each search as the API does")
        q.add_argument("--pre-encode", action="store_true", help=(
            "cache the query vectors first (no encode beside the search: on a 2-core machine it slows the "
            "read path's thread by sharing the core's caches); the first repeat is the only one with cold "
            "per-query caches (graph candidates, BM25 term parts)"))
    a = p.parse_args(argv)
    if a.cmd == "measure":
        sys.stdout.write(json.dumps(measure(a.data_dir, a.n, a.repeats, a.log_search, a.pre_encode)) + "\n")
        return 0
    res = compare(a)
    text = json.dumps(res, indent=1)
    if a.out:
        a.out.with_suffix(".json").write_text(text)
    sys.stdout.write(json.dumps(res["summary"], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
