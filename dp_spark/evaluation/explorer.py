"""The epsilon explorer: expected error of a release spec against its budget and group size.

There is no correct epsilon without a query, a data distribution and a threat model. The
explorer makes the trade-off visible *before* anything is released: for a pre-registered spec
it re-plans the release at other budgets (``dataclasses.replace(spec, charge=...)`` then
:func:`dp_spark.engine.plan_release`, so the sensitivities, the budget split of a mean, the
grid and the noise scales are exactly those the engine would use) and turns the noise
distributions into expected absolute and relative errors for an ASSUMED group size.

Privacy contract: reads no data. Every input is public: the spec, a list of assumed group
sizes, a list of budgets and an assumed mean value. Nothing here is charged, so it may be run
as often as wanted. Its outputs are statements about the noise only: the bias from clipping
and truncation depends on the data and is measured by :mod:`dp_spark.evaluation.utility` on
evaluation data.

Group size. The true value of the cell's count: rows (orders) for ``count``, ``sum`` and
``mean`` releases, distinct units (users) for ``distinct_units``. A sum's true value is
``group_size * assumed_mean``; a mean's is ``assumed_mean`` (default: the spec's own public
``mean.assumed_mean`` when it declares one, else the midpoint of the clamp bounds, the value
the normalised sum is centred on).

Errors. For a noised statistic with noise X (grid units 2^k):

* ``expected_abs_error`` = E|X| * 2^k (exact for the discrete Laplace, sqrt(2/pi) * sd for the
  discrete Gaussian, as in the release table);
* ``halfwidth`` = the release's interval half-width at the spec's confidence: the smallest h
  with P(|X| <= h) >= confidence (:mod:`dp_spark.mechanisms.accuracy`);
* for a mean (noisy normalised sum over the noisy count, count floored): exactly what the
  engine publishes for a cell whose noisy count is the group size and whose noisy sum is
  group size x (assumed mean - midpoint), i.e. the expected noisy values. The engine and the
  explorer call the same :func:`dp_spark.mechanisms.mean.mean_cell_accuracy`: ``halfwidth``
  is the larger side of the published interval (the large-count interval when it applies,
  else the union bound), ``expected_abs_error`` the published one (both noises, first order),
  ``noise_stddev`` the published one (the sum's noise over the count). Tested against the
  engine's ``noise_cells`` with zero noise, for every statistic kind.

Relative errors divide by |true value|; they are ``inf`` when the true value is 0.
Nothing here imports pyspark.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Any, Iterable, Optional, Sequence, Union

from dp_spark.budget import Budget, PureDP, ZCDP, to_fraction
from dp_spark.config import ReleaseSpec
from dp_spark.errors import ConfigError

__all__ = [
    "explore",
    "smallest_budget",
    "plan_at",
    "budget_of",
    "format_table",
    "EXPLORER_COLUMNS",
]

EXPLORER_COLUMNS = (
    "release", "statistic", "measure", "budget", "group_size", "true_value", "mechanism",
    "noise_stddev", "expected_abs_error", "expected_rel_error", "confidence", "halfwidth",
    "rel_halfwidth", "mean_split",
)

Number = Union[int, float, str, Fraction]


# --------------------------------------------------------------------------------------
# Budgets and plans
# --------------------------------------------------------------------------------------
def budget_of(spec: ReleaseSpec, value: Number) -> Budget:
    """A budget in the spec's measure: epsilon for pure_dp specs, rho for zcdp specs."""
    v = to_fraction(value, "budget")
    if isinstance(spec.charge, PureDP):
        return PureDP(v)
    if isinstance(spec.charge, ZCDP):
        return ZCDP(v)
    raise ConfigError("the explorer handles pure_dp and zcdp release specs")


def _budget_value(b: Budget) -> Fraction:
    return b.epsilon if isinstance(b, PureDP) else b.rho


def plan_at(spec: ReleaseSpec, budget: Number | Budget):
    """The engine's plan of ``spec`` with its charge replaced by ``budget`` (no data read)."""
    from dp_spark.engine import plan_release

    charge = budget if isinstance(budget, (PureDP, ZCDP)) else budget_of(spec, budget)
    if type(charge) is not type(spec.charge):
        raise ConfigError("the explored budget must be in the spec's measure")
    return plan_release(dataclasses.replace(spec, charge=charge))


def _alpha(confidence: Optional[Number], spec: ReleaseSpec) -> Fraction:
    conf = spec.confidence if confidence is None else to_fraction(confidence, "confidence")
    if not (0 < conf < 1):
        raise ConfigError("confidence must be in (0, 1)")
    return 1 - conf


def _assumed_mean(spec: ReleaseSpec, assumed_mean: Optional[Number]) -> Optional[Fraction]:
    """The assumed value per row: the argument, else the spec's own public
    ``mean.assumed_mean``, else the midpoint of the clamp bounds."""
    if spec.value is None:
        return None
    if assumed_mean is None:
        own = spec.mean.assumed_mean if getattr(spec, "mean", None) is not None else None
        return own if own is not None else (spec.value.lower + spec.value.upper) / 2
    m = to_fraction(assumed_mean, "assumed_mean")
    return m


def _check_group_size(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError("group sizes must be integers >= 1")
    return n


# --------------------------------------------------------------------------------------
# Accuracy of one planned statistic
# --------------------------------------------------------------------------------------
def _expected_abs_grid(p) -> float:
    """E|noise| in grid units: the engine's own function (the release table's expected_abs_error)."""
    from dp_spark.engine import _expected_abs

    return _expected_abs(p)


def _unit(p) -> Fraction:
    return Fraction(2) ** p.grid_exponent


def _simple_accuracy(p, true_value: float, alpha: Fraction) -> dict[str, float]:
    unit = float(_unit(p))
    abs_err = _expected_abs_grid(p) * unit
    h = float(p.halfwidth_grid(alpha)) * unit
    denom = abs(true_value)
    return {
        "noise_stddev": float(p.stddev_grid) * unit,
        "expected_abs_error": abs_err,
        "expected_rel_error": abs_err / denom if denom > 0 else math.inf,
        "halfwidth": h,
        "rel_halfwidth": h / denom if denom > 0 else math.inf,
    }


def _mean_accuracy(spec: ReleaseSpec, plan, n: int, mean: Fraction, alpha: Fraction) -> dict[str, float]:
    """What the engine publishes for a mean cell whose noisy count is n and whose noisy
    normalised sum is n (mean - mid) on the grid (the expected noisy values: no noise drawn):
    the same function as the engine's noise_cells (:func:`~dp_spark.mechanisms.mean.mean_cell_accuracy`),
    so the interval (large-count law or union bound) and the expected error (both noises) are
    exactly those the release would carry for those values."""
    from dp_spark.mechanisms.mean import mean_cell_accuracy
    from dp_spark.mechanisms.release import grid_midpoint, value_to_grid

    by = {p.statistic: p for p in plan.statistics}
    pc, ps = by["count"], by["normalised_sum"]
    lo_b, hi_b = spec.value.lower, spec.value.upper
    k = ps.grid_exponent
    unit = Fraction(2) ** k
    # the engine's noisy normalised sum at zero noise: rows x (value - midpoint) in grid units
    nsum = n * (value_to_grid(mean, spec.bounds, k) - grid_midpoint(spec.bounds, k)) * unit
    acc = mean_cell_accuracy(nsum, Fraction(n), (lo_b + hi_b) / 2, lo_b, hi_b, spec.mean.min_count, alpha,
                             mechanism=ps.mechanism, sum_scale=ps.scale, sum_unit=unit, count_scale=pc.scale)
    m = acc["value"]
    h = float(max(acc["ci_high"] - m, m - acc["ci_low"]))
    abs_err = float(acc["expected_abs_error"])
    denom = abs(float(min(max(mean, lo_b), hi_b)))
    return {
        "noise_stddev": float(acc["noise_stddev"]),
        "expected_abs_error": abs_err,
        "expected_rel_error": abs_err / denom if denom > 0 else math.inf,
        "halfwidth": h,
        "rel_halfwidth": h / denom if denom > 0 else math.inf,
    }


def _rows_for(spec: ReleaseSpec, plan, budget: Budget, n: int, mean: Optional[Fraction],
              alpha: Fraction) -> list[dict[str, Any]]:
    measure = budget.MEASURE
    common = {"release": spec.name, "measure": measure, "budget": float(_budget_value(budget)),
              "budget_exact": str(_budget_value(budget)), "group_size": n,
              "confidence": float(1 - alpha),
              "mean_split": None if plan.mean_split is None else float(plan.mean_split)}
    rows: list[dict[str, Any]] = []
    if spec.metric in ("count", "distinct_units"):
        p = plan.statistics[0]
        rows.append({**common, "statistic": spec.metric, "true_value": float(n), "assumed_mean": None,
                     "mechanism": p.mechanism, **_simple_accuracy(p, n, alpha)})
    elif spec.metric == "sum":
        p = plan.statistics[0]
        true = float(n * mean)
        rows.append({**common, "statistic": "sum", "true_value": true, "assumed_mean": float(mean),
                     "mechanism": p.mechanism, **_simple_accuracy(p, true, alpha)})
    else:  # mean: the count cell and the mean cell, as the release publishes both
        by = {p.statistic: p for p in plan.statistics}
        pc = by["count"]
        rows.append({**common, "statistic": "count", "true_value": float(n), "assumed_mean": None,
                     "mechanism": pc.mechanism, **_simple_accuracy(pc, n, alpha)})
        rows.append({**common, "statistic": "mean", "true_value": float(mean), "assumed_mean": float(mean),
                     "mechanism": by["normalised_sum"].mechanism,
                     **_mean_accuracy(spec, plan, n, mean, alpha)})
    return rows


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
    mean = _assumed_mean(spec, assumed_mean)
    rows: list[dict[str, Any]] = []
    for b in budgets:
        budget = budget_of(spec, b)
        plan = plan_at(spec, budget)
        for n in sizes:
            rows.extend(_rows_for(spec, plan, budget, n, mean, alpha))
    return rows


def headline_statistic(spec: ReleaseSpec) -> str:
    """The statistic a person reads: the mean for a mean release, else the metric itself."""
    return "mean" if spec.metric == "mean" else spec.metric


def _rel_halfwidth_at(spec: ReleaseSpec, budget: Budget, n: int, mean: Optional[Fraction],
                      alpha: Fraction) -> float:
    rows = _rows_for(spec, plan_at(spec, budget), budget, n, mean, alpha)
    stat = headline_statistic(spec)
    return next(r["rel_halfwidth"] for r in rows if r["statistic"] == stat)


def smallest_budget(spec: ReleaseSpec, group_size: int, target_relative_error: Number,
                    confidence: Optional[Number] = None, *, assumed_mean: Optional[Number] = None,
                    rel_tol: float = 1e-6) -> Budget:
    """The smallest budget (spec's measure) whose interval meets the error target.

    "Meets" means: with probability at least ``confidence`` (default: the spec's) the noise
    error of the headline statistic (the mean for a mean release) is at most
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
    mean = _assumed_mean(spec, assumed_mean)
    stat = headline_statistic(spec)
    true = Fraction(n) if stat in ("count", "distinct_units") else (n * mean if stat == "sum" else mean)
    if true == 0:
        raise ConfigError("a relative error target needs a non-zero assumed true value")
    target_f = float(target)

    def meets(b: Fraction) -> bool:
        return _rel_halfwidth_at(spec, budget_of(spec, b), n, mean, alpha) <= target_f

    start = _calibrated_budget(spec, abs(true) * target, alpha) if stat != "mean" else None
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
    """The calibration inverse for a single-statistic spec, in the spec's measure."""
    from dp_spark.mechanisms import calibration
    from dp_spark.units import Aggregate, sensitivity

    agg = {"count": Aggregate.ROW_COUNT, "distinct_units": Aggregate.DISTINCT_UNITS,
           "sum": Aggregate.SUM}[spec.metric]
    k = spec.value.grid_exponent if spec.metric == "sum" else 0
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
    """A fixed-width text table of explorer rows (one line per budget and group size)."""
    rows = [r for r in rows if statistic is None or r["statistic"] == statistic]
    if not rows:
        return "(no rows)"
    budget_name = "epsilon" if rows[0]["measure"] == "pure_dp" else "rho"
    head = (f"{'statistic':>14} {budget_name:>9} {'group':>8} {'true':>12} {'E|err|':>11} "
            f"{'rel E|err|':>10} {'+-' + format(rows[0]['confidence'], '.0%'):>11} {'rel +-':>9}")
    lines = [head, "-" * len(head)]

    def pct(x: float) -> str:
        return "inf" if not math.isfinite(x) else f"{x:.2%}"

    for r in rows:
        lines.append(
            f"{r['statistic']:>14} {r['budget']:>9.4g} {r['group_size']:>8,} {r['true_value']:>12.5g} "
            f"{r['expected_abs_error']:>11.4g} {pct(r['expected_rel_error']):>10} {r['halfwidth']:>11.4g} "
            f"{pct(r['rel_halfwidth']):>9}")
    return "\n".join(lines)
