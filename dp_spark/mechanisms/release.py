"""The core reference path of one noised statistic: plan (public) -> noise (one draw per cell).

The Spark engine calls :func:`plan_statistic` for each statistic of a release *before any
data is read* (RELIABILITY 10: no sensitivity, scale or control flow depends on the data),
then :func:`add_noise` once per statistic on the exact integer partials it collected.

Grid. Sums are released on the fixed-point grid 2^k (:mod:`dp_spark.core.grid`):
a clamped value v is the integer round(v 2^-k); counts use k = 0. The grid sensitivity is
derived from the clamp bounds *in grid units*, rounded outward ([floor(L 2^-k),
ceil(U 2^-k)]), so it bounds the change of the integer partials whatever the rounding of
each value. When L and U lie on the grid (the config aligns them) it equals the real
sensitivity times 2^-k exactly. Noise is an exact integer draw, so every output lies on
the grid whatever the data (Mironov 2012; Haney et al. 2022).

Mechanism. A PureDP share gets discrete Laplace with scale t = Delta_1 / epsilon (rounded
up by the calibration); a ZCDP share gets the discrete Gaussian with sigma^2 = Delta_2^2 /
(2 rho) (rounded up). The event records the *actual* scale, so its cost never exceeds the
share.

:func:`release_count`, :func:`release_sum` and :func:`release_mean` are reference helpers
in real units for one cell: they document the pipeline and drive the statistical tests.

Nothing here imports pyspark.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from functools import lru_cache
from numbers import Integral
from typing import Optional, Sequence, Union

from dp_spark.core.budget import ApproxDP, PureDP, ZCDP
from dp_spark.errors import ConfigError, DpSparkError, InvalidBoundsError, MeasureMismatchError
from dp_spark.core.events import ComposedEvent, Event, NoiseEvent
from dp_spark.mechanisms import accuracy, calibration
from dp_spark.core import grid
from dp_spark.mechanisms.mean import mean_from_noisy, mean_interval, optimal_mean_split
from dp_spark.core.units import (
    Aggregate,
    ContributionBounds,
    Neighbouring,
    Sensitivity,
    as_aggregate,
    as_relation,
    sensitivity,
)

__all__ = [
    "PlanMismatchError",
    "StatisticPlan",
    "plan_statistic",
    "add_noise",
    "add_noise_array",
    "grid_value_range",
    "grid_midpoint",
    "grid_sensitivity",
    "value_to_grid",
    "kept_values",
    "Released",
    "MeanReleased",
    "release_count",
    "release_sum",
    "release_mean",
]

LAPLACE = "discrete_laplace"
GAUSSIAN = "discrete_gaussian"
_COUNTS = (Aggregate.ROW_COUNT, Aggregate.DISTINCT_UNITS)


class PlanMismatchError(DpSparkError):
    """Noise was requested for a vector that does not match the plan (cells, types)."""


# --- the grid -----------------------------------------------------------------------------
def _check_exponent(k) -> int:
    if isinstance(k, bool) or not isinstance(k, Integral) or int(k) > 0:
        raise ConfigError("grid_exponent must be an integer <= 0")
    return int(k)


def grid_value_range(bounds: ContributionBounds, grid_exponent: int) -> tuple[int, int]:
    """(floor(L 2^-k), ceil(U 2^-k)): every clamped value, rounded to the grid, lies here."""
    k = _check_exponent(grid_exponent)
    lower, upper = bounds.clamp  # InvalidBoundsError when there is no clamp
    step = Fraction(2) ** k
    return math.floor(lower / step), math.ceil(upper / step)


def grid_midpoint(bounds: ContributionBounds, grid_exponent: int) -> int:
    """The normalised sum's centre in grid units: floor((lo + hi) / 2) of the grid range.

    Equals (L + U) / 2 * 2^-k when the bounds are aligned to 2^(k+1) (as the config does).
    """
    lo, hi = grid_value_range(bounds, grid_exponent)
    return (lo + hi) // 2


def _exact_value(value) -> Fraction:
    if isinstance(value, bool) or value is None:
        raise ConfigError("a value must be a number")
    if isinstance(value, (Fraction, Integral)):
        return Fraction(value)
    if isinstance(value, float):
        if math.isnan(value):
            raise ConfigError("NaN values are dropped before aggregation, not converted")
        return Fraction(value)  # the float's binary value, as the Spark path reads it
    raise ConfigError("a value must be an int, float or Fraction")


def value_to_grid(value, bounds: ContributionBounds, grid_exponent: int) -> int:
    """One value clamped to [L, U] (+-inf to the bounds), then round(v 2^-k), ties to even.

    The result lies in :func:`grid_value_range`. NaN is refused: the value policy drops
    null and NaN rows before any aggregate (see :func:`kept_values`).
    """
    lo, hi = grid_value_range(bounds, grid_exponent)
    lower, upper = bounds.clamp
    if isinstance(value, float) and math.isinf(value):
        v = upper if value > 0 else lower
    else:
        v = min(max(_exact_value(value), lower), upper)
    return min(max(grid.to_grid(v, grid_exponent), lo), hi)


def kept_values(values: Sequence) -> list:
    """The special-value policy of the Spark path: null and NaN rows dropped, +-inf kept
    (clamped later), -0.0 read as 0."""
    return [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]


def grid_sensitivity(aggregate, bounds: ContributionBounds, relation, grid_exponent: int) -> Sensitivity:
    """The sensitivity of the integer partials on the grid 2^k (see the module docstring)."""
    agg = as_aggregate(aggregate)
    rel = as_relation(relation)
    k = _check_exponent(grid_exponent)
    if agg in _COUNTS:
        if k != 0:
            raise ConfigError("counts are released on the grid 2^0: grid_exponent must be 0")
        return sensitivity(agg, bounds, rel)
    lo, hi = grid_value_range(bounds, k)
    if agg is Aggregate.NORMALISED_SUM:
        mid = grid_midpoint(bounds, k)
        lo, hi = lo - mid, hi - mid
    shifted = replace(bounds, lower=Fraction(lo), upper=Fraction(hi))
    return sensitivity(Aggregate.SUM, shifted, rel)


# --- the plan -----------------------------------------------------------------------------
@dataclass(frozen=True)
class StatisticPlan:
    """Everything about one noised statistic that is fixed before data is read.

    ``sensitivity`` is in real units; ``sensitivity_grid`` in grid units (what the event
    and the scale use). ``scale`` and ``stddev_grid`` are in grid units (multiply by
    2^grid_exponent for real units).
    """

    statistic: str
    aggregate: Aggregate
    mechanism: str
    budget: Union[PureDP, ZCDP]
    sensitivity: Sensitivity
    grid_exponent: int
    scale: Fraction
    event: NoiseEvent
    stddev_grid: float
    sensitivity_grid: Optional[Sensitivity] = None
    relation: Neighbouring = Neighbouring.ADD_REMOVE_UNIT

    @property
    def cells(self) -> int:
        return self.event.cells

    @property
    def grid_unit(self) -> Fraction:
        return Fraction(2) ** self.grid_exponent

    def halfwidth_grid(self, alpha) -> int:
        """Integer h with P(|noise| > h) <= alpha, per cell (grid units)."""
        return int(accuracy.noise_halfwidth(self.mechanism, self.scale, alpha))


def _mechanism_for(budget_share) -> str:
    if isinstance(budget_share, PureDP):
        return LAPLACE
    if isinstance(budget_share, ZCDP):
        return GAUSSIAN
    if isinstance(budget_share, ApproxDP):
        raise MeasureMismatchError(
            "a statistic's share must be PureDP (discrete Laplace) or ZCDP (discrete Gaussian); "
            "Gaussian budgets are zCDP, converted to (epsilon, delta) only in the statement")
    raise ConfigError("a statistic's budget share must be PureDP or ZCDP")


def plan_statistic(statistic: str, aggregate, bounds: ContributionBounds, relation,
                   budget_share: Union[PureDP, ZCDP], grid_exponent: int, cells: int) -> StatisticPlan:
    """Plan one statistic over ``cells`` public cells, from public parameters only.

    Privacy contract: the unit's contribution obeys ``bounds`` (enforced upstream) under
    ``relation``. A unit touches at most min(L0, K, cells) of the cells. Laplace for a
    PureDP share (cost sensitivity_l1 / scale <= epsilon), Gaussian for a ZCDP share (cost
    l2^2 / (2 sigma^2) <= rho); the L1/L2 norms are of the whole vector of cells, so the
    one event prices all cells together (parallel composition when L0 = 1).
    """
    if not isinstance(statistic, str) or not statistic:
        raise ConfigError("statistic must be a non-empty name")
    if not isinstance(bounds, ContributionBounds):
        raise InvalidBoundsError("bounds must be ContributionBounds")
    if isinstance(cells, bool) or not isinstance(cells, Integral) or cells < 1:
        raise ConfigError("cells must be an integer >= 1 (the size of the public key set)")
    _mechanism_for(budget_share)
    return _plan_cached(statistic, as_aggregate(aggregate), bounds, as_relation(relation),
                        budget_share, _check_exponent(grid_exponent), int(cells))


@lru_cache(maxsize=4096)
def _plan_cached(statistic, agg, bounds, rel, share, k, cells) -> StatisticPlan:
    mechanism = _mechanism_for(share)
    if agg in _COUNTS and k != 0:
        raise ConfigError("counts are released on the grid 2^0: grid_exponent must be 0")
    # A unit cannot touch more cells than the public key set has.
    if bounds.max_partitions_per_unit > cells:
        bounds = replace(bounds, max_partitions_per_unit=cells)
    l0 = 1 if rel is Neighbouring.EVENT else bounds.effective_l0
    sens = sensitivity(agg, bounds, rel)
    sens_grid = grid_sensitivity(agg, bounds, rel, k)
    if mechanism == LAPLACE:
        if sens_grid.l1 == 0:
            raise InvalidBoundsError("lower == upper makes this statistic constant: nothing to release")
        scale = Fraction(calibration.laplace_scale(share.epsilon, sens_grid.l1))
        event = NoiseEvent(mechanism, statistic, scale, sensitivity=sens_grid.l1, cells=cells,
                           grid_exponent=k, partitions_per_unit=l0, parallel=(l0 == 1))
    else:
        if sens_grid.l2_squared == 0:
            raise InvalidBoundsError("lower == upper makes this statistic constant: nothing to release")
        scale = Fraction(calibration.gaussian_sigma_zcdp(share.rho, sens_grid.l2_squared))
        event = NoiseEvent(mechanism, statistic, scale, l2_squared=sens_grid.l2_squared, cells=cells,
                           grid_exponent=k, partitions_per_unit=l0, parallel=(l0 == 1))
    if not event.natural_cost().fits_in(share):
        raise DpSparkError("internal: the calibrated scale costs more than the budget share")
    return StatisticPlan(
        statistic=statistic, aggregate=agg, mechanism=mechanism, budget=share, sensitivity=sens,
        grid_exponent=k, scale=scale, event=event,
        stddev_grid=float(accuracy.noise_stddev(mechanism, scale)),
        sensitivity_grid=sens_grid, relation=rel,
    )


def add_noise(plan: StatisticPlan, true_values_grid: Sequence[int], source) -> list[int]:
    """``true + noise`` per cell: exactly one draw per cell, in one vector call to ``source``.

    ``true_values_grid`` has one integer per public cell (``plan.cells``), present in the
    data or not. Returns integers on the grid (multiply by 2^grid_exponent for real units).
    The values are never logged or put in an error message.
    """
    if not isinstance(plan, StatisticPlan):
        raise ConfigError("add_noise needs a StatisticPlan")
    values = list(true_values_grid)
    if len(values) != plan.cells:
        raise PlanMismatchError(
            f"statistic {plan.statistic!r}: expected {plan.cells} cells, got a different number")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, Integral):
            raise PlanMismatchError(f"statistic {plan.statistic!r}: true values must be grid integers")
    draws = source.draw(plan.mechanism, plan.scale, plan.cells) if hasattr(source, "draw") else (
        source.discrete_laplace(plan.scale, plan.cells) if plan.mechanism == LAPLACE
        else source.discrete_gaussian(plan.scale, plan.cells))
    if len(draws) != plan.cells:
        raise PlanMismatchError(f"statistic {plan.statistic!r}: the noise source returned a wrong length")
    return [int(v) + int(d) for v, d in zip(values, draws)]


def add_noise_array(plan: StatisticPlan, true_values_grid, source):
    """:func:`add_noise` over a numpy vector: ``true + noise`` per cell, one vector call to
    ``source`` (the same draws, in the same order, as :func:`add_noise`). Returns an ``int64``
    array, or an ``object`` array of Python ints when a value does not fit in 62 bits (the
    sum is then exact in Python integers). Never logged."""
    if not isinstance(plan, StatisticPlan):
        raise ConfigError("add_noise needs a StatisticPlan")
    import numpy as np

    from dp_spark.mechanisms.samplers import as_int_array

    true = true_values_grid if isinstance(true_values_grid, np.ndarray) else as_int_array(true_values_grid)
    if true.shape != (plan.cells,):
        raise PlanMismatchError(
            f"statistic {plan.statistic!r}: expected {plan.cells} cells, got a different number")
    if true.dtype != np.int64 and true.dtype != object:
        raise PlanMismatchError(f"statistic {plan.statistic!r}: true values must be grid integers")
    if hasattr(source, "draw_array"):
        draws = source.draw_array(plan.mechanism, plan.scale, plan.cells)
    else:
        draws = as_int_array(add_noise(plan, [0] * plan.cells, source))
    if len(draws) != plan.cells:
        raise PlanMismatchError(f"statistic {plan.statistic!r}: the noise source returned a wrong length")
    limit = 2**62  # |true| and |draw| below 2^62: their int64 sum cannot wrap
    def small(a) -> bool:
        return a.dtype == np.int64 and -limit < int(a.min()) and int(a.max()) < limit

    if plan.cells and small(true) and small(draws):
        return true + draws
    if not plan.cells:
        return np.zeros(0, dtype=np.int64)
    return as_int_array([int(v) + int(d) for v, d in zip(true.tolist(), draws.tolist())])


# --- reference helpers (one cell, real units) -----------------------------------------------
@dataclass(frozen=True)
class Released:
    """One released cell: the noisy value (real units), its (1 - alpha) noise interval,
    the plan and the event to charge."""

    value: Fraction
    interval: tuple[Fraction, Fraction]
    plan: StatisticPlan
    event: Event


@dataclass(frozen=True)
class MeanReleased:
    """A released mean with its two noisy ingredients (already released, so shareable)."""

    value: Fraction
    interval: tuple[Fraction, Fraction]
    noisy_norm_sum: Fraction
    noisy_count: Fraction
    split: Fraction
    count_plan: StatisticPlan
    sum_plan: StatisticPlan
    event: ComposedEvent


def _alpha(alpha) -> float:
    a = float(alpha)
    if not 0 < a < 1:
        raise ConfigError("alpha must be in (0, 1)")
    return a


def release_count(true_count: int, budget, bounds: ContributionBounds, relation, source, *,
                  aggregate=Aggregate.ROW_COUNT, statistic: str = "count", alpha=0.05) -> Released:
    """A noisy count of one cell (raw: may be negative; clamping at 0 is post-processing)."""
    if isinstance(true_count, bool) or not isinstance(true_count, Integral) or true_count < 0:
        raise ConfigError("true_count must be a non-negative integer")
    agg = as_aggregate(aggregate)
    if agg not in _COUNTS:
        raise ConfigError("release_count releases row_count or distinct_units")
    plan = plan_statistic(statistic, agg, bounds, relation, budget, 0, 1)
    (noisy,) = add_noise(plan, [int(true_count)], source)
    h = plan.halfwidth_grid(_alpha(alpha))
    return Released(Fraction(noisy), (Fraction(noisy - h), Fraction(noisy + h)), plan, plan.event)


def _grid_exponent(bounds: ContributionBounds, grid_exponent) -> int:
    lower, upper = bounds.clamp  # InvalidBoundsError when there is no clamp
    if grid_exponent is None:
        return grid.grid_exponent_for(lower, upper)
    return _check_exponent(grid_exponent)


def release_sum(values: Sequence, budget, bounds: ContributionBounds, relation, source, *,
                grid_exponent: Optional[int] = None, statistic: str = "sum", alpha=0.05) -> Released:
    """A noisy sum of one cell. ``values`` are the rows kept after contribution bounding
    (<= K per unit); null/NaN rows are dropped, each value is clamped to [L, U] and put on
    the grid 2^k, then summed exactly in integers."""
    k = _grid_exponent(bounds, grid_exponent)
    plan = plan_statistic(statistic, Aggregate.SUM, bounds, relation, budget, k, 1)
    true = sum(value_to_grid(v, bounds, k) for v in kept_values(values))
    (noisy,) = add_noise(plan, [true], source)
    h = plan.halfwidth_grid(_alpha(alpha))
    unit = plan.grid_unit
    return Released(noisy * unit, ((noisy - h) * unit, (noisy + h) * unit), plan, plan.event)


def charge_share(budget, split: Fraction):
    if isinstance(budget, PureDP):
        return PureDP(budget.epsilon * split)
    if isinstance(budget, ZCDP):
        return ZCDP(budget.rho * split)
    _mechanism_for(budget)
    raise ConfigError("unreachable")  # pragma: no cover


def release_mean(values: Sequence, budget, bounds: ContributionBounds, relation, source, *,
                 assumed_group_size: int, min_count: int = 1, grid_exponent: Optional[int] = None,
                 alpha=0.05, split: Optional[Fraction] = None) -> MeanReleased:
    """A noisy mean of one cell: noisy normalised sum / max(noisy count, min_count) + mid.

    ``values`` are the rows kept after contribution bounding (<= K per unit). The budget is
    split by :func:`~dp_spark.mechanisms.mean.optimal_mean_split` for the *assumed* (public)
    group size, never the true one; ``split`` overrides it (tests compare splits). The
    interval is :func:`~dp_spark.mechanisms.mean.mean_interval` with the exact discrete
    half-widths at alpha/2 each.
    """
    mechanism = _mechanism_for(budget)
    k = _grid_exponent(bounds, grid_exponent)
    if split is None:
        split = optimal_mean_split(bounds, relation, assumed_group_size, mechanism,
                                   budget=budget, min_count=min_count)
    split = Fraction(split)
    if not 0 < split < 1:
        raise ConfigError("a mean split must be in (0, 1)")
    sum_share = charge_share(budget, split)
    count_share = budget - sum_share
    count_plan = plan_statistic("count", Aggregate.ROW_COUNT, bounds, relation, count_share, 0, 1)
    sum_plan = plan_statistic("normalised_sum", Aggregate.NORMALISED_SUM, bounds, relation, sum_share, k, 1)
    mid_grid = grid_midpoint(bounds, k)
    grid_values = [value_to_grid(v, bounds, k) for v in kept_values(values)]
    true_count = len(grid_values)
    true_norm = sum(grid_values) - true_count * mid_grid
    (noisy_count,) = add_noise(count_plan, [true_count], source)
    (noisy_norm,) = add_noise(sum_plan, [true_norm], source)
    unit = sum_plan.grid_unit
    nsum, ncount, mid = noisy_norm * unit, Fraction(noisy_count), mid_grid * unit
    value = mean_from_noisy(nsum, ncount, mid, bounds.lower, bounds.upper, min_count)
    a = _alpha(alpha)
    interval = mean_interval(
        nsum, ncount, sum_plan.stddev_grid * float(unit), count_plan.stddev_grid, mid,
        bounds.lower, bounds.upper, min_count, a, mechanism=mechanism,
        sum_halfwidth=sum_plan.halfwidth_grid(a / 2) * unit,
        count_halfwidth=Fraction(count_plan.halfwidth_grid(a / 2)),
    )
    return MeanReleased(value, interval, nsum, ncount, split, count_plan, sum_plan,
                        ComposedEvent((count_plan.event, sum_plan.event)))
