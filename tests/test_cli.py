"""The command line: help, ingest, search, eval (with qrels and the KAGL protocol on a subset)."""

from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner

from vitrine.cli.app import main
from vitrine.evals import protocols as P
from vitrine.evals.datasets import Catalog, load_qrels


def test_help_lists_every_command():
    out = CliRunner().invoke(main, ["--help"]).output
    for cmd in ("demo", "ingest", "serve", "train", "eval", "search", "convert-fashion"):
        assert cmd in out


def test_ingest_search_and_eval_commands(tmp_path, catalog_dir, cache_dir, subset_rows, monkeypatch):
    monkeypatch.setenv("VITRINE_CACHE_DIR", str(cache_dir))
    runner = CliRunner()
    data = tmp_path / "data"
    r = runner.invoke(main, ["ingest", str(catalog_dir / "catalog.jsonl"), "--data", str(data), "--limit", "25"])
    assert r.exit_code == 0, r.output
    assert "upserted 25" in r.output
    r = runner.invoke(main, ["search", "--data", str(data), "blue t-shirt", "-k", "3"])
    assert r.exit_code == 0, r.output
    assert len(json.loads(r.stdout)["results"]) == 3
    ids = [json.loads(line)["id"] for line in (catalog_dir / "catalog.jsonl").read_text().splitlines()[:25]]
    rows = {x["id"]: x for x in subset_rows}
    qrels = tmp_path / "q.jsonl"
    qrels.write_text("".join(json.dumps({"qid": i, "text": rows[i]["productDisplayName"], "relevant": {i: 1}}) + "\n"
                             for i in ids[:10]))
    out = tmp_path / "res.json"
    r = runner.invoke(main, ["eval", "--data", str(data), "--queries", str(qrels), "--k", "1,5,10",
                             "--json", str(out)])
    assert r.exit_code == 0, r.output
    m = json.loads(out.read_text())["metrics"]
    assert {"R@1", "R@10", "MRR@10", "nDCG@10", "P@5"} <= set(m)
    assert m["R@10"] >= 0.5  # a product's own title finds it among 25


def test_cli_errors_are_one_line(tmp_path):
    r = CliRunner().invoke(main, ["eval", "--protocol", "qrels"])
    assert r.exit_code != 0 and "needs" in r.output or "data" in r.output
    bad = tmp_path / "q.jsonl"
    bad.write_text('{"qid": 1}\n')
    r = CliRunner().invoke(main, ["eval", "--data", str(tmp_path), "--queries", str(bad)])
    assert r.exit_code == 2 and "relevant" in r.output


def test_train_gate_set_overrides():
    """`vitrine train gate --set KEY=VALUE`: JSON values, plain strings, and a clear error."""
    r = CliRunner().invoke(main, ["train", "gate", "--kind", "moe", "--set", "dropout"])
    assert r.exit_code == 2 and "KEY=VALUE" in r.output
    from vitrine.cli.train import _parse_overrides

    assert _parse_overrides(("dropout=0.3", "balance=loss", "router_noise=false")) == {
        "dropout": 0.3, "balance": "loss", "router_noise": False}


def test_train_gate_views_are_checked_before_training():
    r = CliRunner().invoke(main, ["train", "gate", "--views", "flip,rotate90"])
    assert r.exit_code == 2 and "rotate90" in r.output and "crop<N>" in r.output
    from vitrine.cli.train import _parse_views

    assert _parse_views(" flip, crop3 ,") == ("flip", "crop3") and _parse_views("") == ()


def test_kagl_protocols_on_a_subset(encoder, subset_rows):
    cat = Catalog.load(limit_ids={r["id"] for r in subset_rows})
    res = P.kagl_t2i(encoder, cat, split="train", progress=False)
    m = res["metrics"]
    assert res["gallery"] == len(subset_rows) and {"R@1", "R@10", "MRR@10"} <= set(m)
    assert m["MRR@10"] > 0.3  # chance would be ~0.02 with this gallery
    sub = P.kagl_subcat(encoder, cat, progress=False)
    assert sub["metrics"]["P@1"] >= 0.5 and 0 <= sub["metrics"]["P@10"] <= 1


def test_photo_self_protocol(engine, subset_rows):
    cat = Catalog.load(limit_ids={r["id"] for r in subset_rows})
    res = P.photo_self(engine, cat, split="train", limit=40, progress=False)
    assert res["queries"] == 40 and res["metrics"]["self@1"] >= 0.95


def test_load_qrels_resolves_images(tmp_path):
    (tmp_path / "q.jpg").write_bytes(b"\xff\xd8abc")
    (tmp_path / "q.jsonl").write_text(json.dumps({"qid": "a", "image": "q.jpg", "relevant": {"1": 2}}) + "\n")
    q = load_qrels(tmp_path / "q.jsonl")
    assert q[0].image == b"\xff\xd8abc" and q[0].relevant == {"1": 2.0}
    assert np.isclose(sum(q[0].relevant.values()), 2.0)
