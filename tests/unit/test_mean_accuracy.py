"""The exact law of the mean's linearised error: quantiles and expected absolute error."""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest

from dp_spark.mechanisms import accuracy
from dp_spark.mechanisms.mean import mean_error_quantile, mean_expected_abs_error

U = 2.0 ** -4


@pytest.mark.parametrize("mech", ["discrete_laplace", "discrete_gaussian"])
@pytest.mark.parametrize("alpha", [0.5, 0.2, 0.05, 0.01])
def test_at_the_midpoint_the_quantile_is_the_sums_exact_halfwidth(mech, alpha):
    q = mean_error_quantile(alpha, 0, mechanism=mech, sum_scale=300, sum_unit=U, count_scale=7)
    assert q == pytest.approx(accuracy.noise_halfwidth(mech, 300, alpha) * U, rel=1e-6)
    e = mean_expected_abs_error(0, 100, 1, mechanism=mech, sum_scale=300, sum_unit=U, count_scale=7)
    if mech == "discrete_laplace":
        a = math.exp(-1 / 300)
        assert e == pytest.approx(2 * a / (1 - a * a) * U / 100, rel=1e-9)
    else:
        assert e == pytest.approx(math.sqrt(2 / math.pi) * accuracy.discrete_gaussian_stddev(300) * U / 100, rel=1e-9)


@pytest.mark.parametrize("alpha", [0.5, 0.1, 0.05, 0.01])
def test_two_gaussians_give_the_normal_quantile_of_their_sum(alpha):
    sd = math.hypot(400 * U, 3 * 20)  # d = 3, count sigma 20
    q = mean_error_quantile(alpha, 3, mechanism="discrete_gaussian", sum_scale=400, sum_unit=U, count_scale=20)
    assert q == pytest.approx(NormalDist().inv_cdf(1 - alpha / 2) * sd, rel=2e-3)
    e = mean_expected_abs_error(3, 50, 1, mechanism="discrete_gaussian", sum_scale=400, sum_unit=U, count_scale=20)
    assert e == pytest.approx(math.sqrt(2 / math.pi) * sd / 50, rel=2e-3)


@pytest.mark.parametrize("alpha", [0.5, 0.3, 0.1, 0.05, 0.01])
def test_two_equal_laplaces_give_the_difference_law(alpha):
    # u X_S and d X_C both Laplace with scale b = 40: P(|D| > h) = (1 + h/2b) e^(-h/b)
    b, lo, hi = 40.0, 0.0, 4000.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if (1 + mid / (2 * b)) * math.exp(-mid / b) > alpha else (lo, mid)
    q = mean_error_quantile(alpha, 2, mechanism="discrete_laplace", sum_scale=b / U, sum_unit=U,
                            count_scale=b / 2)
    assert q == pytest.approx(hi, rel=0.03)
    # and the root-sum-square of the two half-widths it replaces is too short below 90%
    rss = math.sqrt(2) * b * math.log(1 / alpha)
    if alpha >= 0.3:
        assert rss < 0.95 * q
    e = mean_expected_abs_error(2, 10, 1, mechanism="discrete_laplace", sum_scale=b / U, sum_unit=U,
                                count_scale=b / 2)
    assert e == pytest.approx((b * b + b * b + b * b) / (2 * b) / 10, rel=0.03)  # (b1^2+b1b2+b2^2)/(b1+b2)
