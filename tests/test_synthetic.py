"""`vitrine make-catalogue`: a synthetic catalogue over Google's taxonomy, and judged queries whose
judgements are checked here against the written products by brute force."""

from __future__ import annotations

import json

from click.testing import CliRunner

from vitrine.evals.synthetic import COLOURS, MATERIALS, taxonomy_leaves, write_catalogue


def _read(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_catalogue_and_judgements_match_brute_force(tmp_path):
    made = write_catalogue(tmp_path, 3000, seed=3, queries=150)
    docs = _read(tmp_path / "catalog.jsonl")
    queries = _read(tmp_path / "queries.jsonl")
    assert made.products == len(docs) == 3000 and len({d["id"] for d in docs}) == 3000
    leaves = {leaf.path for leaf in taxonomy_leaves()}
    assert all(tuple(d["category"]) in leaves for d in docs)  # real taxonomy leaf categories
    assert made.categories == len({tuple(d["category"]) for d in docs}) > 20
    assert len({d["brand"] for d in docs}) > 100 and len({d["title"] for d in docs}) > 2900
    assert sum(made.queries.values()) == len(queries) == 150
    assert {q["split"] for q in queries} == {"val", "test"} and len({q["text"] for q in queries}) == 150
    from vitrine.evals.synthetic import Leaf

    for q in queries:
        def matches(d, q=q):
            noun = Leaf(tuple(d["category"])).noun
            words = {"category": noun, "brand": f"{d['brand']} {noun}", "colour": f"{d['colour']} {noun}",
                     "colour_material": f"{d['colour']} {d['material']} {noun}"}
            return words[q["kind"]] == q["text"]
        want = {d["id"] for d in docs if matches(d)}
        assert set(q["relevant"]) == want, q["qid"]
    assert {d["colour"] for d in docs} <= set(COLOURS) and {d["material"] for d in docs} <= set(MATERIALS)


def test_the_same_seed_writes_the_same_files_and_the_cli_writes_them(tmp_path):
    from vitrine.cli.app import main

    write_catalogue(tmp_path / "a", 500, seed=7, queries=40)
    res = CliRunner().invoke(main, ["make-catalogue", "--n", "500", "--seed", "7", "--queries", "40",
                                    "--out", str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["products"] == 500
    for name in ("catalog.jsonl", "queries.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    other = write_catalogue(tmp_path / "c", 500, seed=8, queries=40)
    assert other.products == 500
    assert (tmp_path / "c" / "catalog.jsonl").read_bytes() != (tmp_path / "a" / "catalog.jsonl").read_bytes()
    bad = CliRunner().invoke(main, ["make-catalogue", "--n", "10", "--categories", "999999", "--out",
                                    str(tmp_path / "d")])
    assert bad.exit_code != 0 and "categories must be between 1 and" in bad.output
