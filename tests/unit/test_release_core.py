"""The core path of one noised statistic: plan (public) -> one draw per cell (no Spark)."""

from __future__ import annotations

from fractions import Fraction as F

import pytest

from dp_spark.accountant import Accountant
from dp_spark.core.budget import ApproxDP, PureDP, ZCDP
from dp_spark.errors import ConfigError, InvalidBoundsError, MeasureMismatchError
from dp_spark.core.events import ComposedEvent, event_from_json, event_to_json
from dp_spark.mechanisms import accuracy, calibration
from dp_spark.mechanisms.release import (
    PlanMismatchError,
    StatisticPlan,
    add_noise,
    grid_midpoint,
    grid_sensitivity,
    grid_value_range,
    kept_values,
    plan_statistic,
    release_count,
    release_mean,
    release_sum,
    value_to_grid,
)
from dp_spark.mechanisms.mean import optimal_mean_split
from dp_spark.mechanisms.samplers import NoiseSource, RecordingNoiseSource, SeededNoiseSource
from dp_spark.core.units import Aggregate, ContributionBounds, Neighbouring, sensitivity

AR = Neighbouring.ADD_REMOVE_UNIT
B = ContributionBounds(max_rows_per_unit=4, max_partitions_per_unit=2, max_rows_per_partition=3,
                       lower=-2, upper=6)


@pytest.fixture
def seeded(monkeypatch):
    monkeypatch.setenv("DP_SPARK_TEST_MODE", "1")
    return SeededNoiseSource(20240601)


class ZeroSource(NoiseSource):
    """Draws nothing random: lets a test see the true values pass through unchanged."""

    name = "zero"

    def __init__(self):
        self.calls = []

    def discrete_laplace(self, scale, n):
        self.calls.append(("discrete_laplace", scale, n))
        return [0] * n

    def discrete_gaussian(self, sigma, n):
        self.calls.append(("discrete_gaussian", sigma, n))
        return [0] * n


def test_laplace_plan_for_a_pure_share():
    p = plan_statistic("count", Aggregate.ROW_COUNT, B, AR, PureDP(F(1, 2)), 0, 7)
    assert isinstance(p, StatisticPlan) and p.mechanism == "discrete_laplace"
    s = sensitivity(Aggregate.ROW_COUNT, B, AR)  # l1 = min(4, 2 * 3) = 4
    assert p.sensitivity == s and s.l1 == 4
    assert p.scale == calibration.laplace_scale(F(1, 2), 4) == 8
    assert p.event.sensitivity == 4 and p.event.cells == 7 and p.cells == 7
    assert p.event.partitions_per_unit == 2 and p.event.parallel is False
    assert Accountant("pure_dp").cost(p.event) == PureDP(F(1, 2))
    assert p.stddev_grid == pytest.approx(accuracy.discrete_laplace_stddev(F(8)))
    assert p.halfwidth_grid(0.05) == accuracy.noise_halfwidth("discrete_laplace", F(8), 0.05)


def test_gaussian_plan_for_a_zcdp_share():
    k = -3
    p = plan_statistic("sum", "sum", B, "add_remove_unit", ZCDP(F(1, 8)), k, 5)
    assert p.mechanism == "discrete_gaussian" and p.grid_exponent == k
    real = sensitivity(Aggregate.SUM, B, AR)
    # bounds on the grid: the grid sensitivity is exactly the real one times 2^-k (squared)
    assert p.sensitivity_grid.l2_squared == real.l2_squared * 2 ** (-2 * k)
    assert p.event.l2_squared == p.sensitivity_grid.l2_squared and p.event.sensitivity is None
    assert p.scale == calibration.gaussian_sigma_zcdp(F(1, 8), p.sensitivity_grid.l2_squared)
    cost = Accountant("zcdp", statement_delta=F(1, 10**6)).cost(p.event)
    assert cost.fits_in(ZCDP(F(1, 8)))  # sigma is rounded up: never more than the share
    assert event_from_json(event_to_json(p.event)) == p.event


def test_plan_refusals():
    with pytest.raises(MeasureMismatchError):
        plan_statistic("sum", Aggregate.SUM, B, AR, ApproxDP(1, F(1, 10**6)), -3, 1)
    with pytest.raises(ConfigError):
        plan_statistic("count", Aggregate.ROW_COUNT, B, AR, PureDP(1), -3, 1)  # counts: grid 0
    with pytest.raises(ConfigError):
        plan_statistic("count", Aggregate.ROW_COUNT, B, AR, PureDP(1), 0, 0)
    with pytest.raises(ConfigError):
        plan_statistic("sum", Aggregate.SUM, B, AR, PureDP(1), 2, 1)  # grid coarser than 1
    with pytest.raises(InvalidBoundsError):
        plan_statistic("sum", Aggregate.SUM, ContributionBounds(3), AR, PureDP(1), 0, 1)
    with pytest.raises(InvalidBoundsError):  # lower == upper: a constant, nothing to release
        plan_statistic("m", Aggregate.NORMALISED_SUM, ContributionBounds(3, lower=5, upper=5), AR, PureDP(1), 0, 1)


def test_l0_is_capped_by_the_number_of_cells():
    wide = ContributionBounds(max_rows_per_unit=10, max_partitions_per_unit=5, max_rows_per_partition=1)
    one = plan_statistic("count", Aggregate.ROW_COUNT, wide, AR, PureDP(1), 0, 1)
    many = plan_statistic("count", Aggregate.ROW_COUNT, wide, AR, PureDP(1), 0, 30)
    assert one.event.partitions_per_unit == 1 and one.event.parallel and one.scale == 1
    assert many.event.partitions_per_unit == 5 and many.scale == 5  # charged L0 times


def test_event_relation_is_parallel():
    p = plan_statistic("count", Aggregate.ROW_COUNT, ContributionBounds(1), Neighbouring.EVENT, PureDP(1), 0, 12)
    assert p.event.parallel and p.event.sensitivity == 1 and p.scale == 1


def test_plan_is_public_only():
    """The plan is built from public parameters: there is no data argument at all, and two
    plans from equal parameters are equal (RELIABILITY 10)."""
    a = plan_statistic("sum", Aggregate.SUM, B, AR, PureDP(1), -4, 3)
    b = plan_statistic("sum", Aggregate.SUM, B, AR, PureDP(1), -4, 3)
    assert a == b


def test_grid_helpers():
    assert grid_value_range(B, -2) == (-8, 24)
    assert grid_midpoint(B, -2) == 8  # (L + U) / 2 = 2 -> 8 quarters
    odd = ContributionBounds(1, lower=F(1, 10), upper=F(7, 10))  # not on the grid 2^-2
    assert grid_value_range(odd, -2) == (0, 3)  # rounded outward
    assert value_to_grid(F(1, 10), odd, -2) == 0
    assert value_to_grid(5, odd, -2) == 3  # clamped first
    assert value_to_grid(float("inf"), odd, -2) == 3 and value_to_grid(float("-inf"), odd, -2) == 0
    with pytest.raises(ConfigError):
        value_to_grid(float("nan"), odd, -2)
    # the grid sensitivity bounds the change of the rounded integers (outward bounds)
    gs = grid_sensitivity(Aggregate.SUM, odd, AR, -2)
    assert gs.l1 == 3
    ns = grid_sensitivity(Aggregate.NORMALISED_SUM, odd, AR, -2)
    mid = grid_midpoint(odd, -2)
    assert ns.per_partition == max(abs(0 - mid), abs(3 - mid))
    assert kept_values([1.0, None, float("nan"), float("inf"), -0.0]) == [1.0, float("inf"), -0.0]


def test_add_noise_one_draw_per_cell_in_one_call(seeded):
    p = plan_statistic("count", Aggregate.ROW_COUNT, B, AR, PureDP(1), 0, 6)
    rec = RecordingNoiseSource(seeded)
    out = add_noise(p, [0, 1, 2, 3, 4, 5], rec)
    assert len(rec.calls) == 1 and rec.calls[0].n == 6 and rec.calls[0].scale == p.scale
    assert rec.calls[0].kind == "discrete_laplace"
    assert len(out) == 6 and all(type(v) is int for v in out)
    z = ZeroSource()
    assert add_noise(p, [0, 1, 2, 3, 4, 5], z) == [0, 1, 2, 3, 4, 5]
    assert z.calls == [("discrete_laplace", p.scale, 6)]


def test_add_noise_refuses_a_wrong_vector():
    p = plan_statistic("count", Aggregate.ROW_COUNT, B, AR, PureDP(1), 0, 3)
    z = ZeroSource()
    for bad in ([1, 2], [1, 2, 3, 4], [1, 2, 3.5], [1, True, 2]):
        with pytest.raises(PlanMismatchError) as exc:
            add_noise(p, bad, z)
        assert "3.5" not in str(exc.value)
    assert z.calls == []  # nothing drawn


def test_outputs_are_on_the_grid_whatever_the_truth(seeded):
    """RELIABILITY 1-2: true values 0, 1 and 2^40 all release on the same grid 2^k."""
    k = -5
    p = plan_statistic("sum", Aggregate.SUM, ContributionBounds(1, lower=0, upper=2 ** 41), AR, PureDP(1), k, 3)
    out = add_noise(p, [0, 1 << -k, (2 ** 40) << -k], seeded)
    for v in out:
        real = v * F(2) ** k
        assert (real / F(2) ** k).denominator == 1


def test_release_count_and_sum(seeded):
    r = release_count(10, PureDP(1), B, AR, ZeroSource())
    assert r.value == 10 and r.event == r.plan.event
    lo, hi = r.interval
    assert lo == 10 - r.plan.halfwidth_grid(0.05) and hi == 10 + r.plan.halfwidth_grid(0.05)
    s = release_sum([1, 2, 100, None, float("nan"), -50], PureDP(1), B, AR, ZeroSource(), grid_exponent=-2)
    assert s.value == 1 + 2 + 6 - 2  # clamped to [-2, 6], null/NaN dropped
    assert release_sum([F(1, 3)], PureDP(1), B, AR, ZeroSource(), grid_exponent=-2).value == F(1, 4)
    noisy = release_sum([1, 2], PureDP(1), B, AR, seeded, grid_exponent=-2)
    assert (noisy.value * 4).denominator == 1
    with pytest.raises(ConfigError):
        release_count(-1, PureDP(1), B, AR, seeded)


def test_release_mean_without_noise_is_the_clamped_mean():
    b = ContributionBounds(2, lower=0, upper=100)
    z = ZeroSource()
    r = release_mean([10, 20, 30, 1000], PureDP(1), b, AR, z, assumed_group_size=10, grid_exponent=-4)
    assert r.value == F(10 + 20 + 30 + 100, 4)
    assert r.noisy_count == 4 and r.noisy_norm_sum == 160 - 4 * 50
    assert r.interval[0] <= r.value <= r.interval[1]
    assert r.split == optimal_mean_split(b, AR, 10, "discrete_laplace", budget=PureDP(1))
    assert [c[0] for c in z.calls] == ["discrete_laplace", "discrete_laplace"]  # count, then sum
    assert isinstance(r.event, ComposedEvent)
    assert Accountant("pure_dp").cost(r.event).fits_in(PureDP(1))
    # the assumed group size is public: changing the data does not change the split or scales
    r2 = release_mean([1] * 50, PureDP(1), b, AR, z, assumed_group_size=10, grid_exponent=-4)
    assert (r2.split, r2.sum_plan.scale, r2.count_plan.scale) == (r.split, r.sum_plan.scale, r.count_plan.scale)


def test_release_mean_empty_group_still_releases(seeded):
    b = ContributionBounds(1, lower=0, upper=10)
    r = release_mean([], ZCDP(F(1, 2)), b, AR, seeded, assumed_group_size=5, grid_exponent=-3)
    assert 0 <= r.value <= 10 and r.count_plan.mechanism == "discrete_gaussian"
    assert Accountant("zcdp", statement_delta=F(1, 10**6)).cost(r.event).fits_in(ZCDP(F(1, 2)))


def test_release_mean_needs_an_assumed_group_size(seeded):
    with pytest.raises(TypeError):
        release_mean([1, 2], PureDP(1), B, AR, seeded)  # never the true group size by default
