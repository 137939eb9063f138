"""Experiments checked with simulated shoppers (vitrine/evals/simulate.py) through the HTTP API:
an A/B with a truly better variant, an interleaved A/B, and A/A runs, on a copy of a demo data dir.

    python -m vitrine_bench.experiments_sim --data /tmp/simdemo --out bench-results

1. Judged queries: attribute queries of the bundled catalogue (`vitrine make-queries`), their
   relevant products restricted to the data dir's; the head queries are the 20 with the most.
2. Each variant's nDCG@10 on them is measured first (so "truly better" is known, not assumed).
3. A/B: experiment A (as configured) vs B (a deliberately bad ``fusion_weights``), simulated users
   search and click through ``POST /v1/search`` and ``POST /v1/events``; its verdict is read from
   ``GET /v1/experiments/{name}``. The same with ``interleave``.
4. A/A: ``--aa-http`` full runs through HTTP (each a new experiment: new assignment, new shoppers),
   then 100 offline runs that redraw the per-user outcomes logged by the HTTP A/A runs: each run
   samples users with replacement from the pooled per-user rows (searches, clicks, carts, purchases,
   reciprocal ranks as logged) and assigns each to A or B by a fair coin, then applies the same
   analysis (vitrine/experiments/runner.py ``analyse``). Both arms then come from one distribution,
   which is what A/A means; the users' own spread of CTR is kept, since whole users are drawn.
   The offline A/B power uses the logged A and B rows the same way.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import time
from pathlib import Path
from typing import Any

KEY = "bench-key"
BAD = {"fusion_weights": {"graph:season": 1.0, "graph:proximity": 1.0, "native": 0.1}}


def _copy(src: Path, dst: Path) -> Path:
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("events.sqlite*", "learned.json", "experiments*"))
    return dst


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, required=True, help="A demo data dir (copied, never changed)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/vitrine-expsim"))
    ap.add_argument("--out", type=Path, default=Path("bench-results"))
    ap.add_argument("--users", type=int, default=400)
    ap.add_argument("--sessions", type=int, default=40, help="Sessions per head query per run")
    ap.add_argument("--aa-http", type=int, default=5, help="Full A/A runs through HTTP")
    ap.add_argument("--aa-offline", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from fastapi.testclient import TestClient
    from pydantic import SecretStr

    from vitrine.evals import simulate as sim
    from vitrine.evals.catalogue_queries import attribute_queries
    from vitrine.search import variants
    from vitrine.search.engine import Engine
    from vitrine.experiments.models import Experiment, VariantSettings
    from vitrine.experiments.stats import analyse
    from vitrine.settings import Settings
    from vitrine.web.app import create_app

    t_start = time.time()
    data = _copy(args.data, args.work / "data")
    settings = Settings(data_dir=data)
    settings.web.api_key = SecretStr(KEY)
    engine = Engine.open(settings)
    present = set(engine.records.ids())
    rows = attribute_queries(settings.index.graph_dir, settings.index.taxonomy_file, "test", 600, 1)
    for r in rows:
        r["relevant"] = {p: g for p, g in r["relevant"].items() if p in present}
    qs = [q for q in sim.judged_queries(rows) if len(q.relevant) >= 3]
    qs.sort(key=lambda q: (-len(q.relevant), q.qid))
    head = qs[:20]
    report: dict[str, Any] = {"data": str(args.data), "head_queries": [q.text for q in head], "bad_variant": BAD}

    # each variant's quality on the head queries, measured directly (no shopper in the loop)
    ndcg = {}
    for name, vs in (("A", VariantSettings()), ("B", VariantSettings.model_validate(BAD))):
        ov = engine.experiments.override("measure", name, vs)
        with variants.ranking(ov):
            ndcg[name] = sum(sim.ndcg10([h.id for h in engine.search(sim_req(q.text)).results], q) for q in head) / len(head)
    report["ndcg10"] = ndcg

    def run(client: TestClient, name: str, body: dict[str, Any], seed: int, first_user: int) -> tuple[dict, float]:
        r = client.post("/v1/experiments", json={"name": name, **body}, headers={"X-API-Key": KEY})
        assert r.status_code == 201, r.text
        t0 = time.time()
        log = sim.simulate(client, head, args.sessions, key=KEY, seed=seed, first_user=first_user, users=args.users)
        took = time.time() - t0
        rep = client.get(f"/v1/experiments/{name}", headers={"X-API-Key": KEY}).json()
        client.post(f"/v1/experiments/{name}/stop", headers={"X-API-Key": KEY})
        rep["simulated"] = {"searches": log.searches, "clicks": log.clicks, "purchases": log.purchases,
                            "seconds": round(took, 1)}
        return rep, took

    def brief(rep: dict) -> dict:
        out = {"verdict": rep["verdict"], "winner": rep["winner"], "simulated": rep["simulated"]}
        out["variants"] = {v["variant"]: {k: v[k] for k in ("units", "searches", "ctr", "conversion", "mrr")}
                           for v in rep["variants"]}
        if rep.get("interleaving"):
            out["interleaving"] = rep["interleaving"]
        out["comparisons"] = [{k: c[k] for k in ("metric", "difference", "p_value", "significant")}
                              for c in rep["comparisons"]]
        return out

    with TestClient(create_app(engine=engine)) as client:
        ab, _ = run(client, "ab", {"variants": {"A": {}, "B": BAD}, "split": [50, 50]}, args.seed + 1, 0)
        report["ab_http"] = brief(ab)
        il, _ = run(client, "ab-interleaved", {"variants": {"A": {}, "B": BAD}, "interleave": True},
                    args.seed + 2, 100_000)
        report["interleaved_http"] = brief(il)
        aa_runs = []
        aa_units: list[tuple] = []
        for i in range(args.aa_http):
            rep, _ = run(client, f"aa-{i}", {"variants": {"A": {}, "B": {}}}, args.seed + 10 + i, 200_000 + 10_000 * i)
            aa_runs.append(brief(rep))
            aa_units += engine.feedback.log.experiment_units(f"aa-{i}")
        report["aa_http"] = {"runs": len(aa_runs), "not_significant": sum(r["winner"] is None for r in aa_runs),
                             "verdicts": [r["verdict"] for r in aa_runs]}
        ab_units = engine.feedback.log.experiment_units("ab")

    # offline: redraw whole users' logged outcomes
    two = Experiment(name="offline", variants={"A": VariantSettings(), "B": VariantSettings()}, split=[50, 50], created=0.0)
    rng = random.Random(args.seed)
    per_run = max(1, len(aa_units) // max(1, args.aa_http))
    false_pos = []
    for _ in range(args.aa_offline):
        sample = [rng.choice(aa_units) for _ in range(per_run)]
        rows_ = [(rng.choice("AB"), f"r{i}", *row[2:]) for i, row in enumerate(sample)]
        false_pos.append(analyse(two, rows_).winner is not None)
    a_rows = [r for r in ab_units if r[0] == "A"]
    b_rows = [r for r in ab_units if r[0] == "B"]
    found = []
    for _ in range(args.aa_offline):
        rows_ = [("A", f"a{i}", *rng.choice(a_rows)[2:]) for i in range(len(a_rows))] + \
                [("B", f"b{i}", *rng.choice(b_rows)[2:]) for i in range(len(b_rows))]
        found.append(analyse(two, rows_).winner)
    report["aa_offline"] = {"runs": args.aa_offline, "users_per_run": per_run,
                            "not_significant": args.aa_offline - sum(false_pos),
                            "false_positive_rate": sum(false_pos) / args.aa_offline}
    report["ab_offline"] = {"runs": args.aa_offline, "A_found_better": sum(w == "A" for w in found),
                            "B_found_better": sum(w == "B" for w in found), "not_significant": sum(w is None for w in found)}
    report["seconds"] = round(time.time() - t_start, 1)
    report["settings"] = {"users": args.users, "sessions_per_query": args.sessions, "head": len(head)}
    engine.close()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "experiments.json").write_text(json.dumps(report, indent=2))
    print(json.dumps({k: report[k] for k in ("ndcg10", "aa_http", "aa_offline", "ab_offline")}, indent=2))
    print(report["ab_http"]["verdict"], "|", report["interleaved_http"]["verdict"])


def sim_req(text: str):
    from vitrine.search.models import SearchRequest

    return SearchRequest(text=text, k=10)


if __name__ == "__main__":
    main()
