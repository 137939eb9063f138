"""Where a batch ingest's time goes, stage by stage, beside the towers' own throughput measured
in the same run (the ratio products/s over tower items/s travels between machines).

Two catalogues from the bundled one: text-only (its records without ``image``) and with photos.
Each is ingested into an empty data dir with an empty feature cache through the same code as
``vitrine ingest`` (``ingest_file``); every stage's function is wrapped with a timer that counts
*exclusive* time (a stage called inside another, e.g. the text tower inside the taxonomy mapper,
is taken out of its caller's figure), so the stage rows add up to the covered wall time.
Photo reads run in a thread pool beside the main thread: their row is thread time, not wall.

Runs as ``vitrine bench ingest-profile`` or ``python -m vitrine_bench.ingest_profile`` (the latter
also against an older checkout: ``PYTHONPATH=OLD python -m vitrine_bench.ingest_profile``).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from vitrine_bench.common import Report

STAGE_ORDER = ["parse", "photo read (threads)", "upsert prep (lookups, hashes)", "product texts",
               "feature cache", "tokenize", "text tower", "photo decode+letterbox", "photo tower", "gate (adapter)",
               "native vectors", "photo store", "SQLite writes", "FTS5", "graph + taxonomy mapping",
               "taxonomy mapper", "FAISS", "filters", "snapshot", "other"]


TOWER_STAGES = ("tokenize", "text tower", "photo decode+letterbox", "photo tower")


class StageTimer:
    """Exclusive wall time per stage on the main thread; thread time for calls from other threads."""

    def __init__(self) -> None:
        self.excl: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.main = threading.get_ident()
        self._stack: list[list[Any]] = []  # [stage, start, child time]
        self._undo: list[Callable[[], None]] = []

    def wrap(self, owner: Any, name: str, stage: str) -> None:
        orig = getattr(owner, name)
        timer = self

        @functools.wraps(orig)
        def timed(*a: Any, **kw: Any) -> Any:
            if threading.get_ident() != timer.main:
                t0 = time.perf_counter()
                try:
                    return orig(*a, **kw)
                finally:
                    timer.excl[stage] += time.perf_counter() - t0
                    timer.calls[stage] += 1
            frame: list[Any] = [stage, time.perf_counter(), 0.0]  # stage, start, time in nested stages
            timer._stack.append(frame)
            try:
                return orig(*a, **kw)
            finally:
                timer._stack.pop()
                took = time.perf_counter() - frame[1]
                timer.excl[stage] += took - frame[2]
                timer.calls[stage] += 1
                if timer._stack:
                    timer._stack[-1][2] += took

        setattr(owner, name, timed)
        self._undo.append(lambda: setattr(owner, name, orig))

    def wrap_iter(self, it: Iterator[Any], stage: str) -> Iterator[Any]:
        while True:
            t0 = time.perf_counter()
            try:
                x = next(it)
            except StopIteration:
                self.excl[stage] += time.perf_counter() - t0
                return
            self.excl[stage] += time.perf_counter() - t0
            yield x

    def undo(self) -> None:
        for u in reversed(self._undo):
            u()
        self._undo.clear()


class _Tok:
    """A tokenizer whose calls are timed (the text tower's own row excludes tokenizing)."""

    def __init__(self, tok: Any, timer: StageTimer) -> None:
        self._tok, self._timer = tok, timer
        self._timer.wrap(self, "_call", "tokenize")

    def _call(self, *a: Any, **kw: Any) -> Any:
        return self._tok(*a, **kw)

    def __call__(self, *a: Any, **kw: Any) -> Any:
        return self._call(*a, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tok, name)


def instrument(engine: Any, timer: StageTimer) -> Callable[[], None]:
    """Wrap every ingest stage of ``engine``'s write path; returns the undo."""
    from vitrine.encoders.feature_cache import FeatureCache
    from vitrine.index import records as rec_mod
    from vitrine.index.filters import FilterIndex
    from vitrine.index.graph import ProductGraph
    from vitrine.index.taxonomy_map import TaxonomyMapper
    from vitrine.index.vectors import VectorIndex
    from vitrine.ingest.catalog import PhotoResolver
    from vitrine.search import native, writes
    from vitrine.search.models import Product

    st = engine.index
    enc = st.encoder
    towers = enc.towers
    timer.wrap(PhotoResolver, "resolve", "photo read (threads)")
    timer.wrap(st.records, "get_many", "upsert prep (lookups, hashes)")
    timer.wrap(Product, "content_hash", "upsert prep (lookups, hashes)")
    timer.wrap(writes, "product_text", "product texts")
    timer.wrap(FeatureCache, "get_many", "feature cache")
    timer.wrap(FeatureCache, "put_many", "feature cache")
    if towers.hf_tokenizer is not None:
        tok = towers.hf_tokenizer
        towers.hf_tokenizer = _Tok(tok, timer)
        timer._undo.append(lambda: setattr(towers, "hf_tokenizer", tok))
    timer.wrap(towers, "text_features", "text tower")
    if hasattr(towers, "text_features_of_tokens"):
        timer.wrap(towers, "text_features_of_tokens", "text tower")
    timer.wrap(enc, "decode", "photo decode+letterbox")
    timer.wrap(towers, "preprocess", "photo decode+letterbox")
    timer.wrap(towers, "image_features", "photo tower")
    timer.wrap(enc, "embed", "gate (adapter)")
    timer.wrap(native, "unit_rows", "native vectors")
    timer.wrap(native.NativeSpace, "apply", "native vectors")
    timer.wrap(st.images, "put_many", "photo store")
    timer.wrap(st.records, "upsert_many", "SQLite writes")
    timer.wrap(rec_mod.symbolic, "write", "FTS5")
    timer.wrap(ProductGraph, "upsert_many", "graph + taxonomy mapping")
    timer.wrap(TaxonomyMapper, "map_paths", "taxonomy mapper")
    timer.wrap(VectorIndex, "upsert", "FAISS")
    timer.wrap(FilterIndex, "upsert", "filters")
    timer.wrap(st, "save", "snapshot")
    return timer.undo


def make_catalogues(source: Path, n_text: int, n_photo: int) -> tuple[Path, Path]:
    """Two JSONL files beside the bundled photos (ingest reads photos only from the file's folder)."""
    from vitrine.ingest.fashion import convert, demo_subset

    ids = demo_subset(source, max(n_text, n_photo))
    photo = source / f"catalog-profile-photo-{n_photo}.jsonl"
    text = source / f"catalog-profile-text-{n_text}.jsonl"
    convert(source, photo, ids[:n_photo])
    full = source / f"catalog-profile-all-{len(ids)}.jsonl"
    convert(source, full, ids)
    with open(full, encoding="utf-8") as f, open(text, "w", encoding="utf-8") as out:
        for k, line in enumerate(f):
            if k >= n_text:
                break
            rec = json.loads(line)
            rec.pop("image", None)
            out.write(json.dumps(rec) + "\n")
    full.unlink()
    return text, photo


def tower_throughput(catalogue: Path, *, photos: bool, n: int = 512) -> dict[str, float]:
    """The towers alone on this catalogue's items: texts/s (sorted by token length, forwards of 64 as
    ingest runs them; and of 256, as it did) and photos/s (decoded and letterboxed beforehand; and
    with that work)."""
    import numpy as np
    import torch

    from vitrine.encoders.encoder import MultimodalEncoder
    from vitrine.encoders.precision import batch_autocast
    from vitrine.search.models import Product, product_text

    enc = MultimodalEncoder.create(features_only=True)
    towers = enc.towers
    recs = [json.loads(x) for x in catalogue.read_text().splitlines()[:n]]
    texts = [product_text(Product.model_validate({k: v for k, v in r.items() if k != "image"})) for r in recs]
    out: dict[str, float] = {}
    tok = towers.hf_tokenizer
    lens = [len(x) for x in tok(texts, truncation=True, max_length=towers.context_length)["input_ids"]]
    order = np.argsort(lens, kind="stable")
    s_texts = [texts[i] for i in order]
    # the ingest's own text precision (Settings.encoders.batch_precision, auto by default)
    autocast = batch_autocast(enc.batch_precision, towers.device.type)
    with torch.inference_mode(), autocast:
        towers.text_features(s_texts[:64])
        for key, bs in (("texts_per_s", 64), ("texts_per_s_b256", 256)):  # 64: what ingest runs now
            durs = []
            for _ in range(2):
                t0 = time.perf_counter()
                for s in range(0, len(s_texts), bs):
                    towers.text_features(s_texts[s:s + bs])
                durs.append(time.perf_counter() - t0)
            out[key] = len(texts) / min(durs)
        t0 = time.perf_counter()
        for s in range(0, len(texts), 64):  # catalogue order, batches of 64: padded to each batch's longest
            towers.text_features(texts[s:s + 64])
        out["texts_per_s_unsorted_b64"] = len(texts) / (time.perf_counter() - t0)
        out["tokens_mean"] = float(np.mean(lens))
        out["tokens_max"] = float(np.max(lens))
        if photos:
            root = catalogue.parent
            blobs = [(root / r["image"]).read_bytes() for r in recs[:256]]
            t0 = time.perf_counter()
            pixels = torch.stack([towers.preprocess(enc.decode(b)) for b in blobs])
            prep = time.perf_counter() - t0
            enc.pixel_features(pixels[:8])
            t0 = time.perf_counter()
            enc.pixel_features(pixels)
            tower = time.perf_counter() - t0
            out["photos_per_s_tower"] = len(blobs) / tower
            out["photos_per_s_with_decode"] = len(blobs) / (tower + prep)
    return out


def batching_ab(catalogue: Path, *, n: int = 768, rounds: int = 5) -> dict[str, Any]:
    """The text tower's batching, old and new, in turn in one process (a noisy neighbour slows
    both alike): forwards of 256 sorted by characters (before) vs of 64 sorted by tokens (now),
    and catalogue order in forwards of 64 (no sort). Median texts/s of each over ``rounds``."""
    import torch

    from vitrine.encoders.encoder import MultimodalEncoder
    from vitrine.search.models import Product, product_text

    towers = MultimodalEncoder.create(features_only=True).towers
    recs = [json.loads(x) for x in catalogue.read_text().splitlines()[:n]]
    texts = [product_text(Product.model_validate({k: v for k, v in r.items() if k != "image"})) for r in recs]
    n = len(texts)
    lengths = towers.token_lengths(texts) if hasattr(towers, "token_lengths") else None
    ways: dict[str, list[list[str]]] = {
        "catalogue order, 64": [texts[s:s + 64] for s in range(0, n, 64)],
        "by characters, 256 (before)": (lambda o: [o[s:s + 256] for s in range(0, n, 256)])(sorted(texts, key=len)),
    }
    if lengths is not None:
        by_tok = [t for _, _, t in sorted(zip(lengths, range(n), texts))]
        ways["by tokens, 64 (now)"] = [by_tok[s:s + 64] for s in range(0, n, 64)]
    rates: dict[str, list[float]] = {k: [] for k in ways}
    with torch.inference_mode():
        towers.text_features(texts[:64])
        for _ in range(rounds):
            for name, batches in ways.items():
                t0 = time.perf_counter()
                for b in batches:
                    towers.text_features(b)
                rates[name].append(n / (time.perf_counter() - t0))
    return {k: {"median": statistics.median(v), "runs": v} for k, v in rates.items()}


def profile_ingest(catalogue: Path, *, batch_size: int = 512) -> dict[str, Any]:
    """Ingest ``catalogue`` into an empty data dir (cold feature cache, no tuning), every stage timed
    (at the caller's torch thread count: what ``vitrine ingest --jobs N`` sets)."""
    from vitrine.ingest import catalog
    from vitrine.search.engine import Engine
    from vitrine.settings import Settings

    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(data_dir=Path(tmp) / "data", cache_dir=Path(tmp) / "cache", _env_file=None)
        t0 = time.perf_counter()
        engine = Engine.open(settings)
        t_open = time.perf_counter() - t0
        timer = StageTimer()
        undo = instrument(engine, timer)
        orig_read = catalog.read_catalog
        catalog.read_catalog = lambda p: timer.wrap_iter(orig_read(p), "parse")  # type: ignore[assignment]  # a timing wrapper
        try:
            t1, cpu1 = time.perf_counter(), _cpu_s()
            report = catalog.ingest_file(engine, catalogue, batch_size=batch_size, progress=False)
            wall, cpu = time.perf_counter() - t1, _cpu_s() - cpu1
        finally:
            catalog.read_catalog = orig_read
            undo()
            engine.close()
    stages = {k: v for k, v in timer.excl.items()}
    covered = sum(v for k, v in stages.items() if k != "photo read (threads)")
    stages["other"] = max(0.0, wall - covered)
    return {"products": report.upserted, "failed": len(report.failed), "wall_s": wall, "open_s": t_open,
            "cpu_s": cpu, "cpu_ms_per_product": cpu / max(1, report.upserted) * 1000,
            "products_per_s": report.upserted / wall, "stages_s": stages, "calls": dict(timer.calls)}


def _cpu_s() -> float:
    """CPU seconds (user + system) of this process, all threads: on a shared machine a build's
    work per product, less swayed than wall time by what other tenants run."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def gflops() -> dict[str, float]:
    from vitrine_bench.encoders import matmul_flops

    return {"gflops_1_thread": matmul_flops(1) / 1e9, "gflops_all_threads": matmul_flops(os.cpu_count() or 1) / 1e9}


def run(out: Path, *, source: Path, n_text: int = 4000, n_photo: int = 1000, repeats: int = 1,
        label: str = "", jobs: int | None = None) -> Path:
    import torch

    threads = jobs or torch.get_num_threads()  # --jobs N: the encoders' torch threads
    torch.set_num_threads(threads)
    text_cat, photo_cat = make_catalogues(source, n_text, n_photo)
    name = "ingest-profile" + (f"-{label}" if label else "")
    rep = Report(name, out, "Vitrine ingest, stage by stage" + (f" ({label})" if label else ""))
    rep.add("load_before", os.getloadavg())
    flops_before = gflops()
    torch.set_num_threads(threads)
    runs: dict[str, list[dict[str, Any]]] = {"text-only": [], "photos": []}
    towers: dict[str, list[dict[str, float]]] = {"text-only": [], "photos": []}
    try:
        for _ in range(repeats):
            for kind, cat in (("text-only", text_cat), ("photos", photo_cat)):
                towers[kind].append(tower_throughput(cat, photos=kind == "photos"))
                torch.set_num_threads(threads)
                runs[kind].append(profile_ingest(cat))
                torch.set_num_threads(threads)
        ab = batching_ab(text_cat)
        torch.set_num_threads(threads)
        rep.add("text_batching", ab)
    finally:
        text_cat.unlink(missing_ok=True)
        photo_cat.unlink(missing_ok=True)
    flops_after = gflops()
    rep.add("gflops", {"before": flops_before, "after": flops_after})
    rep.add("load_after", os.getloadavg())
    rep.add("runs", runs)
    rep.add("towers", towers)
    rep.add("jobs", jobs)
    rep.text(f"fp32 matmul GFLOP/s on this machine: one thread {flops_before['gflops_1_thread']:.1f} before / "
             f"{flops_after['gflops_1_thread']:.1f} after; all {os.cpu_count()} threads "
             f"{flops_before['gflops_all_threads']:.1f} / {flops_after['gflops_all_threads']:.1f}. "
             f"Load average before {rep.data['load_before'][0]:.1f}, after {rep.data['load_after'][0]:.1f}. "
             f"torch threads {threads}, ingest --jobs {jobs if jobs is not None else 'default'}.")
    rep.table([{"text batching": k, "texts_per_s_median": v["median"],
                "range": f"{min(v['runs']):.0f}-{max(v['runs']):.0f}"} for k, v in ab.items()],
              ["text batching", "texts_per_s_median", "range"],
              "The text tower's batching in turn in one process (768 titles of the text-only catalogue)")
    summary = []
    for kind in runs:
        for r, t in zip(runs[kind], towers[kind]):
            ref = t["photos_per_s_with_decode"] if kind == "photos" else t["texts_per_s"]
            # a product with a photo needs both towers: their serial rate is the ceiling
            both = 1 / (1 / t["photos_per_s_with_decode"] + 1 / t["texts_per_s"]) if kind == "photos" else ref
            summary.append({"catalogue": kind, "products": r["products"], "wall_s": r["wall_s"],
                            "products_per_s": r["products_per_s"], "cpu_ms_per_product": r.get("cpu_ms_per_product"),
                            "tower_items_per_s": ref,
                            "ratio": r["products_per_s"] / ref, "both_towers_per_s": both,
                            "ratio_both": r["products_per_s"] / both,
                            # the same question asked inside the run (robust to a noisy neighbour):
                            # the share of the ingest's wall time spent in the towers themselves
                            "towers_share_in_run": sum(r["stages_s"].get(k, 0.0) for k in TOWER_STAGES) / r["wall_s"],
                            "texts_per_s_sorted": t["texts_per_s"],
                            "texts_per_s_unsorted_b64": t["texts_per_s_unsorted_b64"],
                            "photos_per_s_tower": t.get("photos_per_s_tower", float("nan"))})
    rep.add("summary", summary)
    rep.table(summary, list(summary[0]), "Products/s against the towers' own throughput (same run)")
    for kind in runs:
        rows = []
        for st in STAGE_ORDER:
            vals = [r["stages_s"].get(st, 0.0) for r in runs[kind]]
            if not any(vals):
                continue
            med = statistics.median(vals)
            wall = statistics.median(r["wall_s"] for r in runs[kind])
            rows.append({"stage": st, "seconds": med, "share": med / wall,
                         "ms_per_product": med / max(1, runs[kind][0]["products"]) * 1000,
                         "calls": runs[kind][0]["calls"].get(st, "")})
        rep.table(rows, ["stage", "seconds", "share", "ms_per_product", "calls"],
                  f"{kind}: stages (median of {len(runs[kind])} run(s), exclusive time)")
    print(json.dumps(summary, indent=1))
    return rep.write()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=Path("bench-results"))
    ap.add_argument("--n-text", type=int, default=4000)
    ap.add_argument("--n-photo", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--label", default="")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--source", type=Path, default=None, help="the bundled catalogue's folder (default: found)")
    a = ap.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from vitrine.bundled import bundled_dir

    print(run(a.out, source=a.source or bundled_dir(), n_text=a.n_text, n_photo=a.n_photo, repeats=a.repeats,
              label=a.label, jobs=a.jobs))


if __name__ == "__main__":
    main()
