"""The product knowledge graph: products, brands, categories and attribute values.

``ProductGraph`` wraps a ``networkx.MultiDiGraph``. Node ids are ``kind:key`` strings:

- ``product:<id>`` — one per live product (attributes: iid, category, brand, colour, gender, ...);
- ``brand:<key>``, ``colour:<key>``, ``gender:<key>``, ``season:<key>``, ``usage:<key>`` — attribute
  values, each product points at its own (edge keys ``brand``, ``colour``, ...);
- ``category:<key>`` — every name on a product's category path; the leaf is what a product
  ``is_a``; each level points at its parent (``in_group``) and a leaf at the node of Google's
  product taxonomy it ``maps_to`` (the reviewed ``category_map.csv``, else the automatic
  mapping of :mod:`vitrine.index.taxonomy_map`, with its confidence; none below its threshold);
- ``taxonomy:<id>`` — the Google taxonomy nodes the mapping uses and their ancestors
  (``subcategory_of`` edges): the category backbone;
- ``complements`` edges between categories (from ``complements.json``: what goes with what,
  per outfit and gender).

The words, brands, colours and reviewed data the graph is built on live in
:mod:`vitrine.index.vocabulary` (re-exported here); what it learns from the catalogue (category
paths, their place on the taxonomy, title brands and colours) in :mod:`vitrine.index.learned`. A product's explicit ``brand`` field wins;
a title whose brand the lexicon lacks teaches a new one.

The graph is updated in step with the vector index (``upsert``/``delete`` with plain dicts) and
persisted as node-link JSON (never pickle) with a SHA-256 the engine's snapshot manifest
records. This module knows nothing of the search layer.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np

from vitrine.atomic import atomic_write_bytes
from vitrine.errors import StorageError
from vitrine.index.cache import IdSetCache
from vitrine.index.fact_codes import FACT_FIELDS, FactCodes
from vitrine.index.learned import TitleColours, category_path, learn_title_brands, map_category, premap
from vitrine.index.vectors import read_verified
from vitrine.index.vocabulary import (
    ATTR_KEYS,
    ATTRIBUTE_FIELDS,
    DATA_FILES,
    MAX_PHRASE,
    QUERY_FIELDS,
    TITLE_GENDER_WORDS,
    BrandLexicon,
    ColourRules,
    GraphData,
    Outfit,
    QueryTerms,
    learn_brands,
    leading_brands,
    norm_key,
    plural_variants,
    title_prefix,
    tokenize,
)

__all__ = [
    "ATTRIBUTE_FIELDS", "DATA_FILES", "FORMAT_VERSION", "MAX_PHRASE", "QUERY_FIELDS", "TITLE_GENDER_WORDS",
    "BrandLexicon", "ColourRules", "GraphData", "Outfit", "ProductFacts", "ProductGraph", "QueryTerms",
    "category_path", "learn_brands", "leading_brands", "norm_key", "title_prefix", "tokenize",
]

log = logging.getLogger(__name__)

FORMAT_VERSION = 1


@dataclass
class ProductFacts:
    iid: int
    pid: str
    category: str | None
    brand: str | None
    colour: str | None
    gender: str | None
    season: str | None
    usage: str | None


# -- the graph ---------------------------------------------------------------------------------------
class ProductGraph:
    """Products, brands, categories and attribute values in one ``networkx.MultiDiGraph``."""

    def __init__(self, data: GraphData | None = None, graph: nx.MultiDiGraph | None = None) -> None:
        self.data = data or GraphData()
        self._lock = threading.RLock()
        self._facts: dict[int, ProductFacts] = {}
        self._codes = FactCodes()  # the same facts as integer codes, for whole-pool reads
        self._iid_of: dict[str, int] = {}
        self._post: dict[str, set[int]] = {}  # attribute / category node -> iids
        self._vocab: dict[str, set[tuple[str, str]]] | None = None
        self._colour_in: TitleColours | None = None
        self._leaves_cache: dict[str, frozenset[str]] = {}
        self._prox_cache: dict[tuple[str | None, tuple[str, ...]], float] = {}  # same lifetime
        # product sets computed from the postings (per query terms): dropped on any product change
        self._sets_cache = IdSetCache(entries=1024)
        if graph is None:
            self.g = nx.MultiDiGraph(format=FORMAT_VERSION, fingerprint=self.data.fingerprint)
            self._build_backbone()
        else:
            self.g = graph
            self._reindex()

    @property
    def lock(self) -> threading.RLock:
        """The graph's lock: hold it to read several of its facts as of one moment (every
        write takes it)."""
        return self._lock

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
            self._vocab = None
            self._categories_changed()
        if leaf and not self.g.nodes[node].get("mapped"):
            m = map_category(self.data, name, path or (name,))
            self.g.nodes[node].update(mapped=True, map=m.as_dict())
            if m.taxonomy_id is not None and m.taxonomy_id in self.data.taxonomy:
                self.g.add_edge(node, self._taxonomy_node(m.taxonomy_id), key="maps_to", source=m.source,
                                confidence=m.confidence)
                self._categories_changed()
        return node

    def mapping(self) -> list[dict[str, Any]]:
        """Every leaf category's place on the taxonomy: source, taxonomy id and path, confidence."""
        out = []
        with self._lock:
            for _node, d in self.g.nodes(data=True):
                m = d.get("map")
                if d.get("kind") == "category" and m:
                    tid = m.get("taxonomy_id")
                    out.append({**m, "taxonomy_path": " > ".join(self.data.taxonomy.get(tid, ())) if tid else None,
                                "products": len(self._post.get(self.category_node(d["name"]), ()))})
        return sorted(out, key=lambda m: (-m["products"], m["category"]))

    def _categories_changed(self) -> None:
        """The category tree changed: what was derived from it (leaves per group, proximities,
        product sets over groups) is recomputed on demand."""
        self._leaves_cache.clear()
        self._sets_cache.clear()
        self._prox_cache.clear()

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
    def facts_from_doc(self, iid: int, pid: str, doc: Mapping[str, Any]) -> tuple[ProductFacts, list[str]]:
        attrs = {str(k).casefold(): v for k, v in (doc.get("attributes") or {}).items()}

        def attr(f: str) -> str | None:
            for k in ATTR_KEYS[f]:
                v = attrs.get(k)
                if v not in (None, "", "NA") and not isinstance(v, list):
                    return " ".join(str(v).split())
            return None

        path = category_path(doc)
        brand = doc.get("brand")
        if brand:
            brand = self.data.brands.canonical(str(brand))
        elif doc.get("title"):
            brand = self.data.brands.from_title(str(doc["title"]))
        colour = attr("colour")
        if colour is None and doc.get("title"):
            if self._colour_in is None:
                self._colour_in = TitleColours(self.data)
            colour = self._colour_in(str(doc["title"]))
        facts = ProductFacts(iid=iid, pid=pid, category=path[-1] if path else None, brand=brand,
                             colour=colour, gender=attr("gender"), season=attr("season"),
                             usage=attr("usage"))
        return facts, path

    def upsert(self, iid: int, pid: str, doc: Mapping[str, Any]) -> None:
        with self._lock:
            self._remove(pid)
            self._sets_cache.clear()
            facts, path = self.facts_from_doc(iid, pid, doc)
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
                    self._vocab = None
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
        with self._lock:
            docs = [doc for _, _, doc in items]
            premap(self.data, docs, lambda name: bool((self.g.nodes.get(self.category_node(name)) or {}).get("mapped")))
            if learn_title_brands(self.data, docs):
                self._vocab = None
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
        with self._lock:
            return sum(self._remove(p) for p in pids)

    def delete_iids(self, iids: Iterable[int]) -> int:
        with self._lock:
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

    def facts(self, iid: int) -> ProductFacts | None:
        return self._facts.get(iid)

    def fact_codes(self, iids: np.ndarray, fields: Sequence[str]) -> np.ndarray:
        """The facts ``fields`` of each of ``iids`` at once, as a (len(iids), len(fields)) matrix of
        codes (:meth:`fact_value` reads one back): a pool's distinct rows are few, so a caller
        works per distinct row, not per product."""
        with self._lock:
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
        with self._lock:
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
        with self._lock:
            out = self._sets_cache.get(key, lambda: np.array(sorted(compute()), dtype=np.int64))
            assert out is not None
            return out

    def products_of_category(self, name: str) -> set[int]:
        """iids of products whose own (leaf) category is ``name``: no group expansion."""
        with self._lock:
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

    def taxonomy_of(self, category: str | None) -> str | None:
        if not category:
            return None
        node = self.category_node(category)
        if node not in self.g:
            return None
        for _, target, key in self.g.out_edges(node, keys=True):
            if key == "maps_to":
                return target
        return None

    def taxonomy_distance(self, a: str | None, b: str | None) -> int | None:
        """Tree distance between two taxonomy nodes (None when either is unknown)."""
        if a is None or b is None or a not in self.g or b not in self.g:
            return None
        return _tree_distance(self._ancestors(a), self._ancestors(b))

    def _ancestors(self, node: str) -> tuple[str, ...]:
        chain = [node]
        while True:
            nxt = [t for _, t, k in self.g.out_edges(chain[-1], keys=True) if k == "subcategory_of"]
            if not nxt:
                return tuple(chain)
            chain.append(nxt[0])

    def category_proximity(self, category: str | None, terms: Iterable[str]) -> float:
        """How close a product's category is to the categories a query names: 0.5 ** (1 + d)
        for taxonomy distance d between their Google nodes (0.5 for two article types on the
        same node, 0.125 for sibling nodes), times the confidence of the less sure of the two
        mappings (1 for reviewed ones); 0 beyond 4 hops or without a mapping."""
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
            tax_nodes = {(t, 1.0)} if t.startswith("taxonomy:") else {
                (self.taxonomy_of(name), self.mapping_confidence(name)) for name in
                (self.g.nodes[leaf].get("name") for leaf in self.category_leaves(t) if leaf in self.g)}
            for tn, c in tax_nodes:
                d = self.taxonomy_distance(tp, tn)
                if d is not None and d <= 4:  # as sure as the less sure of the two mappings
                    best = max(best, 0.5 ** (1 + d) * min(sure, c))
        return best

    def mapping_confidence(self, category: str | None) -> float:
        """How sure the category's place on the taxonomy is (1 for the reviewed mapping)."""
        if not category:
            return 0.0
        node = self.category_node(category)
        if node not in self.g:
            return 0.0
        for _, _, key, d in self.g.out_edges(node, keys=True, data=True):
            if key == "maps_to":
                return float(d.get("confidence", 1.0))
        return 0.0

    def category_name(self, node: str) -> str:
        d = self.g.nodes.get(node) or {}
        return str(d.get("name") or node.split(":", 1)[-1])

    def complements_of(self, category: str | None, gender: str | None = None) -> dict[str, list[str]]:
        """Complementary category names -> the outfits that pair them, for ``gender``."""
        out: dict[str, list[str]] = {}
        if not category:
            return out
        node = self.category_node(category)
        if node not in self.g:
            return out
        for _, target, d in self.g.out_edges(node, data=True):
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

    def colour_compatible(self, a: str | None, b: str | None) -> tuple[bool, str]:
        return self.data.colours.compatible(a, b)

    # -- query vocabulary ------------------------------------------------------------------------------
    def _vocabulary(self) -> dict[str, set[tuple[str, str]]]:
        if self._vocab is not None:
            return self._vocab
        voc: dict[str, set[tuple[str, str]]] = {}

        def add(phrase: str, f: str, value: str) -> None:
            k = norm_key(phrase)
            if k:
                voc.setdefault(k, set()).add((f, value))

        spec = self.data.vocabulary
        for node, d in self.g.nodes(data=True):
            kind = d.get("kind")
            if kind == "category":
                for v in plural_variants(d["name"]):
                    add(v, "category", node)
            elif kind == "taxonomy":
                name = d["name"]
                if "&" not in name and "," not in name and d.get("depth", 9) >= 2:
                    for v in plural_variants(name):
                        add(v, "category", node)
            elif kind in ("colour", "gender", "season", "usage"):
                add(d["name"], kind, d["name"])
        for cat, words in (spec.get("category") or {}).items():
            for w in words:
                add(w, "category", self.category_node(cat))
        for f in ("gender", "colour", "usage", "season"):
            for value, words in (spec.get(f) or {}).items():
                add(value, f, value)
                for w in words:
                    add(w, f, value)
        kids = spec.get("kids") or {}
        for w in kids.get("words") or []:
            for g in kids.get("genders") or []:
                add(w, "gender", g)
        for k, hits in voc.items():  # a catalogue category of that name beats a taxonomy node
            if any(v.startswith("category:") for f, v in hits if f == "category"):
                hits -= {(f, v) for f, v in hits if f == "category" and v.startswith("taxonomy:")}
        for key, name in self.data.brands.by_key.items():
            voc.setdefault(key, set()).add(("brand", name))
        self._vocab = voc
        return voc

    def match_query(self, text: str | None) -> QueryTerms:
        """Greedy longest match of the query's words against the graph's vocabulary: category
        (catalogue or taxonomy names and synonyms), brand, colour, gender, usage, season."""
        terms = QueryTerms()
        if not text:
            return terms
        with self._lock:
            voc = self._vocabulary()
            raw = text.split()
            toks = tokenize(text)
            i = 0
            while i < len(toks):
                for n in range(min(MAX_PHRASE, len(toks) - i), 0, -1):
                    span = toks[i:i + n]
                    key = norm_key("".join(span))
                    hits = voc.get(key)
                    if not hits:
                        continue
                    hits = {h for h in hits if not (h[0] == "brand" and key in self.data.brands.exact_keys
                                                    and not _written_exactly(raw, h[1])) and self.holds(*h)}
                    if not hits:
                        continue
                    phrase = " ".join(span)
                    for f, v in sorted(hits):
                        terms.add(f, v, phrase)
                    i += n
                    break
                else:
                    i += 1
        return terms

    def phrasings(self) -> dict[str, list[str]]:
        """Other words shoppers use for the values this catalogue holds, from the graph's query
        vocabulary (``vocabulary.json``: "sneakers" for the category Casual Shoes, "ladies" for
        Women): ``{value casefolded: [words]}``. Pseudo-queries phrase values in them, so that
        `vitrine tune` learns what the graph's signals are worth when a query's words are not the
        records' words."""
        spec = self.data.vocabulary
        out: dict[str, list[str]] = {}
        with self._lock:
            for f in ("category", "gender", "colour", "usage", "season"):
                for value, words in (spec.get(f) or {}).items():
                    node = self.category_node(value) if f == "category" else value
                    if not self.holds(f, node):
                        continue
                    mine = [w for w in words if w.casefold() != value.casefold()]
                    if mine:
                        out.setdefault(value.casefold(), []).extend(mine)
        return out

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

    # -- persistence ---------------------------------------------------------------------------------
    def save(self, path: str | Path) -> str:
        """Write node-link JSON atomically; returns its SHA-256."""
        with self._lock:
            self.g.graph["format"] = FORMAT_VERSION
            self.g.graph["fingerprint"] = self.data.fingerprint
            payload = nx.node_link_data(self.g, edges="edges")
            data = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
        atomic_write_bytes(Path(path), data)
        return hashlib.sha256(data).hexdigest()

    @classmethod
    def load(cls, path: str | Path, data: GraphData, expected_sha256: str | None = None) -> "ProductGraph":
        """Read a node-link JSON snapshot; StorageError if it is unreadable, fails its checksum,
        or was built from other graph data (then rebuild from the records)."""
        path = Path(path)
        raw = read_verified(path, expected_sha256, "graph")
        try:
            payload = json.loads(raw)
            g = nx.node_link_graph(payload, directed=True, multigraph=True, edges="edges")
        except (ValueError, KeyError, TypeError, nx.NetworkXError) as e:
            raise StorageError(f"graph {path} is unreadable: {e}") from e
        if g.graph.get("format") != FORMAT_VERSION:
            raise StorageError(f"graph {path} has format {g.graph.get('format')}, expected {FORMAT_VERSION}")
        if g.graph.get("fingerprint") != data.fingerprint:
            raise StorageError(f"graph {path} was built from other graph data; rebuilding")
        if not isinstance(g, nx.MultiDiGraph):
            raise StorageError(f"graph {path} is not a directed multigraph")
        return cls(data, graph=g)

    def stats(self) -> dict[str, Any]:
        kinds = Counter(d.get("kind") for _, d in self.g.nodes(data=True))
        return {"nodes": self.g.number_of_nodes(), "edges": self.g.number_of_edges(), "products": len(self),
                "brands": kinds.get("brand", 0), "categories": kinds.get("category", 0),
                "taxonomy_nodes": kinds.get("taxonomy", 0),
                "categories_mapped": Counter((d.get("map") or {}).get("source") for _, d in self.g.nodes(data=True)
                                             if d.get("kind") == "category" and d.get("map")
                                             and self._post.get(self.category_node(d["name"])))}


def _written_exactly(words: Sequence[str], brand: str) -> bool:
    """Whether ``brand`` appears among the query's words with the catalogue's capitalisation."""
    bw = brand.split()
    return any(words[i:i + len(bw)] == bw for i in range(len(words) - len(bw) + 1))


def _tree_distance(a: tuple[str, ...], b: tuple[str, ...]) -> int | None:
    """Distance between the first nodes of two root-ward chains."""
    pos = {n: i for i, n in enumerate(b)}
    for i, n in enumerate(a):
        if n in pos:
            return i + pos[n]
    return None
