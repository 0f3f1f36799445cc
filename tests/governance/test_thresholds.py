"""Minimum group sizes on NOISY counts: behaviour, and the leak a true-count threshold has."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from dp_spark.core.budget import PureDP
from dp_spark.errors import ConfigError
from dp_spark.statistics.postprocess import (
    OTHER_KEY,
    MinGroupSize,
    apply_min_group_size,
    count_statistic_for,
    min_group_size_from_dict,
    suppression_summary,
)
from dp_spark.mechanisms import add_noise
from dp_spark.mechanisms.accuracy import noise_halfwidth, noise_stddev
from dp_spark.mechanisms.release import plan_statistic
from dp_spark.core.units import Aggregate, ContributionBounds, Neighbouring


def cell(stat, key, value, *, scale=2.0, grid=1.0, mech="discrete_laplace"):
    return {"statistic": stat, "key": key, "value": float(value), "ci_low": float(value) - 5,
            "ci_high": float(value) + 5, "mechanism": mech, "noise_scale": scale,
            "noise_stddev": noise_stddev(mech, scale / grid) * grid, "grid": grid, "expected_abs_error": 1.0}


# --------------------------------------------------------------------------------------
# behaviour
# --------------------------------------------------------------------------------------
def test_suppress_marks_all_cells_of_small_keys_and_keeps_rows():
    cells = [cell("count", "a", 3), cell("mean", "a", 40), cell("count", "b", 50), cell("mean", "b", 41),
             cell("count", "c", 9.0), cell("mean", "c", 12)]
    before = [dict(c) for c in cells]
    out, keys = apply_min_group_size(cells, threshold=10, strategy="suppress", count_statistic="count")
    assert keys == ["a", "c"]
    assert cells == before  # input untouched
    assert len(out) == 6 and [(c["statistic"], c["key"]) for c in out] == [(c["statistic"], c["key"]) for c in cells]
    for c in out:
        if c["key"] in ("a", "c"):
            assert c["suppressed"] is True
            assert all(math.isnan(c[f]) for f in ("value", "ci_low", "ci_high"))
            assert c["noise_scale"] == 2.0  # public parameters stay
        else:
            assert c["suppressed"] is False and c["value"] in (50.0, 41.0)


def test_threshold_is_inclusive_lower_bound_on_noisy_value():
    out, keys = apply_min_group_size([cell("count", "a", 10), cell("count", "b", 9.5)], threshold=10,
                                     strategy="suppress", count_statistic="count")
    assert keys == ["b"] and out[0]["suppressed"] is False


def test_nan_count_counts_as_suppressed():
    out, keys = apply_min_group_size([cell("count", "a", float("nan")), cell("count", "b", 30)], threshold=5,
                                     strategy="suppress", count_statistic="count")
    assert keys == ["a"]


def test_merge_other_sums_noisy_counts_with_conservative_interval():
    cells = [cell("distinct_units", k, v) for k, v in [("a", 4), ("b", 7), ("c", 100), ("d", 6)]]
    out, keys = apply_min_group_size(cells, threshold=10, strategy="merge_other",
                                     count_statistic="distinct_units", confidence=0.95)
    assert keys == ["a", "b", "d"]
    assert len(out) == 5
    other = out[-1]
    assert other["key"] == OTHER_KEY and other["suppressed"] is False
    assert other["value"] == 17.0 and other["merged_keys"] == ("a", "b", "d")
    h = 3 * noise_halfwidth("discrete_laplace", math.nextafter(2.0, math.inf), 0.05 / 3)
    assert other["ci_low"] == max(17.0 - h, 0.0) and other["ci_high"] == 17.0 + h
    assert math.isnan(other["noise_scale"])
    assert other["noise_stddev"] == pytest.approx(math.sqrt(3) * noise_stddev("discrete_laplace", 2.0))
    assert [c["suppressed"] for c in out[:4]] == [True, True, False, True]


def test_merge_other_is_itself_thresholded():
    # a single small key merged alone would be that key under another name: suppressed too
    out, keys = apply_min_group_size([cell("count", "a", 4), cell("count", "b", 30)], threshold=10,
                                     strategy="merge_other", count_statistic="count", confidence=0.95)
    assert keys == ["a", OTHER_KEY]
    assert out[-1]["key"] == OTHER_KEY and out[-1]["suppressed"] and math.isnan(out[-1]["value"])


def test_merge_other_without_small_keys_adds_nothing():
    out, keys = apply_min_group_size([cell("count", "a", 40)], threshold=10, strategy="merge_other",
                                     count_statistic="count", confidence=0.95)
    assert keys == [] and len(out) == 1


def test_merge_other_mean_needs_extra_and_uses_noisy_sums():
    cells = [cell("count", "a", 8), cell("mean", "a", 30, scale=0.5, grid=0.25),
             cell("count", "b", 6), cell("mean", "b", 60, scale=0.5, grid=0.25),
             cell("count", "c", 500), cell("mean", "c", 50, scale=0.5, grid=0.25)]
    with pytest.raises(ConfigError, match="normalised sums"):
        apply_min_group_size(cells, threshold=10, strategy="merge_other", count_statistic="count", confidence=0.95)
    extra = {"normalised_sum": {"a": Fraction(-160), "b": Fraction(60)}, "lower": 0, "upper": 100, "min_count": 1}
    out, keys = apply_min_group_size(cells, threshold=10, strategy="merge_other", count_statistic="count",
                                     confidence=0.95, extra=extra)
    assert keys == ["a", "b"]
    other = {c["statistic"]: c for c in out if c["key"] == OTHER_KEY}
    assert other["count"]["value"] == 14.0
    assert other["mean"]["value"] == pytest.approx(50 + (-100) / 14)  # mid + sum(nsum) / sum(count)
    assert other["mean"]["ci_low"] <= other["mean"]["value"] <= other["mean"]["ci_high"]
    assert 0 <= other["mean"]["ci_low"] and other["mean"]["ci_high"] <= 100


def test_merged_interval_covers_the_truth(seeded):
    """Coverage of the merged count's interval over seeded repeats (>= its confidence)."""
    scale = Fraction(3)
    true = {"a": 6, "b": 8, "c": 4, "big": 1000}
    n = 400
    draws = {k: add_noise("discrete_laplace", [t] * n, scale, source=seeded) for k, t in true.items()}
    hits = published = 0
    for i in range(n):
        cells = [cell("count", k, max(draws[k][i], 0), scale=3.0) for k in true]
        out, _ = apply_min_group_size(cells, threshold=10, strategy="merge_other", count_statistic="count",
                                      confidence=0.9)
        o = out[-1]
        if o["key"] != OTHER_KEY or o["suppressed"]:
            continue
        published += 1
        truth = sum(true[k] for k in o["merged_keys"])
        hits += o["ci_low"] <= truth <= o["ci_high"]
    assert published > 0.5 * n
    assert hits / published >= 0.9


def test_refusals():
    with pytest.raises(ConfigError, match="noisy count"):
        apply_min_group_size([cell("sum", "a", 3)], threshold=10, strategy="suppress", count_statistic="count")
    with pytest.raises(ConfigError, match="threshold"):
        apply_min_group_size([cell("count", "a", 3)], threshold=0, strategy="suppress", count_statistic="count")
    with pytest.raises(ConfigError, match="strategy"):
        apply_min_group_size([cell("count", "a", 3)], threshold=5, strategy="round", count_statistic="count")
    with pytest.raises(ConfigError, match="confidence"):
        apply_min_group_size([cell("count", "a", 3), cell("count", "b", 3)], threshold=5,
                             strategy="merge_other", count_statistic="count")
    with pytest.raises(ConfigError, match="clashes"):
        apply_min_group_size([cell("count", "a", 3), cell("count", OTHER_KEY, 3)], threshold=5,
                             strategy="merge_other", count_statistic="count", confidence=0.9)
    with pytest.raises(ConfigError, match="every key"):
        apply_min_group_size([cell("count", "a", 3), cell("mean", "b", 3)], threshold=5, strategy="suppress",
                             count_statistic="count")


def test_spec_field_parsing():
    assert min_group_size_from_dict(None) is None
    assert min_group_size_from_dict(20) == MinGroupSize(20)
    r = min_group_size_from_dict({"threshold": 5, "strategy": "merge_other"}, metric="mean", public_keys=["x"])
    assert r.strategy == "merge_other" and r.to_json()["other_key"] == OTHER_KEY
    for bad in ({"threshold": 0}, {"threshold": 5, "strategy": "x"}, {"threshold": 5, "extra": 1}, True, "5"):
        with pytest.raises(ConfigError, match="min_group_size"):
            min_group_size_from_dict(bad, "spec.yaml")
    with pytest.raises(ConfigError, match="noisy count"):
        min_group_size_from_dict(5, "spec.yaml", metric="sum")
    with pytest.raises(ConfigError, match="clashes"):
        min_group_size_from_dict({"threshold": 5, "other_key": "r1"}, "spec.yaml", public_keys=["r1"])
    assert count_statistic_for("mean") == "count" and count_statistic_for("distinct_units") == "distinct_units"


def test_suppression_summary_has_keys_not_values():
    cells = [cell("count", "a", 4), cell("count", "b", 7), cell("count", "c", 100)]
    out, keys = apply_min_group_size(cells, threshold=10, strategy="merge_other", count_statistic="count",
                                     confidence=0.95)
    s = suppression_summary(out, keys, threshold=10, strategy="merge_other")
    assert s == {"min_group_size": 10, "strategy": "merge_other", "suppressed_keys": ["a", "b"],
                 "merged_into_other": ["a", "b"], "cells_in": 4}
    assert "4.0" not in repr(s) and "7.0" not in repr(s)


# --------------------------------------------------------------------------------------
# the leak: thresholds on TRUE counts vs NOISY counts, on neighbouring datasets
# --------------------------------------------------------------------------------------
EPS = Fraction(1)
THRESHOLD = 20
N = 20_000
Z = 4.5  # ~1e-5 two-sided per comparison: the test is seeded, this only keeps it honest


def _violates(k1: int, k2: int, n: int, eps: float) -> bool:
    """True when the two event frequencies k1/n, k2/n differ by more than a factor e^eps
    beyond statistical error (delta-method CI on the log ratio); disjoint supports
    (an event seen on one side, never on the other) always violate."""
    if min(k1, k2) == 0:
        return max(k1, k2) >= 30
    p1, p2 = k1 / n, k2 / n
    diff = abs(math.log(p1) - math.log(p2))
    se = math.sqrt((1 - p1) / (n * p1) + (1 - p2) / (n * p2))
    return diff - Z * se > eps


def _noisy_threshold(scale: Fraction, source):
    """The engine's path: noisy counts (one draw per repeat), then apply_min_group_size."""
    def run(true_count: int) -> int:
        noisy = add_noise("discrete_laplace", [true_count] * N, scale, source=source)
        cells = [cell("count", f"r{i}", max(v, 0), scale=float(scale)) for i, v in enumerate(noisy)]
        _, keys = apply_min_group_size(cells, threshold=THRESHOLD, strategy="suppress", count_statistic="count")
        return len(keys)
    return run


def _true_threshold(scale: Fraction, source):
    """The anti-pattern: decide suppression on the true count, then add noise."""
    def run(true_count: int) -> int:
        noisy = add_noise("discrete_laplace", [true_count] * N, scale, source=source)
        return sum(1 for _ in noisy if true_count < THRESHOLD)
    return run


@pytest.fixture
def seeded(monkeypatch):
    monkeypatch.setenv("DP_SPARK_TEST_MODE", "1")
    from dp_spark.mechanisms.samplers import SeededNoiseSource

    return SeededNoiseSource(5)


def _plan_scale() -> Fraction:
    # a user-level count, one row and one partition per user: L1 sensitivity 1
    plan = plan_statistic("count", Aggregate.ROW_COUNT, ContributionBounds(max_rows_per_unit=1),
                          Neighbouring.ADD_REMOVE_UNIT, PureDP(EPS), 0, 1)
    assert plan.sensitivity.l1 == 1
    return plan.scale


@pytest.mark.slow
def test_noisy_count_threshold_bounded_true_count_threshold_leaks(seeded):
    scale = _plan_scale()
    d, d_prime = THRESHOLD - 1, THRESHOLD  # neighbours: one more user in the cell

    # noisy-count threshold (what dp_spark does): both events within e^eps
    noisy = _noisy_threshold(scale, seeded)
    s1, s2 = noisy(d), noisy(d_prime)
    q = math.exp(-1 / float(scale))
    # P(X <= 0) and P(X < 0) for the discrete Laplace: the sampler really ran, the rule used the noisy value
    assert abs(s1 / N - 1 / (1 + q)) < 0.015 and abs(s2 / N - q / (1 + q)) < 0.015
    assert 0 < s2 < s1 < N
    assert not _violates(s1, s2, N, float(EPS)), "suppression event"
    assert not _violates(N - s1, N - s2, N, float(EPS)), "publication event"
    # this pair is the tight case: the ratio is e^eps itself, so the check has no slack
    assert abs(math.log(s1 / s2) - float(EPS)) < 0.1

    # true-count threshold: suppression on D with certainty, never on D' -> disjoint support
    leaky = _true_threshold(scale, seeded)
    t1, t2 = leaky(d), leaky(d_prime)
    assert (t1, t2) == (N, 0)
    assert _violates(t1, t2, N, float(EPS)) and _violates(N - t1, N - t2, N, float(EPS))


@pytest.mark.slow
def test_the_check_catches_a_threshold_with_too_little_noise(seeded):
    """The same check flags a noisy threshold calibrated for 2*eps (half the scale)."""
    weak = _noisy_threshold(_plan_scale() / 2, seeded)
    s1, s2 = weak(THRESHOLD - 1), weak(THRESHOLD)
    assert _violates(s1, s2, N, float(EPS)) or _violates(N - s1, N - s2, N, float(EPS))


# --------------------------------------------------------------------------------------
# a suppressed mean publishes nothing that depends on its withheld noisy count
# --------------------------------------------------------------------------------------
def _engine_mean_cells(rows, seed, strategy):
    """The engine's own cells of a mean release (seeded), thresholded as the engine does."""
    from dp_spark.config import release_spec_from_dict
    from dp_spark.engine import plan_for, threshold_cells
    from dp_spark.evaluation.utility import cell_partials
    from dp_spark.mechanisms.samplers import SeededNoiseSource

    spec = release_spec_from_dict({
        "name": "t_mean", "dataset": "demo_events", "privacy_unit": {"kind": "user", "column": "user_id"},
        "metric": "mean", "group_by": {"column": "region", "public_keys": {"values": ["a", "b", "c"]}},
        "bounds": {"max_rows_per_unit": 1, "max_partitions_per_unit": 1},
        "value": {"column": "order_value", "lower": 0, "upper": 100},
        "mean": {"assumed_group_size": 50, "min_count": 1},
        "budget": {"id": "b", "measure": "pure_dp", "epsilon": 4},
        "min_group_size": {"threshold": 30, "strategy": strategy},
    })
    partials = {k: {"rows": n, "sum_fixed": n * 40 * 2 ** 20} for k, n in zip(spec.keys, rows)}
    components: dict = {}
    plan = plan_for(spec)
    cells = plan.noise(cell_partials(spec, plan, partials), SeededNoiseSource(seed), components=components)
    out, _ = threshold_cells(spec, cells, components)
    return out


@pytest.mark.parametrize("strategy", ["suppress", "merge_other"])
def test_suppressed_mean_cell_does_not_reveal_its_noisy_count(seeded, strategy):
    # two small groups of different sizes, one large one; threshold 30
    out = _engine_mean_cells([12, 7, 400], seed=11, strategy=strategy)
    hidden = [c for c in out if c["suppressed"]]
    assert {c["key"] for c in hidden} >= {"a", "b"}
    for c in hidden:
        for f in ("value", "ci_low", "ci_high", "noise_stddev", "expected_abs_error"):
            if c["statistic"] == "mean" or f in ("value", "ci_low", "ci_high"):
                assert math.isnan(c[f]), (c["key"], c["statistic"], f)
        assert math.isfinite(c["noise_scale"]) or c["key"] == OTHER_KEY
    # the published fields of the suppressed cells are the same whatever the withheld counts
    other = _engine_mean_cells([25, 3, 400], seed=12, strategy=strategy)

    def published(cells, key):
        return [{f: ("nan" if isinstance(v, float) and math.isnan(v) else v) for f, v in c.items()}
                for c in cells if c["key"] == key]

    for key in ("a", "b"):
        assert published(out, key) == published(other, key)
    # the unsuppressed large group keeps its (data-dependent) accuracy figures
    big = next(c for c in out if c["key"] == "c" and c["statistic"] == "mean")
    assert not big["suppressed"] and big["noise_stddev"] > 0 and big["expected_abs_error"] > 0
