"""The accountant: exact pricing, composition, the filter, statements."""

from __future__ import annotations

import math
from fractions import Fraction as F

import pytest

from dp_spark.accountant import Accountant, PrivacyFilter
from dp_spark.core.budget import ApproxDP, PureDP, ZCDP
from dp_spark.errors import BudgetExceededError, ConfigError, InvalidBudgetError, MeasureMismatchError
from dp_spark.core.events import ComposedEvent, NoiseEvent
from dp_spark.core.units import Aggregate, ContributionBounds, Neighbouring, sensitivity


def lap_eps(eps, stat="c") -> NoiseEvent:
    """A Laplace event of cost exactly eps (sensitivity 1, scale 1/eps)."""
    return NoiseEvent("discrete_laplace", stat, 1 / F(eps), sensitivity=F(1))


def gau(rho) -> NoiseEvent:
    """A Gaussian event of cost exactly rho (l2^2 = 2 rho sigma^2 with sigma = 1)."""
    return NoiseEvent("discrete_gaussian", "s", F(1), l2_squared=2 * F(rho))


def test_pure_costs_and_composition():
    acc = Accountant("pure_dp")
    assert acc.cost(lap_eps(F(1, 10))) == PureDP(F(1, 10))
    assert acc.compose([lap_eps(F(1, 10)), lap_eps(F(1, 5))]) == PureDP(F(3, 10))
    assert acc.compose([]) == PureDP.zero()
    nested = ComposedEvent((lap_eps(F(1, 10)), ComposedEvent((lap_eps(F(1, 5)), lap_eps(F(1, 2))))))
    assert acc.cost(nested) == PureDP(F(4, 5))


def test_point_one_plus_point_two_fits_point_three():
    acc = Accountant("pure_dp")
    spent = acc.cost(lap_eps(PureDP(0.1).epsilon))
    acc.check(spent, PureDP(0.2), PureDP(0.3), "b")  # RELIABILITY 21: no float drift
    with pytest.raises(BudgetExceededError):
        acc.check(spent, PureDP(0.2000001), PureDP(0.3), "b")


def test_pure_under_zcdp_is_eps_squared_over_two():
    acc = Accountant("zcdp", statement_delta=F(1, 10**6))
    assert acc.cost(lap_eps(F(1, 3))) == ZCDP(F(1, 18))
    assert acc.cost(gau(F(1, 7))) == ZCDP(F(1, 7))
    assert acc.compose([lap_eps(1), gau(F(1, 2))]) == ZCDP(1)


def test_measure_mismatches():
    with pytest.raises(MeasureMismatchError):
        Accountant("pure_dp").cost(gau(F(1, 2)))
    with pytest.raises(MeasureMismatchError):
        Accountant("approx_dp").cost(gau(F(1, 2)))  # Gaussian budgets are zCDP
    assert Accountant("approx_dp").cost(lap_eps(F(1, 2))) == ApproxDP(F(1, 2), 0)
    acc = Accountant("pure_dp")
    with pytest.raises(MeasureMismatchError):
        acc.check(PureDP.zero(), ZCDP(1), PureDP(1))
    with pytest.raises(MeasureMismatchError):
        acc.check(ZCDP.zero(), PureDP(1), PureDP(1))
    with pytest.raises(MeasureMismatchError):
        acc.check(PureDP.zero(), PureDP(1), ApproxDP(1, 0))


def test_bad_accountants():
    with pytest.raises(ConfigError):
        Accountant("renyi")
    with pytest.raises(ConfigError):
        Accountant("pure_dp", statement_delta=F(1, 100))
    with pytest.raises(InvalidBudgetError):
        Accountant("zcdp", statement_delta=0)
    with pytest.raises(InvalidBudgetError):
        Accountant("zcdp", statement_delta=1)


def test_budget_exceeded_fields_are_exact():
    acc = Accountant("zcdp", statement_delta=F(1, 10**6))
    spent, req, cap = ZCDP(F(1, 3)), ZCDP(F(1, 3)), ZCDP(F(1, 2))
    with pytest.raises(BudgetExceededError) as exc:
        acc.check(spent, req, cap, "dau_users")
    e = exc.value
    assert e.budget_id == "dau_users" and e.cap == cap and e.spent == spent and e.requested == req
    acc.check(spent, ZCDP(F(1, 6)), cap, "dau_users")  # exactly the cap fits


def test_approx_check_is_per_component():
    acc = Accountant("approx_dp")
    cap = ApproxDP(1, F(1, 10**6))
    acc.check(ApproxDP(F(1, 2), 0), ApproxDP(F(1, 2), F(1, 10**6)), cap)
    with pytest.raises(BudgetExceededError):
        acc.check(ApproxDP(F(1, 2), F(1, 10**6)), ApproxDP(F(1, 4), F(1, 10**9)), cap)


def test_laplace_charge_scales_with_l0():
    """L0 = 3 partitions per unit cost 3x L0 = 1 at equal scale: parallel composition only at L0 = 1."""
    acc = Accountant("pure_dp")
    scale = F(5)
    costs = {}
    for l0 in (1, 3):
        b = ContributionBounds(max_rows_per_unit=3, max_partitions_per_unit=l0, max_rows_per_partition=1)
        s = sensitivity(Aggregate.ROW_COUNT, b, Neighbouring.ADD_REMOVE_UNIT)
        e = NoiseEvent("discrete_laplace", "count", scale, sensitivity=s.l1, cells=30,
                       partitions_per_unit=b.effective_l0)
        assert e.parallel is (l0 == 1)
        costs[l0] = acc.cost(e)
    assert costs[3] == 3 * costs[1]
    assert costs[1] == PureDP(F(1, 5))  # 30 disjoint cells cost as one


def test_adaptive_charges_stop_at_the_cap():
    """A privacy filter (RELIABILITY 22): each next epsilon depends on the previous outputs;
    the sum of accepted charges never exceeds the cap, and the first charge that would
    exceed it is refused (and spends nothing)."""
    acc = Accountant("pure_dp")
    filt = PrivacyFilter(acc, PureDP(1), "b1")
    last_output = 0
    accepted = []
    refused = None
    for step in range(100):
        # an adaptive analyst: the next epsilon depends on the last (pretend) output
        eps = F(1, 10) if last_output % 2 == 0 else F(3, 20)
        try:
            filt.charge(lap_eps(eps, f"q{step}"))
        except BudgetExceededError as exc:
            refused = exc
            break
        accepted.append(eps)
        last_output = step * 7 + len(accepted)
    assert refused is not None and refused.budget_id == "b1"
    assert sum(accepted) <= 1 and sum(accepted) + refused.requested.epsilon > 1
    assert filt.spent == PureDP(sum(accepted))
    # the refusal spent nothing; a charge that still fits is accepted
    rest = filt.remaining
    if not rest.is_zero():
        filt.charge_budget(rest)
    assert filt.spent == PureDP(1)
    with pytest.raises(BudgetExceededError):
        filt.charge(lap_eps(F(1, 10**9)))


def test_adaptive_zcdp_filter():
    acc = Accountant("zcdp", statement_delta=F(1, 10**6))
    filt = PrivacyFilter(acc, ZCDP(F(1, 2)))
    for _ in range(4):
        filt.charge(gau(F(1, 8)))
    with pytest.raises(BudgetExceededError):
        filt.charge(lap_eps(F(1, 1000)))  # rho = 1/2000000 no longer fits
    assert filt.spent == ZCDP(F(1, 2))


def test_statements():
    st = Accountant("pure_dp").statement(PureDP(F(1, 3)))
    assert st["measure"] == "pure_dp" and st["epsilon_exact"] == "1/3" and st["delta"] == 0.0
    assert st["epsilon"] == pytest.approx(1 / 3)
    st = Accountant("approx_dp").statement(ApproxDP(1, F(1, 10**6)))
    assert st["delta_exact"] == "1/1000000" and st["epsilon"] == 1.0
    with pytest.raises(ConfigError):
        Accountant("zcdp").statement(ZCDP(1))  # no stated delta


def test_zcdp_statement_uses_the_conversion():
    pytest.importorskip("dp_spark.mechanisms.calibration")
    from dp_spark.mechanisms.calibration import zcdp_to_approx_epsilon

    acc = Accountant("zcdp", statement_delta=F(1, 10**6))
    st = acc.statement(ZCDP(F(1, 2)))
    assert st["rho_exact"] == "1/2" and st["delta_exact"] == "1/1000000"
    assert st["epsilon"] == pytest.approx(float(zcdp_to_approx_epsilon(F(1, 2), F(1, 10**6))))
    # the classic bound rho + 2 sqrt(rho ln(1/delta)) is an upper bound on the conversion
    classic = 0.5 + 2 * math.sqrt(0.5 * math.log(10**6))
    assert 0 < st["epsilon"] <= classic
    assert acc.statement(ZCDP.zero())["epsilon"] == 0.0
