"""The graph's vocabulary: what words and names mean, before any product is in a graph.

- keys and words (:func:`norm_key`, :func:`tokenize`, :func:`plural_variants`): case, spaces and
  punctuation never split a name;
- brands: a lexicon learned from catalogue titles (:func:`learn_brands`; titles start with the
  brand, multi-word brands included) shipped as ``brands.json``, read as a :class:`BrandLexicon`;
- colours: families and which go together (:class:`ColourRules`, ``colours.json``);
- the reviewed data (:class:`GraphData`): Google's product taxonomy, the reviewed category mapping
  (``category_map.csv``), outfits (``complements.json``), query synonyms (``vocabulary.json``);
- :class:`QueryTerms`: the graph values a query names.

The graph itself (:mod:`vitrine.index.graph`) is built on these. This module knows nothing of
the search layer.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import json
import logging
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitrine.errors import StorageError

log = logging.getLogger(__name__)

# How the graph is built from the data (mapping, held terms, learned brands and colours): part
# of the fingerprint, so a graph built by an older version is rebuilt from the records.
BUILD_VERSION = "graph-build-2"
DATA_FILES = ("category_map.csv", "complements.json", "colours.json", "vocabulary.json", "brands.json",
              "brand_overrides.json")
ATTRIBUTE_FIELDS = ("brand", "colour", "gender", "season", "usage")
QUERY_FIELDS = ("category", "brand", "colour", "gender", "usage", "season")
MAX_PHRASE = 6

# Words that end the brand at the start of a catalogue title ("Nike Men Blue ...").
TITLE_GENDER_WORDS = frozenset({
    "men", "women", "man", "woman", "boys", "girls", "boy", "girl", "unisex", "kids", "kid's", "men's",
    "women's", "boy's", "girl's", "mens", "womens", "infant", "infants", "baby",
})
# Colour names that, in a title, mostly name a material or a finish ("Steel Frame Desk").
TITLE_NOT_COLOURS = frozenset({"steel", "metallic", "skin", "nude", "multi", "copper", "bronze", "gold", "silver",
                               "rust", "tan", "coffeebrown", "cream", "olive", "peach", "lime", "camel", "wine"})
ATTR_KEYS = {
    "colour": ("colour", "color", "basecolour", "basecolor"),
    "gender": ("gender",),
    "season": ("season",),
    "usage": ("usage",),
}
_TOKEN = re.compile(r"[0-9a-z]+(?:['&.+-][0-9a-z]+)*\.?|[&+]")


_NOT_KEY = re.compile(r"[^0-9a-z&+]")


@functools.lru_cache(maxsize=65536)  # called for every candidate's facts on every search
def norm_key(s: str) -> str:
    """Case, spaces and punctuation ignored: ``U.S. Polo Assn.`` == ``U.S.Polo Assn.``."""
    return _NOT_KEY.sub("", s.casefold())


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text.casefold().replace("\u2019", "'"))


def plural_variants(name: str) -> set[str]:
    k = norm_key(name)
    out = {k}
    if k.endswith("ies") and len(k) > 4:
        out.add(k[:-3] + "y")
    if k.endswith("es") and len(k) > 4:
        out.add(k[:-2])
    if k.endswith("s") and len(k) > 3:
        out.add(k[:-1])
    else:
        out.add(k + "s")
    return {v for v in out if v}


# -- brands ------------------------------------------------------------------------------------
def title_prefix(title: str, max_tokens: int = 6) -> str | None:
    """The words before the first gender word of a title, when that word comes early."""
    toks = title.split()
    for i, t in enumerate(toks[: max_tokens + 1]):
        if t.casefold().strip(".,:;()") in TITLE_GENDER_WORDS:
            return " ".join(toks[:i]) or None
    return None


def learn_brands(titles: Iterable[str], overrides: Mapping[str, Any] | None = None,
                 min_count: int = 2) -> list[dict[str, Any]]:
    """Learn the brand lexicon from catalogue titles.

    A title's brand candidate is the text before its first gender word ("United Colors of
    Benetton Men ..."). Candidates seen ``min_count`` times are brands; a candidate that extends
    a shorter brand ("Jockey ZONE", "ADIDAS Originals", "Red Tape Black") is folded into it
    unless ``overrides['keep']`` names it; ``aliases`` fold other spellings; case, spaces and
    punctuation never split a brand (keys are :func:`norm_key`).
    """
    ov = overrides or {}
    alias = {norm_key(a): b for a, b in (ov.get("aliases") or {}).items()}
    not_brands = {norm_key(x) for x in ov.get("not_brands") or []}
    keep = {norm_key(x) for x in ov.get("keep") or []}
    counts: Counter[str] = Counter()
    surface: dict[str, Counter[str]] = {}
    for t in titles:
        p = title_prefix(t)
        if not p:
            continue
        k = norm_key(p)
        if not k or k in not_brands:
            continue
        if k in alias:
            p = alias[k]
            k = norm_key(p)
        counts[k] += 1
        surface.setdefault(k, Counter())[p] += 1
    for name in ov.get("extra") or []:
        k = norm_key(name)
        surface.setdefault(k, Counter()).setdefault(name, 0)
        counts[k] += 0
    extra = {norm_key(x) for x in ov.get("extra") or []}
    cands = {k for k, c in counts.items() if c >= min_count or k in extra}
    display = {k: (surface[k].most_common(1)[0][0] if surface[k] else k) for k in cands}
    root: dict[str, str] = {}
    for k in cands:
        root[k] = k
        if k in keep:
            continue
        toks = display[k].split()
        for n in range(1, len(toks)):  # the shortest brand this candidate extends
            pk = norm_key(" ".join(toks[:n]))
            if pk in cands and pk != k:
                root[k] = pk
                break
    brands: dict[str, dict[str, Any]] = {}
    for k in sorted(cands):
        r = root[k]
        while root[r] != r:
            r = root[r]
        b = brands.setdefault(r, {"name": display[r], "count": 0, "keys": set(), "forms": Counter()})
        b["count"] += counts[k]
        b["keys"].add(k)
        b["forms"].update(surface[k])
    for a_key, target in alias.items():
        t = norm_key(target)
        r = root.get(t, t)
        if r in brands:
            brands[r]["keys"].add(a_key)
    out = []
    for _r, b in sorted(brands.items(), key=lambda kv: (-kv[1]["count"], kv[0])):
        out.append({"name": b["name"], "count": b["count"], "keys": sorted(b["keys"]),
                    "forms": [f for f, _ in b["forms"].most_common()]})
    return out


def leading_brands(titles: Iterable[str], min_count: int = 3, not_brands: Iterable[str] = ()) -> list[str]:
    """Brands of a catalogue whose titles start with the brand but name no gender ("Sony Bravia
    55 inch TV", "Herman Miller Aeron Chair"): a first word that starts ``min_count`` titles and
    never stands later in a title (an adjective such as "Wireless" does); it extends to the next
    word while every such title continues with that word ("Herman" -> "Herman Miller")."""
    skip = {norm_key(x) for x in not_brands}
    toks_of = [t.split() for t in titles]
    first: Counter[str] = Counter()
    later: Counter[str] = Counter()
    for toks in toks_of:
        if len(toks) < 2:
            continue
        first[norm_key(toks[0])] += 1
        later.update({norm_key(w) for w in toks[1:]})
    cands = {k for k, c in first.items() if c >= min_count and not later[k] and k and not k.isdigit() and k not in skip}
    out: dict[str, Counter[str]] = {}
    for toks in toks_of:
        if len(toks) < 2 or norm_key(toks[0]) not in cands:
            continue
        out.setdefault(norm_key(toks[0]), Counter())[" ".join(toks[:2])] += 1
    brands = []
    for _k, seconds in sorted(out.items()):
        phrase, n = seconds.most_common(1)[0]
        if n == sum(seconds.values()) and len(seconds) == 1 and n >= min_count and \
                len(phrase.split()) == 2 and phrase.split()[1][:1].isupper():
            brands.append(phrase)
        else:
            brands.append(next(t.split()[0] for t in seconds))
    return brands


class BrandLexicon:
    """Brand names by key; finds the brand a title starts with."""

    def __init__(self, brands: Sequence[Mapping[str, Any]] = (), exact_case: Iterable[str] = (),
                 not_brands: Iterable[str] = ()) -> None:
        self.by_key: dict[str, str] = {}
        for b in brands:
            for k in list(b.get("keys") or []) + [norm_key(b["name"])]:
                self.by_key.setdefault(k, b["name"])
        self.exact_case = {x for x in exact_case}
        self.exact_keys = {norm_key(x) for x in exact_case}
        self.not_brands = {norm_key(x) for x in not_brands}
        self.max_tokens = MAX_PHRASE

    def __len__(self) -> int:
        return len(set(self.by_key.values()))

    def canonical(self, name: str) -> str:
        return self.by_key.get(norm_key(name), " ".join(name.split()))

    def from_title(self, title: str) -> str | None:
        toks = title.split()
        for n in range(min(self.max_tokens, len(toks)), 0, -1):
            name = self.by_key.get(norm_key(" ".join(toks[:n])))
            if name:
                return name
        p = title_prefix(title, max_tokens=3)
        if p and norm_key(p) not in self.not_brands:
            return p
        return None

    def learn(self, name: str) -> None:
        self.by_key.setdefault(norm_key(name), name)


# -- colours -------------------------------------------------------------------------------------
class ColourRules:
    """Colour families and which go together (``colours.json``)."""

    def __init__(self, spec: Mapping[str, Any] | None = None) -> None:
        spec = spec or {}
        self.family: dict[str, str] = {}
        self.names: dict[str, str] = {}  # key -> the colour's name: the general colour lexicon
        self.universal: set[str] = set()
        for fam, d in (spec.get("families") or {}).items():
            if d.get("goes_with_all"):
                self.universal.add(fam)
            for c in d.get("colours") or []:
                self.family[norm_key(c)] = fam
                self.names[norm_key(c)] = c
        self.pairs = {frozenset(p) for p in spec.get("compatible_families") or []}

    def family_of(self, colour: str | None) -> str | None:
        return self.family.get(norm_key(colour)) if colour else None

    def compatible(self, a: str | None, b: str | None) -> tuple[bool, str]:
        """Whether two colours go together, and the rule that says so."""
        if not a or not b or a == "NA" or b == "NA":
            return True, "colour unknown"
        fa, fb = self.family_of(a), self.family_of(b)
        if fa is None or fb is None:
            return True, "colour unknown"
        if fa in self.universal or fb in self.universal:
            return True, "neutral" if "neutral" in (fa, fb) else "metallic"
        if fa == fb:
            return (True, "tonal") if fa != "multi" else (False, "clash")
        if frozenset((fa, fb)) in self.pairs:
            return True, "pairing"
        return False, "clash"


# -- the reviewed data ---------------------------------------------------------------------------
@dataclass
class Outfit:
    name: str
    genders: tuple[str, ...]
    slots: tuple[tuple[str, ...], ...]


@dataclass
class GraphData:
    """Everything the graph is built on besides the products: taxonomy, mapping, rules, words."""

    taxonomy: dict[int, tuple[str, ...]] = field(default_factory=dict)
    category_map: dict[str, tuple[int, str]] = field(default_factory=dict)  # key -> (taxonomy id, name)
    outfits: list[Outfit] = field(default_factory=list)
    colours: ColourRules = field(default_factory=ColourRules)
    vocabulary: dict[str, Any] = field(default_factory=dict)
    brands: BrandLexicon = field(default_factory=BrandLexicon)
    fingerprint: str = "empty"
    taxonomy_sha256: str = ""
    # maps catalogue categories the reviewed mapping lacks (vitrine.index.taxonomy_map); set by
    # whoever holds the text tower, None: a leaf maps only to a taxonomy node of the same name
    mapper: Any = None
    _by_path: dict[tuple[str, ...], int] | None = None

    def use_mapper(self, mapper: Any, identity: str) -> None:
        """Map catalogue categories with ``mapper``; ``identity`` (its tower, threshold, method)
        joins the fingerprint, so a graph mapped otherwise is rebuilt from the records."""
        self.mapper = mapper
        self.fingerprint = hashlib.sha256(f"{self.fingerprint}|{identity}".encode()).hexdigest()

    def colour_words(self) -> dict[str, str]:
        """Words that name a colour (key -> colour name): the colour rules' names and the
        vocabulary's colour synonyms, less words that name a material more often than a colour
        in product titles."""
        out = {k: v for k, v in self.colours.names.items() if k not in TITLE_NOT_COLOURS}
        for value, syns in (self.vocabulary.get("colour") or {}).items():
            for w in [value, *syns]:
                if norm_key(w) not in TITLE_NOT_COLOURS:
                    out.setdefault(norm_key(w), value)
        return out

    def path_index(self) -> dict[tuple[str, ...], int]:
        if self._by_path is None or len(self._by_path) != len(self.taxonomy):
            self._by_path = {p: t for t, p in self.taxonomy.items()}
        return self._by_path

    @classmethod
    def load(cls, graph_dir: str | Path | None, taxonomy_file: str | Path | None) -> "GraphData":
        """Read ``graph_dir`` (the files of ``DATA_FILES``) and Google's taxonomy file.

        A missing folder or file gives an empty part (logged): the graph then has no backbone
        or rules, and search still works on vectors and words."""
        data = cls()
        h = hashlib.sha256()
        gdir = Path(graph_dir) if graph_dir else None
        if taxonomy_file and Path(taxonomy_file).is_file():
            raw = Path(taxonomy_file).read_bytes()
            h.update(raw)
            data.taxonomy_sha256 = hashlib.sha256(raw).hexdigest()
            for line in raw.decode("utf-8").splitlines():
                if not line.strip() or line.startswith("#"):
                    continue
                tid, _, path = line.partition(" - ")
                try:
                    data.taxonomy[int(tid)] = tuple(p.strip() for p in path.split(">"))
                except ValueError as e:
                    raise StorageError(f"{taxonomy_file}: bad taxonomy line {line!r}") from e
        else:
            log.warning("Google product taxonomy %s not found: the graph has no category backbone", taxonomy_file)
        if gdir is None or not gdir.is_dir():
            log.warning("graph data folder %s not found: no category mapping, complements or brand lexicon", gdir)
            data.fingerprint = h.hexdigest()
            return data

        def read(name: str) -> bytes | None:
            p = gdir / name
            if not p.is_file():
                log.warning("graph data file %s is missing", p)
                return None
            b = p.read_bytes()
            h.update(name.encode() + b)
            return b

        def read_json(name: str) -> dict[str, Any]:
            b = read(name)
            if b is None:
                return {}
            try:
                return json.loads(b)
            except json.JSONDecodeError as e:
                raise StorageError(f"{gdir / name} is not valid JSON: {e}") from e

        raw_map = read("category_map.csv")
        if raw_map is not None:
            for row in csv.DictReader(raw_map.decode("utf-8").splitlines()):
                map_id = int(row["taxonomy_id"])
                if data.taxonomy and map_id not in data.taxonomy:
                    raise StorageError(f"category_map.csv maps {row['article_type']!r} to unknown taxonomy id {map_id}")
                data.category_map[norm_key(row["article_type"])] = (map_id, row["article_type"])
        comp = read_json("complements.json")
        for o in comp.get("outfits") or []:
            data.outfits.append(Outfit(o["name"], tuple(o.get("genders") or ()),
                                       tuple(tuple(s) for s in o.get("slots") or ())))
        data.colours = ColourRules(read_json("colours.json"))
        data.vocabulary = read_json("vocabulary.json")
        brands = read_json("brands.json")
        ov = read_json("brand_overrides.json")
        data.brands = BrandLexicon(brands.get("brands") or [], ov.get("query_exact_case") or [],
                                   ov.get("not_brands") or [])
        h.update(BUILD_VERSION.encode())
        data.fingerprint = h.hexdigest()
        return data


# -- query terms -----------------------------------------------------------------------------------
@dataclass
class QueryTerms:
    """Graph values a query names: field -> canonical values (category values are node ids)."""

    values: dict[str, list[str]] = field(default_factory=dict)
    phrases: dict[str, list[str]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return any(self.values.values())

    def get(self, f: str) -> list[str]:
        return self.values.get(f, [])

    def add(self, f: str, value: str, phrase: str) -> None:
        vals = self.values.setdefault(f, [])
        if value not in vals:
            vals.append(value)
        ph = self.phrases.setdefault(f, [])
        if phrase not in ph:
            ph.append(phrase)

    def as_dict(self) -> dict[str, list[str]]:
        return {f: list(v) for f, v in self.values.items() if v}

    def key(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """The values named, hashable and in a canonical order (phrases aside)."""
        return tuple(sorted((f, tuple(sorted(v))) for f, v in self.values.items() if v))
