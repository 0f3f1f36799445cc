"""Statistic kind ``quantile``: any q in (0, 1) of a clamped value column, per key tuple.

Method: a noisy histogram over B public, equal-width bins of [L, U] (``bins``, default 64),
post-processed into the quantile. Chosen over the exponential mechanism on a candidate grid
because (a) the histogram is ONE noisy component that every quantile of the same column and
bounds shares (median, p90 and p99 cost one histogram), (b) it is a count, so it gets the
exact discrete Laplace / Gaussian samplers, the fixed grid and the zCDP accounting of every
other component (the exponential mechanism is pure DP only and needs its own sampler), and
(c) its error is explicit, which gives an honest interval. This is the "noisy histogram,
then CDF inversion" estimator used by e.g. Tumult's and PipelineDP's quantile trees with one
level; see also Smith, "Privacy-preserving statistical estimation with optimal convergence
rates" (STOC 2011) and Gillenwater, Joseph, Kulesza, "Differentially private quantiles"
(ICML 2021) for the comparison of methods.

Privacy contract: the ``hist`` component (per cell, B counts); a unit's rows in one cell
fall in its bins with total <= Linf', so the (cell, bin) vector of one unit has L1 <=
min(K, L0' Linf') and L2^2 <= min(K^2, L0' Linf'^2): the row count's sensitivity.

Estimate: with noisy bin counts h~_j and cumulative C~_j = h~_1 + ... + h~_j, T~ = C~_B,
the first bin j with C~_j >= q T~, linearly interpolated inside it.

Interval (covers the q-quantile of the bounded, clamped values, t = min{v: F(v) >= q}): with
C_j the true count below bin edge e_j and T the true total, t lies in [e_lo*, e_hi*) where
lo* = max{j: C_j < q T} and hi* = lo* + 1. The noisy distance D~_j = C~_j - q T~ at edge j has
the noise N_j = (1 - q) sum_{i<j} eta_i - q sum_{i>=j} eta_i. The interval [e_lo, e_hi] takes
hi = the first interior edge (1 <= j <= B - 1) with D~_j > h_j (else B) and lo = the last
interior edge with D~_j < -h_j (else 0). It misses t only if hi < hi* -- some j < hi* with
D_j < 0 had N_j > h_j -- or lo > lo* -- some j > lo* with D_j >= 0 had N_j < -h_j: each
interior edge can fail in ONE direction only, so by the union bound over the B - 1 edges
tested at once the miss probability is at most sum_j P(N_j > h_j) <= alpha when
h_j is the one-sided (alpha / (B - 1)) tail of N_j (:func:`dp_spark.mechanisms.accuracy.
edge_halfwidths`: N_j's exact law by convolution, or a Chernoff bound for large noise
scales). Before, each edge was tested at the full level separately (0.26 at a nominal 0.5 in a
cell of 10 units). Conservative: the union bound, and the ends being bin edges, make the
coverage above the level (the coverage table in docs/accuracy.md).

Error figures (``expected_abs_error``, ``noise_stddev`` as a root-mean-square): the
estimator's error at a plug-in truth, by simulation. The released noisy histogram is taken as
the truth, the estimator is re-run on it plus each of 2,048 fixed draws of the bins' noise
(:func:`dp_spark.statistics.noise.law_draws`: a public quadrature set, the exact discrete
law), and the figures are the mean absolute and root-mean-square differences from its value
there. The same draws serve every cell, so their own Monte Carlo error does not average out
over cells: with 256 draws it put the figures 10-15% high for the 90th percentile in cells
of 200 and 1,000 units (2,048: within 10%; about 1 ms a cell). The first-passage behaviour
of the CDF inversion on a noisy cumulative (it crosses q T~ early when the noise dominates)
is in it, which no local first-order formula has (the old local-density figure
under-reported the error 2-7x at 20 units). An estimate, not a bound:
in cells where the noise dominates the histogram the plug-in truth is itself mostly noise.
The value stays in [L, U], and so does the figure.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
from pydantic import Field

from dp_spark.mechanisms.accuracy import edge_halfwidths
from dp_spark.core.fields import int_type, number_type
from dp_spark.statistics.base import StatisticKind, register
from dp_spark.statistics.components import Component
from dp_spark.statistics.moments import GroupSizeOptions
from dp_spark.statistics.noise import cell, law_draws

DEFAULT_BINS = 64
MAX_BINS = 1024


class QuantileOptions(GroupSizeOptions):
    """Options of a quantile."""

    q: number_type(gt=0, lt=1, what="a number strictly between 0 and 1", strings=False) = Field(  # type: ignore
        description="the quantile, in (0, 1)")
    bins: int_type(2, MAX_BINS) = Field(  # type: ignore[valid-type]
        DEFAULT_BINS, description=f"number of public equal-width bins of [lower, upper] (at most {MAX_BINS})")


def quantile_from_histogram(hist: list, q: float, lower: float, upper: float) -> float:
    """The CDF-inversion estimate of the q-quantile from (noisy) bin counts over [lower, upper]."""
    b = len(hist)
    width = (upper - lower) / b
    total = float(sum(hist))
    if total <= 0:
        return (lower + upper) / 2
    target = q * total
    cum = 0.0
    for j, h in enumerate(hist):
        h = float(h)
        if cum + h >= target:
            frac = 0.5 if h <= 0 else min(max((target - cum) / h, 0.0), 1.0)
            return lower + (j + frac) * width
        cum += h
    return upper


def edge_thresholds(plan, bins: int, q, alpha) -> tuple[float, ...]:
    """h_0 .. h_B of :func:`quantile_interval` at level 1 - ``alpha``: the one-sided
    alpha / (B - 1) tail of each interior edge's noise (union bound over the B - 1 edges
    tested at once), infinite at the two outer edges (not tested). Real units (counts)."""
    return _edge_thresholds(plan.mechanism, plan.scale, plan.grid_exponent, bins, float(q), float(alpha))


@functools.lru_cache(maxsize=256)
def _edge_thresholds(mechanism: str, scale, grid_exponent: int, bins: int, q: float, alpha: float):
    inner = edge_halfwidths(mechanism, scale, bins, q, alpha / (bins - 1))
    unit = 2.0 ** grid_exponent
    return (math.inf,) + tuple(h * unit for h in inner) + (math.inf,)


def quantile_estimates(hists: np.ndarray, q: float, lower: float, upper: float) -> np.ndarray:
    """:func:`quantile_from_histogram` of each row of ``hists`` (vectorised)."""
    hists = np.asarray(hists, dtype=np.float64)
    rows, b = hists.shape
    cum = np.cumsum(hists, axis=1)
    total = cum[:, -1]
    target = q * total
    reached = cum >= target[:, None]
    j = np.where(reached.any(axis=1), reached.argmax(axis=1), b - 1)
    h = hists[np.arange(rows), j]
    before = cum[np.arange(rows), j] - h
    safe = np.where(h > 0, h, 1.0)
    frac = np.where(h > 0, np.clip((target - before) / safe, 0.0, 1.0), 0.5)
    out = lower + (j + frac) * (upper - lower) / b
    out = np.where(reached.any(axis=1), out, upper)
    return np.where(total > 0, out, (lower + upper) / 2)


#: releases simulated per cell for the quantile's error figures (a fixed quadrature set, shared
#: by every cell: 256 left a shared error of 10-15%, module docstring)
ERROR_DRAWS = 2048


@functools.lru_cache(maxsize=256)
def quantile_error(hist: tuple, q: float, lower: float, upper: float, plan) -> tuple[float, float]:
    """(E|error|, root-mean-square error) of the quantile estimate at the plug-in histogram
    ``hist`` (module docstring): the estimator re-run on ``hist`` plus each of
    :data:`ERROR_DRAWS` fixed draws of the bins' noise (:func:`dp_spark.statistics.noise.
    law_draws`), against its value on ``hist``. Memoised (a cell's figures do not depend on
    the level)."""
    h = np.asarray(hist, dtype=np.float64)
    draws = law_draws(plan, ERROR_DRAWS, len(h))
    here = quantile_estimates(h[None, :], q, lower, upper)[0]
    err = quantile_estimates(h[None, :] + draws, q, lower, upper) - here
    return float(np.mean(np.abs(err))), math.sqrt(float(np.mean(err * err)))


def quantile_interval(hist: list, q: float, lower: float, upper: float, halfwidths: list) -> tuple[float, float]:
    """(lo, hi) by test inversion at the bin edges (see the module docstring); ``halfwidths[j]``
    is h_j for edge j = 0..B (math.inf: the edge is not tested; the two outer edges are the
    defaults, never tested)."""
    b = len(hist)
    width = (upper - lower) / b
    cum = np.concatenate([[0.0], np.cumsum(np.asarray(hist, dtype=np.float64))])
    d = cum - q * cum[-1]
    h = np.asarray(halfwidths, dtype=np.float64)
    below, above = np.flatnonzero(d < -h), np.flatnonzero(d > h)
    lo_j = int(below[-1]) if below.size else 0
    hi_j = int(above[0]) if above.size else b
    lo_j, hi_j = min(lo_j, hi_j), max(lo_j, hi_j)  # crossed only when the noise left its bounds
    return lower + lo_j * width, lower + hi_j * width


@register
class Quantile(StatisticKind):
    kind = "quantile"
    needs_value = True
    options = QuantileOptions

    def components(self, stat, *, rows_shared):
        return (Component("hist", stat.clamp, bins=stat.option("bins")),)

    def error_coefficients(self, stat, comps):
        n, q, b = stat.option("assumed_group_size"), float(stat.option("q")), stat.option("bins")
        # the rank error at the quantile: B q (1 - q) bins' noise, relative to n rows
        return {comps[0]: b * q * (1 - q) / (n * n)}

    def finish(self, stat, noisy, plans, alpha) -> dict[str, Any]:
        (c,) = noisy
        plan = plans[c]
        hist = [float(v) for v in noisy[c]]
        b, q = len(hist), float(stat.option("q"))
        lower, upper = float(stat.clamp.lower), float(stat.clamp.upper)
        value = quantile_from_histogram(hist, q, lower, upper)
        lo, hi = quantile_interval(hist, q, lower, upper, edge_thresholds(plan, b, stat.option("q"), alpha))
        lo, hi = min(lo, value), max(hi, value)
        expected, rms = quantile_error(tuple(hist), q, lower, upper, plan)
        return cell(value, lo, hi, plan=plan, sd=rms, expected=expected)
