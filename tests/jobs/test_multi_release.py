"""Multi-statistic releases on Spark, end to end: one pass, one charge, one Delta commit."""

from __future__ import annotations

import dataclasses
import math

import pytest
import yaml
from pyspark.sql import functions as F

from dp_spark.core.budget import ZCDP
from dp_spark.config import load_env
from dp_spark.engine import Engine, plan_for
from dp_spark.errors import ConfigError
from dp_spark.backends.spark import build_query_partials, collect_query_partials

from .conftest import ROOT, register

SHIPPED = ROOT / "conf/releases/orders_by_day_region.yaml"


def engine(spark, env_file, **kw):
    kw.setdefault("principal", "publisher_bob")
    return Engine(load_env(env_file), spark=spark, **kw)


def test_shipped_multi_statistic_release_one_entry_one_commit_then_cache_hit(spark, warehouse):
    eng = engine(spark, warehouse)
    spec = register(warehouse, "orders_by_day_region")
    r = eng.publish(spec)
    assert r.status == "published" and r.charge == ZCDP("0.5")
    assert len(r.rows) == 60 * 6
    entries = eng.ledger.entries("demo_events_user")
    assert len(entries) == 1 and entries[0].release_id == r.release_id
    # the table: created (version 0), then ONE commit for all 360 cells
    hist = spark.sql(f"DESCRIBE HISTORY delta.`{r.table_path}`").collect()
    assert sorted(h["version"] for h in hist) == [0, 1]
    t = spark.read.format("delta").load(r.table_path)
    assert t.count() == 360
    one = t.where((F.col("statistic") == "aov") & (F.col("keys")["region"] == "region_02")
                  & (F.col("keys")["day"] == "2026-11-03")).collect()
    assert len(one) == 1 and one[0]["key"] == '["2026-11-03","region_02"]'
    assert one[0]["key_column"] == "day,region"
    by_stat = {}
    for row in t.collect():
        by_stat.setdefault(row["statistic"], []).append(row)
        assert row["ci_low"] <= row["value"] <= row["ci_high"]
        assert row["charge_rho"] == 0.5 and row["mechanism"] == "discrete_gaussian"
    assert {k: len(v) for k, v in by_stat.items()} == {s: 60 for s in
                                                       ("users", "orders", "revenue", "aov", "order_sd", "median_order")}
    for row in by_stat["order_sd"]:
        assert 0 <= row["value"] <= 250
    for row in by_stat["median_order"]:
        assert 0 <= row["value"] <= 500
    # the family's privacy statement describes every statistic and key column
    env = load_env(warehouse)
    md = (env.warehouse / "statements" / "orders_by_day_region.md").read_text()
    assert "median_order (quantile)" in md and "30 `day` x 2 `region`" in md
    # a rerun is a cache hit that charges nothing and returns the same cells
    again = engine(spark, warehouse).publish(spec)
    assert again.status == "cache_hit" and again.charge is None
    assert len(eng.ledger.entries("demo_events_user")) == 1
    assert sorted((c["statistic"], c["key"], c["value"]) for c in again.rows) == \
        sorted((c["statistic"], c["key"], c["value"]) for c in r.rows)


def test_single_metric_specs_publish_beside_it_with_a_keys_column(spark, warehouse):
    eng = engine(spark, warehouse)
    r = eng.publish(register(warehouse, "aov_by_region"))
    assert r.status == "published"
    row = spark.read.format("delta").load(r.table_path).where(F.col("statistic") == "mean").first()
    assert row["keys"] == {"region": row["key"]}


def test_a_where_outside_the_input_is_refused_before_any_charge(spark, warehouse):
    d = yaml.safe_load(SHIPPED.read_text())
    d["columns"] = ["user_id", "day", "region", "order_value", "no_such_column"]
    d["where"] = "no_such_column > 1"
    spec = register(warehouse, "orders_bad_where", dict(d, name="orders_bad_where", family="orders_bad_where"))
    eng = engine(spark, warehouse)
    with pytest.raises(Exception) as exc:
        eng.publish(spec)
    assert "no_such_column" in str(exc.value) or isinstance(exc.value, ConfigError)
    assert eng.ledger.entries() == []  # refused before the budget is even registered


def test_plan_has_one_shuffle_for_bounding_and_one_for_the_aggregation(spark, warehouse):
    spec = register(warehouse, "orders_by_day_region")
    env = load_env(warehouse)
    df = spark.read.format("delta").load(env.dataset_location("demo_events"))
    partials = build_query_partials(df, plan_for(spec), "salt")
    plan = partials._jdf.queryExecution().executedPlan().toString()
    # hash exchanges: one by the unit (bounding), one by the cell (aggregation); its distinct
    # units (K = 10 < L0 x Linf = 15: the K cut could drop a (unit, cell) pair) come from the
    # same pass (the K cut flagged, the pairs are the first level's groups): no more exchange
    assert plan.count("Exchange hashpartitioning") == 2, plan
    # without a distinct count: the two of the single pass
    rows_only = dataclasses.replace(spec, statistics=tuple(s for s in spec.statistics if s.kind != "distinct_units"))
    plan = build_query_partials(df, plan_for(rows_only), "salt")._jdf.queryExecution().executedPlan().toString()
    assert plan.count("Exchange hashpartitioning") == 2, plan


def _components(spark, df, plan):
    parts = collect_query_partials(build_query_partials(df, plan, "fixed-salt"), plan)
    out = {}
    for comp in plan.components:
        vec = []
        for i in range(plan.spec.cells):
            vec.extend(comp.true_values(parts.get(i, {})))
        out[comp] = vec
    return out


def test_greybox_one_heavy_unit_moves_every_partial_within_its_sensitivity(spark, warehouse):
    """Neighbours differing in one heavy unit: each component's exact partials move by at
    most the declared sensitivity, per cell and in L1 / L2 over all cells."""
    spec = register(warehouse, "orders_by_day_region")
    plan = plan_for(spec)
    env = load_env(warehouse)
    df = spark.read.format("delta").load(env.dataset_location("demo_events"))
    heavy = (df.groupBy("user_id").count().orderBy(F.col("count").desc()).first())["user_id"]
    with_unit = _components(spark, df, plan)
    without = _components(spark, df.where(F.col("user_id") != heavy), plan)
    moved = 0
    for comp, p in zip(plan.components, plan.statistics):
        diff = [a - b for a, b in zip(with_unit[comp], without[comp])]
        sens = p.sensitivity_grid
        assert sum(abs(x) for x in diff) <= sens.l1, comp.name
        assert sum(x * x for x in diff) <= sens.l2_squared, comp.name
        assert max(abs(x) for x in diff) <= sens.per_partition, comp.name
        moved += any(diff)
    assert moved == len(plan.components)  # the heavy unit is in the data and moves every component


def test_python_api_publishes_through_the_same_engine(spark, warehouse):
    import dp_spark.api as dp

    from tests.unit.test_api import shipped_builder

    # official: the built spec equals the pre-registered file, so it publishes and charges
    eng = engine(spark, warehouse)
    cells = shipped_builder().publish(eng)
    assert cells.count() == 360
    assert len(eng.ledger.entries("demo_events_user")) == 1
    # official: a spec that is not pre-registered is refused before any charge
    other = shipped_builder().where("order_value IS NOT NULL")
    with pytest.raises(ConfigError, match="pre-register"):
        other.publish(eng)
    assert len(eng.ledger.entries("demo_events_user")) == 1
    # exploration: charged to the exploration budget like any exploration release
    ana = engine(spark, warehouse, principal="analyst_alice", mode="exploration")
    pdf = (dp.release("explore_orders").on("demo_events")
           .by(region=["region_01", "region_02"]).bounds(rows_per_unit=5)
           .count("orders").mean("aov", "order_value", 0, 500)
           .charge(rho=0.1, budget="demo_events_user")).publish(ana, as_pandas=True)
    assert sorted(pdf["statistic"].unique()) == ["aov", "orders"] and len(pdf) == 4
    assert (pdf["mode"] == "exploration").all()
    assert len(eng.ledger.entries("demo_events_user")) == 2


def test_partials_are_the_exact_aggregates_of_the_bounded_rows(spark):
    """Bounds that cannot bind (K above every unit's rows): the partials are the plain
    aggregates of the filtered input, per key tuple."""
    from dp_spark.config import release_spec_from_dict

    rows = [("u1", "a", "x", 10.0), ("u1", "a", "x", 20.0), ("u1", "b", "y", 30.0), ("u2", "a", "x", 40.0),
            ("u3", "b", "x", None), ("u3", "b", "x", 600.0), (None, "a", "x", 5.0), ("u4", "c", "x", 1.0)]
    df = spark.createDataFrame(rows, "user_id string, region string, kind string, v double")
    value = {"column": "v", "lower": 0, "upper": 500}
    spec = release_spec_from_dict({
        "name": "t", "dataset": "d", "privacy_unit": {"kind": "user", "column": "user_id"},
        "group_by": [{"column": "region", "public_keys": {"values": ["a", "b"]}},
                     {"column": "kind", "public_keys": {"values": ["x", "y"]}}],
        "bounds": {"max_rows_per_unit": 100, "max_partitions_per_unit": 4},
        "statistics": [{"name": "u", "kind": "distinct_units"}, {"name": "n", "kind": "count"},
                       dict(value, name="s", kind="sum")],
        "budget": {"id": "b", "measure": "zcdp", "rho": 1}}, "t.yaml")
    plan = plan_for(spec)
    got = collect_query_partials(build_query_partials(df, plan, "salt"), plan)
    by = {}
    for comp in plan.components:
        for i in range(spec.cells):
            by.setdefault(i, {})[comp.kind] = comp.true_values(got.get(i, {}))[0]
    unit = 2 ** plan.components[2].clamp.grid_exponent
    # cells: (a,x)=0, (a,y)=1, (b,x)=2, (b,y)=3; null values, null units and key 'c' are dropped
    assert {i: d["units"] for i, d in by.items()} == {0: 2, 1: 0, 2: 1, 3: 1}
    assert {i: d["rows"] for i, d in by.items()} == {0: 3, 1: 0, 2: 1, 3: 1}
    assert {i: d["nsum"] * unit + 250 * d["rows"] for i, d in by.items()} == {0: 70, 1: 0, 2: 500, 3: 30}
