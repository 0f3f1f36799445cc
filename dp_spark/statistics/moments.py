"""Statistic kinds over one clamped value column: ``sum``, ``mean``, ``variance``, ``stddev``.

Components (shared across the statistics of a release that use the same column and bounds):
``rows`` (noisy count), ``nsum`` (noisy sum of x = clamp(v) - mid, mid = (L + U) / 2) and, for
the spread, ``nsumsq`` (noisy sum of x^2 - W^2 / 2, W = (U - L) / 2). Their sensitivities come
from the enforced bounds (table in :mod:`dp_spark.statistics.components`).

Post-processing (never the true count; N = max(noisy count, min_count)):

* ``sum``: nsum + mid * count when the release has a noisy count anyway (shared, so the sum
  costs only its normalised part), else one noisy clamped sum (cheaper alone under pure DP);
* ``mean``: mid + nsum / N, clamped to [L, U] (:func:`dp_spark.mechanisms.mean.mean_from_noisy`);
* ``variance``: m2 - m1^2 with m1 = nsum / N and m2 = nsumsq / N + W^2 / 2, clamped to
  [0, W^2] (the largest variance of values in [L, U]);
* ``stddev``: the square root of the variance (and of its interval's ends: a monotone map
  keeps the coverage).

Intervals: the first-order error of the estimate is a linear combination of the components'
noises; its (1 - alpha) half-width is sqrt(sum_c (a_c h_c)^2) with h_c each noise's EXACT
(1 - alpha) half-width (exact for Gaussian noises, and for one dominant noise). The mean uses
:func:`dp_spark.mechanisms.mean.mean_cell_accuracy`, exactly as a single-metric mean release.
The spread uses the first-order interval when the count is large (C~ - h_C >= max(floor, 1)
and h_C <= C~ / 10) and otherwise reports the whole range [0, W^2] (it cannot say more). What is covered: the statistic of the bounded, clamped data,
not the clipping bias.

Budget split model (relative squared error at the statistic's ``assumed_group_size`` n, a
public parameter, default 100): sum: (Var nsum + mid^2 Var count) / (n W)^2; mean:
(Var nsum + d^2 Var count) / (n W)^2 with d = assumed_mean - mid (W when not given: worst
case); variance and stddev: (Var nsumsq + 4 d^2 Var nsum + (W^2/2 + 2 d^2)^2 Var count)
/ (n W^2)^2.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Optional

from pydantic import Field, model_validator

from dp_spark.mechanisms.mean import mean_cell_accuracy
from dp_spark.spec.types import Number, PositiveInt, SpecModel, fail_at
from dp_spark.statistics.base import StatisticKind, StatisticSpec, register
from dp_spark.statistics.components import Component
from dp_spark.statistics.noise import cell, combined_expected_abs, expected_abs, halfwidth, stddev

DEFAULT_GROUP_SIZE = 100


class GroupSizeOptions(SpecModel):
    """Options of every kind: the public group size the default budget split assumes."""

    assumed_group_size: PositiveInt = Field(
        DEFAULT_GROUP_SIZE, description="public group size used by the default split of the charge")


class RatioOptions(GroupSizeOptions):
    """Options of a mean, variance or stddev (mixed into an entry with ``lower`` and ``upper``)."""

    min_count: PositiveInt = Field(1, description="floor of the noisy count in the denominator")
    assumed_mean: Optional[Number] = Field(
        None, description="public estimate of the mean (within [lower, upper], e.g. last period's published "
                          "value) for the split; a wrong one costs accuracy, never privacy")

    @model_validator(mode="after")
    def _assumed_mean_within(self) -> "RatioOptions":
        lo, hi = getattr(self, "lower", None), getattr(self, "upper", None)
        if self.assumed_mean is not None and lo is not None and not lo <= self.assumed_mean <= hi:
            raise fail_at([(("assumed_mean",), "must lie within the statistic's [lower, upper]")])
        return self


def _dev(stat: StatisticSpec) -> float:
    """|assumed mean - mid| (W when no public assumption: the worst case)."""
    c = stat.clamp
    m = stat.option("assumed_mean")
    return float(c.half_width) if m is None else abs(float(m - c.midpoint))


def _comps(stat: StatisticSpec, *kinds: str) -> tuple:
    return tuple(Component(k) if k == "rows" else Component(k, stat.clamp) for k in kinds)


def _large_count(c: Fraction, h_c: Fraction, floor: int) -> bool:
    return not (c - h_c < max(Fraction(floor), Fraction(1)) or h_c * 10 > c)


@register
class Sum(StatisticKind):
    kind = "sum"
    needs_value = True
    options = GroupSizeOptions

    def components(self, stat, *, rows_shared):
        if rows_shared and stat.clamp.midpoint != 0:
            return _comps(stat, "rows", "nsum")
        if stat.clamp.midpoint == 0:  # the normalised sum IS the sum
            return _comps(stat, "nsum")
        return _comps(stat, "sum")

    def error_coefficients(self, stat, comps):
        n, w = stat.option("assumed_group_size"), float(stat.clamp.half_width)
        ref = (n * w) ** 2
        mid = float(stat.clamp.midpoint)
        return {c: (mid * mid if c.kind == "rows" else 1.0) / ref for c in comps}

    def finish(self, stat, noisy, plans, alpha):
        comps = {c.kind: c for c in noisy}  # the components planned for this statistic
        if "rows" in comps:
            pr, ps = plans[comps["rows"]], plans[comps["nsum"]]
            mid = stat.clamp.midpoint
            v = noisy[comps["nsum"]] + mid * noisy[comps["rows"]]
            h = Fraction(math.sqrt(float(halfwidth(ps, alpha)) ** 2 + (float(mid * halfwidth(pr, alpha))) ** 2))
            sds = [stddev(ps), abs(float(mid)) * stddev(pr)]
            return cell(v, v - h, v + h, plan=ps, sd=math.sqrt(sum(s * s for s in sds)),
                        expected=combined_expected_abs(sds))
        (c,) = comps.values()
        p = plans[c]
        v, h = noisy[c], halfwidth(p, alpha)
        return cell(v, v - h, v + h, plan=p, sd=stddev(p), expected=expected_abs(p))


@register
class Mean(StatisticKind):
    kind = "mean"
    needs_value = True
    options = RatioOptions

    def components(self, stat, *, rows_shared):
        return _comps(stat, "rows", "nsum")

    def error_coefficients(self, stat, comps):
        n, w, d = stat.option("assumed_group_size"), float(stat.clamp.half_width), _dev(stat)
        ref = (n * w) ** 2
        return {c: (d * d if c.kind == "rows" else 1.0) / ref for c in comps}

    def finish(self, stat, noisy, plans, alpha):
        rows, nsum = self.components(stat, rows_shared=True)
        pc, ps = plans[rows], plans[nsum]
        cl = stat.clamp
        # the same function as the single-metric engine path and the epsilon explorer
        out = mean_cell_accuracy(noisy[nsum], noisy[rows], cl.midpoint, cl.lower, cl.upper,
                                 stat.option("min_count"), alpha, mechanism=ps.mechanism,
                                 sum_scale=ps.scale, sum_unit=ps.grid_unit, count_scale=pc.scale)
        return cell(out["value"], out["ci_low"], out["ci_high"], plan=ps, sd=out["noise_stddev"],
                    expected=out["expected_abs_error"])


@register
class Variance(StatisticKind):
    kind = "variance"
    needs_value = True
    options = RatioOptions

    def components(self, stat, *, rows_shared):
        return _comps(stat, "rows", "nsum", "nsumsq")

    def error_coefficients(self, stat, comps):
        n, w, d = stat.option("assumed_group_size"), float(stat.clamp.half_width), _dev(stat)
        ref = (n * w * w) ** 2
        a = {"nsumsq": 1.0, "nsum": 4 * d * d, "rows": (w * w / 2 + 2 * d * d) ** 2}
        return {c: a[c.kind] / ref for c in comps}

    def spread(self, stat, noisy, plans, alpha) -> tuple[float, float, float, float, Any]:
        """(variance, lo, hi, sd of the variance's noise, plan) for one cell."""
        rows, nsum, nsq = self.components(stat, rows_shared=True)
        pc, ps, pq = plans[rows], plans[nsum], plans[nsq]
        w = float(stat.clamp.half_width)
        floor = stat.option("min_count")
        c = noisy[rows]
        n = max(float(c), float(floor))
        m1 = min(max(float(noisy[nsum]) / n, -w), w)
        m2 = min(max(float(noisy[nsq]) / n + w * w / 2, 0.0), w * w)
        var = min(max(m2 - m1 * m1, 0.0), w * w)
        g_q, g_s, g_c = 1 / n, 2 * abs(m1) / n, abs(-(m2 - w * w / 2) + 2 * m1 * m1) / n
        sds = [g_q * stddev(pq), g_s * stddev(ps), g_c * stddev(pc)]
        h_c = halfwidth(pc, alpha)
        if _large_count(Fraction(c), h_c, floor):
            h = math.sqrt((g_q * float(halfwidth(pq, alpha))) ** 2 + (g_s * float(halfwidth(ps, alpha))) ** 2
                          + (g_c * float(h_c)) ** 2)
            lo, hi = max(var - h, 0.0), min(var + h, w * w)
        else:  # too few rows for a first-order interval: say nothing beyond the range
            lo, hi = 0.0, w * w
        return var, min(lo, var), max(hi, var), math.sqrt(sum(x * x for x in sds)), pq

    def finish(self, stat, noisy, plans, alpha):
        var, lo, hi, sd, plan = self.spread(stat, noisy, plans, alpha)
        return cell(var, lo, hi, plan=plan, sd=sd, expected=math.sqrt(2 / math.pi) * sd)


@register
class StdDev(Variance):
    kind = "stddev"

    def finish(self, stat, noisy, plans, alpha):
        var, lo, hi, sd_var, plan = self.spread(stat, noisy, plans, alpha)
        sd = math.sqrt(var)
        # first order sd_var / (2 sd), bounded by sqrt(sd_var) near a zero spread
        sd_sd = sd_var / (2 * sd + math.sqrt(sd_var)) if sd_var > 0 else 0.0
        return cell(sd, math.sqrt(lo), math.sqrt(hi), plan=plan, sd=sd_sd, expected=math.sqrt(2 / math.pi) * sd_sd)
