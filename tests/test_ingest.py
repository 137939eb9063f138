"""Catalogue readers and batch ingest: bad records reported with line numbers, idempotent re-ingest."""

from __future__ import annotations

import base64
import json
import shutil

import pytest
from pydantic import ValidationError

from vitrine.errors import InvalidInput
from vitrine.ingest.catalog import PhotoResolver, ingest_file, read_catalog
from vitrine.bundled import read_styles
from vitrine.ingest.fashion import convert, to_record
from vitrine.search.models import Product

from conftest import SOURCE


def test_product_validation():
    p = Product.model_validate({"id": "1", "title": "  Nike  Men Shoe ", "category": "Footwear > Shoes",
                                "gender": "Men", "price": "12.5"})
    assert p.title == "Nike Men Shoe" and p.category == ["Footwear", "Shoes"]
    assert p.attributes["gender"] == "Men" and p.gender == "Men" and p.price == 12.5
    for bad in ({"title": "x"}, {"id": "1"}, {"id": "1", "title": "  "}, {"id": "a/b", "title": "x"},
                {"id": "1", "title": "x", "price": -1}, {"id": "1", "title": "x", "image_b64": "!!!"}):
        with pytest.raises(ValidationError):
            Product.model_validate(bad)


def test_fashion_converter_reads_quoted_titles(tmp_path):
    rows = read_styles(SOURCE)
    assert len(rows) == 20873
    commas = [r for r in rows if "," in r["productDisplayName"]]
    assert len(commas) >= 19 and all(r["productDisplayName"][0] != '"' for r in commas)
    out = tmp_path / "c.jsonl"
    n = convert(SOURCE, out, ids=[r["id"] for r in rows[:5]])
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert n == 5 and recs[0]["category"][0] in {"Apparel", "Accessories", "Footwear", "Personal Care",
                                                  "Free Items", "Sporting Goods", "Home"}
    assert (out.parent / recs[0]["image"]).is_file()


def _write_catalog(d, lines):
    (d / "cat.jsonl").write_text("\n".join(lines) + "\n")
    return d / "cat.jsonl"


def test_bad_records_reported_with_line_numbers(fresh_engine, catalog_dir, tmp_path, subset_rows):
    d = tmp_path / "cat"
    (d / "images").mkdir(parents=True)
    good = []
    for r in subset_rows[:4]:
        shutil.copy(catalog_dir / "images" / f"{r['id']}.jpg", d / "images" / f"{r['id']}.jpg")
        good.append(json.dumps(to_record(r, f"images/{r['id']}.jpg")))
    (d / "images" / "broken.jpg").write_bytes(b"not a jpeg")
    outside = tmp_path / "secret.jpg"
    shutil.copy(catalog_dir / "images" / f"{subset_rows[0]['id']}.jpg", outside)
    lines = [
        good[0],                                                         # 1 ok
        "{not json",                                                     # 2
        json.dumps({"title": "no id"}),                                  # 3
        json.dumps({"id": "x1"}),                                        # 4 no title
        json.dumps({"id": "x2", "title": "t", "image": "images/broken.jpg"}),   # 5 undecodable photo
        json.dumps({"id": "x3", "title": "t", "image": "images/missing.jpg"}),  # 6 missing photo
        json.dumps({"id": "x4", "title": "t", "image": "../secret.jpg"}),       # 7 path traversal
        good[1], good[2],                                                # 8, 9 ok
        json.dumps({"id": "x5", "title": "text only product"}),          # 10 ok, no photo
        json.dumps({"id": "x6", "title": "inline photo", "image_b64": base64.b64encode(
            (catalog_dir / "images" / f"{subset_rows[3]['id']}.jpg").read_bytes()).decode()}),  # 11 ok
    ]
    report = ingest_file(fresh_engine, _write_catalog(d, lines), progress=False)
    assert report.upserted == 5
    by_line = {e.line: e.reason for e in report.failed}
    assert set(by_line) == {2, 3, 4, 5, 6, 7}
    assert "JSON" in by_line[2] and "id" in by_line[3] and "title" in by_line[4]
    assert "photo" in by_line[5] and "does not exist" in by_line[6] and "outside" in by_line[7]
    assert fresh_engine.get("x5").image_url is None and fresh_engine.get("x6").image_url


def test_reingest_changes_nothing(fresh_engine, catalog_dir):
    cat = catalog_dir / "catalog.jsonl"
    first = ingest_file(fresh_engine, cat, progress=False, limit=30)
    seq = fresh_engine.records.seq
    again = ingest_file(fresh_engine, cat, progress=False, limit=30)
    assert first.upserted == 30 and again.upserted == 0 and again.unchanged == 30
    assert fresh_engine.records.seq == seq and len(fresh_engine) == 30


def test_csv_catalog(fresh_engine, catalog_dir, subset_rows, tmp_path):
    r = subset_rows[0]
    shutil.copy(catalog_dir / "images" / f"{r['id']}.jpg", tmp_path / "p.jpg")
    (tmp_path / "c.csv").write_text(
        "id,title,brand,category,price,image,colour\n"
        f"c1,\"{r['productDisplayName']}, special\",Acme,Apparel > Topwear,19.99,p.jpg,Blue\n"
        "c2,,Acme,,,,\n"
        "c3,Plain mug,Acme,Home,not-a-price,,\n"
    )
    parsed = list(read_catalog(tmp_path / "c.csv"))
    assert parsed[0].product.price == 19.99 and parsed[0].product.attributes["colour"] == "Blue"
    assert parsed[1].error and "title" in parsed[1].error and parsed[1].line == 3
    assert parsed[2].error and "price" in parsed[2].error
    report = ingest_file(fresh_engine, tmp_path / "c.csv", progress=False)
    assert report.upserted == 1 and len(report.failed) == 2


def test_photo_resolver_refuses_traversal(tmp_path):
    (tmp_path / "root").mkdir()
    res = PhotoResolver(tmp_path / "root")
    (tmp_path / "x.jpg").write_bytes(b"x")
    for ref in ("../x.jpg", str(tmp_path / "x.jpg"), f"file://{tmp_path / 'x.jpg'}"):
        with pytest.raises(InvalidInput, match="outside"):
            res.fetch(ref)
    with pytest.raises(InvalidInput, match="scheme"):
        res.fetch("ftp://example.com/x.jpg")


def test_missing_catalog_file(tmp_path):
    with pytest.raises(InvalidInput, match="does not exist"):
        read_catalog(tmp_path / "nope.jsonl")


def test_a_batch_ingest_keeps_the_read_indexes_with_its_snapshot(settings_factory, encoder, catalog_dir, tmp_path):
    """The suggestion index and the BM25 postings are built before the ingest's snapshot, so the
    next open (a first `vitrine serve`) loads them instead of building them from every record."""
    from vitrine.search.engine import Engine

    settings = settings_factory(tmp_path / "data")
    eng = Engine(settings, encoder)
    try:
        assert ingest_file(eng, catalog_dir / "catalog.jsonl", progress=False, limit=40).upserted == 40
        assert eng.suggest("shi", k=3).suggestions  # answered from the index built during the ingest
    finally:
        eng.close()
    versions = sorted((tmp_path / "data" / "index" / "snapshots").iterdir())
    assert len(versions) == 1  # close() had nothing more to write
    assert {"bm25.varr", "suggestions.varr"} <= {p.name for p in versions[0].iterdir()}
    again = Engine(settings, encoder)
    try:
        assert again.index.recovery["text_index_loaded"] is True
        assert again.index.recovery["snapshot"] == versions[0].name
    finally:
        again.close()
