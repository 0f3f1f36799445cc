"""The epsilon explorer: expected error of a release spec against its budget and group size.

There is no correct epsilon without a query, a data distribution and a threat model. The
explorer makes the trade-off visible *before* anything is released: for a pre-registered spec
it re-plans the release at other budgets (``dataclasses.replace(spec, charge=...)`` then
:func:`dp_spark.engine.plan_for`, so the sensitivities, the budget split, the grid and the
noise scales are exactly those the engine would use) and turns the noise distributions into
expected absolute and relative errors for an ASSUMED group size. Any spec: every statistic
of it, whichever form it was written in.

Privacy contract: reads no data. Every input is public: the spec, a list of assumed group
sizes, a list of budgets and an assumed mean value. Nothing here is charged, so it may be run
as often as wanted. Its outputs are statements about the noise only: the bias from clipping
and truncation depends on the data and is measured by :mod:`dp_spark.evaluation.utility` on
evaluation data.

Group size. The true value of the cell's count: rows (orders) for ``count``, ``sum`` and
``mean`` statistics, distinct units (users) for ``distinct_units``. A sum's true value is
``group_size * assumed_mean``; a mean's and a quantile's ``assumed_mean`` (default: the
statistic's own public ``assumed_mean`` when it declares one, else the midpoint of its clamp
bounds, the value the normalised sum is centred on); a variance's and a stddev's 0 (every row
at the assumed mean: the statement is about the noise).

Errors. For a noised statistic with noise X (grid units 2^k):

* ``expected_abs_error`` = E|X| * 2^k (exact for the discrete Laplace, sqrt(2/pi) * sd for the
  discrete Gaussian, as in the release table);
* ``halfwidth`` = the release's interval half-width at the spec's confidence: the smallest h
  with P(|X| <= h) >= confidence (:mod:`dp_spark.mechanisms.accuracy`);
* every statistic: exactly what the engine publishes for a cell whose noisy components are
  their expected values (the noisy count is the group size, the noisy normalised sum group
  size x (assumed mean - midpoint), ...): the statistic kind's own post-processing
  (``StatisticKind.finish``; a mean's :func:`dp_spark.mechanisms.mean.mean_cell_accuracy`).
  ``halfwidth`` is the larger side of the published interval (for a mean the large-count
  interval when it applies, else the union bound), ``expected_abs_error`` and
  ``noise_stddev`` the published ones. Tested against the engine's ``QueryPlan.noise`` with
  zero noise, for every statistic kind.

Relative errors divide by |true value|; they are ``inf`` when the true value is 0.
Nothing here imports pyspark.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Any, Iterable, Optional, Sequence, Union

from dp_spark.core.budget import Budget, PureDP, ZCDP, to_fraction
from dp_spark.config import ReleaseSpec
from dp_spark.errors import ConfigError

__all__ = [
    "explore",
    "smallest_budget",
    "value_range",
    "plan_at",
    "budget_of",
    "format_table",
    "EXPLORER_COLUMNS",
]

EXPLORER_COLUMNS = (
    "release", "statistic", "measure", "budget", "group_size", "true_value", "mechanism",
    "noise_stddev", "expected_abs_error", "expected_rel_error", "confidence", "ci_low", "ci_high",
    "clipped", "halfwidth", "rel_halfwidth", "mean_split",
)

Number = Union[int, float, str, Fraction]


# --------------------------------------------------------------------------------------
# Budgets and plans
# --------------------------------------------------------------------------------------
def budget_of(spec: ReleaseSpec, value: Number) -> Union[PureDP, ZCDP]:
    """A budget in the spec's measure: epsilon for pure_dp specs, rho for zcdp specs."""
    v = to_fraction(value, "budget")
    if isinstance(spec.charge, PureDP):
        return PureDP(v)
    if isinstance(spec.charge, ZCDP):
        return ZCDP(v)
    raise ConfigError("the explorer handles pure_dp and zcdp release specs")


def _budget_value(b: Budget) -> Fraction:
    if isinstance(b, PureDP):
        return b.epsilon
    if isinstance(b, ZCDP):
        return b.rho
    raise ConfigError("the explorer handles pure_dp and zcdp release specs")


def plan_at(spec: ReleaseSpec, budget: Number | PureDP | ZCDP):
    """The engine's plan of ``spec`` with its charge replaced by ``budget`` (no data read)."""
    from dp_spark.engine import plan_for

    charge = budget if isinstance(budget, (PureDP, ZCDP)) else budget_of(spec, budget)
    if type(charge) is not type(spec.charge):
        raise ConfigError("the explored budget must be in the spec's measure")
    if spec.private_key_sets:  # the selection's delta stays with the charge
        charge = type(charge)(_budget_value(charge), spec.charge.delta_part)
    return plan_for(dataclasses.replace(spec, charge=charge))


def _alpha(confidence: Optional[Number], spec: ReleaseSpec) -> Fraction:
    conf = spec.confidence if confidence is None else to_fraction(confidence, "confidence")
    if not (0 < conf < 1):
        raise ConfigError("confidence must be in (0, 1)")
    return 1 - conf


def _assumed_means(spec: ReleaseSpec, assumed_mean: Optional[Number]) -> dict[str, Fraction]:
    """The assumed value per row of each statistic with a value column: the argument, else the
    statistic's own public ``assumed_mean``, else the midpoint of its clamp bounds."""
    given = None if assumed_mean is None else to_fraction(assumed_mean, "assumed_mean")
    out = {}
    for s in spec.statistics:
        if s.clamp is not None:
            own = s.option("assumed_mean")
            out[s.name] = given if given is not None else (own if own is not None else s.clamp.midpoint)
    return out


def _check_group_size(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError("group sizes must be integers >= 1")
    return n


# --------------------------------------------------------------------------------------
# Accuracy of one planned statistic
# --------------------------------------------------------------------------------------
def _expected_component(comp, n: int, mean: Optional[Fraction]):
    """A component's expected value in a cell of ``n`` rows (units), every value ``mean``
    (clamped and on the value grid, as the engine aggregates it): real units."""
    if comp.kind in ("rows", "units"):
        return Fraction(n)
    if mean is None:  # _assumed_means gives every valued statistic one; None is a bug
        raise ConfigError(f"component {comp.kind!r} needs an assumed mean")
    c = comp.clamp
    k = c.grid_exponent
    v = min(max(Fraction(mean), c.lower), c.upper)
    v = Fraction(round(v * Fraction(2) ** -k)) * Fraction(2) ** k
    if comp.kind == "sum":
        return n * v
    if comp.kind == "nsum":
        return n * (v - c.midpoint)
    if comp.kind == "nsumsq":
        return n * ((v - c.midpoint) ** 2 - c.half_width ** 2 / 2)
    if comp.kind == "hist":
        span = c.upper - c.lower
        j = min(max(int((v - c.lower) / span * comp.bins), 0), comp.bins - 1) if span > 0 else 0
        return [Fraction(n) if i == j else Fraction(0) for i in range(comp.bins)]
    raise ConfigError(f"unknown component kind {comp.kind!r}")


def _true_value(stat, n: int, mean: Optional[Fraction]) -> float:
    if stat.kind in ("count", "distinct_units"):
        return float(n)
    if stat.kind == "sum":
        if mean is None:  # _assumed_means gives every valued statistic one; None is a bug
            raise ConfigError(f"statistic {stat.name!r} needs an assumed mean")
        return float(n * mean)
    if stat.kind in ("variance", "stddev"):
        return 0.0
    return float(min(max(mean, stat.clamp.lower), stat.clamp.upper))


def _rows_for(spec: ReleaseSpec, plan, budget: Budget, n: int, means: dict[str, Fraction],
              alpha: Fraction, only: Optional[str] = None) -> list[dict[str, Any]]:
    """The rows of ``spec``'s statistics at ``budget`` for a group of ``n`` (``only``: the
    row of that statistic alone; a quantile's exact interval costs about a second per budget,
    which a search for another statistic's budget need not pay)."""
    from dp_spark.statistics.base import kind_of

    measure = budget.MEASURE
    common = {"release": spec.name, "measure": measure, "budget": float(_budget_value(budget)),
              "budget_exact": str(_budget_value(budget)), "group_size": n,
              "confidence": float(1 - alpha),
              "mean_split": None if plan.mean_split is None else float(plan.mean_split)}
    rows: list[dict[str, Any]] = []
    if spec.stream is not None:
        return _stream_rows(spec, plan, n, means, common)
    for stat, comps in zip(spec.statistics, plan.stat_components):
        if only is not None and stat.name != only:
            continue
        mean = means.get(stat.name)
        noisy = {c: _expected_component(c, n, mean) for c in comps}
        out = kind_of(stat.kind).finish(stat, noisy, {c: plan.plan_of(c) for c in comps}, alpha)
        v = float(out["value"])
        low, high, clipped = _within_range(stat, float(out["ci_low"]), float(out["ci_high"]))
        h = max(high - v, v - low)
        true = _true_value(stat, n, mean)
        denom = abs(true)
        abs_err = float(out["expected_abs_error"])
        rows.append({**common, "statistic": stat.name, "kind": stat.kind, "true_value": true,
                     "assumed_mean": None if mean is None else float(mean), "mechanism": out["mechanism"],
                     "noise_stddev": float(out["noise_stddev"]), "expected_abs_error": abs_err,
                     "expected_rel_error": abs_err / denom if denom > 0 else math.inf,
                     "ci_low": low, "ci_high": high, "clipped": clipped,
                     "halfwidth": h, "rel_halfwidth": h / denom if denom > 0 else math.inf})
    return rows


def _stream_rows(spec: ReleaseSpec, plan, n: int, means: dict[str, Fraction],
                 common: dict[str, Any]) -> list[dict[str, Any]]:
    """A stream's rows: the running total of ``n`` rows at the LAST day of its horizon (the
    point with the most nodes among the days shown; :mod:`dp_spark.mechanisms.tree`)."""
    from dp_spark.mechanisms import tree

    rows = []
    for stat, comps in zip(spec.statistics, plan.query.stat_components):
        part = plan.part_of(stat, comps)
        cal, unit = part.calibration, float(part.grid_unit)
        mean = means.get(stat.name)
        true = _true_value(stat, n, mean)
        h = tree.point_halfwidth(plan.horizon, cal, spec.confidence) * unit
        low, high, clipped = _within_range(stat, true - h, true + h)
        abs_err = tree.point_expected_abs(plan.horizon, cal) * unit
        denom = abs(true)
        rows.append({**common, "statistic": stat.name, "kind": stat.kind, "true_value": true,
                     "assumed_mean": None if mean is None else float(mean), "mechanism": cal.mechanism,
                     "noise_stddev": tree.point_variance(plan.horizon, cal) ** 0.5 * unit,
                     "expected_abs_error": abs_err, "expected_rel_error": abs_err / denom if denom > 0 else math.inf,
                     "ci_low": low, "ci_high": high, "clipped": clipped, "halfwidth": max(high - true, true - low),
                     "rel_halfwidth": max(high - true, true - low) / denom if denom > 0 else math.inf})
    return rows


def value_range(stat) -> tuple[float, float]:
    """The values a statistic can take whatever the data: a mean's and a quantile's clamp
    range [L, U], a standard deviation's [0, (U - L) / 2] and a variance's [0, (U - L)^2 / 4],
    a count's [0, inf); a sum's is unbounded here (its row count is not public)."""
    if stat.kind in ("count", "distinct_units"):
        return 0.0, math.inf
    if stat.clamp is None or stat.kind == "sum":
        return -math.inf, math.inf
    lo, hi = float(stat.clamp.lower), float(stat.clamp.upper)
    if stat.kind == "stddev":
        return 0.0, (hi - lo) / 2
    if stat.kind == "variance":
        return 0.0, (hi - lo) ** 2 / 4
    return lo, hi


def _within_range(stat, low: float, high: float) -> tuple[float, float, bool]:
    """The interval cut to the statistic's range (:func:`value_range`, as the engine publishes
    it), and whether it reaches a bound of that range (``clipped``): then it is not the
    value +- a half-width, and the noise, not the data, decides where it ends."""
    lo, hi = value_range(stat)
    low, high = max(low, lo), min(high, hi)
    return low, high, (math.isfinite(lo) and low <= lo) or (math.isfinite(hi) and high >= hi)


# --------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------
def explore(spec: ReleaseSpec, group_sizes: Sequence[int], budgets: Sequence[Number], *,
            assumed_mean: Optional[Number] = None, confidence: Optional[Number] = None) -> list[dict[str, Any]]:
    """Expected error of each statistic of ``spec`` for every (budget, group size) pair.

    ``budgets`` are epsilons for a pure_dp spec and rhos for a zcdp spec. Returns one row
    dict per (budget, group size, statistic) with the columns of :data:`EXPLORER_COLUMNS`
    (plus ``budget_exact`` and ``assumed_mean``). Reads no data and charges nothing.
    """
    sizes = [_check_group_size(n) for n in group_sizes]
    if not sizes or not budgets:
        raise ConfigError("give at least one group size and one budget")
    alpha = _alpha(confidence, spec)
    means = _assumed_means(spec, assumed_mean)
    rows: list[dict[str, Any]] = []
    for b in budgets:
        budget = budget_of(spec, b)
        plan = plan_at(spec, budget)
        for n in sizes:
            rows.extend(_rows_for(spec, plan, budget, n, means, alpha))
    return rows


def headline_statistic(spec: ReleaseSpec) -> str:
    """The statistic a person reads: the mean of a single-metric mean release (which publishes
    its count too), else the spec's first statistic."""
    return "mean" if spec.metric == "mean" else spec.statistics[0].name


def _rel_halfwidth_at(spec: ReleaseSpec, budget: Union[PureDP, ZCDP], n: int, means: dict[str, Fraction],
                      alpha: Fraction, stat: str) -> float:
    rows = _rows_for(spec, plan_at(spec, budget), budget, n, means, alpha, only=stat)
    return next(r["rel_halfwidth"] for r in rows if r["statistic"] == stat)


def smallest_budget(spec: ReleaseSpec, group_size: int, target_relative_error: Number,
                    confidence: Optional[Number] = None, *, assumed_mean: Optional[Number] = None,
                    rel_tol: float = 1e-6, statistic: Optional[str] = None) -> Budget:
    """The smallest budget (spec's measure) whose interval meets the error target.

    "Meets" means: with probability at least ``confidence`` (default: the spec's) the noise
    error of ``statistic`` (default: the headline statistic, the mean for a mean release) is at most
    ``target_relative_error * |true value|`` for a group of ``group_size``; i.e. the
    release's interval half-width at that confidence is within the target.

    Counts, distinct counts and sums use the calibration inverses
    (:func:`~dp_spark.mechanisms.calibration.min_epsilon_for_error`,
    :func:`~dp_spark.mechanisms.calibration.min_rho_for_error`) with the sensitivity the engine
    derives from the enforced bounds as the starting bracket, then confirm the answer on the
    engine's own plan (its scale rounding can only add noise; a bisection to ``rel_tol``
    on the plan settles any difference). A mean has no closed-form inverse (two statistics, a
    floored ratio, a split): it is found by bisection on the budget, to ``rel_tol``.
    The answer is rounded *up* to a short decimal: it meets the target, and no budget
    smaller by more than about ``2 * rel_tol`` (relative) does.
    """
    n = _check_group_size(group_size)
    target = to_fraction(target_relative_error, "target_relative_error")
    if target <= 0:
        raise ConfigError("the error target must be > 0")
    alpha = _alpha(confidence, spec)
    means = _assumed_means(spec, assumed_mean)
    name = statistic or headline_statistic(spec)
    stat = next((s for s in spec.statistics if s.name == name), None)
    if stat is None:
        raise ConfigError(f"no statistic '{name}' in {spec.name} (its statistics: "
                          f"{', '.join(s.name for s in spec.statistics)})")
    true = _true_value(stat, n, means.get(name))
    if true == 0:
        raise ConfigError("a relative error target needs a non-zero assumed true value")
    target_f = float(target)

    def meets(b: Fraction) -> bool:
        return _rel_halfwidth_at(spec, budget_of(spec, b), n, means, alpha, name) <= target_f

    start = (_calibrated_budget(spec, Fraction(abs(true)) * target, alpha)
             if spec.metric in ("count", "distinct_units", "sum") and name == headline_statistic(spec) else None)
    # bracket: meets(high) and not meets(low); the inverse makes the bracket tight at once
    high = start if start is not None and start > 0 else Fraction(1, 100)
    while not meets(high):
        high *= 2
        if high > 10**9:
            raise ConfigError("no budget below 1e9 meets this error target (is the target below "
                              "the grid resolution?)")
    low = high * (1 - Fraction(10 * rel_tol).limit_denominator(10**12)) if start is not None else high / 2
    while meets(low):
        high, low = low, low / 2
        if low < Fraction(1, 10**12):
            low = Fraction(0)
            break
    while high - low > high * Fraction(rel_tol).limit_denominator(10**12):
        mid = (low + high) / 2
        if meets(mid):
            high = mid
        else:
            low = mid
    answer = _round_up(high, rel_tol)
    return budget_of(spec, answer if meets(answer) else high)


def _round_up(x: Fraction, rel_tol: float) -> Fraction:
    """x rounded up to a decimal with about -log10(rel_tol) significant digits."""
    if x <= 0:
        return x
    digits = max(1, int(math.ceil(-math.log10(rel_tol))))
    e = math.floor(math.log10(float(x))) - digits + 1
    step = Fraction(10) ** e
    return math.ceil(x / step) * step


def _calibrated_budget(spec: ReleaseSpec, target_abs: Fraction, alpha: Fraction) -> Optional[Fraction]:
    """The calibration inverse for a single-metric count, distinct count or sum (a starting
    bracket only: the answer is confirmed on the plan), in the spec's measure."""
    from dp_spark.mechanisms import calibration
    from dp_spark.core.units import Aggregate, sensitivity

    agg = {"count": Aggregate.ROW_COUNT, "distinct_units": Aggregate.DISTINCT_UNITS,
           "sum": Aggregate.SUM}[spec.metric]
    k = 0
    if spec.metric == "sum":
        if spec.value is None:  # the config gives every sum release its value column; None is a bug
            raise ConfigError("a sum release needs a value column")
        k = spec.value.grid_exponent
    sens = sensitivity(agg, spec.bounds, spec.neighbouring)
    confidence = 1 - alpha
    if isinstance(spec.charge, PureDP):
        b = calibration.min_epsilon_for_error(target_abs, confidence, sens.l1, grid_exponent=k)
    else:
        b = calibration.min_rho_for_error(target_abs, confidence, sens.l2_squared, grid_exponent=k)
    if b is None:
        return None
    b = b.epsilon if isinstance(b, PureDP) else (b.rho if isinstance(b, ZCDP) else to_fraction(b, "budget"))
    return _round_up(Fraction(b), 1e-7)


# --------------------------------------------------------------------------------------
# Presentation
# --------------------------------------------------------------------------------------
def format_table(rows: Iterable[dict[str, Any]], *, statistic: Optional[str] = None) -> str:
    """A fixed-width text table of explorer rows (one line per budget and group size): the
    interval at the spec's confidence as it is published (cut to the statistic's range) and
    the largest relative error within it; an interval that reaches that range is marked ``*``
    (it is not the value +- a half-width), with a footnote."""
    rows = [r for r in rows if statistic is None or r["statistic"] == statistic]
    if not rows:
        return "(no rows)"
    budget_name = "epsilon" if rows[0]["measure"] == "pure_dp" else "rho"
    conf = format(rows[0]["confidence"], ".0%")
    head = (f"{'statistic':>14} {budget_name:>9} {'group':>8} {'true':>12} {'E|err|':>11} "
            f"{'rel E|err|':>10} {conf + ' interval':>24} {'max rel err':>12}")
    lines = [head, "-" * len(head)]

    def pct(x: float) -> str:
        return "inf" if not math.isfinite(x) else f"{x:.2%}"

    clipped = False
    for r in rows:
        low, high = r.get("ci_low"), r.get("ci_high")
        if low is None or high is None:  # rows from an older explorer: value +- half-width
            v = r["true_value"]
            low, high = v - r["halfwidth"], v + r["halfwidth"]
        mark = "*" if r.get("clipped") else " "
        clipped = clipped or bool(r.get("clipped"))
        interval = f"[{low:.4g}, {high:.4g}]{mark}"
        lines.append(
            f"{r['statistic']:>14} {r['budget']:>9.4g} {r['group_size']:>8,} {r['true_value']:>12.5g} "
            f"{r['expected_abs_error']:>11.4g} {pct(r['expected_rel_error']):>10} {interval:>24} "
            f"{pct(r['rel_halfwidth']):>12}")
    if clipped:
        lines.append("* the interval reaches the statistic's range (a mean's clamp bounds, 0 for a count) and is "
                     "cut there: it is not the value +- a half-width; max rel err is its farther end")
    return "\n".join(lines)
