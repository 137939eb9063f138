"""Merchandising rules: how a shop steers its own results (docs/merchandising.md).

A rule is ``{"conditions": {...}, "consequences": {...}, "enabled": bool}``:

- **conditions** (all must hold; none: every search): ``query`` ``{"is": ...}`` (the query's
  normalised words are exactly these) or ``{"contains": ...}`` (these words appear in it, in this
  order; for Chinese, Japanese and Korean a substring of the normalised query), ``category`` (a
  category the search filters on, explicitly or from the query's slots), ``intent`` (the query's
  intent label), ``variant`` (the search's experiment variant: a variant can be a rule set), and a
  campaign window ``from`` / ``until``;
- **consequences**: ``pin`` products at positions, ``boost`` / ``bury`` the products a filter
  matches by a weight (a share of the query's top score), ``hide`` products, restrict to
  ``filters``, show a ``banner``, ``redirect`` the shopper, and say what ``out_of_stock`` products
  do for this query (last, hide or show).

Rules are applied to a search's whole ranked pool, after ranking and before the storefront pages,
sorts and counts it (vitrine/search/reads.py), so every page, order and facet agrees: a pinned
product counts once, a hidden one nowhere. Pins hold their positions in the relevance order;
boosts change relevance only; hides, filters and stock apply to every order.

Matching is cheap at any number of rules: exact queries are a dict lookup by the normalised query,
``contains`` rules are indexed by their first word (or first character, for CJK) and only those
the query holds are checked. Each process holds the rules compiled in memory and reads the rule
store's version (one indexed ``max``) at most every ``rules_refresh_s``; when it moved, it loads
only the rules changed since: a rule put through any process applies in every other within about
that interval, with no restart. A rule that fails at search time is skipped and logged; rules
never break a search.

The rule as the API takes it (validation, export and import) is vitrine/merchandising/models.py.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import ValidationError

from vitrine.errors import InvalidInput, NotFound
from vitrine.lang import segment
from vitrine.merchandising.types import RuleStoreAPI, StoredRule
from vitrine.search import brand_index, storefront
from vitrine.index import stock
from vitrine.search.models import Filters, Hit, Ranked, SearchRequest
from vitrine.merchandising.models import Rule, RuleOut, check_rule, has_cjk, normalise

if TYPE_CHECKING:  # pragma: no cover
    from vitrine.search.read_context import ReadContext
    from vitrine.search.state import IndexState
    from vitrine.search.understanding import Plan
    from vitrine.settings import SearchSettings

log = logging.getLogger(__name__)


# -- compiled rules -------------------------------------------------------------------------------------
EXACT, CONTAINS, ANY = 0, 1, 2


@dataclass(frozen=True)
class Compiled:
    """A rule ready to match: its normalised query pattern and conditions as sets and numbers."""

    id: str
    rule: Rule
    kind: int
    pattern: str = ""
    cjk: bool = False
    words: tuple[str, ...] = ()  # a CJK pattern's words (segmented)
    priority: int = 0
    categories: frozenset[str] = frozenset()
    intents: frozenset[str] = frozenset()
    variant: str | None = None
    start: float | None = None
    end: float | None = None

    @classmethod
    def of(cls, rule_id: str, rule: Rule) -> Compiled:
        c = rule.conditions
        kind, pattern = ANY, ""
        if c.query is not None:
            kind = EXACT if c.query.is_ is not None else CONTAINS
            pattern = normalise(c.query.is_ if c.query.is_ is not None else c.query.contains)
        cjk = has_cjk(pattern)
        return cls(
            id=rule_id, rule=rule, kind=kind, pattern=pattern, cjk=cjk, priority=rule.priority,
            words=tuple(segment.words(pattern)) if cjk and kind == CONTAINS else (),
            categories=frozenset(x.casefold() for x in _listed(c.category)),
            intents=frozenset(_listed(c.intent)), variant=c.variant,
            start=c.from_.timestamp() if c.from_ else None, end=c.until.timestamp() if c.until else None)

    def live(self, now: float) -> bool:
        return (self.start is None or now >= self.start) and (self.end is None or now < self.end)

    def holds(self, q: QueryFacts) -> bool:
        if self.kind == EXACT and q.norm != self.pattern:
            return False
        if self.kind == CONTAINS and not (q.holds_words(self.words) if self.cjk else f" {self.pattern} " in q.padded):
            return False
        if self.categories and not (self.categories & q.categories):
            return False
        if self.intents and q.intent not in self.intents:
            return False
        if self.variant is not None and q.variant != self.variant:
            return False
        return self.live(q.now)


def _listed(v: str | Sequence[str] | None) -> list[str]:
    if v is None:
        return []
    return [v] if isinstance(v, str) else list(v)


@dataclass
class QueryFacts:
    """What rules match a search on."""

    norm: str
    categories: frozenset[str] = frozenset()
    intent: str | None = None
    variant: str | None = None
    now: float = 0.0

    @property
    def padded(self) -> str:
        return f" {self.norm} "

    def holds_words(self, words: Sequence[str]) -> bool:
        """Whether the query's segmented words hold ``words`` (a CJK pattern's), in this order and
        side by side; a one-word pattern may also be a shorter dictionary word of a longer query
        word ("连衣裙" in "红色连衣裙", but not "包" in "面包")."""
        if not words:
            return False
        got = segment.words(self.norm)
        n = len(words)
        if any(tuple(got[j:j + n]) == tuple(words) for j in range(len(got) - n + 1)):
            return True
        return n == 1 and words[0] in segment.words(self.norm, search_mode=True)

    @classmethod
    def of(cls, text: str | None, req: SearchRequest, plan: Plan | None, variant: str | None) -> QueryFacts:
        cats: set[str] = set()
        for flt in (req.filters, plan.filters if plan is not None else None):
            if flt is not None and flt.category:
                cats.update(x.casefold() for x in _listed(flt.category))
        return cls(norm=normalise(text), categories=frozenset(cats),
                   intent=plan.label if plan is not None else None, variant=variant, now=time.time())


class RuleSet:
    """Enabled rules indexed for matching (immutable: a change builds a new one)."""

    def __init__(self, rules: Iterable[Compiled] = ()) -> None:
        self.exact: dict[str, list[Compiled]] = {}
        self.by_word: dict[str, list[Compiled]] = {}
        self.by_char: dict[str, list[Compiled]] = {}
        self.by_category: dict[str, list[Compiled]] = {}  # no query condition, a category one
        self.anywhere: list[Compiled] = []
        n = 0
        for c in rules:
            n += 1
            if c.kind == EXACT:
                self.exact.setdefault(c.pattern, []).append(c)
            elif c.kind == CONTAINS and c.cjk:
                self.by_char.setdefault(c.pattern[0], []).append(c)
            elif c.kind == CONTAINS:
                self.by_word.setdefault(c.pattern.split(" ", 1)[0], []).append(c)
            elif c.categories:
                for cat in c.categories:
                    self.by_category.setdefault(cat, []).append(c)
            else:
                self.anywhere.append(c)
        self.size = n

    def matching(self, q: QueryFacts) -> list[Compiled]:
        """The rules whose conditions hold for ``q``, in precedence order: higher ``priority``
        first; equal priorities: exact query, then contains, then the rest, by rule id within each
        (the first rule wins a contested pin position, banner, redirect or out_of_stock)."""
        if not self.size:
            return []
        cands: dict[str, Compiled] = {}
        if q.norm:
            for c in self.exact.get(q.norm, ()):
                cands[c.id] = c
            if self.by_word:
                for w in set(q.norm.split(" ")):
                    for c in self.by_word.get(w, ()):
                        cands[c.id] = c
            if self.by_char:
                for ch in set(q.norm):
                    for c in self.by_char.get(ch, ()):
                        cands[c.id] = c
        for cat in q.categories:
            for c in self.by_category.get(cat, ()):
                cands[c.id] = c
        for c in self.anywhere:
            cands[c.id] = c
        return sorted((c for c in cands.values() if c.holds(q)), key=lambda c: (-c.priority, c.kind, c.id))


def _isin(a: np.ndarray, b: np.ndarray | Sequence[int]) -> np.ndarray:
    """``np.isin`` for product iids: by a lookup table over ``b``'s range (a third of the sorting
    method's time for a pool against a rule's product set), sorting only when that range is huge."""
    b = np.asarray(b, dtype=np.int64)
    if not len(a) or not len(b):
        return np.zeros(len(a), dtype=bool)
    if int(b.max()) - int(b.min()) > 10_000_000:
        return np.isin(a, b)
    return np.isin(a, b, kind="table")


# -- what a search's rules did ------------------------------------------------------------------------------
@dataclass
class Outcome:
    """The pool after the rules, which rules fired, and what they did to which product."""

    ranked: Ranked
    fired: list[str] = field(default_factory=list)
    effects: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    banner: dict[str, Any] | None = None
    redirect: str | None = None
    matching: int | None = None  # how many of ``ranked``'s head match (None: the storefront's floor says)
    changed: set[str] = field(default_factory=set)  # rules that changed the results (only these are ``fired``)

    def note(self, iid: int, effect: dict[str, Any]) -> None:
        self.effects.setdefault(int(iid), []).append(effect)

    def mark(self, hit: Hit, iid: int) -> None:
        """Name on ``hit`` the rules that moved it (and, when it is explained, what each did)."""
        eff = self.effects.get(int(iid))
        if not eff:
            return
        named = [e["rule"] for e in eff if e.get("rule")]
        hit.rules = list(dict.fromkeys(named)) or None
        if hit.explanation is not None:
            hit.explanation.rules = [dict(e) for e in eff]

    def response_fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rules": list(self.fired)}
        if self.banner is not None:
            out["banner"] = self.banner
        if self.redirect is not None:
            out["redirect"] = self.redirect
        return out


@dataclass
class _Actions:
    """The consequences of the fired rules, resolved to product iids and id sets."""

    hide: dict[int, str] = field(default_factory=dict)  # iid -> the first rule hiding it
    only: list[tuple[str, np.ndarray]] = field(default_factory=list)  # (rule, allowed iids)
    moves: list[tuple[str, str, float, np.ndarray]] = field(default_factory=list)  # (rule, action, weight, iids)
    pins: dict[int, tuple[int, str]] = field(default_factory=dict)  # iid -> (position, rule)
    stock: tuple[str, str | None] | None = None  # (mode, rule)
    banner: tuple[dict[str, Any], str] | None = None
    redirect: tuple[str, str] | None = None


class RuleBook:
    """The rules of one record store, as one process serves them (see the module docstring)."""

    def __init__(self, store: RuleStoreAPI, state: IndexState, settings: SearchSettings) -> None:
        self.store, self.state, self.settings = store, state, settings
        self._compiled: dict[str, Compiled] = {}
        self._set = RuleSet()
        self._version = 0
        self._checked = -1e18
        self._lock = threading.Lock()
        self._iids: dict[str, int] = {}
        self._miss_seq = -1
        self._missed: set[str] = set()  # ids not found at catalogue change _miss_seq
        self.broken: dict[str, str] = {}  # stored rules this version cannot read: id -> why

    # -- following the store ------------------------------------------------------------------------
    def current(self) -> RuleSet:
        """The rule set, re-read when the store moved (checked at most every ``rules_refresh_s``)."""
        if time.monotonic() - self._checked >= self.settings.rules_refresh_s:
            self.refresh(wait=False)
        return self._set

    def refresh(self, *, wait: bool = True) -> int:
        """Load the rules changed since the version held; returns the store's version. A failing
        store keeps the rules held (logged). ``wait=False``: skip when another thread is at it."""
        if not self._lock.acquire(blocking=wait):
            return self._version
        try:
            self._checked = time.monotonic()
            try:
                version = self.store.version()
                if version == self._version:
                    return version
                changed = self.store.changed_since(self._version)
            except Exception as e:  # noqa: BLE001 - the rules held keep serving
                log.warning("rule store unreadable (%s); serving the rules held", e)
                return self._version
            compiled = dict(self._compiled)
            for r in changed:
                compiled.pop(r.id, None)
                self.broken.pop(r.id, None)
                if r.deleted or not r.enabled:
                    continue
                try:
                    compiled[r.id] = Compiled.of(r.id, Rule.model_validate({**r.body, "enabled": True}))
                except (ValidationError, ValueError) as e:
                    self.broken[r.id] = str(e)
                    log.warning("rule %r skipped: it does not read as a rule (%s)", r.id, e)
            self._compiled = compiled
            self._set = RuleSet(compiled.values())
            wanted = {pid for r in changed if r.id in compiled
                      for pid in (*compiled[r.id].rule.consequences.hide,
                                  *(p.id for p in compiled[r.id].rule.consequences.pin))}
            try:  # resolved now, in one pass, rather than by the first searches they fire on
                self.iids_of(sorted(wanted))
            except Exception as e:  # noqa: BLE001 - searches resolve them as they fire
                log.warning("rule products not resolved ahead (%s)", e)
            self._version = max([version, *(r.seq for r in changed)])
            return self._version
        finally:
            self._lock.release()

    # -- managing rules ---------------------------------------------------------------------------------
    def validate(self, rule: Rule) -> None:
        """The checks a rule's shape cannot say (:func:`check_rule`)."""
        check_rule(rule, self.state.records, self.settings.max_k)

    def warnings(self, rule: Rule) -> list[str]:
        """What in ``rule`` matches nothing in the catalogue now: each filter of a boost, bury or
        ``filters`` that allows no product, naming a brand (or other value) no product has."""
        cons = rule.consequences
        parts = [(f"consequences.boost[{j}].filter", b.filter) for j, b in enumerate(cons.boost)]
        parts += [(f"consequences.bury[{j}].filter", b.filter) for j, b in enumerate(cons.bury)]
        if cons.filters is not None and not cons.filters.is_empty():
            parts.append(("consequences.filters", cons.filters))
        out = []
        for where, flt in parts:
            if len(self._allowed(flt)):
                continue
            why = [f"no product has the brand {b!r}" for b in flt.terms().get("brand", [])
                   if not len(brand_index.brand_ids(self.state.graph, self.state.filters, [b]))]
            shown = flt.model_dump(exclude_none=True, mode="json")
            out.append(f"{where}: no product matches {shown}" + (f" ({'; '.join(why)})" if why else "")
                       + ": the rule is stored, but this part changes nothing")
        return out

    def put(self, rule_id: str, rule: Rule) -> RuleOut:
        self.validate(rule)
        warned = self.warnings(rule)
        stored = self.store.put(rule_id, rule.body(), rule.enabled, max_rules=self.settings.max_rules)
        self.refresh()
        out = self.out(stored)
        if warned:
            for w in warned:
                log.warning("rule %r: %s", rule_id, w)
            out.warnings = warned
        return out

    def put_many(self, rules: Sequence[tuple[str, Rule]]) -> int:
        """Create or replace many rules at once (an import), each checked first."""
        for rid, rule in rules:
            try:
                self.validate(rule)
            except InvalidInput as e:
                raise InvalidInput(f"rule {rid!r}: {e}") from e
        n = self.store.put_many([(rid, r.body(), r.enabled) for rid, r in rules], max_rules=self.settings.max_rules)
        self.refresh()
        return n

    def get(self, rule_id: str) -> RuleOut:
        stored = self.store.get(rule_id)
        if stored is None:
            raise NotFound("rule", rule_id)
        return self.out(stored)

    def list(self) -> list[RuleOut]:
        out = []
        for s in self.store.all():
            try:
                out.append(self.out(s))
            except ValidationError as e:
                log.warning("rule %r not listed: it does not read as a rule (%s)", s.id, e)
        return out

    def delete(self, rule_id: str) -> None:
        if not self.store.delete(rule_id):
            raise NotFound("rule", rule_id)
        self.refresh()

    @staticmethod
    def out(stored: StoredRule) -> RuleOut:
        rule = Rule.model_validate({**stored.body, "enabled": stored.enabled})
        live = rule.enabled and Compiled.of(stored.id, rule).live(time.time())
        return RuleOut(id=stored.id, updated=datetime.fromtimestamp(stored.updated, UTC), active=live,
                       **rule.model_dump(by_alias=True))

    # -- applying them -----------------------------------------------------------------------------------
    def apply(self, reader: ReadContext, req: SearchRequest, text: str | None, plan: Plan | None, ranked: Ranked,
              variant: str | None = None, allowed: np.ndarray | None = None) -> Outcome:
        """The rules that hold for this search (``variant``: its experiment variant, None when
        none runs), applied to its whole ranked pool ``ranked``; ``allowed``: the ids the search's
        own filters allow (a pinned product outside them is not inserted). Never raises: a rule
        that fails is skipped and logged, and if applying fails the pool is left as it was."""
        out = Outcome(ranked=ranked)
        try:
            fired = self.current().matching(QueryFacts.of(text, req, plan, variant))
        except Exception as e:  # noqa: BLE001 - rules never break a search
            log.warning("rules skipped for this search: %s", e)
            fired = []
        acts = _Actions()
        resolved = []
        for c in fired:
            try:
                self._resolve(c, acts)
                resolved.append(c.id)
            except Exception as e:  # noqa: BLE001 - one failing rule is skipped
                log.warning("rule %r skipped for this search: %s", c.id, e)
        try:
            out.ranked = self._run(reader, ranked, acts, out, allowed)
        except Exception as e:  # noqa: BLE001
            log.warning("rules not applied to this search: %s", e)
            return Outcome(ranked=ranked)
        if acts.banner is not None:
            out.banner = acts.banner[0]
            out.changed.add(acts.banner[1])
        if acts.redirect is not None:
            out.redirect = acts.redirect[0]
            out.changed.add(acts.redirect[1])
        # ``fired``: the rules that held *and* changed what the shopper gets (a hide of a product
        # the search never found, a boost of a brand absent from the pool, a pin already in place
        # change nothing and are not listed)
        out.fired = [rid for rid in resolved if rid in out.changed]
        return out

    def iids_of(self, ids: Sequence[str]) -> dict[str, int]:
        """Product id -> iid (cached; ids not found are asked again once the catalogue changed)."""
        if self.state.seq != self._miss_seq:  # the catalogue changed: ids not found may exist now
            self._miss_seq, self._missed = self.state.seq, set()
        missing = [i for i in ids if i not in self._iids and i not in self._missed]
        if missing:
            for pid, row in self.state.records.get_many(missing, include_deleted=True).items():
                if row.iid is not None:
                    self._iids[pid] = int(row.iid)
            self._missed.update(i for i in missing if i not in self._iids)
        return {i: self._iids[i] for i in ids if i in self._iids}

    def _allowed(self, flt: Filters) -> np.ndarray:
        """The iids ``flt`` allows, as a search's own filters read it (vitrine/search/state.py): a
        brand is the record's brand, or the one the product graph learned from its title."""
        got = self.state.allowed(flt)
        return np.zeros(0, dtype=np.int64) if got is None else got

    def _resolve(self, c: Compiled, acts: _Actions) -> None:
        cons = c.rule.consequences
        hide = {iid: c.id for iid in self.iids_of(cons.hide).values()} if cons.hide else {}
        only = (c.id, self._allowed(cons.filters)) if cons.filters is not None and not cons.filters.is_empty() else None
        moves = [(c.id, "boost", b.weight, self._allowed(b.filter)) for b in cons.boost] + \
                [(c.id, "bury", -b.weight, self._allowed(b.filter)) for b in cons.bury]
        pins: dict[int, tuple[int, str]] = {}
        if cons.pin:
            iids = self.iids_of([p.id for p in cons.pin])
            taken = {pos for pos, _ in acts.pins.values()}
            for p in cons.pin:
                iid = iids.get(p.id)
                if iid is not None and iid not in acts.pins and iid not in pins and p.position not in taken:
                    pins[iid] = (p.position, c.id)
                    taken.add(p.position)
        # all of this rule or none of it
        for iid, rid in hide.items():
            acts.hide.setdefault(iid, rid)
        if only is not None:
            acts.only.append(only)
        acts.moves += moves
        acts.pins.update(pins)
        if cons.out_of_stock is not None and acts.stock is None:
            acts.stock = (cons.out_of_stock, c.id)
        if cons.banner is not None and acts.banner is None:
            acts.banner = (cons.banner, c.id)
        if cons.redirect is not None and acts.redirect is None:
            acts.redirect = (cons.redirect, c.id)

    def _run(self, reader: ReadContext, ranked: Ranked, acts: _Actions, out: Outcome,
             allowed: np.ndarray | None) -> Ranked:
        """The pool after the rules, matching products first; sets ``out.matching`` (how many).

        Which products match is the ranking's (those above its relevance floor, as the storefront
        counts them) less those hidden or filtered out, plus the pinned ones; a boost or bury
        re-scores a product by a share of the query's top score, and it matches when its new score
        clears the floor of the ranking as it was."""
        mode, stock_rule = acts.stock or (self.settings.out_of_stock, None)
        oos = self.state.filters.allowed({stock.FIELD: [stock.OUT]}) if mode != "show" else None
        if oos is None:  # stock shown as it is, or nothing filters
            oos = np.zeros(0, dtype=np.int64)
        has_oos = len(oos) > 0
        if not (acts.hide or acts.only or acts.moves or acts.pins or has_oos) or not (ranked or acts.pins):
            return ranked
        floor = reader.relevance_floor
        n0 = storefront.above_floor(ranked, floor)
        top = ranked[0][1] if ranked else 0.0
        threshold = floor * top if top > 0 and floor > 0 else -np.inf
        pool = list(ranked)
        iids = np.fromiter((e[0] for e in pool), dtype=np.int64, count=len(pool))
        head = np.arange(len(pool)) < n0
        # pinned products leave their places (they come back at their positions)
        pinned_parts: dict[int, Mapping[str, float]] = {}
        pin_ids = np.fromiter(acts.pins, dtype=np.int64, count=len(acts.pins))
        keep = np.ones(len(pool), dtype=bool)
        if acts.pins:
            in_pin = _isin(iids, pin_ids)
            for j in np.flatnonzero(in_pin).tolist():
                pinned_parts[pool[j][0]] = pool[j][2]
            keep &= ~in_pin
            if allowed is not None:  # a product outside the search's own filters stays out
                pin_ids = pin_ids[_isin(pin_ids, allowed) | _isin(pin_ids, list(pinned_parts))]
        keep_pin = np.ones(len(pin_ids), dtype=bool)
        for rid, ok in acts.only:
            inside = _isin(iids, ok)
            if (keep & ~inside).any():
                out.changed.add(rid)
            keep &= inside
            keep_pin &= _isin(pin_ids, ok)
        if acts.hide:
            gone = np.fromiter(acts.hide, dtype=np.int64, count=len(acts.hide))
            hidden = keep & _isin(iids, gone)
            out.changed.update(acts.hide[int(i)] for i in iids[hidden].tolist())
            keep &= ~hidden
            keep_pin &= ~_isin(pin_ids, gone)
        if has_oos and mode == "hide":
            gone_oos = keep & _isin(iids, oos)
            if gone_oos.any() and stock_rule is not None:
                out.changed.add(stock_rule)
            keep &= ~gone_oos
            keep_pin &= ~_isin(pin_ids, oos)
        pin_ids = pin_ids[keep_pin]
        rows = np.flatnonzero(keep)
        scores = np.fromiter((pool[j][1] for j in rows.tolist()), dtype=np.float64, count=len(rows))
        iids, head = iids[rows], head[rows]
        if acts.only and len(rows):  # filtered as a shopper's filter would: the floor of what is left
            filtered = [pool[j] for j in rows.tolist()]
            head = np.arange(len(rows)) < storefront.above_floor(filtered, floor)
            top = filtered[0][1]
            threshold = floor * top if top > 0 and floor > 0 else -np.inf
        order = np.arange(len(rows))
        if acts.moves and len(rows):
            scale = abs(top) or 1.0
            adj = np.zeros(len(rows))
            for rid, action, w, ids in acts.moves:
                hit = _isin(iids, ids)
                if hit.any():
                    adj[hit] += w * scale
                    out.changed.add(rid)
                    for iid in iids[hit].tolist():
                        out.note(iid, {"rule": rid, "action": action, "weight": w})
            moved = adj != 0
            if moved.any():
                scores = scores + adj
                head = np.where(moved, scores >= threshold, head)
                order = np.lexsort((np.arange(len(rows)), -scores, ~head))  # matching first, by new score
        elif not head.all() and head[order].tolist() != sorted(head.tolist(), reverse=True):
            order = np.lexsort((np.arange(len(rows)), ~head))
        if has_oos and mode == "last":  # out of stock: after the in-stock matching products
            o = _isin(iids, oos)
            lasts = o & head
            if lasts.any() and not lasts[head].all():
                rank = np.empty(len(order), dtype=np.int64)
                rank[order] = np.arange(len(order))
                order = np.lexsort((rank, lasts, ~head))
                if stock_rule is not None:
                    out.changed.add(stock_rule)
                for iid in iids[lasts].tolist():
                    out.note(iid, {"rule": stock_rule, "action": "stock", "out_of_stock": "last"})
        result: Ranked = [(int(iids[j]), float(scores[j]), pool[rows[j]][2]) for j in order.tolist()]
        n_match = int(head.sum())
        # where a pinned product would be without its pin (the pool's order, less what left it),
        # when nothing re-ordered the pool: a pin already at its place changes nothing
        was_at = {int(e[0]): j for j, e in enumerate(pool) if int(e[0]) in acts.pins} if len(pin_ids) else {}
        in_order = bool(np.all(order[1:] > order[:-1])) if len(order) > 1 else True
        for n_in, iid in enumerate(sorted(pin_ids.tolist(), key=lambda i: acts.pins[i][0])):
            pos, rid = acts.pins[iid]
            at = min(pos, n_match)  # a pin past the matching products sits right after them
            was = was_at.get(int(iid))
            natural = int(np.searchsorted(rows, was)) + n_in if was is not None and in_order else None
            if natural != at:
                out.changed.add(rid)
            if at < len(result):
                score = result[at][1]
            else:
                score = result[-1][1] if result else (top or 1.0)
            result.insert(at, (iid, score, pinned_parts.get(iid, {})))
            n_match += 1
            out.note(iid, {"rule": rid, "action": "pin", "position": pos})
        out.matching = n_match
        return result

