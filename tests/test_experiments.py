"""A/B experiments (vitrine/experiments/runner.py) through the HTTP API and the CLI: start, sticky
assignment, split and staged rollout, stop, the variant in the response and in the logged row,
per-search ranking overrides under concurrency, interleaving; the statistics on synthetic data
with a known answer (coverage of the intervals, A/A and A/B verdicts, delta method vs bootstrap)."""

from __future__ import annotations

import contextlib
import json
import random
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import engine_and_client

KEY = {"X-API-Key": "s3cret"}
BM25_ONLY = {"fusion_weights": {"bm25": 1.0}}


# -- statistics on synthetic data with a known answer ------------------------------------------------
def synthetic_units(rng, variant, users, ctr, conv_of_click=0.2, spread=20.0):
    """Per-user rows (variant, unit, searches, clicked, carted, bought, rr): each user has a click
    propensity drawn from Beta around ``ctr`` (users differ: searches of one user are correlated)."""
    rows = []
    for u in range(users):
        p = rng.betavariate(ctr * spread, (1 - ctr) * spread)
        n = 1 + int(rng.expovariate(1 / 4))
        c = a = b = 0
        rr = 0.0
        for _ in range(n):
            if rng.random() < p:
                c += 1
                rr += 1 / (1 + min(int(rng.expovariate(1 / 2)), 9))
                if rng.random() < conv_of_click:
                    a += 1
                    b += rng.random() < 0.5
        rows.append((variant, f"{variant}-{u}", n, c, a, b, rr))
    return rows


def _exp(names=("A", "B"), interleave=False):
    from vitrine.experiments.models import Experiment, VariantSettings

    return Experiment(name="t", variants={n: VariantSettings() for n in names}, split=[100 / len(names)] * len(names),
                      created=0.0, interleave=interleave)


def test_intervals_cover_the_truth_and_the_verdicts_are_right():
    from vitrine.experiments.stats import analyse, ratio_delta

    rng = random.Random(0)
    covered = aa_false = ab_found = 0
    runs = 200
    for _ in range(runs):
        a = synthetic_units(rng, "A", 300, 0.30)
        b = synthetic_units(rng, "B", 300, 0.30)
        rep = analyse(_exp(), a + b)
        aa_false += rep.winner is not None
        # the truth of a ratio metric: the population's clicks / searches, by a large sample
        ctr = rep.variants[0].ctr
        covered += ctr.low <= 0.30 <= ctr.high
        rep = analyse(_exp(), a + synthetic_units(rng, "B", 300, 0.38))
        ab_found += rep.winner == "B"
    assert covered / runs >= 0.90  # 95% intervals (the Beta mean is the truth only approximately)
    assert aa_false / runs <= 0.06  # Holm over three metrics: at most alpha = 5%
    # +8 points of CTR on 300 users a side: an always-valid (sequential) test, readable at any look,
    # pays for it in power at one fixed size (the fixed-horizon z-test found ~0.8 of these);
    # tests/test_trust_experiments.py checks a larger effect's power and A/A under ten looks
    assert ab_found / runs >= 0.5
    # the delta method's standard error agrees with a per-user (cluster) bootstrap
    rows = synthetic_units(random.Random(5), "A", 400, 0.25)
    n, x = [r[2] for r in rows], [r[3] for r in rows]
    r, se = ratio_delta(x, n)
    boot = []
    rb = random.Random(1)
    for _ in range(1000):
        idx = [rb.randrange(len(rows)) for _ in rows]
        boot.append(sum(x[i] for i in idx) / sum(n[i] for i in idx))
    mu = sum(boot) / len(boot)
    se_boot = (sum((v - mu) ** 2 for v in boot) / (len(boot) - 1)) ** 0.5
    assert abs(se - se_boot) / se_boot < 0.15, (se, se_boot)
    # a per-search interval would be too narrow: searches of one user are correlated
    p = sum(x) / sum(n)
    assert (p * (1 - p) / sum(n)) ** 0.5 < 0.9 * se


def test_verdict_needs_enough_users_and_names_the_winner_and_loser():
    from vitrine.experiments.stats import analyse

    rng = random.Random(2)
    few = analyse(_exp(), synthetic_units(rng, "A", 10, 0.2) + synthetic_units(rng, "B", 10, 0.6))
    assert few.winner is None and "too few users" in few.verdict
    worse = analyse(_exp(), synthetic_units(rng, "A", 500, 0.4) + synthetic_units(rng, "B", 500, 0.2))
    assert worse.winner == "A" and worse.verdict.startswith("A wins over B")
    cmp = {c.metric: c for c in worse.comparisons}
    assert cmp["ctr"].difference.high < 0 and cmp["ctr"].significant


def test_team_draft_and_the_sign_test():
    from vitrine.experiments.stats import interleaving, sign_test
    from vitrine.experiments.runner import team_draft

    rng = random.Random(3)
    for _ in range(200):
        a = rng.sample(range(30), 10)
        b = rng.sample(range(30), 10)
        merged, teams = team_draft([str(x) for x in a], [str(x) for x in b], 10, rng)
        assert len(merged) == len(set(merged)) == 10
        na = sum(t == "A" for t in teams.values())
        assert abs(na - (10 - na)) <= 1  # teams stay balanced
        for p in merged:  # every product comes from its team's list
            assert int(p) in (a if teams[p] == "A" else b)
    same, teams = team_draft(list("abcdef"), list("abcdef"), 6, rng)
    assert same == list("abcdef")  # identical rankings interleave to themselves
    assert sign_test(50, 50) == pytest.approx(1.0) and sign_test(0, 10) == pytest.approx(2 / 1024)
    clicks = [("q1", json.dumps({"x": "A", "y": "B"}), "y"), ("q2", json.dumps({"x": "A", "y": "B"}), "x"),
              ("q2", json.dumps({"x": "A", "y": "B"}), "y"), ("q3", json.dumps({"x": "B"}), "x")]
    rep = interleaving(["A", "B"], clicks)
    assert rep.wins == {"A": 0, "B": 2} and rep.ties == 1 and rep.searches == 3


def test_assignment_is_sticky_and_widening_only_moves_users_into_the_new_variant():
    from vitrine.experiments.runner import pick, point

    users = [f"u:{i}" for i in range(5000)]
    at5 = {u: pick([95, 5], point("exp", u)) for u in users}
    at50 = {u: pick([50, 50], point("exp", u)) for u in users}
    assert all(at50[u] == 1 for u in users if at5[u] == 1)  # B's users stay in B
    assert 0.035 < sum(at5.values()) / len(users) < 0.065 and 0.47 < sum(at50.values()) / len(users) < 0.53
    assert {u: pick([95, 5], point("exp", u)) for u in users} == at5  # sticky
    other = {u: pick([95, 5], point("exp2", u)) for u in users}
    assert other != at5  # each experiment its own draw


# -- through the HTTP API -------------------------------------------------------------------------
own_engine, client = engine_and_client("experiments", engine_name="own_engine", api_key="s3cret")


def search(client, text="blue shirt", **kw):
    r = client.post("/v1/search", json={"text": text, "k": 10, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def ids(res):
    return [h["id"] for h in res["results"]]


def test_an_experiment_over_the_api(client, own_engine):
    body = {"name": "bm25", "variants": {"A": {}, "B": BM25_ONLY}, "split": [50, 50]}
    assert client.post("/v1/experiments", json=body).status_code == 401
    base = ids(search(client, "casual shoes"))  # no experiment: as configured
    r = client.post("/v1/experiments", json=body, headers=KEY)
    assert r.status_code == 201, r.text
    assert r.json()["split"] == [50, 50] and r.json()["status"] == "running"
    assert client.post("/v1/experiments", json={**body, "name": "other"}, headers=KEY).status_code == 422  # one runs
    assert client.post("/v1/experiments", json=body, headers=KEY).status_code == 422  # name taken
    bad = {"name": "bad", "variants": {"A": {}, "B": {"calibration": "sometimes"}}}
    assert client.post("/v1/experiments", json=bad, headers=KEY).status_code == 422

    got = {}
    for u in range(40):
        res = search(client, "casual shoes", user=f"user-{u}")
        got[f"user-{u}"] = res["variant"]
        assert res["variant"] in ("A", "B") and res["query_id"]
        again = search(client, "casual shoes", user=f"user-{u}")
        assert again["variant"] == res["variant"] and ids(again) == ids(res)  # sticky
        if res["variant"] == "A":
            assert ids(res) == base  # the control ranks as configured
    assert 8 <= sum(v == "B" for v in got.values()) <= 32
    b_user = next(u for u, v in got.items() if v == "B")
    assert ids(search(client, "casual shoes", user=b_user)) != base  # BM25 alone ranks otherwise
    no_user = search(client, "casual shoes")
    assert "variant" not in no_user and ids(no_user) == base  # not in the experiment
    assert search(client, "casual shoes", session="sess-1")["variant"] in ("A", "B")  # by session

    # concurrent searches in both variants and in none never see another's ranking
    expect = {u: ids(search(client, "red dress", user=u)) for u in ("user-0", b_user)}
    expect[None] = ids(search(client, "red dress"))

    def one(u):
        return u, ids(search(client, "red dress", **({"user": u} if u else {})))

    with ThreadPoolExecutor(6) as pool:
        for u, got_ids in pool.map(one, [*expect] * 8):
            assert got_ids == expect[u]
    assert expect[b_user] != expect[None]

    # the logged rows carry experiment and variant; events are attributed
    log = own_engine.feedback.log
    rows = [s for s in log.read().searches if s.experiment == "bm25"]
    assert rows and all(s.variant in ("A", "B") for s in rows)
    assert {s.variant for s in rows if s.user == log.hash_user(b_user)} == {"B"}
    clicked = []
    for u in list(got)[:30]:
        res = search(client, "watch", user=u)
        if res["variant"] == "B" or u.endswith(("1", "3")):
            ev = {"type": "click", "query_id": res["query_id"], "product_id": res["results"][1]["id"], "position": 1}
            assert client.post("/v1/events", json={"events": [ev]}, headers=KEY).status_code == 202
            clicked.append(res["query_id"])
    rep = client.get("/v1/experiments/bm25", headers=KEY)
    assert rep.status_code == 200, rep.text
    rep = rep.json()
    per = {v["variant"]: v for v in rep["variants"]}
    # brute force over the raw rows: searches, units, clicked searches, MRR per variant
    raw = log.read()
    mine = [s for s in raw.searches if s.experiment == "bm25"]
    clicks = {e.query_id: e.position for e in raw.events if e.type == "click"}
    for v in ("A", "B"):
        ss = [s for s in mine if s.variant == v]
        units = {s.user or "session:" + s.session for s in ss}
        assert per[v]["searches"] == len(ss) and per[v]["units"] == len(units)
        assert per[v]["clicked"] == sum(s.query_id in clicks for s in ss)
        mrr = sum(1 / (1 + clicks[s.query_id]) for s in ss if s.query_id in clicks) / len(ss)
        assert per[v]["mrr"]["value"] == pytest.approx(mrr, abs=1e-6)
        assert per[v]["ctr"]["low"] <= per[v]["ctr"]["value"] <= per[v]["ctr"]["high"]
    assert per["B"]["clicked"] > 0 and rep["verdict"] and "delta method" in rep["method"]
    assert client.get("/v1/experiments/nope", headers=KEY).status_code == 404

    # staged rollout: 100/0 -> everyone in A; widen to 0/100 -> everyone in B; then stop
    r = client.patch("/v1/experiments/bm25/split", json={"split": [100, 0]}, headers=KEY)
    assert r.status_code == 200 and r.json()["split"] == [100, 0]
    assert {search(client, user=u)["variant"] for u in list(got)[:10]} == {"A"}
    r = client.post("/v1/experiments/bm25/split", json={"split": [0, 100]}, headers=KEY)
    assert r.status_code == 200 and len(r.json()["history"]) == 3
    assert {search(client, user=u)["variant"] for u in list(got)[:10]} == {"B"}
    assert client.patch("/v1/experiments/bm25/split", json={"split": [1, 2, 3]}, headers=KEY).status_code == 422
    r = client.post("/v1/experiments/bm25/stop", headers=KEY)
    assert r.status_code == 200 and r.json()["status"] == "stopped"
    res = search(client, "casual shoes", user=b_user)
    assert "variant" not in res and ids(res) == base
    names = [e["name"] for e in client.get("/v1/experiments", headers=KEY).json()]
    assert names == ["bm25"]


def test_a_replica_sees_a_start_and_a_stop_within_a_second(own_engine):
    from vitrine.feedback.eventlog import EventLog
    from vitrine.experiments.models import ExperimentCreate, VariantSettings
    from vitrine.experiments.runner import Experiments
    from vitrine.search.models import SearchRequest

    other = EventLog(own_engine.data_dir / "events.sqlite")  # another worker's connection to the same log
    try:
        replica = Experiments(other, own_engine.data_dir)
        req = SearchRequest(text="x", user="someone")
        assert replica.assign(req) is None
        own_engine.experiments.start(ExperimentCreate(name="replica-check", variants={
            "A": VariantSettings(), "B": VariantSettings(calibration="floor")}))
        t0 = time.monotonic()
        while replica.assign(req) is None:
            assert time.monotonic() - t0 < 1.5
            time.sleep(0.05)
        own_engine.experiments.stop("replica-check")
        t0 = time.monotonic()
        while replica.assign(req) is not None:
            assert time.monotonic() - t0 < 1.5
            time.sleep(0.05)
    finally:
        other.close()


def test_interleaving_credits_clicks_to_teams(client, own_engine):
    body = {"name": "inter", "variants": {"A": {}, "B": BM25_ONLY}, "interleave": True}
    assert client.post("/v1/experiments", json=body, headers=KEY).status_code == 201
    for u in range(30):
        res = search(client, "casual shoes", user=f"i-{u}")
        assert res["variant"] == "interleaved" and len(res["results"]) == 10
        # click the first product of team B: B should win every decided search
        pos, pid = next((i, h["id"]) for i, h in enumerate(res["results"])
                        if _team_of(own_engine, res["query_id"], h["id"]) == "B")
        ev = {"type": "click", "query_id": res["query_id"], "product_id": pid, "position": pos}
        assert client.post("/v1/events", json={"events": [ev]}, headers=KEY).status_code == 202
    rep = client.get("/v1/experiments/inter", headers=KEY).json()
    assert rep["interleaving"]["wins"] == {"A": 0, "B": 30} and rep["interleaving"]["p_value"] < 1e-6
    assert rep["winner"] == "B" and rep["verdict"].startswith("B wins")
    assert client.patch("/v1/experiments/inter/split", json={"split": [50, 50]}, headers=KEY).status_code == 422
    assert client.post("/v1/experiments/inter/stop", headers=KEY).status_code == 200


def _team_of(engine, query_id, pid):
    with contextlib.closing(sqlite3.connect(engine.feedback.log.path)) as conn:  # a test reads the table directly
        row = conn.execute("SELECT teams FROM experiment_teams WHERE query_id=?", (query_id,)).fetchone()
    return json.loads(row[0]).get(pid) if row else None


# -- the CLI and PostgreSQL ---------------------------------------------------------------------------
def test_cli_start_split_status_stop(tmp_path):
    from click.testing import CliRunner

    from vitrine.cli.app import main

    d = str(tmp_path / "data")
    run = CliRunner().invoke
    out = run(main, ["experiment", "start", "--data", d, "--name", "cli", "--variant", "A=",
                     "--variant", 'B=fusion_weights={"native": 1, "bm25": 0.3},learn_weight=0', "--split", "95,5"])
    assert out.exit_code == 0, out.output
    assert "A 95%, B 5%" in out.output and '"learn_weight": 0.0' in out.output
    out = run(main, ["experiment", "split", "--data", d, "--name", "cli", "--split", "50,50"])
    assert out.exit_code == 0 and "A 50%, B 50%" in out.output
    out = run(main, ["experiment", "status", "--data", d, "--name", "cli", "--json"])
    assert out.exit_code == 0 and json.loads(out.output)["verdict"].startswith("not yet significant")
    out = run(main, ["experiment", "stop", "--data", d, "--name", "cli"])
    assert out.exit_code == 0 and "stopped" in out.output
    out = run(main, ["experiment", "list", "--data", d])
    assert out.exit_code == 0 and out.output.startswith("cli: stopped")
    out = run(main, ["experiment", "start", "--data", d, "--name", "x", "--variant", "A=colour=red", "--variant", "B="])
    assert out.exit_code == 2 and "colour" in out.output


def test_postgres_and_sqlite_report_the_same_experiment(tmp_path, pg_url):
    from vitrine.feedback.types import EventRecord, SearchLog
    from vitrine.feedback.eventlog import EventLog
    from vitrine.experiments.models import ExperimentCreate, VariantSettings
    from vitrine.experiments.runner import Experiments

    lite, pg = EventLog(tmp_path / "events.sqlite"), EventLog(pg_url)
    try:
        spec = ExperimentCreate(name="e", variants={"A": VariantSettings(), "B": VariantSettings(learn_weight=0)})
        reps = []
        for log in (lite, pg):
            ex = Experiments(log)
            exp = ex.start(spec)
            r2 = random.Random(9)
            for i in range(600):
                user = f"u{r2.randrange(80)}"
                variant = ("A", "B")[r2.random() < 0.5]
                s = SearchLog(f"q{i}", exp.created + i, "t", "t", tuple(f"p{j}" for j in range(10)),
                              user=log.hash_user(user), experiment="e", variant=variant)
                log.log_search(s)
                if r2.random() < 0.4:
                    pos = r2.randrange(10)
                    log.add_events([EventRecord(f"e{i}", s.query_id, "click", f"p{pos}", pos, s.ts + 1, s.user)])
            reps.append(ex.status("e").model_dump(exclude={"experiment"}))
        assert reps[0] == reps[1]
    finally:
        lite.close(), pg.close()
