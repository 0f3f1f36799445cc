"""Spark tests of the one aggregation path (dp_spark.aggregations.query): exact partials per key
tuple, exact value sums beyond 2^63, and the partials of neighbours that differ by one heavy
unit moving each component within its bound (L0 cells, Linf rows per cell, K rows in all,
clamped values; NaN rows and null units dropped on every path)."""

from __future__ import annotations

import random
from decimal import ROUND_HALF_UP, Decimal

import pytest
from pyspark.sql import functions as F

from dp_spark.aggregations.query import build_query_partials, collect_query_partials
from dp_spark.config import release_spec_from_dict
from dp_spark.statistics.plan import plan_query

REGIONS = [f"region_{i:02d}" for i in range(1, 6)]
EVENT_DDL = "user_id string, region string, order_value double, event_id long"
L0, LINF, K = 2, 3, 5
SALT = "grey-box"


def _plan(lower, upper, *, regions=REGIONS, bounds=None, unit="user_id", value="order_value"):
    """A release of rows, distinct units and the clamped sum of ``value`` per region."""
    spec = release_spec_from_dict({
        "name": "partials", "dataset": "x", "privacy_unit": {"kind": "user", "column": unit},
        "group_by": {"column": "region", "public_keys": {"values": regions}},
        "bounds": bounds or {"max_rows_per_unit": K, "max_partitions_per_unit": L0, "max_rows_per_partition": LINF},
        "statistics": [{"name": "rows", "kind": "count"}, {"name": "units", "kind": "distinct_units"},
                       {"name": "total", "kind": "sum", "column": value, "lower": lower, "upper": upper}],
        "budget": {"id": "b", "measure": "pure_dp", "epsilon": 1}}, "partials.yaml")
    return plan_query(spec)


def _partials(df, plan) -> dict[str, dict[str, int]]:
    """{region: {rows, units, sum (grid units)}} through the engine's one path."""
    got = collect_query_partials(build_query_partials(df, plan, SALT), plan)
    value = next(c for c in plan.components if c.kind in ("sum", "nsum"))
    out = {}
    for i, key in enumerate(plan.spec.keys):
        p = got.get(i, {})
        out[key] = {"rows": p.get("dp_rows", 0), "units": p.get("dp_units", 0), "sum": value.exact_sum(p)}
    return out


def _fixed(v: float, lower: float, upper: float, frac_bits: int) -> int:
    c = min(max(v, lower), upper)
    return int(Decimal(c * 2**frac_bits).quantize(Decimal(1), rounding=ROUND_HALF_UP))


# --------------------------------------------------------------------------- exact sums
def test_sums_identical_with_1_and_200_partitions_and_exact(spark):
    rng = random.Random(11)  # test data only
    values = [rng.uniform(-50.0, 150.0) for _ in range(20_000)]
    rows = [(f"u{i}", REGIONS[i % 5], v, i) for i, v in enumerate(values)]  # one row per unit
    df = spark.createDataFrame(rows, EVENT_DDL)
    plan = _plan(-16, 112, bounds={"max_rows_per_unit": 1})
    clamp = plan.spec.statistics[2].clamp
    f = -clamp.grid_exponent
    one, many = _partials(df.repartition(1), plan), _partials(df.repartition(200), plan)
    assert one == many
    for j, region in enumerate(REGIONS):
        exact = sum(_fixed(v, float(clamp.lower), float(clamp.upper), f) for i, v in enumerate(values) if i % 5 == j)
        assert one[region]["sum"] == exact and one[region]["rows"] == one[region]["units"] == 4000


@pytest.mark.parametrize("ansi_on", [True, False])
def test_sum_beyond_2_63_neither_wraps_nor_raises(spark, ansi, ansi_on):
    ansi(ansi_on)
    n = 3000  # 3000 rows at the clamp's top: beyond 2^63 grid units (a long sum would wrap or raise)
    df = spark.range(0, n, 1, 3).select(F.format_string("u%d", "id").alias("user_id"),
                                        F.lit(REGIONS[0]).alias("region"), F.lit(1e300).alias("order_value"))
    plan = _plan(0, 2**52, bounds={"max_rows_per_unit": 1})
    clamp = plan.spec.statistics[2].clamp
    top = int(clamp.upper / 2**clamp.grid_exponent)
    got = _partials(df, plan)[REGIONS[0]]
    assert got["sum"] == n * top and got["sum"] > 2**63


# --------------------------------------------------------------------------- grey-box neighbours
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
    return spark.range(0, 10_000, 1, 8).select(
        F.lit("heavy").alias("user_id"),
        F.element_at(F.array(*[F.lit(r) for r in REGIONS + ["region_99"]]), (F.col("id") % 6 + 1).cast("int"))
        .alias("region"),
        F.element_at(F.array(*[F.lit(v) for v in values]), (F.col("id") % len(values) + 1).cast("int"))
        .cast("double").alias("order_value"),
        (F.col("id") + 1_000_000).alias("event_id"),
    )


PLAN = None


def _pipeline(df):
    global PLAN
    PLAN = PLAN or _plan(-10, 100)
    return _partials(df, PLAN)


def _check_neighbour_bounds(d, d_prime):
    clamp = PLAN.spec.statistics[2].clamp
    max_abs = max(abs(clamp.lower), abs(clamp.upper)) / 2**clamp.grid_exponent
    changed = [k for k in REGIONS if d[k] != d_prime[k]]
    assert len(changed) <= L0, "a unit may touch at most L0 cells"
    total_rows = 0
    for k in REGIONS:
        dr = d_prime[k]["rows"] - d[k]["rows"]
        du = d_prime[k]["units"] - d[k]["units"]
        ds = d_prime[k]["sum"] - d[k]["sum"]
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
    diffs = sorted(d_prime[k]["sum"] - d[k]["sum"] for k in changed)
    # K = 5 rows over L0 = 2 cells with Linf = 3: 2 + 3 rows, each clamped to U exactly
    clamp = PLAN.spec.statistics[2].clamp
    u = int(clamp.upper / 2**clamp.grid_exponent)
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


# --------------------------------------------------------------------------- distinct units
def test_a_unit_with_20_rows_in_2_cells_is_counted_in_both_cells(spark):
    """Distinct units come from the (unit, cell) pairs after the L0 cut and before the K row
    cut: 40 units, each with 19 rows in one region and 1 in another (20 rows, K = 5, L0 = 5):
    the row statistics keep 5 rows per unit (the other region's row mostly not among them),
    yet every unit is counted in both regions."""
    rows = []
    for u in range(40):
        a, b = REGIONS[u % 2], REGIONS[2 + u % 3]
        rows += [(f"u{u}", a, 1.0, 100 * u + j) for j in range(19)] + [(f"u{u}", b, 1.0, 100 * u + 19)]
    df = spark.createDataFrame(rows, EVENT_DDL)
    plan = _plan(0, 10, bounds={"max_rows_per_unit": 5, "max_partitions_per_unit": 5})
    got = _partials(df, plan)
    units = {k: got[k]["units"] for k in REGIONS}
    assert units == {REGIONS[0]: 20, REGIONS[1]: 20, REGIONS[2]: 14, REGIONS[3]: 13, REGIONS[4]: 13}
    assert sum(got[k]["rows"] for k in REGIONS) == 40 * 5  # the row statistics: K rows per unit
    assert sum(got[k]["rows"] for k in REGIONS[2:]) < 40  # most single rows were cut by K
    # the sensitivity stays L0' = min(L0, K) (each unit in <= L0' cells, 1 each)
    comp = next(c for c in plan.components if c.kind == "units")
    assert plan.plan_of(comp).sensitivity_grid.l1 == 5


def test_distinct_units_are_cut_to_min_l0_k_cells(spark):
    """K = 2 < L0 = 4: a unit with rows in 4 cells is counted in 2 of them (sensitivity
    min(L0, K) = 2), the cells of smallest priority, which hold its kept rows."""
    rows = [(f"u{u}", REGIONS[j], 1.0, 10 * u + j) for u in range(30) for j in range(4)]
    df = spark.createDataFrame(rows, EVENT_DDL)
    plan = _plan(0, 10, bounds={"max_rows_per_unit": 2, "max_partitions_per_unit": 4})
    got = _partials(df, plan)
    assert sum(got[k]["units"] for k in REGIONS) == 60 and sum(got[k]["rows"] for k in REGIONS) == 60
    comp = next(c for c in plan.components if c.kind == "units")
    assert plan.plan_of(comp).sensitivity_grid.l1 == 2


def test_distinct_units_keep_the_l0_cut(spark):
    """L0 = 1: the pair cut keeps one cell per unit, the very cell the row bounding keeps."""
    rows = []
    for u in range(30):
        rows += [(f"u{u}", REGIONS[j % 3], 1.0, 100 * u + j) for j in range(9)]
    df = spark.createDataFrame(rows, EVENT_DDL)
    plan = _plan(0, 10, bounds={"max_rows_per_unit": 2, "max_partitions_per_unit": 1})
    got = _partials(df, plan)
    assert sum(got[k]["units"] for k in REGIONS) == 30
    for k in REGIONS:  # users are counted where their kept rows are
        assert (got[k]["units"] > 0) == (got[k]["rows"] > 0)
        assert got[k]["rows"] == 2 * got[k]["units"]
