"""Pseudo-queries generated from a catalogue's own records, for calibrating Vitrine to it.

A shop's catalogue comes without shopper queries or relevance judgements, so `vitrine tune`
and `vitrine train gate --data` make their own, from what every product record says:

- ``title``: a product's title with words dropped and re-ordered (a shopper remembering part of
  a product name); relevant: that product (and any with the same title);
- ``category``: a category name (the leaf of a category path); relevant: the products under it;
- ``brand_type``: brand + category leaf ("Acme drills"); relevant: that brand's products there;
- ``attributes``: one, two or three facet values (or the brand) + category leaf ("blue men
  tshirts", "casual black shoes for men"); relevant: every product holding all of them (as the
  attribute protocol defines relevance), not only the product the values were read from. Facets are the attribute keys with a few repeated string values
  (learned from the catalogue, not a fashion list). With ``phrasings`` (other words for a value,
  from the knowledge graph's query vocabulary), each value and the category name is said in one
  of them half the time ("ladies sneakers" for Women + Casual Shoes), as shoppers say them;
- ``photo``: a product's photo (where there are photos); relevant: that product;
- ``taxonomy``: the name of the Google-taxonomy node a category maps to, or of one of its
  ancestors, where it says it in other words than the catalogue does ("shirts & tops" for
  "Tshirts"), alone or with one facet value; relevant: every product whose category maps under
  that node (holding the value). Such queries share no word with the records, as shoppers'
  words often do not ("sneakers" for "Casual Shoes"), so they show what the vector signals are
  worth beside BM25. ``counts["taxonomy"]``: none unless asked (`vitrine tune` asks for
  ``tune_taxonomy_queries``, 200 by default).

Queries are split into ``fit`` and ``heldout`` by a hash of what they were made from (a
product's id, a category's name), so a product's title queries never land on both sides.
Nothing here reads a test split: the queries come from the records alone.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

KINDS = ("title", "category", "brand_type", "attributes", "photo", "taxonomy", "shopper")
DEFAULT_COUNTS = {"title": 600, "category": 150, "brand_type": 200, "attributes": 250, "photo": 0, "taxonomy": 0,
                  "shopper": 300}
EXACT, PARTIAL = 2.0, 1.0  # the grades of graded pseudo-queries (WANDS's: exact 2, partial 1)
_STOP = frozenset("a an and the with for of in on to by from or at x w h d set piece pc pcs inch ft that all this your".split())
_WORD = re.compile(r"\w[\w'&.-]*", re.UNICODE)
_NUMERIC = re.compile(r"^[\d.,:/ -]+$")


@dataclass
class PseudoQuery:
    """One generated query: ``text`` (or ``photo_of``: the product whose photo is the query),
    ``relevant`` product ids with their grade, ``kind``, ``split`` (fit / heldout)."""

    kind: str
    relevant: dict[str, float]
    split: str
    text: str | None = None
    photo_of: str | None = None
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text, "photo_of": self.photo_of, "split": self.split,
                "relevant": self.relevant, "source": self.source}


def split_of(key: str, heldout: float, salt: str) -> str:
    """fit or heldout, by a hash of ``key``: a share ``heldout`` lands held out."""
    h = int(hashlib.sha256(f"{salt}:{key}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "heldout" if h < heldout else "fit"


def _leaf(doc: Mapping[str, Any]) -> str | None:
    cat = doc.get("category") or []
    return str(cat[-1]) if cat else None


def facet_keys(docs: Sequence[Mapping[str, Any]], max_values: int = 60, min_share: float = 0.3) -> list[str]:
    """Attribute keys that behave like facets in this catalogue: string values, repeated (at most
    ``max_values`` distinct), set on at least ``min_share`` of the products, not numeric."""
    values: dict[str, Counter[str]] = defaultdict(Counter)
    for d in docs:
        for k, v in (d.get("attributes") or {}).items():
            if isinstance(v, str) and v.strip() and not _NUMERIC.match(v):
                values[str(k)][v.strip()] += 1
    n = max(1, len(docs))
    out = []
    for k, c in values.items():
        if 2 <= len(c) <= max_values and sum(c.values()) >= min_share * n and max(c.values()) >= 2:
            out.append(k)
    return sorted(out)


def title_variant(title: str, rng: random.Random) -> str | None:
    words = _WORD.findall(title)
    if len(words) < 3:
        return None
    keep = max(2, round(len(words) * rng.uniform(0.45, 0.75)))
    picked = sorted(rng.sample(range(len(words)), keep))
    out = [words[i] for i in picked]
    if rng.random() < 0.5:
        rng.shuffle(out)
    text = " ".join(out)
    return None if text.casefold() == title.casefold() else text.lower() if rng.random() < 0.5 else text


def inflect(word: str, rng: random.Random) -> str:
    """A category name as a shopper may type it: half the time its last word's plural ``s``
    dropped or added ("tshirt", "heel", "sofas")."""
    if rng.random() < 0.5:
        return word
    head, _, last = word.rpartition(" ")
    last = last[:-1] if last.endswith("s") and len(last) > 3 else last + "s"
    return f"{head} {last}".strip()


def phrase(values: list[str], leaf: str, rng: random.Random) -> str:
    """Facet values and a category name in one of a few orders shoppers use ("blue shirts",
    "shirts blue", "shirts in blue", "blue shirts for men")."""
    form = rng.randrange(4)
    if form == 0 or not values:
        return " ".join([*values, leaf])
    if form == 1:
        return " ".join([leaf, *values])
    if form == 2:
        return f"{' '.join([leaf, *values[:-1]])} in {values[-1]}"
    return f"{' '.join([*values[:-1], leaf])} for {values[-1]}"


def say(value: str, phrasings: Mapping[str, Sequence[str]] | None, rng: random.Random) -> str:
    """``value`` itself, or half the time (when ``phrasings`` has other words for it) one of those."""
    other = (phrasings or {}).get(value.casefold())
    return rng.choice(list(other)) if other and rng.random() < 0.5 else value


def attribute_sample(combos: Mapping[tuple[tuple[tuple[str, str], ...], str], list[str]],
                     held: Sequence[tuple[tuple[tuple[str, str], ...], str]], n: int, max_relevant: int,
                     rng: random.Random) -> list[tuple[tuple[tuple[str, str], ...], str]]:
    """``n`` distinct facet-value combinations (with a category leaf), drawn as shoppers' queries
    fall: a random product, then one, two or three of its values (sizes in turn). So a combination
    comes up as often as the catalogue holds it ("men black shoes" more than a rare colour of a rare
    type), and broad ones, whose top 10 must all hold every value, are as common as in real
    attribute queries. ``held``: each product's (facet items, leaf); combinations with more than
    ``max_relevant`` products are skipped."""
    out: list[tuple[tuple[tuple[str, str], ...], str]] = []
    seen: set[tuple[tuple[tuple[str, str], ...], str]] = set()
    if not held:
        return out
    for t in range(50 * n):
        if len(out) >= n:
            break
        items, leaf = held[rng.randrange(len(held))]
        size = min(len(items), 1 + t % 3)
        c = (tuple(sorted(rng.sample(list(items), size))), leaf)
        if c not in seen and len(combos[c]) <= max_relevant:
            seen.add(c)
            out.append(c)
    return out


def _words(text: str) -> set[str]:
    return {w.rstrip("s") for w in _WORD.findall(text.casefold()) if w not in ("and", "&")}


def _stem(word: str) -> str:
    w = word.casefold()
    return w[:-1] if w.endswith("s") and len(w) > 3 else w


def _content(title: str) -> list[str]:
    """A title's words a shopper could type: alphabetic, 3+ letters, not a stop word."""
    return [w for w in _WORD.findall(title.casefold()) if w.isalpha() and len(w) >= 3 and w not in _STOP]


def shopper_queries(docs: Sequence[Mapping[str, Any]], n: int, heldout: float, salt: str,
                    rng: random.Random) -> list[PseudoQuery]:
    """``n`` short queries as shoppers type them, with graded relevance (``shopper`` kind):

    - a class word as the product's title says it (a title word in its category leaf's name, else
      the leaf's last word) with one or two modifiers from the title ("tufted bed", "rustic storage
      cabinet");
    - a model or maker name (a title word held by 2 to 20 products) alone or with the class word
      ("alcott knob").

    Graded by what the titles say, not by the category the records file a product under: exact (2),
    a title holding every word (or, in the source's leaf, every modifier); partial (1), a title
    holding the class word, or a product of the source's leaf.

    Unlike the ``category`` and ``taxonomy`` kinds, such queries rarely name a category as the
    records do, and most of what they want is only partly relevant, as in real judgements: a
    signal that ranks a whole category high (graph category, proximity) gains little here unless
    it also helps the words that make the query specific."""
    by_leaf: dict[str, list[int]] = defaultdict(list)
    words_of: list[set[str]] = []
    df: Counter[str] = Counter()
    for i, d in enumerate(docs):
        ws = {_stem(w) for w in _content(str(d["title"]))}
        words_of.append(ws)
        df.update(ws)
        leaf = _leaf(d)
        if leaf:
            by_leaf[leaf].append(i)
    n_docs = max(1, len(docs))
    order = list(range(len(docs)))
    rng.shuffle(order)
    out: list[PseudoQuery] = []
    seen: set[str] = set()
    for i in order:
        if len(out) >= n:
            break
        d = docs[i]
        leaf = _leaf(d)
        title_words = _content(str(d["title"]))
        if not leaf or len(title_words) < 2:
            continue
        leaf_stems = {_stem(w) for w in _WORD.findall(leaf.casefold())}
        heads = [w for w in title_words if _stem(w) in leaf_stems]
        head = heads[-1] if heads else leaf.split()[-1].casefold()
        mods = [w for w in dict.fromkeys(title_words) if _stem(w) not in leaf_stems and _stem(w) != _stem(head)]
        if not mods:
            continue
        if rng.random() < 0.3:  # a model or maker name: a word few titles hold
            rare = [w for w in mods if 2 <= df[_stem(w)] <= 20]
            if not rare:
                continue
            name = rng.choice(rare)
            text = name if rng.random() < 0.5 else f"{name} {head}"
            want = {_stem(name)}
        else:  # a class word with one or two modifiers a handful of titles share
            common = [w for w in mods if 3 <= df[_stem(w)] <= n_docs // 5]
            if not common:
                continue
            picked = rng.sample(common, min(len(common), 1 if rng.random() < 0.7 else 2))
            text = " ".join([*picked, head])
            want = {_stem(w) for w in picked}
        if text in seen:
            continue
        seen.add(text)
        # graded by what the titles say, not by the category the records file them under (a shopper's
        # "twin bed" is exactly a twin bunk bed too): exact, every word; partial, the class word, or
        # the source's leaf
        same_leaf = set(by_leaf[leaf])
        need, h = want | {_stem(head)}, _stem(head)
        rel: dict[str, float] = {}
        for j, ws in enumerate(words_of):
            if need <= ws or (j in same_leaf and want <= ws):
                rel[str(docs[j]["id"])] = EXACT
            elif h in ws or j in same_leaf:
                rel[str(docs[j]["id"])] = PARTIAL
        if not any(g == EXACT for g in rel.values()):
            continue
        out.append(PseudoQuery("shopper", rel, split_of("s:" + text, heldout, salt), text=text,
                               source=str(d["id"])))
    return out


def taxonomy_queries(docs: Sequence[Mapping[str, Any]], taxonomy: Mapping[str, Sequence[str]], n: int,
                     broad: int, heldout: float, salt: str, rng: random.Random,
                     keys: Sequence[str]) -> list[PseudoQuery]:
    """``n`` queries naming taxonomy nodes (a category's node or an ancestor below the root) in
    other words than the category's own, alone or with one facet value; see the module doc."""
    under: dict[tuple[str, ...], list[str]] = defaultdict(list)  # node path -> products mapped under it
    leaves_under: dict[tuple[str, ...], set[str]] = defaultdict(set)
    by_id = {str(d["id"]): d for d in docs}
    for d in docs:
        leaf = _leaf(d)
        path = tuple(taxonomy.get(leaf) or ()) if leaf else ()
        for depth in range(2, len(path) + 1):
            under[path[:depth]].append(str(d["id"]))
            leaves_under[path[:depth]].add(leaf)  # type: ignore[arg-type]  # leaf is set for every document reaching here
    nodes = [node for node, ids in under.items() if len(ids) <= broad
             and any(not _words(node[-1]) <= _words(leaf) for leaf in leaves_under[node])]
    rng.shuffle(nodes)
    out: list[PseudoQuery] = []
    for node in nodes:
        if len(out) >= n:
            break
        sides = [x.strip() for x in re.split(r"\s*(?:&|,)\s*", node[-1]) if x.strip()]
        name = (rng.choice([node[-1].replace(" & ", " and "), *sides]) if len(sides) > 1 else node[-1]).lower()
        ids = under[node]
        text, rel, key = name, ids, "t:" + " > ".join(node)
        if keys and rng.random() < 0.5:  # with one facet value one of its products holds
            k = rng.choice(list(keys))
            v = (by_id[rng.choice(ids)].get("attributes") or {}).get(k)
            if isinstance(v, str) and v.strip():
                rel = [p for p in ids if str((by_id[p].get("attributes") or {}).get(k, "")).strip() == v.strip()]
                text, key = phrase([v.strip().lower()], name, rng), f"{key}|{k}={v}"
        out.append(PseudoQuery("taxonomy", {p: 1.0 for p in rel}, split_of(key, heldout, salt), text=text,
                               source=key))
    return out


def generate(products: Sequence[Mapping[str, Any]], *, counts: Mapping[str, int] | None = None,
             heldout: float = 0.4, seed: int = 0, with_photo: Iterable[str] = (),
             max_relevant: int = 500, taxonomy: Mapping[str, Sequence[str]] | None = None,
             phrasings: Mapping[str, Sequence[str]] | None = None) -> list[PseudoQuery]:
    """Pseudo-queries from product documents (each with ``id``, ``title``, optional ``brand``,
    ``category`` path, ``attributes``). ``counts``: how many of each kind at most (photo queries
    only for the ids in ``with_photo``); queries with more than ``max_relevant`` relevant
    products (too broad to tell rankings apart) are skipped, except attribute queries, which may
    hold up to a tenth of the catalogue (their top 10 must all hold every named value).
    ``taxonomy``: each category leaf's Google-taxonomy path (names, root first), for the
    ``taxonomy`` kind. ``phrasings``: other words for values (casefolded value -> words), used in
    attribute queries half the time."""
    counts = {**DEFAULT_COUNTS, **(counts or {})}
    rng = random.Random(seed)
    salt = f"vitrine-pq-{seed}"
    docs = [p for p in products if p.get("id") is not None and p.get("title")]
    by_title: dict[str, list[str]] = defaultdict(list)
    by_leaf: dict[str, list[str]] = defaultdict(list)
    by_brand_leaf: dict[tuple[str, str], list[str]] = defaultdict(list)
    for d in docs:
        pid = str(d["id"])
        by_title[str(d["title"]).casefold()].append(pid)
        leaf = _leaf(d)
        if leaf:
            by_leaf[leaf].append(pid)
            if d.get("brand"):
                by_brand_leaf[(str(d["brand"]), leaf)].append(pid)
    out: list[PseudoQuery] = []

    # titles with words dropped / re-ordered
    order = list(range(len(docs)))
    rng.shuffle(order)
    n = 0
    for i in order:
        if n >= counts["title"]:
            break
        d = docs[i]
        text = title_variant(str(d["title"]), rng)
        if text is None:
            continue
        same = by_title[str(d["title"]).casefold()]
        out.append(PseudoQuery("title", {p: 1.0 for p in same}, split_of(str(d["id"]), heldout, salt),
                               text=text, source=str(d["id"])))
        n += 1

    # category names
    leaves = [c for c, ids in by_leaf.items() if len(ids) <= max_relevant]
    rng.shuffle(leaves)
    for leaf in leaves[:counts["category"]]:
        out.append(PseudoQuery("category", {p: 1.0 for p in by_leaf[leaf]}, split_of("c:" + leaf, heldout, salt),
                               text=inflect(leaf, rng), source=leaf))

    # brand + type
    pairs = [k for k, ids in by_brand_leaf.items() if len(ids) <= max_relevant]
    rng.shuffle(pairs)
    for brand, leaf in pairs[:counts["brand_type"]]:
        leaf_text = inflect(leaf, rng)
        text = leaf_text if brand.casefold() in leaf.casefold() else f"{brand} {leaf_text}"
        out.append(PseudoQuery("brand_type", {p: 1.0 for p in by_brand_leaf[(brand, leaf)]},
                               split_of(f"b:{brand}|{leaf}", heldout, salt), text=text, source=f"{brand}|{leaf}"))

    # facet values + category leaf
    keys = facet_keys(docs)
    if keys and counts["attributes"]:
        combos: dict[tuple[tuple[tuple[str, str], ...], str], list[str]] = defaultdict(list)
        held: list[tuple[tuple[tuple[str, str], ...], str]] = []
        for d in docs:
            leaf = _leaf(d)
            attrs = {k: str(v).strip() for k, v in (d.get("attributes") or {}).items() if k in keys and isinstance(v, str)}
            if d.get("brand"):  # the brand combines with facets like one ("acme blue drills")
                attrs["brand"] = str(d["brand"]).strip()
            attrs = {k: v for k, v in attrs.items() if v and v.casefold() != (leaf or "").casefold()}
            if not leaf or not attrs:
                continue
            items = tuple(sorted(attrs.items()))
            held.append((items, leaf))
            for size in range(1, min(3, len(items)) + 1):
                for vals in itertools.combinations(items, size):
                    combos[(vals, leaf)].append(str(d["id"]))
        broad = max(max_relevant, len(docs) // 10)  # attribute queries may be broad: every hit must hold all values
        for vals, leaf in attribute_sample(combos, held, counts["attributes"], broad, rng):
            words = [say(v, phrasings, rng) for _, v in vals]
            rng.shuffle(words)
            said = say(leaf, phrasings, rng)
            text = phrase(words, inflect(leaf, rng) if said == leaf else said, rng)
            key = "a:" + "|".join(f"{k}={v}" for k, v in vals) + "|" + leaf
            out.append(PseudoQuery("attributes", {p: 1.0 for p in combos[(vals, leaf)]},
                                   split_of(key, heldout, salt), text=text.lower() if rng.random() < 0.5 else text,
                                   source=key, meta={"facets": dict(vals)}))

    # taxonomy names in other words than the records'
    if taxonomy and counts["taxonomy"]:
        out += taxonomy_queries(docs, taxonomy, counts["taxonomy"], max(max_relevant, len(docs) // 10), heldout,
                                salt, rng, keys)

    # short queries as shoppers type them, graded
    if counts["shopper"]:
        out += shopper_queries(docs, counts["shopper"], heldout, salt, rng)

    # photos as queries
    photo_ids = [str(p) for p in with_photo]
    rng.shuffle(photo_ids)
    for pid in photo_ids[:counts["photo"]]:
        out.append(PseudoQuery("photo", {pid: 1.0}, split_of(pid, heldout, salt), photo_of=pid, source=pid))
    return out


def labelled(queries: Iterable[tuple[str, str, Mapping[str, float]]], *, kind: str, heldout: float = 0.4,
             seed: int = 0) -> list[PseudoQuery]:
    """A shop's own judged queries (query logs with clicks, or judged queries: ``(qid, text,
    relevant)``) as tuning queries of ``kind``, split fit / held-out by a hash of the text (the
    same text never lands on both sides)."""
    salt = f"vitrine-pq-{seed}"
    return [PseudoQuery(kind, {str(p): float(g) for p, g in rel.items() if g > 0},
                        split_of("q:" + " ".join(text.casefold().split()), heldout, salt), text=text, source=qid)
            for qid, text, rel in queries if text and any(g > 0 for g in rel.values())]


def split(queries: Sequence[PseudoQuery], which: str) -> list[PseudoQuery]:
    return [q for q in queries if q.split == which]
