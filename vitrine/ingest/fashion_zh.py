"""A Chinese-titled variant of the bundled catalogue (``vitrine convert-fashion --language zh``).

The seeds' own case is a shop whose titles, categories and attributes are written in Chinese. This
module writes one from the bundled data, photos kept, so the Chinese side can be measured on the
same products and judgements as the English one (``vitrine eval --protocol zh`` on its data dir).

Each English phrase is rendered by, in order:

1. the intent lexicon's Chinese form of a gender, colour or article type ("Navy Blue" -> "海军蓝",
   "Track Pants" -> its first Chinese form);
2. the shop-word table read backwards (``vitrine/lang/data/shop_words.json``: "watch" -> "手表");
3. CC-CEDICT read backwards: the Chinese words whose *first* sense begins with the English word,
   the most frequent in jieba's dictionary first ("shirt" -> "衬衫").

A title's brand (a lexicon brand at its start, else its first word) stays as written, as
"Nike/耐克" where the lexicon knows its Chinese name; a word none of the three knows stays English
(model names, numbers). Chinese words are written together, English ones apart:
"Nike Men Black Running Shoes" -> "Nike/耐克 男士黑色跑步鞋".
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from vitrine.atomic import atomic_path
from vitrine.ingest.fashion import photo_prefix, styles_of, to_record
from vitrine.intent.slots import lexicon
from vitrine.lang import cedict, segment
from vitrine.lang.translate import content_words, gloss_phrases, shop_words

log = logging.getLogger(__name__)

MAX_PHRASE = 4  # words of the longest English phrase looked up whole
# the converter's own words: catalogue words whose first dictionary sense is another one ("fall" the
# season, "check" the pattern) and the bundled catalogue's category names the lexicon lacks
FASHION_WORDS = {
    "fall": "秋季", "spring": "春季", "summer": "夏季", "winter": "冬季", "printed": "印花", "print": "印花",
    "check": "格子", "checked": "格子", "solid": "纯色", "striped": "条纹", "stripes": "条纹", "dial": "表盘",
    "ethnic": "民族风", "smart casual": "商务休闲", "formal": "正装", "party": "派对", "travel": "旅行", "home": "居家",
    "topwear": "上装", "bottomwear": "下装", "innerwear": "内衣", "loungewear and nightwear": "家居服",
    "apparel": "服装", "accessories": "配饰", "footwear": "鞋履", "personal care": "个人护理", "fragrance": "香水",
    "eyewear": "眼镜", "headwear": "帽子", "shoes": "鞋子", "bags": "包包", "apparel set": "服装套装",
    "kurta sets": "库尔塔套装", "tunics": "束腰上衣", "tunic": "束腰上衣", "graphic": "图案", "washed": "水洗",
    "round neck": "圆领", "v neck": "V领", "polo": "polo", "jersey": "球衣", "length": "长度", "kids": "儿童",
}
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9'&.+-]*")
_lock = threading.Lock()
_renderer: ChineseRenderer | None = None


def _zh_form(forms: Iterable[str]) -> str | None:
    """A lexicon value's first Chinese form of two characters or more."""
    for f in forms:
        if segment.has_cjk(f) and len(f) > 1:
            return f
    return None


def _norm(phrase: str) -> str:
    return " ".join(re.sub(r"[-_/]", " ", phrase.lower().replace("'s", "s")).split())


class ChineseRenderer:
    """English catalogue text -> Chinese, from the lexicon, the shop words and CC-CEDICT."""

    def __init__(self) -> None:
        lex = lexicon()
        self.brands: dict[str, str] = {}  # brand (lower) -> as written in a Chinese title
        for value, forms in lex.get("brand", {}).items():
            zh = _zh_form(forms)
            written = f"{value}/{zh}" if zh else value
            self.brands[_norm(value)] = written
        self.phrases: dict[str, str] = dict(FASHION_WORDS)  # English phrase -> Chinese
        for fld in ("gender", "colour", "category"):
            for value, forms in lex.get(fld, {}).items():
                zh = _zh_form(forms)
                if not zh:
                    continue
                for f in [value, *forms]:
                    if not segment.has_cjk(f):
                        self.phrases.setdefault(_norm(f), zh)
        for zh, glosses in shop_words().items():  # the table backwards: its first gloss
            if glosses and len(zh) > 1:
                self.phrases.setdefault(_norm(glosses[0]), zh)
        self.words = self._dictionary_backwards()

    @staticmethod
    def _dictionary_backwards() -> dict[str, str]:
        """English word -> the most frequent Chinese word whose first sense starts with it."""
        freq = segment.tokenizer().FREQ
        best: dict[str, tuple[int, str]] = {}
        for zh, senses in cedict.dictionary().glosses.items():
            if not (1 < len(zh) <= 4) or not all(segment.has_cjk(ch) for ch in zh) or not senses:
                continue
            phrases = gloss_phrases(senses[0])
            if not phrases:
                continue
            words = content_words(phrases[0])
            if len(words) != 1:
                continue
            f = int(freq.get(zh, 0))
            cur = best.get(words[0])
            if cur is None or f > cur[0]:
                best[words[0]] = (f, zh)
        return {w: zh for w, (_, zh) in best.items()}

    def phrase(self, words: list[str]) -> tuple[str | None, int]:
        """The longest phrase at the start of ``words`` the tables know: (Chinese, words used)."""
        for n in range(min(MAX_PHRASE, len(words)), 0, -1):
            key = _norm(" ".join(words[:n]))
            zh = self.phrases.get(key)
            if zh is None and n == 1:
                zh = self.words.get(key)
                if zh is None and key.endswith("s") and len(key) > 3:  # plurals: "shirts" -> "shirt"
                    zh = self.phrases.get(key[:-1]) or self.words.get(key[:-1]) \
                        or (self.words.get(key[:-2]) if key.endswith("es") else None)
            if zh is not None:
                return zh, n
        return None, 1

    def text(self, english: str, *, brand: bool = False) -> str:
        """``english`` in Chinese; ``brand``: its leading brand stays as written ("Nike/耐克")."""
        raw = _TOKEN.findall(english)
        parts: list[str] = []
        i = 0
        if brand and raw and _norm(raw[0]) not in self.brands and "-" in raw[0]:  # "Ray-Ban": one brand word
            parts.append(raw.pop(0))
            brand = False
        words: list[str] = []
        for w in raw:  # "Kids-Unisex" -> two words, "T-shirt" stays one where the tables know it
            known = _norm(w) in self.phrases or _norm(w) in self.brands
            words.extend([w] if known or "-" not in w else [x for x in w.split("-") if x])
        if brand and words:
            for n in range(min(MAX_PHRASE, len(words)), 0, -1):
                written = self.brands.get(_norm(" ".join(words[:n])))
                if written is not None:
                    parts.append(written)
                    i = n
                    break
            else:
                parts.append(words[0])
                i = 1
        while i < len(words):
            w = words[i]
            if any(ch.isdigit() for ch in w):
                parts.append(w)
                i += 1
                continue
            zh, n = self.phrase(words[i:])
            parts.append(zh if zh is not None else w)
            i += n
        out = ""
        for p in parts:  # Chinese written together, English apart
            if out and not (segment.has_cjk(p[0]) and segment.has_cjk(out[-1])):
                out += " "
            out += p
        return out

    def record(self, rec: dict[str, Any]) -> dict[str, Any]:
        """A catalogue record (as :func:`vitrine.ingest.fashion.to_record` writes it) in Chinese."""
        attrs = {k: (v if k == "year" else self.text(str(v))) for k, v in rec.get("attributes", {}).items()}
        return {**rec, "title": self.text(rec["title"], brand=True),
                "category": [self.text(c) for c in rec.get("category", [])], "attributes": attrs}


def renderer() -> ChineseRenderer:
    global _renderer
    with _lock:
        if _renderer is None:
            _renderer = ChineseRenderer()
        return _renderer


def convert_zh(source: Path, out: Path, ids: Iterable[str] | None = None) -> int:
    """Write the Chinese-titled catalogue as JSONL at ``out`` (ids and photos as the English one's,
    placed beside ``out`` as :func:`~vitrine.ingest.fashion.convert` does)."""
    source, out = Path(source), Path(out)
    rows = styles_of(source, ids)
    out.parent.mkdir(parents=True, exist_ok=True)
    rel = photo_prefix(source, out, [row["id"] for row in rows])
    r = renderer()
    with atomic_path(out, fsync=False) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(r.record(to_record(row, f"{rel}/{row['id']}.jpg")), ensure_ascii=False) + "\n")
    return len(rows)
