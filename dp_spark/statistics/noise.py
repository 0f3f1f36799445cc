"""Shared post-processing helpers of the statistic kinds: intervals and expected errors of
noisy components (exact noise quantiles from :mod:`dp_spark.mechanisms.accuracy`).

Nothing here imports pyspark.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any


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


def combined_expected_abs(sds: list[float]) -> float:
    """First-order E|sum of independent noises| with these standard deviations (normal
    approximation of the sum; exact for Gaussian noises)."""
    return math.sqrt(2 / math.pi) * math.sqrt(sum(s * s for s in sds))


def cell(value, lo, hi, *, plan, sd: float, expected: float) -> dict[str, Any]:
    return {"value": float(value), "ci_low": float(lo), "ci_high": float(hi), "mechanism": plan.mechanism,
            "noise_scale": float(plan.scale * plan.grid_unit), "noise_stddev": float(sd),
            "grid": float(plan.grid_unit), "expected_abs_error": float(expected)}


def count_cell(noisy: Fraction, plan, alpha: Fraction) -> dict[str, Any]:
    """A noisy count: clamped at 0 (post-processing), exact noise interval."""
    h = halfwidth(plan, alpha)
    v = Fraction(noisy)
    zero = Fraction(0)
    return cell(max(v, zero), max(v - h, zero), max(v + h, zero), plan=plan, sd=stddev(plan),
                expected=expected_abs(plan))
