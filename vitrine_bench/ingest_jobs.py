"""How an ingest should use N cores for the text tower: one process with N torch threads, or N
processes of one thread each (each encoding its share), in turn, several rounds. Every process
loads its towers first and starts encoding on one signal, so model loading is not timed.

``python -m vitrine_bench.ingest_jobs [--cores 2] [--rounds 3] [--n 1024] [--out DIR]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vitrine_bench.common import Report


def worker(texts_file: Path, threads: int, part: int, parts: int, go: Path, ready: Path) -> None:
    import torch

    from vitrine.encoders.encoder import MultimodalEncoder

    torch.set_num_threads(threads)
    enc = MultimodalEncoder.create(features_only=True)
    texts = json.loads(texts_file.read_text())[part::parts]
    enc.text_features(texts[:64])  # warm
    ready.write_text("1")
    while not go.exists():
        time.sleep(0.01)
    t0 = time.perf_counter()
    enc.text_features(texts)  # length-sorted forwards of 64, as ingest runs them
    print(json.dumps({"n": len(texts), "seconds": time.perf_counter() - t0}))


def one(texts_file: Path, cores: int, procs: int) -> float:
    """Texts/s of ``procs`` processes with ``cores // procs`` threads each, started together."""
    with tempfile.TemporaryDirectory() as d:
        go = Path(d) / "go"
        ps = []
        for p in range(procs):
            ps.append(subprocess.Popen(
                [sys.executable, "-m", "vitrine_bench.ingest_jobs", "--worker", str(texts_file), str(cores // procs),
                 str(p), str(procs), str(go), str(Path(d) / f"ready{p}")],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}))
        while not all((Path(d) / f"ready{p}").exists() for p in range(procs)):
            if any(x.poll() not in (None, 0) for x in ps):
                raise RuntimeError("an encode worker failed")
            time.sleep(0.05)
        t0 = time.perf_counter()
        go.write_text("1")
        outs = [json.loads(x.communicate()[0].decode().strip().splitlines()[-1]) for x in ps]
        wall = time.perf_counter() - t0
    return sum(o["n"] for o in outs) / wall


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        a = sys.argv[2:]
        worker(Path(a[0]), int(a[1]), int(a[2]), int(a[3]), Path(a[4]), Path(a[5]))
        return
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--out", type=Path, default=Path("bench-results"))
    a = ap.parse_args()
    from vitrine.bundled import bundled_dir, read_styles
    from vitrine_bench.ingest_profile import gflops

    rows = read_styles(bundled_dir())[: a.n]
    rep = Report("ingest-jobs", a.out, "Vitrine ingest: N cores as threads or as processes (text tower)")
    g0 = gflops()
    with tempfile.TemporaryDirectory() as d:
        tf = Path(d) / "texts.json"
        tf.write_text(json.dumps([r["productDisplayName"] for r in rows]))
        modes = {f"1 process x {a.cores} threads": 1, f"{a.cores} processes x 1 thread": a.cores}
        rates: dict[str, list[float]] = {m: [] for m in modes}
        for _ in range(a.rounds):
            for m, procs in modes.items():
                rates[m].append(one(tf, a.cores, procs))
    g1 = gflops()
    rep.add("rates", rates)
    rep.add("gflops", {"before": g0, "after": g1})
    rep.text(f"{a.n} bundled titles through the text tower (length-sorted forwards of 64), {a.rounds} rounds in turn. "
             f"fp32 matmul GFLOP/s one thread {g0['gflops_1_thread']:.1f} before / {g1['gflops_1_thread']:.1f} after, "
             f"all threads {g0['gflops_all_threads']:.1f} / {g1['gflops_all_threads']:.1f}; load {os.getloadavg()[0]:.1f}.")
    rep.table([{"mode": m, "texts_per_s_median": statistics.median(v), "runs": ", ".join(f"{x:.0f}" for x in v)}
               for m, v in rates.items()], ["mode", "texts_per_s_median", "runs"])
    print(rep.write())
    print(json.dumps(rates))


if __name__ == "__main__":
    main()
