"""Ranking experiments as the API and `vitrine experiment` take them (docs/experiments.md): an
experiment, its variants (a variant from the command line: :func:`parse_variant`), its traffic
split, and the report's shape. Running experiments is vitrine/experiments/runner.py; the
statistics, vitrine/experiments/stats.py.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from vitrine.errors import InvalidInput
from vitrine.settings import DEFAULT_FUSION_WEIGHTS


CACHE_TTL_S = 1.0
ALPHA = 0.05
MIN_UNITS = 20  # no verdict before each variant has this many users (or sessions)
BUCKETS = 1000  # assignment buckets (0.1% of traffic each): a split change moves whole buckets
SRM_ALPHA = 0.001  # a sample-ratio mismatch is flagged below this chi-square p-value (the field's usual bar)
METRICS = ("ctr", "add_to_cart_rate", "conversion", "mrr")
VERDICT_METRICS = ("ctr", "conversion", "mrr")
INTERLEAVED = "interleaved"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


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
    alpha: float = Field(ALPHA, gt=0, lt=0.5, description=(
        "False-positive rate the verdict keeps over every look, variant and verdict metric together"))
    min_units: int = Field(MIN_UNITS, ge=2, le=10_000_000, description=(
        "No verdict before each variant has this many users (or sessions)"))

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_PATTERN.match(v):
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
    alpha: float = ALPHA
    min_units: int = MIN_UNITS
    buckets: list[int] | None = Field(None, description=(
        "The variant (its index) owning each of the 1,000 assignment buckets; a split change moves "
        "buckets only out of variants that shrink, so no variant that keeps or grows its share loses shoppers"))
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
    p_value: float | None = Field(description=(
        "Always-valid p-value (mSPRT, a normal mixture): valid however often the report is read"))
    p_adjusted: float | None = Field(None, description=(
        "p_value after Holm's correction over every variant x verdict metric (CTR, conversion, MRR)"))
    p_fixed_horizon: float | None = Field(None, description=(
        "The classical two-sided z-test p-value, for reference only: valid for one look at a horizon fixed in advance"))
    significant: bool = Field(description="p_adjusted below alpha, on a verdict metric, with min_units in every variant")


class SampleRatio(BaseModel):
    """Sample-ratio mismatch check: units per variant against the split (chi-square)."""

    observed: dict[str, int]
    expected: dict[str, float]
    p_value: float | None
    mismatch: bool = Field(description="p below 0.001: the assignment or logging is broken; no verdict is given")


class InterleavingReport(BaseModel):
    searches: int = Field(description="Interleaved searches with at least one click")
    wins: dict[str, int] = Field(description="Searches whose clicks went more to this team")
    ties: int
    preference: float | None = Field(description="Share of decided searches the second variant won (0.5: none)")
    p_value: float | None = Field(description="Two-sided sign test (exact binomial) of the wins: one look only")
    p_always_valid: float | None = Field(None, description="Always-valid p-value (mSPRT): the verdict's")


class ExperimentReport(BaseModel):
    experiment: Experiment
    method: str = Field(description="How the intervals and tests are computed")
    alpha: float
    variants: list[VariantReport]
    comparisons: list[Comparison]
    interleaving: InterleavingReport | None = None
    sample_ratio: SampleRatio | None = Field(None, description="The SRM check (A/B experiments)")
    verdict: str
    winner: str | None


# -- parsing a variant from the command line ----------------------------------------------------
def _split_top(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside braces, brackets and quotes."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    quote: str | None = None
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
