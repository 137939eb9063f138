"""Training and held-out queries, generated from templates over the real catalogue's vocabulary.

Every query comes with its intent label and its gold slots (the brand, category, colour, gender
and price bounds the generator put in). English and Chinese, paraphrase variety from the
template sets (``data/templates.json``), code-mixing ("nike 跑步鞋 under 2000"), typos, casing,
fillers and emoji.

No leakage between the two splits:
- templates: the ``train`` and ``test`` template sets are disjoint (checked);
- vocabulary: a fixed fifth of the brands and of the article types (by a salted hash of the
  name) is held out: held-out values never appear in a training query;
- texts: a test query whose text is also a training query is dropped.

Validation (model selection, tuning) measures the same thing as the held-out set, generalisation
to phrasings never trained on, without touching the test templates: a fixed share of the
``train`` templates of every intent and language (and of the compositional frames), picked by a
salted hash of the template text, is kept out of training and only builds the ``val`` queries.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitrine.bundled import read_styles
from vitrine.intent.slots import SLOT_FIELDS, SlotExtractor, Vocabulary, key_norm, learn_brands, lexicon
from vitrine.intent.taxonomy import OTHER_BRANDS as OTHER_BRANDS_POOL
from vitrine.intent.taxonomy import shopper_form, taxonomy_names, taxonomy_phrase
from vitrine.intent.templates import (
    DETERMINERS,
    LABELS,
    SPLITS,
    compositional_templates,
    norm_template,
    template_sets,
    templates,
)
from vitrine.intent.typos import typo
from vitrine.training.intent_phrases import (
    CUR_POST,
    CUR_PRE,
    FILLERS,
    GENDER_FORMS,
    MODIFIERS,
    OTHER_PRODUCTS,
    PRICES,
    PRICE_FORMS,
)

# Bumped whenever the generated queries change: held-out figures recorded by weights trained
# under another version cannot be reproduced by generating the held-out set again.
GENERATOR_VERSION = 2  # 2: Google's taxonomy (every domain), more bare phrases
HOLDOUT_SALT = "vitrine-intent-holdout-v1"
# Share of the training search queries that are a product phrase alone ("red heels", a catalogue
# title): the commonest real shopper query, which the templates alone under-represent; without
# them a model learns that product words inside a sentence mean search and sends a bare phrase
# or a title with a cue-like word ("cross-back", "return") to another intent.
BARE_SEARCH_SHARE = 0.3
BARE_TITLE_SHARE = 0.25  # of those, a real catalogue title rather than a generated phrase
# of those, a product phrase over a category of Google's taxonomy (any domain): half the category
# name alone as a shopper types it ("band saw", "arrow nocks"), half with brands, sizes, ...
BARE_TAXONOMY_SHARE = 0.5
# Share of the product phrases inside every intent's templates that name a category of another
# domain (Google's taxonomy): the model must learn the template, not the domain.
TAXONOMY_SHARE = 0.25
EXTRA_TITLE_SHARE = 0.5  # of the titles drawn, a tuned catalogue's own (when it gives any)
TAXONOMY_PAIR_SHARE = 0.2  # of the compared pairs ("dewalt vs makita drill")
# Share of training titles whose brand is swapped for an invented name: shoppers type brands the
# catalogue vocabulary never had, and a name-like run of unfamiliar subwords must not read as a cue.
PSEUDO_BRAND_SHARE = 0.35
# Share of training product phrases with one word swapped for an invented one (a model name, a
# fabric, a brand the vocabulary lacks): product words never seen in training must stay neutral.
OOV_WORD_SHARE = 0.25
_ONSETS = ["b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "ch", "cl",
           "dr", "gr", "kr", "pr", "sh", "st", "tr", "vr"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "io", "ou", "y"]
_CODAS = ["", "", "", "n", "r", "s", "l", "x", "k", "m", "tt", "nd"]


def pseudo_brand(rng: random.Random) -> str:
    """An invented brand-like name of one or two words ("Velorin", "Kraso Dumet")."""
    def word() -> str:
        w = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(rng.randint(1, 3))) + rng.choice(_CODAS)
        return w.capitalize() if rng.random() < 0.8 else w.upper()
    return " ".join(word() for _ in range(1 if rng.random() < 0.6 else 2))
_CJK = re.compile(r"[\u3040-\u9fff]")
_PLACEHOLDER = re.compile(r"\{(P|PA|PB|BA|BB|C|G|PRICE)\}")

# Products outside the catalogue (no slot): the classifier must not depend on catalogue words.
@dataclass
class Example:
    text: str
    label: str
    slots: dict[str, Any] | None  # None: not labelled (a real catalogue title as the product)
    lang: str
    template: str

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "label": self.label, "slots": self.slots, "lang": self.lang,
                "template": self.template}


@dataclass
class Terms:
    """The catalogue vocabulary the generator draws from."""

    brands: list[str]
    types: list[str]
    generic: list[str]
    colours: list[str]
    genders: list[str]
    titles: list[tuple[str, str]] = field(default_factory=list)  # (title, article type)
    taxonomy: bool = True  # product phrases over Google's taxonomy (every domain) beside the catalogue's
    extra_titles: list[str] = field(default_factory=list)  # a shop's own titles, added at tune time

    def with_titles(self, titles: Sequence[str]) -> "Terms":
        """These terms plus another catalogue's titles: half of the titles the training queries
        use (bare searches and the product inside every intent's templates) are then drawn from
        them. How a shop's own product names join the training queries at tune time."""
        extra = [" ".join(t.split()) for t in titles if t and t.strip()]
        return Terms(self.brands, self.types, self.generic, self.colours, self.genders, self.titles,
                     self.taxonomy, self.extra_titles + extra)

    def vocabulary(self) -> Vocabulary:
        return Vocabulary.of(self.brands, self.types + self.generic, self.colours, self.genders)


def read_styles_csv(source: Path) -> list[dict[str, str]]:
    """``styles.csv`` of the bundled catalogue as dicts."""
    return read_styles(Path(source))


def catalogue_terms(source: Path) -> Terms:
    """Brands (learned from titles), article types, generic categories, colours and genders."""
    rows = read_styles_csv(source)
    lex = lexicon()
    common = {key_norm(w) for w in lex["common_words"]}
    brands = [b for b in learn_brands(r["productDisplayName"] for r in rows)
              if len(key_norm(b)) >= 2 and key_norm(b) not in common]
    types = sorted({r["articleType"] for r in rows if r["articleType"]})
    # generic categories (sub/master) that people name: the ones the lexicon knows
    generic = sorted((({r["subCategory"] for r in rows} | {r["masterCategory"] for r in rows}) - set(types))
                     & set(lex["category"]))
    colours = sorted({r["baseColour"] for r in rows if r["baseColour"] and r["baseColour"] != "NA"})
    genders = sorted({r["gender"] for r in rows if r["gender"]})
    titles = [(" ".join(r["productDisplayName"].split()), r["articleType"]) for r in rows if r["productDisplayName"]]
    return Terms(brands, types, generic, colours, genders, titles)


def held_out(value: str, fraction_denominator: int = 5) -> bool:
    """Whether a brand / article type belongs to the held-out fifth (stable salted hash)."""
    h = hashlib.sha256(f"{HOLDOUT_SALT}:{key_norm(value)}".encode()).digest()
    return int.from_bytes(h[:4], "big") % fraction_denominator == 0




def _forms(lex_forms: dict[str, list[str]], value: str) -> tuple[list[str], list[str]]:
    forms = [value.lower()] + [f for f in lex_forms.get(value, []) if f]
    en = [f for f in forms if not _CJK.search(f)]
    zh = [f for f in forms if _CJK.search(f)]
    return list(dict.fromkeys(en)), list(dict.fromkeys(zh))


class QueryGenerator:
    """Generates labelled queries for one split: "train", "val" (validation templates, training
    vocabulary) or "test" (held-out templates, price forms and vocabulary)."""

    def __init__(self, terms: Terms, split: str, seed: int = 0, member: int = 0) -> None:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}")
        self.split = split
        # member: an ensemble member's own draw of the training queries (0: the plain seed)
        self.rng = random.Random(f"{seed}:{split}" if member == 0 else f"{seed}:{split}:member{member}")
        lex = lexicon()
        self.held_brands = [b for b in terms.brands if held_out(b)]
        self.held_types = [t for t in terms.types if held_out(t)]
        if split != "test":
            self.brands = [b for b in terms.brands if not held_out(b)]
            self.types = [t for t in terms.types if not held_out(t)]
        else:
            self.brands, self.types = list(terms.brands), list(terms.types)
        self.generic = list(terms.generic)
        self.colours = list(terms.colours)
        self.genders = [g for g in terms.genders if g in GENDER_FORMS["en_adj"]]
        self.cat_forms = {c: _forms(lex["category"], c) for c in self.types + self.generic}
        self.colour_forms = {c: _forms(lex["colour"], c) for c in self.colours}
        self.brand_forms = {b: _forms(lex["brand"], b) for b in self.brands}
        # categories with at least one usable surface form
        self.types = [t for t in self.types if self.cat_forms[t][0]]
        self.templates = template_sets(split)
        self.compositional = compositional_templates() if split == "train" else {}
        self.prices = PRICE_FORMS["test" if split == "test" else "train"]
        # Google's taxonomy: training and validation use its non-leaf names and the training half
        # of its leaves; the held-out queries draw half their categories from the other leaves.
        tax = taxonomy_names() if terms.taxonomy else None
        self.taxonomy = list(tax.train) if tax else []
        self.taxonomy_held = list(tax.heldout_leaves) if tax and split == "test" else []
        # Real catalogue titles as product phrases (training only; their slots are not labelled):
        # product words far beyond the slot vocabulary. Held-out brands and types stay out.
        held_b = [key_norm(b) for b in self.held_brands]
        held_t = set(self.held_types)
        self.titles = [] if split != "train" else [
            t for t, at in terms.titles
            if at not in held_t and not any(key_norm(t).startswith(b + " ") for b in held_b)]
        self.extra_titles = list(terms.extra_titles) if split == "train" else []
        if self.extra_titles and not self.titles:
            self.titles = list(self.extra_titles)
        # title -> its brand prefix (longest known brand it starts with), for pseudo-brand swaps
        by_len = sorted(self.brands, key=len, reverse=True)
        self._title_brand = {t: next((b for b in by_len if t.casefold().startswith(b.casefold() + " ")), "")
                             for t in self.titles}

    # -- pieces --------------------------------------------------------------------------------------
    def _title(self) -> str:
        """A real catalogue title, sometimes lowercased, sometimes with an invented brand."""
        rng = self.rng
        if self.extra_titles and rng.random() < EXTRA_TITLE_SHARE:
            title = rng.choice(self.extra_titles)
            return title.lower() if rng.random() < 0.5 else title
        title = rng.choice(self.titles)
        brand = self._title_brand.get(title, "")
        if brand and rng.random() < PSEUDO_BRAND_SHARE:
            title = pseudo_brand(rng) + title[len(brand):]
        return title.lower() if rng.random() < 0.5 else title

    def _pick_taxonomy(self) -> str:
        if self.taxonomy_held and self.rng.random() < 0.5:
            return self.rng.choice(self.taxonomy_held)
        return self.rng.choice(self.taxonomy)

    def taxonomy_product(self) -> str:
        """A product phrase over a taxonomy category (any domain); its slots are not labelled."""
        return taxonomy_phrase(self._pick_taxonomy(), self.rng, self._typo, self.brands, pseudo_brand,
                               self._pick_taxonomy)

    def _pick_brand(self) -> str:
        if self.split == "test" and self.held_brands and self.rng.random() < 0.5:
            return self.rng.choice(self.held_brands)
        return self.rng.choice(self.brands)

    def _pick_type(self) -> str:
        r = self.rng.random()
        if self.split == "test" and self.held_types and r < 0.5:
            return self.rng.choice(self.held_types)
        if r > 0.9 and self.generic:
            g = self.rng.choice(self.generic)
            if self.cat_forms[g][0]:
                return g
        return self.rng.choice(self.types)

    def _surface(self, forms: tuple[list[str], list[str]], zh: bool) -> str:
        en, cn = forms
        if zh and cn and self.rng.random() < 0.8:
            return self.rng.choice(cn)
        return self.rng.choice(en or cn)

    def _brand_surface(self, brand: str, zh: bool) -> str:
        en, cn = self.brand_forms.get(brand, ([brand.lower()], []))
        if zh and cn and self.rng.random() < 0.5:
            return self.rng.choice(cn)
        s = self.rng.choice([brand, brand.lower(), brand.lower(), brand.upper()] + en[1:])
        return s

    def product(self, zh: bool, *, brand: str | None = None, category: str | None = None,
                allow_other: bool = True, no_category: bool = False) -> tuple[str, dict[str, list[str]]]:
        """A product phrase and the slot values it names."""
        rng = self.rng
        if allow_other and brand is None and category is None:
            r = rng.random()
            if r < 0.08:
                return rng.choice(OTHER_PRODUCTS["zh" if zh else "en"]), {}
            if r < 0.25 and self.titles:
                return self._title(), {"_unlabelled": ["title"]}
            if 0.25 <= r < 0.25 + TAXONOMY_SHARE and self.taxonomy and (not zh or rng.random() < 0.5):
                return self.taxonomy_product(), {"_unlabelled": ["taxonomy"]}
        text, slots = self._product(zh, brand=brand, category=category, no_category=no_category)
        r = rng.random()
        if not zh and rng.random() < 0.2:
            text = f"{rng.choice(DETERMINERS)} {text}"
        if r < 0.25:
            text = rng.choice(MODIFIERS["zh_pre" if zh else "en_pre"]) + ("" if zh else " ") + text
        elif r < 0.4:
            text = text + " " + rng.choice(MODIFIERS["zh_post" if zh else "en_post"])
        return text, slots

    def _product(self, zh: bool, *, brand: str | None, category: str | None,
                 no_category: bool) -> tuple[str, dict[str, list[str]]]:
        rng = self.rng
        slots: dict[str, list[str]] = {}
        b = brand if brand is not None else (self._pick_brand() if rng.random() < 0.45 else None)
        c = category if category is not None else (self._pick_type() if rng.random() < 0.92 else None)
        if no_category:
            c = None
        col = rng.choice(self.colours) if rng.random() < 0.45 else None
        g = rng.choice(self.genders) if rng.random() < 0.4 and self.genders else None
        if c is None and b is None:
            c = self._pick_type()
        parts_zh = zh and rng.random() < 0.8  # the product phrase itself in Chinese (else code-mixed English)
        bs = self._brand_surface(b, parts_zh) if b else None
        cs = self._surface(self.cat_forms[c], parts_zh) if c else None
        cols = self._surface(self.colour_forms[col], parts_zh) if col else None
        if b:
            slots["brand"] = [b]
        if c:
            slots["category"] = [c]
        if col:
            slots["colour"] = [col]
        if g:
            slots["gender"] = [g]
        if parts_zh:
            gs = rng.choice(GENDER_FORMS["zh"][g]) if g else None
            seq = [x for x in (bs, gs, cols, cs) if x]
            text = ""
            for x in seq:
                if not text:
                    text = x
                    continue
                latin_join = text[-1].isascii() and text[-1].isalnum() and x[0].isascii() and x[0].isalnum()
                mixed = not _CJK.search(text[-1]) or not _CJK.search(x[0])
                text += (" " if latin_join or (mixed and rng.random() < 0.7) else "") + x
            if not cs and rng.random() < 0.5:
                text += "的东西"
            return text, slots
        gfor = rng.choice(GENDER_FORMS["en_for"][g]) if g else None
        gadj = rng.choice(GENDER_FORMS["en_adj"][g]) if g else None
        style = rng.random()
        words: list[str | None]  # in order; None: left out
        if cols and cs and style < 0.15:  # "nike running shoes in black for men"
            words = [bs, cs, "in", cols, gfor]
        elif g and style < 0.55:  # "nike men's black running shoes" / "men's nike black ..."
            words = [bs, gadj, cols, cs] if rng.random() < 0.7 else [gadj, bs, cols, cs]
        else:  # "nike black running shoes for men"
            words = [bs, cols, cs, gfor]
        text = " ".join(x for x in words if x)
        return text, slots

    def price(self, zh: bool) -> tuple[str, dict[str, float]]:
        rng = self.rng
        form, kind = rng.choice(self.prices["zh" if zh else "en"])
        a, b = sorted(rng.sample(PRICES, 2))
        n = rng.choice(PRICES)
        c = rng.choice(CUR_PRE) if "{c}" in form else ""
        s = rng.choice(CUR_POST) if "{s}" in form and not c else ""

        def show(v: int) -> str:
            r = rng.random()
            if v >= 1000 and v % 1000 == 0 and r < 0.15 and not zh:
                return f"{v // 1000}k"
            if v >= 1000 and r > 0.85:
                return f"{v:,}"
            return str(v)

        text = form.format(c=c, s=s, n=show(n), a=show(a), b=show(b))
        if kind == "max":
            return text, {"price_max": float(n)}
        if kind == "min":
            return text, {"price_min": float(n)}
        return text, {"price_min": float(a), "price_max": float(b)}

    def recipient(self, zh: bool) -> tuple[str, dict[str, list[str]]]:
        key = "zh_g" if zh else "en_g"
        g = self.rng.choice([g for g in GENDER_FORMS[key] if g in self.genders] or list(GENDER_FORMS[key]))
        return self.rng.choice(GENDER_FORMS[key][g]), {"gender": [g]}

    # -- queries -------------------------------------------------------------------------------------
    def example(self, label: str, lang: str | None = None) -> Example:
        rng = self.rng
        if lang is None:
            lang = "zh" if rng.random() < 0.4 else "en"
        zh = lang == "zh"
        comp = self.compositional.get(label) if lang == "en" else None
        tpl = rng.choice(comp) if comp and rng.random() < 0.35 else rng.choice(self.templates[label][lang])
        if label == "search" and self.split == "train" and rng.random() < BARE_SEARCH_SHARE:
            r = rng.random()
            if self.titles and r < BARE_TITLE_SHARE:
                return Example(self._title(), label, None, lang, f"{self.split}:{label}:{lang}:<title>")
            if self.taxonomy and r < BARE_TITLE_SHARE + BARE_TAXONOMY_SHARE:
                phrase = shopper_form(self._pick_taxonomy(), rng, self._typo) if rng.random() < 0.5 \
                    else self.taxonomy_product()
                text = self._render([(phrase, "slot")], False)
                return Example(text, label, None, "en", f"{self.split}:{label}:en:<taxonomy>")
            tpl = "{P}"
        gold: dict[str, Any] = {}
        segs: list[tuple[str, str]] = []  # (text, kind) kind: lit | slot | price
        pos = 0
        shared_cat: str | None = None
        brands_pair: list[str] = []
        # a compared pair of another domain ("dewalt vs makita cordless drill"): slots unlabelled
        tax_pair = shopper_form(self._pick_taxonomy(), rng, self._typo) if (
            self.taxonomy and "{PA}" in tpl and rng.random() < TAXONOMY_PAIR_SHARE) else None
        for m in _PLACEHOLDER.finditer(tpl):
            if m.start() > pos:
                segs.append((tpl[pos:m.start()], "lit"))
            pos = m.end()
            ph = m.group(1)
            mixed = zh and rng.random() < 0.3
            pzh = zh and not mixed or (not zh and rng.random() < 0.08)
            text = ""
            slots: dict[str, Any] = {}
            if ph == "P":
                text, slots = self.product(pzh)
            elif ph in ("PA", "PB") and tax_pair is not None:
                brand = rng.choice(OTHER_BRANDS_POOL) if rng.random() < 0.5 else pseudo_brand(rng).lower()
                text = brand if ph == "PB" and rng.random() < 0.4 else f"{brand} {tax_pair}"
                slots = {"_unlabelled": ["taxonomy"]}
            elif ph in ("PA", "PB"):
                if shared_cat is None:
                    shared_cat = self._pick_type()
                brand = self._pick_brand()
                while brand in brands_pair and len(self.brands) > 1:
                    brand = self._pick_brand()
                brands_pair.append(brand)
                cat = shared_cat if (ph == "PA" or rng.random() < 0.6) else None
                text, slots = self.product(pzh, brand=brand, category=cat, allow_other=False, no_category=cat is None)
            elif ph in ("BA", "BB"):
                brand = self._pick_brand()
                while brand in brands_pair and len(self.brands) > 1:
                    brand = self._pick_brand()
                brands_pair.append(brand)
                text, slots = self._brand_surface(brand, pzh), {"brand": [brand]}
            elif ph == "C":
                if shared_cat is None:
                    shared_cat = self._pick_type()
                text = self._surface(self.cat_forms[shared_cat], pzh)
                slots = {"category": [shared_cat]}
            elif ph == "G":
                if rng.random() < 0.6:
                    text, slots = self.recipient(zh)
            elif ph == "PRICE":
                if rng.random() < 0.55:
                    text, pslots = self.price(zh)
                    gold.update(pslots)
                    segs.append((text, "price"))
                    continue
            for f, vals in slots.items():
                cur = gold.setdefault(f, [])
                cur.extend(v for v in vals if v not in cur)
            segs.append((text, "slot"))
        if pos < len(tpl):
            segs.append((tpl[pos:], "lit"))
        text = self._render(segs, zh)
        if gold.pop("_unlabelled", None):  # a real title: its slots are unknown
            return Example(text, label, None, lang, f"{self.split}:{label}:{lang}:{tpl}")
        slots_out: dict[str, Any] = {}
        for f in SLOT_FIELDS:
            if gold.get(f):
                vals = gold[f]
                slots_out[f] = vals[0] if len(vals) == 1 else vals
        for f in ("price_min", "price_max"):
            if f in gold:
                slots_out[f] = gold[f]
        return Example(text, label, slots_out, lang, f"{self.split}:{label}:{lang}:{tpl}")

    def _typo(self, w: str) -> str:
        return typo(w, self.rng)

    def _render(self, segs: list[tuple[str, str]], zh: bool) -> str:
        rng = self.rng
        out = []
        for text, kind in segs:
            if kind != "price":
                p, min_len = (0.05, 4) if kind == "lit" else (0.03, 6)

                def noisy(m: re.Match[str], p: float = p, min_len: int = min_len) -> str:
                    w = m.group(0)
                    return self._typo(w) if len(w) >= min_len and rng.random() < p else w

                text = re.sub(r"[A-Za-z]+", noisy, text)
                if kind == "slot" and self.split == "train" and rng.random() < OOV_WORD_SHARE:
                    words = text.split(" ")
                    spots = [i for i, w in enumerate(words) if w.isascii() and w.isalpha()]
                    if spots:  # an unknown product word: the words around it still decide the intent
                        words[rng.choice(spots)] = pseudo_brand(rng).split(" ")[0].lower()
                        text = " ".join(words)
            out.append(text)
        s = " ".join("".join(out).split())
        s = re.sub(r"\s+([?,!.，？！])", r"\1", s)
        r = rng.random()
        if r < 0.15:
            s = rng.choice(FILLERS["zh_pre" if zh else "en_pre"]) + s
        elif r < 0.3:
            s = s + rng.choice(FILLERS["zh_post" if zh else "en_post"])
        c = rng.random()
        if c < 0.7:
            s = s.lower()
        elif c < 0.8:
            s = s.title() if not zh else s
        elif c < 0.83:
            s = s.upper()
        return s.strip()

    def generate(self, per_label: int, *, lang_mix: float = 0.4) -> list[Example]:
        """``per_label`` unique queries per label (fewer when the templates cannot make that many)."""
        out: list[Example] = []
        for label in LABELS:
            seen: set[str] = set()
            tries = 0
            while len(seen) < per_label and tries < per_label * 20:
                tries += 1
                lang = "zh" if self.rng.random() < lang_mix else "en"
                ex = self.example(label, lang)
                if ex.text in seen or not ex.text:
                    continue
                seen.add(ex.text)
                out.append(ex)
        self.rng.shuffle(out)
        return out


def heldout_titles(terms: Terms, n: int = 600, seed: int = 0) -> list[str]:
    """Real catalogue titles of held-out brands or article types (never in training): typed as a
    query, each is a search. A check of real shopper text beside the generated test sets."""
    held_b = [key_norm(b) for b in terms.brands if held_out(b)]
    held_t = {t for t in terms.types if held_out(t)}
    pool = sorted({t for t, at in terms.titles
                   if at in held_t or any(key_norm(t).startswith(b + " ") for b in held_b)})
    rng = random.Random(f"{seed}:titles")
    picked = rng.sample(pool, min(n, len(pool)))
    return [t.lower() if i % 2 else t for i, t in enumerate(picked)]


def make_splits(terms: Terms, *, train_per_label: int = 3000, test_per_label: int = 400,
                seed: int = 0, members: int = 1, train_seed: int | None = None) -> tuple[list[Example], list[Example]]:
    """The training queries (of the first ensemble member) and the held-out queries (no shared
    template, held-out vocabulary absent from training, no text of any member's training)."""
    trains, test = make_member_splits(terms, train_per_label=train_per_label, test_per_label=test_per_label,
                                      seed=seed, members=members, train_seed=train_seed)
    return trains[0], test


def make_member_splits(terms: Terms, *, train_per_label: int = 3000, test_per_label: int = 400,
                       seed: int = 0, members: int = 1,
                       train_seed: int | None = None) -> tuple[list[list[Example]], list[Example]]:
    """Each ensemble member's training queries (its own draw from the training templates and
    vocabulary) and the held-out queries, none of which is any member's training text.
    ``train_seed``: the training draw's seed when it is not ``seed`` (a fine-tuning draw)."""
    if members < 1:
        raise ValueError("members must be at least 1")
    tseed = seed if train_seed is None else train_seed
    trains = [QueryGenerator(terms, "train", tseed, member=m).generate(train_per_label) for m in range(members)]
    texts = {e.text.casefold() for train in trains for e in train}
    test = [e for e in QueryGenerator(terms, "test", seed).generate(test_per_label) if e.text.casefold() not in texts]
    return trains, test


def make_val(terms: Terms, *, per_label: int = 400, seed: int = 0,
             exclude: set[str] | None = None) -> list[Example]:
    """Validation queries: from the validation templates only, over the training vocabulary;
    texts in ``exclude`` (casefolded training texts) are dropped."""
    exclude = exclude or set()
    return [e for e in QueryGenerator(terms, "val", seed).generate(per_label) if e.text.casefold() not in exclude]


def template_overlap() -> set[str]:
    """Templates shared by two of the train / val / test sets (should be empty): the template
    lists and the filled compositional frames, compared after normalising space and case."""
    shared: set[str] = set()
    norm = {split: {lab: {lang: {norm_template(t) for t in tpls} for lang, tpls in by_lang.items()}
                    for lab, by_lang in template_sets(split).items()} for split in SPLITS}
    every = {split: set().union(*(s for by_lang in norm[split].values() for s in by_lang.values()))
             for split in SPLITS}
    for made in compositional_templates().values():
        shared |= {t for t in made if norm_template(t) in every["test"] | every["val"]}
    for label in LABELS:
        for lang in ("en", "zh"):
            a, v, b = (norm[split][label].get(lang, set()) for split in SPLITS)
            shared |= (a & b) | (a & v) | (v & b)
    return shared


def template_literal_slots(vocab: Vocabulary) -> dict[str, dict[str, Any]]:
    """Slots the template words themselves would produce (placeholders removed): should be none,
    or the gold slots would miss them."""
    ex = SlotExtractor(vocab)
    bad = {}
    for label in LABELS:
        for split in ("train", "test"):
            for lang in ("en", "zh"):
                for t in templates()[label][split][lang]:
                    lit = _PLACEHOLDER.sub(" | ", t)
                    vals = ex.extract(lit).values()
                    if vals:
                        bad[t] = vals
    return bad


def read_jsonl(path: Path) -> Iterator[Example]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                yield Example(d["text"], d["label"], d.get("slots"), d.get("lang", ""), d.get("template", ""))
