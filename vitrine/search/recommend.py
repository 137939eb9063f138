"""Recommendations (similar / complementary) and product comparison, over vectors + the graph.

- similar: the anchor's nearest products in the shared space within its own category,
  diversified by maximal marginal relevance (MMR), never the anchor itself;
- complementary: products of the categories the graph says complement the anchor's (per
  outfit, for its gender), colour-compatible with it, of its gender (unisex only to fill),
  ranked by shared-space affinity to the anchor and spread over the complementary categories
  (strongest pairings first); each result names the relation that put it there;
- compare: attribute table, shared/differing attributes, pairwise photo/text/fused cosine,
  the graph relation of each pair, price difference and a one-line summary; ``compare_text``
  resolves "nike vs puma running shoes" by searching each side.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from vitrine.errors import InvalidInput, NotFound
from vitrine.index.graph_facts import ProductFacts
from vitrine.index.vocabulary import norm_key
from vitrine.search.state import product_out
from vitrine.search.models import (
    CompareAttribute,
    CompareResponse,
    Explanation,
    PairwiseSimilarity,
    ProductOut,
    RecommendHit,
    RecommendResponse,
    SearchRequest,
    SearchResponse,
)
from vitrine.search.read_context import ReadContext

if TYPE_CHECKING:  # pragma: no cover
    from vitrine.index.records import StoredRow

KINDS = ("similar", "complementary")
MAX_COMPARE = 5
_ADULT = ("Men", "Women")
# Attribute rows of a comparison, in this order first; others follow alphabetically.
_ORDER = ("brand", "category", "gender", "colour", "usage", "season", "year")
_SPLIT = re.compile(r"\s+(?:vs\.?|versus|v/s|compared\s+(?:to|with)|against)\s+", re.IGNORECASE)
_LEAD = re.compile(r"^\s*(?:compare|comparison of|difference between|differences between)\s+", re.IGNORECASE)


def _cos(a: np.ndarray | None, b: np.ndarray | None) -> float | None:
    if a is None or b is None:
        return None
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0 or nb == 0:
        return None
    return round(float(a @ b) / (na * nb), 6)


def _hit(row: "StoredRow", score: float, relation: str, signals: dict[str, float]) -> RecommendHit:
    p = product_out(row)
    return RecommendHit(score=round(float(score), 6), relation=relation,
                        explanation=Explanation(vector_score=round(float(signals.get("vector", score)), 6),
                                                signals={k: round(float(v), 6) for k, v in signals.items()},
                                                modalities=["product"]),
                        **p.model_dump(exclude={"version"}))


def _facts(reader: ReadContext, row: "StoredRow") -> ProductFacts:
    f = reader.state.graph.facts(row.iid)
    if f is None:
        f, _ = reader.state.graph.facts_from_doc(row.iid, row.id, row.doc)
    return f


def mmr(anchor_sims: np.ndarray, vecs: np.ndarray, k: int, lam: float) -> list[tuple[int, float]]:
    """Maximal marginal relevance: indices (and their MMR scores) trading similarity to the
    anchor against similarity to what is already picked."""
    picked: list[tuple[int, float]] = []
    if len(anchor_sims) == 0:
        return picked
    max_sim = np.full(len(anchor_sims), -np.inf, dtype=np.float32)
    avail = np.ones(len(anchor_sims), dtype=bool)
    for _ in range(min(k, len(anchor_sims))):
        penalty = np.where(np.isfinite(max_sim), max_sim, 0.0)
        score = lam * anchor_sims - (1 - lam) * penalty
        score = np.where(avail, score, -np.inf)
        j = int(np.argmax(score))
        picked.append((j, float(score[j])))
        avail[j] = False
        max_sim = np.maximum(max_sim, vecs @ vecs[j])
    return picked


def recommend(reader: ReadContext, pid: str, kind: str = "similar", k: int = 10) -> RecommendResponse:
    t0 = time.perf_counter()
    if kind not in KINDS:
        raise InvalidInput(f"kind must be one of {list(KINDS)}, got {kind!r}")
    if not isinstance(k, int) or not 1 <= k <= reader.settings.search.max_k:
        raise InvalidInput(f"k must be between 1 and {reader.settings.search.max_k}")
    row = reader.state.records.get(pid)
    if row is None:
        raise NotFound("product", pid)
    anchor = product_out(row)
    fused = reader.state.vectors["fused"]
    if row.iid not in fused:  # embedded by another model: nothing to compare it with yet
        return RecommendResponse(anchor=anchor, kind=kind, results=[],
                                 took_ms=round((time.perf_counter() - t0) * 1000, 3))
    av = fused.get([row.iid])[0]
    facts = _facts(reader, row)
    if kind == "similar":
        results = _similar(reader, row, av, facts, k)
    else:
        results = _complementary(reader, row, av, facts, k)
    return RecommendResponse(anchor=anchor, kind=kind, results=results,
                             took_ms=round((time.perf_counter() - t0) * 1000, 3))


def _similar(reader: ReadContext, row: "StoredRow", av: np.ndarray, facts: ProductFacts, k: int) -> list[RecommendHit]:
    g = reader.state.graph
    fused = reader.state.vectors["fused"]
    allowed = None
    relation = "nearest in the shared space"
    if facts.category:
        with g.lock:
            members = g.products_of_category(facts.category)
            members.discard(row.iid)
            if facts.gender:  # a shopper's "similar" keeps to the anchor's gender (unisex fits both)
                compat = [facts.gender] + (["Unisex"] if facts.gender in _ADULT else
                                           list(_ADULT) if facts.gender == "Unisex" else [])
                same = members & g.products_with("gender", compat)
                if len(same) >= k:
                    members = same
        allowed = np.fromiter(sorted(members), dtype=np.int64)
        relation = f"same category: {facts.category}"
        if len(allowed) == 0:
            return []
    n = min(max(5 * k, 50), len(fused))
    scores, ids = fused.search(av[None], n + 1, allowed)
    pairs = [(int(i), float(s)) for s, i in zip(scores[0], ids[0]) if i >= 0 and i != row.iid]
    if not pairs:
        return []
    cand = np.array([i for i, _ in pairs], dtype=np.int64)
    sims = np.array([s for _, s in pairs], dtype=np.float32)
    vecs = fused.get(cand)
    picked = mmr(sims, vecs, k, reader.settings.search.mmr_lambda)
    rows = reader.state.records.get_by_iids([int(cand[j]) for j, _ in picked])
    out = []
    for j, m in picked:
        r = rows.get(int(cand[j]))
        if r is not None and r.id != row.id:
            out.append(_hit(r, sims[j], relation, {"vector": float(sims[j]), "mmr": m}))
    return out


def _complementary(reader: ReadContext, row: "StoredRow", av: np.ndarray, facts: ProductFacts,
                   k: int) -> list[RecommendHit]:
    g = reader.state.graph
    fused = reader.state.vectors["fused"]
    with g.lock:
        comps = g.complements_of(facts.category, facts.gender)
        if not comps:
            return []
        gender = facts.gender
        exact = g.products_with("gender", [gender]) if gender else None
        fill: set[int] = set()
        if gender in _ADULT:
            fill = g.products_with("gender", ["Unisex"])
        elif gender == "Unisex":
            fill = g.products_with("gender", list(_ADULT))
        # per complementary category: (name, outfits, candidate iids)
        per_cat: list[tuple[str, list[str], set[int], set[int]]] = []
        for cat, outfits in comps.items():
            members = g.products_of_category(cat)
            members.discard(row.iid)
            main = members & exact if exact is not None else members
            per_cat.append((cat, outfits, main, (members & fill) - main))
        colour_ok: dict[int, str] = {}
        for _, _, main, extra in per_cat:
            for i in main | extra:
                f = g.facts(i)
                ok, why = g.colour_compatible(facts.colour, f.colour if f else None)
                if ok:
                    colour_ok[i] = why

    def ranked(ids: set[int]) -> list[tuple[int, float]]:
        ids_ok = [i for i in ids if i in colour_ok and i in fused]
        if not ids_ok:
            return []
        sims = fused.get(ids_ok) @ av
        order = np.argsort(-sims, kind="stable")
        return [(ids_ok[j], float(sims[j])) for j in order]

    def queues(fill: bool) -> list:  # one ranked queue per complementary category, most outfits first
        out = [(cat, outfits, q, fill) for cat, outfits, main, extra in per_cat
               if (q := ranked(extra if fill else main))]
        return sorted(out, key=lambda t: (-len(t[1]), -t[2][0][1], t[0]))

    picks = _round_robin(queues(False), k)
    if len(picks) < k:  # not enough of the anchor's own gender: unisex-compatible products fill in
        picks += _round_robin(queues(True), k - len(picks))
    rows = reader.state.records.get_by_iids([i for _, _, i, _, _ in picks])
    out = []
    for cat, outfits, iid, sim, is_fill in picks:
        r = rows.get(iid)
        if r is None:
            continue
        f = g.facts(iid)
        why = colour_ok.get(iid, "colour unknown")
        colour_txt = (f"colour-compatible ({why}: {facts.colour} with {f.colour})"
                      if f and f.colour and facts.colour and why != "colour unknown" else f"colour-compatible ({why})")
        rel = f"complements: {facts.category} -> {cat} ({', '.join(outfits)}); {colour_txt}"
        if is_fill:
            rel += f"; {f.gender if f else 'unisex'} for a {facts.gender or 'unknown'} anchor (unisex-compatible)"
        out.append(_hit(r, sim, rel, {"vector": sim, "graph:complements": float(len(outfits))}))
    return out


def _round_robin(queues: list[tuple[str, list[str], list[tuple[int, float]], bool]],
                 k: int) -> list[tuple[str, list[str], int, float, bool]]:
    """Best product of each complementary category in turn (strongest pairing first)."""
    picks: list[tuple[str, list[str], int, float, bool]] = []
    depth = 0
    while len(picks) < k:
        progressed = False
        for cat, outfits, q, fill in queues:
            if depth < len(q):
                iid, sim = q[depth]
                picks.append((cat, outfits, iid, sim, fill))
                progressed = True
                if len(picks) >= k:
                    break
        if not progressed:
            break
        depth += 1
    return picks


# -- compare -------------------------------------------------------------------------------------------
def _same(values: list[Any]) -> bool:
    if any(v is None for v in values):
        return False
    return len({norm_key(str(v)) if isinstance(v, str) else v for v in values}) == 1


def compare(reader: ReadContext, ids: list[str]) -> CompareResponse:
    t0 = time.perf_counter()
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise InvalidInput("ids must be a list of product ids")
    if len(ids) < 2:
        raise InvalidInput(f"compare needs at least 2 product ids, got {len(ids)}")
    if len(ids) > MAX_COMPARE:
        raise InvalidInput(f"compare takes at most {MAX_COMPARE} product ids, got {len(ids)}")
    dups = sorted({i for i in ids if ids.count(i) > 1})
    if dups:
        raise InvalidInput(f"duplicate product id(s) {dups}: compare distinct products")
    rows = reader.state.records.get_many(ids, with_vectors=True)
    for i in ids:
        if i not in rows:
            raise NotFound("product", i)
    ordered = [rows[i] for i in ids]
    products: list[ProductOut] = [product_out(r) for r in ordered]
    facts = [_facts(reader, r) for r in ordered]
    table: dict[str, dict[str, Any]] = {}
    for r, p, f in zip(ordered, products, facts):
        vals: dict[str, Any] = {"brand": p.brand or f.brand, "category": p.category[-1] if p.category else f.category}
        for key, v in (p.attributes or {}).items():
            if key.casefold() == "articletype" and isinstance(v, str) and norm_key(v) == norm_key(vals["category"] or ""):
                continue
            vals[key] = v
        if p.price is not None:
            vals["price"] = p.price
        if p.currency:
            vals["currency"] = p.currency
        for key, v in vals.items():
            if v is not None:
                table.setdefault(key, {})[r.id] = v
    names = [n for n in _ORDER if n in table] + sorted(n for n in table if n not in _ORDER and n not in
                                                        ("price", "currency")) + \
        [n for n in ("price", "currency") if n in table]
    attributes = []
    for n in names:
        values = {i: table[n].get(i) for i in ids}
        attributes.append(CompareAttribute(name=n, values=values, same=_same(list(values.values()))))
    shared = {a.name: a.values[ids[0]] for a in attributes if a.same}
    differing = [a.name for a in attributes if not a.same]
    image_idx, fused_idx = reader.state.vectors["image"], reader.state.vectors["fused"]
    pairwise = []
    for (ra, fa), (rb, fb) in itertools.combinations(list(zip(ordered, facts)), 2):
        va, vb = ra.vectors, rb.vectors
        photo = _cos(image_idx.get([ra.iid])[0], image_idx.get([rb.iid])[0]) \
            if ra.iid in image_idx and rb.iid in image_idx else None
        fused = _cos(fused_idx.get([ra.iid])[0], fused_idx.get([rb.iid])[0]) \
            if ra.iid in fused_idx and rb.iid in fused_idx else _cos(va.get("fused"), vb.get("fused"))
        with reader.state.graph.lock:
            rel = reader.state.graph.relation(fa.category, fb.category, fa.gender)
        pairwise.append(PairwiseSimilarity(a=ra.id, b=rb.id, photo=photo, text=_cos(va.get("text"), vb.get("text")),
                                           fused=fused, relation=rel))
    prices = [p.price for p in products if p.price is not None]
    price_difference = round(max(prices) - min(prices), 2) if len(prices) >= 2 else None
    summary = _summary(products, shared, differing, pairwise, price_difference)
    return CompareResponse(products=products, attributes=attributes, shared=shared, differing=differing,
                           pairwise=pairwise, price_difference=price_difference, summary=summary,
                           took_ms=round((time.perf_counter() - t0) * 1000, 3))


def _summary(products: list[ProductOut], shared: dict[str, Any], differing: list[str],
             pairwise: list[PairwiseSimilarity], price_difference: float | None) -> str:
    names = " vs ".join(p.title for p in products) if len(products) == 2 else f"{len(products)} products"
    rels = {p.relation for p in pairwise}
    rel = next(iter(rels)) if len(rels) == 1 else "mixed relations (" + ", ".join(sorted(rels)) + ")"
    common = [f"{v}" for k, v in shared.items() if k in ("category", "gender", "brand", "colour")]
    parts = [f"{names}: {rel}"]
    if common:
        parts.append(("both " if len(products) == 2 else "all ") + ", ".join(str(c) for c in common))
    key_diff = [d for d in differing if d in _ORDER or d == "price"]
    if key_diff:
        parts.append("differ in " + ", ".join(key_diff[:5]))
    sims = [(s, p) for p in pairwise if (s := p.photo if p.photo is not None else p.fused) is not None]
    if sims:
        s, p = max(sims, key=lambda t: t[0])
        what = "photo" if p.photo is not None else "overall"
        parts.append(f"{what} similarity {s:.2f}" + ("" if len(products) == 2 else f" ({p.a} & {p.b})"))
    if price_difference is not None:
        parts.append(f"price difference {price_difference:g}")
    return "; ".join(parts) + "."


def split_sides(text: str) -> list[str]:
    """ "nike vs puma running shoes" -> ["nike", "puma running shoes"]."""
    t = _LEAD.sub("", " ".join(text.split()))
    sides = [s.strip(" ,.?!") for s in _SPLIT.split(t)]
    if len(sides) < 2 and _LEAD.match(" ".join(text.split())):
        sides = [s.strip(" ,.?!") for s in re.split(r"\s+(?:and|or|with)\s+", t, flags=re.IGNORECASE)]
    return [s for s in sides if s]


def compare_text(reader: ReadContext, text: str, search: Callable[[SearchRequest], SearchResponse]) -> CompareResponse:
    """Resolve each side of "A vs B" by ``search`` (sharing the words only one side carries, as in
    "nike vs puma running shoes") and compare the best match of each."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput("compare text is empty")
    sides = split_sides(text)
    if len(sides) < 2:
        raise InvalidInput(f"could not find two things to compare in {text!r}; write them like 'A vs B'")
    if len(sides) > MAX_COMPARE:
        raise InvalidInput(f"compare takes at most {MAX_COMPARE} sides, got {len(sides)}")
    g = reader.state.graph
    terms = [g.match_query(s) for s in sides]
    # Words of the side that names a category, minus its brand, complete the sides that name none.
    context = ""
    for s, tm in reversed(list(zip(sides, terms))):
        if tm.get("category"):
            ctx = s
            for ph in tm.phrases.get("brand", []):
                ctx = re.sub(re.escape(ph), " ", ctx, count=1, flags=re.IGNORECASE)
            context = " ".join(ctx.split())
            break
    queries = [s if tm.get("category") or not context else f"{s} {context}" for s, tm in zip(sides, terms)]
    chosen: list[str] = []
    for side, q in zip(sides, queries):
        res = search(SearchRequest(text=q, k=max(5, len(sides) + 1)))
        pick = next((h.id for h in res.results if h.id not in chosen), None)
        if pick is None:
            raise NotFound("product matching", side)
        chosen.append(pick)
    return compare(reader, chosen)

