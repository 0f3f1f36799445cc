"""Private key selection on Spark, end to end: keys nobody listed, found with DP, published with
their statistics in one pass and one charge; keys that one unit alone creates do not appear
(more often than delta allows)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import yaml
from pyspark.sql import functions as F

from dp_spark.backends.spark import build_query_partials, collect_query_partials
from dp_spark.core.budget import ZCDP
from dp_spark.config import load_env, release_spec_from_dict
from dp_spark.engine import Engine, plan_for
from dp_spark.statistics.selection import publish_probability

from tests.statistical.test_private_keys import _binomial_sf
from tests.unit.test_statistics import ZeroSource

from .conftest import ROOT, register

def _lonely_units(spark, location: str, n: int):
    """n new units, each alone in a region of its own (rows copied from real ones)."""
    df = spark.read.format("delta").load(location)
    base = df.where(F.col("order_value").isNotNull()).limit(n)
    idx = F.monotonically_increasing_id()
    return (base.withColumn("user_id", F.concat(F.lit("lonely_u"), idx.cast("string")))
            .withColumn("region", F.concat(F.lit("lonely_r"), idx.cast("string"))))


def _spec_dict(delta: float, l0: int = 1):
    return {
        "name": "found_regions", "family": "found_regions", "dataset": "demo_events",
        "privacy_unit": {"kind": "user", "column": "user_id"},
        "group_by": [{"column": "region", "private_keys": {"max_keys": 1000}}],
        "bounds": {"max_rows_per_unit": 5, "max_partitions_per_unit": l0},
        "statistics": [{"name": "users", "kind": "distinct_units"},
                       {"name": "revenue", "kind": "sum", "column": "order_value", "lower": 0, "upper": 500}],
        "budget": {"id": "any", "measure": "zcdp", "rho": 0.5, "delta": delta},
        "max_cells": 2000,
    }


def test_lone_unit_keys_are_published_at_most_at_rate_delta_and_real_regions_are(spark, warehouse):
    """Neighbouring inputs: the demo data (D) and D plus 400 units each alone in a new region
    (each such region is a key that exists because of one unit). Over the 400 lone keys of one
    run the observed publication rate is at most delta (binomial test), and the demo's regions
    with many users are published. In D no lone key can appear at all."""
    env = load_env(warehouse)
    loc = env.dataset_location("demo_events")
    spec = release_spec_from_dict(_spec_dict(0.05), "found.yaml")
    plan = plan_for(spec)
    sel = plan.selection
    assert sel.max_new_keys == 1
    n_lonely = 400
    base = spark.read.format("delta").load(loc)
    with_lonely = base.unionByName(_lonely_units(spark, loc, n_lonely))
    partials, tuples = collect_query_partials(build_query_partials(with_lonely, plan, "salt-1"), plan)
    published = {t[0] for t in tuples}
    lone = {k for k in published if k.startswith("lonely_r")}
    assert _binomial_sf(len(lone), n_lonely, 0.05) > 1e-4, "lone-unit keys published too often"
    # the demo regions all have hundreds of users: each is published with probability ~1
    regions = {r["region"] for r in base.select("region").distinct().collect()}
    assert publish_probability(100, sel.scale, sel.threshold) > 0.999999
    assert regions <= published
    # every published cell's partials come from the data, indices within the tuples
    assert set(partials) <= set(range(len(tuples)))
    # the neighbour without the lone units: none of their keys can appear
    _, tuples_d = collect_query_partials(build_query_partials(base, plan, "salt-1"), plan)
    assert not any(t[0].startswith("lonely_r") for t in tuples_d)


def test_engine_publishes_found_regions_by_day_with_one_charge_and_no_trace_of_the_rest(spark, warehouse, tmp_path):
    """The shipped spec with 'region' undeclared: day (public) x region (private), one
    charge (rho, delta) in the ledger, the statement names the selection's parameters only."""
    spec = register(warehouse, "orders_by_found_region")
    assert spec.private_key_sets and spec.charge.delta > 0
    env = load_env(warehouse)
    # a lone unit in a region of its own, on a day of the release
    loc = env.dataset_location("demo_events")
    _lonely_units(spark, loc, 1).withColumn("day", F.lit("2026-11-02").cast("date")) \
        .write.format("delta").mode("append").save(loc)
    eng = Engine(env, spark=spark, principal="publisher_bob")
    r = eng.publish(spec)
    assert r.status == "published" and r.charge == spec.charge
    keys = {(row["keys"]["day"], row["keys"]["region"]) for row in r.rows}
    regions = {k[1] for k in keys}
    assert regions and all(k.startswith("region_") for k in regions)  # the lone region: no row
    days = {k[0] for k in keys}
    assert len(days) == 30 and len(keys) == 30 * len(regions)  # every day shows the same regions
    assert {row["statistic"] for row in r.rows} == {s.name for s in spec.statistics}
    t = spark.read.format("delta").load(r.table_path)
    assert t.where(F.col("key").contains("lonely")).count() == 0
    entries = eng.ledger.entries(spec.budget_id)
    assert len(entries) == 1
    assert {row["charge_delta"] for row in r.rows} == {1e-8}
    md = (env.warehouse / "statements" / f"{spec.family}.md").read_text()
    assert "lonely" not in md and "found privately" in md


def test_mixed_public_and_private_columns_and_plan_shuffles(spark, warehouse):
    """Two private columns are selected jointly as tuples and crossed with a public one."""
    rows = []
    for u in range(60):
        rows.append((f"u{u}", "2026-11-01" if u % 2 else "2026-11-02", "north", "ios", 10.0))
        rows.append((f"u{u}", "2026-11-01", "south", "web", 20.0))
    rows.append(("solo", "2026-11-01", "east", "ios", 30.0))  # a tuple of one unit
    df = spark.createDataFrame(rows, "user_id string, day string, region string, device string, v double")
    d = {
        "name": "t", "dataset": "d", "privacy_unit": {"kind": "user", "column": "user_id"},
        "group_by": [{"column": "region", "private_keys": {"max_keys": 5}},
                     {"column": "day", "public_keys": {"values": ["2026-11-01", "2026-11-02"]}},
                     {"column": "device", "private_keys": {"max_keys": 5}}],
        "bounds": {"max_rows_per_unit": 4, "max_partitions_per_unit": 2},
        "statistics": [{"name": "n", "kind": "count"}],
        "budget": {"id": "b", "measure": "zcdp", "rho": 2, "delta": 1e-6},
    }
    spec = release_spec_from_dict(d, "t.yaml")
    plan = plan_for(spec)
    partials, tuples = collect_query_partials(build_query_partials(df, plan, "salt"), plan)
    # (north, ios) and (south, web) have 60 units each: selected; (east, ios) has one
    assert sorted({(t[0], t[2]) for t in tuples}) == [("north", "ios"), ("south", "web")]
    assert len(tuples) == 2 * 2 and all(t[1] in ("2026-11-01", "2026-11-02") for t in tuples)
    got = {tuples[i]: p for i, p in partials.items()}
    assert got[("south", "2026-11-01", "web")]["dp_rows"] == 60
    assert got[("north", "2026-11-01", "ios")]["dp_rows"] == 30
    assert ("south", "2026-11-02", "web") not in got  # a selected tuple's empty cell: zeros
    cells = plan.noise(partials, ZeroSource(), tuples)
    assert {c["key"] for c in cells} == {'["north","2026-11-01","ios"]', '["north","2026-11-02","ios"]',
                                         '["south","2026-11-01","web"]', '["south","2026-11-02","web"]'}


def test_shipped_spec_is_valid_and_its_charge_carries_delta():
    d = yaml.safe_load((ROOT / "conf/releases/orders_by_found_region.yaml").read_text())
    assert d["group_by"][1] == {"column": "region", "private_keys": {"max_keys": 50}}
    spec = release_spec_from_dict(d, "shipped")
    assert spec.charge.delta == Fraction(1, 10**8) and isinstance(spec.charge, ZCDP)


def test_a_budget_without_delta_cap_refuses_private_keys_before_any_data(spark, warehouse):
    """An existing budget (no delta_cap: 0) refuses a release that spends delta, naming the
    field to add; nothing is charged or created."""
    import pytest

    from dp_spark.errors import BudgetExceededError

    env = load_env(warehouse)
    pol = yaml.safe_load(Path(env.policies).read_text())
    pol["budgets"]["demo_events_user"].pop("delta_cap", None)
    Path(env.policies).write_text(yaml.safe_dump(pol))
    spec = register(warehouse, "orders_by_found_region")
    eng = Engine(load_env(warehouse), spark=spark, principal="publisher_bob")
    with pytest.raises(BudgetExceededError, match="delta_cap"):
        eng.publish(spec)
    assert not Path(eng.table_path(spec)).exists()


def test_no_key_selected_publishes_an_empty_release_once(spark, warehouse):
    """When no key reaches the threshold the release publishes no cell: the charge is spent
    once (the noise was drawn), and a rerun is a cache hit."""
    d = yaml.safe_load((ROOT / "conf/releases/orders_by_found_region.yaml").read_text())
    d.update(name="found_nothing", family="found_nothing", where="region = 'no_such_region'")
    spec = register(warehouse, "found_nothing", d)
    eng = Engine(load_env(warehouse), spark=spark, principal="publisher_bob")
    r = eng.publish(spec)
    assert r.status == "published" and r.rows == () and r.charge == spec.charge
    again = Engine(load_env(warehouse), spark=spark, principal="publisher_bob").publish(spec)
    assert again.status == "cache_hit" and again.charge is None and again.rows == ()
    assert len(eng.ledger.entries(spec.budget_id)) == 1


def test_distinct_units_alone_with_public_and_private_keys(spark):
    """A release of distinct units only (no row-level aggregate at all) on both key kinds."""
    rows = [(f"u{u}", "a" if u < 40 else "b", 1.0) for u in range(50)] + [("u0", "a", 2.0)]
    df = spark.createDataFrame(rows, "user_id string, region string, v double")
    for keys in ({"public_keys": {"values": ["a", "b"]}}, {"private_keys": {"max_keys": 5}}):
        d = {"name": "t", "dataset": "d", "privacy_unit": {"kind": "user", "column": "user_id"},
             "group_by": [dict(column="region", **keys)], "bounds": {"max_rows_per_unit": 3},
             "statistics": [{"name": "users", "kind": "distinct_units"}],
             "budget": {"id": "b", "measure": "zcdp", "rho": 8, **({"delta": 1e-3} if "private_keys" in keys else {})}}
        plan = plan_for(release_spec_from_dict(d, "t.yaml"))
        got = collect_query_partials(build_query_partials(df, plan, "salt"), plan)
        if "private_keys" in keys:
            partials, tuples = got
            got = {tuples[i][0]: p["dp_units"] for i, p in partials.items()}
            assert got.get("a") == 40  # 'a' has 40 units: selected; 'b' (10) may or may not be
        else:
            assert {i: p["dp_units"] for i, p in got.items()} == {0: 40, 1: 10}


def test_old_metric_form_finds_keys_privately_through_the_rewrite(spark, warehouse):
    """A single-``metric`` spec with ``private_keys`` (rewritten into the statistics form) runs
    the one engine path: regions found with DP, one charge carrying delta, a rerun is a cache
    hit; a lone unit's region never appears."""
    env = load_env(warehouse)
    loc = env.dataset_location("demo_events")
    _lonely_units(spark, loc, 1).write.format("delta").mode("append").save(loc)
    d = {"name": "mean_by_found_region", "family": "mean_by_found_region", "dataset": "demo_events",
         "privacy_unit": {"kind": "user", "column": "user_id"}, "metric": "mean",
         "group_by": {"column": "region", "private_keys": {"max_keys": 50}},
         "value": {"column": "order_value", "lower": 0, "upper": 500},
         "bounds": {"max_rows_per_unit": 5, "max_partitions_per_unit": 2},
         "budget": {"id": "demo_events_user", "measure": "zcdp", "rho": 0.1, "delta": 1e-8}}
    spec = register(warehouse, "mean_by_found_region", d)
    assert spec.metric == "mean" and spec.private_key_sets
    eng = Engine(env, spark=spark, principal="publisher_bob")
    r = eng.publish(spec)
    assert r.status == "published" and r.charge == spec.charge
    regions = {row["keys"]["region"] for row in r.rows}
    assert regions and all(k.startswith("region_") for k in regions)
    assert {row["statistic"] for row in r.rows} == {"count", "mean"}
    again = Engine(load_env(warehouse), spark=spark, principal="publisher_bob").publish(spec)
    assert again.status == "cache_hit" and again.charge is None
    assert len(eng.ledger.entries(spec.budget_id)) == 1
