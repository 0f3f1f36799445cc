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

from dp_spark.budget import PureDP, ZCDP
from dp_spark.errors import ConfigError, InvalidBoundsError, MeasureMismatchError
from dp_spark.units import Aggregate, ContributionBounds, as_relation, sensitivity

__all__ = [
    "SPLIT_MIN",
    "SPLIT_MAX",
    "optimal_mean_split",
    "mean_split_error",
    "mean_from_noisy",
    "mean_interval",
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


def _variances(f: np.ndarray, sens_s: float, sens_c: float, mechanism: str, total: float):
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
    if not bounds.lower <= a <= bounds.upper:
        raise ConfigError("assumed_mean must lie within [lower, upper]")
    w = bounds.half_width
    d0 = 0.0 if w == 0 else abs(float((a - (bounds.lower + bounds.upper) / 2) / w))
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
      :func:`~dp_spark.units.sensitivity` this is 1/2, except for the Gaussian under
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


def mean_interval_large_count(noisy_norm_sum, noisy_count, midpoint, lower, upper, min_count, *,
                              sum_halfwidth, count_halfwidth) -> Optional[tuple[Fraction, Fraction]]:
    """A calibrated (1 - alpha) interval for the mean when the noisy count is large, else None.

    Method (first-order, documented in docs/accuracy.md): with S the normalised sum and n the
    count of the bounded data, mean - mid = S/n, and the released estimate's error is
    (e_S - (S/n) e_C) / n + O(e_C^2 / n^2). Its (1 - alpha) half-width is taken as
    sqrt(h_S^2 + ((mean~ - mid) h_C)^2) / max(C~, floor), with h_S and h_C the EXACT
    (1 - alpha) half-widths of the sum and count noises (``plan.halfwidth_grid(alpha)`` in real
    units). When one noise dominates this is that noise's exact quantile; for two Gaussian
    noises it is the exact quantile of their sum. It is used only when the count is large
    enough for the ratio to be nearly linear: C~ - h_C >= max(floor, 1) and h_C <= C~ / 10;
    otherwise None is returned and the caller uses the conservative union bound of
    :func:`mean_interval` (valid at every group size). Covers the bounded, clamped truth,
    not the clipping bias.
    """
    s, c, mid, lo_b, hi_b = _mean_inputs(noisy_norm_sum, noisy_count, midpoint, lower, upper)
    h_s = _exact(sum_halfwidth, "sum_halfwidth")
    h_c = _exact(count_halfwidth, "count_halfwidth")
    floor = _floor_value(min_count)
    if c - h_c < max(floor, Fraction(1)) or h_c * 10 > c:
        return None
    point = mean_from_noisy(s, c, mid, lo_b, hi_b, min_count)
    dev = float(point - mid)
    half = math.sqrt(float(h_s) ** 2 + (dev * float(h_c)) ** 2) / float(max(c, floor))
    half_f = Fraction(half)
    lo = min(max(point - half_f, lo_b), hi_b)
    hi = max(min(point + half_f, hi_b), lo_b)
    return lo, hi
