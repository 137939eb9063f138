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
        self._prox_epoch = store.categories_epoch  # the cache holds for this category tree

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

    def taxonomy_of(self, category: str | None) -> str | None:
        if not category:
            return None
        g = self.store.g
        node = self.store.category_node(category)
        if node not in g:
            return None
        for _, target, key in g.out_edges(node, keys=True):
            if key == "maps_to":
                return target
        return None

    def taxonomy_distance(self, a: str | None, b: str | None) -> int | None:
        """Tree distance between two taxonomy nodes (None when either is unknown)."""
        g = self.store.g
        if a is None or b is None or a not in g or b not in g:
            return None
        return _tree_distance(self._ancestors(a), self._ancestors(b))

    def _ancestors(self, node: str) -> tuple[str, ...]:
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
        if self._prox_epoch != self.store.categories_epoch:
            self._prox_cache.clear()
            self._prox_epoch = self.store.categories_epoch
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
        g = self.store.g
        sure = self.mapping_confidence(category)
        best = 0.0
        for t in terms:
            tax_nodes = {(t, 1.0)} if t.startswith("taxonomy:") else {
                (self.taxonomy_of(name), self.mapping_confidence(name)) for name in
                (g.nodes[leaf].get("name") for leaf in self.store.category_leaves(t) if leaf in g)}
            for tn, c in tax_nodes:
                d = self.taxonomy_distance(tp, tn)
                if d is not None and d <= 4:  # as sure as the less sure of the two mappings
                    best = max(best, 0.5 ** (1 + d) * min(sure, c))
        return best

    def mapping_confidence(self, category: str | None) -> float:
        """How sure the category's place on the taxonomy is (1 for the reviewed mapping)."""
        if not category:
            return 0.0
        g = self.store.g
        node = self.store.category_node(category)
        if node not in g:
            return 0.0
        for _, _, key, d in g.out_edges(node, keys=True, data=True):
            if key == "maps_to":
                return float(d.get("confidence", 1.0))
        return 0.0

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
