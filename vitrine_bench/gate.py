"""What the alignment adapter / MoE gate adds to one query on CPU: its forward at batch 1.

For each adapter, a query's backbone features (a real title's text features, a real photo's image
features, or both) go through the adapter alone, one query at a time on one thread, after a
warm-up; p50/p95/p99 per query kind, twice: *warm*, queries back to back (the adapter's weights
stay in the CPU caches), and *cold*, each query after reading a buffer larger than the last-level
cache, as in the service, where the towers run between two queries' gate calls and evict it (the
gate then fetches its weights, and torch its own code and state, from memory). The towers' own cost is the same for
every adapter and is measured by ``vitrine bench fastpath``.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from vitrine_bench.common import Report, summary_ms


def run(out: Path, adapters: list[str], *, n: int = 2000, flush_mb: int = 64) -> Path:
    import torch

    from vitrine.encoders.adapters import load_adapter, parse_adapter_spec
    from vitrine.evals.datasets import Catalog
    from vitrine.search.engine import build_encoder
    from vitrine.settings import Settings

    from vitrine_bench.encoders import matmul_flops

    torch.set_num_threads(1)
    gflops = round(matmul_flops(1) / 1e9, 1)  # this machine's fp32 matmul rate on one core, beside every figure
    rep = Report("gate_latency", out, "Adapter / MoE gate cost per query (CPU, batch 1, one thread)")
    encoder = build_encoder(Settings())
    img_f, txt_f = Catalog.load().features(encoder, progress=False)
    ok = ~np.isnan(img_f).any(1)
    rng = np.random.default_rng(0)
    rows = rng.choice(np.flatnonzero(ok), size=n, replace=True)
    flush = np.ones(flush_mb << 18, dtype=np.float32)  # flush_mb MiB, read before each cold query
    rows_out, series = [], {}
    for spec in adapters:
        name, path, overrides = parse_adapter_spec(spec)
        adapter = load_adapter(path, overrides=overrides).eval()
        for cache in ("warm", "cold"):
            for kind in ("text", "photo", "both"):
                lat = []
                with torch.inference_mode():
                    for i, r in enumerate(rows):
                        t = torch.from_numpy(txt_f[r:r + 1]) if kind != "photo" else None
                        p = torch.from_numpy(img_f[r:r + 1]) if kind != "text" else None
                        if cache == "cold":
                            flush.sum()
                        t0 = time.perf_counter()
                        adapter(p, t)
                        if i >= 100:  # warm-up
                            lat.append(time.perf_counter() - t0)
                rows_out.append({"adapter": name, "cache": cache, "query": kind, **summary_ms(lat),
                                 "core_GFLOPs": gflops})
                series[f"{name} {kind} {cache}"] = sorted(x * 1000 for x in lat)
    rep.add("results", rows_out)
    rep.add("matmul_GFLOP_per_s_one_core", gflops)
    rep.text(f"{n} queries per cell (the first 100 are warm-up), features of real catalogue products; "
             "time of `adapter(photo, text)` alone. *warm*: queries back to back; *cold*: each after reading "
             f"{flush_mb} MiB (more than the last-level cache), as the towers do between two queries in the service. "
             f"This machine's fp32 matmul rate on one core (`core_GFLOPs`, measured as `vitrine bench encoders` does, "
             f"2048x2048 products): {gflops} GFLOP/s; these machines range from about 70 to 200, so compare latencies "
             "across machines against it.")
    rep.table(rows_out, ["adapter", "cache", "query", "p50_ms", "p95_ms", "p99_ms", "mean_ms", "n",
                          "core_GFLOPs"], heading="Results")

    def draw(ax):
        for label, xs in series.items():
            if label.endswith(" both cold"):
                ax.plot(xs, np.linspace(0, 1, len(xs)), label=label)
        ax.set_xlabel("ms per photo + text query, cold caches (adapter only)")
        ax.set_ylabel("CDF")
        ax.legend(fontsize=7)

    rep.plot("gate_latency_cdf.png", draw)
    return rep.write()
