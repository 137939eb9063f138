"""A/B experiments on ranking: variants, sticky assignment, staged rollout, and the verdict.

- An experiment names two or more **variants**, each a ranking configuration
  (:class:`VariantSettings`: ``calibration=floor|auto``, a ``tuning`` file, ``fusion_weights``,
  ``learn_weight``, a merchandising ``rules`` tag), and a **split** in percent. The first variant
  is the control. Experiments live in the event log's database (vitrine/feedback/eventlog.py: SQLite
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
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vitrine.errors import InvalidInput, NotFound, StorageError
from vitrine.search import variants
from vitrine.search.calibration import Calibration, floor
from vitrine.search.models import SearchRequest, SearchResponse
from vitrine.experiments.models import (
    BUCKETS,
    CACHE_TTL_S,
    Experiment,
    ExperimentCreate,
    ExperimentReport,
    INTERLEAVED,
    NAME_PATTERN,
    VariantSettings,
    normalise_split,
)
from vitrine.experiments.stats import analyse

log = logging.getLogger(__name__)


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


def bucket_counts(split: Sequence[float], n: int = BUCKETS) -> list[int]:
    """Buckets per variant for a split (percent), by largest remainder: they sum to ``n``."""
    total = float(sum(split))
    raw = [n * s / total for s in split]
    counts = [int(r) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: (-(raw[i] - counts[i]), i))[:n - sum(counts)]:
        counts[i] += 1
    return counts


def first_buckets(split: Sequence[float], n: int = BUCKETS) -> list[int]:
    """The buckets of a new experiment: consecutive ranges in variant order."""
    out: list[int] = []
    for i, c in enumerate(bucket_counts(split, n)):
        out += [i] * c
    return out


def rebucket(buckets: Sequence[int], split: Sequence[float]) -> list[int]:
    """``buckets`` moved to a new split: each variant that shrinks gives up its highest buckets;
    the freed ones go, lowest first, to the variants that grow, in variant order. A variant that
    keeps or grows its share keeps every bucket it had, so none of its shoppers move out (a
    staged rollout with any number of variants)."""
    want = bucket_counts(split, len(buckets))
    out = list(buckets)
    have = [0] * len(want)
    for b in out:
        have[b] += 1
    freed: list[int] = []
    for i in range(len(want)):
        extra = have[i] - want[i]
        if extra > 0:
            mine = [j for j, b in enumerate(out) if b == i]
            freed += mine[-extra:]
    freed.sort()
    k = 0
    for i in range(len(want)):
        for _ in range(max(0, want[i] - have[i])):
            out[freed[k]] = i
            k += 1
    return out


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
        try:
            specs = self.log.experiment_specs()
        except StorageError as e:  # the shared store is down: searches go on with what was read last
            if fresh:
                raise
            log.debug("experiments unreadable (%s): the ones held serve", e)
            return cached[1] if cached is not None else []
        exps = [Experiment.model_validate_json(spec) for _, spec, _ in specs]
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
            if not NAME_PATTERN.match(v) or v == INTERLEAVED:
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
                                         interleave=spec.interleave, created=now, alpha=spec.alpha,
                                         min_units=spec.min_units,
                                         buckets=None if spec.interleave else first_buckets(split),
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
            buckets = rebucket(exp.buckets if exp.buckets is not None else first_buckets(exp.split), new)
            exp = exp.model_copy(update={"split": new, "buckets": buckets,
                                         "history": [*exp.history, {"ts": time.time(), "split": new}]})
            return self._save(exp)

    def stop(self, name: str) -> Experiment:
        with self._lock:
            exp = self.get(name)
            if exp.status == "stopped":
                return exp
            return self._save(exp.model_copy(update={"status": "stopped", "stopped": time.time()}))

    def status(self, name: str, *, alpha: float | None = None, min_units: int | None = None) -> ExperimentReport:
        """The report; ``alpha`` and ``min_units``: the experiment's own unless given."""
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
        u = point(exp.name, unit)
        if exp.buckets:
            return Assignment(exp, names[exp.buckets[min(int(u * len(exp.buckets)), len(exp.buckets) - 1)]], unit)
        return Assignment(exp, names[pick(exp.split, u)], unit)  # stored before buckets

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
        # the session's turn is taken once (by A's run); B ranks the very query the session made of
        # it (its standing words and filters), so both teams rank with the same session state
        b_req = req.model_copy(update={"session": None, "session_drop": None})
        if req.session and ra.session:
            b_req = b_req.model_copy(update={"text": ra.session.get("text") or req.text,
                                             "filters": ra.session.get("filters") or None, "offset": req.offset})
        with variants.ranking(self.override(exp.name, nb, vb)):
            rb = run(SearchRequest.model_validate(b_req.model_dump(exclude_none=True)))
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
