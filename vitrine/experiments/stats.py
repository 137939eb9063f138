"""The statistics of a ranking experiment's report (docs/experiments.md), on scipy.stats: ratio
metrics over units with 95% intervals by the delta method; the verdict against the control by an
always-valid mixture SPRT (the report may be read at any time), Holm-corrected over every variant
and verdict metric; a sample-ratio-mismatch check (chi-square) that withholds the verdict; and
team-draft interleaving's always-valid test (with the exact sign test for reference).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from scipy import stats

from vitrine.experiments.models import (
    Comparison,
    Experiment,
    ExperimentReport,
    INTERLEAVED,
    InterleavingReport,
    Interval,
    METRICS,
    SRM_ALPHA,
    SampleRatio,
    VERDICT_METRICS,
    VariantReport,
)


# -- statistics ------------------------------------------------------------------------------------
Z95 = float(stats.norm.isf(0.025))
MSPRT_TAU = 0.1  # the mixing spread of the effect, relative to the control's value (a 10% lift is typical)


def normal_p(z: float) -> float:
    """Two-sided p-value of a standard normal statistic."""
    return float(2.0 * stats.norm.sf(abs(z)))


def z_for(alpha: float) -> float:
    """The two-sided critical value of a standard normal at ``alpha``."""
    return float(stats.norm.isf(alpha / 2.0))


def msprt_p(d: float, se: float, tau: float) -> float:
    """Always-valid p-value of a difference ``d`` with standard error ``se`` (mixture sequential
    probability ratio test, normal mixture N(0, tau^2) over the effect: Johari, Pekelis and Walsh,
    "Always valid inference", 2017). 1 / the mixture likelihood ratio is a p-value at every look
    at once (Ville's inequality): reading the report after every search keeps the false-positive
    rate at most alpha, where a fixed-horizon z-test recomputed at each look does not."""
    v, t2 = se * se, tau * tau
    if v <= 0 or t2 <= 0:
        return 1.0 if d == 0 else 0.0
    log_lr = 0.5 * math.log(v / (v + t2)) + d * d * t2 / (2.0 * v * (v + t2))
    return float(min(1.0, math.exp(-log_lr))) if log_lr < 700 else 0.0


def holm(ps: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error at most alpha over all of ``ps``)."""
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    out = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        out[i] = running
    return out


def sample_ratio(observed: Sequence[int], split: Sequence[float]) -> float | None:
    """Chi-square p-value of units per variant against the split (None: nothing to test)."""
    total = sum(observed)
    live = [(o, s) for o, s in zip(observed, split) if s > 0]
    if total == 0 or len(live) < 2 or sum(o for o, _ in live) != total:
        return None if total == 0 or len(live) < 2 else 0.0  # units in a variant given no share: broken
    share = sum(s for _, s in live)
    exp = [total * s / share for _, s in live]
    return float(stats.chisquare([o for o, _ in live], exp).pvalue)


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
    return float(stats.binomtest(wins, n, 0.5).pvalue)


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
            alpha: float | None = None, min_units: int | None = None) -> ExperimentReport:
    """The report of ``exp`` from its per-unit rows (the store's ``experiment_units``) and, when
    interleaved, its clicked searches' teams (``interleaved_clicks``). ``alpha`` and ``min_units``:
    the experiment's own unless given."""
    alpha = exp.alpha if alpha is None else alpha
    min_units = exp.min_units if min_units is None else min_units
    names = list(exp.variants)
    by: dict[str, UnitRows] = {}
    for v, _unit, n, c, a, b, rr in units:
        u = by.setdefault(v, UnitRows())
        u.n.append(n)
        u.clicked.append(c)
        u.carted.append(a)
        u.bought.append(b)
        u.rr.append(rr)
    shown = [INTERLEAVED] if exp.interleave else names
    reports = []
    for i, v in enumerate(shown):
        u = by.get(v, UnitRows())
        share = 100.0 if exp.interleave else exp.split[i]
        reports.append(VariantReport(
            variant=v, share=share, units=len(u.n), searches=int(sum(u.n)), clicked=int(sum(u.clicked)),
            added_to_cart=int(sum(u.carted)), purchased=int(sum(u.bought)),
            **{m: _interval(*ratio_delta(u.metric(m), u.n)) for m in METRICS}))
    verdict, winner = "not significant", None
    if exp.interleave:
        inter = interleaving(names, clicks)
        decided = sum(inter.wins.values())
        if inter.p_always_valid is None or decided < min_units:
            verdict = f"not yet significant: {decided} decided searches (at least {min_units})"
        elif inter.p_always_valid < alpha:
            winner = max(inter.wins, key=lambda t: inter.wins[t])
            verdict = f"{winner} wins (interleaving: {inter.wins[winner]} of {decided} decided " \
                      f"searches, always-valid p={inter.p_always_valid:.3g})"
        return ExperimentReport(experiment=exp, method=METHOD_INTERLEAVE, alpha=alpha, variants=reports,
                                comparisons=[], interleaving=inter, verdict=verdict, winner=winner)
    srm = _srm(exp, names, by)
    control = names[0]
    cu = by.get(control, UnitRows())
    small = [v for v in names if len(by.get(v, UnitRows()).n) < min_units]
    comparisons: list[Comparison] = []
    diffs: dict[int, float] = {}
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
            fixed = normal_p(d / se) if se > 0 else (1.0 if d == 0 else 0.0)
            tau = MSPRT_TAU * max(abs(rc), 1e-9)
            diffs[len(comparisons)] = d
            comparisons.append(Comparison(variant=v, control=control, metric=m, difference=_interval(d, se),
                                          relative=round(d / rc, 6) if rc else None,
                                          p_value=round(msprt_p(d, se, tau), 6), p_fixed_horizon=round(fixed, 6),
                                          significant=False))
    family = [j for j, c in enumerate(comparisons) if c.metric in VERDICT_METRICS and c.p_value is not None]
    adjusted = holm([p if (p := comparisons[j].p_value) is not None else 1.0 for j in family])
    wins: dict[str, list[str]] = {}
    losses: dict[str, list[str]] = {}
    for j, pa in zip(family, adjusted):
        c = comparisons[j]
        c.p_adjusted = round(pa, 6)
        c.significant = not small and pa < alpha
        if c.significant:
            (wins if diffs[j] > 0 else losses).setdefault(c.variant, []).append(c.metric)
    if srm is not None and srm.mismatch:
        verdict = (f"no verdict: sample ratio mismatch (units {srm.observed} against the split, chi-square "
                   f"p={srm.p_value:.2g}): the assignment or the logging is broken")
    elif small:
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
                            sample_ratio=srm, verdict=verdict, winner=winner)


def _srm(exp: Experiment, names: Sequence[str], by: dict[str, UnitRows]) -> SampleRatio | None:
    """The SRM check against the split, while the split has not changed (after a staged rollout
    step, units were assigned under several splits and no one ratio is expected)."""
    if len(exp.history) > 1:
        return None
    observed = {v: len(by.get(v, UnitRows()).n) for v in names}
    total = sum(observed.values())
    p = sample_ratio(list(observed.values()), exp.split)
    expected = {v: round(total * s / 100.0, 3) for v, s in zip(names, exp.split)}
    return SampleRatio(observed=observed, expected=expected, p_value=None if p is None else float(f"{p:.6g}"),
                       mismatch=p is not None and p < SRM_ALPHA)


METHOD_AB = ("ratio metrics over units (users, else sessions); 95% intervals by the delta method over units; "
             "verdict: each variant vs the control on ctr, conversion and mrr by an always-valid mixture SPRT "
             "(readable at any time), Holm-corrected over every variant and those three metrics; "
             "no verdict under a sample ratio mismatch (chi-square p < 0.001)")
METHOD_INTERLEAVE = ("team-draft interleaving; a search's clicks are credited to the teams of the clicked products; "
                     "the team with more clicks wins the search; an always-valid mixture SPRT over decided "
                     "searches (and the exact sign test for reference)")


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
    p_av = None
    if decided:  # each decided search is +1 (second team) or -1: the mean under no preference is 0
        mean = (wins[names[1]] - wins[names[0]]) / decided
        p_av = round(msprt_p(mean, 1.0 / math.sqrt(decided), MSPRT_TAU), 6)
    return InterleavingReport(searches=len(per), wins=wins, ties=ties,
                              preference=round(wins[names[1]] / decided, 6) if decided else None,
                              p_value=sign_test(wins[names[1]], wins[names[0]]), p_always_valid=p_av)
