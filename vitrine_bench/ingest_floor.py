"""What bounds a whole ``vitrine ingest`` command from below on this machine:

- **start**: what every ingest pays before its first product, timed stage by stage in fresh
  processes: the interpreter, the imports (torch; transformers; open_clip, which imports torchvision
  and timm; Vitrine's engine) and building the towers and the adapter;
- **the text tower** on a catalogue's texts (tokenized once, sorted by tokens, forwards of 64, as
  ingest runs it) in each numeric form it could run in on a CPU: float32, bf16 autocast (what
  ``VITRINE_BATCH_PRECISION=auto`` runs where bf16 pays), bf16 weights, int8 dynamic quantisation,
  with how far each moves the features from float32's (cosine per text);
- **the whole command** (text-only, cold feature cache, tuning off, as shipped) and the **floor**:
  start + products / the shipped tower's own rate. No ingest of that catalogue on this machine beats
  the floor whatever the rest (gate, stores, indexes, snapshot) costs, so it says whether a
  products/s bar is reachable here with these towers at all.
"""

from __future__ import annotations

import copy
import json
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from vitrine_bench.batch_precision import cosines, ingest_wall
from vitrine_bench.common import Report
from vitrine_bench.encoders import matmul_flops

#: The issue's bar: products/s of a text-only whole command on 2 cores of a 95 GFLOP/s-per-core machine.
BAR_PER_S, BAR_GFLOPS = 500.0, 95.0

_START = r"""
import json, sys, time
t0 = time.perf_counter()
marks = []
def mark(name):
    marks.append([name, time.perf_counter() - t0])
import torch; mark("torch")
import transformers; mark("transformers")
import open_clip; mark("open_clip (torchvision, timm)")
import vitrine.search.engine; mark("vitrine engine")
from vitrine.search.engine import build_encoder
from vitrine.settings import Settings
torch.set_num_threads(int(sys.argv[1]))
build_encoder(Settings()); mark("towers + adapter built")
print(json.dumps(marks))
"""


def start_costs(jobs: int, rounds: int) -> dict[str, Any]:
    """Seconds of each start stage (imports in order, then the model build) in fresh processes:
    the median of ``rounds`` per stage; "interpreter start and exit" is the process's wall time
    outside them (Python's own start, and its exit with the models loaded)."""
    runs: list[dict[str, float]] = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", _START, str(jobs)], capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"start probe failed: {proc.stderr[-2000:]}")
        marks = json.loads(proc.stdout.strip().splitlines()[-1])
        stages, prev = {}, 0.0
        for name, at in marks:
            stages[name] = at - prev
            prev = at
        stages["interpreter start and exit"] = wall - prev
        runs.append(stages)
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    return {"stages": med, "total": sum(med.values()), "runs": runs}


def _variants(text_module: Any) -> dict[str, tuple[Any, bool]]:
    """The text tower's module per numeric form, and whether it runs under bf16 autocast."""
    import torch

    out: dict[str, tuple[Any, bool]] = {
        "float32": (text_module, False),
        "bf16 autocast (shipped)": (text_module, True),
        "bf16 weights": (copy.deepcopy(text_module).to(torch.bfloat16), False),
    }
    with warnings.catch_warnings():  # torch.ao's eager quantisation is deprecated, still shipped
        warnings.simplefilter("ignore")
        try:
            out["int8 dynamic"] = (torch.ao.quantization.quantize_dynamic(
                copy.deepcopy(text_module), {torch.nn.Linear}, dtype=torch.qint8), False)
        except (AttributeError, RuntimeError) as e:  # gone from a later torch, or no int8 engine here
            out["int8 dynamic"] = (e, False)
    return out


def tower_forms(catalogue: Path, *, n_text: int, rounds: int, batch: int = 64, towers: Any = None) -> dict[str, Any]:
    """Texts/s of the text tower per numeric form (median of ``rounds``, forms alternated within
    each round) and the cosines of each form's features with float32's. ``towers``: the served
    towers unless given (they are restored after each form)."""
    import torch

    from vitrine.search.engine import build_encoder
    from vitrine.search.models import Product, product_text
    from vitrine.settings import Settings

    if towers is None:
        towers = build_encoder(Settings()).towers
    recs = [json.loads(x) for x in catalogue.read_text().splitlines() if x.strip()][:n_text]
    texts = [product_text(Product.model_validate({k: v for k, v in r.items() if k != "image"})) for r in recs]
    ids = towers.tokenize(texts)
    if ids is None:
        raise RuntimeError("the text tower has no Hugging Face tokenizer: nothing to sort by tokens")
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    shipped = towers.model.text
    forms = _variants(shipped)
    rates: dict[str, list[float]] = {k: [] for k, (m, _) in forms.items() if not isinstance(m, Exception)}
    feats: dict[str, np.ndarray] = {}

    def encode(module: Any, autocast: bool) -> np.ndarray:
        out = np.zeros((len(ids), towers.text_dim), dtype=np.float32)
        towers.model.text = module
        try:
            for s in range(0, len(order), batch):
                chunk = order[s:s + batch]
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    out[chunk] = towers.text_features_of_tokens([ids[i] for i in chunk]).cpu().numpy()
        finally:
            towers.model.text = shipped
        return out

    skipped = {k: str(m) for k, (m, _) in forms.items() if isinstance(m, Exception)}
    for name in list(rates):  # warm: kernels picked for every shape
        try:
            encode(*forms[name])
        except RuntimeError as e:  # a form this CPU's kernels cannot run (float32 always runs)
            if name == "float32":
                raise
            skipped[name] = str(e)
            del rates[name]
    for _ in range(rounds):
        for name in rates:
            t0 = time.perf_counter()
            feats[name] = encode(*forms[name])
            rates[name].append(len(ids) / (time.perf_counter() - t0))
    rows = []
    for k, v in rates.items():
        cos = cosines(feats["float32"], feats[k])
        rows.append({"form": k, "texts_per_s": statistics.median(v), **{f"cos_{s}": c for s, c in cos.items()}})
    return {"rows": rows, "runs": rates, "skipped": skipped, "n_text": len(ids),
            "mean_tokens": float(np.mean([len(x) for x in ids])), "max_tokens": max(len(x) for x in ids)}


def run(out: Path, *, catalogue: Path, n_text: int = 6482, rounds: int = 3, start_rounds: int = 3,
        ingest_rounds: int = 2, jobs: int = 2) -> Path:
    import torch

    rep = Report("ingest-floor", out, "What bounds a whole `vitrine ingest` command from below")
    flops_before = matmul_flops(1) / 1e9  # (sets torch's threads to one)
    torch.set_num_threads(jobs)
    # the whole command first, while this process holds no model (nothing of it beside the ingest)
    ingests = [ingest_wall(catalogue, "auto", jobs) for _ in range(ingest_rounds)]
    start = start_costs(jobs, start_rounds)
    forms = tower_forms(catalogue, n_text=n_text, rounds=rounds)
    flops_after = matmul_flops(1) / 1e9
    n = sum(1 for line in catalogue.read_text().splitlines() if line.strip())
    gflops = statistics.mean([flops_before, flops_after])
    bar = BAR_PER_S * gflops / BAR_GFLOPS
    shipped = next(r for r in forms["rows"] if r["form"] == "bf16 autocast (shipped)")
    budget = []
    for r in forms["rows"]:
        floor = start["total"] + n / r["texts_per_s"]
        budget.append({"text tower form": r["form"], "start_s": start["total"], "tower_s": n / r["texts_per_s"],
                       "floor_s": floor, "floor_products_per_s": n / floor, "cos_min": r["cos_min"]})
    whole = statistics.median(x["seconds"] for x in ingests) if ingests else None
    rep.add("start", start)
    rep.add("tower_forms", forms)
    rep.add("ingest", ingests)
    rep.add("budget", budget)
    rep.add("bar_products_per_s_here", bar)
    rep.add("gflops_per_core", [flops_before, flops_after])
    rep.text(
        f"Catalogue `{catalogue}`: {n} products, text-only; the towers' texts {forms['mean_tokens']:.1f} tokens on "
        f"average, {forms['max_tokens']} at most ({forms['n_text']} texts for the tower alone). fp32 matmul "
        f"{flops_before:.0f} / {flops_after:.0f} GFLOP/s per core before / after; {jobs} threads. The issue's bar, "
        f"{BAR_PER_S:.0f} products/s at {BAR_GFLOPS:.0f} GFLOP/s per core, scaled to this machine: **{bar:.0f}/s**, "
        f"{n / bar:.1f} s for this catalogue. Command: `vitrine bench ingest-floor --catalog {catalogue}`.")
    rep.table([{"stage": k, "seconds": v} for k, v in start["stages"].items()] + [{"stage": "total",
              "seconds": start["total"]}], ["stage", "seconds"],
              heading=f"Start: before the first product (median of {start_rounds} fresh processes)")
    def five(row: dict[str, Any]) -> dict[str, Any]:  # cosines near 1: five decimals, not the table's three
        return {k: f"{v:.5f}" if k.startswith("cos_") else v for k, v in row.items()}

    rep.table([five(r) for r in forms["rows"]], ["form", "texts_per_s", "cos_min", "cos_p1", "cos_mean"],
              heading=f"The text tower alone per numeric form (median of {rounds} alternated rounds); cosine with "
                      "float32's features of the same text")
    rep.table([five(b) for b in budget], ["text tower form", "start_s", "tower_s", "floor_s", "floor_products_per_s", "cos_min"],
              heading="The floor: start + products / the tower's rate (everything else free)")
    if ingests:
        tower_s = n / shipped["texts_per_s"]
        rep.table(ingests, ["precision", "products", "seconds", "products_per_s"],
                  heading="`vitrine ingest` as shipped: whole command, cold cache, tuning off")
        rep.table([{"whole_s": whole, "start_s": start["total"], "tower_s": tower_s,
                    "rest_s": whole - start["total"] - tower_s}], ["whole_s", "start_s", "tower_s", "rest_s"],
                  heading="Where the whole command's median goes (the tower at its rate alone; the rest: gate, "
                          "stores, indexes, snapshot, and the tower's slowdown beside them)")
    if forms["skipped"]:
        rep.text("Forms not measured: " + "; ".join(f"{k}: {v}" for k, v in forms["skipped"].items()))

    def draw(ax: Any) -> None:
        labels = [b["text tower form"] for b in budget]
        ax.barh(labels, [b["start_s"] for b in budget], label="start (imports, model build)", color="#bbbbbb")
        ax.barh(labels, [b["tower_s"] for b in budget], left=[b["start_s"] for b in budget], label="text tower")
        if whole is not None:
            ax.axvline(whole, color="black", label=f"whole command as shipped ({n / whole:.0f}/s)")
        ax.axvline(n / bar, color="red", linestyle="--", label=f"bar here: {bar:.0f} products/s")
        ax.set_xlabel(f"seconds to ingest {n} products (floor: everything else free)")
        ax.set_title("What bounds a text-only ingest")
        ax.legend(fontsize=8, loc="lower right")

    rep.plot("ingest-floor.png", draw)
    return rep.write()
