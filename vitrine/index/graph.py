"""The product knowledge graph: products, brands, categories and attribute values.

``ProductGraph`` wraps a ``networkx.MultiDiGraph`` of the catalogue's values, and the products on
them. Node ids are ``kind:key`` strings:

- products — each live product points at its own attribute values and its leaf category; these
  edges are kept as a row of value codes per product (:mod:`vitrine.index.graph_store`), not as a
  networkx node per product, so a million products cost arrays, not millions of Python objects;
- ``brand:<key>``, ``colour:<key>``, ``gender:<key>``, ``season:<key>``, ``usage:<key>`` — attribute
  values;
- ``category:<key>`` — every name on a product's category path; the leaf is what a product
  ``is_a``; each level points at its parent (``in_group``) and a leaf at the node of Google's
  product taxonomy it ``maps_to`` (the reviewed ``category_map.csv``, else the automatic
  mapping of :mod:`vitrine.index.taxonomy_map`, with its confidence; none below its threshold);
- ``taxonomy:<id>`` — the Google taxonomy nodes the mapping uses and their ancestors
  (``subcategory_of`` edges): the category backbone;
- ``complements`` edges between categories (from ``complements.json``: what goes with what,
  per outfit and gender).

The words, brands, colours and reviewed data the graph is built on live in
:mod:`vitrine.index.vocabulary`; what it learns from the catalogue (category paths, their place on
the taxonomy, title brands and colours) in :mod:`vitrine.index.learned`. ``ProductGraph`` composes
four parts, each its own module:

- :mod:`vitrine.index.graph_store`: the nodes, edges and live products (facts, postings), updated
  in step with the vector index (``upsert``/``delete`` with plain dicts); a product's facts are
  read by :mod:`vitrine.index.graph_facts` (its explicit ``brand`` field wins; a title whose brand
  the lexicon lacks teaches a new one);
- :mod:`vitrine.index.graph_categories`: taxonomy places, proximities, complements;
- :mod:`vitrine.index.graph_query`: which graph values a query's words name;
- :mod:`vitrine.index.graph_files`: one file on disk (node-link JSON of the values, the products'
  code rows as an array; never pickle) with a SHA-256 the engine's snapshot manifest records.

This module knows nothing of the search layer.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np

from vitrine.errors import StorageError

from vitrine.index.graph_categories import CategoryRelations
from vitrine.index.graph_facts import ProductFacts
from vitrine.index.graph_files import read_graph, save_graph
from vitrine.index.graph_query import QueryMatcher
from vitrine.index.graph_store import GraphStore, ProductRows
from vitrine.index.vocabulary import GraphData, QueryTerms


class ProductGraph:
    """Products, brands, categories and attribute values in one ``networkx.MultiDiGraph``: the
    store of them (``store``), how categories relate (``categories``) and what a query names
    (``query``)."""

    def __init__(self, data: GraphData | None = None, graph: nx.MultiDiGraph | None = None,
                 products: ProductRows | None = None) -> None:
        self.store = GraphStore(data or GraphData(), graph, products)
        self.categories = CategoryRelations(self.store)
        self.query = QueryMatcher(self.store)

    @property
    def data(self) -> GraphData:
        return self.store.data

    @property
    def g(self) -> nx.MultiDiGraph:
        return self.store.g

    @property
    def lock(self) -> threading.RLock:
        """The graph's lock: hold it to read several of its facts as of one moment (every
        write takes it)."""
        return self.store.lock

    # -- products (the store) ----------------------------------------------------------------------
    def facts_from_doc(self, iid: int, pid: str, doc: Mapping[str, Any]) -> tuple[ProductFacts, list[str]]:
        return self.store.read_facts(iid, pid, doc)

    def upsert(self, iid: int, pid: str, doc: Mapping[str, Any]) -> None:
        self.store.upsert(iid, pid, doc)

    def upsert_many(self, items: Iterable[tuple[int, str, Mapping[str, Any]]]) -> int:
        return self.store.upsert_many(items)

    def delete(self, pids: Iterable[str]) -> int:
        return self.store.delete(pids)

    def delete_iids(self, iids: Iterable[int]) -> int:
        return self.store.delete_iids(iids)

    def __len__(self) -> int:
        return len(self.store)

    def __contains__(self, pid: object) -> bool:
        return pid in self.store

    def facts(self, iid: int) -> ProductFacts | None:
        return self.store.facts(iid)

    def fact_codes(self, iids: np.ndarray, fields: Sequence[str]) -> np.ndarray:
        """See :meth:`GraphStore.fact_codes`."""
        return self.store.fact_codes(iids, fields)

    def fact_value(self, field: str, code: int) -> str | None:
        return self.store.fact_value(field, code)

    def facts_of(self, pid: str) -> ProductFacts | None:
        return self.store.facts_of(pid)

    def products_with(self, f: str, values: Iterable[str]) -> set[int]:
        """See :meth:`GraphStore.products_with`."""
        return self.store.products_with(f, values)

    def product_ids_with(self, f: str, values: Iterable[str]) -> np.ndarray:
        """See :meth:`GraphStore.product_ids_with`."""
        return self.store.product_ids_with(f, values)

    def product_set(self, key: Hashable, compute: Callable[[], Iterable[int]]) -> np.ndarray:
        """See :meth:`GraphStore.product_set`."""
        return self.store.product_set(key, compute)

    def products_of_category(self, name: str) -> set[int]:
        return self.store.products_of_category(name)

    def category_node(self, name: str) -> str:
        return self.store.category_node(name)

    def category_leaves(self, node: str) -> frozenset[str]:
        return self.store.category_leaves(node)

    def holds(self, f: str, value: str) -> bool:
        """See :meth:`GraphStore.holds`."""
        return self.store.holds(f, value)

    # -- categories ----------------------------------------------------------------------------------
    def mapping(self) -> list[dict[str, Any]]:
        return self.categories.mapping()

    def taxonomy_of(self, category: str | None) -> str | None:
        return self.categories.taxonomy_of(category)

    def taxonomy_distance(self, a: str | None, b: str | None) -> int | None:
        return self.categories.taxonomy_distance(a, b)

    def category_proximity(self, category: str | None, terms: Iterable[str]) -> float:
        """See :meth:`CategoryRelations.category_proximity`."""
        return self.categories.category_proximity(category, terms)

    def mapping_confidence(self, category: str | None) -> float:
        return self.categories.mapping_confidence(category)

    def category_name(self, node: str) -> str:
        return self.categories.category_name(node)

    def complements_of(self, category: str | None, gender: str | None = None) -> dict[str, list[str]]:
        return self.categories.complements_of(category, gender)

    def relation(self, cat_a: str | None, cat_b: str | None, gender: str | None = None) -> str:
        return self.categories.relation(cat_a, cat_b, gender)

    def colour_compatible(self, a: str | None, b: str | None) -> tuple[bool, str]:
        return self.data.colours.compatible(a, b)

    # -- query vocabulary ----------------------------------------------------------------------------
    def match_query(self, text: str | None) -> QueryTerms:
        """See :meth:`QueryMatcher.match_query`."""
        return self.query.match_query(text)

    def phrasings(self) -> dict[str, list[str]]:
        """See :meth:`QueryMatcher.phrasings`."""
        return self.query.phrasings()

    # -- persistence ---------------------------------------------------------------------------------
    def save(self, path: str | Path) -> str:
        """Write the graph and its products atomically (vitrine/index/graph_files.py); returns the
        file's SHA-256."""
        return save_graph(self.store, path)

    @classmethod
    def load(cls, path: str | Path, data: GraphData, expected_sha256: str | None = None) -> "ProductGraph":
        """Read a saved graph; StorageError if it is unreadable, fails its checksum, or was built
        from other graph data (then rebuild from the records)."""
        g, products = read_graph(path, data, expected_sha256)
        try:
            return cls(data, graph=g, products=products)
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise StorageError(f"graph {path} holds inconsistent products: {e}") from e

    def stats(self) -> dict[str, Any]:
        s = self.store
        kinds = Counter(d.get("kind") for _, d in s.g.nodes(data=True))
        return {"nodes": s.g.number_of_nodes(), "edges": s.g.number_of_edges(), "products": len(s),
                "brands": kinds.get("brand", 0), "categories": kinds.get("category", 0),
                "taxonomy_nodes": kinds.get("taxonomy", 0),
                "categories_mapped": Counter((d.get("map") or {}).get("source") for _, d in s.g.nodes(data=True)
                                             if d.get("kind") == "category" and d.get("map")
                                             and s.on_node(s.category_node(d["name"])))}
