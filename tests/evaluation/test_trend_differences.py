"""Day-over-day changes of a discrete Laplace trend: the exact law of the difference, and the
coverage of its intervals at small scales (where the continuous formula under-covered)."""

from __future__ import annotations

import math
import os
from fractions import Fraction

import numpy as np
import pytest

os.environ.setdefault("DP_SPARK_TEST_MODE", "1")

from dp_spark.evaluation import utility  # noqa: E402
from dp_spark.mechanisms import accuracy  # noqa: E402


@pytest.mark.parametrize("t", [0.3, 0.5, 1.0, 2.5, 10.0])
def test_difference_tail_is_the_exact_convolution(t):
    x = np.arange(-60 * int(math.ceil(t)) - 60, 60 * int(math.ceil(t)) + 61)
    p = accuracy.discrete_laplace_pmf(t, x)
    d = np.convolve(p, p)  # the pmf of X1 - X2 on -2X..2X
    k = np.arange(-(len(d) // 2), len(d) // 2 + 1)
    for h in range(0, int(8 * t) + 3):
        brute = float(d[np.abs(k) > h].sum())
        assert math.exp(utility.discrete_laplace_difference_log_tail(t, h)) == pytest.approx(brute, rel=1e-9, abs=1e-300)
    for alpha in (0.5, 0.2, 0.05, 0.01):
        h = utility.discrete_laplace_difference_halfwidth(t, alpha)
        assert float(d[np.abs(k) > h].sum()) <= alpha
        assert h == 0 or float(d[np.abs(k) > h - 1].sum()) > alpha


def test_large_scales_approach_the_continuous_law():
    t = 1e7
    h = utility.discrete_laplace_difference_halfwidth(t, 0.05)
    assert h == pytest.approx(utility._laplace_diff_halfwidth(t, 0.05), rel=1e-6)


def _trend_rows(values, t, confidence):
    sd = accuracy.discrete_laplace_stddev(t)
    return [{"statistic": "distinct_units", "key": f"2026-11-{i + 1:02d}", "value": float(v), "ci_low": 0.0,
             "ci_high": 0.0, "noise_stddev": sd, "noise_scale": float(t), "grid": 1.0,
             "mechanism": "discrete_laplace", "confidence": confidence} for i, v in enumerate(values)]


@pytest.mark.slow
@pytest.mark.parametrize("t", [Fraction(1, 2), Fraction(1), Fraction(3)])
@pytest.mark.parametrize("confidence", [0.8, 0.95])
def test_day_over_day_coverage_at_small_laplace_scales(t, confidence):
    from dp_spark.mechanisms.samplers import SeededNoiseSource

    days, reps = 8, 600  # 4,200 changes per case
    truth = np.array([1000 + 13 * i for i in range(days)])
    src = SeededNoiseSource(4040 + int(t * 10) + int(confidence * 100))
    noise = np.array(src.draw("discrete_laplace", t, days * reps)).reshape(reps, days)
    hits = total = 0
    for r in range(reps):
        diffs = utility.trend_differences(_trend_rows(truth + noise[r], t, confidence))
        for d, true in zip(diffs, np.diff(truth)):
            hits += d["ci_low"] <= true <= d["ci_high"]
            total += 1
    cov = hits / total
    se = math.sqrt(confidence * (1 - confidence) / total)
    print(f"scale {t}, confidence {confidence}: coverage {cov:.4f}")
    assert cov >= confidence - 3 * se, cov
