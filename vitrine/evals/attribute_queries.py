"""Attribute queries: what shoppers type ("women red heels", "men navy blue casual shirts").

Built from the catalogue's own attributes (gender, colour, article type, usage, brand), they
serve two purposes with two disjoint template sets:

- training pseudo-queries for the adapters and the gate (train split, ``TRAIN_TEMPLATES``);
- an evaluation qrels file (val/test split, ``EVAL_TEMPLATES``) where the relevant products
  are every catalogue product matching all the attributes a query names.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

GENDER_WORDS = {
    "Men": ["men", "mens", "men's", "male"],
    "Women": ["women", "womens", "women's", "ladies"],
    "Boys": ["boys", "boy's", "kids boys"],
    "Girls": ["girls", "girl's", "kids girls"],
    "Unisex": ["unisex"],
}

# A few article types whose catalogue names are not what people type.
TYPE_WORDS = {
    "Tshirts": ["t-shirts", "tshirts", "tees"],
    "Casual Shoes": ["casual shoes", "sneakers"],
    "Sports Shoes": ["sports shoes", "running shoes"],
    "Formal Shoes": ["formal shoes"],
    "Flip Flops": ["flip flops", "slippers"],
    "Sunglasses": ["sunglasses", "shades"],
    "Handbags": ["handbags", "bags"],
    "Kurtas": ["kurtas", "kurta"],
    "Heels": ["heels", "high heels"],
    "Track Pants": ["track pants", "joggers"],
}

# attribute subsets a template names; the same subsets index product keys during training
SUBSETS: tuple[tuple[str, ...], ...] = (
    ("articleType",),
    ("colour", "articleType"),
    ("gender", "articleType"),
    ("gender", "colour", "articleType"),
    ("gender", "usage", "articleType"),
    ("brand", "articleType"),
    ("brand", "gender", "articleType"),
)

TRAIN_TEMPLATES: tuple[tuple[int, str], ...] = (
    (0, "{a}"),
    (1, "{c} {a}"),
    (2, "{g} {a}"),
    (3, "{g} {c} {a}"),
    (3, "{c} {a} for {g}"),
    (4, "{u} {a} for {g}"),
    (5, "{b} {a}"),
    (6, "{b} {g} {a}"),
)

EVAL_TEMPLATES: tuple[tuple[int, str], ...] = (
    (3, "{g} {c} {a}"),
    (1, "{a} in {c}"),
    (4, "{g} {u} {a}"),
    (6, "{b} {a} for {g}"),
    (2, "{a} {g}"),
)


def brand_of(title: str) -> str:
    """The brand is the first word of the bundled catalogue's titles (a heuristic)."""
    return title.split()[0] if title.split() else ""


def attrs_of(row: dict[str, str], brand_fn: Callable[[str], str | None] = brand_of) -> dict[str, str]:
    return {
        "gender": row.get("gender", ""),
        "colour": row.get("baseColour", ""),
        "articleType": row.get("articleType", ""),
        "usage": row.get("usage", ""),
        "brand": brand_fn(row.get("productDisplayName", "")) or "",
    }


def _words(attr: str, value: str, rng: random.Random) -> str:
    if attr == "gender":
        return rng.choice(GENDER_WORDS.get(value, [value.lower()]))
    if attr == "articleType":
        return rng.choice(TYPE_WORDS.get(value, [value.lower()]))
    if attr == "brand":
        return value if rng.random() < 0.5 else value.lower()
    return value.lower()


def render(template: str, attrs: dict[str, str], rng: random.Random) -> str:
    return template.format(
        g=_words("gender", attrs["gender"], rng), c=_words("colour", attrs["colour"], rng),
        a=_words("articleType", attrs["articleType"], rng), u=_words("usage", attrs["usage"], rng),
        b=_words("brand", attrs["brand"], rng),
    )


def usable(subset: Sequence[str], attrs: dict[str, str]) -> bool:
    return all(attrs.get(a) and attrs[a] not in ("NA", "") for a in subset)


def subset_key(subset: Sequence[str], attrs: dict[str, str]) -> str:
    return "|".join(attrs.get(a, "").casefold() for a in subset)


@dataclass
class PseudoQuery:
    row: int
    subset: int
    key: str
    text: str


def pseudo_queries(rows: Sequence[dict[str, str]], row_ids: Sequence[int], *, per_product: int = 2,
                   seed: int = 0, templates: Sequence[tuple[int, str]] = TRAIN_TEMPLATES) -> list[PseudoQuery]:
    """``per_product`` queries for each product row in ``row_ids``, from ``templates``."""
    rng = random.Random(seed)
    out = []
    for r in row_ids:
        attrs = attrs_of(rows[r])
        options = [(s, t) for s, t in templates if usable(SUBSETS[s], attrs)]
        for s, t in rng.sample(options, min(per_product, len(options))):
            out.append(PseudoQuery(row=r, subset=s, key=subset_key(SUBSETS[s], attrs), text=render(t, attrs, rng)))
    return out


def eval_queries(rows: Sequence[dict[str, str]], seed_rows: Sequence[int], *, n: int = 500, seed: int = 1,
                 min_relevant: int = 1, templates: Sequence[tuple[int, str]] = EVAL_TEMPLATES,
                 brand_fn: Callable[[str], str | None] = brand_of) -> list[dict]:
    """Distinct attribute queries seeded by ``seed_rows``; relevant = every row matching them.

    ``brand_fn`` names a title's brand (default: its first word; the knowledge graph's learned
    lexicon knows multi-word brands like "United Colors of Benetton")."""
    rng = random.Random(seed)
    index: dict[tuple[int, str], list[int]] = {}
    all_attrs = [attrs_of(r, brand_fn) for r in rows]
    for i, a in enumerate(all_attrs):
        for s, sub in enumerate(SUBSETS):
            if usable(sub, a):
                index.setdefault((s, subset_key(sub, a)), []).append(i)
    seen: set[tuple[int, str]] = set()
    out: list[dict] = []
    order = list(seed_rows)
    rng.shuffle(order)
    for r in order:
        if len(out) >= n:
            break
        attrs = all_attrs[r]
        s, t = rng.choice(templates)
        if not usable(SUBSETS[s], attrs):
            continue
        key = (s, subset_key(SUBSETS[s], attrs))
        if key in seen or len(index[key]) < min_relevant:
            continue
        seen.add(key)
        out.append({
            "qid": f"attr-{len(out)}", "text": render(t, attrs, rng),
            "relevant": {rows[i]["id"]: 1 for i in index[key]},
            "attributes": {a: attrs[a] for a in SUBSETS[s]},
        })
    return out


def write_qrels(queries: Sequence[dict], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for q in queries:
            f.write(json.dumps(q, ensure_ascii=False) + "\n")


