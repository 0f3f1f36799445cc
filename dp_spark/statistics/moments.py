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
(:func:`dp_spark.statistics.noise.law_nodes`; the sum over every combination of nodes in closed
form along the last noise, :func:`clamped_line_error`): every floor and clamp of the estimator is in
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
                                      plan_fields, shared_sum_columns, stddev)

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
    two integers around the stationary point n = 2 S^2 / Q. One cell of
    :func:`variance_box_columns`."""
    lo, hi = variance_box_columns(np.array([float(c)]), h_c, np.array([float(s)]), h_s, np.array([float(q)]), h_q,
                                  w, e)
    return float(lo[0]), float(hi[0])


def variance_box_columns(c: np.ndarray, h_c: int, s: np.ndarray, h_s: float, q: np.ndarray, h_q: float, w: float,
                         e: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`variance_box` for float64 vectors ``c``, ``s``, ``q`` (one cell each; the
    half-widths and bounds shared): the candidates n (the two ends, and the integers around
    the stationary point where it exists, else an end again) evaluated at once."""
    c, s, q = (np.asarray(x, dtype=np.float64) for x in (c, s, q))
    s_lo, s_hi, q_lo, q_hi = s - h_s, s + h_s, q - h_q, q + h_q
    top = w * w
    n_lo = np.maximum.reduce([np.ceil(c - h_c), np.ones_like(c), np.ceil(np.maximum(np.maximum(s_lo, -s_hi), 0.0) / w),
                              np.ceil(np.maximum(np.maximum(q_lo, -q_hi), 0.0) / e)])
    n_hi = np.floor(c + h_c)
    empty = n_hi < n_lo
    n_hi = np.where(empty, n_lo, n_hi)  # (any n: replaced by the whole range below)
    near = np.minimum(np.maximum(0.0, s_lo), s_hi)
    far = np.maximum(np.abs(s_lo), np.abs(s_hi))

    def var(n, qq, ss):
        return qq / n + top / 2 - (ss / n) * (ss / n)

    inner = (near != 0) & (q_hi > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        m = np.where(inner, 2 * near * near / np.where(inner, q_hi, 1.0), n_lo)
    ends = [n_lo, n_hi, np.minimum(np.maximum(np.floor(m), n_lo), n_hi), np.minimum(np.maximum(np.ceil(m), n_lo), n_hi)]
    hi = np.maximum.reduce([var(n, q_hi, near) for n in ends])
    lo = np.minimum(var(n_lo, q_lo, far), var(n_hi, q_lo, far))
    lo, hi = np.clip(lo, 0.0, top), np.clip(hi, 0.0, top)
    return np.where(empty, 0.0, lo), np.where(empty, top, hi)


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
    rounding (tests/unit/test_mean_columns.py). Each cell's sum over the count's nodes is
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


def _prefix(law) -> tuple:
    """What :func:`clamped_line_error` needs of one discretised law (nodes sorted): the nodes,
    the mass before each index (``p_before``), from each index on (``p_from``), and the parts
    ``start`` and ``end`` of :func:`_ranges`, for the mass and the first and second moments at
    once. A range's sum is taken from the sums of the end it is nearer to: a tail's mass or
    moment is never the difference of two sums of nearly all the law."""
    ys, ps = law
    centre = int(np.searchsorted(ys, 0.0))
    w = np.stack([ps, ps * ys, ps * ys * ys], axis=1)
    before = np.concatenate([np.zeros((1, 3)), np.cumsum(w, axis=0)])  # sum over [0, k)
    after = np.concatenate([np.cumsum(w[::-1], axis=0)[::-1], np.zeros((1, 3))])  # sum over [k, K)
    k = np.arange(len(ys) + 1)[:, None]
    start = np.where(k >= centre, after, -before)
    # end[j, 0]: the sum before j (from the left when j is left of the centre, else the whole
    # minus the tail from j); end[j, 1]: minus the tail from j
    end = np.stack([np.where(k <= centre, before, before[-1] - after), -after], axis=1).reshape(-1, 3)
    return ys, centre, before[:, 0], after[:, 0], start, end


def _ranges(prefix, i, j) -> np.ndarray:
    """(mass, first moment, second moment) of the nodes [i, j) (i <= j, index arrays), last
    axis: a range right of the centre is the difference of the two tails from i and from j, any
    other the sum before j minus the sum before i (each from its nearer end)."""
    _, centre, _, _, start, end = prefix
    return np.take(start, i, axis=0) + np.take(end, 2 * j + (i >= centre), axis=0)


def clamped_line_error(prefix, b, d, y_lo, y_hi, y_0, c_lo, c_hi) -> tuple[np.ndarray, np.ndarray]:
    """(sum p |e(y)|, sum p e(y)^2) over the nodes y (probabilities p) of one law, ``prefix`` from
    :func:`_prefix`, for an error that is a clamped line in that noise: e(y) = ``c_lo`` for
    y <= ``y_lo``, ``c_hi`` for y >= ``y_hi``, b + y / d in between (continuous at both ends),
    changing sign at ``y_0`` (arrays broadcast together, one result per element). Three binary
    searches and the law's cumulative mass and moments: O(log nodes) per element instead of a
    sum over the nodes."""
    ys, _, p_before, p_from, _, _ = prefix
    shape = np.broadcast_shapes(np.shape(b), np.shape(d), np.shape(y_lo), np.shape(y_hi), np.shape(y_0))

    def find(y, side):
        return np.searchsorted(ys, np.broadcast_to(y, shape).ravel(), side=side).reshape(shape)

    i_lo = find(y_lo, "right")
    i_hi = np.maximum(find(y_hi, "left"), i_lo)
    i_0 = np.clip(find(y_0, "left"), i_lo, i_hi)
    below, above = np.abs(c_lo), np.abs(c_hi)
    p_lo, p_hi = p_before[i_lo], p_from[i_hi]  # the masses where the error is clamped
    r_neg, r_pos = _ranges(prefix, i_lo, i_0), _ranges(prefix, i_0, i_hi)
    p_neg, y_neg, p_pos, y_pos = r_neg[..., 0], r_neg[..., 1], r_pos[..., 0], r_pos[..., 1]
    neg = np.maximum(-(b * p_neg + y_neg / d), 0.0)
    pos = np.maximum(b * p_pos + y_pos / d, 0.0)
    absolute = below * p_lo + above * p_hi + neg + pos
    # between the clamps, about the nodes' mean mu there: sum p (b + y/d)^2 = P (b + mu/d)^2 + V / d^2
    # (V = sum p (y - mu)^2 >= 0), not b^2 P + 2 b Y / d + Y2 / d^2, whose terms cancel when the
    # error is small against the line's offset b
    p_in, y_in = p_neg + p_pos, y_neg + y_pos
    mu = np.divide(y_in, p_in, out=np.zeros(shape), where=p_in > 0)
    spread = np.maximum(r_neg[..., 2] + r_pos[..., 2] - y_in * mu, 0.0)
    square = below * below * p_lo + above * above * p_hi + p_in * (b + mu / d) ** 2 + spread / (d * d)
    return absolute, square


def _mean_error_block(values, counts, clamp, floor: float, count_law, sum_law):
    mid, lo, hi = float(clamp.midpoint), float(clamp.lower), float(clamp.upper)
    xc, pc = count_law
    v = values[:, None]
    n = np.maximum(counts, floor)[:, None]
    s_hat = (v - mid) * n
    d = np.maximum(n + xc[None, :], floor)  # cells x count nodes
    b = mid + s_hat / d - v  # the error at the sum's noise 0, before the clamps
    abs_j, sq_j = clamped_line_error(_prefix(sum_law), b, d, (lo - mid) * d - s_hat, (hi - mid) * d - s_hat,
                                     (v - mid) * d - s_hat, lo - v, hi - v)
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
    :data:`_SPREAD_NODES` nodes each. One cell of :func:`spread_error_columns`. Memoised: a
    cell's figures do not depend on the level. (The standard deviation's figures:
    :func:`stddev_error`.)"""
    e, r = spread_error_columns(np.array([float(c)]), np.array([float(s)]), np.array([float(q)]), w, floor,
                                count_plan, sum_plan, square_plan)
    return float(e[0]), float(r[0])


#: cells per block of :func:`spread_error_columns` (each cell: count x sum nodes rows)
_SPREAD_BLOCK = 256


def spread_error_columns(c: np.ndarray, s: np.ndarray, q: np.ndarray, w: float, floor: float, count_plan, sum_plan,
                         square_plan) -> tuple[np.ndarray, np.ndarray]:
    """(E|error|, root-mean-square error) of the published variance for each cell (float64
    vectors of the noisy count, normalised sum and sum of centred squares), at the plug-in
    truth over the three noises' discretised laws. For a fixed (count, sum) node the released
    variance is a clamped line in the squares' noise: clamp(m2 - m1^2, 0, W^2) with m2 =
    clamp(Q / N + W^2 / 2, 0, W^2) and m1^2 <= W^2 is clamp(Q / N + W^2 / 2 - m1^2, 0, W^2 -
    m1^2), so the sum over the squares' nodes is :func:`clamped_line_error` (equal to the
    product-grid sum up to rounding, tests/unit/test_spread_columns.py)."""
    c, s, q = (np.asarray(x, dtype=np.float64).reshape(-1) for x in (c, s, q))
    laws = [law_nodes(p, _SPREAD_NODES) for p in (count_plan, sum_plan, square_plan)]
    expected, rms = np.empty(c.size), np.empty(c.size)
    for i in range(0, c.size, _SPREAD_BLOCK):
        part = slice(i, i + _SPREAD_BLOCK)
        expected[part], rms[part] = _spread_error_block(c[part], s[part], q[part], float(w), float(floor), *laws)
    return expected, rms


def _spread_error_block(c, s, q, w: float, floor: float, count_law, sum_law, square_law):
    top = w * w
    n = np.maximum(c, floor)
    m1 = np.minimum(np.maximum(s / n, -w), w)
    m2 = np.minimum(np.maximum(q / n + top / 2, 0.0), top)
    s_hat, q_hat = m1 * n, (m2 - top / 2) * n
    truth = _variance(n, s_hat, q_hat, w, floor)[:, None, None]
    (xc, pc), (xs, ps) = count_law, sum_law
    big_n = np.maximum(n[:, None, None] + xc[None, :, None], floor)  # cells x count nodes x sum nodes
    sq1 = np.clip((s_hat[:, None, None] + xs[None, None, :]) / big_n, -w, w) ** 2
    qn = q_hat[:, None, None]
    base = top / 2 - sq1
    b = qn / big_n + base - truth
    absolute, square = clamped_line_error(_prefix(square_law), b, big_n, -base * big_n - qn, top / 2 * big_n - qn,
                                          (truth - base) * big_n - qn, -truth, top - sq1 - truth)
    weight = (pc[:, None] * ps[None, :]).ravel()[None, :]
    k = c.size
    expected = np.add.reduce(absolute.reshape(k, -1) * weight, axis=1)
    rms = np.sqrt(np.add.reduce(square.reshape(k, -1) * weight, axis=1))
    return expected, rms


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
        if int(pc.grid_exponent) != 0:  # (a count is on the integers)
            return None
        out = mean_cell_accuracy_columns(grids[nsum], grids[rows], ps.grid_exponent, cl.midpoint, cl.lower, cl.upper,
                                         floor, alpha, mechanism=ps.mechanism, sum_scale=ps.scale,
                                         count_scale=pc.scale)
        if out is None:
            return None
        expected, rms = mean_error_columns(out["value"], grids[rows].astype(np.float64), cl, floor, pc, ps)
        return {**out, "noise_stddev": rms, "expected_abs_error": expected, **plan_fields(ps)}


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
        :func:`stddev_error` for its figures. One cell of :meth:`spread_columns`."""
        rows, nsum, nsq = self.components(stat, rows_shared=True)
        c, s, q = float(noisy[rows]), float(noisy[nsum]), float(noisy[nsq])
        var, lo, hi = self.spread_columns(stat, np.array([c]), np.array([s]), np.array([q]), plans, alpha)
        w, floor = float(stat.clamp.half_width), float(stat.option("min_count"))
        return float(var[0]), float(lo[0]), float(hi[0]), (c, s, q, w, floor, plans[rows], plans[nsum], plans[nsq])

    def spread_columns(self, stat, c, s, q, plans, alpha) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(variance, lo, hi) of every cell from the float64 vectors of the noisy count,
        normalised sum and sum of centred squares (real units)."""
        rows, nsum, nsq = self.components(stat, rows_shared=True)
        pc, ps, pq = plans[rows], plans[nsum], plans[nsq]
        w = float(stat.clamp.half_width)
        top = w * w
        floor = float(stat.option("min_count"))
        var = _variance(c, s, q, w, floor)
        a = joint_alpha(alpha, 3)
        k2, bound = nsq.square_grid
        step = 2.0 ** k2
        lo, hi = variance_box_columns(c, pc.halfwidth_grid(a), s, float(halfwidth(ps, a)), q, float(halfwidth(pq, a)),
                                      w, bound * step)
        # the centred squares are rounded to the grid 2^k2: the truth's m2 may sit half a step
        # outside [0, W^2] before its clamp
        lo, hi = np.maximum(lo - step / 2, 0.0), np.minimum(hi + step / 2, top)
        return var, np.minimum(lo, var), np.maximum(hi, var)

    def _columns(self, stat, grids, plans, alpha):
        """(c, s, q, var, lo, hi, fixed fields) of every cell from the grids, or None when a
        grid is not int64 (values beyond it: the per-cell path)."""
        rows, nsum, nsq = self.components(stat, rows_shared=True)
        if any(grids[x].dtype != np.int64 for x in (rows, nsum, nsq)):
            return None
        c, s, q = (np.ldexp(grids[x].astype(np.float64), int(plans[x].grid_exponent)) for x in (rows, nsum, nsq))
        var, lo, hi = self.spread_columns(stat, c, s, q, plans, alpha)
        return c, s, q, var, lo, hi, plan_fields(plans[nsq])

    def finish(self, stat, noisy, plans, alpha):
        var, lo, hi, key = self.spread(stat, noisy, plans, alpha)
        expected, rms = spread_error(*key)
        return cell(var, lo, hi, plan=key[-1], sd=rms, expected=expected)

    def finish_columns(self, stat, grids, plans, alpha):
        """:meth:`finish` over every cell: the same float operations on vectors (the value and the
        box interval, :func:`variance_box_columns`), the figures of :func:`spread_error_columns`."""
        cols = self._columns(stat, grids, plans, alpha)
        if cols is None:
            return None
        c, s, q, var, lo, hi, fixed = cols
        rows, nsum, nsq = self.components(stat, rows_shared=True)
        expected, rms = spread_error_columns(c, s, q, float(stat.clamp.half_width), float(stat.option("min_count")),
                                             plans[rows], plans[nsum], plans[nsq])
        return {"value": var, "ci_low": lo, "ci_high": hi, "noise_stddev": rms, "expected_abs_error": expected, **fixed}


@register
class StdDev(Variance):
    kind = "stddev"

    def finish(self, stat, noisy, plans, alpha):
        var, lo, hi, key = self.spread(stat, noisy, plans, alpha)
        expected, rms = stddev_error(*key)
        return cell(math.sqrt(var), math.sqrt(lo), math.sqrt(hi), plan=key[-1], sd=rms, expected=expected)

    def finish_columns(self, stat, grids, plans, alpha):
        """:meth:`finish` over every cell: value and interval on vectors (IEEE square roots, as
        ``math.sqrt``); the figures of :func:`stddev_error` cell by cell (its weights over the
        truths that can exist have no clamped-line form: about 0.3 ms a cell)."""
        cols = self._columns(stat, grids, plans, alpha)
        if cols is None:
            return None
        c, s, q, var, lo, hi, fixed = cols
        rows, nsum, nsq = self.components(stat, rows_shared=True)
        w, floor = float(stat.clamp.half_width), float(stat.option("min_count"))
        each = stddev_error.__wrapped__  # not memoised: every cell's key is its own
        figures = [each(x, y, z, w, floor, plans[rows], plans[nsum], plans[nsq])
                   for x, y, z in zip(c.tolist(), s.tolist(), q.tolist())]
        expected = np.array([f[0] for f in figures], dtype=np.float64)
        rms = np.array([f[1] for f in figures], dtype=np.float64)
        return {"value": np.sqrt(var), "ci_low": np.sqrt(lo), "ci_high": np.sqrt(hi), "noise_stddev": rms,
                "expected_abs_error": expected, **fixed}
