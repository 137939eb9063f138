"""Product vocabulary from every domain for the intent generator: Google's product taxonomy.

The bundled catalogue is fashion; a shop's catalogue may be furniture, tools or groceries. A
classifier trained on fashion words alone reads an unfamiliar product phrase ("queen size bed
frame", "dewalt 20v impact driver") as whatever its few cue-like words resemble. Google's
taxonomy names 5,582 categories of every domain; the generator uses them as product phrases
(bare, with brands, model codes, sizes and attributes, typed with typos) and inside every
intent's templates, so the model learns the template, not the domain.

Honest measurement: the taxonomy's non-leaf names and a fixed half of its leaves (a salted hash
of the name) train; the other leaves never appear in a training query and measure how many
unseen product categories, typed as a shopper would, are read as a search
(:func:`heldout_leaf_queries`).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from vitrine import resources

LEAF_SALT = "vitrine-intent-taxonomy-v1"
LEAF_TRAIN_PERCENT = 50  # share of the taxonomy's leaves the generator may use (the rest: measurement)

# Brands of other domains (tools, appliances, furniture, electronics, groceries, toys, ...): a
# brand the fashion catalogue never had must not read as a cue.
OTHER_BRANDS = [
    "dewalt", "bosch", "makita", "milwaukee", "ryobi", "black+decker", "stanley", "craftsman", "ikea", "ashley",
    "samsung", "lg", "sony", "philips", "dyson", "shark", "bissell", "kitchenaid", "cuisinart", "ninja",
    "instant pot", "keurig", "whirlpool", "frigidaire", "apple", "dell", "hp", "lenovo", "logitech", "anker",
    "canon", "nikon", "lego", "hasbro", "mattel", "pampers", "huggies", "purina", "pedigree", "kong", "coleman",
    "yeti", "weber", "hamilton beach", "oxo", "pyrex", "rubbermaid", "3m", "sharpie", "crayola", "gillette",
    "oral-b", "colgate", "nivea", "maybelline", "nestle", "heinz", "michelin", "yamaha", "fender", "wilson",
    "spalding", "garmin", "netgear", "tp-link", "epson", "brother", "bosch", "miele", "breville", "delonghi",
    "tefal", "xiaomi", "huawei", "lenox", "sealy", "serta", "tempur-pedic", "la-z-boy", "herman miller",
    "kohler", "moen", "grohe", "honeywell", "rheem", "husqvarna", "stihl", "toro", "worx", "greenworks",
]
SIZES = [
    "queen size", "king size", "twin", "full size", "california king", "queen", "king", "double", "single",
    "3 seater", "2 seater", "6 ft", "8 foot", "4x6", "55 inch", "65\"", "10 inch", "12 in", "1/2 inch", "3/8\"",
    "xl", "xxl", "large", "small", "medium", "mini", "compact", "extra large", "2 pack", "pack of 6", "set of 4",
    "10 pcs", "500 ml", "1 litre", "2l", "5 kg", "10 lb", "1 gallon", "16 oz", "64gb", "1tb", "20v", "18v", "12v",
    "1000w", "4k", "size 10", "100 count", "a4", "36 x 24", "30cm", "2 tier", "5 shelf", "4 burner", "6 quart",
]
ATTRIBUTES = [
    "stainless steel", "wooden", "solid wood", "cordless", "wireless", "portable", "heavy duty", "waterproof",
    "organic", "rechargeable", "led", "electric", "adjustable", "foldable", "non-stick", "ceramic", "glass",
    "plastic", "cast iron", "bamboo", "memory foam", "outdoor", "indoor", "kids", "baby", "vintage", "modern",
    "industrial", "smart", "digital", "manual", "automatic", "professional", "commercial", "refurbished",
    "replacement", "spare", "universal", "compatible", "gluten free", "unscented", "eco friendly", "black",
    "white", "grey", "oak", "walnut", "chrome", "brass", "blue", "red", "green", "clear", "matte", "gloss",
]
CONNECT = ["for", "with", "compatible with", "fits", "and"]
_CODE_LETTERS = "abcdefghkmnprstvxz"


@dataclass(frozen=True)
class TaxonomyNames:
    """The taxonomy's category names: those the generator may train on, and held-out leaves."""

    train: tuple[str, ...]
    heldout_leaves: tuple[str, ...]


def taxonomy_file() -> Path:
    """Google's taxonomy file shipped with Vitrine (package data, ``vitrine/resources/taxonomy``)."""
    return resources.taxonomy_file()


@lru_cache(maxsize=4)
def taxonomy_paths(path: Path | None = None) -> tuple[tuple[str, ...], ...]:
    """Every category of the taxonomy as its path of names (root first)."""
    out = []
    for line in (path or taxonomy_file()).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#") or " - " not in line:
            continue
        out.append(tuple(p.strip() for p in line.split(" - ", 1)[1].split(" > ")))
    return tuple(out)


def is_training_leaf(name: str) -> bool:
    """Whether a leaf belongs to the half the generator may use (stable salted hash of the name)."""
    h = hashlib.sha256(f"{LEAF_SALT}:{name.casefold()}".encode()).digest()
    return int.from_bytes(h[:4], "big") % 100 < LEAF_TRAIN_PERCENT


@lru_cache(maxsize=4)
def taxonomy_names(path: Path | None = None) -> TaxonomyNames:
    """Non-leaf names and the training half of the leaves; the other leaves held out. A name
    that is both a leaf somewhere and a parent elsewhere counts as a parent (it trains)."""
    paths = taxonomy_paths(path)
    parents = {p[:-1] for p in paths if len(p) > 1}
    inner = {p[-1] for p in paths if p in parents}
    leaves = {p[-1] for p in paths if p not in parents} - inner
    train = sorted(inner | {n for n in leaves if is_training_leaf(n)})
    held = sorted(n for n in leaves if not is_training_leaf(n))
    return TaxonomyNames(tuple(train), tuple(held))


def _sides(name: str) -> list[str]:
    """The ways a shopper names a category: "Maternity Belts & Support Bands" -> the whole name,
    with "and", or one side of it."""
    parts = [p.strip() for p in re.split(r"\s*(?:&|,)\s*", name) if p.strip()]
    out = [name, name.replace(" & ", " and ")]
    if len(parts) > 1:
        out += parts
    return out


def singular(word: str) -> str:
    w = word
    if len(w) > 4 and w.endswith("ies"):
        return w[:-3] + "y"
    if len(w) > 4 and w.endswith(("ches", "shes", "sses", "xes")):
        return w[:-2]
    if len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is")):
        return w[:-1]
    return w


def shopper_form(name: str, rng: random.Random, typo: Callable[[str], str], *, typo_p: float = 0.15,
                 whole: bool = False) -> str:
    """A category name typed as a shopper would: one of its sides (``whole``: the whole name, with
    "&" or "and"), lower-cased, sometimes singular, with probability ``typo_p`` one typo in a long
    word."""
    text = rng.choice(_sides(name)[:2] if whole else _sides(name)).lower()
    words = text.split()
    if words and rng.random() < 0.35:
        words[-1] = singular(words[-1])
    long = [i for i, w in enumerate(words) if len(w) >= 5 and w.isalpha()]
    if long and rng.random() < typo_p:  # at most one typo per phrase
        i = rng.choice(long)
        words[i] = typo(words[i])
    return " ".join(words)


def model_code(rng: random.Random) -> str:
    """An invented product-line or model code ("m18", "xr 20", "v15 pro", "dcd771")."""
    r = rng.random()
    letters = "".join(rng.choice(_CODE_LETTERS) for _ in range(rng.randint(1, 3)))
    num = str(rng.choice([rng.randint(1, 20), rng.randint(10, 999), rng.randint(100, 9999)]))
    if r < 0.4:
        return letters + num
    if r < 0.6:
        return f"{letters} {num}"
    if r < 0.8:
        return f"{letters}{num} {rng.choice(['pro', 'max', 'plus', 'ultra', 'lite', 'mini', 'xl', 'gen 2', 'series'])}"
    return f"{rng.choice(['pro', 'gen', 'series', 'mark', 'model'])} {rng.randint(1, 12)}"


def taxonomy_phrase(name: str, rng: random.Random, typo: Callable[[str], str], brands: list[str],
                    pseudo_brand: Callable[[random.Random], str], other_name: Callable[[], str]) -> str:
    """A product phrase over a taxonomy category: "dewalt 20v cordless drill", "queen size bed
    frame with storage", "replacement filter for dyson v8", "kraso m18 pressure washers"."""
    base = shopper_form(name, rng, typo)
    parts: list[str] = []
    r = rng.random()
    if r < 0.25:
        parts.append(rng.choice(OTHER_BRANDS))
    elif r < 0.4:
        parts.append(pseudo_brand(rng).lower() if rng.random() < 0.7 else pseudo_brand(rng))
    elif r < 0.48 and brands:
        parts.append(rng.choice(brands).lower())
    if parts and rng.random() < 0.35:
        parts.append(model_code(rng))
    if rng.random() < 0.25:
        parts.append(rng.choice(SIZES))
    if rng.random() < 0.3:
        parts.append(rng.choice(ATTRIBUTES))
    parts.append(base)
    r = rng.random()
    if r < 0.12:  # an accessory for another product
        target = rng.choice(OTHER_BRANDS) + (" " + model_code(rng) if rng.random() < 0.5 else "")
        if rng.random() < 0.5:
            target = shopper_form(other_name(), rng, typo)
        parts += [rng.choice(CONNECT), target]
    elif r < 0.2:
        parts += ["with", shopper_form(other_name(), rng, typo)]
    elif r < 0.28:
        parts.append(rng.choice(SIZES))
    return " ".join(parts)


def training_leaf_queries(seed: int = 0, path: Path | None = None) -> list[tuple[str, str]]:
    """The training half of the leaves typed as :func:`heldout_leaf_queries` types the held-out
    half: what a decision rule may be chosen on (the held-out half only measures it)."""
    from vitrine.intent.typos import typo_fn

    rng = random.Random(f"{seed}:fit-leaves")
    typo = typo_fn(rng)
    paths = taxonomy_paths(path)
    parents = {q[:-1] for q in paths if len(q) > 1}
    leaves = {q[-1] for q in paths if q not in parents}
    return [(shopper_form(name, rng, typo, typo_p=0.34, whole=True), name)
            for name in taxonomy_names(path).train if name in leaves]


def heldout_leaf_queries(seed: int = 0, path: Path | None = None) -> list[tuple[str, str]]:
    """Every held-out leaf typed as a shopper would (English): (query, leaf name). The whole name
    lower-cased ("&" or "and"), sometimes singular, a third with one typo in a long word. None of
    these leaves is in any training query (one side of an "A & B" leaf may be a word that is)."""
    from vitrine.intent.typos import typo_fn

    rng = random.Random(f"{seed}:leaves")
    typo = typo_fn(rng)
    out = []
    for name in taxonomy_names(path).heldout_leaves:
        out.append((shopper_form(name, rng, typo, typo_p=0.34, whole=True), name))
    return out
