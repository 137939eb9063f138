"""Intent classifier latency on CPU at batch 1: tokenizer + Qwen2 forward, slot extraction, both.

Queries: the held-out queries of the shipped classifier (English, Chinese, code-mixed, typos)
and the held-out leaves of Google's taxonomy typed as a shopper would, plus a very long one and an emoji-only one. Each query is classified alone (batch 1), after a
warm-up; p50/p95/p99 per stage, with torch's default threads and with one thread. The label
follows the shipped decision rule (confidence floor + lexical prior), so its cost is inside the
classifier's figure. Beside each run: this machine's fp32 matmul rate on one core, measured right
before and right after it (as `vitrine bench encoders` measures it), since on a shared machine
the latency follows what the core gives.
"""

from __future__ import annotations

import time
from typing import Any
from pathlib import Path

import numpy as np

from vitrine_bench.common import Report, summary_ms


RUNTIMES = ("torch", "onnx", "onnx-members")


def run(out: Path, *, n: int = 2000, weights: str = "default", cache_dir: Path | None = None,
        threads: tuple[int | None, ...] = (None, 1), runtimes: tuple[str, ...] = RUNTIMES) -> Path:
    """``runtimes``: torch (at each of ``threads``), onnx (the served stacked graph, one thread),
    onnx-members (the members one by one, one thread)."""
    import torch

    from vitrine.intent.classifier import IntentClassifier
    from vitrine.intent.slots import SlotExtractor
    from vitrine.intent.taxonomy import heldout_leaf_queries
    from vitrine.training.intent import heldout_examples

    from vitrine import onnxrt
    from vitrine_bench.encoders import matmul_flops

    def core_gflops() -> float:
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return round(matmul_flops(1) / 1e9, 1)
        finally:
            torch.set_num_threads(before)

    rep = Report("intent", out, "Vitrine intent classifier latency (CPU, batch 1)")
    t0 = time.perf_counter()
    clf = IntentClassifier.load(weights, cache_dir=cache_dir)
    load_s = time.perf_counter() - t0
    # (runtime, classifier, torch threads): torch at its default and at one thread; onnxruntime at one
    runs: list[tuple[str, Any, int | None]] = [("torch", clf, th) for th in threads] if "torch" in runtimes else []
    if onnxrt.available() and "onnx" in runtimes:
        runs.append(("onnxruntime", IntentClassifier.load(weights, cache_dir=cache_dir, runtime="onnx"), 1))
    if onnxrt.available() and "onnx-members" in runtimes:
        if clf.members:  # the ensemble member by member (the fallback), for comparison
            runs.append(("onnxruntime, members one by one",
                         IntentClassifier.load(weights, cache_dir=cache_dir, runtime="onnx", stack=False), 1))
    cfg = clf.model.config
    test, terms = heldout_examples(seed=int(cfg.get("seed", 0)), per_label=int(cfg.get("test_per_label", 400)),
                                   train_per_label=int(cfg.get("train_per_label", 2500)),
                                   members=int(cfg.get("members", 1)), train_seed=cfg.get("train_seed"),
                                   dropped=cfg.get("heldout_dropped"))
    t1 = time.perf_counter()
    ex = SlotExtractor(terms.vocabulary())
    vocab_s = time.perf_counter() - t1
    queries = [e.text for e in test]
    queries += [q for q, _ in heldout_leaf_queries()]  # product categories of every domain (held out)
    queries += ["women red heels under 1500 " * 80, "👠👠👠🔥", "nike 跑步鞋 under 2000"]
    rng = np.random.default_rng(0)
    sample = [queries[i] for i in rng.integers(0, len(queries), size=n)]
    default_threads = torch.get_num_threads()
    rows = []
    for runtime, clf, th in runs:
        g0 = core_gflops()
        torch.set_num_threads(th or default_threads)
        for q in sample[:100]:  # warm-up
            clf.predict(q)
            ex.extract(q)
        cls_lat, slot_lat, total_lat = [], [], []
        for q in sample:
            a = time.perf_counter()
            clf.predict(q)
            b = time.perf_counter()
            ex.extract(q)
            c = time.perf_counter()
            cls_lat.append(b - a)
            slot_lat.append(c - b)
            total_lat.append(c - a)
        g1 = core_gflops()
        label = f"{runtime}, {th or default_threads} thread(s)" + (" (default)" if th is None else "")
        for stage, lat in (("classifier (tokenize + Qwen2 forward)", cls_lat), ("slots", slot_lat),
                           ("intent + slots", total_lat)):
            rows.append({"run": label, "stage": stage, **summary_ms(lat), "core_GFLOPs_before_after": f"{g0} / {g1}"})
        if th is None:
            rep.add("latencies_ms_default_threads", [x * 1000 for x in total_lat])
        if runtime == "onnxruntime":
            rep.add("latencies_ms_onnxruntime", [x * 1000 for x in total_lat])
    torch.set_num_threads(default_threads)
    rep.add("results", rows)
    rep.add("model", {"parameters": clf.model.n_parameters(), "config": cfg.get("config_name"),
                      "kept_token_ids": len(clf.model.keep_ids), "weights": weights, "load_s": load_s,
                      "slot_vocabulary_build_s": vocab_s, "queries": n})
    rep.text(f"{n} queries drawn from the {len(test)} held-out queries and the held-out Google-taxonomy leaves (plus a 2,000-character query, an "
             f"emoji-only query and a code-mixed one), each classified alone after 100 warm-up queries. "
             f"Model: Qwen2ForSequenceClassification, {clf.model.n_parameters():,} parameters "
             f"({len(clf.model.keep_ids):,} kept token ids); load {load_s:.2f}s. Bar: p99 <= 10 ms.")
    rep.table(rows, ["run", "stage", "p50_ms", "p95_ms", "p99_ms", "mean_ms", "n", "core_GFLOPs_before_after"],
              "Latency per query")
    curves = {"torch, default threads": rep.data["latencies_ms_default_threads"]} \
        if "latencies_ms_default_threads" in rep.data else {}
    if "latencies_ms_onnxruntime" in rep.data:
        curves["onnxruntime, 1 thread"] = rep.data["latencies_ms_onnxruntime"]

    def draw(ax):
        for name, lat in curves.items():
            xs = np.sort(np.array(lat))
            ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=name)
        ax.axvline(10, color="red", linestyle="--", label="10 ms bar")
        ax.set_xlabel("intent + slots latency per query (ms), batch 1")
        ax.set_ylabel("fraction of queries")
        ax.set_xscale("log")
        ax.legend()

    rep.plot("intent_latency_cdf.png", draw)
    for r in rows:
        print(r)
    return rep.write()
