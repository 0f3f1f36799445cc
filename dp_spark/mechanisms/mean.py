"""The DP mean: a noisy normalised sum over a noisy count, the count floored.

Privacy contract. Per released cell the mean uses two noised statistics over the same
bounded rows (K rows per unit, L0 partitions per unit, values clamped to [L, U]):

* the NORMALISED SUM  S = sum(x - mid), mid = (L + U) / 2, |x - mid| <= W = (U - L) / 2;
* the ROW COUNT       C.

Their budget shares add up to the release's budget (sequential composition). Everything
below is post-processing of the two noisy values: the true count is never used, and the
split between the two statistics depends on public parameters only (bounds, relation,
budget, an *assumed* group size), never on the data.

Why normalise: S has per-row magnitude W instead of M = max(|L|, |U|) (smaller noise when
[L, U] is far from 0), and the error that count noise causes is proportional to the mean's
distance from the midpoint (at most W) instead of to the mean itself.

Nothing here imports pyspark.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache
from numbers import Integral
from statistics import NormalDist
from typing import Optional, Union

import numpy as np

from dp_spark.core.budget import PureDP, ZCDP
from dp_spark.core.grid import EXACT_INT, dyadic
from dp_spark.errors import ConfigError, InvalidBoundsError, MeasureMismatchError
from dp_spark.core.units import Aggregate, ContributionBounds, as_relation, sensitivity

__all__ = [
    "SPLIT_MIN",
    "SPLIT_MAX",
    "optimal_mean_split",
    "mean_split_error",
    "mean_from_noisy",
    "mean_interval",
    "mean_interval_large_count",
    "mean_error_quantile",
    "mean_error_quantiles",
    "mean_expected_abs_error",
    "mean_cell_accuracy",
    "noise_tail_halfwidth",
]

LAPLACE = "discrete_laplace"
GAUSSIAN = "discrete_gaussian"
SPLIT_MIN = Fraction(5, 100)
SPLIT_MAX = Fraction(95, 100)
_COUNT_POINTS = 601
_SUM_POINTS = 241
_DEVIATIONS = (0.0, 0.25, 0.5, 0.75, 1.0)  # |mean - mid| / W


def _check_mechanism(mechanism: str) -> None:
    if mechanism not in (LAPLACE, GAUSSIAN):
        raise ConfigError(f"unknown mechanism; expected one of {[LAPLACE, GAUSSIAN]}")


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1")
    return int(value)


def _noise_inputs(bounds: ContributionBounds, relation, mechanism: str) -> tuple[float, float, float]:
    """(sum sensitivity, count sensitivity, W^2) in the measure's norm (L1 or L2^2)."""
    if not bounds.has_values:
        raise InvalidBoundsError("a mean needs lower and upper clamp bounds")
    s = sensitivity(Aggregate.NORMALISED_SUM, bounds, relation)
    c = sensitivity(Aggregate.ROW_COUNT, bounds, relation)
    w2 = float(bounds.half_width) ** 2
    if mechanism == LAPLACE:
        return float(s.l1), float(c.l1), w2
    return float(s.l2_squared), float(c.l2_squared), w2


def _variances(f: float, sens_s: float, sens_c: float, mechanism: str, total: float) -> tuple[float, float]:
    """Noise variances of the sum and the count for budget shares f and 1 - f."""
    if mechanism == LAPLACE:  # scale t = Delta_1 / epsilon_share, variance 2 t^2
        var_s = 2.0 * (sens_s / (f * total)) ** 2
        var_c = 2.0 * (sens_c / ((1.0 - f) * total)) ** 2
    else:  # sigma^2 = Delta_2^2 / (2 rho_share)
        var_s = sens_s / (2.0 * f * total)
        var_c = sens_c / (2.0 * (1.0 - f) * total)
    return var_s, var_c


def _count_noise(var_c: float, mechanism: str) -> tuple[np.ndarray, np.ndarray]:
    """Support points and probabilities of the count noise (integers; coarser when wide)."""
    sd = math.sqrt(var_c)
    half = int(math.ceil(14 * sd)) + 2
    step = max(1, int(math.ceil(2 * half / (_COUNT_POINTS - 1))))
    x = np.arange(-half, half + 1, step, dtype=float)
    if mechanism == LAPLACE:
        logw = -np.abs(x) * (math.sqrt(2.0) / sd)
    else:
        logw = -(x * x) / (2.0 * var_c)
    w = np.exp(logw - logw.max())
    return x, w / w.sum()


def _sum_noise(var_s: float, mechanism: str) -> tuple[np.ndarray, np.ndarray]:
    """Quadrature points and weights of the (fine-grid, so continuous) sum noise."""
    sd = math.sqrt(var_s)
    x = np.linspace(-14 * sd, 14 * sd, _SUM_POINTS)
    if mechanism == LAPLACE:
        logw = -np.abs(x) * (math.sqrt(2.0) / sd)
    else:
        logw = -(x * x) / (2.0 * var_s)
    w = np.exp(logw - logw.max())
    return x, w / w.sum()


def mean_split_error(split: Fraction, bounds: ContributionBounds, relation, assumed_group_size: int,
                     mechanism: str, budget: Union[PureDP, ZCDP], min_count: int = 1,
                     assumed_mean=None) -> float:
    """Model of the mean's worst-case expected squared error for a given ``split``.

    ``split`` of the budget goes to the normalised sum, the rest to the count. With n the
    assumed group size, d = mean - mid the true mean's distance from the midpoint, e_S and
    e_C the independent zero-mean noises and C~ = max(n + e_C, min_count), the released
    centred mean is clamp((n d + e_S) / C~, -W, W), so

        err(f, d) = E[ (clamp((n d + e_S) / C~, -W, W) - d)^2 ]
        model(f)  = max over d in {0, W/4, W/2, 3W/4, W} of err(f, d)

    (with a public ``assumed_mean`` a: err(f, a - mid) instead)

    (err is symmetric in d). The expectation is a sum over the count noise's integer
    distribution and a quadrature over the sum noise, the floor and the clamp included,
    so it holds for small groups too. For large n it tends to the delta method,
    Var(S)/n^2 + d^2 Var(C)/n^2, largest at |d| = W.
    """
    _check_mechanism(mechanism)
    n = _positive_int(assumed_group_size, "assumed_group_size")
    m = _positive_int(min_count, "min_count")
    sens_s, sens_c, w2 = _noise_inputs(bounds, as_relation(relation), mechanism)
    total = _budget_value(budget, mechanism)
    f = float(split)
    if not 0 < f < 1:
        raise ConfigError("a mean split must be in (0, 1)")
    if w2 == 0:
        return 0.0
    return _model_error(f, sens_s, sens_c, w2, n, m, mechanism, total, _deviations(bounds, assumed_mean))


def _budget_value(budget, mechanism: str) -> float:
    if mechanism == LAPLACE:
        if not isinstance(budget, PureDP):
            raise MeasureMismatchError("a discrete_laplace mean needs a PureDP budget")
        return float(budget.epsilon)
    if not isinstance(budget, ZCDP):
        raise MeasureMismatchError("a discrete_gaussian mean needs a ZCDP budget")
    return float(budget.rho)


def _deviations(bounds: ContributionBounds, assumed_mean) -> tuple[float, ...]:
    """The |mean - mid| / W at which the split's error is evaluated (the worst case is taken):
    the whole range [0, 1] by default; with a public ``assumed_mean``, that mean alone."""
    if assumed_mean is None:
        return _DEVIATIONS
    a = _exact(assumed_mean, "assumed_mean")
    lower, upper = bounds.clamp
    if not lower <= a <= upper:
        raise ConfigError("assumed_mean must lie within [lower, upper]")
    w = bounds.half_width
    d0 = 0.0 if w == 0 else abs(float((a - (lower + upper) / 2) / w))
    return (min(d0, 1.0),)


def _model_error(f: float, sens_s, sens_c, w2, n, m, mechanism, total, deviations=_DEVIATIONS) -> float:
    var_s, var_c = _variances(f, sens_s, sens_c, mechanism, total)
    xc, pc = _count_noise(var_c, mechanism)
    xs, ps = _sum_noise(var_s / w2, mechanism)  # the sum noise in units of W
    c = np.maximum(n + xc, m)[:, None]
    weights = pc[:, None] * ps[None, :]
    worst = 0.0
    for d in deviations:
        est = np.clip((n * d + xs[None, :]) / c, -1.0, 1.0)
        worst = max(worst, float(np.sum(weights * (est - d) ** 2)))
    return worst * w2


def _first_order_split(sens_s: float, sens_c: float, w2: float, mechanism: str) -> float:
    """Minimiser of the delta method Var(S) + W^2 Var(C) (independent of n and the budget)."""
    if mechanism == LAPLACE:  # minimise s^2/f^2 + W^2 c^2/(1-f)^2: f/(1-f) = (s/(W c))^(2/3)
        ratio = (sens_s / math.sqrt(w2 * sens_c * sens_c)) ** (2.0 / 3.0)
    else:  # minimise s2/f + W^2 c2/(1-f): f/(1-f) = sqrt(s2 / (W^2 c2))
        ratio = math.sqrt(sens_s / (w2 * sens_c))
    return ratio / (1.0 + ratio)


def _snap(f: float) -> Fraction:
    frac = Fraction(round(f * 100), 100)
    return min(max(frac, SPLIT_MIN), SPLIT_MAX)


@lru_cache(maxsize=1024)
def _optimal_split_cached(bounds, relation, n, mechanism, budget, min_count, deviations=_DEVIATIONS) -> Fraction:
    sens_s, sens_c, w2 = _noise_inputs(bounds, relation, mechanism)
    if w2 == 0 or sens_s == 0:
        return Fraction(1, 2)
    if budget is None:
        return _snap(_first_order_split(sens_s, sens_c, w2, mechanism))
    total = _budget_value(budget, mechanism)
    memo: dict[Fraction, float] = {}

    def err(f: Fraction) -> float:
        if f not in memo:
            memo[f] = _model_error(float(f), sens_s, sens_c, w2, n, min_count, mechanism, total, deviations)
        return memo[f]

    def best_of(cands) -> Fraction:
        low = min(err(f) for f in cands)
        # ties (a flat optimum): prefer the split nearest 1/2
        return min((f for f in cands if err(f) <= low * (1 + 1e-9)), key=lambda f: abs(f - Fraction(1, 2)))

    coarse = best_of([Fraction(k, 20) for k in range(1, 20)])
    fine = [Fraction(k, 100) for k in range(5, 96) if abs(Fraction(k, 100) - coarse) <= Fraction(5, 100)]
    return best_of(fine)


def optimal_mean_split(bounds: ContributionBounds, relation, assumed_group_size: int, mechanism: str,
                       *, budget: Optional[Union[PureDP, ZCDP]] = None, min_count: int = 1,
                       assumed_mean=None) -> Fraction:
    """Share of the mean's budget (epsilon for Laplace, rho for Gaussian) given to the
    normalised sum; the count gets the rest. A simple Fraction k/100 in [0.05, 0.95].

    Privacy contract: depends on public parameters only (bounds, relation, mechanism, an
    assumed group size, the budget), so it costs nothing and leaks nothing.

    * With ``budget`` (recommended): a 1-D search (k/20, then k/100 within 0.05 of the best)
      minimising :func:`mean_split_error`, the worst-case (over the true mean in [L, U])
      expected squared error of the clamped, floored estimator for groups of
      ``assumed_group_size`` rows. For large groups it tends to the delta-method optimum;
      for small groups (noisy count and sum) it departs from 1/2 (tested: it beats 50/50).
      With a public ``assumed_mean`` the error is minimised at that mean instead of at the
      worst case over the whole range: the split follows where the mean is (far from the
      midpoint count noise matters more; near it, less). Public, so still free; a wrong
      assumption costs accuracy only (the optimum is flat near its minimum).
    * Without ``budget``: the closed-form minimiser of the delta method
      Var(S)/n^2 + W^2 Var(C)/n^2, with Var ~ Delta_1^2/eps^2 (Laplace) or Delta_2^2/rho
      (Gaussian): f/(1-f) = (Delta_S / (W Delta_C))^(2/3) (Laplace) or
      sqrt(Delta_S^2 / (W^2 Delta_C^2)) (Gaussian); n cancels. With the sensitivities of
      :func:`~dp_spark.core.units.sensitivity` this is 1/2, except for the Gaussian under
      replace_unit (the signed sum's l2^2 is 4x, the count's 2x): sqrt(2)/(1+sqrt(2)) ~ 0.59.
    """
    _check_mechanism(mechanism)
    n = _positive_int(assumed_group_size, "assumed_group_size")
    m = _positive_int(min_count, "min_count")
    if not isinstance(bounds, ContributionBounds):
        raise InvalidBoundsError("bounds must be ContributionBounds")
    if budget is not None:
        _budget_value(budget, mechanism)
    devs = _deviations(bounds, assumed_mean) if bounds.has_values else _DEVIATIONS
    if budget is None and assumed_mean is not None:
        raise ConfigError("an assumed_mean is used by the budget-aware split: pass budget")
    return _optimal_split_cached(bounds, as_relation(relation), n, mechanism, budget, m, devs)


# --- post-processing ----------------------------------------------------------------------
def _exact(value, name: str) -> Fraction:
    if type(value) is Fraction:  # immutable: itself (the per-cell post-processing passes these)
        return value
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a number")
    if isinstance(value, (Fraction, Integral)):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"{name} must be finite")
        return Fraction(value)
    raise ConfigError(f"{name} must be a number")


def _floor_value(min_count) -> Fraction:
    m = _exact(min_count, "min_count")
    if m <= 0:
        raise ConfigError("min_count must be > 0")
    return m


def _mean_inputs(noisy_norm_sum, noisy_count, midpoint, lower, upper):
    """Exact (s, c, mid, lower, upper) of a mean's noisy inputs and public bounds, checked."""
    s = _exact(noisy_norm_sum, "noisy_norm_sum")
    c = _exact(noisy_count, "noisy_count")
    mid = _exact(midpoint, "midpoint")
    lo = _exact(lower, "lower")
    hi = _exact(upper, "upper")
    if lo > hi:
        raise InvalidBoundsError("lower clamp bound is above the upper clamp bound")
    return s, c, mid, lo, hi


def mean_from_noisy(noisy_norm_sum, noisy_count, midpoint, lower, upper, min_count) -> Fraction:
    """``midpoint + noisy_norm_sum / max(noisy_count, min_count)``, clamped to [lower, upper].

    Post-processing of the two noisy statistics (exact Fractions). Never the true count.
    """
    s, c, mid, lo, hi = _mean_inputs(noisy_norm_sum, noisy_count, midpoint, lower, upper)
    m = _floor_value(min_count)
    value = mid + s / max(c, m)
    return min(max(value, lo), hi)


def noise_tail_halfwidth(stddev: float, alpha: float, mechanism: Optional[str] = None) -> float:
    """h with P(|noise| > h) <= alpha, from the noise's standard deviation.

    * ``discrete_laplace``: the Laplace tail, h = (sd / sqrt 2) ln(1 / alpha);
    * ``discrete_gaussian``: the normal quantile, h = sd z_{1 - alpha/2};
    * None (mechanism unknown): the larger of the two.

    For the discrete mechanisms these are checked numerically in the tests; when the exact
    integer half-widths are at hand (``accuracy.noise_halfwidth``) pass those instead.
    """
    if not (0 < alpha < 1):
        raise ConfigError("alpha must be in (0, 1)")
    sd = float(stddev)
    if not math.isfinite(sd) or sd < 0:
        raise ConfigError("a noise standard deviation must be finite and >= 0")
    lap = sd / math.sqrt(2.0) * math.log(1.0 / alpha)
    gau = sd * NormalDist().inv_cdf(1.0 - alpha / 2.0)
    if mechanism == LAPLACE:
        return lap
    if mechanism == GAUSSIAN:
        return gau
    if mechanism is None:
        return max(lap, gau)
    raise ConfigError(f"unknown mechanism; expected one of {[LAPLACE, GAUSSIAN]}")


def mean_interval(noisy_norm_sum, noisy_count, sum_stddev, count_stddev, midpoint, lower, upper,
                  min_count, alpha, *, mechanism: Optional[str] = None,
                  sum_halfwidth=None, count_halfwidth=None) -> tuple[Fraction, Fraction]:
    """A (1 - alpha) interval for the mean, by a union bound on the two noises.

    Method: with probability >= 1 - alpha/2 each (so >= 1 - alpha jointly),
    S in [S~ - h_S, S~ + h_S] and n in [C~ - h_C, C~ + h_C]; on that event the true
    centred mean S/n lies between the extreme ratios over that box (with n an integer
    >= 1), so the interval is [mid + min s/c, mid + max s/c], clamped to [lower, upper] and
    widened to contain the point estimate. h_S, h_C are ``sum_halfwidth`` /
    ``count_halfwidth`` when given (exact, e.g. ``plan.halfwidth_grid(alpha/2)`` in real
    units), else :func:`noise_tail_halfwidth` of the standard deviations at alpha/2.

    What it covers: the mean of the *bounded, clamped* data (K rows per unit, values
    clamped to [L, U], on the fixed-point grid) of a non-empty group. It does not cover
    the clipping bias (the distance between that and the mean of the raw data), which the
    evaluation measures separately. It is conservative, valid for every group size (no
    normal approximation of a ratio).
    """
    if not (0 < float(alpha) < 1):
        raise ConfigError("alpha must be in (0, 1)")
    s, c, mid, lo_b, hi_b = _mean_inputs(noisy_norm_sum, noisy_count, midpoint, lower, upper)
    point = mean_from_noisy(s, c, mid, lo_b, hi_b, min_count)
    a = float(alpha) / 2.0
    h_s = _exact(sum_halfwidth, "sum_halfwidth") if sum_halfwidth is not None else \
        Fraction(noise_tail_halfwidth(sum_stddev, a, mechanism))
    h_c = _exact(count_halfwidth, "count_halfwidth") if count_halfwidth is not None else \
        Fraction(noise_tail_halfwidth(count_stddev, a, mechanism))
    if h_s < 0 or h_c < 0:
        raise ConfigError("half-widths must be >= 0")
    s_lo, s_hi = s - h_s, s + h_s
    c_lo = max(Fraction(math.ceil(c - h_c)), Fraction(1))
    c_hi = Fraction(math.floor(c + h_c))
    if c_hi < c_lo:  # no integer count >= 1 is consistent: no information
        lo, hi = lo_b, hi_b
    else:
        d_min = s_lo / c_hi if s_lo >= 0 else s_lo / c_lo
        d_max = s_hi / c_lo if s_hi >= 0 else s_hi / c_hi
        lo = min(max(mid + d_min, lo_b), hi_b)
        hi = max(min(mid + d_max, hi_b), lo_b)
    return min(lo, point), max(hi, point)


# --- the exact law of the mean's linearised error ----------------------------------------
# With S and n the bounded data's normalised sum and count, d = S/n = mean - mid, and
# C~ = n + e_C >= floor, the released centred mean is (S + u X_S) / C~, so its error is
#
#     mean~ - mean = (u X_S - d X_C) / C~          (exactly, before the clamp)
#
# with X_S, X_C the two independent integer noises (grid units) and u = 2^k the sum's grid.
# Z = u X_S - d X_C has a known law for known d: the functions below compute its quantiles and
# E|Z| exactly from the two pmfs (the count's enumerated, the sum's through its closed-form or
# summed CDF). Nothing here reads data: d and C~ are the released (noisy) values.
_COUNT_SUPPORT_MAX = 400_001
_GUARD_ALPHA = 0.05  # the large-count regime is checked at this level or the release's, the smaller


def _law_inputs(mechanism: str, sum_scale, sum_unit, count_scale) -> tuple[str, float, float, float]:
    from dp_spark.mechanisms import accuracy

    _check_mechanism(mechanism)
    t_s = accuracy._scale_float(sum_scale, "sum_scale")
    t_c = accuracy._scale_float(count_scale, "count_scale")
    u = float(_exact(sum_unit, "sum_unit"))
    if not (u > 0 and math.isfinite(u)):
        raise ConfigError("sum_unit must be > 0")
    return mechanism, t_s, u, t_c


@lru_cache(maxsize=64)
def _count_law(mechanism: str, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Support (c >= 0 only, the law is symmetric) and P(|X_C| = c) of the count noise.

    Truncated where the remaining mass is below 1e-13 (Laplace: 32 scales; Gaussian: 13
    sigmas); coarsened (lumped at a step) only beyond 400,000 support points."""
    from dp_spark.mechanisms import accuracy

    half = int(math.ceil((32.0 if mechanism == LAPLACE else 13.0) * scale)) + 2
    step = max(1, int(math.ceil((half + 1) / _COUNT_SUPPORT_MAX)))
    x = np.arange(0, half + 1, step, dtype=np.float64)
    pmf = accuracy.discrete_laplace_pmf if mechanism == LAPLACE else accuracy.discrete_gaussian_pmf
    p = pmf(scale, x) * step
    p[1:] *= 2.0  # +c and -c
    if step > 1:
        p /= p.sum()
    return x, p


def _sum_cdf(mechanism: str, scale: float, j: np.ndarray) -> np.ndarray:
    """P(X_S <= j) for integer-valued arrays j (grid units), from the exact law."""
    from dp_spark.mechanisms import accuracy

    j = np.asarray(j, dtype=np.float64)
    if mechanism == LAPLACE:
        # P(X <= j) = 1 - a^(j+1)/(1+a) for j >= 0, a^(-j)/(1+a) for j < 0; a = e^(-1/t)
        one_plus_a = 1.0 + math.exp(-1.0 / scale)
        upper = -np.expm1(-(np.abs(j) + 1.0) / scale) + np.exp(-(np.abs(j) + 1.0) / scale) * (1 - 1 / one_plus_a)
        # 1 - a^(j+1)/(1+a) = (1 - a^(j+1)) + a^(j+1) (1 - 1/(1+a))
        lower = np.exp(-np.abs(j) / scale) / one_plus_a
        return np.where(j >= 0, upper, lower)
    if scale <= accuracy._DIRECT_MAX_SIGMA:
        d = accuracy._get_direct(scale)
        suffix = np.append(d.suffix, 0.0)  # suffix[i] = sum_{x >= i} f(x), 0 beyond the top
        idx_hi = np.clip(np.abs(j) + 1, 0, len(suffix) - 1).astype(np.int64)
        idx_lo = np.clip(np.abs(j), 0, len(suffix) - 1).astype(np.int64)
        return np.where(j >= 0, 1.0 - suffix[idx_hi] / d.z, suffix[idx_lo] / d.z)
    from scipy import special

    # sigma > 4096: the midpoint rule is exact to ~1e-9 relative (Euler-Maclaurin)
    return special.ndtr((j + 0.5) / scale)


def _linear_coverage(h: np.ndarray, d: np.ndarray, mechanism: str, t_s: float, u: float, t_c: float) -> np.ndarray:
    """P(|u X_S - d X_C| <= h) for each (h, d) of two equal-length vectors. Each cell's sum over
    the count's support is one row of a C-ordered array reduced along that row (numpy's pairwise
    summation of a contiguous row: its order depends on the row's length only), so a cell's
    coverage has the same bits whichever cells it is computed with."""
    c, p = _count_law(mechanism, t_c)
    shift = d[:, None] * c[None, :]
    hi = np.floor((shift + h[:, None]) / u)
    lo = np.ceil((shift - h[:, None]) / u) - 1.0
    inside = _sum_cdf(mechanism, t_s, hi) - _sum_cdf(mechanism, t_s, lo)
    return np.add.reduce(np.clip(inside, 0.0, 1.0) * p[None, :], axis=1)


#: cells x count-support points per block of the vectorised bisection (memory: ~8 arrays of this)
_QUANTILE_BLOCK = 1 << 18


def mean_error_quantile(alpha, deviation, *, mechanism: str, sum_scale, sum_unit, count_scale) -> float:
    """The smallest h with P(|u X_S - d X_C| <= h) >= 1 - alpha (real units of the sum).

    ``deviation`` d = mean - mid, ``sum_scale`` / ``count_scale`` the noises' parameters in
    grid units (Laplace scale t or Gaussian sigma), ``sum_unit`` u = 2^k. Exact up to the
    bisection's 1e-7 relative tolerance (from above): the count noise enumerated, the sum
    noise's CDF exact (closed form for the Laplace; the Gaussian's summed pmf, or its
    midpoint rule above sigma = 4096). At d = 0 it is u times the sum's exact half-width.
    One cell of :func:`mean_error_quantiles` (the one implementation).
    """
    d = float(deviation)
    if not math.isfinite(d):
        raise ConfigError("deviation must be finite")
    return float(mean_error_quantiles(alpha, np.array([d]), mechanism=mechanism, sum_scale=sum_scale,
                                      sum_unit=sum_unit, count_scale=count_scale)[0])


def mean_error_quantiles(alpha, deviations, *, mechanism: str, sum_scale, sum_unit, count_scale) -> np.ndarray:
    """:func:`mean_error_quantile` for every d of the vector ``deviations`` at once: each cell
    runs the same bisection (the same start, the same doublings, the same midpoints, stopping
    at the same relative tolerance) as it would alone, the cells still running stepped
    together, in blocks of :data:`_QUANTILE_BLOCK` cells x support points. A cell's result does
    not depend on the other cells (:func:`_linear_coverage`)."""
    a = float(alpha)
    if not (0 < a < 1):
        raise ConfigError("alpha must be in (0, 1)")
    mech, t_s, u, t_c = _law_inputs(mechanism, sum_scale, sum_unit, count_scale)
    d_all = np.abs(np.asarray(deviations, dtype=np.float64).reshape(-1))
    if not bool(np.all(np.isfinite(d_all))):
        raise ConfigError("deviation must be finite")
    from dp_spark.mechanisms import accuracy

    target = 1.0 - a
    h_s, h_c = accuracy.noise_halfwidth(mech, t_s, a / 2), accuracy.noise_halfwidth(mech, t_c, a / 2)
    out = np.empty(d_all.size, dtype=np.float64)
    block = max(1, _QUANTILE_BLOCK // len(_count_law(mech, t_c)[0]))
    for start in range(0, d_all.size, block):
        d = d_all[start:start + block]
        zero = _linear_coverage(np.zeros_like(d), d, mech, t_s, u, t_c) >= target
        # union bound: each noise within its alpha/2 half-width covers with >= 1 - alpha
        hi = np.maximum(u * h_s + d * h_c, u)
        lo = np.zeros_like(d)
        todo = np.flatnonzero(~zero)
        while todo.size:  # float safety
            low = _linear_coverage(hi[todo], d[todo], mech, t_s, u, t_c) < target
            todo = todo[low]
            hi[todo] *= 2.0
        todo = np.flatnonzero(~zero & (hi - lo > 1e-7 * hi))
        while todo.size:
            mid = (lo[todo] + hi[todo]) / 2.0
            ok = _linear_coverage(mid, d[todo], mech, t_s, u, t_c) >= target
            hi[todo] = np.where(ok, mid, hi[todo])
            lo[todo] = np.where(ok, lo[todo], mid)
            todo = todo[hi[todo] - lo[todo] > 1e-7 * hi[todo]]
        out[start:start + d.size] = np.where(zero, 0.0, hi)
    return out


def _mean_abs_deviation(mechanism: str, scale: float, m: np.ndarray) -> np.ndarray:
    """E|X_S - m| (grid units) for arrays m >= 0: exact for the discrete Laplace; for the
    discrete Gaussian the normal formula at its exact sd (the convention of the release
    table's sqrt(2/pi) sd)."""
    from dp_spark.mechanisms import accuracy

    m = np.asarray(m, dtype=np.float64)
    if mechanism == LAPLACE:
        # E|X - m| = m + 2 a^(j+1) ((1 - f)(1 - a) + a) / ((1 + a)(1 - a)), j = floor m, f = m - j
        a = math.exp(-1.0 / scale)
        one_minus_a = -math.expm1(-1.0 / scale)
        j = np.floor(m)
        f = m - j
        return m + 2.0 * np.exp(-(j + 1.0) / scale) * ((1.0 - f) * one_minus_a + a) / ((1.0 + a) * one_minus_a)
    from scipy import special

    sd = accuracy.discrete_gaussian_stddev(scale)
    return sd * math.sqrt(2.0 / math.pi) * np.exp(-(m * m) / (2.0 * sd * sd)) + m * (1.0 - 2.0 * special.ndtr(-m / sd))


def mean_expected_abs_error(deviation, noisy_count, min_count, *, mechanism: str, sum_scale, sum_unit,
                            count_scale) -> float:
    """The mean's expected absolute error, both noises included (first order).

    mean~ - mean = (u X_S - d X_C) / C~ with d = mean - mid (see above), so
    E|error| ~ E|u X_S - d X_C| / max(C~, floor), with d = ``deviation`` (the released
    mean minus the midpoint: public) and C~ = ``noisy_count``. E|u X_S - d X_C| is summed
    exactly over the count noise's pmf, with E|u X_S - m| in closed form (discrete
    Laplace) or the normal formula at the exact sd (discrete Gaussian). At d = 0 it is the
    sum's E|noise| over the count, the count noise's term vanishing; far from the midpoint
    the count noise's term |d| E|X_C| / C~ dominates. Pure (no data, no pyspark).
    """
    mech, t_s, u, t_c = _law_inputs(mechanism, sum_scale, sum_unit, count_scale)
    d = abs(float(deviation))
    if not math.isfinite(d):
        raise ConfigError("deviation must be finite")
    denom = max(float(_exact(noisy_count, "noisy_count")), float(_floor_value(min_count)))
    c, p = _count_law(mech, t_c)
    e_abs = u * float(np.dot(p, _mean_abs_deviation(mech, t_s, d * c / u)))
    return e_abs / denom


def mean_interval_large_count(noisy_norm_sum, noisy_count, midpoint, lower, upper, min_count, *,
                              alpha, mechanism: str, sum_scale, sum_unit, count_scale,
                              ) -> Optional[tuple[Fraction, Fraction]]:
    """A calibrated (1 - alpha) interval for the mean when the noisy count is large, else None.

    Method (docs/accuracy.md): with S the normalised sum and n the count of the bounded data,
    d = S/n = mean - mid and C~ = n + e_C, the released estimate's error is exactly
    (u X_S - d X_C) / C~ while C~ >= floor (before the clamp, which never moves the estimate
    away from a truth inside [L, U]). Its (1 - alpha) half-width is q / C~ with q the EXACT
    (1 - alpha) quantile of |u X_S - d X_C| (:func:`mean_error_quantile`), d taken at the
    released mean (the one approximation: d is estimated). This holds at every confidence
    level, whatever the two noises' relative sizes (the root-sum-square of the two
    half-widths it replaces under-covered two comparable Laplace noises below 90%).

    Used only when the count is large enough for the estimated d to be close to the true
    one: C~ - h_C >= max(floor, 1) and h_C <= C~ / 10, h_C the count noise's exact
    half-width at min(alpha, 0.05); otherwise None is returned and the caller uses the
    conservative union bound of :func:`mean_interval` (valid at every group size). Covers
    the bounded, clamped truth, not the clipping bias.
    """
    from dp_spark.mechanisms import accuracy

    s, c, mid, lo_b, hi_b = _mean_inputs(noisy_norm_sum, noisy_count, midpoint, lower, upper)
    mech, t_s, u, t_c = _law_inputs(mechanism, sum_scale, sum_unit, count_scale)
    a = float(alpha)
    if not (0 < a < 1):
        raise ConfigError("alpha must be in (0, 1)")
    h_c = Fraction(accuracy.noise_halfwidth(mech, t_c, min(a, _GUARD_ALPHA)))
    floor = _floor_value(min_count)
    if c - h_c < max(floor, Fraction(1)) or h_c * 10 > c:
        return None
    point = mean_from_noisy(s, c, mid, lo_b, hi_b, min_count)
    q = mean_error_quantile(a, point - mid, mechanism=mech, sum_scale=sum_scale, sum_unit=sum_unit,
                            count_scale=count_scale)
    half_f = Fraction(q) / max(c, floor)
    lo = min(max(point - half_f, lo_b), hi_b)
    hi = max(min(point + half_f, hi_b), lo_b)
    return lo, hi


def mean_cell_accuracy(noisy_norm_sum, noisy_count, midpoint, lower, upper, min_count, alpha, *,
                       mechanism: str, sum_scale, sum_unit, count_scale) -> dict:
    """The value and interval a release publishes for one mean cell, from its two noisy values
    and the public noise laws: ``value``, ``ci_low``, ``ci_high`` (Fractions). The mean kind's
    ``finish`` (:mod:`dp_spark.statistics.moments`, which the epsilon explorer runs too, so the
    explorer predicts exactly what is published) calls this; its error figures are the plug-in
    ones of ``moments.mean_error`` (both noises, the floor and the clamp).

    The interval is :func:`mean_interval_large_count` when the count is large, else the union
    bound :func:`mean_interval` with the exact alpha/2 half-widths of the two noises.
    """
    from dp_spark.mechanisms import accuracy

    s, c, mid, lo_b, hi_b = _mean_inputs(noisy_norm_sum, noisy_count, midpoint, lower, upper)
    mech = _law_inputs(mechanism, sum_scale, sum_unit, count_scale)[0]
    a = float(alpha)
    value = mean_from_noisy(s, c, mid, lo_b, hi_b, min_count)
    interval = mean_interval_large_count(s, c, mid, lo_b, hi_b, min_count, alpha=a, mechanism=mech,
                                         sum_scale=sum_scale, sum_unit=sum_unit, count_scale=count_scale)
    if interval is None:
        unit = _exact(sum_unit, "sum_unit")
        interval = mean_interval(  # the exact half-widths given: no standard deviation is read
            s, c, None, None, mid, lo_b, hi_b, min_count, a, mechanism=mech,
            sum_halfwidth=accuracy.noise_halfwidth(mech, sum_scale, a / 2) * unit,
            count_halfwidth=Fraction(accuracy.noise_halfwidth(mech, count_scale, a / 2)))
    return {"value": value, "ci_low": interval[0], "ci_high": interval[1]}


# --- the same, over a vector of cells ------------------------------------------------------
def _ratio_floats(num, den, e: int, low: int, high: int) -> np.ndarray:
    """float(clamp(num / den, low, high) 2^e) per cell, each correctly rounded as the exact
    Fraction's float is: ``num`` (integers), ``den`` (integers >= 1), ``low`` <= ``high``
    integers, all in units of 2^e. int64 numpy vectors when every numerator and denominator is
    below 2^53 (one IEEE division of exact operands is correctly rounded, and the power of two
    is exact), else
    Python integers (int / int is correctly rounded at any size). The clamp commutes with the
    rounding: the bounds are exact and rounding is monotone. NaN where ``den`` <= 0 (cells the
    caller replaces)."""
    num, den = np.asarray(num, dtype=object if isinstance(num, list) else None), np.asarray(den)
    if num.dtype == np.int64 and den.dtype == np.int64 and (num.size == 0 or (
            int(np.abs(num).max()) < EXACT_INT and int(den.max()) < EXACT_INT)):
        with np.errstate(divide="ignore", invalid="ignore"):  # den 0: a cell the caller replaces
            q = np.ldexp(num.astype(np.float64) / den.astype(np.float64), e)
        return np.clip(q, math.ldexp(low, e), math.ldexp(high, e))
    scale = 1 << -e if e < 0 else None
    out = []
    for n_, d_ in zip(num.tolist(), den.tolist()):
        n_, d_ = int(n_), int(d_)
        if d_ <= 0:  # a cell the caller replaces
            out.append(math.nan)
            continue
        n_ = min(max(n_, low * d_), high * d_)
        out.append(n_ / (d_ * scale) if scale else (n_ << e) / d_)
    return np.array(out, dtype=np.float64)


def mean_cell_accuracy_columns(grid_sum, grid_count, sum_exponent: int, midpoint, lower, upper, min_count,
                               alpha, *, mechanism: str, sum_scale, count_scale) -> Optional[dict]:
    """:func:`mean_cell_accuracy` over every cell at once: ``grid_sum`` and ``grid_count`` the
    noisy normalised sums (grid units 2^``sum_exponent``) and noisy counts (integers), int64
    vectors. Returns ``value``, ``ci_low`` and ``ci_high`` as float64 vectors equal, bit for
    bit, to the floats of the per-cell Fractions (tests/unit/test_mean_columns.py): every
    quantity is a ratio of integers in units of one power of two, rounded once
    (:func:`_ratio_floats`), and the large-count half-width is the same bisection
    (:func:`mean_error_quantiles`). None (the caller's per-cell path) for a midpoint or bounds
    that are not dyadic rationals, a fractional floor, or vectors that are not int64."""
    from dp_spark.mechanisms import accuracy

    mech = _law_inputs(mechanism, sum_scale, Fraction(2) ** int(sum_exponent), count_scale)[0]
    a = float(alpha)
    if not (0 < a < 1):
        raise ConfigError("alpha must be in (0, 1)")
    s = np.asarray(grid_sum)
    c = np.asarray(grid_count)
    maybe = [dyadic(x) for x in (midpoint, lower, upper)]
    parts = [x for x in maybe if x is not None]
    floor = _floor_value(min_count)
    if (len(parts) != 3 or s.dtype != np.int64 or c.dtype != np.int64 or floor.denominator != 1
            or _exact(lower, "lower") > _exact(upper, "upper") or s.shape != c.shape):
        return None
    if s.size and max(int(np.abs(s).max()), int(np.abs(c).max())) >= 2**62:
        return None
    k = int(sum_exponent)
    e = min(k, *(p[1] for p in parts))
    mid, lo_b, hi_b = (m << (x - e) for m, x in parts)
    shift = k - e
    flo = int(floor)
    n = np.maximum(c, flo)
    h_s = int(accuracy.noise_halfwidth(mech, sum_scale, a / 2)) << shift
    h_c = int(accuracy.noise_halfwidth(mech, count_scale, a / 2))
    wide = bool(s.size) and ((int(np.abs(s).max()) << shift) + h_s + abs(mid) * (int(n.max()) + h_c)) >= 2**62

    def scaled(v):  # grid integers -> units of 2^e (Python ints when int64 could overflow)
        return [int(x) << shift for x in v.tolist()] if wide else v << shift

    def plus_mid(num, den):  # mid + num/den, over den (units of 2^e)
        if wide:
            return [x + mid * int(y) for x, y in zip(num, den.tolist())]
        return num + mid * den

    s_e = scaled(s)
    point_num = plus_mid(s_e, n)
    value = _ratio_floats(point_num, n, e, lo_b, hi_b)
    # the union bound (mean_interval) at the noises' exact alpha/2 half-widths
    c_lo = np.maximum(c - h_c, 1)
    c_hi = c + h_c
    if wide:
        s_lo = [x - h_s for x in s_e]
        s_hi = [x + h_s for x in s_e]
        den_min = np.array([up if x >= 0 else dn for x, up, dn in zip(s_lo, c_hi.tolist(), c_lo.tolist())], dtype=np.int64)
        den_max = np.array([dn if x >= 0 else up for x, up, dn in zip(s_hi, c_hi.tolist(), c_lo.tolist())], dtype=np.int64)
    else:
        s_lo, s_hi = s_e - h_s, s_e + h_s
        den_min = np.where(s_lo >= 0, c_hi, c_lo)
        den_max = np.where(s_hi >= 0, c_lo, c_hi)
    lo = _ratio_floats(plus_mid(s_lo, den_min), den_min, e, lo_b, hi_b)
    hi = _ratio_floats(plus_mid(s_hi, den_max), den_max, e, lo_b, hi_b)
    none = c_hi < c_lo  # no integer count >= 1 is consistent: the bounds
    lo = np.where(none, math.ldexp(lo_b, e), lo)
    hi = np.where(none, math.ldexp(hi_b, e), hi)
    lo, hi = np.minimum(lo, value), np.maximum(hi, value)
    # the large-count interval (mean_interval_large_count) where the count is large
    g = int(accuracy.noise_halfwidth(mech, count_scale, min(a, _GUARD_ALPHA)))
    large = np.flatnonzero((c - g >= max(flo, 1)) & (g * 10 <= c))
    if large.size:
        p_num = [point_num[i] for i in large.tolist()] if wide else point_num[large].tolist()
        n_l = n[large].tolist()
        p_num = [min(max(int(x), lo_b * y), hi_b * y) for x, y in zip(p_num, n_l)]  # the clamped point
        dev = _ratio_floats([x - mid * y for x, y in zip(p_num, n_l)], n[large], e, lo_b - mid, hi_b - mid)
        q = mean_error_quantiles(a, dev, mechanism=mech, sum_scale=sum_scale, sum_unit=Fraction(2) ** k,
                                 count_scale=count_scale)
        low_f, high_f = math.ldexp(lo_b, e), math.ldexp(hi_b, e)
        for i, pn, y, qq in zip(large.tolist(), p_num, n_l, q.tolist()):
            qn, qd = qq.as_integer_ratio()  # qd a power of two
            # point -/+ q / n = (pn qd 2^e -/+ qn) / (qd n), over (qd n 2^-e) when e < 0
            if e < 0:
                top, den, qn_e = pn * qd, (qd * y) << -e, qn << -e
            else:
                top, den, qn_e = (pn << e) * qd, qd * y, qn
            lo[i] = min(max((top - qn_e) / den, low_f), high_f)
            hi[i] = max(min((top + qn_e) / den, high_f), low_f)
    return {"value": value, "ci_low": lo, "ci_high": hi}
