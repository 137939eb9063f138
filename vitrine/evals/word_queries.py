"""Exact-word queries: a brand plus the rare words of a product's title ("Nike Sahara",
"Puma Ballistic Spike") — model and collection names an embedding easily blurs.

Built from the val/test split for evaluating symbolic (BM25) retrieval beside the vectors:
relevant = every catalogue product whose title holds all the query's words. Words that name an
attribute (gender, colour, article type, usage) are never picked: those are what the attribute
queries measure.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable, Sequence

_WORD = re.compile(r"[a-z][a-z0-9'-]*[a-z0-9]")


def _words(title: str) -> list[str]:
    return _WORD.findall(title.casefold())


def word_queries(rows: Sequence[dict[str, str]], seed_rows: Sequence[int], *, n: int = 300, seed: int = 2,
                 brand_fn: Callable[[str], str | None] | None = None, max_df: int = 40,
                 stop: set[str] | None = None) -> list[dict]:
    """``n`` distinct queries "<brand> <rare title words>" seeded by ``seed_rows``."""
    rng = random.Random(seed)
    attr_words: set[str] = set(stop or ())
    for r in rows:
        for col in ("gender", "baseColour", "articleType", "usage", "season", "subCategory", "masterCategory"):
            attr_words.update(_words(r.get(col, "")))
    attr_words |= {w.rstrip("s") for w in attr_words} | {w + "s" for w in attr_words}
    attr_words |= {"men", "mens", "men's", "women", "womens", "women's", "boys", "girls", "kids", "unisex", "with",
                   "and", "for", "the", "pack", "set", "of"}
    toks = [set(_words(r.get("productDisplayName", ""))) for r in rows]
    df = Counter(w for t in toks for w in t)
    out: list[dict] = []
    seen: set[str] = set()
    order = list(seed_rows)
    rng.shuffle(order)
    for i in order:
        if len(out) >= n:
            break
        title = rows[i].get("productDisplayName", "")
        brand = brand_fn(title) if brand_fn else None
        bwords = set(_words(brand or ""))
        cands = [w for w in _words(title) if w not in attr_words and w not in bwords and len(w) >= 4
                 and 2 <= df[w] <= max_df]
        if not cands:
            continue
        cands.sort(key=lambda w: (df[w], w))
        picked = cands[: rng.choice((1, 2))]
        qwords = sorted(bwords) + picked
        relevant = [rows[j]["id"] for j, t in enumerate(toks) if all(w in t for w in qwords)]
        text = " ".join(([brand] if brand else []) + picked)
        key = text.casefold()
        if key in seen or not relevant:
            continue
        seen.add(key)
        out.append({"qid": f"words-{len(out)}", "text": text, "relevant": {pid: 1 for pid in relevant},
                    "words": qwords})
    return out
