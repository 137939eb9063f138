"""The graph's nodes and edges and the products on them: what :class:`~vitrine.index.graph.ProductGraph`
keeps, kept in step with the vector index (``upsert``/``delete`` with plain dicts).

:class:`GraphStore` wraps the ``networkx.MultiDiGraph`` of the catalogue's values (node kinds in
:mod:`vitrine.index.graph`), builds its category backbone from the reviewed data, and indexes the
live products on it: each product's facts as a row of integer codes (one code per distinct value
of a field, each code on the graph node of its value), its id, and a count of live products per
code. A product is an edge from its id to each of its fact values, kept as that row rather than
as a networkx node: at 1M products a node and its edges per product were ~2.7 KB of Python
objects per product per process, 40 s to load, and pages a forked worker copies as soon as it
reads them; the rows are arrays a snapshot keeps as they are. Which products sit on a node is a
scan of one code column. Two counters tell derived structures when to recompute: ``vocab_epoch``
(the query vocabulary's names) and ``categories_epoch`` (the category tree).
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

FORMAT_VERSION = 2  # 1: products as networkx nodes (still read: they become rows)
ProductRows = tuple[list[str | None], dict[str, list[str]], np.ndarray]  # pid by iid, values per field, codes


class GraphStore:
    """The graph, its category backbone, and the live products' facts and postings."""

    def __init__(self, data: GraphData, graph: nx.MultiDiGraph | None = None,
                 products: "ProductRows | None" = None) -> None:
        self.data = data
        self.lock = threading.RLock()  # hold it to read several facts as of one moment (every write takes it)
        self.vocab_epoch = 0  # bumped when a name the query vocabulary holds may have changed
        self.categories_epoch = 0  # bumped when the category tree changed
        self.read_facts = FactReader(data)
        self._codes = FactCodes()  # each product's facts as a row of codes
        self._pids: list[str | None] = []  # product id by iid (None: no such product)
        self._iid_of: dict[str, int] = {}
        self._count: dict[str, np.ndarray] = {f: np.zeros(0, dtype=np.int64) for f in FACT_FIELDS}  # per code
        self._node_codes: dict[str, list[tuple[str, int]]] = {}  # value node -> (field, code) of its values
        self._coded = {f: 0 for f in FACT_FIELDS}  # codes already placed on their nodes
        self._leaves_cache: dict[str, frozenset[str]] = {}
        # product sets computed from the postings (per query terms): dropped on any product change
        self._sets_cache = IdSetCache(entries=1024)
        if graph is None:
            self.g = nx.MultiDiGraph(format=FORMAT_VERSION, fingerprint=data.fingerprint)
            self._build_backbone()
        else:
            self.g = graph
            self._take_product_nodes()
        if products is not None:
            self._restore(*products)

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
            if facts.category:
                leaf = self._category_node(facts.category, leaf=True, path=path)
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
            self._keep(facts)

    def _keep(self, facts: ProductFacts) -> None:
        """Index a live product's facts: its row of codes, their counts, its pid's iid."""
        iid = facts.iid
        self._codes.set(iid, [getattr(facts, f) for f in FACT_FIELDS])
        self._place_new_codes()
        for f, c in zip(FACT_FIELDS, self._codes.rows()[iid].tolist()):
            if c >= 0:
                self._count[f][c] += 1
        if iid >= len(self._pids):
            self._pids.extend([None] * (iid + 1 - len(self._pids)))
        self._pids[iid] = facts.pid
        self._iid_of[facts.pid] = iid

    def _unkeep(self, iid: int) -> None:
        for f, c in zip(FACT_FIELDS, self._codes.rows()[iid].tolist()):
            if c >= 0:
                self._count[f][c] -= 1
        self._codes.drop(iid)
        pid = self._pids[iid] if iid < len(self._pids) else None
        if pid is not None:
            self._pids[iid] = None
            self._iid_of.pop(pid, None)

    def _place_new_codes(self) -> None:
        """Put the fact values first seen since the last call on their graph nodes."""
        for f in FACT_FIELDS:
            values = self._codes.values(f)
            if self._coded[f] == len(values):
                continue
            for c in range(self._coded[f], len(values)):
                self._node_codes.setdefault(self._value_node(f, values[c]), []).append((f, c))
            self._coded[f] = len(values)
            if len(self._count[f]) < len(values):
                grown = np.zeros(max(16, 2 * len(values)), dtype=np.int64)
                grown[: len(self._count[f])] = self._count[f]
                self._count[f] = grown

    def _value_node(self, f: str, value: str) -> str:
        return self.category_node(value) if f == "category" else f"{f}:{norm_key(value)}"

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
        iid = self._iid_of.get(pid)
        if iid is None:
            return False
        self._sets_cache.clear()
        self._unkeep(iid)
        return True

    def delete(self, pids: Iterable[str]) -> int:
        with self.lock:
            return sum(self._remove(p) for p in pids)

    def delete_iids(self, iids: Iterable[int]) -> int:
        with self.lock:
            pids = [p for i in iids if 0 <= i < len(self._pids) and (p := self._pids[i]) is not None]
            return self.delete(pids)

    def _take_product_nodes(self) -> None:
        """A graph saved in format 1 holds its products as nodes: they become rows."""
        nodes = [(n, d) for n, d in self.g.nodes(data=True) if d.get("kind") == "product"]
        for node, d in nodes:
            self._keep(ProductFacts(iid=int(d["iid"]), pid=node.split(":", 1)[1], **{k: d.get(k) for k in FACT_FIELDS}))
            if d.get("brand"):
                self.data.brands.learn(d["brand"])
        self.g.remove_nodes_from([n for n, _ in nodes])
        self.g.graph["format"] = FORMAT_VERSION

    def product_rows(self) -> "ProductRows":
        """The products as a saved graph keeps them: (pid by iid, values per field, code rows)."""
        with self.lock:
            return list(self._pids), {f: list(self._codes.values(f)) for f in FACT_FIELDS}, self._codes.rows().copy()

    def _restore(self, pids: list[str | None], values: dict[str, list[str]], rows: np.ndarray) -> None:
        self._codes.restore(values, rows)
        self._pids = list(pids)
        self._iid_of = {p: i for i, p in enumerate(self._pids) if p is not None}
        self._place_new_codes()
        for f in FACT_FIELDS:
            col = self._codes.column(f)
            n = np.bincount(col[col >= 0], minlength=len(self._count[f]))
            self._count[f][: len(n)] = n
        for b in values["brand"]:
            self.data.brands.learn(b)

    # -- reads ----------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._iid_of)

    def __contains__(self, pid: object) -> bool:
        return pid in self._iid_of

    def postings(self, node: str) -> np.ndarray:
        """iids of the live products on an attribute or category node, ascending."""
        return self._on_nodes((node,))

    def on_node(self, node: str) -> int:
        """How many live products sit on a node."""
        return sum(int(self._count[f][c]) for f, c in self._node_codes.get(node, ()))

    def _on_nodes(self, nodes: Iterable[str]) -> np.ndarray:
        """iids of the live products on any of ``nodes`` (all of one field), ascending."""
        placed = [fc for n in nodes for fc in self._node_codes.get(n, ())]
        if not placed:
            return np.zeros(0, dtype=np.int64)
        return self._codes.postings(placed[0][0], [c for _, c in placed])

    def facts(self, iid: int) -> ProductFacts | None:
        pid = self._pids[iid] if 0 <= iid < len(self._pids) else None
        if pid is None:
            return None
        row = self._codes.rows()[iid].tolist()
        return ProductFacts(iid, pid, *(self._codes.value(f, c) for f, c in zip(FACT_FIELDS, row)))

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
        return self.facts(iid) if iid is not None else None

    def products_with(self, f: str, values: Iterable[str]) -> set[int]:
        """iids of products holding any of ``values`` for field ``f`` (categories expand to
        every leaf under the named category or taxonomy node)."""
        return set(self.product_ids_with(f, values).tolist())

    def product_ids_with(self, f: str, values: Iterable[str]) -> np.ndarray:
        """:meth:`products_with` as ascending iids (read-only: it may be the postings' own array)."""
        with self.lock:
            if f == "category":
                nodes = {leaf for v in values for leaf in self.category_leaves(v)}
            else:
                nodes = {f"{f}:{norm_key(v)}" for v in values}
            return self._on_nodes(nodes)

    def product_set(self, key: Hashable, compute: Callable[[], Iterable[int]]) -> np.ndarray:
        """The sorted iids ``compute()`` gives, remembered under ``key`` until any product changes
        (read-only: shared by every caller with this key)."""
        with self.lock:
            out = self._sets_cache.get(key, lambda: _sorted_ids(compute()))
            assert out is not None
            return out

    def products_of_category(self, name: str) -> set[int]:
        """iids of products whose own (leaf) category is ``name``: no group expansion."""
        with self.lock:
            return set(self.postings(self.category_node(name)).tolist())

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
            return any(self.on_node(leaf) for leaf in self.category_leaves(value))
        if self.on_node(f"{f}:{norm_key(value)}"):
            return True
        if f == "colour":
            fam = self.data.colours.family_of(value)
            return fam is not None and fam not in self.data.colours.universal and any(
                self.on_node(f"colour:{k}") for k, kf in self.data.colours.family.items() if kf == fam)
        return False


def _sorted_ids(ids: Iterable[int]) -> np.ndarray:
    """Ascending int64 ids of an iterable of distinct ids (an array as it is, sorted)."""
    if isinstance(ids, np.ndarray):
        return np.sort(ids.astype(np.int64, copy=False))
    return np.array(sorted(ids), dtype=np.int64)
