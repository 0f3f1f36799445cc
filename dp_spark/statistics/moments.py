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

Intervals (each covers the statistic of the bounded, clamped data, not the clipping bias):

* ``sum`` alone: the one noise's exact half-width. ``sum`` sharing the count: its error is
  u X_S + mid X_C, two independent integer noises; the half-width is the exact (1 - alpha)
  quantile of |u X_S + mid X_C| (:func:`dp_spark.mechanisms.mean.mean_error_quantile`: the
  count's pmf enumerated, the sum's CDF exact), not the root-sum-square of the two
  half-widths (exact only for two continuous Gaussians: 0.42 at a nominal 0.5 under pure DP);
* ``mean``: :func:`dp_spark.mechanisms.mean.mean_cell_accuracy`: for large counts the exact
  law of its error (u X_S - d X_C) / C~ with d = mean - mid taken at the released mean (the one
  approximation), else a union bound over the two noises;
* ``variance`` and ``stddev``: a proven box bound. The three noises are within their exact
  (1 - alpha_c) half-widths with probability (1 - alpha_c)^3 = 1 - alpha (independent); on
  that event the true (n, S, Q) lie in the box of the noisy values +- those half-widths
  (n an integer >= 1, |S| <= n W, |Q| <= n E), and the interval is the smallest and largest
  variance Q/n + W^2/2 - (S/n)^2 over the box (:func:`variance_box`: exact extremes of a
  concave function of 1/n), clamped to [0, W^2]. Valid at every cell size, conservative
  (coverage above the level); ``stddev``'s interval is its square root (monotone).

Error figures (``expected_abs_error``, ``noise_stddev``: the root-mean-square error) are those
of the PUBLISHED value, computed from published values and noise parameters only. ``sum``:
exact for the noise(s) (E|u X_S + mid X_C| summed over the count's pmf; the Gaussian's E|.| at
its exact sd), public. ``mean`` and ``variance``: the estimator's error computed at a plug-in
truth (the released values) over the noises' discretised laws
(:func:`dp_spark.statistics.noise.plugin_error`; the mean's from prefix sums of the same nodes,
:func:`mean_error_columns`): every floor and clamp of the estimator is in
it, so the figure never exceeds the value's range (before: a mean held to [0, 500] reported
1,708), and the ratio's curvature too. ``stddev``: the plug-in truth fails where the noise
dominates (the variance is released as 0 in 20-40% of the cells of 10-20 units, the plug-in
truth is then 0, where the square root is steepest: it under-reported E|error| by 21-28%), so
its figure is the released value's expected distance from the standard deviation of the
truths (n, S, Q) = noisy values - noise that can exist (n >= 1, |S| <= n W, m2 <= W^2, a
variance >= 0), weighted by the three noises' laws (:func:`stddev_error`): the expected error
given the published values under a flat prior on (n, S, Q) over its feasible range. With
little noise every truth is feasible and it is the first-order plug-in figure. The same figure
for the variance over-reports at 10 units (1.33: the flat prior spreads the truth over
[0, W^2] while the data's variance sits near its low end), so the variance keeps the plug-in
figure (within 20% there). All are estimates, not bounds: the plug-in truth is itself noisy in
small cells, and the posterior's prior is a choice (the coverage table measures both).

Budget split model (relative squared error at the statistic's ``assumed_group_size`` n, a
public parameter, default 100): sum: (Var nsum + mid^2 Var count) / (n W)^2; mean:
(Var nsum + d^2 Var count) / (n W)^2 with d = assumed_mean - mid (W when not given: worst
case); variance and stddev: (Var nsumsq + 4 d^2 Var nsum + (W^2/2 + 2 d^2)^2 Var count)
/ (n W^2)^2.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import Optional

from pydantic import Field, model_validator

import numpy as np

from dp_spark.mechanisms.mean import (mean_cell_accuracy, mean_cell_accuracy_columns, mean_error_quantile,
                                     mean_expected_abs_error)
from dp_spark.core.fields import Number, PositiveInt, SpecModel, fail_at
from dp_spark.statistics.base import StatisticKind, StatisticSpec, register
from dp_spark.statistics.components import Component
from dp_spark.statistics.noise import (cell, expected_abs, halfwidth, interval_columns, joint_alpha, law_nodes,
                                      plugin_error, shared_sum_columns, stddev)

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


@functools.lru_cache(maxsize=1024)
def shared_sum_accuracy(mechanism: str, sum_scale: Fraction, sum_unit: Fraction, count_scale: Fraction,
                        mid: Fraction, alpha: float) -> tuple[float, float, float]:
    """(half-width, sd, E|error|) of a sum released as nsum~ + mid C~: the error u X_S + mid X_C
    of two independent integer noises, whose law is that of u X_S - mid X_C (symmetric).
    The half-width is its exact (1 - alpha) quantile, the sd exact, E|.| summed over the
    count's pmf (:func:`dp_spark.mechanisms.mean.mean_expected_abs_error` with denominator 1).
    Public: noise parameters only."""
    from dp_spark.mechanisms import accuracy

    kw = dict(mechanism=mechanism, sum_scale=sum_scale, sum_unit=sum_unit, count_scale=count_scale)
    h = mean_error_quantile(alpha, mid, **kw)
    sd = math.hypot(accuracy.noise_stddev(mechanism, sum_scale) * float(sum_unit),
                    float(mid) * accuracy.noise_stddev(mechanism, count_scale))
    return h, sd, mean_expected_abs_error(mid, 1, 1, **kw)


def variance_box(c: float, h_c: int, s: float, h_s: float, q: float, h_q: float, w: float, e: float
                 ) -> tuple[float, float]:
    """Smallest and largest Q/n + W^2/2 - (S/n)^2 over n an integer in [c - h_c, c + h_c],
    n >= 1, S in [s - h_s, s + h_s] with |S| <= n W, Q in [q - h_q, q + h_q] with |Q| <= n E
    (W the clamp's half-width, E the bound of one row's centred-square term), clamped to
    [0, W^2]; the whole range when no n is consistent. For fixed n the largest value takes Q
    at its top and S nearest 0, the smallest Q at its bottom and |S| largest (the per-n clips
    of S and Q dropped there: only wider); with x = 1/n both are concave quadratics in x, so
    the smallest is at an end of the range of n and the largest at an end or at one of the
    two integers around the stationary point n = 2 S^2 / Q."""
    s_lo, s_hi, q_lo, q_hi = s - h_s, s + h_s, q - h_q, q + h_q
    top = w * w
    n_lo = max(math.ceil(c - h_c), 1, math.ceil(max(s_lo, -s_hi, 0.0) / w), math.ceil(max(q_lo, -q_hi, 0.0) / e))
    n_hi = math.floor(c + h_c)
    if n_hi < n_lo:
        return 0.0, top
    near = min(max(0.0, s_lo), s_hi)
    far = max(abs(s_lo), abs(s_hi))

    def var(n: int, qq: float, ss: float) -> float:
        return qq / n + top / 2 - (ss / n) ** 2

    ends = {n_lo, n_hi}
    if near != 0 and q_hi > 0:
        m = 2 * near * near / q_hi
        ends |= {min(max(math.floor(m), n_lo), n_hi), min(max(math.ceil(m), n_lo), n_hi)}
    hi = max(var(n, q_hi, near) for n in ends)
    lo = min(var(n, q_lo, far) for n in (n_lo, n_hi))
    return min(max(lo, 0.0), top), min(max(hi, 0.0), top)


#: nodes per noise of the plug-in error figures (the spread's three noises: a product grid of 32^3)
_MEAN_NODES, _SPREAD_NODES = 80, 32


@functools.lru_cache(maxsize=256)
def mean_error(value: float, count: float, clamp, floor: int, count_plan, sum_plan) -> tuple[float, float]:
    """(E|error|, root-mean-square error) of the published mean (floored, clamped) at the
    plug-in truth: mean = ``value``, rows = max(``count``, floor) (module docstring). One cell
    of :func:`mean_error_columns` (the one implementation). Memoised: a cell's figures do not
    depend on the level."""
    e, r = mean_error_columns(np.array([float(value)]), np.array([float(count)]), clamp, floor, count_plan, sum_plan)
    return float(e[0]), float(r[0])


def mean_error_columns(values: np.ndarray, counts: np.ndarray, clamp, floor: int, count_plan, sum_plan
                       ) -> tuple[np.ndarray, np.ndarray]:
    """(E|error|, root-mean-square error) of the published mean for each cell (float64 vectors
    of the published means and noisy counts): the estimator clamp(mid + (S + e_S) / max(n + e_C,
    floor), L, U) at the plug-in truth (mean = value, n = max(count, floor), S = (value - mid) n)
    over the two noises' discretised laws (:func:`~dp_spark.statistics.noise.law_nodes`, the sum's
    nodes sorted). For each count node the estimate is a clamped line in the sum's noise, so its
    error is a constant below one threshold (L - value), above another (U - value) and linear in
    between, changing sign once: E|error| and E error^2 over the sum's nodes are sums of
    prefix sums (mass, first and second moment of the nodes) at three indices found by binary
    search, instead of the estimate at every pair of nodes. Equal to that product-grid sum up to
    rounding (tests/unit/test_mean_accuracy.py). Each cell's sum over the count's nodes is
    one row reduced along itself: its bits do not depend on the other cells."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    counts = np.asarray(counts, dtype=np.float64).reshape(-1)
    laws = law_nodes(count_plan, _MEAN_NODES), law_nodes(sum_plan, _MEAN_NODES)
    expected, rms = np.empty(values.size), np.empty(values.size)
    for i in range(0, values.size, _MEAN_BLOCK):  # bounded memory: ~20 arrays of block x nodes
        part = slice(i, i + _MEAN_BLOCK)
        expected[part], rms[part] = _mean_error_block(values[part], counts[part], clamp, float(floor), *laws)
    return expected, rms


#: cells per block of :func:`mean_error_columns`
_MEAN_BLOCK = 4096


def _mean_error_block(values, counts, clamp, floor: float, count_law, sum_law):
    mid, lo, hi = float(clamp.midpoint), float(clamp.lower), float(clamp.upper)
    xc, pc = count_law
    ys, ps = sum_law
    mass = np.concatenate([[0.0], np.cumsum(ps)])
    first = np.concatenate([[0.0], np.cumsum(ps * ys)])
    second = np.concatenate([[0.0], np.cumsum(ps * ys * ys)])
    total = mass[-1]
    v = values[:, None]
    n = np.maximum(counts, floor)[:, None]
    s_hat = (v - mid) * n
    d = np.maximum(n + xc[None, :], floor)  # cells x count nodes
    b = mid + s_hat / d - v  # the error at the sum's noise 0, before the clamps
    i_lo = np.searchsorted(ys, ((lo - mid) * d - s_hat).ravel(), side="right").reshape(d.shape)
    i_hi = np.maximum(np.searchsorted(ys, ((hi - mid) * d - s_hat).ravel(), side="left").reshape(d.shape), i_lo)
    i_0 = np.clip(np.searchsorted(ys, ((v - mid) * d - s_hat).ravel(), side="left").reshape(d.shape), i_lo, i_hi)
    below, above = v - lo, hi - v  # |error| where the estimate is clamped at L, at U
    m_lo, m_0, m_hi = mass[i_lo], mass[i_0], mass[i_hi]
    f_lo, f_0, f_hi = first[i_lo], first[i_0], first[i_hi]
    neg = np.maximum(-(b * (m_0 - m_lo) + (f_0 - f_lo) / d), 0.0)
    pos = np.maximum(b * (m_hi - m_0) + (f_hi - f_0) / d, 0.0)
    abs_j = below * m_lo + above * (total - m_hi) + neg + pos
    sq_j = (below * below * m_lo + above * above * (total - m_hi)
            + np.maximum(b * b * (m_hi - m_lo) + 2 * b * (f_hi - f_lo) / d + (second[i_hi] - second[i_lo]) / (d * d),
                         0.0))
    expected = np.add.reduce(abs_j * pc[None, :], axis=1)
    rms = np.sqrt(np.add.reduce(sq_j * pc[None, :], axis=1))
    return expected, rms


def _variance(c, s, q, w: float, floor: float):
    """The released variance from the noisy count, normalised sum and sum of centred squares
    (arrays broadcast): clamp(m2 - m1^2, 0, W^2), m1 = s / N clamped to [-W, W],
    m2 = q / N + W^2 / 2 clamped to [0, W^2], N = max(c, floor)."""
    top = w * w
    n = np.maximum(c, floor)
    m1 = np.clip(s / n, -w, w)
    m2 = np.clip(q / n + top / 2, 0.0, top)
    return np.clip(m2 - m1 * m1, 0.0, top)


@functools.lru_cache(maxsize=256)
def spread_error(c: float, s: float, q: float, w: float, floor: float, count_plan, sum_plan, square_plan
                 ) -> tuple[float, float]:
    """(E|error|, root-mean-square error) of the published variance at the plug-in truth: the
    released count (floored) and moments (clamped), the three noises on
    :data:`_SPREAD_NODES` nodes each. Memoised: a cell's figures do not depend on the level.
    (The standard deviation's figures: :func:`stddev_error`.)"""
    top = w * w
    n = max(c, floor)
    m1 = min(max(s / n, -w), w)
    m2 = min(max(q / n + top / 2, 0.0), top)
    s_hat, q_hat = m1 * n, (m2 - top / 2) * n
    truth = float(_variance(n, s_hat, q_hat, w, floor))
    laws = [law_nodes(p, _SPREAD_NODES) for p in (count_plan, sum_plan, square_plan)]

    def estimate(e_c, e_s, e_q):
        return _variance(n + e_c, s_hat + e_s, q_hat + e_q, w, floor)

    return plugin_error(estimate, truth, laws)


@functools.lru_cache(maxsize=256)
def stddev_error(c: float, s: float, q: float, w: float, floor: float, count_plan, sum_plan, square_plan
                 ) -> tuple[float, float]:
    """(E|error|, root-mean-square error) of the published standard deviation given the
    published noisy count ``c``, normalised sum ``s`` and sum of centred squares ``q``: its
    distance from the standard deviation of each truth (n, S, Q) = (c, s, q) - noise that can
    exist (n >= 1, |S| <= n W, m2 = Q/n + W^2/2 <= W^2, a variance >= 0), weighted by the
    three noises' laws on :data:`_SPREAD_NODES` nodes each: the expected error given the
    published values under a flat prior on (n, S, Q) over its feasible range (module
    docstring). Where the noise is small every node is feasible and this is the plug-in
    figure's first-order value; where it dominates, the truths the clamps cut away (a negative
    variance, a count below 1) no longer count, and the truth is not put at 0 when the
    variance is released as 0. Public: published values and noise parameters only; never
    more than the range [0, W]. Memoised (a cell's figures do not depend on the level)."""
    top = w * w
    value = math.sqrt(float(_variance(c, s, q, w, floor)))
    (xc, pc), (xs, ps), (xq, pq) = (law_nodes(p, _SPREAD_NODES) for p in (count_plan, sum_plan, square_plan))
    n = c - xc[:, None, None]
    big_s = s - xs[None, :, None]
    big_q = q - xq[None, None, :]
    ok_n = n >= 1
    safe_n = np.where(ok_n, n, 1.0)
    m2 = big_q / safe_n + top / 2
    var = m2 - (big_s / safe_n) ** 2
    feasible = ok_n & (np.abs(big_s) <= safe_n * w) & (m2 <= top) & (var >= 0)
    weight = np.where(feasible, pc[:, None, None] * ps[None, :, None] * pq[None, None, :], 0.0)
    total = float(weight.sum())
    if total <= 0:  # no feasible truth on the nodes (published values far outside): the range
        far = max(value, w - value)
        return far / 2, far / math.sqrt(3)
    err = value - np.sqrt(np.clip(var, 0.0, top))
    return float(np.sum(weight * np.abs(err)) / total), math.sqrt(float(np.sum(weight * err * err)) / total)


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
            h, sd, expected = shared_sum_accuracy(ps.mechanism, Fraction(ps.scale), ps.grid_unit,
                                                  Fraction(pr.scale), mid, float(alpha))
            h = Fraction(h)
            return cell(v, v - h, v + h, plan=ps, sd=sd, expected=expected)
        (c,) = comps.values()
        p = plans[c]
        v, h = noisy[c], halfwidth(p, alpha)
        return cell(v, v - h, v + h, plan=p, sd=stddev(p), expected=expected_abs(p))

    def finish_columns(self, stat, grids, plans, alpha):
        if len(grids) != 1:  # the sum from the shared row count and the normalised sum
            comps = {c.kind: c for c in grids}
            pr, ps = plans[comps["rows"]], plans[comps["nsum"]]
            mid = stat.clamp.midpoint
            h, sd, expected = shared_sum_accuracy(ps.mechanism, Fraction(ps.scale), ps.grid_unit,
                                                  Fraction(pr.scale), mid, float(alpha))
            return shared_sum_columns(grids[comps["nsum"]], grids[comps["rows"]], ps, pr, mid, Fraction(h),
                                      sd=sd, expected=expected)
        (c,) = grids
        return interval_columns(grids[c], plans[c], alpha, at_least_zero=False)


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
        floor = stat.option("min_count")
        out = mean_cell_accuracy(noisy[nsum], noisy[rows], cl.midpoint, cl.lower, cl.upper,
                                 floor, alpha, mechanism=ps.mechanism,
                                 sum_scale=ps.scale, sum_unit=ps.grid_unit, count_scale=pc.scale)
        expected, rms = mean_error(float(out["value"]), float(noisy[rows]), cl, floor, pc, ps)
        return cell(out["value"], out["ci_low"], out["ci_high"], plan=ps, sd=rms, expected=expected)

    def finish_columns(self, stat, grids, plans, alpha):
        """:meth:`finish` over every cell: the value and interval of
        :func:`~dp_spark.mechanisms.mean.mean_cell_accuracy_columns` (the per-cell Fractions'
        floats, bit for bit), the error figures of :func:`mean_error_columns` (what
        :func:`mean_error` computes for one cell); each cell's own figures, so they are
        columns too."""
        rows, nsum = self.components(stat, rows_shared=True)
        pc, ps = plans[rows], plans[nsum]
        cl = stat.clamp
        floor = stat.option("min_count")
        out = mean_cell_accuracy_columns(grids[nsum], grids[rows], ps.grid_exponent, cl.midpoint, cl.lower, cl.upper,
                                         floor, alpha, mechanism=ps.mechanism, sum_scale=ps.scale,
                                         count_scale=pc.scale)
        if out is None or int(pc.grid_exponent) != 0:
            return None
        expected, rms = mean_error_columns(out["value"], grids[rows].astype(np.float64), cl, floor, pc, ps)
        fixed = cell(0, 0, 0, plan=ps, sd=0.0, expected=0.0)
        for f in ("value", "ci_low", "ci_high", "noise_stddev", "expected_abs_error"):
            del fixed[f]
        return {**out, "noise_stddev": rms, "expected_abs_error": expected, **fixed}


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

    def spread(self, stat, noisy, plans, alpha) -> tuple[float, float, float, tuple]:
        """(variance, lo, hi, key) of one cell: the released variance, its box interval
        (module docstring), and the arguments of :func:`spread_error` and
        :func:`stddev_error` for its figures."""
        rows, nsum, nsq = self.components(stat, rows_shared=True)
        pc, ps, pq = plans[rows], plans[nsum], plans[nsq]
        w = float(stat.clamp.half_width)
        top = w * w
        floor = float(stat.option("min_count"))
        c, s, q = float(noisy[rows]), float(noisy[nsum]), float(noisy[nsq])
        var = float(_variance(c, s, q, w, floor))
        a = joint_alpha(alpha, 3)
        k2, bound = nsq.square_grid
        step = 2.0 ** k2
        lo, hi = variance_box(c, pc.halfwidth_grid(a), s, float(halfwidth(ps, a)), q, float(halfwidth(pq, a)),
                              w, bound * step)
        # the centred squares are rounded to the grid 2^k2: the truth's m2 may sit half a step
        # outside [0, W^2] before its clamp
        lo, hi = max(lo - step / 2, 0.0), min(hi + step / 2, top)
        return var, min(lo, var), max(hi, var), (c, s, q, w, floor, pc, ps, pq)

    def finish(self, stat, noisy, plans, alpha):
        var, lo, hi, key = self.spread(stat, noisy, plans, alpha)
        expected, rms = spread_error(*key)
        return cell(var, lo, hi, plan=key[-1], sd=rms, expected=expected)


@register
class StdDev(Variance):
    kind = "stddev"

    def finish(self, stat, noisy, plans, alpha):
        var, lo, hi, key = self.spread(stat, noisy, plans, alpha)
        expected, rms = stddev_error(*key)
        return cell(math.sqrt(var), math.sqrt(lo), math.sqrt(hi), plan=key[-1], sd=rms, expected=expected)
