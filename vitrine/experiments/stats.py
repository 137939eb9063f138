"""The statistics of a ranking experiment's report (docs/experiments.md): ratio metrics over units
with 95% intervals by the delta method, the verdict against the control (Bonferroni over the
verdict metrics), and team-draft interleaving's sign test.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field


from vitrine.experiments.models import (
    ALPHA,
    Comparison,
    Experiment,
    ExperimentReport,
    INTERLEAVED,
    InterleavingReport,
    Interval,
    METRICS,
    MIN_UNITS,
    VERDICT_METRICS,
    VariantReport,
)


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
