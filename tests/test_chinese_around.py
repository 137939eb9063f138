"""Everything around search reads Chinese (issue 51, items 3 and 4), through the HTTP API on real
text: suggestions by Chinese prefix, by pinyin (whole, initials, mixed) and through a homophone
typed by an input method; the Chinese lexicon of any catalogue (the dictionary reversed onto a
furniture catalogue's categories, a brand's Chinese name learned where the catalogue writes it
beside the brand, "Nike/耐克"); highlights on Chinese words; analytics grouping one Chinese query
however it was typed (traditional, full-width, spaces); the UI's language."""

from __future__ import annotations

import pytest
from conftest import SOURCE
from fastapi.testclient import TestClient

KEY = {"X-API-Key": "s3cret"}

# A small Chinese shop: titles, categories and brands as Chinese shops write them.
ZH_SHOP = [
    ("Z1", "卡西欧 男士 黑色 手表 防水 石英表", "配饰 > 手表", "卡西欧"),
    ("Z2", "天梭 女士 手表 钢带 机械表", "配饰 > 手表", "天梭"),
    ("Z3", "Nike/耐克 男士 跑步鞋 透气 运动鞋", "鞋靴 > 运动鞋", "Nike/耐克"),
    ("Z4", "红色 连衣裙 夏季 雪纺 女装", "服装 > 连衣裙", "优衣库"),
    ("Z5", "黑色 手提包 真皮 女士 单肩包", "箱包 > 手提包", "小CK"),
    ("Z6", "Adidas/阿迪达斯 三叶草 男士 卫衣 连帽", "服装 > 卫衣", "Adidas"),
    ("Z7", "苹果 手机壳 硅胶 透明 防摔", "数码配件 > 手机壳", "倍思"),
    ("Z8", "男士 休闲 衬衫 长袖 纯棉", "服装 > 衬衫", "海澜之家"),
]

# Rows of the WANDS furniture catalogue (/work/shared/data/wands-dev/catalog.jsonl), as written there.
WANDS_ROWS = [
    {"id": "13", "title": "king tufted low profile standard bed",
     "category": ["Furniture", "Bedroom Furniture", "Beds & Headboards", "Beds"], "attributes": {"class": "Beds"}},
    {"id": "30", "title": "lugent 70.87 '' h x 70.87 '' w x 11.8 '' d steel etagere bookcase",
     "category": ["Furniture", "Living Room Furniture", "Bookcases"], "attributes": {"class": "Bookcases"}},
    {"id": "34", "title": "oversized osiris wall clock", "category": ["Décor & Pillows", "Clocks", "Wall Clocks"],
     "attributes": {"class": "Wall Clocks"}},
    {"id": "100", "title": "telemark 4 shelf etagere bookcase",
     "category": ["Furniture", "Living Room Furniture", "Bookcases"], "attributes": {"class": "Bookcases"}},
    {"id": "444", "title": "industrial vintage home office l-shape desk",
     "category": ["Furniture", "Office Furniture", "Desks"], "attributes": {"class": "Desks"}},
    {"id": "1190", "title": "mariel floating desk with hutch", "category": ["Furniture", "Office Furniture", "Desks"],
     "attributes": {"class": "Desks"}},
    {"id": "1477", "title": "kjellfrid 54.75 '' linen rolled arm curved loveseat",
     "category": ["Furniture", "Living Room Furniture", "Sofas"], "attributes": {"class": "Sofas"}},
    {"id": "17649", "title": "northstate mid-century modern light grey fabric upholstered loveseat",
     "category": ["Furniture", "Living Room Furniture", "Sofas"], "attributes": {"class": "Sofas"}},
    {"id": "18644", "title": "carolina 50.25 '' velvet recessed arm loveseat",
     "category": ["Furniture", "Living Room Furniture", "Sofas"], "attributes": {"class": "Sofas"}},
    {"id": "19078", "title": "micheals 95 '' genuine leather square arm sofa",
     "category": ["Furniture", "Living Room Furniture", "Sofas"], "attributes": {"class": "Sofas"}},
]


def _client(engine):
    from pydantic import SecretStr

    from vitrine.web.app import create_app

    engine.settings.web.api_key = SecretStr("s3cret")
    engine.settings.intent.intent_vocab_refresh_s = 0.0  # the slot vocabulary follows the writes at once
    return TestClient(create_app(engine=engine))


@pytest.fixture()
def zh_client(fresh_engine):
    with _client(fresh_engine) as c:
        for pid, title, category, brand in ZH_SHOP:
            r = c.put(f"/v1/products/{pid}", json={"id": pid, "title": title, "category": category, "brand": brand},
                      headers=KEY)
            assert r.status_code == 200, r.text
        yield c


@pytest.fixture()
def furniture_client(fresh_engine):
    with _client(fresh_engine) as c:
        for row in WANDS_ROWS:
            r = c.put(f"/v1/products/{row['id']}", json=row, headers=KEY)
            assert r.status_code == 200, r.text
        yield c


def texts(c: TestClient, q: str, k: int = 8) -> list[str]:
    r = c.get("/v1/suggest", params={"q": q, "k": k})
    assert r.status_code == 200, r.text
    return [s["text"] for s in r.json()["suggestions"]]


# -- pinyin, unit by unit ---------------------------------------------------------------------------
def test_pinyin_reads_typed_forms_against_a_words_readings():
    from vitrine.lang import pinyin

    watch = pinyin.syllables("手表")
    assert watch == [("shou",), ("biao",)] and pinyin.initials(watch) == "sb" and pinyin.full(watch) == "shoubiao"
    known = frozenset({"shou", "biao", "ti", "bao"})
    for typed in ("shoubiao", "sb", "shb", "shoub", "sbiao", "shou biao", "shou'biao", "手b", "手标"):
        assert any(pinyin.matches(u, watch) for u in pinyin.query_units(typed, known)), typed
    for typed in ("sbx", "tb", "手提"):
        assert not any(pinyin.matches(u, watch) for u in pinyin.query_units(typed, known)), typed
    assert "hang" in pinyin.readings("行") and "xing" in pinyin.readings("行")  # heteronyms kept


def test_pinyin_lookup_stops_early_but_finds_what_a_full_scan_finds(subset_rows):
    """The pinyin index verifies entries heaviest first and stops once it has ``k``: on the real
    subset written in Chinese (convert-fashion --language zh) every typed form of its phrases
    (whole pinyin, initials, mixed, a character then letters) gets exactly the first ``k`` of the
    full scan (``k`` past every entry)."""
    from vitrine.index import suggest
    from vitrine.ingest.fashion import to_record
    from vitrine.ingest.fashion_zh import renderer
    from vitrine.lang import pinyin

    r = renderer()
    idx = suggest.SuggestIndex(suggest.catalogue_phrases([r.record(to_record(row, "")) for row in subset_rows]))
    py = idx.pinyin()
    chinese = [t for t in idx.texts if pinyin.has_cjk(t)]
    assert py.chinese and len(chinese) > 100
    typed: set[str] = set()
    for p in chinese[::5]:
        chars = "".join(ch for ch in p if pinyin.is_cjk_char(ch))[:6]
        sylls = pinyin.syllables(chars)
        full, ini = pinyin.full(sylls), pinyin.initials(sylls)
        typed |= {full[:i] for i in range(2, len(full) + 1, 3)} | {ini[:i] for i in range(2, len(ini) + 1)}
        typed.add(chars[0] + pinyin.full(sylls[1:]))
    assert len(typed) > 200
    answered = 0
    for q in sorted(typed):
        every = py.lookup(q, 10**6)
        for k in (1, 8, 16):
            assert py.lookup(q, k) == every[:k], (q, k)
        answered += bool(every)
    assert answered > 0.75 * len(typed)  # a form made across a Latin word ("Q&Q 男士...") reads nothing

def test_chinese_then_pinyin_reads_the_characters_after_the_typed_ones(subset_rows):
    """"手b" on the real subset written in Chinese (convert-fashion --language zh): 手 as typed, b the
    start of the next syllable, so 手表 (shou-biao) and the phrases holding it come first; "Baggit
    ...手提包", found only because its Latin brand starts with b, after every one of them."""
    from vitrine.index import suggest
    from vitrine.ingest.fashion import to_record
    from vitrine.ingest.fashion_zh import renderer

    r = renderer()
    idx = suggest.SuggestIndex(suggest.catalogue_phrases([r.record(to_record(row, "")) for row in subset_rows]))
    assert [m.text for m in idx.lookup("手bi", 20)][0] == "手表"
    for q in ("手b", "手 b"):
        got = [m.text for m in idx.lookup(q, 20)]
        assert got[0] == "手表", (q, got)
        watches = [i for i, t in enumerate(got) if "手表" in t]
        baggit = [i for i, t in enumerate(got) if t.startswith("Baggit")]
        assert len(watches) >= 4 and baggit, (q, got)  # both readings still suggested ...
        assert max(watches) < min(baggit), (q, got)  # ... the pinyin of the characters first
    scores = {m.text: m.score for m in idx.lookup("手b", 20)}
    assert scores["手表"] > 2 and all(1 < v < 2 for t, v in scores.items() if t != "手表")
    got = idx.lookup("手t", 20)  # 手提包 (shou-ti-bao) before the titles of "Taj", "Toned", "Titan"
    assert [m.text for m in got[:2]] == ["手提包", "黑色 手提包"] and len(got) > 2, got
    assert all(1 < m.score < 1.5 for m in got[2:]), got


# -- suggestions through the API ----------------------------------------------------------------------
def test_chinese_shop_suggests_by_prefix_pinyin_initials_and_homophone(zh_client):
    c = zh_client
    assert texts(c, "手")[:1] == ["手表"] or "手表" in texts(c, "手")  # a Chinese prefix
    assert "手提包" in texts(c, "手") and "手机壳" in texts(c, "手")  # inside a run of characters too
    assert texts(c, "shoubiao")[0] == "手表"  # whole pinyin: the category first
    assert texts(c, "sb")[0] == "手表"  # initials
    assert texts(c, "shoub")[0] == "手表"  # mixed: a whole syllable, then an initial
    assert texts(c, "shou biao")[0] == "手表"  # syllables apart, as some input methods show them
    assert texts(c, "手b")[0] == "手表"  # characters, then letters still being typed (the next syllable)
    got = texts(c, "手标")  # a homophone the input method offered first: 标 (biao) for 表 (biao)
    assert got and got[0] == "手表" and "手标" not in got
    assert "手提包" in texts(c, "shoutibao") and "手提包" in texts(c, "stb")
    assert "连衣裙" in texts(c, "lianyiqun") and "连衣裙" in texts(c, "lyq")
    assert "运动鞋" in texts(c, "yundongxie")
    # a word inside a title is found from its start: "sb" finds the titles holding 手表 too
    assert any("手表" in t and t != "手表" for t in texts(c, "sb", 8))
    assert texts(c, "zzzq") == []  # letters that spell nothing here: nothing


def test_english_furniture_catalogue_suggests_its_categories_chinese_forms(furniture_client):
    c = furniture_client
    assert "沙发" in texts(c, "沙")  # Sofas' Chinese form, from the dictionary
    assert "沙发" in texts(c, "shafa") and "沙发" in texts(c, "sf")
    assert "书柜" in texts(c, "shugui")  # Bookcases
    assert "挂钟" in texts(c, "gz") or "挂钟" in texts(c, "guazhong")  # Wall Clocks
    # English first: a Latin prefix that completes English words keeps them ahead of pinyin
    got = texts(c, "so")
    assert got and got[0].lower().startswith("so")


# -- the lexicon ---------------------------------------------------------------------------------------
def test_lexicon_learns_a_brands_chinese_name_from_the_catalogue():
    from vitrine.intent import lexicon_zh
    from vitrine.intent.slots import SlotExtractor, Vocabulary

    learned = lexicon_zh.learn_pairs(["Air Max Nike/耐克 男士跑步鞋", "卡西欧（Casio）手表 男士", "plain title"])
    assert learned["nike"]["耐克"] == 1 and learned["casio"]["卡西欧"] == 1 and "plain title" not in learned
    vocab = Vocabulary.of(brands=["Nike", "Casio", "Bose"], categories=["Headphones"])
    # learned only: "Bose" has no pair in the titles; its dictionary name is not asked here
    forms = lexicon_zh.chinese_forms({"brand": ["Nike", "Casio"]}, ["Air Max Nike/耐克", "卡西欧（Casio）"],
                                     base={}, use_dictionary=False)
    assert forms == {"brand": {"Nike": ["耐克"], "Casio": ["卡西欧"]}}
    ex = SlotExtractor(vocab, lexicon_data=lexicon_zh.merged_lexicon(vocab, ["Air Max Nike/耐克"]))
    assert ex.extract("耐克跑步鞋").brand == ["Nike"]
    # a brand field written in both scripts names the brand by either
    both = Vocabulary.of(brands=["Nike/耐克"])
    ex = SlotExtractor(both, lexicon_data=lexicon_zh.merged_lexicon(both))
    assert ex.extract("耐克 跑鞋").brand == ["Nike/耐克"] and ex.extract("nike shoes").brand == ["Nike/耐克"]



def test_a_title_of_brand_and_chinese_words_teaches_no_brand_name(subset_rows):
    """A Chinese shop's title "Image 女士太阳镜" is a brand and what it sells, not the brand's
    Chinese name: on the bundled catalogue written in Chinese (convert-fashion --language zh), the
    query 女士太阳镜 read as brand Image and lost its gender and category slots."""
    from vitrine.bundled import read_styles
    from vitrine.ingest.fashion import to_record
    from vitrine.ingest.fashion_zh import renderer
    from vitrine.intent import lexicon_zh
    from vitrine.intent.slots import SlotExtractor, Vocabulary, key_norm

    r = renderer()
    image = [row for row in read_styles(SOURCE) if row["id"] in {"16937", "16939", "16957"}]
    rows = [r.record(to_record(row, "")) for row in [*subset_rows, *image]]
    titles = [row["title"] for row in rows]
    assert "Image 女士太阳镜" in titles and "Image 男士太阳镜" in titles  # the shop's own titles
    brands = sorted({str(row.get("brand") or row["title"].split()[0]) for row in rows})
    paired = [t for t in titles if lexicon_zh.learn_pairs([t], whole=True)]  # "Brand 中文..." titles
    assert len(paired) >= 10
    learned = lexicon_zh.learn_pairs(titles)
    for t in paired:
        latin, _, zh = t.partition(" ")
        assert zh not in learned.get(key_norm(latin), {}), t
    assert learned["nike"].most_common(1)[0][0] == "耐克"  # "Nike/耐克 ..." still names the brand
    # a name run on into what the product is ends where the lexicon's words begin, either side
    assert dict(lexicon_zh.learn_pairs(["Nike/耐克女士黑色手表", "男士耐克/Nike 跑鞋"])["nike"]) == {"耐克": 2}
    vocab = Vocabulary.of(brands=["Image", "Nike"], categories=sorted({c for row in rows for c in row["category"]}),
                          genders=sorted({row["attributes"]["gender"] for row in rows}))
    got = SlotExtractor(vocab, lexicon_data=lexicon_zh.merged_lexicon(vocab, titles)).extract("女士太阳镜")
    assert got.brand == [] and got.category == ["太阳镜"] and got.gender == ["女士"], got
    assert len(brands) > 20
def test_dictionary_gives_any_catalogues_values_chinese_forms():
    from vitrine.intent import lexicon_zh

    assert lexicon_zh.dictionary_forms("Sofas", "category")[0] == "沙发"
    assert "书柜" in lexicon_zh.dictionary_forms("Bookcases", "category")
    assert lexicon_zh.dictionary_forms("Wall Clocks", "category") == ["挂钟"]
    assert "衣柜" in lexicon_zh.dictionary_forms("Armoires & Wardrobes", "category")  # a side of "A & B"
    assert "手表" in lexicon_zh.dictionary_forms("Wristwatch", "category")
    assert lexicon_zh.dictionary_forms("Watches", "category") == []  # "to watch" is a verb: no form
    assert lexicon_zh.dictionary_forms("Nike", "brand") == ["耐克"]  # a name: brands only
    assert lexicon_zh.dictionary_forms("Nike", "category") == []


def test_chinese_slots_on_a_furniture_catalogue(furniture_client, fresh_engine):
    ex = fresh_engine.understanding.extractor()
    assert ex.extract("沙发").category == ["Sofas"]
    assert ex.extract("灰色沙发").category == ["Sofas"]
    assert ex.extract("书柜").category == ["Bookcases"]
    assert ex.extract("挂钟").category == ["Wall Clocks"]
    assert ex.extract("书桌").category == ["Desks"]
    r = furniture_client.post("/v1/search", json={"text": "沙发", "k": 5})
    assert r.status_code == 200, r.text
    assert r.json()["slots"].get("category") == "Sofas"


def test_chinese_shop_slots_learned_from_its_own_pairs(zh_client, fresh_engine):
    ex = fresh_engine.understanding.extractor()
    # learned from the title "Adidas/阿迪达斯 ..." (or the lexicon's ADIDAS, where the graph names it so)
    assert [b.casefold() for b in ex.extract("阿迪达斯卫衣").brand] == ["adidas"]
    # the brand field "Nike/耐克" (the graph's brand lexicon may name it "Nike", read from the titles)
    assert [b.split("/")[0] for b in ex.extract("耐克跑步鞋").brand] == ["Nike"]


def test_a_brand_written_with_its_chinese_name_is_found_by_either_name(zh_client):
    """The record writes its brand "Nike/耐克": the Chinese name, the Latin one and either with a
    product word all find it first, through the API."""
    for text in ("耐克", "Nike", "nike", "耐克跑步鞋", "Nike 跑步鞋"):
        r = zh_client.post("/v1/search", json={"text": text, "k": 5})
        assert r.status_code == 200, r.text
        assert [h["id"] for h in r.json()["results"]][:1] == ["Z3"], text


# -- highlights --------------------------------------------------------------------------------------
def test_highlights_mark_chinese_words_in_chinese_titles(zh_client):
    r = zh_client.post("/v1/search", json={"text": "男士手表", "k": 8, "highlight": True})
    assert r.status_code == 200, r.text
    hits = {h["id"]: h for h in r.json()["results"]}
    assert "Z1" in hits
    title = hits["Z1"]["title"]
    marked = [title[s["start"]:s["end"]] for s in hits["Z1"]["highlights"]["title"]]
    assert marked == ["男士", "手表"]
    for h in hits.values():  # every marked piece is a query word, never a whole run of characters
        for s in h["highlights"]["title"]:
            assert h["title"][s["start"]:s["end"]] in {"男士", "手表", "男士手表"}


def test_highlighter_merges_and_keeps_latin_words():
    from vitrine.search.storefront import Highlighter

    h = Highlighter("Nike 跑步鞋")
    title = "Nike/耐克 男士 跑步鞋 透气"
    got = [title[s.start:s.end] for s in h.spans(title)]
    assert got == ["Nike", "跑步鞋"]
    assert Highlighter("的").spans("我的手表") == []  # a function character alone is never marked


# -- analytics ---------------------------------------------------------------------------------------
def test_one_chinese_query_however_typed():
    from vitrine.index.querytext import normalise_query

    forms = ["男士手表", "男士手錶", "男士 手表", " 男士　手錶！", "男士手表。"]
    assert {normalise_query(f) for f in forms} == {"男士手表"}
    assert normalise_query("ＮＩＫＥ 跑步鞋") == normalise_query("nike 跑步鞋") == "nike 跑步鞋"
    assert normalise_query("紅色連衣裙") == "红色连衣裙"
    assert normalise_query("Red  Shoes!") == "red shoes"  # English as before


def test_analytics_group_chinese_queries(zh_client, fresh_engine):
    typed = ["男士手表", "男士手錶", "男士 手表", "男士手表！", "红色连衣裙", "紅色連衣裙"]
    for i, q in enumerate(typed):
        r = zh_client.post("/v1/search", json={"text": q, "k": 5, "user": f"u{i}"})
        assert r.status_code == 200, r.text
    rep = zh_client.get("/v1/analytics", params={"top": 50}, headers=KEY).json()
    counts = {q["query"]: q["searches"] for q in rep["top_queries"]}
    raw = fresh_engine.feedback.log.read()  # the brute force: the raw log's texts, grouped by hand
    by_hand: dict[str, int] = {}
    for s in raw.searches:
        key = {"男士手表": "男士手表", "男士手錶": "男士手表", "男士 手表": "男士手表", "男士手表！": "男士手表",
               "红色连衣裙": "红色连衣裙", "紅色連衣裙": "红色连衣裙"}[s.text]
        by_hand[key] = by_hand.get(key, 0) + 1
    assert counts == by_hand == {"男士手表": 4, "红色连衣裙": 2}
    assert rep["distinct_queries"] == 2


# -- the UI ----------------------------------------------------------------------------------------------
def test_ui_config_says_the_catalogues_language(zh_client, client_en):
    zh = zh_client.get("/v1/ui/config").json()
    assert zh["language"] == "zh"
    chinese = [e for e in zh["examples"] if any("\u4e00" <= ch <= "\u9fff" for ch in e)]
    assert zh["examples"] and len(chinese) * 2 >= len(zh["examples"])  # its own words (a brand may be Latin)
    en = client_en.get("/v1/ui/config").json()
    assert en["language"] == "en"
    page = zh_client.get("/static/i18n.js").text
    assert '"搜索"' in page and "zh:" in page and "en:" in page


@pytest.fixture()
def client_en(engine):
    from vitrine.web.app import create_app

    with TestClient(create_app(engine=engine)) as c:
        yield c


@pytest.fixture(scope="module")
def shop(engine):
    """The conftest's real subset (English titles) through the HTTP API."""
    from vitrine.web.app import create_app

    with TestClient(create_app(engine=engine)) as c:
        yield c


def test_chinese_session_cues_refine_exclude_and_reset(shop, subset_rows):
    """A Chinese shopping session: "男士T恤", then "不要耐克" (exclude the brand), "重新开始" (reset);
    the next Chinese query is a new search that finds its products. Another: "男士皮鞋", then
    "要棕色的" (refine the colour)."""
    import uuid

    sid = "zh-" + uuid.uuid4().hex[:10]
    rows = {r["id"]: r for r in subset_rows}

    def ask(text: str, session: str = sid) -> dict:
        r = shop.post("/v1/search", json={"text": text, "k": 10, "session": session})
        assert r.status_code == 200, r.text
        return r.json()

    def types(out: dict) -> list[str]:
        return [rows[h["id"]]["articleType"] for h in out["results"]]

    first = ask("男士T恤")
    assert first["session"]["new_search"] is True and types(first).count("Tshirts") >= 8
    assert any(h["title"].startswith("Nike") for h in first["results"])  # the subset's men's T-shirts: 7 Nike
    no_nike = ask("不要耐克")
    assert no_nike["session"]["new_search"] is False
    assert no_nike["session"]["filters"]["exclude"] == {"brand": ["Nike"]}
    assert no_nike["results"] and not any(h["title"].startswith("Nike") for h in no_nike["results"])
    assert types(no_nike).count("Tshirts") >= 8
    reset = ask("重新开始")
    assert reset["session"]["new_search"] is True
    after = ask("女士手表")
    assert after["session"]["new_search"] is True
    assert "exclude" not in after["session"]["filters"] and "colour" not in after["session"]["filters"]
    watches = {i for i, r in rows.items() if r["articleType"] == "Watches" and r["gender"] == "Women"}
    assert len({h["id"] for h in after["results"]} & watches) >= min(5, len(watches))
    # another session: men's formal shoes (black and brown in the subset), then "the brown ones"
    other = "zh-" + uuid.uuid4().hex[:10]
    shoes = ask("男士皮鞋", other)
    assert types(shoes).count("Formal Shoes") >= 3
    brown = ask("要棕色的", other)
    assert brown["session"]["new_search"] is False and brown["session"]["filters"]["colour"] == "Brown"
    browns = {i for i, r in rows.items() if r["articleType"] == "Formal Shoes" and r["baseColour"] == "Brown"}
    assert browns and {h["id"] for h in brown["results"][:len(browns)]} == browns
