"""Chinese words onto a catalogue's own English vocabulary (CC-CEDICT + a small table of shop words).

A query such as "男士手表" is cut into the dictionary's words (CC-CEDICT, :mod:`vitrine.lang.cedict`,
and the hand-written shop words of ``data/shop_words.json``, which CC-CEDICT lacks or glosses in
another sense first), choosing the cut under which most of the query reads as the *catalogue's own*
words (its BM25 terms, each with how many products hold it): "四柱床" -> "四柱床" (shop words:
"poster bed") rather than "四柱" + "床"; "手表" -> "wristwatch", and a catalogue without
"wristwatch" but with "wrist" and "watch" reads "wrist watch". The English text then runs the same
pipeline as an English query.

How a word's English is chosen: each sense ``i`` (in the dictionary's order) is cut into phrases
at ";" and ","; parentheses either join ("(hand)bag" -> "handbag") or drop ("red (color)" ->
"red"); leading "to "/"a " and words such as "sb"/"sth" go. A phrase's score is the share of its
content words the catalogue holds (a dictionary's American spelling meets a catalogue's British
one), squared (a phrase read in part, "iris family" as "family", is a weak reading), times
``1 / (1 + 0.25 i)`` (earlier senses are the usual ones), times the catalogue's own prior for the
phrase: ``(1 + products per thousand holding it, at most PRIOR_CAP) ** SENSE_PRIOR`` (what this
catalogue sells is what its shoppers most likely mean: "圆" reads "round", its second sense, on a
catalogue with ten times more "round" than "circle"; "储物柜" reads "cabinet" rather than "locker"),
and a verb sense ("to assemble") weighs :data:`VERB_SENSE` beside a word's noun senses (a query names
things: "组合" reads "set" too); the best phrase is kept, and
the next ones too when they score within 90% of the best (both "handbag" and "bag": alternatives BM25
ORs). A single character is read by its first two senses only (its later ones belong to other
words). A word the dictionary has but whose senses the catalogue lacks stays unread ("硬币", coin, on
a furniture catalogue), and so do words like "要". Function characters standing alone (:data:`FUNCTION`:
"带" as *with*, "的", measure words, the suffixes "形"/"式" of "X-shaped", "X-style") read as nothing,
and a decade ("70年代") as the English one ("70s").

Nothing here knows a catalogue's storage: the caller hands the vocabulary (term -> products) and
the function that turns an English word into the vocabulary's terms (the BM25 stemmer).
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from vitrine.lang import cedict, segment

log = logging.getLogger(__name__)

SHOP_WORDS = Path(__file__).with_name("data") / "shop_words.json"
_EN_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
_PAREN_JOIN = re.compile(r"\(([a-z]+)\)(?=[a-z])|(?<=[a-z])\(([a-z]+)\)")
_PAREN = re.compile(r"\([^)]*\)")
_SKIP_SENSE = re.compile(r"^(surname|variant of|old variant|see |abbr\.|used in|classifier|also written|"
                         r"erhua variant|japanese variant|\(tw\)|\(old\)|\(archaic\)|\(dialect\)|\(literary\)|"
                         r"\(internet slang\)|\(coll\.\)|\(slang\))", re.I)
STOPWORDS = frozenset({
    "a", "an", "the", "of", "for", "to", "and", "or", "in", "on", "with", "by", "at", "as", "from", "into", "one",
    "sb", "sth", "sb's", "oneself", "one's", "etc", "esp", "eg", "ie", "e", "g", "kind", "type", "form", "bound",
    "is", "be", "it", "its", "that", "this", "someone", "something", "loanword", "lit", "fig", "usu", "certain",
    "color", "colour", "colored", "coloured",
})
# spellings a dictionary and a catalogue may disagree on (CC-CEDICT writes American English)
SPELLINGS = {"gray": "grey", "grey": "gray", "color": "colour", "colour": "color", "jewelry": "jewellery",
             "jewellery": "jewelry", "favorite": "favourite", "center": "centre", "centre": "center",
             "theater": "theatre", "aluminum": "aluminium", "aluminium": "aluminum", "pajamas": "pyjamas",
             "pyjamas": "pajamas", "mustache": "moustache", "catalog": "catalogue"}
SHARE_SECOND = 0.9  # a further phrase is kept when it scores within this share of the best
MAX_WORD = 8  # the longest dictionary word a query is cut into
# The weight of a catalogue's own frequency in choosing among a word's senses: a sense one step later in
# the dictionary's order (factor 1 / 1.25) wins when the catalogue holds its phrase ~2.5 times as often.
SENSE_PRIOR = 0.25
# ... up to this many products per thousand: a phrase one product in a hundred holds is something the
# catalogue sells, and more of it says nothing of which sense a shopper means ("粉色", pink, stays pink
# on a catalogue with more white than pink; "圆" reads "round" where "circle" is rare).
PRIOR_CAP = 10.0
VERB_SENSE = 0.7  # a verb sense's weight beside a word's noun senses
# Characters that, standing alone between a query's words, carry grammar, not a product word: particles
# and conjunctions, "带"/"配"/"含" (with), measure words, and the suffixes of "X-shaped", "X-style",
# "X-type" (a word that holds them, "皮带", "款式", is read whole as a dictionary word first).
FUNCTION = frozenset("的地得之了着和与及或并带配含附个件张把只条支根块盏款式型形状类")
# Instrument suffixes: a word the dictionary lacks, a verb and one of these, names the verb's agent noun
# ("喂食器", feed + device: "feeder"; "切割机", cut + machine: "cutter").
AGENT = frozenset("器机")
_DECADE = re.compile(r"(\d{2,4})\s*年代")


@lru_cache(maxsize=1)
def shop_words() -> dict[str, list[str]]:
    """The hand-written table: shop words CC-CEDICT lacks or glosses in another sense first."""
    data = json.loads(SHOP_WORDS.read_text(encoding="utf-8"))
    return {k: list(v) for k, v in data.items() if not k.startswith("_")}


def gloss_phrases(gloss: str) -> list[str]:
    """The candidate English phrases of one dictionary sense ("(hand)bag" -> ["handbag", "bag"])."""
    g = gloss.strip().lower()
    if not g or _SKIP_SENSE.match(g):
        return []
    out: list[str] = []
    for part in re.split(r"[;,]", g):
        part = part.strip()
        joined = _PAREN_JOIN.sub(lambda m: m.group(1) or m.group(2), part)
        for cand in dict.fromkeys([joined, part]):
            cand = _PAREN.sub(" ", cand)
            cand = re.sub(r"^(to|a|an|the) ", "", cand.strip())
            cand = " ".join(cand.replace("-", " ").split())
            if cand and cand not in out:
                out.append(cand)
    return out


def content_words(phrase: str) -> list[str]:
    return [w for w in _EN_WORD.findall(phrase.lower()) if w not in STOPWORDS]


@dataclass
class WordReading:
    """One Chinese word of a query and the catalogue words it was read as (``via``: ``table``,
    ``dictionary``, ``parts``: its parts were read; ``kept``: not Chinese; ``function``: a grammar
    character, read as nothing; ``unread``: nothing)."""

    word: str
    english: list[str] = field(default_factory=list)
    via: str = "dictionary"

    def as_dict(self) -> dict[str, Any]:
        return {"word": self.word, "english": list(self.english), "via": self.via}


@dataclass
class Translation:
    """A query's English reading: ``text`` (what the pipeline searches) and its words."""

    source: str
    text: str
    words: list[WordReading]

    @property
    def unread(self) -> list[str]:
        return [w.word for w in self.words if w.via == "unread"]

    @property
    def read_share(self) -> float:
        """Share of the query's Chinese words (function characters aside) read as catalogue words."""
        zh = [w for w in self.words if w.via not in ("kept", "function")]
        return 1.0 if not zh else sum(1 for w in zh if w.english) / len(zh)

    def explain(self) -> list[dict[str, Any]]:
        return [w.as_dict() for w in self.words]


class Translator:
    """Chinese -> the English words of one catalogue. ``terms``: the catalogue's terms (as
    ``stem`` makes them) and how many products hold each; ``n_docs``: products in all."""

    def __init__(self, terms: Mapping[str, int], stem: Callable[[str], Sequence[str]], n_docs: int,
                 second_share: float | None = SHARE_SECOND, *, sense_prior: float = SENSE_PRIOR,
                 grammar: bool = True, table: Mapping[str, Sequence[str]] | None = None) -> None:
        self.terms = terms
        self.table = table or {}  # more shop words (a lexicon's Chinese forms of catalogue values), after the table's
        self.second_share = second_share  # None: a word's best phrase only (:mod:`vitrine.lang.render`)
        self.sense_prior = sense_prior  # 0: the dictionary's sense order alone
        self.grammar = grammar  # read function characters as nothing and decades as English
        self.stem = stem
        self.n_docs = max(1, int(n_docs))
        self._words: dict[str, tuple[list[str], str, float]] = {}
        self._stems: dict[str, tuple[str, ...]] = {}
        # shop words written in Latin letters and Chinese together ("T恤"): read whole, longest first,
        # before the text is cut where the characters change ("T" kept and "恤" unread otherwise)
        mixed = sorted((w for w in {*shop_words(), *self.table} if segment.has_cjk(w) and re.search("[a-z0-9]", w)),
                       key=len, reverse=True)
        self._mixed = re.compile("(" + "|".join(map(re.escape, mixed)) + ")", re.IGNORECASE) if mixed else None

    # -- one English word against the catalogue ----------------------------------------------------
    def _df(self, word: str) -> int:
        """Products holding ``word`` (0: the catalogue lacks it); a word FTS splits needs every part."""
        st = self._stems.get(word)
        if st is None:
            st = self._stems[word] = tuple(self.stem(word))
        if not st:
            return 0
        return min(int(self.terms.get(t, 0)) for t in st)

    def _catalogue_words(self, word: str) -> list[str]:
        """``word`` when the catalogue holds it, else its split into two catalogue words
        ("wristwatch" -> ["wrist", "watch"]), else nothing."""
        if self._df(word):
            return [word]
        other = SPELLINGS.get(word)
        if other and self._df(other):
            return [other]
        for i in range(len(word) - 4, 3, -1):  # both parts of four letters or more ("app" + "ear" is no split)
            a, b = word[:i], word[i:]
            if self._df(a) and self._df(b):
                return [a, b]
        return []

    # -- one Chinese word ---------------------------------------------------------------------------
    def _score(self, phrase: str, sense: int) -> tuple[float, list[str]]:
        words = content_words(phrase)
        if not words:
            return 0.0, []
        got: list[str] = []
        hit = 0
        dfs: list[int] = []
        for w in words:
            cw = self._catalogue_words(w)
            if cw:
                hit += 1
                got.extend(cw)
                dfs.append(min(self._df(x) for x in cw))
        if not hit:
            return 0.0, []
        coverage = hit / len(words)
        length = 1.0 if len(words) <= 3 else 0.6
        rate = min(dfs) * 1000.0 / self.n_docs  # products per thousand holding the phrase's rarest word
        common = (1.0 + 0.05 * math.log1p(rate)) * (1.0 + min(rate, PRIOR_CAP)) ** self.sense_prior
        return coverage * coverage * length * common / (1.0 + 0.25 * sense), got

    def _read(self, glosses: Sequence[str]) -> tuple[float, list[str]]:
        """The best phrases of a word's glosses in the catalogue's words, and the best one's score."""
        scored: list[tuple[float, int, list[str]]] = []
        verbs = [g.strip().lower().startswith("to ") for g in glosses]
        # a query names things: where a word has noun senses too, its verb senses come after them
        # ("组合": "to assemble", ... "set")
        verb_weight = VERB_SENSE if self.grammar and not all(verbs) else 1.0
        for i, g in enumerate(glosses):
            for p in gloss_phrases(g):
                s, got = self._score(p, i)
                s *= verb_weight if verbs[i] else 1.0
                if s > 0:
                    scored.append((s, -len(scored), got))
        if not scored:
            return 0.0, []
        scored.sort(reverse=True)
        best = scored[0][0]
        out: list[str] = []
        for s, _, got in scored[:3]:
            if out and (self.second_share is None or s < self.second_share * best):
                break
            for w in got:
                if w not in out:
                    out.append(w)
            if len(out) >= 3:
                break
        return best, out

    def word(self, zh: str) -> tuple[list[str], str, float]:
        """One Chinese word's catalogue words, how they were found (``table``, ``dictionary``;
        ``known``: the dictionary has it but the catalogue lacks its senses; ``unread``), and the
        segmentation score of reading it so (:meth:`pieces`)."""
        got = self._words.get(zh)
        if got is not None:
            return got
        n = len(zh)
        q, via = 0.0, "unread"
        eng: list[str] = []
        if self.grammar and zh in FUNCTION:  # grammar between words: read as nothing, but read
            out = self._words[zh] = ([], "function", 0.6)
            return out
        table = shop_words().get(zh) or self.table.get(zh)
        if table:
            q, eng = self._read(table)
            via = "table"
        entry = cedict.glosses(zh)
        if not eng:
            # a single character by its first senses only: its later ones are parts of other words
            q, eng = self._read(entry if n > 1 else [g for g in entry if not _SKIP_SENSE.match(g.strip())][:2])
            via = "dictionary" if eng else ("known" if entry and n > 1 else "unread")
        if not eng and not entry and n > 2 and zh[-1] in AGENT:
            eng = self._agent(zh[:-1])  # "喂食器": feed + 器 -> "feeder"
            q, via = (1.0, "parts") if eng else (q, via)
        if eng:
            score = (0.6 if n == 1 else n * n) * (0.5 + 0.5 * min(1.0, q))
        elif via == "known":
            score = 0.4 * n * n  # a word the dictionary knows names something the catalogue lacks
        else:
            score = 0.0
        out = self._words[zh] = (eng, via, score)
        return out

    def _agent(self, verb: str) -> list[str]:
        """The catalogue's agent noun of a Chinese verb ("喂食" -> "feeder"), for a word the dictionary
        lacks that is the verb and an instrument suffix (:data:`AGENT`); [] when the catalogue has none."""
        for gloss in cedict.glosses(verb)[:3]:
            for phrase in gloss_phrases(gloss):
                words = content_words(phrase)
                if not words:
                    continue
                v = words[-1]
                forms = [v + "er", v + "r"] if v.endswith("e") else [v + "er", v + v[-1] + "er"]
                if v.endswith("y"):
                    forms.append(v[:-1] + "ier")
                for form in forms:
                    if self._df(form):
                        return [*words[:-1], form]
        return []

    def pieces(self, run: str) -> list[str]:
        """A run of Chinese characters cut into the dictionary's words so that as much of it as
        possible reads as catalogue words (dynamic programming: a word of n characters that reads
        scores n * n, one the dictionary knows but the catalogue lacks 0.4 n * n, a single
        character at most 0.6; fewer pieces break ties)."""
        n = len(run)
        best = [0.0] + [-1e9] * n
        back = [0] * (n + 1)
        for i in range(1, n + 1):
            for j in range(max(0, i - MAX_WORD), i):
                cand = best[j] + self.word(run[j:i])[2] - 0.01
                if cand > best[i]:
                    best[i], back[i] = cand, j
        out: list[str] = []
        i = n
        while i > 0:
            out.append(run[back[i]:i])
            i = back[i]
        return out[::-1]

    # -- a query ------------------------------------------------------------------------------------
    def translate(self, text: str) -> Translation:
        readings: list[WordReading] = []
        text = decades(text) if self.grammar else text
        chunks = self._mixed.split(text) if self._mixed is not None else [text]
        parts = [p for i, chunk in enumerate(chunks)
                 for p in ([chunk] if i % 2 else re.split(f"([{segment.CJK}]+)", chunk))]
        for part in parts:
            if not part.strip():
                continue
            if self._mixed is not None and self._mixed.fullmatch(part) and segment.has_cjk(part):
                eng, via, _ = self.word(part.lower())
                readings.append(WordReading(part, list(eng), "unread" if via == "known" else via))
                continue
            if not segment.has_cjk(part):
                readings.extend(WordReading(w, [w], "kept") for w in segment.words(part))
                continue
            for piece in self.pieces(part):
                eng, via, _ = self.word(piece)
                readings.append(WordReading(piece, list(eng), "unread" if via == "known" else via))
        english = " ".join(e for r in readings for e in r.english)
        return Translation(source=text, text=english, words=readings)


def decades(text: str) -> str:
    """A decade written the Chinese way as the English one: "70年代风格" -> "70s 风格"."""
    return _DECADE.sub(lambda m: f" {m.group(1)}s ", text) if "年代" in text else text


def cjk_share(terms: Mapping[str, int]) -> float:
    """Share of a vocabulary's product-word occurrences that are Chinese (0 for an English catalogue)."""
    total = zh = 0
    for t, n in terms.items():
        total += n
        if segment.has_cjk(t):
            zh += n
    return zh / total if total else 0.0


class ToChinese:
    """English query words onto a Chinese catalogue's own words (the reverse of :class:`Translator`):
    each English word becomes the catalogue's Chinese word whose dictionary sense is that word
    ("black handbag" -> 黑色 手提包 on a shop whose titles say 黑色手提包). ``terms``: the catalogue's
    terms and how many products hold each; ``stem``: English word -> its terms (the BM25 stemmer),
    so "handbags" meets a sense "handbag"; ``table``: more shop words, as :class:`Translator`'s.
    Among the catalogue words one English word names, the one whose sense comes first wins, then
    the one more products hold."""

    def __init__(self, terms: Mapping[str, int], stem: Callable[[str], Sequence[str]],
                 table: Mapping[str, Sequence[str]] | None = None) -> None:
        self.stem = stem
        found: dict[tuple[str, ...], tuple[int, int, str]] = {}
        shop, more = shop_words(), table or {}
        vocab = dict(terms)
        for zh in [*shop, *more]:  # a shop word the index holds in parts ("t恤": "t" and "恤")
            parts = re.findall(f"[a-z0-9]+|[{segment.CJK}]+", zh)
            if zh not in vocab and len(parts) > 1 and all(terms.get(p, 0) for p in parts):
                vocab[zh] = min(int(terms[p]) for p in parts)
        for zh, df in vocab.items():
            if not segment.segment_worthy(zh):
                continue
            glosses = shop.get(zh) or more.get(zh) or cedict.glosses(zh)
            for i, g in enumerate(glosses[:3]):
                for phrase in gloss_phrases(g):
                    words = content_words(phrase)
                    if not 0 < len(words) <= 2:
                        continue
                    key = self._key(words)
                    cand = (i, -int(df), zh)
                    if key and (key not in found or cand < found[key]):
                        found[key] = cand
        self.words = {k: v[2] for k, v in found.items()}

    def _key(self, words: Sequence[str]) -> tuple[str, ...]:
        return tuple(t for w in words for t in self.stem(w))

    def translate(self, text: str) -> Translation:
        """``text``'s words read as the catalogue's Chinese words (two-word senses first, "flip
        flops" -> 人字拖); a word none names is kept as typed (a brand, a model)."""
        words = segment.words(text)
        readings: list[WordReading] = []
        i = 0
        while i < len(words):
            two = self.words.get(self._key(words[i:i + 2])) if i + 1 < len(words) else None
            if two:
                readings.append(WordReading(" ".join(words[i:i + 2]), [two], "dictionary"))
                i += 2
                continue
            one = self.words.get(self._key(words[i:i + 1]))
            readings.append(WordReading(words[i], [one], "dictionary") if one else WordReading(words[i], [], "kept"))
            i += 1
        return Translation(source=text, text=" ".join(e for r in readings for e in r.english), words=readings)
