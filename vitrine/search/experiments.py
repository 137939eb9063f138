"""A/B experiments on ranking: variants, sticky assignment, staged rollout, and the verdict.

- An experiment names two or more **variants**, each a ranking configuration
  (:class:`VariantSettings`: ``calibration=floor|auto``, a ``tuning`` file, ``fusion_weights``,
  ``learn_weight``, a merchandising ``rules`` tag), and a **split** in percent. The first variant
  is the control. Experiments live in the event log's database (vitrine/index/eventlog.py: SQLite
  beside the data dir, or the PostgreSQL store), so every worker and replica sees a start, a
  split change or a stop within :data:`CACHE_TTL_S` (each process re-reads them at most that often).
- **Assignment** hashes the experiment's name with the shopper's ``user`` token (else the
  ``session``; a search with neither is not in the experiment) to a point ``u`` in [0, 1); the
  variants own consecutive ranges of the split, in order. The same user always gets the same
  variant while the split stands, and widening the last variant's share (95/5 -> 90/10 -> 50/50:
  a staged rollout) only moves users into it, never out of it.
- A search in a variant ranks with the variant's overrides (vitrine/search/variants.py, for that
  search only), its response names the variant, and its logged row carries the experiment and
  variant, so the events on it are attributed.
- **Interleaving** (``interleave``: exactly two variants): every search in the experiment runs
  both rankings and merges them by team draft; the team of each shown product is logged, a
  search's clicks are credited to the teams of the clicked products, and the report counts the
  searches each team won (a sign test).

The report (:meth:`Experiments.status`): per variant, searches, units (users, or sessions),
CTR, add-to-cart rate, conversion and mean reciprocal click rank, each with a 95% confidence
interval by the **delta method over units**: a shopper's searches are not independent (one
shopper clicks more than another), so a ratio metric's variance comes from per-unit sums, not
per-search outcomes (docs/experiments.md says why, and why not the bootstrap). The verdict tests
each variant against the control on CTR, conversion and MRR with a Bonferroni correction over
the three (each at ``alpha / 3``), so that looking at three metrics keeps the chance of a false
"wins" at most ``alpha``.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from vitrine.errors import InvalidInput, NotFound
from vitrine.search import variants
from vitrine.search.calibration import Calibration, floor
from vitrine.search.models import SearchRequest, SearchResponse
from vitrine.settings import DEFAULT_FUSION_WEIGHTS

CACHE_TTL_S = 1.0
ALPHA = 0.05
MIN_UNITS = 20  # no verdict before each variant has this many users (or sessions)
METRICS = ("ctr", "add_to_cart_rate", "conversion", "mrr")
VERDICT_METRICS = ("ctr", "conversion", "mrr")
INTERLEAVED = "interleaved"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class VariantSettings(BaseModel):
    """A ranking configuration. Unset fields rank as the server is configured."""

    model_config = ConfigDict(extra="forbid")

    calibration: Literal["floor", "auto"] | None = Field(
        None, description="floor: text queries rank by the text tower's cosine alone; auto: the data dir's tuning")
    tuning: str | None = Field(None, description="Path of a tuning.json (`vitrine tune`) whose text weights rank")
    fusion_weights: dict[str, float] | None = Field(
        None, description="Text ranking weights per signal (native, vector, bm25, graph signals)")
    learn_weight: float | None = Field(None, ge=0, description="Weight of the learned per-query re-ranking (0: off)")
    rules: str | None = Field(None, min_length=1, max_length=64,
                              description="Tag matched by merchandising rules' variant condition (default: the name)")

    @field_validator("fusion_weights")
    @classmethod
    def _weights(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is not None and (any(not math.isfinite(w) or w < 0 for w in v.values()) or not any(v.values())):
            raise ValueError("fusion_weights: non-negative numbers, at least one above 0")
        unknown = sorted(set(v or {}) - set(DEFAULT_FUSION_WEIGHTS))
        if unknown:
            raise ValueError(f"fusion_weights: unknown signals {unknown}; known: {', '.join(DEFAULT_FUSION_WEIGHTS)}")
        return v

    @model_validator(mode="after")
    def _one_ranking(self) -> "VariantSettings":
        if sum(x is not None for x in (self.calibration, self.tuning, self.fusion_weights)) > 1:
            raise ValueError("give one of calibration, tuning, fusion_weights")
        return self


class ExperimentCreate(BaseModel):
    """``POST /v1/experiments``: a new experiment, started at once."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{
        "name": "floor-vs-tuned", "variants": {"A": {"calibration": "auto"}, "B": {"calibration": "floor"}},
        "split": [95, 5]}]})

    name: str = Field(min_length=1, max_length=64, description="Unique name: letters, digits, _ . -")
    variants: dict[str, VariantSettings] = Field(description="Variant name -> ranking; the first is the control")
    split: list[float] | None = Field(None, description="Percent of users per variant, in order (default: equal)")
    interleave: bool = Field(False, description="Team-draft interleaving of exactly two variants in every search")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("name: letters, digits, _ . - (64 at most), starting with a letter or digit")
        return v


class SplitChange(BaseModel):
    model_config = ConfigDict(extra="forbid")

    split: list[float] = Field(description="Percent of users per variant, in the experiment's order")


class Experiment(BaseModel):
    """An experiment as stored (JSON in the event log's ``experiments`` table)."""

    name: str
    variants: dict[str, VariantSettings]
    split: list[float]
    interleave: bool = False
    status: Literal["running", "stopped"] = "running"
    created: float
    stopped: float | None = None
    history: list[dict[str, Any]] = Field(default_factory=list, description="Split changes: {ts, split}")


class Interval(BaseModel):
    value: float | None
    low: float | None = None
    high: float | None = None


class VariantReport(BaseModel):
    variant: str
    share: float = Field(description="Percent of units assigned to it now")
    units: int = Field(description="Users (or sessions, for searches without a user) with a search in this variant")
    searches: int
    clicked: int
    added_to_cart: int
    purchased: int
    ctr: Interval
    add_to_cart_rate: Interval
    conversion: Interval
    mrr: Interval = Field(description="Mean reciprocal rank of the first click (0 for a search without one)")


class Comparison(BaseModel):
    variant: str
    control: str
    metric: str
    difference: Interval = Field(description="variant - control, with its 95% interval")
    relative: float | None = Field(description="difference / control value")
    p_value: float | None
    significant: bool = Field(description="p below alpha / 3 (Bonferroni over CTR, conversion, MRR)")


class InterleavingReport(BaseModel):
    searches: int = Field(description="Interleaved searches with at least one click")
    wins: dict[str, int] = Field(description="Searches whose clicks went more to this team")
    ties: int
    preference: float | None = Field(description="Share of decided searches the second variant won (0.5: none)")
    p_value: float | None = Field(description="Two-sided sign test (exact binomial) of the wins")


class ExperimentReport(BaseModel):
    experiment: Experiment
    method: str = Field(description="How the intervals and tests are computed")
    alpha: float
    variants: list[VariantReport]
    comparisons: list[Comparison]
    interleaving: InterleavingReport | None = None
    verdict: str
    winner: str | None


# -- parsing a variant from the command line ----------------------------------------------------
def _split_top(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside braces, brackets and quotes."""
    out, depth, cur, quote = [], 0, [], None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == sep and depth == 0:
            out.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    out.append("".join(cur))
    return [p.strip() for p in out if p.strip()]


def parse_variant(text: str) -> tuple[str, VariantSettings]:
    """``NAME=key=value,key=value`` or ``NAME={json}`` (``vitrine experiment start --variant``);
    ``NAME=`` alone: as configured. Values are JSON where they parse as JSON."""
    name, sep, rest = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise InvalidInput(f"variant {text!r}: NAME=setting=value,... or NAME={{json}}")
    rest = rest.strip()
    try:
        if rest.startswith("{"):
            raw = json.loads(rest)
        else:
            raw = {}
            for part in _split_top(rest, ","):
                k, eq, v = part.partition("=")
                if not eq:
                    raise InvalidInput(f"variant {name}: {part!r} is not setting=value")
                try:
                    raw[k.strip()] = json.loads(v)
                except json.JSONDecodeError:
                    raw[k.strip()] = v.strip()
        return name, VariantSettings.model_validate(raw)
    except (json.JSONDecodeError, ValidationError) as e:
        raise InvalidInput(f"variant {name}: {e}") from e


def normalise_split(split: Sequence[float] | None, n: int) -> list[float]:
    if split is None:
        return [round(100.0 / n, 6)] * n
    if len(split) != n:
        raise InvalidInput(f"split: {len(split)} shares for {n} variants")
    if any(not math.isfinite(s) or s < 0 for s in split) or sum(split) <= 0:
        raise InvalidInput("split: non-negative percentages, not all 0")
    total = float(sum(split))
    return [round(100.0 * s / total, 6) for s in split]


# -- assignment and team draft ------------------------------------------------------------------
def unit_of(req: SearchRequest) -> str | None:
    """What assignment hashes: the user token, else the session (None: not in the experiment)."""
    if req.user:
        return "u:" + req.user
    if req.session:
        return "s:" + req.session
    return None


def point(name: str, unit: str) -> float:
    """The unit's fixed point in [0, 1) for experiment ``name``."""
    h = hashlib.sha256(f"{name}\x00{unit}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2.0**64


def pick(split: Sequence[float], u: float) -> int:
    """The variant whose range of the cumulative split holds ``u``."""
    edge = 0.0
    total = sum(split)
    for i, s in enumerate(split):
        edge += s / total
        if u < edge:
            return i
    return len(split) - 1


def team_draft(a: Sequence[str], b: Sequence[str], k: int, rng: random.Random,
               names: tuple[str, str] = ("A", "B")) -> tuple[list[str], dict[str, str]]:
    """Team-draft interleaving (Radlinski et al. 2008): in each round a coin decides which team
    picks first; each team adds its highest-ranked product not yet taken. Returns the merged list
    (at most ``k``) and each product's team."""
    merged: list[str] = []
    teams: dict[str, str] = {}
    count = {names[0]: 0, names[1]: 0}
    lists = {names[0]: list(a), names[1]: list(b)}
    pos = {names[0]: 0, names[1]: 0}

    def take(team: str) -> bool:
        lst = lists[team]
        while pos[team] < len(lst) and lst[pos[team]] in teams:
            pos[team] += 1
        if pos[team] >= len(lst):
            return False
        pid = lst[pos[team]]
        teams[pid] = team
        merged.append(pid)
        count[team] += 1
        return True

    while len(merged) < k:
        first = names[0] if count[names[0]] < count[names[1]] or (
            count[names[0]] == count[names[1]] and rng.random() < 0.5) else names[1]
        second = names[1] if first == names[0] else names[0]
        if not take(first) and not take(second):
            break
        if len(merged) < k and count[second] < count[first]:
            take(second)
    return merged[:k], {p: teams[p] for p in merged[:k]}


# -- statistics ------------------------------------------------------------------------------------
Z95 = 1.959963984540054


def normal_p(z: float) -> float:
    """Two-sided p-value of a standard normal statistic."""
    return math.erfc(abs(z) / math.sqrt(2.0))


def z_for(alpha: float) -> float:
    """The two-sided critical value of a standard normal at ``alpha`` (bisection on erfc)."""
    lo, hi = 0.0, 10.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if normal_p(mid) > alpha else (lo, mid)
    return (lo + hi) / 2


def ratio_delta(x: Sequence[float], n: Sequence[float]) -> tuple[float | None, float | None]:
    """A ratio metric sum(x) / sum(n) over units, with its standard error by the delta method:
    Var(R) ~ Var(x_i - R n_i) / (N * mean(n)^2) (Deng, Knoblich and Lu 2018). Units, not searches,
    are the independent draws. (None, None) without units; an SE of None with one unit."""
    units = len(n)
    total_n = float(sum(n))
    if units == 0 or total_n == 0:
        return None, None
    r = float(sum(x)) / total_n
    if units < 2:
        return r, None
    mean_n = total_n / units
    resid = [xi - r * ni for xi, ni in zip(x, n)]
    mu = sum(resid) / units
    var = sum((d - mu) ** 2 for d in resid) / (units - 1)
    return r, math.sqrt(var / units) / mean_n


def sign_test(wins: int, losses: int) -> float | None:
    """Two-sided exact binomial p-value of ``wins`` vs ``losses`` under p = 1/2."""
    n = wins + losses
    if n == 0:
        return None
    k = min(wins, losses)
    if n > 2000:  # normal approximation with continuity correction
        return min(1.0, normal_p((abs(wins - losses) - 1) / math.sqrt(n)))
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0**n
    return min(1.0, 2 * tail)


@dataclass
class UnitRows:
    """Per unit of one variant: searches, clicked, carted, bought, sum of reciprocal ranks."""

    n: list[float] = field(default_factory=list)
    clicked: list[float] = field(default_factory=list)
    carted: list[float] = field(default_factory=list)
    bought: list[float] = field(default_factory=list)
    rr: list[float] = field(default_factory=list)

    def metric(self, name: str) -> list[float]:
        return {"ctr": self.clicked, "add_to_cart_rate": self.carted, "conversion": self.bought, "mrr": self.rr}[name]


def _interval(r: float | None, se: float | None, z: float = Z95) -> Interval:
    if r is None:
        return Interval(value=None)
    if se is None:
        return Interval(value=round(r, 6))
    return Interval(value=round(r, 6), low=round(r - z * se, 6), high=round(r + z * se, 6))


def analyse(exp: Experiment, units: Sequence[tuple], clicks: Sequence[tuple[str, str, str]] = (), *,
            alpha: float = ALPHA, min_units: int = MIN_UNITS) -> ExperimentReport:
    """The report of ``exp`` from its per-unit rows (the store's ``experiment_units``) and, when
    interleaved, its clicked searches' teams (``interleaved_clicks``)."""
    names = list(exp.variants)
    by: dict[str, UnitRows] = {}
    for v, _unit, n, c, a, b, rr in units:
        u = by.setdefault(v, UnitRows())
        u.n.append(n), u.clicked.append(c), u.carted.append(a), u.bought.append(b), u.rr.append(rr)
    shown = [INTERLEAVED] if exp.interleave else names
    reports = []
    for i, v in enumerate(shown):
        u = by.get(v, UnitRows())
        share = 100.0 if exp.interleave else exp.split[i]
        reports.append(VariantReport(
            variant=v, share=share, units=len(u.n), searches=int(sum(u.n)), clicked=int(sum(u.clicked)),
            added_to_cart=int(sum(u.carted)), purchased=int(sum(u.bought)),
            **{m: _interval(*ratio_delta(u.metric(m), u.n)) for m in METRICS}))
    comparisons: list[Comparison] = []
    verdict, winner = "not significant", None
    if exp.interleave:
        inter = interleaving(names, clicks)
        if inter.p_value is None or sum(inter.wins.values()) < min_units:
            verdict = f"not yet significant: {sum(inter.wins.values())} decided searches (at least {min_units})"
        elif inter.p_value < alpha:
            winner = max(inter.wins, key=lambda t: inter.wins[t])
            verdict = f"{winner} wins (interleaving: {inter.wins[winner]} of {sum(inter.wins.values())} decided " \
                      f"searches, p={inter.p_value:.3g})"
        return ExperimentReport(experiment=exp, method=METHOD_INTERLEAVE, alpha=alpha, variants=reports,
                                comparisons=[], interleaving=inter, verdict=verdict, winner=winner)
    control = names[0]
    cu = by.get(control, UnitRows())
    z_verdict = z_for(alpha / len(VERDICT_METRICS))
    small = [v for v in names if len(by.get(v, UnitRows()).n) < min_units]
    wins: dict[str, list[str]] = {}
    losses: dict[str, list[str]] = {}
    for v in names[1:]:
        vu = by.get(v, UnitRows())
        for m in METRICS:
            rc, sc = ratio_delta(cu.metric(m), cu.n)
            rv, sv = ratio_delta(vu.metric(m), vu.n)
            if rc is None or rv is None or sc is None or sv is None:
                comparisons.append(Comparison(variant=v, control=control, metric=m, difference=Interval(value=None),
                                              relative=None, p_value=None, significant=False))
                continue
            d, se = rv - rc, math.sqrt(sc * sc + sv * sv)
            p = normal_p(d / se) if se > 0 else (1.0 if d == 0 else 0.0)
            sig = m in VERDICT_METRICS and not small and abs(d) > z_verdict * se
            comparisons.append(Comparison(variant=v, control=control, metric=m, difference=_interval(d, se),
                                          relative=round(d / rc, 6) if rc else None, p_value=round(p, 6),
                                          significant=sig))
            if sig:
                (wins if d > 0 else losses).setdefault(v, []).append(m)
    if small:
        verdict = f"not yet significant: too few users in {', '.join(small)} (at least {min_units} each)"
    elif wins or losses:
        better = [v for v in wins if v not in losses]
        worse = [v for v in losses if v not in wins]
        if better:
            winner = max(better, key=lambda v: next(c.difference.value or 0 for c in comparisons
                                                      if c.variant == v and c.metric == wins[v][0]))
            verdict = f"{winner} wins over {control} on {', '.join(wins[winner])}"
        elif worse and len(names) == 2:
            winner = control
            verdict = f"{control} wins over {worse[0]} on {', '.join(losses[worse[0]])}"
        elif worse:
            verdict = f"{', '.join(worse)} worse than {control} on " + "; ".join(
                f"{v}: {', '.join(losses[v])}" for v in worse)
        else:
            verdict = "mixed: " + "; ".join(f"{v} better on {', '.join(wins.get(v, []))}, worse on "
                                            f"{', '.join(losses.get(v, []))}" for v in set(wins) | set(losses))
    return ExperimentReport(experiment=exp, method=METHOD_AB, alpha=alpha, variants=reports, comparisons=comparisons,
                            verdict=verdict, winner=winner)


METHOD_AB = ("ratio metrics over units (users, else sessions); 95% intervals by the delta method over units; "
             "verdict: each variant vs the control on ctr, conversion and mrr, two-sided z-test at alpha/3 "
             "(Bonferroni over the three)")
METHOD_INTERLEAVE = ("team-draft interleaving; a search's clicks are credited to the teams of the clicked products; "
                     "the team with more clicks wins the search; two-sided exact sign test over decided searches")


def interleaving(names: Sequence[str], clicks: Sequence[tuple[str, str, str]]) -> InterleavingReport:
    """Wins per team over the interleaved searches with clicks."""
    per: dict[str, dict[str, int]] = {}
    for qid, teams_json, pid in clicks:
        teams = json.loads(teams_json)
        team = teams.get(pid)
        if team is not None:
            per.setdefault(qid, {}).setdefault(team, 0)
            per[qid][team] += 1
    wins = {n: 0 for n in names}
    ties = 0
    for counts in per.values():
        a, b = counts.get(names[0], 0), counts.get(names[1], 0)
        if a == b:
            ties += 1
        else:
            wins[names[0] if a > b else names[1]] += 1
    decided = wins[names[0]] + wins[names[1]]
    return InterleavingReport(searches=len(per), wins=wins, ties=ties,
                              preference=round(wins[names[1]] / decided, 6) if decided else None,
                              p_value=sign_test(wins[names[1]], wins[names[0]]))


# -- the registry ----------------------------------------------------------------------------------
@dataclass
class Assignment:
    """One search's place in an experiment."""

    experiment: Experiment
    variant: str
    unit: str
    teams: dict[str, str] | None = None


class Experiments:
    """Experiments in an event log (see the module docstring). ``log``: the feedback log (it has
    ``save_experiment``, ``experiment_specs``, ``experiment_units``, ``log_teams``,
    ``interleaved_clicks``); ``data_dir``: where relative ``tuning`` paths are read from."""

    def __init__(self, log: Any, data_dir: Path | None = None, *, ttl_s: float = CACHE_TTL_S) -> None:
        self.log = log
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._cache: tuple[float, list[Experiment]] | None = None
        self._overrides: dict[tuple[str, str, str], variants.RankingOverride] = {}

    # -- the store
    def all(self, *, fresh: bool = False) -> list[Experiment]:
        now = time.monotonic()
        cached = self._cache
        if not fresh and cached is not None and now - cached[0] < self.ttl_s:
            return cached[1]
        exps = [Experiment.model_validate_json(spec) for _, spec, _ in self.log.experiment_specs()]
        self._cache = (now, exps)
        return exps

    def get(self, name: str) -> Experiment:
        for e in self.all(fresh=True):
            if e.name == name:
                return e
        raise NotFound("experiment", name)

    def running(self) -> Experiment | None:
        for e in self.all():
            if e.status == "running":
                return e
        return None

    def _save(self, exp: Experiment) -> Experiment:
        self.log.save_experiment(exp.name, exp.model_dump_json(), time.time())
        self._cache = None
        return exp

    def start(self, spec: ExperimentCreate) -> Experiment:
        """Start a new experiment (one runs at a time: they would share users)."""
        if len(spec.variants) < 2:
            raise InvalidInput("variants: at least two")
        if spec.interleave and len(spec.variants) != 2:
            raise InvalidInput("variants: interleaving compares exactly two")
        for v, vs in spec.variants.items():
            if not _NAME.match(v) or v == INTERLEAVED:
                raise InvalidInput(f"variants: bad variant name {v!r}")
            self.override(spec.name, v, vs)  # a tuning file that cannot be read fails now, not per search
        split = normalise_split(spec.split, len(spec.variants))
        with self._lock:
            exps = self.all(fresh=True)
            if any(e.name == spec.name for e in exps):
                raise InvalidInput(f"name: experiment {spec.name!r} exists (names are never reused: its events "
                                   "stay attributed to it)")
            run = next((e for e in exps if e.status == "running"), None)
            if run is not None:
                raise InvalidInput(f"experiment {run.name!r} is running; stop it first (one at a time)")
            now = time.time()
            return self._save(Experiment(name=spec.name, variants=spec.variants, split=split,
                                         interleave=spec.interleave, created=now,
                                         history=[{"ts": now, "split": split}]))

    def set_split(self, name: str, split: Sequence[float]) -> Experiment:
        """Change the split of a running experiment (a staged rollout: 95/5, then 90/10 ...)."""
        with self._lock:
            exp = self.get(name)
            if exp.status != "running":
                raise InvalidInput(f"experiment {name!r} is stopped")
            if exp.interleave:
                raise InvalidInput("split: an interleaved experiment shows both variants in every search")
            new = normalise_split(split, len(exp.variants))
            exp = exp.model_copy(update={"split": new, "history": [*exp.history, {"ts": time.time(), "split": new}]})
            return self._save(exp)

    def stop(self, name: str) -> Experiment:
        with self._lock:
            exp = self.get(name)
            if exp.status == "stopped":
                return exp
            return self._save(exp.model_copy(update={"status": "stopped", "stopped": time.time()}))

    def status(self, name: str, *, alpha: float = ALPHA, min_units: int = MIN_UNITS) -> ExperimentReport:
        exp = self.get(name)
        units = self.log.experiment_units(name, exp.created - 1.0)
        clicks = self.log.interleaved_clicks(name, exp.created - 1.0) if exp.interleave else ()
        return analyse(exp, units, clicks, alpha=alpha, min_units=min_units)

    # -- serving
    def override(self, exp_name: str, variant: str, vs: VariantSettings) -> variants.RankingOverride:
        key = (exp_name, variant, vs.model_dump_json())
        got = self._overrides.get(key)
        if got is None:
            cal: Calibration | None = None
            if vs.calibration == "floor":
                cal = floor(f"experiment {exp_name}: variant {variant}: calibration=floor")
            elif vs.fusion_weights is not None:
                cal = Calibration(text_weights=dict(vs.fusion_weights), source=f"experiment {exp_name}: {variant}",
                                  accepted=True)
            elif vs.tuning is not None:
                p = Path(vs.tuning)
                if not p.is_absolute() and self.data_dir is not None:
                    p = self.data_dir / p
                try:
                    cal = Calibration.from_json(json.loads(p.read_text()))
                except (OSError, ValueError, TypeError, AttributeError) as e:
                    raise InvalidInput(f"variants.{variant}.tuning: {p} unusable: {e}") from e
                cal.source = f"experiment {exp_name}: {variant}: {p.name}"
            got = variants.RankingOverride(experiment=exp_name, variant=variant, calibration=cal,
                                           learn_weight=vs.learn_weight, rules=vs.rules)
            self._overrides[key] = got
        return got

    def assign(self, req: SearchRequest) -> Assignment | None:
        """The running experiment's variant for this search (None: none runs, or no user/session)."""
        exp = self.running()
        if exp is None:
            return None
        unit = unit_of(req)
        if unit is None:
            return None
        names = list(exp.variants)
        if exp.interleave:
            return Assignment(exp, INTERLEAVED, unit)
        return Assignment(exp, names[pick(exp.split, point(exp.name, unit))], unit)

    def search(self, req: SearchRequest, run: Callable[[SearchRequest], SearchResponse]
               ) -> tuple[SearchResponse, Assignment | None]:
        """``run(req)`` ranked as the search's variant wants (as configured when it is in none)."""
        a = self.assign(req)
        if a is None:
            return run(req), None
        exp = a.experiment
        if not exp.interleave:
            with variants.ranking(self.override(exp.name, a.variant, exp.variants[a.variant])):
                resp = run(req)
            resp.variant = a.variant
            return resp, a
        (na, va), (nb, vb) = exp.variants.items()
        with variants.ranking(self.override(exp.name, na, va)):
            ra = run(req)
        with variants.ranking(self.override(exp.name, nb, vb)):
            rb = run(req.model_copy(update={"session": None}))  # the session's turn is taken once
        rng = random.Random(f"{exp.name}\x00{a.unit}\x00{req.text}\x00{time.time_ns()}")
        hits = {h.id: h for h in (*rb.results, *ra.results)}
        merged, teams = team_draft([h.id for h in ra.results], [h.id for h in rb.results], req.k, rng, (na, nb))
        ra.results = [hits[p] for p in merged]
        ra.variant = INTERLEAVED
        a.teams = teams
        return ra, a

    def after_log(self, a: Assignment | None, resp: SearchResponse) -> None:
        """Keep an interleaved search's teams under its query_id (once it is logged)."""
        if a is not None and a.teams is not None and resp.query_id:
            self.log.log_teams(resp.query_id, a.experiment.name, json.dumps(a.teams, ensure_ascii=False))
