"""Statistical tests of the new statistics: the DP inequality of the sum-of-squares component
(shown able to fail with too little noise). The coverage of every kind's interval (variance,
stddev and quantile included) at every level and cell size is the coverage table,
tests/statistical/test_coverage_table.py."""

from __future__ import annotations

from fractions import Fraction

import pytest

from dp_spark.core.budget import PureDP
from dp_spark.mechanisms import DISCRETE_LAPLACE
from dp_spark.statistics.components import Component
from dp_spark.core.units import ContributionBounds, Neighbouring

from tests.statistical.test_dp_inequality import Case, run

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
