"""The graph's nodes and edges and the products on them: what :class:`~vitrine.index.graph.ProductGraph`
keeps, kept in step with the vector index (``upsert``/``delete`` with plain dicts).

:class:`GraphStore` wraps the ``networkx.MultiDiGraph`` (node kinds in :mod:`vitrine.index.graph`),
builds its category backbone from the reviewed data, and indexes the live products: their facts by
iid (and as integer codes for whole-pool reads) and a posting set of iids per attribute and
category node. Two counters tell derived structures when to recompute: ``vocab_epoch`` (the
query vocabulary's names) and ``categories_epoch`` (the category tree).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any

import networkx as nx
import numpy as np

from vitrine.index.cache import IdSetCache
from vitrine.index.fact_codes import FACT_FIELDS, FactCodes
from vitrine.index.graph_facts import FactReader, ProductFacts
from vitrine.index.learned import learn_title_brands, map_category, premap
from vitrine.index.vocabulary import ATTRIBUTE_FIELDS, GraphData, norm_key

FORMAT_VERSION = 1


class GraphStore:
    """The graph, its category backbone, and the live products' facts and postings."""

    def __init__(self, data: GraphData, graph: nx.MultiDiGraph | None = None) -> None:
        self.data = data
        self.lock = threading.RLock()  # hold it to read several facts as of one moment (every write takes it)
        self.vocab_epoch = 0  # bumped when a name the query vocabulary holds may have changed
        self.categories_epoch = 0  # bumped when the category tree changed
        self.read_facts = FactReader(data)
        self._facts: dict[int, ProductFacts] = {}
        self._codes = FactCodes()  # the same facts as integer codes, for whole-pool reads
        self._iid_of: dict[str, int] = {}
        self._post: dict[str, set[int]] = {}  # attribute / category node -> iids
        self._leaves_cache: dict[str, frozenset[str]] = {}
        # product sets computed from the postings (per query terms): dropped on any product change
        self._sets_cache = IdSetCache(entries=1024)
        if graph is None:
            self.g = nx.MultiDiGraph(format=FORMAT_VERSION, fingerprint=data.fingerprint)
            self._build_backbone()
        else:
            self.g = graph
            self._reindex()

    # -- backbone ---------------------------------------------------------------------------------
    def _taxonomy_node(self, tid: int) -> str:
        """Add taxonomy node ``tid`` and its ancestors; returns its node id."""
        path = self.data.taxonomy.get(tid)
        node = f"taxonomy:{tid}"
        if path is None or node in self.g:
            return node
        by_path = self.data.path_index()
        child = None
        for depth in range(len(path), 0, -1):
            sub = path[:depth]
            t = by_path.get(sub)
            if t is None:
                break
            n = f"taxonomy:{t}"
            fresh = n not in self.g
            if fresh:
                self.g.add_node(n, kind="taxonomy", tid=t, name=sub[-1], path=" > ".join(sub), depth=depth)
            if child is not None and not self.g.has_edge(child, n, key="subcategory_of"):
                self.g.add_edge(child, n, key="subcategory_of")
            if not fresh:
                break
            child = n
        return node

    def _category_node(self, name: str, *, leaf: bool = False, path: Sequence[str] | None = None) -> str:
        """The category node of ``name`` (created when new). A leaf (what products are) maps to
        its Google taxonomy node (:func:`~vitrine.index.learned.map_category`); the mapping, with
        its confidence, is kept on the node and persisted with the graph."""
        key = norm_key(name)
        node = f"category:{key}"
        if node not in self.g:
            self.g.add_node(node, kind="category", name=name)
            self.vocab_epoch += 1
            self._categories_changed()
        if leaf and not self.g.nodes[node].get("mapped"):
            m = map_category(self.data, name, path or (name,))
            self.g.nodes[node].update(mapped=True, map=m.as_dict())
            if m.taxonomy_id is not None and m.taxonomy_id in self.data.taxonomy:
                self.g.add_edge(node, self._taxonomy_node(m.taxonomy_id), key="maps_to", source=m.source,
                                confidence=m.confidence)
                self._categories_changed()
        return node

    def _categories_changed(self) -> None:
        """The category tree changed: what was derived from it (leaves per group, proximities,
        product sets over groups) is recomputed on demand."""
        self.categories_epoch += 1
        self._leaves_cache.clear()
        self._sets_cache.clear()

    def _build_backbone(self) -> None:
        for _key, (_tid, name) in sorted(self.data.category_map.items()):
            self._category_node(name, leaf=True)
        for o in self.data.outfits:
            for i, slot in enumerate(o.slots):
                for j, other in enumerate(o.slots):
                    if i == j:
                        continue
                    for a in slot:
                        for b in other:
                            if norm_key(a) == norm_key(b):
                                continue
                            na, nb = self._category_node(a, leaf=True), self._category_node(b, leaf=True)
                            ek = f"complements:{o.name}:{','.join(o.genders)}"
                            if not self.g.has_edge(na, nb, key=ek):
                                self.g.add_edge(na, nb, key=ek, relation="complements", outfit=o.name,
                                                genders=list(o.genders))

    # -- products -----------------------------------------------------------------------------------
    def upsert(self, iid: int, pid: str, doc: Mapping[str, Any]) -> None:
        with self.lock:
            self._remove(pid)
            self._sets_cache.clear()
            facts, path = self.read_facts(iid, pid, doc)
            node = f"product:{pid}"
            self.g.add_node(node, kind="product", iid=iid, **{
                k: v for k, v in facts.__dict__.items() if k not in ("iid", "pid") and v is not None})
            if facts.category:
                leaf = self._category_node(facts.category, leaf=True, path=path)
                self.g.add_edge(node, leaf, key="is_a")
                self._post.setdefault(leaf, set()).add(iid)
                child = leaf
                for parent in reversed(path[:-1]):
                    pn = self._category_node(parent)
                    if pn != child and not self.g.has_edge(child, pn, key="in_group"):
                        self.g.add_edge(child, pn, key="in_group")
                        self._categories_changed()
                    child = pn
            for f in ATTRIBUTE_FIELDS:
                v = getattr(facts, f)
                if v is None:
                    continue
                an = f"{f}:{norm_key(v)}"
                if an not in self.g:
                    self.g.add_node(an, kind=f, name=v)
                    self.vocab_epoch += 1
                    if f == "brand":
                        self.data.brands.learn(v)
                self.g.add_edge(node, an, key=f)
                self._post.setdefault(an, set()).add(iid)
            self._keep(facts)

    def _keep(self, facts: ProductFacts) -> None:
        """Index a product's facts: by iid, as fact codes, and its pid's iid."""
        self._facts[facts.iid] = facts
        self._codes.set(facts.iid, [getattr(facts, f) for f in FACT_FIELDS])
        self._iid_of[facts.pid] = facts.iid

    def upsert_many(self, items: Iterable[tuple[int, str, Mapping[str, Any]]]) -> int:
        n = 0
        items = list(items)
        with self.lock:
            docs = [doc for _, _, doc in items]
            premap(self.data, docs, lambda name: bool((self.g.nodes.get(self.category_node(name)) or {}).get("mapped")))
            if learn_title_brands(self.data, docs):
                self.vocab_epoch += 1
            for iid, pid, doc in items:
                self.upsert(iid, pid, doc)
                n += 1
        return n

    def _remove(self, pid: str) -> bool:
        node = f"product:{pid}"
        if node not in self.g:
            return False
        iid = self._iid_of.pop(pid, None)
        self._sets_cache.clear()
        for _, target in self.g.out_edges(node):
            s = self._post.get(target)
            if s is not None and iid is not None:
                s.discard(iid)
        self.g.remove_node(node)
        if iid is not None:
            self._facts.pop(iid, None)
            self._codes.drop(iid)
        return True

    def delete(self, pids: Iterable[str]) -> int:
        with self.lock:
            return sum(self._remove(p) for p in pids)

    def delete_iids(self, iids: Iterable[int]) -> int:
        with self.lock:
            pids = [self._facts[i].pid for i in iids if i in self._facts]
            return self.delete(pids)

    def _reindex(self) -> None:
        self._sets_cache.clear()
        self._facts.clear()
        self._codes.clear()
        self._iid_of.clear()
        self._post.clear()
        for node, d in self.g.nodes(data=True):
            if d.get("kind") != "product":
                continue
            pid = node.split(":", 1)[1]
            iid = int(d["iid"])
            self._keep(ProductFacts(iid=iid, pid=pid, **{k: d.get(k) for k in FACT_FIELDS}))
            for _, target in self.g.out_edges(node):
                self._post.setdefault(target, set()).add(iid)
            if d.get("brand"):
                self.data.brands.learn(d["brand"])

    # -- reads ----------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._facts)

    def __contains__(self, pid: object) -> bool:
        return pid in self._iid_of

    def postings(self, node: str) -> set[int]:
        """iids of the live products on an attribute or category node (the store's own set: read
        it, never change it)."""
        return self._post.get(node, set())

    def facts(self, iid: int) -> ProductFacts | None:
        return self._facts.get(iid)

    def fact_codes(self, iids: np.ndarray, fields: Sequence[str]) -> np.ndarray:
        """The facts ``fields`` of each of ``iids`` at once, as a (len(iids), len(fields)) matrix of
        codes (:meth:`fact_value` reads one back): a pool's distinct rows are few, so a caller
        works per distinct row, not per product."""
        with self.lock:
            return self._codes.of(iids, fields)

    def fact_value(self, field: str, code: int) -> str | None:
        """The value of ``field`` a code of :meth:`fact_codes` stands for (None: no value)."""
        return self._codes.value(field, code)

    def facts_of(self, pid: str) -> ProductFacts | None:
        iid = self._iid_of.get(pid)
        return self._facts.get(iid) if iid is not None else None

    def products_with(self, f: str, values: Iterable[str]) -> set[int]:
        """iids of products holding any of ``values`` for field ``f`` (categories expand to
        every leaf under the named category or taxonomy node)."""
        out: set[int] = set()
        with self.lock:
            for v in values:
                if f == "category":
                    for leaf in self.category_leaves(v):
                        out |= self._post.get(leaf, set())
                else:
                    out |= self._post.get(f"{f}:{norm_key(v)}", set())
        return out

    def product_set(self, key: Hashable, compute: Callable[[], Iterable[int]]) -> np.ndarray:
        """The sorted iids ``compute()`` gives, remembered under ``key`` until any product changes
        (read-only: shared by every caller with this key)."""
        with self.lock:
            out = self._sets_cache.get(key, lambda: np.array(sorted(compute()), dtype=np.int64))
            assert out is not None
            return out

    def products_of_category(self, name: str) -> set[int]:
        """iids of products whose own (leaf) category is ``name``: no group expansion."""
        with self.lock:
            return set(self._post.get(self.category_node(name), set()))

    def category_node(self, name: str) -> str:
        return f"category:{norm_key(name)}"

    def category_leaves(self, node: str) -> frozenset[str]:
        """Category nodes under ``node`` (itself included): via ``in_group`` for catalogue
        groups, via ``maps_to``/``subcategory_of`` for taxonomy nodes."""
        if not node.startswith(("category:", "taxonomy:")):
            node = self.category_node(node)
        hit = self._leaves_cache.get(node)
        if hit is not None:
            return hit
        out: set[str] = set()
        if node in self.g:
            stack = [node]
            seen = {node}
            while stack:
                n = stack.pop()
                if n.startswith("category:"):
                    out.add(n)
                for src, _, key in self.g.in_edges(n, keys=True):
                    if key in ("in_group", "maps_to", "subcategory_of") and src not in seen:
                        seen.add(src)
                        stack.append(src)
        res = frozenset(out)
        self._leaves_cache[node] = res
        return res

    def holds(self, f: str, value: str) -> bool:
        """Whether a live product holds this graph value (a category: any leaf under it; a
        colour: that colour or one of its family). A query term the catalogue does not hold
        never becomes a graph signal."""
        if f == "category":
            return any(self._post.get(leaf) for leaf in self.category_leaves(value))
        if self._post.get(f"{f}:{norm_key(value)}"):
            return True
        if f == "colour":
            fam = self.data.colours.family_of(value)
            return fam is not None and fam not in self.data.colours.universal and any(
                self._post.get(f"colour:{k}") for k, kf in self.data.colours.family.items() if kf == fam)
        return False
