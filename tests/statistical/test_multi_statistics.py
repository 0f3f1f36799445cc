"""Statistical tests of the new statistics: the DP inequality of the sum-of-squares component
(shown able to fail with too little noise) and the coverage of the variance, stddev and
quantile intervals (seeded; 95% nominal)."""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
import pytest

from dp_spark.budget import PureDP, ZCDP
from dp_spark.config import release_spec_from_dict
from dp_spark.mechanisms import DISCRETE_LAPLACE
from dp_spark.mechanisms.samplers import SeededNoiseSource
from dp_spark.statistics.components import Component
from dp_spark.statistics.plan import plan_query
from dp_spark.units import ContributionBounds, Neighbouring

from tests.statistical.test_dp_inequality import Case, run
from tests.unit.test_statistics import _truth_partials

pytestmark = pytest.mark.slow


def _square_case() -> Case:
    """nsumsq of one cell, K = 1, pure eps = 1: D' adds one unit whose value sits at a clamp
    bound, so its centred square is +S, the sensitivity in grid units."""
    from dp_spark.statistics.base import align_clamp

    clamp = align_clamp("v", Fraction(0), Fraction(100))
    comp = Component("nsumsq", clamp)
    plan = comp.plan(ContributionBounds(max_rows_per_unit=1), Neighbouring.ADD_REMOVE_UNIT, PureDP(1), 1)
    k2, s = comp.square_grid
    assert plan.sensitivity_grid.l1 == s
    return Case("sum_of_squares", DISCRETE_LAPLACE, 12345, 12345 + s, plan.scale, 1.0, 0.0, max(s // 4, 1))


def test_square_component_satisfies_the_dp_inequality():
    case = _square_case()
    res = run(case, 1.0)
    assert res["majority_pass"], res
    assert res["eps_lcb"] <= case.epsilon, res


def test_square_component_check_detects_too_little_noise():
    case = _square_case()
    res = run(case, 1.2)
    assert not res["majority_pass"], res


def _spec(kind: str, measure: str, **extra):
    budget = {"id": "b", "measure": measure, **({"rho": 2} if measure == "zcdp" else {"epsilon": 2})}
    stat = {"name": "s", "kind": kind, "column": "v", "lower": 0, "upper": 100, **extra}
    return release_spec_from_dict({
        "name": "t", "dataset": "d", "privacy_unit": {"kind": "user", "column": "u"},
        "bounds": {"max_rows_per_unit": 1}, "statistics": [stat], "budget": budget}, "t.yaml")


def _coverage(kind, measure, truth_fn, reps=1500, n=2000, seed=5, **extra):
    spec = _spec(kind, measure, **extra)
    plan = plan_query(spec)
    rng = random.Random(seed)
    vals = [min(max(rng.gauss(40, 15), 0.0), 100.0) for _ in range(n)]
    partials = _truth_partials(plan, {0: vals})
    truth = truth_fn(plan, vals)
    src = SeededNoiseSource(seed)  # seeded: the test is deterministic
    hits = 0
    for _ in range(reps):
        (c,) = plan.noise(partials, src)
        hits += c["ci_low"] <= truth <= c["ci_high"]
    return hits / reps


def _var(plan, vals):
    from dp_spark.mechanisms.release import value_to_grid

    clamp = plan.components[0].clamp if plan.components[0].clamp else plan.components[1].clamp
    b = ContributionBounds(max_rows_per_unit=1, lower=clamp.lower, upper=clamp.upper)
    xs = np.array([float(value_to_grid(v, b, clamp.grid_exponent) * Fraction(2) ** clamp.grid_exponent)
                   for v in vals])
    return float(np.mean(xs * xs) - np.mean(xs) ** 2)


@pytest.mark.parametrize("measure", ["zcdp", "pure_dp"])
def test_variance_and_stddev_intervals_cover(measure):
    cov_v = _coverage("variance", measure, _var)
    cov_s = _coverage("stddev", measure, lambda p, v: _var(p, v) ** 0.5)
    # 1,500 seeded repetitions: the 93-97% band at 95% is +-3.5 standard errors (0.0056)
    assert 0.93 <= cov_v <= 0.975, cov_v
    assert 0.93 <= cov_s <= 0.975, cov_s


@pytest.mark.parametrize("measure", ["zcdp", "pure_dp"])
def test_quantile_interval_covers(measure):
    def median(plan, vals):
        s = sorted(vals)
        return s[(len(s) + 1) // 2 - 1]  # min{v: F(v) >= 1/2}

    # noise-dominated: a small group and fine bins, so the interval is not just one bin
    cov = _coverage("quantile", measure, median, reps=400, n=150, q=0.5, bins=256)
    # conservative by construction (the ends are bin edges): measured 0.97-0.975 here
    assert 0.93 <= cov <= 0.99, cov


def test_coverage_check_detects_too_narrow_intervals(monkeypatch):
    """The coverage test can fail: halve the noise half-widths the variance interval uses."""
    import dp_spark.statistics.moments as moments

    real = moments.halfwidth
    monkeypatch.setattr(moments, "halfwidth", lambda plan, alpha: real(plan, alpha) / 2)
    cov = _coverage("variance", "zcdp", _var)
    assert cov < 0.93, cov
