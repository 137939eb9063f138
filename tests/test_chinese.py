"""Chinese: queries read onto an English catalogue's own words, BM25 over Chinese titles, the twins eval.

Real Chinese text throughout, the real CC-CEDICT and jieba, the shared subset engine."""

from __future__ import annotations

import random

import pytest

from vitrine.index.bm25 import MemoryBM25, word_terms
from vitrine.index.records import RecordRow, RecordStore
from vitrine.lang.translate import Translator, gloss_phrases
from vitrine.search.models import SearchRequest


def _catalogue_translator(words: dict[str, int]) -> Translator:
    terms: dict[str, int] = {}
    for w, n in words.items():
        for t in word_terms(w):
            terms[t] = terms.get(t, 0) + n
    return Translator(terms, word_terms, 1000)


def test_gloss_phrases_read_parentheses_and_verbs():
    assert gloss_phrases("(hand)bag") == ["handbag", "bag"]
    assert gloss_phrases("red (color)") == ["red"]
    assert gloss_phrases("to protect") == ["protect"]
    assert gloss_phrases("variant of 床[chuang2]") == []


def test_chinese_words_map_onto_the_catalogues_own_vocabulary():
    fashion = _catalogue_translator({"watch": 300, "watches": 200, "men": 900, "wrist": 3, "handbag": 80, "bag": 120,
                                     "black": 700, "dress": 60, "red": 300, "grey": 200})
    tr = fashion.translate("男士手表")
    assert tr.text.split()[0] == "men" and "watch" in tr.text.split()
    assert [w.word for w in tr.words] == ["男士", "手表"]
    assert fashion.translate("黑色手提包").text == "black handbag"
    assert fashion.translate("红色连衣裙").text == "red dress"
    assert fashion.translate("灰色").text == "grey"  # CC-CEDICT writes "gray"; this catalogue "grey"
    # the same words on a furniture catalogue read as its words
    furniture = _catalogue_translator({"bed": 500, "poster": 40, "four": 30, "king": 200, "bookcase": 90, "gray": 50})
    assert set(furniture.translate("特大号四柱床").text.split()) >= {"king", "poster", "bed"}
    assert furniture.translate("书柜").text == "bookcase"
    unread = furniture.translate("硬币书柜")  # coin: the dictionary knows it, this catalogue has no coin
    assert unread.text == "bookcase" and unread.words[0].via == "unread"
    # Latin words (brands) are kept as typed
    assert fashion.translate("Nike 黑色").text == "nike black"
    # a shop word written in Latin letters and characters together is read whole, not cut where they change
    shirts = _catalogue_translator({"tshirt": 400, "tshirts": 300, "nike": 100, "white": 500, "t": 10})
    for typed in ("T恤", "t恤", "耐克T恤", "白色 T恤"):
        tr = shirts.translate(typed)
        assert "tshirt" in tr.text.split() and all(w.via != "unread" for w in tr.words), (typed, tr)
    assert [w.word for w in shirts.translate("耐克T恤").words] == ["耐克", "T恤"]


def test_chinese_query_on_the_english_catalogue_finds_what_its_english_twin_does(engine):
    zh = engine.search(SearchRequest(text="男士手表", k=10, explain=True))
    en = engine.search(SearchRequest(text="men watches", k=10))
    assert "watch" in zh.query["translated"] and "men" in zh.query["translated"]
    assert zh.query["text"] == "男士手表"
    assert [w["word"] for w in zh.query["translation"]] == ["男士", "手表"]
    assert zh.results[0].explanation is not None and zh.results[0].explanation.translated[1]["word"] == "手表"

    def watches(res):
        return sum(1 for h in res.results if "Watches" in h.category)

    assert watches(en) >= 5
    assert watches(zh) >= watches(en) - 1
    assert "translated" not in en.query  # an English query is searched as typed


def test_slots_filter_a_language_the_tune_did_not_measure(engine):
    cal = engine.reader.calibration
    assert "zh" not in cal.slot_languages
    assert engine.reader.slot_filters_on("zh") == engine.settings.intent.intent_slot_filters
    assert engine.reader.slot_filters_on("en") == (engine.settings.intent.intent_slot_filters and
                                                   (engine.settings.search.calibration == "off" or cal.slot_filters))


def _row(pid: str, title: str, category: list[str]) -> RecordRow:
    return RecordRow(id=pid, doc={"id": pid, "title": title, "category": category, "attributes": {}},
                     content_hash=pid)


@pytest.fixture()
def chinese_store(tmp_path):
    store = RecordStore(tmp_path / "records.sqlite")
    store.upsert_many([
        _row("1", "Baggit 女士 黑色 手提包", ["配饰", "手提包"]),
        _row("2", "Nike 男士 黑色跑鞋", ["鞋", "运动鞋"]),
        _row("3", "卡西欧男士手表", ["配饰", "手表"]),
        _row("4", "Puma 女士 黑色T恤", ["服装", "T恤"]),
    ])
    yield store
    store.close()


def test_bm25_reads_chinese_titles_by_words_and_character_pairs(chinese_store):
    # a run of characters is no longer one token: "黑色手提包" finds the handbag whose title spaces its words
    hits = chinese_store.bm25("黑色手提包", 4)
    assert hits and hits[0][0] == chinese_store.get("1").iid
    # and "手表" finds the watch whose title runs "卡西欧男士手表" together
    assert chinese_store.bm25("手表", 4)[0][0] == chinese_store.get("3").iid
    # the in-memory scorer gives SQLite's numbers for Chinese queries too
    mem = chinese_store.bm25_scores("男士手表")
    assert isinstance(chinese_store.text_index(), MemoryBM25)
    sql = dict(chinese_store.bm25("男士手表", 10))
    assert set(mem) == set(sql) and all(abs(mem[i] - sql[i]) < 1e-9 for i in sql)


def test_attribute_twins_name_the_same_attributes_in_chinese():
    from vitrine.evals.chinese import chinese_forms, twin_text

    forms = chinese_forms()
    rng = random.Random(0)
    text = twin_text({"gender": "Men", "colour": "Black", "articleType": "Watches"}, forms, rng)
    assert text is not None
    assert any(text.startswith(g) for g in forms["gender"]["Men"])
    assert any(c in text for c in forms["colour"]["Black"]) and any(a in text for a in forms["articleType"]["Watches"])
    assert twin_text({"colour": "Black", "articleType": "No Such Type"}, forms, rng) is None


def test_senses_are_chosen_by_what_the_catalogue_sells():
    # CC-CEDICT: 圆 "circle/round/...", 储物柜 "locker/cabinet", 组合 "to assemble/.../set": a furniture
    # catalogue with ten times more "round" than "circle" (2 in 1,000) reads the second sense
    furniture = _catalogue_translator({"round": 21, "circle": 2, "tile": 200, "ceramic": 90, "cabinet": 521,
                                       "locker": 1, "set": 100, "assemble": 3, "outdoor": 300, "dining": 250,
                                       "table": 900, "white": 300, "pink": 40})
    assert furniture.translate("圆瓷砖").text == "round ceramic tile"
    assert furniture.translate("储物柜").text == "cabinet"
    # 组合's noun sense "set" is read beside its first, verb, sense "to assemble"
    assert "set" in furniture.translate("户外组合餐桌").text.split()
    # beyond one product in a hundred, frequency no longer reorders senses: 粉色 "pink; white" stays pink
    assert furniture.translate("粉色").text == "pink"
    # a catalogue that holds "circle" and no "round" still reads the dictionary's first sense
    shapes = _catalogue_translator({"circle": 50, "tile": 80})
    assert shapes.translate("圆").text == "circle"


def test_grammar_characters_decades_and_instrument_suffixes():
    furniture = _catalogue_translator({"bed": 400, "trundle": 20, "gravity": 20, "feeder": 46, "feed": 32,
                                       "tool": 50, "furniture": 900, "style": 37, "70s": 51, "round": 100})
    # "带" (with) and "的" are grammar between words: read as nothing, yet read (not "band")
    tr = furniture.translate("带抽屉的床")
    assert tr.text.split()[-1] == "bed" and "band" not in tr.text.split()
    assert {w.word: w.via for w in tr.words}["带"] == "function"
    # a decade the Chinese way is the English one
    assert furniture.translate("70年代风格家具").text.split()[0] == "70s"
    # a word the dictionary lacks, a verb and an instrument suffix: the catalogue's agent noun
    feeder = furniture.translate("重力喂食器")
    assert feeder.text == "gravity feeder" and feeder.read_share == 1.0
    # 形 (-shaped) alone is a suffix, not "to look"
    assert furniture.translate("圆形").text == "round"
    assert "look" not in furniture.translate("星形圆床").text


def test_a_query_read_in_full_is_searched_as_english(engine):
    # every word read: the ranking reads English, so the tune's English slot decision applies;
    # a word left unread (硬币, coin, on no catalogue of coins): its slots filter
    full = engine.reads.translation.read("男士手表")
    assert full.language == "zh" and full.translation is not None and full.translation.read_share == 1.0
    assert full.searched_language == "en"
    part = engine.reads.translation.read("硬币男士手表")
    assert part.translation is not None and part.translation.unread == ["硬币"]
    assert part.searched_language == "zh"
    assert engine.reads.translation.read("men watches").searched_language == "en"
    # the intent lexicon's forms read as their values, where the dictionary reads "girl friend"
    gift = engine.reads.translation.read("女朋友手提包")
    assert gift.translation is not None and gift.translation.text.split()[0] == "women"
