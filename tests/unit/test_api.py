"""The Python API builds exactly the YAML spec and plans it without data."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import dp_spark.api as dp
from dp_spark.config import load_release_spec, release_spec_from_dict
from dp_spark.errors import ConfigError
from dp_spark.ledger.policy import load_policies

ROOT = Path(__file__).resolve().parents[2]


def shipped_builder():
    return (dp.release("orders_by_day_region")
            .on("demo_events", unit="user_id")
            .by(day=dp.dates("2026-11-01", "2026-11-30"), region=["region_01", "region_02"])
            .where("order_value IS NOT NULL AND region <> 'test'")
            .bounds(rows_per_unit=10, partitions_per_unit=3, rows_per_partition=5)
            .distinct_units("users").count("orders")
            .sum("revenue", "order_value", 0, 500).mean("aov", "order_value", 0, 500)
            .stddev("order_sd", "order_value", 0, 500).quantile("median_order", "order_value", 0.5, 0, 500)
            .charge(rho=0.5, budget="demo_events_user"))


def test_builder_makes_the_shipped_spec():
    shipped = load_release_spec(ROOT / "conf/releases/orders_by_day_region.yaml")
    built = shipped_builder().spec()
    assert built.version() == shipped.version()
    assert built.statistics == shipped.statistics and built.key_sets == shipped.key_sets
    # and its YAML round-trips to the same spec
    again = release_spec_from_dict(yaml.safe_load(shipped_builder().to_yaml()))
    assert again.version() == shipped.version()


def test_builder_is_immutable_and_positional_columns_need_keys():
    b = dp.release("x").on("demo_events").by("region")
    b2 = b.keys(region=["a", "b"]).count("n").bounds(rows_per_unit=1).charge(epsilon=1, budget="demo_events_user_pure")
    assert b.to_dict()["group_by"][0]["public_keys"] is None
    assert b2.spec().key_sets[0].values == ("a", "b")
    with pytest.raises(ConfigError, match="has no keys"):
        b.count("n").bounds(rows_per_unit=1).charge(rho=1, budget="b").spec()
    with pytest.raises(ConfigError):
        b.charge(budget="b")  # neither rho nor epsilon


def test_plan_reads_no_data_and_reports_every_statistic():
    policies = load_policies(ROOT / "conf/policies/budgets.yaml")
    rows = shipped_builder().plan(group_size=500, budget_policy=policies["demo_events_user"])
    assert [r["statistic"] for r in rows] == ["users", "orders", "revenue", "aov", "order_sd", "median_order"]
    by = {r["statistic"]: r for r in rows}
    assert by["orders"]["components"] == ["rows"] and by["aov"]["components"][0] == "rows"
    assert by["users"]["sensitivity_l1"] == ["3"]
    for r in rows:
        assert r["expected_abs_error"] > 0 and r["interval_half_width"] > 0
        assert r["epsilon"] > 0 and r["delta"] == pytest.approx(1e-7)
    # more rows per cell: a smaller error for the ratio statistics
    small = {r["statistic"]: r for r in shipped_builder().plan(group_size=50)}
    assert small["aov"]["expected_abs_error"] > by["aov"]["expected_abs_error"]


def test_charge_without_a_budget_takes_the_dataset_policy_of_that_measure():
    policies = load_policies(ROOT / "conf/policies/budgets.yaml")
    b = (dp.release("orders").on("demo_events").by(region=["region_01"]).bounds(rows_per_unit=5)
         .count("orders").charge(rho=0.5))
    with pytest.raises(ConfigError):  # no budget id yet: the spec is incomplete
        b.spec()
    assert b.for_policies(policies).spec().budget_id == "demo_events_user"
    pure = b.charge(epsilon=1).for_policies(policies).spec()
    assert pure.budget_id == "demo_events_user_pure"
    with pytest.raises(ConfigError, match="0 zcdp budget policies"):
        b.on("other_data").for_policies(policies)
