"""Spark tests of dp_spark.backends.bounding: minimisation, special values, bounding, clamping."""

from __future__ import annotations

import contextlib
import io
import math
from collections import Counter
from datetime import date
from decimal import Decimal

import pytest
from chispa import assert_df_equality
from pyspark.sql import Window
from pyspark.sql import functions as F
from pyspark.sql import types as T
from scipy import stats

from dp_spark.errors import ConfigError, InvalidBoundsError, SchemaError
from dp_spark.backends.bounding import (
    apply_value_policy,
    bound_contributions,
    clamp_to_fixed_point,
    dedupe_unit_partition,
    drop_null_units,
    restrict_to_public_keys,
    select_columns,
)

SALT = "test-salt"

EVENTS_SCHEMA = T.StructType(
    [
        T.StructField("event_id", T.LongType()),
        T.StructField("user_id", T.StringType()),
        T.StructField("day", T.DateType()),
        T.StructField("region", T.StringType()),
        T.StructField("order_value", T.DoubleType()),
        T.StructField("tags", T.ArrayType(T.StringType())),
    ]
)


def _events(spark):
    rows = [
        (1, "u1", date(2026, 11, 1), "region_01", 10.0, ["a"]),
        (2, "u1", date(2026, 11, 2), "region_02", 20.0, None),
        (3, "u2", date(2026, 11, 1), "region_01", 30.0, ["secret_value_123"]),
    ]
    return spark.createDataFrame(rows, EVENTS_SCHEMA)


def _grid(spark, *, units, days, rows_per_cell, partitions=4):
    """units x days x rows_per_cell rows: (unit, day, seq, value)."""
    df = spark.range(0, units * days * rows_per_cell, 1, partitions)
    return df.select(
        F.format_string("u%04d", (F.col("id") / (days * rows_per_cell)).cast("long")).alias("unit"),
        F.date_add(F.lit(date(2026, 11, 1)), ((F.col("id") / rows_per_cell) % days).cast("int")).alias(
            "day"
        ),
        (F.col("id") % rows_per_cell).alias("seq"),
        F.col("id").alias("event_id"),
    )


def _explain(df) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        df.explain()
    return buf.getvalue()


# --------------------------------------------------------------------------- select_columns


def test_select_columns_keeps_only_the_named_columns_in_order(spark):
    out = select_columns(
        _events(spark),
        ["region", "user_id", "order_value"],
        unit_col="user_id",
        key_cols=["region"],
        value_col="order_value",
    )
    expected = spark.createDataFrame(
        [("region_01", "u1", 10.0), ("region_02", "u1", 20.0), ("region_01", "u2", 30.0)],
        "region string, user_id string, order_value double",
    )
    assert_df_equality(out, expected, ignore_row_order=True)


def test_select_columns_missing_column_names_it_without_data(spark):
    with pytest.raises(SchemaError) as err:
        select_columns(_events(spark), ["user_id", "amount"], unit_col="user_id")
    msg = str(err.value)
    assert "'amount'" in msg and "missing" in msg
    assert "secret_value_123" not in msg and "u1" not in msg


def test_select_columns_case_mismatch_gets_a_hint(spark):
    with pytest.raises(SchemaError, match="did you mean 'user_id'"):
        select_columns(_events(spark), ["User_ID"], unit_col="User_ID")


@pytest.mark.parametrize(
    "kwargs, columns, pattern",
    [
        ({"unit_col": "tags"}, ["tags"], "unit column 'tags'"),
        ({"unit_col": "user_id", "key_cols": ["order_value"]}, ["user_id", "order_value"], "key column"),
        ({"unit_col": "user_id", "value_col": "region"}, ["user_id", "region"], "value column 'region'"),
    ],
)
def test_select_columns_checks_types(spark, kwargs, columns, pattern):
    with pytest.raises(SchemaError, match=pattern):
        select_columns(_events(spark), columns, **kwargs)


def test_select_columns_accepts_date_and_integer_keys_and_any_scalar_unit(spark):
    out = select_columns(
        _events(spark), ["event_id", "day", "order_value"], unit_col="event_id", key_cols=["day"],
        value_col="order_value",
    )
    assert out.columns == ["event_id", "day", "order_value"]
    out = select_columns(_events(spark), ["day", "event_id"], unit_col="day", key_cols=["event_id"])
    assert out.columns == ["day", "event_id"]


def test_select_columns_config_errors(spark):
    df = _events(spark)
    with pytest.raises(ConfigError, match="not among the selected"):
        select_columns(df, ["user_id"], unit_col="user_id", value_col="order_value")
    with pytest.raises(ConfigError, match="duplicate"):
        select_columns(df, ["user_id", "user_id"])
    with pytest.raises(ConfigError, match="two roles"):
        select_columns(df, ["user_id"], unit_col="user_id", key_cols=["user_id"])
    with pytest.raises(ConfigError):
        select_columns(df, [])
    with pytest.raises(SchemaError, match="reserved prefix"):
        select_columns(df.withColumnRenamed("region", "__dp_x"), ["__dp_x"])


# --------------------------------------------------------------------------- null units / values


def test_drop_null_units(spark):
    df = spark.createDataFrame(
        [("u1", 1), (None, 2), ("", 3), (None, 4), ("u2", 5)], "user_id string, v int"
    )
    expected = spark.createDataFrame([("u1", 1), ("", 3), ("u2", 5)], "user_id string, v int")
    assert_df_equality(drop_null_units(df, unit_col="user_id"), expected, ignore_row_order=True)


def test_value_policy_drops_null_and_nan_keeps_inf_normalises_negative_zero(spark):
    values = [1.5, None, float("nan"), float("inf"), float("-inf"), -0.0, 5e-324, -2.0]
    df = spark.createDataFrame(list(enumerate(values)), "id long, v double")
    out = apply_value_policy(df, value_col="v")
    expected = spark.createDataFrame(
        [(0, 1.5), (3, float("inf")), (4, float("-inf")), (5, 0.0), (6, 5e-324), (7, -2.0)],
        "id long, v double",
    )
    assert_df_equality(out, expected, ignore_row_order=True)
    zero = out.where("id = 5").first()["v"]
    assert math.copysign(1.0, zero) == 1.0, "-0.0 must become +0.0"
    assert out.schema == df.schema


def test_value_policy_float_column_and_integral_column(spark):
    df = spark.createDataFrame([(1, -0.0), (2, float("nan")), (3, None)], "id long, v float")
    out = apply_value_policy(df, value_col="v").collect()
    assert [(r["id"], math.copysign(1.0, r["v"])) for r in out] == [(1, 1.0)]
    df = spark.createDataFrame([(1, 7), (2, None)], "id long, v long")
    assert_df_equality(
        apply_value_policy(df, value_col="v"), spark.createDataFrame([(1, 7)], "id long, v long")
    )
    df = spark.createDataFrame([(1, Decimal("7.5")), (2, None)], "id long, v decimal(10,2)")
    assert apply_value_policy(df, value_col="v").count() == 1


def test_value_policy_rejects_non_numeric(spark):
    with pytest.raises(SchemaError, match="numeric"):
        apply_value_policy(_events(spark), value_col="region")


# --------------------------------------------------------------------------- public keys


def test_restrict_to_public_string_keys(spark):
    df = spark.createDataFrame(
        [("u1", "region_01"), ("u1", "region_99"), ("u2", None), ("u3", "region_02")],
        "user_id string, region string",
    )
    out = restrict_to_public_keys(df, key_col="region", public_keys=["region_01", "region_02", "region_03"])
    expected = spark.createDataFrame(
        [("u1", "region_01"), ("u3", "region_02")], "user_id string, region string"
    )
    assert_df_equality(out, expected, ignore_row_order=True)


def test_restrict_to_public_date_keys(spark):
    df = _events(spark)
    out = restrict_to_public_keys(df, key_col="day", public_keys=[date(2026, 11, 2), date(2026, 11, 3)])
    assert_df_equality(out, df.where("event_id = 2"))


def test_restrict_to_public_keys_validates_declared_keys(spark):
    df = _events(spark)
    with pytest.raises(ConfigError, match="empty"):
        restrict_to_public_keys(df, key_col="region", public_keys=[])
    with pytest.raises(ConfigError, match="must be str"):
        restrict_to_public_keys(df, key_col="region", public_keys=["region_01", None])
    with pytest.raises(ConfigError, match="datetime.date"):
        restrict_to_public_keys(df, key_col="day", public_keys=["2026-11-01"])
    with pytest.raises(ConfigError, match="int in"):
        restrict_to_public_keys(df, key_col="event_id", public_keys=[True])
    with pytest.raises(ConfigError, match="not one string"):
        restrict_to_public_keys(df, key_col="region", public_keys="region_01")
    with pytest.raises(SchemaError, match="missing"):
        restrict_to_public_keys(df, key_col="nope", public_keys=["x"])


# --------------------------------------------------------------------------- bounding


def test_exactly_min_n_k_rows_per_unit(spark):
    # unit i has i rows, i = 1..20
    df = spark.range(0, 20, 1, 3).select(
        F.format_string("u%02d", F.col("id") + 1).alias("unit"),
        F.explode(F.sequence(F.lit(1), (F.col("id") + 1).cast("int"))).alias("seq"),
    )
    k = 5
    out = bound_contributions(
        df, unit_col="unit", partition_col=None, max_partitions_per_unit=None,
        max_rows_per_partition=None, max_rows_per_unit=k, salt=SALT,
    )
    assert out.schema == df.schema
    counts = {r["unit"]: r["count"] for r in out.groupBy("unit").count().collect()}
    assert counts == {f"u{i:02d}": min(i, k) for i in range(1, 21)}
    assert out.exceptAll(df).count() == 0, "output must be a sub-multiset of the input"


def test_l0_linf_and_k_are_enforced_exactly(spark):
    # 30 units x 12 days x 4 rows per (unit, day)
    df = _grid(spark, units=30, days=12, rows_per_cell=4)
    l0, linf, k = 3, 2, 5
    out = bound_contributions(
        df, unit_col="unit", partition_col="day", max_partitions_per_unit=l0,
        max_rows_per_partition=linf, max_rows_per_unit=k, salt=SALT,
    )
    assert out.schema == df.schema
    per_unit = out.groupBy("unit").agg(F.count("*").alias("rows"), F.countDistinct("day").alias("days"))
    assert {(r["rows"], r["days"]) for r in per_unit.collect()} == {(5, 3)}
    per_cell = out.groupBy("unit", "day").count().agg(F.max("count")).first()[0]
    assert per_cell == linf
    assert per_unit.count() == 30

    # Without K (K >= L0 * Linf): exactly L0 * Linf rows.
    out2 = bound_contributions(
        df, unit_col="unit", partition_col="day", max_partitions_per_unit=l0,
        max_rows_per_partition=linf, max_rows_per_unit=None, salt=SALT,
    )
    assert {r["count"] for r in out2.groupBy("unit").count().collect()} == {l0 * linf}
    # K applies after L0 and Linf: its rows are a subset of the L0/Linf selection.
    assert out.exceptAll(out2).count() == 0


def test_selection_does_not_depend_on_partitioning(spark):
    df = _grid(spark, units=40, days=10, rows_per_cell=5)
    kwargs = dict(
        unit_col="unit", partition_col="day", max_partitions_per_unit=3,
        max_rows_per_partition=2, max_rows_per_unit=4, salt=SALT,
    )
    one = bound_contributions(df.repartition(1), **kwargs)
    many = bound_contributions(df.repartition(200), **kwargs)
    by_key = bound_contributions(df.repartition(7, "day"), **kwargs)
    assert_df_equality(one, many, ignore_row_order=True)
    assert_df_equality(one, by_key, ignore_row_order=True)
    assert one.count() == 40 * 4
    # A different salt selects different rows (the salt is really used).
    other = bound_contributions(df, **{**kwargs, "salt": "another-salt"})
    assert other.exceptAll(one).count() > 0


def test_identical_rows_tie_harmlessly(spark):
    df = spark.createDataFrame([("u1", "a", 1.0)] * 10 + [("u1", "b", 2.0)] * 3, "unit string, k string, v double")
    kwargs = dict(
        unit_col="unit", partition_col=None, max_partitions_per_unit=None,
        max_rows_per_partition=None, max_rows_per_unit=4, salt=SALT,
    )
    one = bound_contributions(df.repartition(1), **kwargs)
    many = bound_contributions(df.repartition(13), **kwargs)
    assert one.count() == 4
    assert_df_equality(one, many, ignore_row_order=True)


def test_plan_uses_window_group_limit(spark):
    df = _grid(spark, units=5, days=3, rows_per_cell=2)
    with_partitions = bound_contributions(
        df, unit_col="unit", partition_col="day", max_partitions_per_unit=2,
        max_rows_per_partition=2, max_rows_per_unit=3, salt=SALT,
    )
    plan = _explain(with_partitions)
    assert "WindowGroupLimit" in plan
    lines = plan.splitlines()
    exchange = [i for i, line in enumerate(lines) if "Exchange hashpartitioning" in line]
    partial = [i for i, line in enumerate(lines) if "WindowGroupLimit" in line and "Partial" in line]
    assert len(exchange) == 1, "all three windows must share one shuffle (by unit)"
    assert partial and partial[-1] > exchange[0], "a partial top-K must run before the shuffle"
    assert "rand(" not in plan.lower()
    without = bound_contributions(
        df, unit_col="unit", partition_col=None, max_partitions_per_unit=None,
        max_rows_per_partition=None, max_rows_per_unit=3, salt=SALT,
    )
    assert "WindowGroupLimit" in _explain(without)


def _three_window_oracle(df, *, unit_col, partition_col, l0, linf, k, salt):
    """The definition of L0 -> Linf -> K bounding, spelled out as three windows (the general
    path of bound_contributions); the one-window path for L0 = 1 must select the same rows."""
    cols = df.columns
    tie = [F.col(c).asc_nulls_first() for c in cols]
    out = df.withColumn("rp", F.xxhash64(F.lit(salt), F.lit("row"), *[F.col(c) for c in cols]))
    out = out.withColumn("pp", F.xxhash64(F.lit(salt), F.lit("partition"), F.col(unit_col), F.col(partition_col)))
    w0 = Window.partitionBy(unit_col).orderBy(F.col("pp").asc(), F.col(partition_col).asc_nulls_first())
    out = out.withColumn("r0", F.dense_rank().over(w0)).where(F.col("r0") <= l0)
    if linf is not None:
        w1 = Window.partitionBy(unit_col, partition_col).orderBy(F.col("rp").asc(), *tie)
        out = out.withColumn("r1", F.row_number().over(w1)).where(F.col("r1") <= linf)
    if k is not None:
        w2 = Window.partitionBy(unit_col).orderBy(F.col("rp").asc(), *tie)
        out = out.withColumn("r2", F.row_number().over(w2)).where(F.col("r2") <= k)
    return out.select(*cols)


@pytest.mark.parametrize("linf,k", [(3, None), (None, 2), (3, 2), (2, 5), (1, 1), (None, 6), (8, 7)])
def test_one_partition_per_unit_selects_what_the_three_windows_define(spark, linf, k):
    # heavy units over several days, a unit with a null day, byte-identical duplicate rows
    df = _grid(spark, units=30, days=6, rows_per_cell=4).drop("event_id")
    extra = spark.createDataFrame(
        [("u9000", None, 0)] * 3 + [("u9000", date(2026, 11, 1), 0)] * 4 + [("u9001", None, 1), ("u9001", None, 2)],
        "unit string, day date, seq long")
    df = df.unionByName(extra)
    got = bound_contributions(df.repartition(5), unit_col="unit", partition_col="day", max_partitions_per_unit=1,
                              max_rows_per_partition=linf, max_rows_per_unit=k, salt=SALT)
    want = _three_window_oracle(df, unit_col="unit", partition_col="day", l0=1, linf=linf, k=k, salt=SALT)
    assert_df_equality(got, want, ignore_row_order=True)
    per_unit = got.groupBy("unit").agg(F.countDistinct("day").alias("d"), F.count("*").alias("n"),
                                       F.sum(F.col("day").isNull().cast("int")).alias("nulls")).collect()
    limit = min(b for b in (linf, k) if b is not None)
    assert all(r["n"] <= limit and (r["d"] + (1 if r["nulls"] else 0)) == 1 for r in per_unit)
    assert len(per_unit) == 32


def _reference_bounding(rows, *, l0, linf, k):
    """L0 -> Linf -> K bounding written out in plain Python over collected rows ``(unit,
    partition, value, row priority, partition priority)``: the definition the Spark plan must
    match row for row (priorities are the keyed hashes of the docstring, computed by Spark)."""
    from collections import defaultdict

    def nf(x):  # ascending, nulls first (the tie-break order of bound_contributions)
        return (x is not None, x if x is not None else 0)

    def row_key(r):
        return (r[3], nf(r[0]), nf(r[1]), nf(r[2]))

    by_unit = defaultdict(list)
    for r in rows:
        by_unit[r[0]].append(r)
    kept = []
    for unit_rows in by_unit.values():
        if l0 is not None:
            parts = sorted({(r[4], nf(r[1])) for r in unit_rows})[:l0]
            unit_rows = [r for r in unit_rows if (r[4], nf(r[1])) in set(parts)]
        if linf is not None:
            cells = defaultdict(list)
            for r in unit_rows:
                cells[nf(r[1])].append(r)
            unit_rows = [r for c in cells.values() for r in sorted(c, key=row_key)[:linf]]
        if k is not None:
            unit_rows = sorted(unit_rows, key=row_key)[:k]
        kept.extend(r[:3] for r in unit_rows)
    return Counter(kept)


@pytest.mark.parametrize("l0,linf,k", [(2, 2, 3), (3, 1, 2), (3, 2, 5), (4, 3, 100), (2, 3, None), (None, 2, 5),
                                       (5, 1, 4), (2, 4, 3)])
def test_general_bounding_keeps_the_rows_of_a_plain_reference(spark, l0, linf, k):
    # random units with many partitions and rows, null partitions, a null unit, exact duplicates
    import random

    rng = random.Random(20261204 + (l0 or 0) * 100 + linf * 10 + (k or 0))
    rows = []
    for u in range(60):
        unit = None if u == 0 else f"u{u:03d}"
        for _ in range(rng.choice([1, 3, 8, 25, 60])):
            part = None if rng.random() < 0.05 else rng.randrange(12)
            value = float(rng.randrange(6))  # few values: byte-identical rows are common
            rows.append((unit, part, value))
    df = spark.createDataFrame(rows, "unit string, part int, value double").repartition(7)
    got = bound_contributions(df, unit_col="unit", partition_col="part", max_partitions_per_unit=l0,
                              max_rows_per_partition=linf, max_rows_per_unit=k, salt=SALT)
    prio = df.select("unit", "part", "value",
                     F.xxhash64(F.lit(SALT), F.lit("row"), "unit", "part", "value").alias("rp"),
                     F.xxhash64(F.lit(SALT), F.lit("partition"), "unit", "part").alias("pp"))
    want = _reference_bounding([tuple(r) for r in prio.collect()], l0=l0, linf=linf, k=k)
    assert Counter(tuple(r) for r in got.collect()) == want
    assert sum(want.values()) < len(rows)  # the bounds bind


@pytest.mark.parametrize("l0,linf,k,sorts", [(3, 2, 5, 3), (3, 2, 6, 2), (3, 5, 5, 2), (3, 5, None, 2),
                                             (None, 2, 5, 2), (3, None, 5, 2), (None, 5, 5, 1)])
def test_general_bounding_is_one_shuffle_and_a_sort_per_limit_that_binds(spark, l0, linf, k, sorts):
    # one shuffle by the unit; a window (a sort after the shuffle) only for a limit that can
    # bind: no Linf window when Linf >= K, no K window when K >= L0 * Linf; without L0 the
    # cell limit and K still share the shuffle by the unit
    df = _grid(spark, units=5, days=4, rows_per_cell=3)
    plan = _explain(bound_contributions(df, unit_col="unit", partition_col="day", max_partitions_per_unit=l0,
                                        max_rows_per_partition=linf, max_rows_per_unit=k, salt=SALT))
    lines = plan.splitlines()
    exchange = [i for i, line in enumerate(lines) if "Exchange hashpartitioning" in line]
    after_shuffle = [i for i, line in enumerate(lines) if "Sort [" in line and i < exchange[0]]
    assert len(exchange) == 1, "one shuffle, by the unit"
    assert len(after_shuffle) == sorts


def test_one_partition_per_unit_is_one_sort_after_the_shuffle(spark):
    df = _grid(spark, units=5, days=3, rows_per_cell=2)
    plan = _explain(bound_contributions(df, unit_col="unit", partition_col="day", max_partitions_per_unit=1,
                                        max_rows_per_partition=2, max_rows_per_unit=2, salt=SALT))
    lines = plan.splitlines()
    exchange = [i for i, line in enumerate(lines) if "Exchange hashpartitioning" in line]
    sorts = [i for i, line in enumerate(lines) if "Sort [" in line]
    partial = [i for i, line in enumerate(lines) if "WindowGroupLimit" in line and "Partial" in line]
    assert len(exchange) == 1
    assert len([i for i in sorts if i < exchange[0]]) == 1, "one sort after the shuffle (lines above it)"
    assert partial and partial[0] > exchange[0], "a partial top-K runs before the shuffle"


def test_flood_of_null_unit_ids(spark):
    flood = spark.range(0, 100_000, 1, 8).select(
        F.lit(None).cast("string").alias("unit"), (F.col("id") % 30).alias("day"), F.col("id").alias("seq")
    )
    normal = _grid(spark, units=10, days=3, rows_per_cell=3).select(
        "unit", F.dayofmonth("day").cast("long").alias("day"), "seq"
    )
    df = flood.unionByName(normal)
    kwargs = dict(
        unit_col="unit", partition_col="day", max_partitions_per_unit=2,
        max_rows_per_partition=2, max_rows_per_unit=3, salt=SALT,
    )
    out = bound_contributions(drop_null_units(df, unit_col="unit"), **kwargs)
    assert out.where(F.col("unit").isNull()).count() == 0
    assert {r["count"] for r in out.groupBy("unit").count().collect()} == {3}
    # Even if the null-id policy step were skipped, the nulls form ONE bounded unit.
    unguarded = bound_contributions(df, **kwargs)
    assert unguarded.where(F.col("unit").isNull()).count() == 3
    assert unguarded.where(F.col("unit").isNull()).select("day").distinct().count() <= 2


def test_heavy_unit_is_bounded_to_k_rows_and_l0_partitions(spark):
    heavy = spark.range(0, 100_000, 1, 16).select(
        F.lit("heavy").alias("unit"),
        F.format_string("region_%02d", (F.col("id") % 20) + 1).alias("region"),
        F.col("id").alias("event_id"),
        (F.col("id") * 0.37).alias("value"),
    )
    light = spark.createDataFrame(
        [("light", "region_01", -1, 1.0), ("light", "region_02", -2, 2.0)],
        "unit string, region string, event_id long, value double",
    )
    df = heavy.unionByName(light)
    out = bound_contributions(
        df, unit_col="unit", partition_col="region", max_partitions_per_unit=3,
        max_rows_per_partition=4, max_rows_per_unit=10, salt=SALT,
    )
    h = out.where("unit = 'heavy'")
    assert h.count() == 10
    assert h.select("region").distinct().count() == 3
    assert h.groupBy("region").count().agg(F.max("count")).first()[0] <= 4
    assert out.where("unit = 'light'").count() == 2


def test_partition_choice_is_uniform_chi_squared(spark):
    # 3000 units, each with one row in each of 10 days; L0 = 1: which day is kept?
    units, days = 3000, 10
    df = _grid(spark, units=units, days=days, rows_per_cell=1)
    out = bound_contributions(
        df, unit_col="unit", partition_col="day", max_partitions_per_unit=1,
        max_rows_per_partition=1, max_rows_per_unit=None, salt=SALT,
    )
    counts = Counter(r["day"] for r in out.select("day").collect())
    observed = [counts.get(d, 0) for d in sorted({r["day"] for r in df.select("day").distinct().collect()})]
    assert sum(observed) == units
    assert stats.chisquare(observed).pvalue > 1e-6


def _position_counts(selected, n):
    counts = Counter(r["seq"] for r in selected.select("seq").collect())
    return [counts.get(i, 0) for i in range(n)]


def test_bottom_k_selection_is_uniform_chi_squared_and_first_k_is_not(spark):
    units, n, k = 2000, 10, 3
    df = spark.range(0, units * n, 1, 4).select(
        F.format_string("u%05d", (F.col("id") / n).cast("long")).alias("unit"),
        (F.col("id") % n).alias("seq"),
        F.col("id").alias("event_id"),
    )
    for salt in ("salt-a", "salt-b", "salt-c"):
        out = bound_contributions(
            df, unit_col="unit", partition_col=None, max_partitions_per_unit=None,
            max_rows_per_partition=None, max_rows_per_unit=k, salt=salt,
        )
        observed = _position_counts(out, n)
        assert sum(observed) == units * k
        # Sampling without replacement makes the statistic conservative (smaller variance).
        assert stats.chisquare(observed).pvalue > 1e-6, (salt, observed)

    # The same test catches a biased selector: first K rows by event_id.
    w = Window.partitionBy("unit").orderBy("event_id")
    first_k = df.withColumn("__r", F.row_number().over(w)).where(F.col("__r") <= k).drop("__r")
    biased = _position_counts(first_k, n)
    assert sum(biased) == units * k
    assert stats.chisquare(biased).pvalue < 1e-20


def test_bound_contributions_validates_parameters(spark):
    df = _grid(spark, units=2, days=2, rows_per_cell=1)
    base = dict(
        unit_col="unit", partition_col="day", max_partitions_per_unit=1,
        max_rows_per_partition=1, max_rows_per_unit=1, salt=SALT,
    )
    for bad in ({"max_rows_per_unit": 0}, {"max_rows_per_partition": True},
                {"max_partitions_per_unit": 1.5}, {"max_rows_per_unit": 2**31}):
        with pytest.raises(InvalidBoundsError):
            bound_contributions(df, **{**base, **bad})
    with pytest.raises(InvalidBoundsError, match="unbounded"):
        bound_contributions(df, **{**base, "max_rows_per_unit": None, "max_rows_per_partition": None})
    with pytest.raises(InvalidBoundsError, match="unbounded"):
        bound_contributions(
            df, **{**base, "partition_col": None, "max_rows_per_unit": None, "max_rows_per_partition": None}
        )
    with pytest.raises(ConfigError, match="salt"):
        bound_contributions(df, **{**base, "salt": ""})
    with pytest.raises(ConfigError, match="differ"):
        bound_contributions(df, **{**base, "partition_col": "unit"})
    with pytest.raises(SchemaError, match="missing"):
        bound_contributions(df, **{**base, "partition_col": "region"})
    with pytest.raises(SchemaError, match="reserved prefix"):
        bound_contributions(df.withColumn("__dp_rank_unit", F.lit(1)), **base)
    with pytest.raises(SchemaError, match="cannot be hashed"):
        bound_contributions(df.withColumn("m", F.create_map(F.lit("a"), F.lit(1))), **base)


def test_without_partition_column_linf_and_k_both_bound(spark):
    df = _grid(spark, units=3, days=1, rows_per_cell=9)
    out = bound_contributions(
        df, unit_col="unit", partition_col=None, max_partitions_per_unit=4,
        max_rows_per_partition=2, max_rows_per_unit=6, salt=SALT,
    )
    assert {r["count"] for r in out.groupBy("unit").count().collect()} == {2}


def test_dedupe_unit_partition(spark):
    df = spark.createDataFrame(
        [("u1", "a", 1), ("u1", "a", 2), ("u1", "b", 3), ("u2", "a", 4), ("u2", "a", 4)],
        "unit string, k string, v int",
    )
    expected = spark.createDataFrame([("u1", "a"), ("u1", "b"), ("u2", "a")], "unit string, k string")
    assert_df_equality(dedupe_unit_partition(df, unit_col="unit", partition_col="k"), expected,
                       ignore_row_order=True)
    only_units = spark.createDataFrame([("u1",), ("u2",)], "unit string")
    assert_df_equality(dedupe_unit_partition(df, unit_col="unit", partition_col=None), only_units,
                       ignore_row_order=True)


# --------------------------------------------------------------------------- clamping


def _expected_fixed(v, lower, upper, frac_bits):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    c = min(max(float(v), lower), upper)
    x = c * 2**frac_bits
    return int(math.floor(abs(x) + 0.5)) * (1 if x >= 0 else -1)  # half away from zero


@pytest.mark.parametrize("ansi_on", [True, False])
def test_clamp_long_values_near_overflow(spark, ansi, ansi_on):
    ansi(ansi_on)
    values = [2**63 - 1, -(2**63), 2147483647, -2147483648, 2147483648, 0, 5, -3, None]
    df = spark.createDataFrame([(i, v) for i, v in enumerate(values)], "id long, v long")
    out = clamp_to_fixed_point(df, value_col="v", lower=-10.0, upper=100.0, frac_bits=4, out_col="fx")
    expected = spark.createDataFrame(
        [(i, v, _expected_fixed(v, -10.0, 100.0, 4)) for i, v in enumerate(values)],
        "id long, v long, fx long",
    )
    assert_df_equality(out, expected, ignore_row_order=True)
    assert out.where("id = 0").first()["fx"] == 1600
    assert out.where("id = 1").first()["fx"] == -160


@pytest.mark.parametrize("ansi_on", [True, False])
def test_clamp_double_specials(spark, ansi, ansi_on):
    ansi(ansi_on)
    values = [1e308, float("inf"), float("-inf"), -0.0, 1.5, 0.03125, -0.03125, 5e-324,
              9.3e18, -9.3e18, float("nan"), None, 2.0**62]
    df = spark.createDataFrame([(i, v) for i, v in enumerate(values)], "id long, v double")
    out = clamp_to_fixed_point(df, value_col="v", lower=-1.0, upper=2.0, frac_bits=4, out_col="fx")
    got = {r["id"]: r["fx"] for r in out.collect()}
    assert got == {i: _expected_fixed(v, -1.0, 2.0, 4) for i, v in enumerate(values)}
    assert got[1] == 32 and got[2] == -16 and got[5] == 1 and got[6] == -1 and got[7] == 0
    assert got[10] is None and got[11] is None
    assert dict(out.dtypes)["fx"] == "bigint"


@pytest.mark.parametrize("ansi_on", [True, False])
def test_clamp_int_and_decimal_columns(spark, ansi, ansi_on):
    ansi(ansi_on)
    df = spark.createDataFrame(
        [(1, 2147483647, Decimal("99999999999999999999999999999999999999")),
         (2, -2147483648, Decimal("-99999999999999999999999999999999999999")),
         (3, 7, Decimal("7"))],
        "id long, i int, d decimal(38,0)",
    )
    out = clamp_to_fixed_point(df, value_col="i", lower=0, upper=1000, frac_bits=0, out_col="fi")
    out = clamp_to_fixed_point(out, value_col="d", lower=0, upper=1000, frac_bits=0, out_col="fd")
    got = {r["id"]: (r["fi"], r["fd"]) for r in out.collect()}
    assert got == {1: (1000, 1000), 2: (0, 0), 3: (7, 7)}


def test_clamp_at_the_largest_allowed_magnitude(spark):
    df = spark.createDataFrame([(1e300,), (-1e300,)], "v double")
    out = clamp_to_fixed_point(df, value_col="v", lower=-(2.0**42), upper=2.0**42, frac_bits=10, out_col="v")
    assert sorted(r["v"] for r in out.collect()) == [-(2**52), 2**52]
    assert out.columns == ["v"]


def test_clamp_validates_parameters(spark):
    df = spark.createDataFrame([(1.0,)], "v double")
    kw = dict(value_col="v", lower=0.0, upper=1.0, frac_bits=8, out_col="fx")
    for bad in ({"lower": 2.0}, {"upper": float("inf")}, {"lower": float("nan")}, {"frac_bits": 53},
                {"frac_bits": -1}, {"upper": 2.0**45}, {"lower": True}, {"upper": 2**53 + 1}):
        with pytest.raises(InvalidBoundsError):
            clamp_to_fixed_point(df, **{**kw, **bad})
    with pytest.raises(SchemaError, match="numeric"):
        clamp_to_fixed_point(df.withColumn("s", F.lit("x")), **{**kw, "value_col": "s"})
    with pytest.raises(SchemaError, match="already exists"):
        clamp_to_fixed_point(df.withColumn("fx", F.lit(1)), **kw)
    with pytest.raises(ConfigError, match="out_col"):
        clamp_to_fixed_point(df, **{**kw, "out_col": ""})
    # An engine-internal output column may use the reserved prefix.
    assert clamp_to_fixed_point(df, **{**kw, "out_col": "__dp_fx"}).columns == ["v", "__dp_fx"]


# --------------------------------------------------------------------------- the salt stays out of plans

PLAN_SALT = "5a1t0f7e5f0ba5ed0e11ad0d0c0ffee042"  # distinctive: any occurrence in a plan is the salt


def _all_explain_modes(df) -> str:
    jvm = df.sparkSession._jvm
    mode = jvm.org.apache.spark.sql.execution.ExplainMode
    qe = df._jdf.queryExecution()
    return "\n".join(qe.explainString(mode.fromString(m)) for m in ("simple", "extended", "codegen", "cost",
                                                                       "formatted"))


@pytest.mark.codegen  # EXPLAIN CODEGEN shows the generated code: the production evaluator
@pytest.mark.parametrize("partition_col,l0,linf,k", [
    (None, None, None, 3),       # one window per unit
    ("day", 1, 2, 2),            # one partition per unit: one window
    ("day", 2, 2, 3),            # L0, Linf and K windows
])
def test_salt_never_appears_in_the_plan(spark, partition_col, l0, linf, k):
    """The salt is a value of a broadcast one-row DataFrame, not a literal: no EXPLAIN mode (the
    text the Spark UI and the event log show) contains it, before or after execution, and the
    rows kept are exactly those of the literal-salt definition."""
    df = _grid(spark, units=6, days=3, rows_per_cell=3)
    out = bound_contributions(df, unit_col="unit", partition_col=partition_col, max_partitions_per_unit=l0,
                              max_rows_per_partition=linf, max_rows_per_unit=k, salt=PLAN_SALT)
    assert PLAN_SALT not in _all_explain_modes(out)
    assert "__dp_salt" in _explain(out)  # the priority reads the joined column
    out.collect()
    assert PLAN_SALT not in _all_explain_modes(out)  # the final adaptive plan neither
    if partition_col is not None:
        want = _three_window_oracle(df, unit_col="unit", partition_col="day", l0=l0, linf=linf, k=k, salt=PLAN_SALT)
    else:
        w = Window.partitionBy("unit").orderBy(
            F.xxhash64(F.lit(PLAN_SALT), F.lit("row"), *[F.col(c) for c in df.columns]).asc(),
            *[F.col(c).asc_nulls_first() for c in df.columns])
        want = df.withColumn("r", F.row_number().over(w)).where(F.col("r") <= k).drop("r")
    assert_df_equality(out, want, ignore_row_order=True)
    assert out.columns == df.columns


@pytest.mark.parametrize("bounds", [
    dict(partition_col=None, max_partitions_per_unit=None, max_rows_per_partition=None, max_rows_per_unit=4),
    dict(partition_col="day", max_partitions_per_unit=3, max_rows_per_partition=None, max_rows_per_unit=4),
    dict(partition_col="day", max_partitions_per_unit=3, max_rows_per_partition=2, max_rows_per_unit=4),
    dict(partition_col="day", max_partitions_per_unit=None, max_rows_per_partition=2, max_rows_per_unit=5),
])
def test_the_k_cut_as_a_flag_keeps_every_pair_and_flags_exactly_the_bounded_rows(spark, bounds):
    """``flag_col``: the flagged rows are exactly the rows ``bound_contributions`` keeps
    without it, and the rows returned hold every (unit, day) pair of the days the L0 cut
    keeps (the K cut, flagged, drops no pair)."""
    df = _grid(spark, units=30, days=6, rows_per_cell=3).select("unit", "day", "event_id")
    kept = bound_contributions(df, unit_col="unit", salt=SALT, **bounds)
    flagged = bound_contributions(df, unit_col="unit", salt=SALT, flag_col="dp_kept", **bounds)
    assert flagged.columns == ["unit", "day", "event_id", "dp_kept"]
    assert_df_equality(flagged.where("dp_kept").drop("dp_kept"), kept, ignore_row_order=True)
    # the pairs: every pair of the days the L0 cut keeps (all days without an L0 cut)
    l0_only = bound_contributions(df, unit_col="unit", salt=SALT, partition_col="day",
                                  max_partitions_per_unit=bounds["max_partitions_per_unit"] or 6,
                                  max_rows_per_partition=3, max_rows_per_unit=None)
    assert_df_equality(flagged.select("unit", "day").distinct(), l0_only.select("unit", "day").distinct(),
                       ignore_row_order=True)
    assert flagged.where("NOT dp_kept").count() > 0  # K binds: some rows are only flagged out
