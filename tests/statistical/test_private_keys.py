"""Private key selection: the threshold, the lone-unit bound (statistically, with the
production sampler), the per-column limit, the spec and the plan (no Spark here)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import yaml

from dp_spark.accountant import Accountant
from dp_spark.core.budget import ZCDP
from dp_spark.config import PrivateKeys, release_spec_from_dict
from dp_spark.errors import ConfigError
from dp_spark.mechanisms.samplers import OpenDPNoiseSource
from dp_spark.statistics.plan import plan_query
from dp_spark.core.events import GAUSSIAN, LAPLACE
from dp_spark.statistics.selection import (
    gaussian_tail,
    gaussian_threshold,
    keep_over_threshold,
    laplace_threshold,
    limit_keys,
    publish_probability,
)

SPEC = {
    "name": "orders_by_found_region",
    "dataset": "demo_events",
    "privacy_unit": {"kind": "user", "column": "user_id"},
    "group_by": [{"column": "day", "public_keys": {"dates": {"start": "2026-11-01", "end": "2026-11-07"}}},
                 {"column": "region", "private_keys": {"max_keys": 50}}],
    "bounds": {"max_rows_per_unit": 10, "max_partitions_per_unit": 3, "max_rows_per_partition": 5},
    "statistics": [{"name": "users", "kind": "distinct_units"},
                   {"name": "revenue", "kind": "sum", "column": "order_value", "lower": 0, "upper": 500}],
    "budget": {"id": "demo_events_user", "measure": "zcdp", "rho": 0.5, "delta": 1e-8},
    "max_cells": 5000,
}


def spec(**changes):
    d = yaml.safe_load(yaml.safe_dump(SPEC))
    d.update(changes)
    return release_spec_from_dict(d)


def _binomial_sf(k: int, n: int, p: float) -> float:
    """P[Bin(n, p) >= k], exactly enough for the test's sizes (log-space terms)."""
    if k <= 0:
        return 1.0
    total = 0.0
    for i in range(k, n + 1):
        total += math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                          + i * math.log(p) + (n - i) * math.log1p(-p))
    return min(1.0, total)


# --- the threshold -------------------------------------------------------------------------
@pytest.mark.parametrize("scale,delta,m", [(Fraction(2), Fraction(1, 10**8), 1), (Fraction(6), Fraction(1, 10**6), 3),
                                           (Fraction(1, 3), Fraction(1, 20), 1), (Fraction(40), Fraction(1, 10**9), 20)])
def test_threshold_is_the_smallest_with_a_lone_key_tail_below_delta_over_m(scale, delta, m):
    tau = laplace_threshold(scale, delta, m)
    p = float(delta) / m
    # a key with one unit passes with probability <= delta / m; one less would exceed it
    assert publish_probability(1, scale, tau) <= p
    if tau > 2:
        assert publish_probability(1, scale, tau - 1) > p
    # the tail formula itself against a direct sum of the discrete Laplace pmf
    b = float(scale)
    t = math.exp(-1 / b)
    norm = (1 - t) / (1 + t)
    direct = sum(norm * t ** x for x in range(tau - 1, tau - 1 + 20000))
    assert direct == pytest.approx(publish_probability(1, scale, tau), rel=1e-6)


def test_a_key_with_many_units_is_published_almost_surely():
    scale, tau = Fraction(4), laplace_threshold(Fraction(4), Fraction(1, 10**8), 3)
    assert publish_probability(tau + 60, scale, tau) > 0.99999
    assert publish_probability(tau, scale, tau) > 0.5


def _lone_key_rate_consistent(threshold: int, scale: Fraction, delta: float, n: int,
                              mechanism: str = LAPLACE) -> tuple[int, float]:
    """Selections of n keys with one unit each, drawn by the production (OpenDP) sampler; the
    p-value of seeing that many or more if the true rate were delta."""
    kept = keep_over_threshold([1] * n, scale, threshold, OpenDPNoiseSource(), mechanism=mechanism)
    hits = sum(v is not None for v in kept)
    return hits, _binomial_sf(hits, n, delta)


def test_a_key_created_by_one_unit_is_published_with_rate_at_most_delta():
    # delta large enough to be observed: 20,000 lone keys, one selection each (m = 1)
    scale, delta, n = Fraction(5), 0.05, 20_000
    tau = laplace_threshold(scale, Fraction(delta).limit_denominator(), 1)
    hits, p_value = _lone_key_rate_consistent(tau, scale, delta, n)
    assert p_value > 1e-4, "lone keys published more often than delta allows"
    # and close to the computed probability (the threshold is not needlessly high either)
    expected = publish_probability(1, scale, tau)
    sd = math.sqrt(n * expected * (1 - expected))
    assert abs(hits - n * expected) < 5 * sd


def test_the_lone_key_check_catches_a_threshold_one_too_low():
    # the same check, on a deliberately wrong threshold, must fail: it has the power to
    scale, delta, n = Fraction(5), 0.05, 20_000
    tau = laplace_threshold(scale, Fraction(delta).limit_denominator(), 1)
    hits, p_value = _lone_key_rate_consistent(tau - 1, scale, delta, n)
    assert p_value < 1e-4


# --- the Gaussian threshold (zCDP) ---------------------------------------------------------------
@pytest.mark.parametrize("sigma,delta,m", [(Fraction(2), Fraction(1, 10**8), 1), (Fraction(37, 10), Fraction(1, 10**8), 3),
                                           (Fraction(1, 3), Fraction(1, 20), 1), (Fraction(40), Fraction(1, 10**9), 20),
                                           (Fraction(3), Fraction(1, 20), 1)])
def test_gaussian_threshold_is_the_smallest_with_a_lone_key_tail_below_delta_over_m(sigma, delta, m):
    tau = gaussian_threshold(sigma, delta, m)
    p = float(delta) / m
    assert publish_probability(1, sigma, tau, GAUSSIAN) <= p
    if tau > 2:  # minimality: one less would let a lone key through too often
        assert publish_probability(1, sigma, tau - 1, GAUSSIAN) > p
    # the tail against a direct sum of the discrete Gaussian pmf over a wide window
    s = float(sigma)
    n = int(80 * s) + 80
    weights = [math.exp(-x * x / (2 * s * s)) for x in range(-n, n + 1)]
    direct = math.fsum(weights[n + tau - 1:]) / math.fsum(weights)
    assert direct == pytest.approx(publish_probability(1, sigma, tau, GAUSSIAN), rel=1e-9)
    # symmetric: a key far above the threshold is published with the mirrored probability
    assert publish_probability(tau + tau - 2, sigma, tau, GAUSSIAN) == pytest.approx(1 - gaussian_tail(tau - 1, s))


def test_gaussian_lone_key_is_published_with_rate_at_most_delta():
    sigma, delta, n = Fraction(3), 0.05, 20_000
    tau = gaussian_threshold(sigma, Fraction(delta).limit_denominator(), 1)
    hits, p_value = _lone_key_rate_consistent(tau, sigma, delta, n, GAUSSIAN)
    assert p_value > 1e-4, "lone keys published more often than delta allows"
    expected = publish_probability(1, sigma, tau, GAUSSIAN)
    sd = math.sqrt(n * expected * (1 - expected))
    assert abs(hits - n * expected) < 5 * sd


def test_the_gaussian_lone_key_check_catches_a_threshold_one_too_low():
    sigma, delta, n = Fraction(3), 0.05, 20_000
    tau = gaussian_threshold(sigma, Fraction(delta).limit_denominator(), 1)
    hits, p_value = _lone_key_rate_consistent(tau - 1, sigma, delta, n, GAUSSIAN)
    assert p_value < 1e-4


def test_the_gaussian_check_catches_laplace_noise_at_the_gaussian_threshold():
    # the sampler matters: Laplace draws of the same scale have heavier tails and fail the check
    sigma, delta, n = Fraction(3), 0.05, 20_000
    tau = gaussian_threshold(sigma, Fraction(delta).limit_denominator(), 1)
    kept = keep_over_threshold([1] * n, sigma, tau, OpenDPNoiseSource(), mechanism=LAPLACE)
    assert _binomial_sf(sum(v is not None for v in kept), n, delta) < 1e-4


def _with_mechanism(mechanism, **changes):
    gb = [{"column": "day", "public_keys": {"dates": {"start": "2026-11-01", "end": "2026-11-07"}}},
          {"column": "region", "private_keys": {"max_keys": 50, "mechanism": mechanism}}]
    return spec(group_by=gb, **changes)


def test_zcdp_plan_shows_both_thresholds_and_cheaper_picks_the_gaussian():
    laplace, gauss, cheap = (plan_query(_with_mechanism(m)).selection for m in ("laplace", "gaussian", "cheaper"))
    assert plan_query(spec()).selection.mechanism == LAPLACE  # no mechanism named: today's selection
    assert laplace.mechanism == LAPLACE and gauss.mechanism == GAUSSIAN and cheap.mechanism == GAUSSIAN
    assert [a.mechanism for a in cheap.alternatives] == [LAPLACE, GAUSSIAN]
    assert cheap.threshold == gauss.threshold < laplace.threshold  # 22 units against 115 here
    assert gauss.epsilon is None and gauss.sensitivity == 3  # L2^2 = m under add/remove
    # sigma pays for exactly the selection's quarter of rho
    assert gauss.event.natural_cost().rho <= Fraction(1, 8)
    assert gauss.scale == gauss.event.scale and gauss.event.delta == Fraction(1, 10**8)
    s = _with_mechanism("gaussian")
    qp = plan_query(s)
    cost = Accountant("zcdp", statement_delta=Fraction(1, 10**7)).cost(qp.event)
    assert cost.fits_in(s.charge) and cost.delta == s.charge.delta and cost.rho > Fraction(499, 1000)
    # replacing a unit doubles the squared L2 sensitivity
    assert plan_query(_with_mechanism("gaussian", neighbouring="replace_unit")).selection.sensitivity == 6


def test_pure_dp_has_only_the_laplace_threshold():
    pure = {"id": "b", "measure": "pure_dp", "epsilon": 2, "delta": 1e-6}
    sel = plan_query(_with_mechanism("cheaper", budget=pure)).selection
    assert sel.mechanism == LAPLACE and len(sel.alternatives) == 1
    with pytest.raises(ConfigError) as exc:
        _with_mechanism("gaussian", budget=pure)
    assert "'group_by[1].private_keys.mechanism'" in str(exc.value)


def test_the_mechanism_enters_the_canonical_form_only_when_it_changes_the_selection():
    base = spec().canonical()
    assert _with_mechanism("laplace").canonical() == base  # same release id as without it
    assert _with_mechanism("gaussian").canonical()["group_by"][1]["mechanism"] == "gaussian"
    assert _with_mechanism("cheaper").canonical() != base
    with pytest.raises(ConfigError, match="mechanism"):
        spec(group_by=[{"column": "region", "private_keys": {"max_keys": 5, "mechanism": "gaussian"}},
                       {"column": "device", "private_keys": {"max_keys": 5, "mechanism": "laplace"}}])


# --- the per-column limit (post-processing of noisy counts) -------------------------------------
def test_limit_keeps_the_largest_noisy_counts_within_each_columns_max():
    cands = [(100, ("a", "x")), (90, ("b", "x")), (80, ("c", "y")), (70, ("a", "z")), (60, ("b", "y"))]
    # region max 2, device max 2: (c, y) would add a third region; after (a, z) the devices
    # are {x, z}, so (b, y) would add a third device
    assert limit_keys(cands, (2, 2), 4) == [("a", "x"), ("a", "z"), ("b", "x")]
    assert limit_keys(cands, (5, 5), 2) == [("a", "x"), ("b", "x")]
    assert limit_keys([], (5,), 5) == []
    # ties broken by the key, never by arrival order
    assert limit_keys([(5, ("b",)), (5, ("a",))], (1,), 1) == [("a",)]


# --- the spec ---------------------------------------------------------------------------------------
def test_spec_reads_private_keys_exactly_as_the_issue_writes_them():
    s = spec()
    assert isinstance(s.key_sets[1], PrivateKeys) and s.key_sets[1].max_keys == 50
    assert s.key_columns == ("day", "region")
    assert s.cells == 7 * 50 and s.charge == ZCDP("0.5", "1e-8")
    assert s.canonical()["group_by"][1] == {"column": "region", "kind": "private", "max_keys": 50, "share": None}
    with pytest.raises(ConfigError):
        _ = s.keys  # not known before the data
    # max_cells counts the most keys that can be selected
    with pytest.raises(ConfigError, match="max_cells"):
        spec(max_cells=7 * 50 * 2 - 1)


@pytest.mark.parametrize("change,field", [
    ({"budget": {"id": "b", "measure": "zcdp", "rho": 0.5}}, "budget.delta"),
    ({"group_by": [{"column": "region", "private_keys": {"max_keys": 5}, "public_keys": {"values": ["a"]}}]},
     "group_by[0]"),
    ({"group_by": [{"column": "region", "private_keys": {"max_keys": 0}}]}, "group_by[0].private_keys.max_keys"),
    ({"group_by": [{"column": "region", "private_keys": {"max_keys": 5, "share": 1}}]}, "group_by[0].private_keys.share"),
    ({"group_by": [{"column": "region", "private_keys": {"max_keys": 5, "typo": 1}}]}, "group_by[0].private_keys.typo"),
    ({"group_by": [{"column": "region", "private_keys": {"max_keys": 5, "share": 0.2}},
                   {"column": "device", "private_keys": {"max_keys": 5, "share": 0.3}}]}, "group_by"),
])
def test_spec_errors_name_the_field(change, field):
    with pytest.raises(ConfigError) as exc:
        spec(**change)
    assert f"'{field}'" in str(exc.value)


def test_delta_is_refused_on_a_release_without_private_keys():
    with pytest.raises(ConfigError, match="budget.delta"):
        spec(group_by=[{"column": "region", "public_keys": {"values": ["region_01"]}}])


def test_the_single_metric_form_finds_keys_privately_through_the_rewrite():
    d = {k: v for k, v in SPEC.items() if k not in ("statistics", "group_by")}
    d.update(metric="distinct_units", group_by={"column": "region", "private_keys": {"max_keys": 5}})
    s = release_spec_from_dict(d)
    assert [k.column for k in s.private_key_sets] == ["region"] and s.charge.delta > 0
    assert plan_query(s).selection.max_tuples == 5


# --- the plan: one event, one charge with its delta ------------------------------------------------
def test_plan_charges_selection_and_statistics_as_one_event_within_the_charge():
    s = spec()
    qp = plan_query(s)
    sel = qp.selection
    assert sel is not None and qp.event.children[0] is sel.event
    assert sel.delta == Fraction(1, 10**8) and sel.max_new_keys == 3 and sel.sensitivity == 3
    # zCDP: the selection's eps^2/2 fits its quarter of rho
    assert sel.epsilon ** 2 / 2 <= Fraction(1, 8) < (sel.epsilon + Fraction(1, 10**9)) ** 2 / 2
    cost = Accountant("zcdp", statement_delta=Fraction(1, 10**7)).cost(qp.event)
    assert cost.fits_in(s.charge) and cost.delta == s.charge.delta
    assert cost.rho > Fraction(499, 1000)  # the whole charge is used, not wasted
    split = qp.split_json()
    assert split["key_selection"] == "1/4"
    assert sum(Fraction(v) for v in split.values()) == 1


def test_pure_dp_plan_spends_epsilon_share_and_delta():
    s = spec(budget={"id": "b", "measure": "pure_dp", "epsilon": 2, "delta": 1e-6},
             group_by=[{"column": "region", "private_keys": {"max_keys": 20, "share": 0.5}}])
    qp = plan_query(s)
    assert qp.selection.epsilon == 1 and qp.selection.scale == 3
    cost = Accountant("pure_dp").cost(qp.event)
    assert cost.fits_in(s.charge) and cost.delta == Fraction(1, 10**6)


def test_replacing_a_unit_doubles_the_selection_sensitivity():
    s = spec(neighbouring="replace_unit")
    assert plan_query(s).selection.sensitivity == 6


# --- the Python API and the plan table --------------------------------------------------------------
def test_python_api_writes_private_keys_as_the_yaml_does_and_plans_the_selection():
    import dp_spark.api as dp

    b = (dp.release("orders_by_found_region").on("demo_events")
         .by(day=dp.dates("2026-11-01", "2026-11-07"), region=dp.private(50))
         .bounds(rows_per_unit=10, partitions_per_unit=3, rows_per_partition=5)
         .distinct_units("users").sum("revenue", "order_value", 0, 500)
         .charge(rho=0.5, delta=1e-8, budget="demo_events_user"))
    d = b.to_dict()
    assert d["group_by"][1] == {"column": "region", "private_keys": {"max_keys": 50}}
    assert d["budget"]["delta"] == 1e-8
    s = b.spec()
    assert s.private_key_sets[0].max_keys == 50
    rows = dp.plan_table(s, group_size=500)
    sel = rows[0]
    assert sel["statistic"] == "key_selection" and sel["threshold_units"] == plan_query(s).selection.threshold
    assert sel["units_for_even_odds"] <= sel["units_for_95_percent"]
    assert publish_probability(sel["units_for_95_percent"], plan_query(s).selection.scale,
                               sel["threshold_units"]) >= 0.95
    # the statistics' shares are of the whole charge: with the selection's they sum to 1
    shares = [Fraction(x) for r in rows for x in r["share_of_charge"]]
    assert sum(shares) == 1
