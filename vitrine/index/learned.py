"""What the graph learns from the catalogue it is given, record by record and batch by batch.

- a record's category path (:func:`category_path`) and where its leaf sits on Google's taxonomy
  (:func:`map_category`: the reviewed mapping, else the automatic one, else a same-name node);
- brands from titles when the lexicon explains too few of them (:func:`learn_title_brands`);
- the colour a title names (:class:`TitleColours`).

Functions over :class:`~vitrine.index.vocabulary.GraphData`; the graph
(:mod:`vitrine.index.graph`) calls them as products arrive.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from vitrine.index.taxonomy_map import CategoryMapping
from vitrine.index.vocabulary import GraphData, leading_brands, norm_key, plural_variants, tokenize

log = logging.getLogger(__name__)


def category_path(doc: Mapping[str, Any]) -> list[str]:
    """A product's category path, root first (any depth); a bare ``articleType`` attribute when
    it has none."""
    path = [str(c) for c in (doc.get("category") or []) if str(c).strip()]
    if not path:
        attrs = {str(k).casefold(): v for k, v in (doc.get("attributes") or {}).items()}
        if attrs.get("articletype"):
            path = [str(attrs["articletype"])]
    return path


def taxonomy_by_name(taxonomy: Mapping[int, tuple[str, ...]], name: str) -> int | None:
    """The shallowest taxonomy node named ``name`` (plurals folded)."""
    want = plural_variants(name)
    best = None
    for tid, path in taxonomy.items():
        if norm_key(path[-1]) in want and (best is None or len(path) < len(taxonomy[best])):
            best = tid
    return best


def map_category(data: GraphData, name: str, path: Sequence[str]) -> CategoryMapping:
    """Where a leaf category sits on the taxonomy: the reviewed mapping (``category_map.csv``)
    first; else the automatic mapping (``data.mapper``; unmapped below its threshold); else,
    without a mapper, a taxonomy node of the same name."""
    path = tuple(str(p) for p in path)
    reviewed = data.category_map.get(norm_key(name))
    if reviewed is not None:
        return CategoryMapping(name, path, reviewed[0], 1.0, "reviewed", best_id=reviewed[0])
    if data.mapper is not None and data.taxonomy:
        try:
            return data.mapper.map_path(path)
        except Exception as e:  # noqa: BLE001 - a failing text tower leaves the category unmapped
            log.warning("mapping category %r onto the taxonomy failed: %s", name, e)
            return CategoryMapping(name, path, None, 0.0, "unmapped")
    tid = taxonomy_by_name(data.taxonomy, name)
    return CategoryMapping(name, path, tid, 1.0 if tid is not None else 0.0,
                           "name" if tid is not None else "unmapped", best_id=tid)


def premap(data: GraphData, docs: Sequence[Mapping[str, Any]], is_mapped: Callable[[str], bool]) -> None:
    """Map the new leaf categories of a batch in one call of the text tower (``is_mapped``:
    whether the graph already placed a category of that name)."""
    if data.mapper is None or not data.taxonomy:
        return
    todo: dict[tuple[str, ...], None] = {}
    for doc in docs:
        path = category_path(doc)
        if path and norm_key(path[-1]) not in data.category_map and not is_mapped(path[-1]):
            todo[tuple(path)] = None
    if todo:
        try:
            data.mapper.map_paths(list(todo))
        except Exception as e:  # noqa: BLE001 - mapped one by one (and logged) instead
            log.warning("mapping %d categories onto the taxonomy failed: %s", len(todo), e)


def learn_title_brands(data: GraphData, docs: Sequence[Mapping[str, Any]], min_count: int = 3) -> list[str]:
    """Brands from the titles of products without a ``brand`` field, when the brand lexicon
    explains fewer than half of those titles (a catalogue unlike the one it was learned from):
    :func:`~vitrine.index.vocabulary.leading_brands`, added to ``data.brands``. Returns them."""
    titles = [str(d["title"]) for d in docs if not d.get("brand") and d.get("title")]
    if len(titles) < min_count:
        return []
    known = sum(1 for t in titles if data.brands.from_title(t) is not None)
    if known * 2 >= len(titles):
        return []
    new = [b for b in leading_brands(titles, min_count, data.colour_words()) if norm_key(b) not in data.brands.by_key]
    for b in new:
        data.brands.learn(b)
    if new:
        log.info("learned %d brands from %d titles: %s", len(new), len(titles), ", ".join(new[:10]))
    return new


class TitleColours:
    """Finds the first colour a title names (one or two words: "Navy Blue") in the general colour
    lexicon (:meth:`GraphData.colour_words`)."""

    def __init__(self, data: GraphData) -> None:
        self.words = data.colour_words()

    def __call__(self, title: str) -> str | None:
        toks = tokenize(title)
        for i in range(len(toks)):
            for n in (2, 1):
                hit = self.words.get(norm_key("".join(toks[i:i + n]))) if i + n <= len(toks) else None
                if hit:
                    return hit
        return None
