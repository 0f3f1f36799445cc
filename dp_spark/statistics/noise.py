"""Shared post-processing helpers of the statistic kinds: intervals and expected errors of
noisy components (exact noise quantiles from :mod:`dp_spark.mechanisms.accuracy`), and the
noises' discretised laws on which the error of a non-linear, clamped estimate is computed at a
plug-in truth (:func:`law_nodes`).

Nothing here imports pyspark.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import Any, Optional

import numpy as np

from dp_spark.core.grid import EXACT_INT, dyadic


def halfwidth(plan, alpha: Fraction) -> Fraction:
    """Exact (1 - alpha) half-width of one entry's noise, real units."""
    return Fraction(plan.halfwidth_grid(alpha)) * plan.grid_unit


def stddev(plan) -> float:
    """Standard deviation of one entry's noise, real units."""
    return float(plan.stddev_grid) * float(plan.grid_unit)


def expected_abs(plan) -> float:
    """E|noise| of one entry, real units: the exact mean for the discrete Laplace
    (2 q / (1 - q^2), q = e^(-1/t)), sqrt(2/pi) sd for the discrete Gaussian."""
    if plan.mechanism == "discrete_laplace":
        q = math.exp(-1 / float(plan.scale))
        return 2 * q / (1 - q * q) * float(plan.grid_unit)
    return math.sqrt(2 / math.pi) * stddev(plan)


def joint_alpha(alpha, parts: int) -> float:
    """The level alpha_c of each of ``parts`` independent noises such that all of them are
    within their exact (1 - alpha_c) half-widths with probability (1 - alpha_c)^parts =
    1 - alpha exactly (independence: no union bound needed)."""
    return -math.expm1(math.log1p(-float(alpha)) / parts)


# --- the law of one entry's noise, discretised ---------------------------------------------
_LAW_TAIL = 1e-9  # mass beyond the discretised support (dropped, the rest renormalised)
_EXACT_SUPPORT = 20_000  # integer supports up to this size are enumerated exactly


def law_nodes(plan, points: int = 80) -> tuple[np.ndarray, np.ndarray]:
    """(values, probabilities) of one entry's noise in real units, on at most ``points`` + 1
    nodes: the exact integer pmf when its support (tail mass 1e-9 left out) has that few
    values; else ``points`` / 2 cells of equal width on each side of 0 (the last one taking
    the tail), each with its exact mass and its conditional mean as node, so that E|noise| is
    kept exactly (the pmf's cells when the support has at most 20,000 values, 0 its own atom;
    else the continuous law of the same scale, Laplace(t) or Normal(sigma), equal to the
    discrete one to 1e-7 relative at those scales). Cached per (mechanism, scale, grid)."""
    return _law_nodes(plan.mechanism, Fraction(plan.scale), int(plan.grid_exponent), int(points))


@functools.lru_cache(maxsize=256)
def _law_nodes(mechanism: str, scale: Fraction, grid_exponent: int, points: int):
    from dp_spark.mechanisms import accuracy

    unit = 2.0 ** grid_exponent
    k = accuracy.noise_halfwidth(mechanism, scale, _LAW_TAIL)
    half = max(1, points // 2)
    if 2 * k + 1 <= _EXACT_SUPPORT:
        pmf = accuracy.discrete_laplace_pmf if mechanism == "discrete_laplace" else accuracy.discrete_gaussian_pmf
        x = np.arange(1, k + 1, dtype=np.float64)  # the positive side; the law is symmetric
        p = np.asarray(pmf(scale, x), dtype=np.float64)
        zero = float(pmf(scale, 0))
        if k > half:  # lump into `half` cells of equal width
            cell = np.minimum(((x - 1) * half / k).astype(np.int64), half - 1)
            mass = np.bincount(cell, weights=p, minlength=half)
            first = np.bincount(cell, weights=p * x, minlength=half)
            keep = mass > 0
            x, p = first[keep] / mass[keep], mass[keep]
        xs = np.concatenate([-x[::-1], [0.0], x])
        ps = np.concatenate([p[::-1], [zero], p])
        return xs * unit, ps / ps.sum()
    return continuous_nodes(mechanism, float(scale), float(k), half, unit)


def continuous_nodes(mechanism: str, scale: float, reach: float, half: int, unit: float = 1.0):
    """The continuous Laplace(scale) (``discrete_laplace``) or Normal(0, scale^2) law on
    2 ``half`` nodes: cells [i w, (i + 1) w), w = ``reach`` / ``half``, on each side of 0, the
    last unbounded, each with its exact mass and conditional mean (E|X| kept exactly)."""
    t = float(scale)
    edges = np.arange(half, dtype=np.float64) * (float(reach) / half)
    if mechanism == "discrete_laplace":
        tail_mass = 0.5 * np.exp(-edges / t)  # P(X > z)
        tail_first = 0.5 * (edges + t) * np.exp(-edges / t)  # E[X 1{X > z}]
    else:
        from scipy import special

        tail_mass = special.ndtr(-edges / t)
        tail_first = t * np.exp(-edges * edges / (2 * t * t)) / math.sqrt(2 * math.pi)
    mass = np.append(tail_mass[:-1] - tail_mass[1:], tail_mass[-1])
    first = np.append(tail_first[:-1] - tail_first[1:], tail_first[-1])
    keep = mass > 0
    x, p = first[keep] / mass[keep], mass[keep]
    xs = np.concatenate([-x[::-1], x])
    ps = np.concatenate([p[::-1], p])
    return xs * unit, ps / ps.sum()


_DRAWS_SEED = 20261205  # public and fixed: the draws below are a quadrature rule, not noise


def law_draws(plan, rows: int, columns: int) -> np.ndarray:
    """A fixed, public ``rows`` x ``columns`` array of draws from one entry's noise law (real
    units): the exact discrete quantile function (continuous Laplace / Normal of the same
    scale beyond 20,000 support points) at uniforms from a seeded generator. A Monte Carlo
    quadrature rule for error figures that have no closed form (the quantile's); it never
    touches a released value, so it is no noise source. Cached."""
    return _law_draws(plan.mechanism, Fraction(plan.scale), int(plan.grid_exponent), rows, columns)


@functools.lru_cache(maxsize=32)
def _law_draws(mechanism: str, scale: Fraction, grid_exponent: int, rows: int, columns: int) -> np.ndarray:
    from scipy import special

    from dp_spark.mechanisms import accuracy

    u = np.random.default_rng(_DRAWS_SEED).random((rows, columns))
    k = accuracy.noise_halfwidth(mechanism, scale, _LAW_TAIL)
    t = float(scale)
    if 2 * k + 1 <= _EXACT_SUPPORT:
        pmf = accuracy.discrete_laplace_pmf if mechanism == "discrete_laplace" else accuracy.discrete_gaussian_pmf
        x = np.arange(-k, k + 1, dtype=np.float64)
        cdf = np.cumsum(pmf(scale, x))
        draws = x[np.minimum(np.searchsorted(cdf, u * cdf[-1]), len(x) - 1)]
    elif mechanism == "discrete_laplace":
        draws = -t * np.sign(u - 0.5) * np.log1p(-2 * np.abs(u - 0.5))
    else:
        draws = t * special.ndtri(u)
    out = draws * 2.0 ** grid_exponent
    out.setflags(write=False)
    return out


def plan_fields(plan) -> dict[str, Any]:
    """The fields of :func:`cell` that depend on the plan only (mechanism, noise_scale, grid):
    what a vectorised finish returns once for every cell."""
    return {"mechanism": plan.mechanism, "noise_scale": float(plan.scale * plan.grid_unit),
            "grid": float(plan.grid_unit)}


def cell(value, lo, hi, *, plan, sd: float, expected: float) -> dict[str, Any]:
    return {"value": float(value), "ci_low": float(lo), "ci_high": float(hi), "noise_stddev": float(sd),
            "expected_abs_error": float(expected), **plan_fields(plan)}


def count_cell(noisy: Fraction, plan, alpha: Fraction) -> dict[str, Any]:
    """A noisy count: clamped at 0 (post-processing), exact noise interval. The error figures
    are the noise's (public noise parameters, so a suppressed count may keep them): the clamp
    at 0 only makes the published count's error smaller, never larger."""
    h = halfwidth(plan, alpha)
    v = Fraction(noisy)
    zero = Fraction(0)
    return cell(max(v, zero), max(v - h, zero), max(v + h, zero), plan=plan, sd=stddev(plan),
                expected=expected_abs(plan))


def interval_columns(grid, plan, alpha: Fraction, *, at_least_zero: bool) -> Optional[dict[str, Any]]:
    """Vectorised :func:`count_cell` (``at_least_zero``) or the plain interval of a one-component
    sum: the noisy grid integers ``grid`` (numpy), value and exact (1 - alpha) noise interval
    as float64 vectors, the noise's figures once. Each float is an integer below 2^53 times a
    power of two, so it equals the per-cell Fraction's float exactly; None (per-cell path)
    for an ``object`` vector or values that large."""
    h = int(plan.halfwidth_grid(alpha))
    k = int(plan.grid_exponent)
    if grid.dtype != np.int64 or k < -900:
        return None
    if grid.size and (int(grid.max()) + h >= EXACT_INT or int(grid.min()) - h <= -EXACT_INT):
        return None
    v, lo, hi = grid, grid - h, grid + h
    if at_least_zero:
        v, lo, hi = np.maximum(v, 0), np.maximum(lo, 0), np.maximum(hi, 0)
    out: dict[str, Any] = {f: np.ldexp(x.astype(np.float64), k) for f, x in (("value", v), ("ci_low", lo), ("ci_high", hi))}
    return {**out, "noise_stddev": float(stddev(plan)), "expected_abs_error": float(expected_abs(plan)),
            **plan_fields(plan)}


def shared_sum_columns(grid_sum, grid_rows, plan_sum, plan_rows, mid: Fraction, h: Fraction, *,
                       sd: float, expected: float) -> Optional[dict[str, Any]]:
    """Vectorised value and interval of a sum released from the normalised sum and the shared
    row count, v = S~ u_S + mid C~ u_C, [v - h, v + h] (``Sum.finish``), equal to the per-cell
    Fraction's floats bit for bit: every term is a dyadic rational, so each is ONE Python
    integer numerator over a common power of two 2^-e (exact, any size) and its float the
    correctly rounded quotient (Python's int / int), with no Fraction per cell. None (per-cell
    path) for a midpoint or half-width that is not dyadic (a spec's bounds are snapped to the
    grid: only a direct call has one)."""
    m, h_ = dyadic(mid), dyadic(h)
    if m is None or h_ is None:
        return None
    k_s, k_r = int(plan_sum.grid_exponent), int(plan_rows.grid_exponent)
    e = min(k_s, k_r + m[1], h_[1], 0)
    a, b = k_s - e, k_r + m[1] - e  # shifts >= 0 of the two terms onto 2^e
    hh, den, mm = h_[0] << (h_[1] - e), 1 << -e, m[0] << b
    v = [(int(s) << a) + mm * int(r) for s, r in zip(grid_sum.tolist(), grid_rows.tolist())]
    out: dict[str, Any] = {f: np.array([(x + d) / den for x in v], dtype=np.float64)
                           for f, d in (("value", 0), ("ci_low", -hh), ("ci_high", hh))}
    return {**out, "noise_stddev": float(sd), "expected_abs_error": float(expected), **plan_fields(plan_sum)}
