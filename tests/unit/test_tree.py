"""The binary-tree mechanism (:mod:`dp_spark.mechanisms.tree`), pure and fast.

* the dyadic decomposition of every prefix of small horizons: disjoint nodes of the tree whose
  union is exactly days 1 .. t, popcount(t) of them;
* the node vector's sensitivity, by brute force over every neighbouring pair of small streams
  (one unit added to a stream of other units): never above the declared L1 / L2^2, and a
  declaration that is too small (one level's bound, or one level fewer) is caught by the same
  search; the same for "distinct units ever seen" (each unit counted on its first kept day);
* calibration: one charge for the whole horizon; one vector draw for the whole tree;
* released points from stored node noises: a rerun gives the same series;
* the interval of a point: the exact law of the sum of its nodes' noises (checked against a
  direct convolution), never narrower than it, and the Chernoff fallback is never narrower.
"""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import numpy as np
import pytest

from dp_spark.core.budget import PureDP, ZCDP
from dp_spark.errors import ConfigError, InvalidBoundsError
from dp_spark.mechanisms import accuracy, tree
from dp_spark.mechanisms.samplers import RecordingNoiseSource, SeededNoiseSource


@pytest.fixture(autouse=True)
def _test_mode(monkeypatch):
    monkeypatch.setenv("DP_SPARK_TEST_MODE", "1")


@pytest.mark.parametrize("horizon", [1, 2, 3, 5, 8, 13, 64, 100, 365])
def test_prefix_decomposition_is_exact(horizon):
    nodes = set(tree.tree_nodes(horizon))
    assert len(nodes) == len(tree.tree_nodes(horizon))
    for t in range(1, horizon + 1):
        parts = tree.prefix_nodes(t, horizon)
        assert set(parts) <= nodes
        days = [d for h, j in parts for d in range(j * 2**h + 1, (j + 1) * 2**h + 1)]
        assert sorted(days) == list(range(1, t + 1))  # disjoint, and exactly 1 .. t
        assert len(parts) == bin(t).count("1")
    assert tree.levels(horizon) == math.floor(math.log2(horizon)) + 1


def test_node_values_are_the_sums_they_cover():
    rng = random.Random(3)
    xs = [rng.randint(-5, 9) for _ in range(37)]
    vals = tree.node_values(xs, 40)
    for (h, j), v in vals.items():
        assert v == sum(xs[j * 2**h:(j + 1) * 2**h])
    assert set(vals) == {(h, j) for h in range(6) for j in range(37 >> h)}


def test_refusals():
    with pytest.raises(ConfigError):
        tree.tree_nodes(0)
    with pytest.raises(ConfigError):
        tree.prefix_nodes(6, 5)
    with pytest.raises(ConfigError):
        tree.node_values([1] * 6, 5)
    with pytest.raises(InvalidBoundsError):
        tree.StreamContribution(max_days=0, per_day=1)
    with pytest.raises(ConfigError):
        tree.calibrate(10, tree.distinct_units_contribution(), PureDP(1, delta=Fraction(1, 10**9)))


# --- sensitivity by brute force ------------------------------------------------------------
def _unit_patterns(horizon: int, c: tree.StreamContribution):
    """Every way one unit can change the increments: at most max_days days, each by 1 ..
    per_day, all together at most total."""
    for k in range(1, min(c.max_days, horizon) + 1):
        for days in itertools.combinations(range(horizon), k):
            for amounts in itertools.product(range(1, c.per_day + 1), repeat=k):
                if c.total is not None and sum(amounts) > c.total:
                    continue
                xs = [0] * horizon
                for d, a in zip(days, amounts):
                    xs[d] = a
                yield xs


def _worst(horizon: int, patterns, base) -> tuple[int, int]:
    """The largest L1 and squared L2 distance between the node vectors of ``base`` and base +
    one unit's pattern (both directions are the same distance: add or remove)."""
    before = tree.node_values(base, horizon)
    l1 = l2 = 0
    for xs in patterns:
        after = tree.node_values([b + x for b, x in zip(base, xs)], horizon)
        d = [after[n] - before[n] for n in before]
        l1, l2 = max(l1, sum(abs(v) for v in d)), max(l2, sum(v * v for v in d))
    return l1, l2


CASES = [(h, tree.StreamContribution(*b)) for h in (1, 2, 5, 7, 8, 11)
         for b in ((1, 1), (2, 1), (3, 2), (2, 3, 4), (4, 1), (3, 3, 5))]


@pytest.mark.parametrize("horizon,contribution", CASES)
def test_declared_sensitivity_holds_for_every_neighbouring_stream(horizon, contribution):
    rng = random.Random(horizon)
    base = [rng.randint(0, 20) for _ in range(horizon)]  # the other units' increments
    l1, l2 = _worst(horizon, _unit_patterns(horizon, contribution), base)
    declared = tree.node_sensitivity(horizon, contribution)
    assert l1 <= declared.l1 and l2 <= declared.l2_squared
    # L1 is tight (days 1 .. max_days, fullest): the derivation does not overcharge
    assert l1 == declared.l1


def _caught(horizon, contribution, l1: int, l2: int) -> bool:
    base = [0] * horizon
    worst_l1, worst_l2 = _worst(horizon, _unit_patterns(horizon, contribution), base)
    return worst_l1 > l1 or worst_l2 > l2


@pytest.mark.parametrize("horizon,contribution", [(8, tree.StreamContribution(2, 1)),
                                                  (11, tree.StreamContribution(3, 2)),
                                                  (7, tree.StreamContribution(1, 1))])
def test_a_too_small_declared_sensitivity_is_caught(horizon, contribution):
    good = tree.node_sensitivity(horizon, contribution)
    assert not _caught(horizon, contribution, good.l1, good.l2_squared)
    one_level = contribution.most  # the naive bound: as if the tree had one level
    assert _caught(horizon, contribution, one_level, one_level ** 2)
    lv = tree.levels(horizon)
    assert _caught(horizon, contribution, good.l1 * (lv - 1) // lv, good.l2_squared)  # a level short
    assert _caught(horizon, contribution, good.l1 - 1, good.l2_squared)


def _first_day_increments(units: dict, horizon: int) -> list[int]:
    """Distinct units ever seen: each unit counted once, on its first kept day."""
    xs = [0] * horizon
    for days in units.values():
        if days:
            xs[min(days)] += 1
    return xs


@pytest.mark.parametrize("horizon", [1, 3, 8, 12])
def test_distinct_units_ever_seen_moves_one_per_level(horizon):
    rng = random.Random(horizon)
    others = {u: {rng.randrange(horizon) for _ in range(rng.randint(1, 3))} for u in range(6)}
    base = _first_day_increments(others, horizon)
    before = tree.node_values(base, horizon)
    declared = tree.node_sensitivity(horizon, tree.distinct_units_contribution())
    assert declared.l1 == declared.l2_squared == tree.levels(horizon)
    seen = 0
    for k in range(1, min(horizon, 4) + 1):  # the new unit's active days, every choice
        for days in itertools.combinations(range(horizon), k):
            after = tree.node_values(_first_day_increments({**others, "new": set(days)}, horizon), horizon)
            d = [after[n] - before[n] for n in before]
            assert sum(abs(v) for v in d) <= declared.l1
            assert sum(v * v for v in d) <= declared.l2_squared
            seen = max(seen, sum(abs(v) for v in d))
    assert seen == declared.l1  # a unit first seen on day 1 reaches every level


# --- calibration, noise, release --------------------------------------------------------
def test_calibration_is_one_charge_for_the_horizon():
    c = tree.StreamContribution(max_days=3, per_day=2)
    sens = tree.node_sensitivity(365, c)
    lap = tree.calibrate(365, c, PureDP(Fraction(1, 2)))
    assert lap.mechanism == "discrete_laplace" and lap.scale == Fraction(sens.l1) * 2
    gau = tree.calibrate(365, c, ZCDP(Fraction(1, 2)))
    assert gau.mechanism == "discrete_gaussian"
    assert gau.scale >= math.sqrt(sens.l2_squared) and gau.scale ** 2 <= sens.l2_squared * (1 + 1e-12)


def test_one_vector_draw_for_the_whole_tree():
    cal = tree.calibrate(365, tree.distinct_units_contribution(), PureDP(1))
    rec = RecordingNoiseSource(SeededNoiseSource(1))
    noise = tree.draw_node_noise(cal, source=rec)
    assert [(c.kind, c.n) for c in rec.calls] == [("discrete_laplace", len(tree.tree_nodes(365)))]
    assert set(noise) == set(tree.tree_nodes(365))


def test_points_from_stored_noise_are_reproducible_and_unbiased_without_noise():
    rng = random.Random(5)
    xs = [rng.randint(0, 50) for _ in range(40)]
    zero = {n: 0 for n in tree.tree_nodes(64)}
    assert tree.released_prefixes(xs, zero, 64) == list(itertools.accumulate(xs))
    cal = tree.calibrate(64, tree.StreamContribution(1, 50), PureDP(1))
    noise = tree.draw_node_noise(cal, source=SeededNoiseSource(7))
    first = tree.released_prefixes(xs, noise, 64)
    assert tree.released_prefixes(xs[:20], noise, 64) == first[:20]  # a later day changes no earlier point
    assert tree.released_prefixes(xs, dict(noise), 64) == first


def _point_law(mechanism, scale, nodes):
    """The exact law of a point summing ``nodes`` iid node noises (direct convolution of the
    pmf, its tails below 1e-18 cut), and the index of 0 in it."""
    k = accuracy.noise_halfwidth(mechanism, scale, 1e-18)
    pmf = (accuracy.discrete_laplace_pmf if mechanism == "discrete_laplace"
           else accuracy.discrete_gaussian_pmf)(scale, np.arange(-k, k + 1))
    law = np.array([1.0])
    for _ in range(nodes):
        law = np.convolve(law, pmf)
    return law, (len(law) - 1) // 2


@pytest.mark.parametrize("mechanism,scale", [("discrete_laplace", Fraction(3)), ("discrete_gaussian", Fraction(4)),
                                             ("discrete_laplace", Fraction(1, 2))])
@pytest.mark.parametrize("t", [1, 3, 7, 31])
def test_point_interval_is_the_exact_law(mechanism, scale, t):
    cal = tree.TreeCalibration(64, mechanism, scale, tree.NodeSensitivity(1, 1))
    m = bin(t).count("1")
    law, centre = _point_law(mechanism, scale, m)
    for level in (0.8, 0.95):
        h = int(tree.point_halfwidth(t, cal, level))
        inside = law[centre - h:centre + h + 1].sum()
        assert inside >= level - 1e-9
        if h > 0:  # the smallest such h
            assert law[centre - h + 1:centre + h].sum() < level
        assert tree.chernoff_halfwidth(mechanism, float(scale), m, 1 - level) >= h - 1e-9
    assert tree.point_variance(t, cal) == pytest.approx(m * cal.node_variance)


def test_error_profile_days():
    cal = tree.calibrate(365, tree.distinct_units_contribution(), PureDP(1))
    prof = tree.error_profile(cal, 0.95)
    assert [p["day"] for p in prof] == [1, 30, 365]
    assert [p["nodes"] for p in prof] == [1, 4, 6]
    assert prof[0]["stddev"] < prof[1]["stddev"] < prof[2]["stddev"]
    assert [p["day"] for p in tree.error_profile(tree.calibrate(90, tree.distinct_units_contribution(), PureDP(1)),
                                                 0.95)] == [1, 30]


def test_expected_abs_error_of_a_point():
    cal = tree.TreeCalibration(64, "discrete_laplace", Fraction(3), tree.NodeSensitivity(1, 1))
    # one node: E|X| of the discrete Laplace, summed directly
    x = np.arange(-400, 401)
    assert tree.point_expected_abs(1, cal) == pytest.approx(
        float(np.dot(np.abs(x), accuracy.discrete_laplace_pmf(Fraction(3), x))), rel=1e-9)
    sd = tree.point_variance(63, cal) ** 0.5
    assert 0.7 * sd < tree.point_expected_abs(63, cal) < sd


@pytest.mark.parametrize("mechanism,scale", [("discrete_laplace", Fraction(3)), ("discrete_gaussian", Fraction(4))])
@pytest.mark.parametrize("t", [1, 3, 7, 31])
def test_band_is_the_point_law_at_the_bonferroni_level(mechanism, scale, t):
    """The band of a point over m points: the point's own exact law at miss probability
    (1 - level) / m (checked against a direct convolution), the smallest such h, wider than
    the pointwise interval, and the same whatever day is being published."""
    cal = tree.TreeCalibration(64, mechanism, scale, tree.NodeSensitivity(1, 1))
    law, centre = _point_law(mechanism, scale, bin(t).count("1"))
    for points in (64, 128):
        alpha = tree.band_alpha(0.95, points)
        assert alpha == pytest.approx(0.05 / points)
        h = int(tree.band_halfwidth(t, cal, 0.95, points))
        assert law[centre - h:centre + h + 1].sum() >= 1 - alpha - 1e-9
        assert law[centre - h + 1:centre + h].sum() < 1 - alpha  # the smallest such h
        assert h > tree.point_halfwidth(t, cal, 0.95)
    assert tree.band_halfwidth(t, cal, 0.95, 128) >= tree.band_halfwidth(t, cal, 0.95, 64)
    with pytest.raises(ConfigError):
        tree.band_halfwidth(t, cal, 0.95, 0)
    with pytest.raises(ConfigError):
        tree.band_halfwidth(t, cal, 1.0, 64)
