"""The mean's post-processing, interval and budget split (no Spark, no sampling)."""

from __future__ import annotations

from fractions import Fraction as F

import pytest

from dp_spark.core.budget import ApproxDP, PureDP, ZCDP
from dp_spark.errors import ConfigError, InvalidBoundsError, MeasureMismatchError
from dp_spark.mechanisms.mean import (
    SPLIT_MAX,
    SPLIT_MIN,
    mean_from_noisy,
    mean_interval,
    mean_split_error,
    noise_tail_halfwidth,
    optimal_mean_split,
)
from dp_spark.core.units import ContributionBounds, Neighbouring

B = ContributionBounds(max_rows_per_unit=3, lower=0, upper=100)
AR = Neighbouring.ADD_REMOVE_UNIT


def test_mean_from_noisy_is_exact_and_floored():
    # midpoint + noisy_norm_sum / max(noisy_count, min_count)
    assert mean_from_noisy(F(30), F(10), F(50), 0, 100, 5) == F(53)
    assert mean_from_noisy(F(30), F(2), F(50), 0, 100, 5) == F(56)  # floored at 5, not 2
    assert mean_from_noisy(F(30), F(-7), F(50), 0, 100, 5) == F(56)  # a negative noisy count too
    assert mean_from_noisy(F(1, 3), 1, F(1, 2), 0, 1, 1) == F(5, 6)
    assert mean_from_noisy(F(10**6), F(1), F(50), 0, 100, 1) == 100  # clamped (post-processing)
    assert mean_from_noisy(F(-10**6), F(1), F(50), 0, 100, 1) == 0
    assert isinstance(mean_from_noisy(F(1), F(3), F(0), -1, 1, 1), F)


def test_mean_from_noisy_validation():
    with pytest.raises(ConfigError):
        mean_from_noisy(F(1), F(1), F(0), 0, 1, 0)  # min_count must be > 0
    with pytest.raises(InvalidBoundsError):
        mean_from_noisy(F(1), F(1), F(0), 1, 0, 1)
    with pytest.raises(ConfigError):
        mean_from_noisy(float("nan"), F(1), F(0), 0, 1, 1)


def test_mean_interval_contains_truth_when_noise_is_within_halfwidths():
    # truth: n = 20 rows, centred sum 100 (mean 55 with mid 50); noise within the half-widths
    for e_s, e_c in [(0, 0), (40, -3), (-40, 3), (40, 3), (-40, -3)]:
        lo, hi = mean_interval(F(100 + e_s), F(20 + e_c), 0.0, 0.0, F(50), 0, 100, 1, 0.05,
                               sum_halfwidth=F(40), count_halfwidth=F(3))
        assert lo <= 55 <= hi
        assert 0 <= lo <= hi <= 100
        point = mean_from_noisy(F(100 + e_s), F(20 + e_c), F(50), 0, 100, 1)
        assert lo <= point <= hi


def test_mean_interval_edge_cases():
    # the count interval holds no integer >= 1: no information, the whole clamp range
    assert mean_interval(F(0), F(-50), 0.0, 0.0, F(50), 0, 100, 1, 0.05,
                         sum_halfwidth=F(10), count_halfwidth=F(5)) == (0, 100)
    # a large count with little noise gives a narrow interval
    lo, hi = mean_interval(F(5000), F(10000), 0.0, 0.0, F(50), 0, 100, 1, 0.05,
                           sum_halfwidth=F(100), count_halfwidth=F(10))
    assert 50.48 < lo < 50.5 < hi < 50.52
    # from standard deviations (no exact half-widths): wider with heavier assumed tails
    lo1, hi1 = mean_interval(F(100), F(20), 10.0, 1.0, F(50), 0, 100, 1, 0.05, mechanism="discrete_gaussian")
    lo2, hi2 = mean_interval(F(100), F(20), 10.0, 1.0, F(50), 0, 100, 1, 0.05, mechanism="discrete_laplace")
    lo3, hi3 = mean_interval(F(100), F(20), 10.0, 1.0, F(50), 0, 100, 1, 0.05)
    assert hi2 - lo2 >= hi1 - lo1 and (lo3, hi3) == (min(lo1, lo2), max(hi1, hi2))
    with pytest.raises(ConfigError):
        mean_interval(F(1), F(1), 1.0, 1.0, F(0), 0, 1, 1, 1.5)


def test_noise_tail_halfwidth():
    import math
    assert noise_tail_halfwidth(math.sqrt(2), 0.05, "discrete_laplace") == pytest.approx(math.log(20))
    assert noise_tail_halfwidth(1.0, 0.05, "discrete_gaussian") == pytest.approx(1.959964, rel=1e-6)
    with pytest.raises(ConfigError):
        noise_tail_halfwidth(1.0, 0.05, "laplace")


@pytest.mark.parametrize("mechanism,budget", [("discrete_laplace", PureDP(1)), ("discrete_gaussian", ZCDP(F(1, 2)))])
def test_split_is_a_simple_fraction_in_range(mechanism, budget):
    for n in (1, 3, 10, 100, 10_000):
        f = optimal_mean_split(B, AR, n, mechanism, budget=budget)
        assert isinstance(f, F) and (f * 100).denominator == 1
        assert SPLIT_MIN <= f <= SPLIT_MAX
        # it is the best of the grid it searched, up to the model's own resolution
        e = mean_split_error(f, B, AR, n, mechanism, budget)
        for g in (SPLIT_MIN, F(1, 4), F(1, 2), F(3, 4), SPLIT_MAX):
            assert e <= mean_split_error(g, B, AR, n, mechanism, budget) * (1 + 1e-9)


def test_split_tends_to_the_delta_method_for_large_groups():
    # without a budget: the closed form. Laplace: Delta_S = W Delta_C in every relation -> 1/2.
    # Gaussian: the same except replace_unit, where the signed sum's l2^2 doubles again (4x vs
    # the count's 2x): f/(1-f) = sqrt(2), f = 0.586 -> 59/100.
    for rel in Neighbouring:
        b = ContributionBounds(1, lower=B.lower, upper=B.upper) if rel is Neighbouring.EVENT else B  # event: K = 1
        assert optimal_mean_split(b, rel, 50, "discrete_laplace") == F(1, 2)
        expected = F(59, 100) if rel is Neighbouring.REPLACE_UNIT else F(1, 2)
        assert optimal_mean_split(b, rel, 50, "discrete_gaussian") == expected
    # with a budget and huge groups the count noise is negligible next to n: near 1/2
    f = optimal_mean_split(B, AR, 10**7, "discrete_laplace", budget=PureDP(1))
    assert abs(f - F(1, 2)) <= F(1, 10)


def test_split_depends_on_public_parameters_only():
    a = optimal_mean_split(B, AR, 10, "discrete_laplace", budget=PureDP(1), min_count=1)
    assert a == optimal_mean_split(B, "add_remove_unit", 10, "discrete_laplace", budget=PureDP(1))
    # small groups move budget away from 1/2
    assert a != F(1, 2)


def test_assumed_mean_moves_the_split_with_the_mean():
    """Near the midpoint the count noise barely moves the mean: the sum gets more; at a
    bound the worst case is where it was (the default takes the whole range)."""
    lo, hi = B.lower, B.upper
    mid = (lo + hi) / 2
    kw = dict(budget=PureDP(1), min_count=1)
    default = optimal_mean_split(B, AR, 2000, "discrete_laplace", **kw)
    centred = optimal_mean_split(B, AR, 2000, "discrete_laplace", assumed_mean=mid, **kw)
    at_bound = optimal_mean_split(B, AR, 2000, "discrete_laplace", assumed_mean=hi, **kw)
    assert centred >= default + F(2, 10)
    assert abs(at_bound - default) <= F(5, 100)
    # the model's error at its own choice is below the default's, at that assumption
    e = lambda f: mean_split_error(f, B, AR, 2000, "discrete_laplace", PureDP(1), assumed_mean=mid)  # noqa: E731
    assert e(centred) < 0.8 * e(default)
    with pytest.raises(ConfigError, match="assumed_mean"):
        optimal_mean_split(B, AR, 10, "discrete_laplace", assumed_mean=hi + 1, **kw)
    with pytest.raises(ConfigError, match="assumed_mean"):
        optimal_mean_split(B, AR, 10, "discrete_laplace", assumed_mean=mid)  # needs the budget


def test_split_validation():
    with pytest.raises(ConfigError):
        optimal_mean_split(B, AR, 0, "discrete_laplace")
    with pytest.raises(ConfigError):
        optimal_mean_split(B, AR, 10, "laplace")
    with pytest.raises(MeasureMismatchError):
        optimal_mean_split(B, AR, 10, "discrete_laplace", budget=ZCDP(1))
    with pytest.raises(MeasureMismatchError):
        optimal_mean_split(B, AR, 10, "discrete_gaussian", budget=ApproxDP(1, F(1, 10**6)))
    with pytest.raises(InvalidBoundsError):
        optimal_mean_split(ContributionBounds(3), AR, 10, "discrete_laplace")
    with pytest.raises(ConfigError):
        mean_split_error(F(0), B, AR, 10, "discrete_laplace", PureDP(1))
