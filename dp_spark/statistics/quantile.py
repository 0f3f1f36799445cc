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

Interval (covers the q-quantile of the bounded, clamped values, min{v: F(v) >= q}): the
noisy distance D_j = C~_j - q T~ at each bin edge e_j has noise
sum_{i<=j} (1 - q) eta_i - sum_{i>j} q eta_i, of standard deviation
s_j = sigma sqrt(j (1-q)^2 + (B-j) q^2). Edge e_j is ruled out as an upper end while
D_j <= h_j and as a lower end while D_j >= -h_j, with h_j the (1 - alpha) two-sided tail of
that noise (:func:`dp_spark.mechanisms.mean.noise_tail_halfwidth`: the normal quantile for
the Gaussian, the Laplace tail, conservative for a sum of Laplace draws, for the Laplace).
The ends are bin edges, so the interval is at least one bin wide and conservative by up to
the discretisation; the coverage test measures it.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import Field

from dp_spark.mechanisms.mean import noise_tail_halfwidth
from dp_spark.spec.types import int_type, number_type
from dp_spark.statistics.base import StatisticKind, register
from dp_spark.statistics.components import Component
from dp_spark.statistics.moments import GroupSizeOptions
from dp_spark.statistics.noise import cell, stddev

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


def quantile_interval(hist: list, q: float, lower: float, upper: float, halfwidths: list) -> tuple[float, float]:
    """(lo, hi) by test inversion at the bin edges (see the module docstring); ``halfwidths[j]``
    is h_j for edge j = 0..B."""
    b = len(hist)
    width = (upper - lower) / b
    total = float(sum(hist))
    cum = [0.0]
    for h in hist:
        cum.append(cum[-1] + float(h))
    d = [cum[j] - q * total for j in range(b + 1)]
    lo_j = max((j for j in range(b + 1) if d[j] < -halfwidths[j]), default=0)
    hi_j = min((j for j in range(b + 1) if d[j] > halfwidths[j]), default=b)
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
        sigma = stddev(plan)
        sds = [sigma * math.sqrt(j * (1 - q) ** 2 + (b - j) * q * q) for j in range(b + 1)]
        hws = [noise_tail_halfwidth(s, float(alpha), plan.mechanism) for s in sds]
        value = quantile_from_histogram(hist, q, lower, upper)
        lo, hi = quantile_interval(hist, q, lower, upper, hws)
        lo, hi = min(lo, value), max(hi, value)
        # first order: the rank noise at the estimate over the local noisy density
        width = (upper - lower) / b
        j = min(int((value - lower) / width), b - 1) if width > 0 else 0
        density = max(hist[j], 1.0) / width if width > 0 else 1.0
        sd_value = min(sds[j] / density, upper - lower)
        return cell(value, lo, hi, plan=plan, sd=sd_value, expected=math.sqrt(2 / math.pi) * sd_value)
