"""Which graph values a query's words name: the query vocabulary (category, taxonomy, colour,
gender, usage and season names and their synonyms from ``vocabulary.json``, and the brand lexicon)
and a greedy longest match of a query's words against it."""

from __future__ import annotations

from collections.abc import Sequence

from vitrine.index.graph_store import GraphStore
from vitrine.index.vocabulary import MAX_PHRASE, QueryTerms, norm_key, plural_variants, tokenize


class QueryMatcher:
    """Matches query text against the vocabulary of a :class:`~vitrine.index.graph_store.GraphStore`
    (rebuilt when the store's names change)."""

    def __init__(self, store: GraphStore) -> None:
        self.store = store
        self._vocab: dict[str, set[tuple[str, str]]] | None = None
        self._vocab_epoch = store.vocab_epoch

    def _vocabulary(self) -> dict[str, set[tuple[str, str]]]:
        s = self.store
        if self._vocab is not None and self._vocab_epoch == s.vocab_epoch:
            return self._vocab
        epoch = s.vocab_epoch
        voc: dict[str, set[tuple[str, str]]] = {}

        def add(phrase: str, f: str, value: str) -> None:
            k = norm_key(phrase)
            if k:
                voc.setdefault(k, set()).add((f, value))

        spec = s.data.vocabulary
        for node, d in s.g.nodes(data=True):
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
                add(w, "category", s.category_node(cat))
        for f in ("gender", "colour", "usage", "season"):
            for value, words in (spec.get(f) or {}).items():
                add(value, f, value)
                for w in words:
                    add(w, f, value)
        kids = spec.get("kids") or {}
        for w in kids.get("words") or []:
            for g in kids.get("genders") or []:
                add(w, "gender", g)
        for hits in voc.values():  # a catalogue category of that name beats a taxonomy node
            if any(v.startswith("category:") for f, v in hits if f == "category"):
                hits -= {(f, v) for f, v in hits if f == "category" and v.startswith("taxonomy:")}
        for key, name in s.data.brands.by_key.items():
            voc.setdefault(key, set()).add(("brand", name))
        self._vocab, self._vocab_epoch = voc, epoch
        return voc

    def match_query(self, text: str | None) -> QueryTerms:
        """Greedy longest match of the query's words against the graph's vocabulary: category
        (catalogue or taxonomy names and synonyms), brand, colour, gender, usage, season."""
        terms = QueryTerms()
        if not text:
            return terms
        s = self.store
        with s.lock:
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
                    hits = {h for h in hits if not (h[0] == "brand" and key in s.data.brands.exact_keys
                                                    and not _written_exactly(raw, h[1])) and s.holds(*h)}
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
        s = self.store
        spec = s.data.vocabulary
        out: dict[str, list[str]] = {}
        with s.lock:
            for f in ("category", "gender", "colour", "usage", "season"):
                for value, words in (spec.get(f) or {}).items():
                    node = s.category_node(value) if f == "category" else value
                    if not s.holds(f, node):
                        continue
                    mine = [w for w in words if w.casefold() != value.casefold()]
                    if mine:
                        out.setdefault(value.casefold(), []).extend(mine)
        return out


def _written_exactly(words: Sequence[str], brand: str) -> bool:
    """Whether ``brand`` appears among the query's words with the catalogue's capitalisation."""
    bw = brand.split()
    return any(words[i:i + len(bw)] == bw for i in range(len(words) - len(bw) + 1))
