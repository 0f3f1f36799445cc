"""Accounting with delta (issue 14 item 2) and the epsilon form of a zCDP charge (issue 16
item 3): budget arithmetic and JSON, events, the accountant's costs and statements, the
budget policy's delta cap and the release spec's budget block. No Spark."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from dp_spark.accountant import Accountant, DeltaCapExceededError, PrivacyFilter
from dp_spark.core.budget import ApproxDP, PureDP, ZCDP, budget_from_json, parse_budget
from dp_spark.config import release_spec_from_dict
from dp_spark.errors import BudgetExceededError, ConfigError, InvalidBudgetError
from dp_spark.core.events import (ComposedEvent, InvalidEventError, NoiseEvent, canonical_json, event_from_json,
                             event_to_json)
from dp_spark.ledger.policy import policies_from_dict
from dp_spark.mechanisms.calibration import zcdp_to_approx_epsilon

D7 = Fraction(1, 10**7)
D8 = Fraction(1, 10**8)


# -- budgets -----------------------------------------------------------------------------
def test_delta_defaults_to_zero_and_arithmetic_includes_it():
    assert ZCDP(1).delta == 0 and PureDP(1).delta == 0
    a, b = ZCDP("0.5", "1e-8"), ZCDP("0.25")
    assert a + b == ZCDP("0.75", D8)
    assert (a + a) - b == ZCDP("0.75", 2 * D8)
    assert (b - a).is_zero()  # floored at 0 per component
    assert a * 3 == ZCDP("1.5", 3 * D8)
    assert PureDP(1, D8) + PureDP(2) == PureDP(3, D8)
    assert a.fits_in(ZCDP(1, D7)) and not a.fits_in(ZCDP(1))  # a delta does not fit a 0 delta cap
    assert not ZCDP(2, D8).fits_in(ZCDP(1, D7))
    assert ZCDP(1) == ZCDP(1, 0) and hash(ZCDP(1)) == hash(ZCDP(1, 0))


@pytest.mark.parametrize("bad", [-1e-9, 1, 1.5, float("nan")])
def test_delta_is_checked(bad):
    with pytest.raises(InvalidBudgetError, match="delta"):
        ZCDP(1, bad)
    with pytest.raises(InvalidBudgetError, match="delta"):
        PureDP(1, bad)


def test_json_omits_a_zero_delta_and_round_trips_both_forms():
    assert ZCDP("0.5").to_json() == {"measure": "zcdp", "rho": "1/2"}  # byte-identical to before
    assert PureDP(1).to_json() == {"measure": "pure_dp", "epsilon": "1"}
    assert ZCDP("0.5", D8).to_json() == {"measure": "zcdp", "rho": "1/2", "delta": "1/100000000"}
    for b in (ZCDP("0.5"), ZCDP("0.5", D8), PureDP(2), PureDP(2, D7), ApproxDP(1, 0), ApproxDP(1, D7)):
        assert budget_from_json(b.to_json()) == b
    assert budget_from_json({"measure": "zcdp", "rho": "1/2", "delta": "0"}) == ZCDP("0.5")
    assert ApproxDP(1, 0).to_json() == {"measure": "approx_dp", "epsilon": "1", "delta": "0"}  # unchanged
    with pytest.raises(InvalidBudgetError):
        budget_from_json({"measure": "zcdp", "rho": "1", "delta": "1"})


def test_str_shows_delta_only_when_positive():
    assert str(ZCDP("0.5")) == "zcdp(rho=0.5)"
    assert str(ZCDP("0.5", D8)) == "zcdp(rho=0.5, delta=1e-08)"
    assert str(PureDP(1)) == "pure_dp(epsilon=1)"
    assert ZCDP("0.5").as_floats() == {"rho": 0.5}


def test_parse_budget_accepts_delta():
    assert parse_budget("zcdp", rho=1, delta=1e-6) == ZCDP(1, Fraction(1, 10**6))
    assert parse_budget("pure_dp", epsilon=1) == PureDP(1)
    with pytest.raises(InvalidBudgetError):
        parse_budget("zcdp", rho=1, epsilon=1)


# -- events --------------------------------------------------------------------------------
def _lap(**kw):
    return NoiseEvent("discrete_laplace", "count", scale=Fraction(5, 2), sensitivity=Fraction(3), cells=4,
                      partitions_per_unit=3, **kw)


def test_event_json_without_delta_is_unchanged():
    # produced by the code before delta existed (commit 7845b28)
    assert canonical_json(_lap()) == (
        '{"cells":4,"format":1,"grid_exponent":0,"l2_squared":null,"mechanism":"discrete_laplace",'
        '"parallel":false,"partitions_per_unit":3,"scale":"5/2","sensitivity":"3","statistic":"count",'
        '"type":"noise"}')


def test_event_delta_round_trip_and_validation():
    e = _lap(delta=D8)
    d = event_to_json(e)
    assert d["delta"] == "1/100000000"
    assert event_from_json(json.loads(canonical_json(e))) == e
    assert event_from_json(event_to_json(_lap())).delta == 0
    assert e.natural_cost() == PureDP(Fraction(6, 5), D8)
    # a thresholded Gaussian (private key selection under zCDP): delta-approximate rho-zCDP
    g = NoiseEvent("discrete_gaussian", "count", scale=Fraction(2), l2_squared=Fraction(1), delta=D8)
    assert g.natural_cost() == ZCDP(Fraction(1, 8), D8)
    assert event_from_json(json.loads(canonical_json(g))) == g
    with pytest.raises(InvalidEventError, match="delta"):
        _lap(delta=Fraction(1))
    with pytest.raises(InvalidEventError):
        _lap(delta=0.1)  # floats are not exact


# -- accountant ----------------------------------------------------------------------------
def test_costs_with_delta_per_measure():
    e = NoiseEvent("discrete_laplace", "count", scale=Fraction(2), sensitivity=Fraction(1), delta=D8)
    assert Accountant("pure_dp").cost(e) == PureDP(Fraction(1, 2), D8)
    assert Accountant("zcdp", statement_delta=D7).cost(e) == ZCDP(Fraction(1, 8), D8)
    assert Accountant("approx_dp").cost(e) == ApproxDP(Fraction(1, 2), D8)
    g = NoiseEvent("discrete_gaussian", "count", scale=Fraction(2), l2_squared=Fraction(1))
    both = ComposedEvent((e, g, e))
    assert Accountant("zcdp", statement_delta=D7).cost(both) == ZCDP(Fraction(1, 8) * 2 + Fraction(1, 8), 2 * D8)


def test_statement_delta_adds_the_delta_spent():
    acc = Accountant("zcdp", statement_delta=D7)
    plain = acc.statement(ZCDP("0.5"))
    assert plain["delta"] == pytest.approx(1e-7) and "delta_spent" not in plain  # unchanged without delta
    st = acc.statement(ZCDP("0.5", D8))
    assert st["epsilon"] == zcdp_to_approx_epsilon(Fraction(1, 2), D7) == plain["epsilon"]
    assert st["delta_exact"] == str(D7 + D8) and st["delta_spent_exact"] == str(D8)
    assert st["delta"] == pytest.approx(1.1e-7)
    pure = Accountant("pure_dp").statement(PureDP(1, D8))
    assert (pure["epsilon"], pure["delta_exact"]) == (1.0, str(D8))
    assert Accountant("pure_dp").statement(PureDP(1))["delta_exact"] == "0"


def test_filter_refuses_over_the_delta_cap_naming_the_field():
    f = PrivacyFilter(Accountant("zcdp", statement_delta=D7), ZCDP(2), "demo_events_user")
    f.charge_budget(ZCDP(1))
    with pytest.raises(DeltaCapExceededError) as info:
        f.charge_budget(ZCDP("0.1", D8))
    assert "has delta_cap 0" in str(info.value) and "budgets.demo_events_user" in str(info.value)
    g = PrivacyFilter(Accountant("pure_dp"), PureDP(2, D7), "p")
    g.charge_budget(PureDP(1, D8))
    with pytest.raises(DeltaCapExceededError, match="delta exhausted"):
        g.charge_budget(PureDP("0.1", D7))
    with pytest.raises(BudgetExceededError):
        g.charge_budget(PureDP(2))
    assert g.remaining == PureDP(1, D7 - D8)


# -- policy --------------------------------------------------------------------------------
def _pol(**extra):
    return {"version": 1, "budgets": {"b": {"dataset": "d", "privacy_unit": "user", "measure": "zcdp",
                                            "cap": {"rho": 2}, "statement_delta": 1e-7, **extra}}}


def test_policy_delta_cap():
    p = policies_from_dict(_pol(delta_cap=1e-6))["b"]
    assert p.cap == ZCDP(2, Fraction(1, 10**6)) and p.delta_cap == Fraction(1, 10**6)
    assert p.to_json()["delta_cap"] == "1/1000000"
    q = policies_from_dict(_pol())["b"]
    assert q.delta_cap == 0 and "delta_cap" not in q.to_json()
    r = policies_from_dict(_pol(delta_cap=1e-6, max_per_release={"rho": 1, "delta": 1e-7}))["b"]
    assert r.max_per_release == ZCDP(1, D7)
    for bad, field in (({"delta_cap": 1}, "budgets.b.delta_cap"), ({"delta_cap": -1e-9}, "budgets.b.delta_cap"),
                       ({"delta_cap": "x"}, "budgets.b.delta_cap"),
                       ({"cap": {"rho": 2, "delta": 1e-6}}, "budgets.b.cap"),
                       ({"max_per_release": {"rho": 1, "delta": 1e-7}}, "budgets.b.max_per_release")):
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            policies_from_dict(_pol(**bad))


# -- the release spec's budget block -------------------------------------------------------
SPEC = {
    "name": "aov_by_region", "family": "aov_by_region", "description": "AOV per region",
    "dataset": "demo_events", "privacy_unit": {"kind": "user", "column": "user_id"},
    "neighbouring": "add_remove_unit", "metric": "mean",
    "group_by": {"column": "region", "public_keys": {"values": ["r1", "r2", "r3"]}},
    "value": {"column": "order_value", "lower": 0, "upper": 500},
    "bounds": {"max_rows_per_unit": 10, "max_partitions_per_unit": 1, "max_rows_per_partition": 10},
    "mean": {"assumed_group_size": 900, "assumed_mean": 45, "min_count": 20},
    "budget": {"id": "demo_events_user", "measure": "zcdp", "rho": 0.25},
    "confidence": 0.95, "on_exhausted": "reject",
}


def _spec(**budget):
    return release_spec_from_dict({**SPEC, "budget": {"id": "demo_events_user", **budget}}, "t.yaml")


def _charge(**budget):
    """The budget block's parsing alone (whether a spec may spend delta at all depends on its
    private keys, checked after it)."""
    from dp_spark.spec.release import budget_charge

    return budget_charge({"id": "x", **budget}, "t.yaml")


def test_release_id_of_a_spec_without_delta_is_unchanged():
    from dp_spark.engine import release_id_for

    s = release_spec_from_dict(SPEC, "t.yaml")
    # computed by the code before delta existed (commit 7845b28)
    assert s.version() == "d9e4ff52e6d7b145"
    assert release_id_for(s, "tbl-1", 7, "official") == "c3cdf4c139d8c01a41f47873795ed11c"
    assert "delta" not in s.canonical()["charge"]
    assert _charge(measure="zcdp", rho=0.25, delta=0) == s.charge  # an explicit 0: the same charge


def test_zcdp_epsilon_form_is_the_largest_rho_within_epsilon():
    for eps, delta in ((1, 1e-7), (0.3, 1e-9), (5, 1e-6)):
        s = _spec(measure="zcdp", epsilon=eps, delta=delta)
        rho = s.charge.rho
        assert isinstance(s.charge, ZCDP) and s.charge.delta == 0  # delta is the conversion's, not spent
        d = Fraction(repr(delta))
        assert Fraction(zcdp_to_approx_epsilon(rho, d)) <= Fraction(repr(float(eps)))  # converts back within eps
        bigger = rho * (1 + Fraction(1, 10**9))
        assert Fraction(zcdp_to_approx_epsilon(bigger, d)) > Fraction(repr(float(eps)))  # largest within 1e-9


def test_budget_block_delta():
    assert _charge(measure="zcdp", rho=0.5, delta=1e-8) == ZCDP("0.5", D8)
    assert _charge(measure="pure_dp", epsilon=1, delta=1e-8) == PureDP(1, D8)
    assert ZCDP("0.5", D8).to_json()["delta"] == "1/100000000"  # and so in the spec's canonical charge
    for bad in (1, 1.5, -1e-9, "x"):
        for measure, amount in (("zcdp", {"rho": 0.5}), ("pure_dp", {"epsilon": 1})):
            with pytest.raises(ConfigError, match=r"'budget\.delta'"):
                _spec(measure=measure, delta=bad, **amount)
    with pytest.raises(ConfigError, match=r"'budget(\.delta)?'"):
        _spec(measure="zcdp", epsilon=1)  # the epsilon form needs its conversion delta
    with pytest.raises(ConfigError, match=r"'budget'"):
        _spec(measure="zcdp", epsilon=1, rho=0.5, delta=1e-7)
