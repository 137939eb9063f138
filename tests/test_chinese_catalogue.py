"""A Chinese-titled shop with photos, and a mixed one (issue 51, item 2), through the HTTP API.

The shop is the conftest's real subset written in Chinese by ``vitrine convert-fashion --language
zh`` (vitrine/ingest/fashion_zh.py), photos kept; its titles reach the English text tower as their
English rendering (vitrine/lang/render.py), Chinese queries too; an English catalogue's text is
embedded exactly as before."""

from __future__ import annotations

import json
import random
import shutil
from collections import Counter

import pytest
from fastapi.testclient import TestClient

from vitrine.evals.chinese import chinese_forms
from vitrine.ingest.fashion_zh import renderer
from vitrine.lang import segment
from vitrine.lang.render import for_tower, to_english
from vitrine.search.models import Product, product_text

TRIPLE_MIN = 3  # a (gender, colour, article type) query needs this many products in the subset


def _rows(catalog_dir):
    return [json.loads(line) for line in (catalog_dir / "catalog.jsonl").read_text().splitlines() if line.strip()]


def _shop(settings_factory, encoder, catalog_dir, tmp_path_factory, name, chinese):
    """An engine over the subset with the records ``chinese`` says written in Chinese (photos kept)."""
    from vitrine.ingest.catalog import ingest_file
    from vitrine.search.engine import Engine

    d = tmp_path_factory.mktemp(name)
    shutil.copytree(catalog_dir / "images", d / "images")
    r = renderer()
    with open(d / "catalog.jsonl", "w", encoding="utf-8") as f:
        for rec in _rows(catalog_dir):
            f.write(json.dumps(r.record(rec) if chinese(rec) else rec, ensure_ascii=False) + "\n")
    eng = Engine(settings_factory(tmp_path_factory.mktemp(name + "-data")), encoder)
    report = ingest_file(eng, d / "catalog.jsonl", progress=False)
    assert report.upserted == len(_rows(catalog_dir)) and not report.failed
    return eng


@pytest.fixture(scope="module")
def zh_shop(settings_factory, encoder, catalog_dir, tmp_path_factory):
    eng = _shop(settings_factory, encoder, catalog_dir, tmp_path_factory, "zh-shop", lambda rec: True)
    with TestClient(__import__("vitrine.web.app", fromlist=["create_app"]).create_app(engine=eng)) as c:
        yield c
    eng.close()


@pytest.fixture(scope="module")
def mixed_shop(settings_factory, encoder, catalog_dir, tmp_path_factory):
    eng = _shop(settings_factory, encoder, catalog_dir, tmp_path_factory, "mixed-shop",
                lambda rec: int(rec["id"]) % 2 == 0)
    with TestClient(__import__("vitrine.web.app", fromlist=["create_app"]).create_app(engine=eng)) as c:
        yield c
    eng.close()


def _search(client, text, k=10):
    r = client.post("/v1/search", json={"text": text, "k": k})
    assert r.status_code == 200, r.text
    return r.json()


def _triples(subset_rows):
    """(gender, colour, article type) of the subset with at least TRIPLE_MIN products, and each's ids."""
    by: dict[tuple[str, str, str], set[str]] = {}
    for r in subset_rows:
        by.setdefault((r["gender"], r["baseColour"], r["articleType"]), set()).add(r["id"])
    return {t: ids for t, ids in by.items() if len(ids) >= TRIPLE_MIN}


def _chinese_queries(subset_rows):
    """Each common triple as a Chinese shopper types it ("男士黑色手表"), from the lexicon's forms."""
    forms, rng = chinese_forms(), random.Random(3)
    out = []
    for (g, c, a), ids in sorted(_triples(subset_rows).items()):
        parts = [forms["gender"].get(g), forms["colour"].get(c), forms["articleType"].get(a)]
        if all(parts):
            out.append(("".join(rng.choice(p) for p in parts if p), ids))
    return out


def _precision_at(ids, relevant, k=10):
    """P@k by hand: relevant hits in the top k over k (fewer relevant than k: over their number)."""
    return sum(1 for i in ids[:k] if i in relevant) / min(k, len(relevant))


def test_chinese_variant_keeps_ids_and_photos_and_writes_chinese(catalog_dir):
    rows = _rows(catalog_dir)
    r = renderer()
    zh = [r.record(rec) for rec in rows]
    assert [x["id"] for x in zh] == [x["id"] for x in rows] and [x["image"] for x in zh] == [x["image"] for x in rows]
    assert sum(segment.has_cjk(x["title"]) for x in zh) == len(zh)
    gender = Counter((a["attributes"].get("gender"), b["attributes"].get("gender")) for a, b in zip(rows, zh))
    assert gender[("Men", "男士")] > 0 and gender[("Women", "女士")] > 0
    nike = [x["title"] for a, x in zip(rows, zh) if a["title"].startswith("Nike ")]
    assert nike and all(t.startswith("Nike/耐克") for t in nike)
    watches = [x for a, x in zip(rows, zh) if a["attributes"].get("articleType") == "Watches"]
    assert watches and all("手表" in x["title"] and x["category"][-1] == "手表" for x in watches)


def test_english_text_is_embedded_as_before_and_chinese_as_its_english(catalog_dir):
    for rec in _rows(catalog_dir)[:40]:
        p = Product.model_validate(rec)
        plain = " ".join([p.title] + ([p.category[-1]] if p.category[-1].casefold() not in p.title.casefold() else []))
        assert product_text(p) == plain and for_tower(plain) is plain
    p = Product.model_validate({"id": "z", "title": "Nike/耐克男士黑色手表", "category": ["配饰", "手表"]})
    text = product_text(p)
    assert not segment.has_cjk(text) and text == to_english("Nike/耐克男士黑色手表")
    assert "men" in text.split() and "black" in text.split() and "watch" in text.split()
    assert to_english("女士红色连衣裙") == "women red dress"


def test_chinese_shop_answers_chinese_attribute_queries(zh_shop, subset_rows):
    queries = _chinese_queries(subset_rows)
    assert len(queries) >= 5
    got = []
    for text, relevant in queries:
        out = _search(zh_shop, text)
        assert out["query"]["text"] == text and "translated" not in out["query"]  # searched as typed
        got.append(_precision_at([h["id"] for h in out["results"]], relevant))
    mean = sum(got) / len(got)
    assert mean >= 0.85, (mean, list(zip([q for q, _ in queries], got)))


def test_chinese_titles_are_read_by_the_vector_side(zh_shop, subset_rows):
    """"黑色手提包" (the issue's miss): handbags first, by words and by the text tower alike."""
    handbags = {r["id"] for r in subset_rows if r["articleType"] == "Handbags"}
    out = _search(zh_shop, "手提包")
    top = [h["id"] for h in out["results"][:5]]
    assert len(set(top) & handbags) == 5
    r = zh_shop.post("/v1/search", json={"text": "女士手提包", "k": 5, "explain": True}).json()
    assert r["results"][0]["id"] in handbags
    assert any(v for k, v in r["results"][0]["explanation"]["signals"].items() if k != "bm25")


def test_mixed_catalogue_finds_both_languages(mixed_shop, subset_rows):
    watches = {r["id"] for r in subset_rows if r["articleType"] == "Watches" and r["gender"] == "Men"}
    assert {int(i) % 2 for i in watches} == {0, 1}  # written in both languages
    for text in ("男士手表", "men watches"):
        ids = [h["id"] for h in _search(mixed_shop, text)["results"]]
        assert _precision_at(ids, watches) >= 0.8, (text, ids)
        assert {int(i) % 2 for i in ids[:len(watches)] if i in watches} == {0, 1}, text


def test_convert_fashion_writes_the_chinese_variant(tmp_path):
    """`vitrine convert-fashion --language zh`: the same products and photos as the English file."""
    from click.testing import CliRunner

    from vitrine.cli.app import main

    runner = CliRunner()
    for lang in ("en", "zh"):
        res = runner.invoke(main, ["convert-fashion", "--limit", "60", "--language", lang,
                                   "--out", str(tmp_path / f"{lang}.jsonl")])
        assert res.exit_code == 0, res.output
    en, zh = ([json.loads(x) for x in (tmp_path / f"{lang}.jsonl").read_text(encoding="utf-8").splitlines()]
              for lang in ("en", "zh"))
    assert len(en) == len(zh) == 60 and [r["id"] for r in en] == [r["id"] for r in zh]
    assert [r["image"] for r in en] == [r["image"] for r in zh]
    assert all(segment.has_cjk(r["title"]) for r in zh) and not any(segment.has_cjk(r["title"]) for r in en)


def test_convert_fashion_out_anywhere_is_ingestible(tmp_path, fresh_engine, monkeypatch):
    """`vitrine convert-fashion --out FILE` with FILE outside the source folder: its photos are placed
    in images/ beside FILE (hard links, copies where linking fails), never named by a path that
    leaves FILE's folder, and `vitrine ingest FILE` reads every one of them."""
    import errno
    import os

    from click.testing import CliRunner

    from vitrine.cli.app import main
    from vitrine.ingest.catalog import PhotoResolver, ingest_file
    from vitrine.ingest.fashion import place_photos

    from conftest import SOURCE

    out = tmp_path / "elsewhere" / "shop"
    runner = CliRunner()
    for lang in ("en", "zh"):  # the second run finds the photos already there and keeps them
        res = runner.invoke(main, ["convert-fashion", "--source", str(SOURCE), "--limit", "6", "--language", lang,
                                   "--out", str(out / f"{lang}.jsonl")])
        assert res.exit_code == 0, res.output
    recs = [json.loads(x) for x in (out / "zh.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(recs) == 6 and all(segment.has_cjk(r["title"]) for r in recs)
    for r in recs:
        assert r["image"] == f"images/{r['id']}.jpg"
        photo = out / r["image"]
        assert photo.is_file() and os.path.samefile(photo, SOURCE / "images" / f"{r['id']}.jpg")  # a link
        assert PhotoResolver(out).fetch(r["image"]) == (SOURCE / "images" / f"{r['id']}.jpg").read_bytes()
    report = ingest_file(fresh_engine, out / "en.jsonl", progress=False)
    assert report.upserted == 6 and not report.failed, report.failed
    assert all(fresh_engine.get(r["id"]).image_url for r in recs)

    # linking refused (another filesystem): the photos are copied instead, byte for byte
    def no_link(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_link)
    ids = [r["id"] for r in recs]
    placed = place_photos(SOURCE / "images", tmp_path / "copied", ids)
    assert (placed.linked, placed.copied, placed.missing) == (0, 6, 0)
    for pid in ids:
        copy = tmp_path / "copied" / f"{pid}.jpg"
        assert not os.path.samefile(copy, SOURCE / "images" / f"{pid}.jpg")
        assert copy.read_bytes() == (SOURCE / "images" / f"{pid}.jpg").read_bytes()
    assert place_photos(SOURCE / "images", tmp_path / "copied", ids).kept == 6


def test_content_hash_changes_only_for_chinese_records():
    """A data dir ingested before the rendering re-embeds its Chinese records on re-ingest, never
    its English ones (their hash is the plain digest, as before)."""
    import hashlib

    en = Product.model_validate({"id": "e", "title": "Nike Men Black Watch", "category": ["Watches"]})
    doc = en.model_dump(exclude={"image", "image_b64", "version"}, exclude_none=True)
    plain = hashlib.sha256(json.dumps(doc, sort_keys=True, ensure_ascii=False).encode())
    plain.update(b"abc")
    assert en.content_hash("abc") == plain.hexdigest()
    zh = Product.model_validate({"id": "z", "title": "Nike/耐克男士黑色手表", "category": ["手表"]})
    doc = zh.model_dump(exclude={"image", "image_b64", "version"}, exclude_none=True)
    old = hashlib.sha256(json.dumps(doc, sort_keys=True, ensure_ascii=False).encode())
    old.update(b"abc")
    assert zh.content_hash("abc") != old.hexdigest() and zh.content_hash("abc") == zh.content_hash("abc")


def test_english_words_read_as_a_chinese_shops_own_words():
    from vitrine.index.bm25 import word_terms
    from vitrine.lang.translate import ToChinese

    shop = ToChinese({"黑色": 300, "手提包": 80, "人字拖": 40, "男士": 900, "手表": 120, "色手": 30, "t": 50, "恤": 50},
                     word_terms)
    assert shop.translate("tshirts").text == "t恤"  # a shop word the index holds in parts
    tr = shop.translate("black handbags")  # a plural meets the sense "(hand)bag" by its stem
    assert tr.text == "黑色 手提包" and [w.word for w in tr.words] == ["black", "handbags"]
    assert shop.translate("men flip flops").text == "男士 人字拖"  # a two-word sense first
    kept = shop.translate("Casio watch")
    assert kept.text == "手表" and kept.words[0].via == "kept"  # a name none reads stays as typed


def test_chinese_shop_answers_english_queries(zh_shop, subset_rows, engine):
    """English twins of the Chinese attribute queries on the Chinese-titled shop, through the API:
    read as the shop's Chinese words beside the words as typed; English catalogues untouched."""
    queries = [(f"{g} {c} {a}".lower(), ids) for (g, c, a), ids in sorted(_triples(subset_rows).items())]
    assert len(queries) >= 5
    got = []
    for text, relevant in queries:
        out = _search(zh_shop, text)
        assert out["query"]["text"] == text and out["query"]["translated"]
        assert all(segment.has_cjk(w) for w in out["query"]["translated"].split())
        got.append(_precision_at([h["id"] for h in out["results"]], relevant))
    mean = sum(got) / len(got)
    assert mean >= 0.6, (mean, list(zip([q for q, _ in queries], got)))
    from vitrine.search.models import SearchRequest

    english = engine.search(SearchRequest(text=queries[0][0], k=10))  # the English subset
    assert "translated" not in english.query
