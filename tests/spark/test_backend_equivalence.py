"""The Spark backend computes the same partials as the local reference backend
(dp_spark.backends.local) on random data: every statistic kind (count, distinct_units, sum,
mean, variance, stddev, quantile), every bounding branch (no cell cut, L0 = 1, L0 > 1 with
Linf < K, the K cut dropping whole (unit, cell) pairs), a ``where``, public keys of string and
date columns, event-level units, private keys (the candidate partials and the selection),
rolling windows over a date key and derived week / month keys.

The local backend hashes with Spark's xxhash64, so both keep the very same rows: the partials
must be EQUAL, not merely within bounds. Seeded test data only (never noise)."""

from __future__ import annotations

import datetime as dt
import random

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dp_spark.backends.spark import build_query_partials, collect_query_partials
from dp_spark.backends.local import query_partials, select_private_keys, spark_xxhash64
from dp_spark.config import release_spec_from_dict
from dp_spark.mechanisms.samplers import NoiseSource
from dp_spark.statistics.plan import plan_query

# the production evaluator (generated code): the Spark backend as jobs run it (tests/conftest.py)
pytestmark = [pytest.mark.spark, pytest.mark.codegen]

SALT = "equivalence-salt"
REGIONS = [f"r_{i}" for i in range(5)]
DAYS = [dt.date(2026, 11, 1) + dt.timedelta(days=i) for i in range(3)]
SCHEMA = T.StructType([T.StructField("user_id", T.StringType()), T.StructField("region", T.StringType()),
                       T.StructField("day", T.DateType()), T.StructField("v", T.DoubleType()),
                       T.StructField("n", T.LongType())])
TYPES = {"user_id": "string", "region": "string", "day": "date", "v": "double", "n": "long"}
ALL_KINDS = [{"name": "rows", "kind": "count"}, {"name": "units", "kind": "distinct_units"},
             {"name": "total", "kind": "sum", "column": "v", "lower": -10, "upper": 100},
             {"name": "avg", "kind": "mean", "column": "v", "lower": -10, "upper": 100},
             {"name": "var", "kind": "variance", "column": "v", "lower": 0, "upper": 50},
             {"name": "sd", "kind": "stddev", "column": "v", "lower": -10, "upper": 100},
             {"name": "med", "kind": "quantile", "column": "v", "lower": -10, "upper": 100, "q": 0.5},
             {"name": "n_total", "kind": "sum", "column": "n", "lower": 0, "upper": 7}]


def _rows(seed: int, n_rows: int = 1500, n_users: int = 60):
    """Random rows: heavy and light users, undeclared and null keys, null / NaN / inf / -0.0 /
    huge values, exact duplicates (ties of the row priority)."""
    rng = random.Random(seed)  # test data only
    rows = []
    for _ in range(n_rows):
        heavy = rng.random() < 0.3  # a few heavy users (Pareto), the rest uniform
        user = None if rng.random() < 0.02 else f"u{(int(rng.paretovariate(1.2)) if heavy else rng.randrange(n_users)) % n_users}"
        region = rng.choice(REGIONS + ["r_undeclared", None]) if rng.random() < 0.2 else rng.choice(REGIONS[:3])
        day = rng.choice(DAYS + [None]) if rng.random() < 0.1 else rng.choice(DAYS)
        v = rng.choice([rng.uniform(-30, 130)] * 12 + [None, float("nan"), float("inf"), -float("inf"),
                                                        -0.0, 1e300, 49.999999999999996])
        n = rng.choice([rng.randrange(0, 10), None])
        row = {"user_id": user, "region": region, "day": day, "v": v, "n": n}
        rows.append(row)
        if rng.random() < 0.05:
            rows.append(dict(row))
    return rows


def _spec(bounds, *, statistics=ALL_KINDS, group_by=None, where=None, unit="user_id", neighbouring=None,
          budget=None):
    d = {"name": "equiv", "dataset": "x", "privacy_unit": {"kind": "user", "column": unit},
         "group_by": group_by or {"column": "region", "public_keys": {"values": REGIONS}},
         "bounds": bounds, "statistics": statistics,
         "budget": budget or {"id": "b", "measure": "zcdp", "rho": 1}, "max_cells": 20_000}
    if where is not None:
        d["where"] = where
    if neighbouring is not None:
        d["neighbouring"] = neighbouring
        d["privacy_unit"]["kind"] = "event"
    return plan_query(release_spec_from_dict(d, "equiv.yaml"))


def _spark_partials(spark, rows, plan):
    df = spark.createDataFrame([tuple(r[f.name] for f in SCHEMA.fields) for r in rows], SCHEMA)
    return collect_query_partials(build_query_partials(df.repartition(3), plan, SALT), plan)


def _both(spark, rows, plan, where=None):
    local = query_partials(rows, plan, SALT, where=where, schema=TYPES).cells
    return _spark_partials(spark, rows, plan), local


def _where_n_region(r):
    """``n >= 3 AND region <> 'r_1'`` with SQL's nulls (a null predicate drops the row)."""
    return r["n"] is not None and r["n"] >= 3 and r["region"] is not None and r["region"] != "r_1"


BY_REGION_DAY = [{"column": "region", "public_keys": {"values": REGIONS}},
                 {"column": "day", "public_keys": {"dates": {"start": "2026-11-01", "end": "2026-11-03"}}}]

CASES = {
    # L0 > 1, Linf < K, and K < L0 x Linf: the K cut can drop whole (unit, cell) pairs
    "l0_linf_k_pairs_cut": dict(bounds={"max_rows_per_unit": 5, "max_partitions_per_unit": 2,
                                        "max_rows_per_partition": 3}),
    # L0 = 1: one window
    "l0_one": dict(bounds={"max_rows_per_unit": 6, "max_partitions_per_unit": 1, "max_rows_per_partition": 2}),
    # L0 >= the cells: no cell cut, K alone (distinct units in one pass with the K cut as a
    # flag: a unit counts in its first min(L0, K) = 3 cells by priority)
    "k_only": dict(bounds={"max_rows_per_unit": 3, "max_partitions_per_unit": 5}),
    # K alone, K >= the cells: the one pass counts a unit in every cell it has rows in
    "k_only_every_cell": dict(bounds={"max_rows_per_unit": 6, "max_partitions_per_unit": 8}),
    # two public key columns (string x date), L0 < cells, no Linf, and a where
    "two_keys_where": dict(bounds={"max_rows_per_unit": 8, "max_partitions_per_unit": 3},
                           group_by=BY_REGION_DAY, where="n >= 3 AND region <> 'r_1'", py_where=_where_n_region),
    # a large public key set (the key lookup is a broadcast join, not a scan): 3,000 keys of
    # which the data holds a few, L0 < cells
    "many_keys": dict(bounds={"max_rows_per_unit": 4, "max_partitions_per_unit": 2},
                      group_by={"column": "region", "public_keys": {"values": [f"z_{i}" for i in range(1500)]
                                                                    + REGIONS + [f"y_{i}" for i in range(1500)]}},
                      statistics=ALL_KINDS[:3]),
    # cell limit without L0 (L0 >= cells, Linf < K)
    "linf_no_l0": dict(bounds={"max_rows_per_unit": 9, "max_partitions_per_unit": 15, "max_rows_per_partition": 2},
                       group_by=BY_REGION_DAY),
}


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("case", sorted(CASES))
def test_spark_partials_equal_the_local_backend(spark, case, seed):
    c = dict(CASES[case])
    py_where = c.pop("py_where", None)
    plan = _spec(**c)
    rows = _rows(seed)
    got, want = _both(spark, rows, plan, where=py_where)
    assert got == want
    # and the statistics are really computed (not all zero): rows kept in several cells
    assert sum(p.get("dp_rows", 0) for p in want.values()) > 40 and len(want) >= 3


@pytest.mark.parametrize("seed", [4, 5])
def test_event_units_partials_equal(spark, seed):
    rows = _rows(seed)
    for i, r in enumerate(rows):  # event ids: mostly unique, some shared by two different rows
        r["user_id"] = f"e{i if i % 17 else i - 1}"
    plan = _spec({"max_rows_per_unit": 1, "max_partitions_per_unit": 1, "max_rows_per_partition": 1},
                 neighbouring="event", statistics=ALL_KINDS[:4])
    got, want = _both(spark, rows, plan)
    assert got == want and sum(p["dp_rows"] for p in want.values()) > 500


WINDOWED = [{"name": "dau", "kind": "distinct_units"},
            {"name": "wau", "kind": "distinct_units", "window": {"days": 2}},
            {"name": "rows3", "kind": "count", "window": {"days": 3}},
            {"name": "total2", "kind": "sum", "column": "v", "lower": -10, "upper": 100, "window": {"days": 2}},
            {"name": "avg", "kind": "mean", "column": "v", "lower": -10, "upper": 100}]
LATE_DAYS = {"column": "day", "public_keys": {"dates": {"start": "2026-11-02", "end": "2026-11-03"}}}
SERIES_CASES = {
    # rolling windows over region x day: the L0 cut binds on (unit, (day, window)) pairs, the
    # K cut drops whole pairs; rows of 2026-11-01 (before the declared days) feed the first
    # windows only
    "windows_l0_cut": dict(bounds={"max_rows_per_unit": 7, "max_partitions_per_unit": 4, "max_rows_per_partition": 2},
                           group_by=[{"column": "region", "public_keys": {"values": REGIONS}}, LATE_DAYS],
                           statistics=WINDOWED),
    # windows over the day alone, no cell cut
    "windows_no_cut": dict(bounds={"max_rows_per_unit": 40, "max_partitions_per_unit": 6}, group_by=LATE_DAYS,
                           statistics=WINDOWED),
    # a derived key: ISO weeks of the declared days (2026-11-01 is a Sunday: two weeks)
    "bucket_week": dict(bounds={"max_rows_per_unit": 5, "max_partitions_per_unit": 2, "max_rows_per_partition": 3},
                        group_by=[{"column": "region", "public_keys": {"values": REGIONS}},
                                  {"column": "day", "bucket": "week",
                                   "public_keys": {"dates": {"start": "2026-11-01", "end": "2026-11-03"}}}]),
    "bucket_month": dict(bounds={"max_rows_per_unit": 5, "max_partitions_per_unit": 2},
                         group_by={"column": "day", "bucket": "month",
                                   "public_keys": {"dates": {"start": "2026-10-30", "end": "2026-11-02"}}}),
}


@pytest.mark.parametrize("case", sorted(SERIES_CASES))
def test_windows_and_buckets_partials_equal(spark, case):
    plan = _spec(**SERIES_CASES[case])
    rows = _rows(3)
    got, want = _both(spark, rows, plan)
    assert got == want
    assert len(want) >= (1 if case == "bucket_month" else 2) and all(sum(p.values()) > 0 for p in want.values())
    if plan.spec.windowed:  # each window's partials are there, and a window holds more than its day
        names = set().union(*want.values())
        assert {"dp_units", "dp_units@2", "dp_rows@3", "dp_rows"} <= names
        assert sum(p.get("dp_rows@3", 0) for p in want.values()) > sum(p.get("dp_rows", 0) for p in want.values())


class ZeroNoise(NoiseSource):
    """No noise at all: the selection keeps exactly the tuples whose count reaches the threshold."""

    def discrete_laplace(self, scale, n):
        return [0] * n

    def discrete_gaussian(self, sigma, n):
        return [0] * n


@pytest.mark.parametrize("seed,mechanism", [(6, "laplace"), (7, "laplace"), (8, "gaussian")])
def test_private_keys_candidates_and_selection_equal(spark, seed, mechanism):
    rows = _rows(seed, n_rows=2500, n_users=200)
    for r in rows:  # private region keys: many values, shared by a few units or held by one only
        u = r["user_id"]
        draw = random.Random(f"{seed}-{u}").random()
        if r["region"] is not None and u is not None and draw < 0.5:
            r["region"] = f"g_{int(u[1:]) % 25}" if draw < 0.35 else f"p_{u}"
    # a huge epsilon (rho): the executors' Laplace scale (Gaussian sigma) is ~0.003, so the noise
    # is 0 with probability 1 - 1e-100 per tuple and the selection is the threshold's (tau = 2) exact choice
    budget = ({"id": "b", "measure": "pure_dp", "epsilon": 4000, "delta": 1e-6} if mechanism == "laplace"
              else {"id": "b", "measure": "zcdp", "rho": 10**6, "delta": 1e-6})
    plan = _spec({"max_rows_per_unit": 5, "max_partitions_per_unit": 2, "max_rows_per_partition": 3},
                 group_by=[{"column": "day", "public_keys": {"dates": {"start": "2026-11-01", "end": "2026-11-03"}}},
                           {"column": "region", "private_keys": {"max_keys": 8, "mechanism": mechanism}}],
                 statistics=ALL_KINDS, budget=budget)
    assert plan.selection.threshold == 2
    assert plan.selection.mechanism == ("discrete_laplace" if mechanism == "laplace" else "discrete_gaussian")
    local = query_partials(rows, plan, SALT, schema=TYPES)
    counts = local.unit_counts
    assert len([t for t, c in counts.items() if c >= 2]) > 8, "max_keys must bind"
    assert any(c == 1 for c in counts.values()), "some tuples must fail the threshold"
    spark_partials, spark_tuples = _spark_partials(spark, rows, plan)
    local_partials, local_tuples = select_private_keys(local, plan, ZeroNoise())
    assert spark_tuples == local_tuples
    assert spark_partials == local_partials
    # every published cell is a candidate of the local pass, with its partials
    index = {t: i for i, t in enumerate(local_tuples)}
    for (p_idx, priv), partials in local.cells.items():
        t = (DAYS[p_idx].isoformat(), *priv)
        if t in index:
            assert spark_partials[index[t]] == partials


def test_key_lookup_is_a_broadcast_join_and_never_clashes(spark):
    """The key index comes from a broadcast hash join (no literal array of the keys in the
    plan), and a user column named like the join's temporary columns is left alone."""
    from chispa import assert_df_equality

    from dp_spark.backends.spark import join_key_index

    df = spark.createDataFrame([("a", 1), ("c", 2), (None, 3), ("x", 4), ("b", 5)],
                               "k string, dp_key_k long")
    joined, idx = join_key_index(df, "k", ["b", "a", "c"])
    got = joined.select("k", "dp_key_k", idx.alias("i"))
    want = spark.createDataFrame([("a", 1, 1), ("c", 2, 2), ("b", 5, 0)], "k string, dp_key_k long, i long")
    assert_df_equality(got, want, ignore_row_order=True, ignore_nullable=True)
    plan = got._jdf.queryExecution().executedPlan().toString()
    assert "BroadcastHashJoin" in plan and "array_position" not in plan


def test_spark_xxhash64_matches_spark(spark):
    values = [("a", 1, 2**40 + 3, 1.5, -0.0, dt.date(2026, 1, 2), True, "ünï"),
              (None, -7, -1, float("inf"), 0.0, dt.date(1969, 12, 31), False, "")]
    schema = "s string, i int, l long, d double, z double, dd date, b boolean, u string"
    df = spark.createDataFrame(values, schema)
    cols = ["s", "i", "l", "d", "z", "dd", "b", "u"]
    kinds = ["string", "int", "long", "double", "double", "date", "boolean", "string"]
    got = df.select(F.xxhash64(F.lit("salt"), *cols).alias("h"),
                    F.xxhash64(F.struct(F.col("l").alias("p"), F.col("s").alias("k0"))).alias("st")).collect()
    for row, v in zip(got, values):
        assert row["h"] == spark_xxhash64(("salt", "string"), *zip(v, kinds))
        assert row["st"] == spark_xxhash64((((v[2], "long"), (v[0], "string")), "struct"))
