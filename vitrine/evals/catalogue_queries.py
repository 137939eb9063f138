"""Eval queries generated from the bundled catalogue, seeded by one split's products.

- :func:`attribute_queries`: attributes named ("men black casual shoes"); relevant = every
  catalogue product matching all of them.
- :func:`title_word_queries`: a brand and rare title words ("Nike Sahara"); relevant = every
  product whose title holds all the words.

Brands come from the knowledge graph's learned lexicon (multi-word brands included).
"""

from __future__ import annotations

from pathlib import Path

from vitrine.bundled import bundled_dir, read_splits, read_styles
from vitrine.errors import InvalidInput
from vitrine.evals.attribute_queries import eval_queries
from vitrine.evals.word_queries import word_queries
from vitrine.index.vocabulary import GraphData


def _seeded(graph_dir: Path, taxonomy_file: Path, split: str):
    source = bundled_dir()
    rows = read_styles(source)
    splits = read_splits(source)
    if split not in set(splits.values()):
        raise InvalidInput(f"unknown split {split!r}; use train, val or test")
    brands = GraphData.load(graph_dir, taxonomy_file).brands
    seeds = [i for i, r in enumerate(rows) if splits.get(r["id"]) == split]
    return rows, seeds, brands


def attribute_queries(graph_dir: Path, taxonomy_file: Path, split: str, n: int, seed: int = 1) -> list[dict]:
    """Attribute queries seeded by ``split``'s products; relevant = every product with all the
    attributes named."""
    rows, seeds, brands = _seeded(graph_dir, taxonomy_file, split)
    return eval_queries(rows, seeds, n=n, seed=seed, brand_fn=brands.from_title)


def title_word_queries(graph_dir: Path, taxonomy_file: Path, split: str, n: int, seed: int = 1) -> list[dict]:
    """Exact-word queries seeded by ``split``'s products; relevant = every product whose title
    holds all the words."""
    rows, seeds, brands = _seeded(graph_dir, taxonomy_file, split)
    return word_queries(rows, seeds, n=n, seed=seed, brand_fn=brands.from_title)
