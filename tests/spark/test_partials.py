"""Spark tests of dp_spark.aggregations: exact partials, O(keys) collection, neighbour bounds."""

from __future__ import annotations

import random
from datetime import date
from decimal import ROUND_HALF_UP, Decimal

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dp_spark.aggregations import GLOBAL_KEY, collect_partials, compute_partials
from dp_spark.errors import ConfigError, SchemaError
from dp_spark.transforms import (
    apply_value_policy,
    bound_contributions,
    clamp_to_fixed_point,
    drop_null_units,
    restrict_to_public_keys,
    select_columns,
)

REGIONS = [f"region_{i:02d}" for i in range(1, 6)]
EVENT_DDL = "user_id string, region string, order_value double, event_id long"


@pytest.fixture
def ansi(spark):
    previous = spark.conf.get("spark.sql.ansi.enabled")

    def set_ansi(enabled: bool) -> None:
        spark.conf.set("spark.sql.ansi.enabled", "true" if enabled else "false")

    yield set_ansi
    spark.conf.set("spark.sql.ansi.enabled", previous)


def _fixed(v: float, lower: float, upper: float, frac_bits: int) -> int:
    c = min(max(v, lower), upper)
    return int(Decimal(c * 2**frac_bits).quantize(Decimal(1), rounding=ROUND_HALF_UP))


# --------------------------------------------------------------------------- compute_partials


def test_compute_partials_per_key(spark):
    df = spark.createDataFrame(
        [("u1", "a", 10), ("u1", "a", 5), ("u2", "a", -3), ("u1", "b", None), ("u3", "b", 7)],
        "unit string, k string, fx long",
    )
    out = compute_partials(df, key_col="k", unit_col="unit", fixed_col="fx")
    expected = spark.createDataFrame(
        [("a", 3, 2, Decimal(12)), ("b", 2, 2, Decimal(7))],
        T.StructType(
            [
                T.StructField("key", T.StringType()),
                T.StructField("rows", T.LongType()),
                T.StructField("units", T.LongType()),
                T.StructField("sum_fixed", T.DecimalType(38, 0)),
            ]
        ),
    )
    assert_df_equality(out, expected, ignore_row_order=True, ignore_nullable=True)
    without_sum = compute_partials(df, key_col="k", unit_col="unit")
    assert without_sum.columns == ["key", "rows", "units"]
    assert dict(without_sum.dtypes) == {"key": "string", "rows": "bigint", "units": "bigint"}


def test_compute_partials_global_cell(spark):
    df = spark.createDataFrame([("u1", 4), ("u1", 6), ("u2", None)], "unit string, fx long")
    out = compute_partials(df, key_col=None, unit_col="unit", fixed_col="fx")
    assert [tuple(r) for r in out.collect()] == [(GLOBAL_KEY, 3, 2, Decimal(10))]
    assert collect_partials(out, key_col=None, public_keys=None, has_sum=True) == {
        GLOBAL_KEY: {"rows": 3, "units": 2, "sum_fixed": 10}
    }


def test_empty_input_gives_zero_rows_and_collect_fills_every_public_key(spark):
    empty = spark.createDataFrame([], "unit string, k string, fx long")
    keyed = compute_partials(empty, key_col="k", unit_col="unit", fixed_col="fx")
    assert keyed.count() == 0
    assert collect_partials(keyed, key_col="k", public_keys=REGIONS, has_sum=True) == {
        r: {"rows": 0, "units": 0, "sum_fixed": 0} for r in REGIONS
    }
    glob = compute_partials(empty, key_col=None, unit_col="unit", fixed_col="fx")
    assert glob.count() == 0
    assert collect_partials(glob, key_col=None, public_keys=None, has_sum=True) == {
        GLOBAL_KEY: {"rows": 0, "units": 0, "sum_fixed": 0}
    }


def test_collect_partials_fills_missing_drops_private_keys_and_keeps_order(spark):
    df = spark.createDataFrame(
        [("u1", date(2026, 11, 2)), ("u2", date(2026, 11, 2)), ("u3", date(2026, 12, 25))],
        "unit string, day date",
    )
    partials = compute_partials(df, key_col="day", unit_col="unit")
    days = [date(2026, 11, 1), date(2026, 11, 2), date(2026, 11, 3)]
    got = collect_partials(partials, key_col="day", public_keys=days, has_sum=False)
    assert list(got) == days
    assert got == {
        date(2026, 11, 1): {"rows": 0, "units": 0},
        date(2026, 11, 2): {"rows": 2, "units": 2},
        date(2026, 11, 3): {"rows": 0, "units": 0},
    }
    assert all(type(v) is int for cell in got.values() for v in cell.values())


def test_collect_partials_errors(spark):
    df = spark.createDataFrame([("u1", "a", 1)], "unit string, k string, fx long")
    partials = compute_partials(df, key_col="k", unit_col="unit", fixed_col="fx")
    with pytest.raises(ConfigError, match="must be str"):
        collect_partials(partials, key_col="k", public_keys=[1, 2], has_sum=True)
    with pytest.raises(ConfigError, match="empty"):
        collect_partials(partials, key_col="k", public_keys=[], has_sum=True)
    with pytest.raises(ConfigError, match="global"):
        collect_partials(partials, key_col=None, public_keys=["a"], has_sum=True)
    with pytest.raises(SchemaError, match="sum_fixed"):
        collect_partials(compute_partials(df, key_col="k", unit_col="unit"), key_col="k",
                         public_keys=["a"], has_sum=True)
    with pytest.raises(SchemaError, match="more than one row"):
        collect_partials(partials.unionByName(partials), key_col="k", public_keys=["a"], has_sum=True)
    with pytest.raises(SchemaError, match="integer type"):
        compute_partials(df.withColumn("fx", F.col("fx").cast("double")), key_col="k",
                         unit_col="unit", fixed_col="fx")
    with pytest.raises(SchemaError, match="key column"):
        compute_partials(df.withColumn("k", F.lit(1.5)), key_col="k", unit_col="unit")


# --------------------------------------------------------------------------- exact sums


def test_sums_identical_with_1_and_200_partitions_and_exact(spark):
    rng = random.Random(11)  # test data only
    values = [rng.uniform(-50.0, 150.0) for _ in range(20_000)]
    rows = [(f"u{i % 997}", REGIONS[i % 5], v) for i, v in enumerate(values)]
    df = spark.createDataFrame(rows, "unit string, k string, v double")
    lower, upper, f = -10.0, 100.0, 16

    def run(frame):
        fixed = clamp_to_fixed_point(frame, value_col="v", lower=lower, upper=upper, frac_bits=f, out_col="fx")
        partials = compute_partials(fixed, key_col="k", unit_col="unit", fixed_col="fx")
        return collect_partials(partials, key_col="k", public_keys=REGIONS, has_sum=True)

    one, many = run(df.repartition(1)), run(df.repartition(200))
    assert one == many
    for j, region in enumerate(REGIONS):
        exact = sum(_fixed(v, lower, upper, f) for i, v in enumerate(values) if i % 5 == j)
        assert one[region]["sum_fixed"] == exact
        assert one[region]["rows"] == 4000


@pytest.mark.parametrize("ansi_on", [True, False])
def test_sum_beyond_2_63_neither_wraps_nor_raises(spark, ansi, ansi_on):
    ansi(ansi_on)
    n = 3000  # 3000 * 2^52 > 2^63: a long sum would wrap (ANSI off) or raise (ANSI on)
    df = spark.range(0, n, 1, 3).select(F.format_string("u%d", "id").alias("unit"), F.lit(1e300).alias("v"))
    fixed = clamp_to_fixed_point(df, value_col="v", lower=0.0, upper=2.0**42, frac_bits=10, out_col="fx")
    got = collect_partials(
        compute_partials(fixed, key_col=None, unit_col="unit", fixed_col="fx"),
        key_col=None, public_keys=None, has_sum=True,
    )
    assert got[GLOBAL_KEY]["sum_fixed"] == n * 2**52
    assert got[GLOBAL_KEY]["sum_fixed"] > 2**63


@pytest.mark.parametrize("ansi_on", [True, False])
def test_split_long_sums_are_exact_for_any_long(spark, ansi, ansi_on):
    """The three 21-bit part sums recombine exactly for extreme and negative longs."""
    ansi(ansi_on)
    rng = random.Random(11)
    extremes = [2**63 - 1, -(2**63), -1, 0, 1, 2**42, -(2**42) - 1, 2**21 - 1, -(2**21)]
    values = extremes * 50 + [rng.randrange(-(2**63), 2**63) for _ in range(3000)]
    rows = [(f"u{i % 97}", REGIONS[i % 3], v) for i, v in enumerate(values)]
    df = spark.createDataFrame(rows, "unit string, region string, fx long").repartition(7)
    got = collect_partials(compute_partials(df, key_col="region", unit_col="unit", fixed_col="fx"),
                           key_col="region", public_keys=REGIONS[:3], has_sum=True)
    for j, region in enumerate(REGIONS[:3]):
        assert got[region]["sum_fixed"] == sum(v for i, v in enumerate(values) if i % 3 == j)
        assert got[region]["rows"] == sum(1 for i in range(len(values)) if i % 3 == j)


def test_units_are_counted_only_when_asked(spark):
    df = spark.createDataFrame([("u1", "region_01", 2), ("u1", "region_01", 3), ("u2", "region_01", 5)],
                               "unit string, region string, fx long")
    without = compute_partials(df, key_col="region", unit_col="unit", fixed_col="fx", count_units=False)
    assert without.columns == ["key", "rows", "sum_fixed"]
    assert without.schema["sum_fixed"].dataType.simpleString() == "decimal(38,0)"
    got = collect_partials(without, key_col="region", public_keys=["region_01", "region_02"], has_sum=True)
    assert got == {"region_01": {"rows": 3, "sum_fixed": 10}, "region_02": {"rows": 0, "sum_fixed": 0}}
    with_units = collect_partials(compute_partials(df, key_col="region", unit_col="unit"), key_col="region",
                                  public_keys=["region_01"], has_sum=False)
    assert with_units == {"region_01": {"rows": 3, "units": 2}}


# --------------------------------------------------------------------------- grey-box neighbours

L0, LINF, K = 2, 3, 5
LOWER, UPPER, FRAC = -10.0, 100.0, 8
SALT = "grey-box"


def _pipeline(df):
    """The whole Spark path of a per-region count / distinct-units / sum release."""
    df = select_columns(df, ["user_id", "region", "order_value", "event_id"], unit_col="user_id",
                        key_cols=["region"], value_col="order_value")
    df = drop_null_units(df, unit_col="user_id")
    df = apply_value_policy(df, value_col="order_value")
    df = restrict_to_public_keys(df, key_col="region", public_keys=REGIONS)
    df = bound_contributions(df, unit_col="user_id", partition_col="region", max_partitions_per_unit=L0,
                             max_rows_per_partition=LINF, max_rows_per_unit=K, salt=SALT)
    df = clamp_to_fixed_point(df, value_col="order_value", lower=LOWER, upper=UPPER, frac_bits=FRAC,
                              out_col="fx")
    partials = compute_partials(df, key_col="region", unit_col="user_id", fixed_col="fx")
    return collect_partials(partials, key_col="region", public_keys=REGIONS, has_sum=True)


def _base(spark):
    rng = random.Random(5)  # test data only
    rows = []
    for i in range(4000):
        user = f"u{rng.randrange(60):03d}" if rng.random() > 0.01 else None
        region = rng.choice(REGIONS + ["region_99"])
        value = rng.choice([rng.lognormvariate(3.5, 0.6)] * 20 + [float("nan"), None, -25.0, 1e9])
        rows.append((user, region, value, i))
    return spark.createDataFrame(rows, EVENT_DDL)


def _heavy(spark, values):
    """One extra unit with 10^4 rows over all regions (public and not)."""
    df = spark.range(0, 10_000, 1, 8).select(
        F.lit("heavy").alias("user_id"),
        F.element_at(F.array(*[F.lit(r) for r in REGIONS + ["region_99"]]), (F.col("id") % 6 + 1).cast("int"))
        .alias("region"),
        F.element_at(F.array(*[F.lit(v) for v in values]), (F.col("id") % len(values) + 1).cast("int"))
        .cast("double").alias("order_value"),
        (F.col("id") + 1_000_000).alias("event_id"),
    )
    return df


def _check_neighbour_bounds(d, d_prime):
    max_abs = max(abs(LOWER), abs(UPPER)) * 2**FRAC
    changed = [k for k in REGIONS if d[k] != d_prime[k]]
    assert len(changed) <= L0, "a unit may touch at most L0 cells"
    total_rows = 0
    for k in REGIONS:
        dr = d_prime[k]["rows"] - d[k]["rows"]
        du = d_prime[k]["units"] - d[k]["units"]
        ds = d_prime[k]["sum_fixed"] - d[k]["sum_fixed"]
        assert 0 <= dr <= LINF, (k, dr)
        assert 0 <= du <= 1, (k, du)
        assert abs(ds) <= LINF * max_abs, (k, ds)
        total_rows += dr
    assert total_rows <= min(K, L0 * LINF)
    return changed, total_rows


def test_neighbour_differing_by_one_heavy_user_moves_each_partial_within_its_bound(spark):
    base = _base(spark)
    d = _pipeline(base)
    d_prime = _pipeline(base.unionByName(_heavy(spark, [1e9, float("inf"), 2.0**62, 55.5])))
    changed, total_rows = _check_neighbour_bounds(d, d_prime)
    assert total_rows == min(K, L0 * LINF)  # the heavy unit is bounded, not dropped
    assert len(changed) == L0


def test_the_sum_bound_is_attained_so_clamping_is_really_applied(spark):
    base = _base(spark)
    d = _pipeline(base)
    d_prime = _pipeline(base.unionByName(_heavy(spark, [1e9])))
    changed, _ = _check_neighbour_bounds(d, d_prime)
    diffs = sorted(d_prime[k]["sum_fixed"] - d[k]["sum_fixed"] for k in changed)
    # K = 5 rows over L0 = 2 cells with Linf = 3: 2 + 3 rows, each clamped to U * 2^f exactly.
    u = int(UPPER * 2**FRAC)
    assert diffs == [2 * u, 3 * u]


def test_neighbour_with_only_nan_and_inf_rows(spark):
    base = _base(spark)
    d = _pipeline(base)
    nan_only = _pipeline(base.unionByName(_heavy(spark, [float("nan")])))
    assert nan_only == d, "NaN rows are dropped on every path"
    inf_rows = _pipeline(base.unionByName(_heavy(spark, [float("nan"), float("inf"), float("-inf")])))
    _check_neighbour_bounds(d, inf_rows)
    assert inf_rows != d


def test_null_unit_flood_does_not_change_any_partial(spark):
    base = _base(spark)
    d = _pipeline(base)
    flood = _heavy(spark, [1e9]).withColumn("user_id", F.lit(None).cast("string"))
    assert _pipeline(base.unionByName(flood)) == d
