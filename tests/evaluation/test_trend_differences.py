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


def test_week_over_week_pairs_each_day_with_the_day_a_week_before_and_refuses_a_bad_lag():
    rows = _trend_rows([100 + i for i in range(20)], 1.0, 0.95)
    week = utility.trend_differences(rows, lag=7)
    assert [(d["previous_key"], d["key"]) for d in week][:2] == [("2026-11-01", "2026-11-08"), ("2026-11-02", "2026-11-09")]
    assert len(week) == 13 and all(d["value"] == 7.0 for d in week)
    fam = utility.trend_differences(rows, lag=7, simultaneous=True)
    assert all(f["ci_high"] - f["ci_low"] > w["ci_high"] - w["ci_low"] for f, w in zip(fam, week))
    for bad in (0, -1, 1.5, True):
        with pytest.raises(Exception, match="lag must be"):
            utility.trend_differences(rows, lag=bad)


@pytest.mark.parametrize("lag", [1, 7])
def test_week_over_week_family_wise_coverage(lag):
    """All m - lag changes of a 30-day trend inside their simultaneous intervals together in at
    least 95% of 1,000 seeded trends (a discrete Laplace at scale 2); the per-change intervals
    used for the whole family fail the same check."""
    from dp_spark.mechanisms.samplers import SeededNoiseSource

    days, reps, t = 30, 1000, Fraction(2)
    truth = np.array([1000 + 13 * i for i in range(days)])
    noise = np.array(SeededNoiseSource(77 + lag).draw("discrete_laplace", t, days * reps)).reshape(reps, days)
    together = alone = 0
    for r in range(reps):
        rows = _trend_rows(truth + noise[r], t, 0.95)
        true = truth[lag:] - truth[:-lag]
        for simultaneous in (True, False):
            diffs = utility.trend_differences(rows, lag=lag, simultaneous=simultaneous)
            inside = all(d["ci_low"] <= x <= d["ci_high"] for d, x in zip(diffs, true))
            together += inside and simultaneous
            alone += inside and not simultaneous
    se = math.sqrt(0.95 * 0.05 / reps)
    assert together / reps >= 0.95 - 2 * se and alone / reps < 0.5, (together, alone)
