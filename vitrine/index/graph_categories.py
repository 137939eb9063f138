"""How categories relate on the graph: their place on Google's product taxonomy, how close two
are, and which go together (outfits), read from a :class:`~vitrine.index.graph_store.GraphStore`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from vitrine.index.graph_store import GraphStore
from vitrine.index.vocabulary import norm_key


class CategoryRelations:
    """Taxonomy places, distances, proximities and complements of the store's categories."""

    def __init__(self, store: GraphStore) -> None:
        self.store = store
        self._prox_cache: dict[tuple[str | None, tuple[str, ...]], float] = {}
        # per category tree (dropped with the proximities): a category's taxonomy node and mapping
        # confidence, a taxonomy node's root-ward chain, a query term's (taxonomy node, confidence)
        # pairs. Read per candidate category of every text search, they were networkx edge walks.
        self._tax_cache: dict[str, tuple[str | None, float]] = {}
        self._chain_cache: dict[str, tuple[str, ...]] = {}
        self._term_cache: dict[str, frozenset[tuple[str | None, float]]] = {}
        self._prox_epoch = store.categories_epoch  # the caches hold for this category tree

    def mapping(self) -> list[dict[str, Any]]:
        """Every leaf category's place on the taxonomy: source, taxonomy id and path, confidence."""
        s = self.store
        out = []
        with s.lock:
            for _node, d in s.g.nodes(data=True):
                m = d.get("map")
                if d.get("kind") == "category" and m:
                    tid = m.get("taxonomy_id")
                    out.append({**m, "taxonomy_path": " > ".join(s.data.taxonomy.get(tid, ())) if tid else None,
                                "products": len(s.postings(s.category_node(d["name"])))})
        return sorted(out, key=lambda m: (-m["products"], m["category"]))

    def _fresh(self) -> None:
        """Drop what was derived from an older category tree."""
        if self._prox_epoch != self.store.categories_epoch:
            self._prox_cache.clear()
            self._tax_cache.clear()
            self._chain_cache.clear()
            self._term_cache.clear()
            self._prox_epoch = self.store.categories_epoch

    def _placed(self, category: str) -> tuple[str | None, float]:
        """(its taxonomy node, the mapping's confidence) of a category (None, 0: not mapped)."""
        self._fresh()
        hit = self._tax_cache.get(category)
        if hit is None:
            hit = self._tax_cache[category] = self._read_placed(category)
        return hit

    def _read_placed(self, category: str) -> tuple[str | None, float]:
        g = self.store.g
        node = self.store.category_node(category)
        if node not in g:
            return None, 0.0
        for _, target, key, d in g.out_edges(node, keys=True, data=True):
            if key == "maps_to":
                return target, float(d.get("confidence", 1.0))
        return None, 0.0

    def taxonomy_of(self, category: str | None) -> str | None:
        return self._placed(category)[0] if category else None

    def taxonomy_distance(self, a: str | None, b: str | None) -> int | None:
        """Tree distance between two taxonomy nodes (None when either is unknown)."""
        g = self.store.g
        if a is None or b is None or a not in g or b not in g:
            return None
        return _tree_distance(self._ancestors(a), self._ancestors(b))

    def _ancestors(self, node: str) -> tuple[str, ...]:
        self._fresh()
        hit = self._chain_cache.get(node)
        if hit is None:
            hit = self._chain_cache[node] = self._read_ancestors(node)
        return hit

    def _read_ancestors(self, node: str) -> tuple[str, ...]:
        chain = [node]
        while True:
            nxt = [t for _, t, k in self.store.g.out_edges(chain[-1], keys=True) if k == "subcategory_of"]
            if not nxt:
                return tuple(chain)
            chain.append(nxt[0])

    def category_proximity(self, category: str | None, terms: Iterable[str]) -> float:
        """How close a product's category is to the categories a query names: 0.5 ** (1 + d)
        for taxonomy distance d between their Google nodes (0.5 for two article types on the
        same node, 0.125 for sibling nodes), times the confidence of the less sure of the two
        mappings (1 for reviewed ones); 0 beyond 4 hops or without a mapping."""
        self._fresh()
        key = (category, tuple(terms))
        hit = self._prox_cache.get(key)
        if hit is not None:
            return hit
        if len(self._prox_cache) > 100_000:
            self._prox_cache.clear()
        best = self._prox_cache[key] = self._category_proximity(category, key[1])
        return best

    def _category_proximity(self, category: str | None, terms: tuple[str, ...]) -> float:
        tp = self.taxonomy_of(category)
        if tp is None:
            return 0.0
        sure = self.mapping_confidence(category)
        best = 0.0
        for t in terms:
            for tn, c in self._term_places(t):
                d = self.taxonomy_distance(tp, tn)
                if d is not None and d <= 4:  # as sure as the less sure of the two mappings
                    best = max(best, 0.5 ** (1 + d) * min(sure, c))
        return best

    def _term_places(self, t: str) -> frozenset[tuple[str | None, float]]:
        """(taxonomy node, mapping confidence) of each category leaf under query term ``t``."""
        self._fresh()
        hit = self._term_cache.get(t)
        if hit is None:
            g = self.store.g
            hit = self._term_cache[t] = frozenset({(t, 1.0)}) if t.startswith("taxonomy:") else frozenset(
                (self.taxonomy_of(name), self.mapping_confidence(name)) for name in
                (g.nodes[leaf].get("name") for leaf in self.store.category_leaves(t) if leaf in g))
        return hit

    def mapping_confidence(self, category: str | None) -> float:
        """How sure the category's place on the taxonomy is (1 for the reviewed mapping)."""
        return self._placed(category)[1] if category else 0.0

    def category_name(self, node: str) -> str:
        d = self.store.g.nodes.get(node) or {}
        return str(d.get("name") or node.split(":", 1)[-1])

    def complements_of(self, category: str | None, gender: str | None = None) -> dict[str, list[str]]:
        """Complementary category names -> the outfits that pair them, for ``gender``."""
        out: dict[str, list[str]] = {}
        if not category:
            return out
        g = self.store.g
        node = self.store.category_node(category)
        if node not in g:
            return out
        for _, target, d in g.out_edges(node, data=True):
            if d.get("relation") != "complements":
                continue
            if gender and d.get("genders") and gender not in d["genders"]:
                continue
            names = out.setdefault(self.category_name(target), [])
            if d["outfit"] not in names:
                names.append(d["outfit"])
        return out

    def relation(self, cat_a: str | None, cat_b: str | None, gender: str | None = None) -> str:
        """substitutes (same category or same taxonomy node), complements (an outfit pairs
        them) or unrelated."""
        if not cat_a or not cat_b:
            return "unrelated"
        if norm_key(cat_a) == norm_key(cat_b):
            return "substitutes"
        if any(norm_key(c) == norm_key(cat_b) for c in self.complements_of(cat_a, gender)):
            return "complements"
        ta, tb = self.taxonomy_of(cat_a), self.taxonomy_of(cat_b)
        if ta is not None and ta == tb:
            return "substitutes"
        return "unrelated"


def _tree_distance(a: tuple[str, ...], b: tuple[str, ...]) -> int | None:
    """Distance between the first nodes of two root-ward chains."""
    pos = {n: i for i, n in enumerate(b)}
    for i, n in enumerate(a):
        if n in pos:
            return i + pos[n]
    return None
