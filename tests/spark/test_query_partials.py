"""Spark tests of the one aggregation path (dp_spark.backends.spark): exact partials per key
tuple, independent of the partitioning, and exact value sums beyond 2^63 under either ANSI mode.

The grey-box neighbour tests (one heavy unit moves each partial within its bound; NaN rows and
null units dropped; distinct units cut to min(L0, K) cells) run on the local reference backend
(tests/unit/test_local_backend.py), which the Spark path equals on random data with heavy
units, NaN, inf and null units (tests/spark/test_backend_equivalence.py)."""

from __future__ import annotations

import random
from decimal import ROUND_HALF_UP, Decimal

import pytest
from pyspark.sql import functions as F

from dp_spark.backends.spark import build_query_partials, collect_query_partials
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


# --------------------------------------------------------------------------- one pass


def test_distinct_units_under_the_k_cut_read_the_input_once(spark, tmp_path):
    """K alone (L0 >= the cells, no Linf) with distinct units that the K cut would thin: the
    row statistics and the (unit, cell) pairs come from ONE scan of the input (the K cut is a
    flag, not a second pass over the rows), and a unit with 20 rows in 2 cells still counts in
    both while its rows are cut to K."""
    plan = _plan(0, 100, bounds={"max_rows_per_unit": K, "max_partitions_per_unit": 5})
    rows = [("heavy", REGIONS[i % 2], 10.0, i) for i in range(20)] + [("light", REGIONS[2], 5.0, 100)]
    spark.createDataFrame(rows, EVENT_DDL).write.parquet(str(tmp_path / "events"))
    df = spark.read.parquet(str(tmp_path / "events"))
    partials = build_query_partials(df, plan, SALT)
    scans = partials._jdf.queryExecution().optimizedPlan().toString().count("] parquet")
    assert scans == 1, f"the input is read {scans} times"
    got = _partials(df, plan)
    assert got[REGIONS[0]]["units"] == 1 and got[REGIONS[1]]["units"] == 1 and got[REGIONS[2]]["units"] == 1
    assert got[REGIONS[0]]["rows"] + got[REGIONS[1]]["rows"] == K and got[REGIONS[2]]["rows"] == 1


def test_the_arrow_and_the_streamed_collect_give_the_same_columns_and_refuse_alike(spark, monkeypatch):
    """stream_partial_columns collects up to ARROW_COLLECT_VALUES values as Arrow in one job,
    beyond that one partition at a time: the same int64 columns (a null is 0, sorted by cell)
    on 7 partitions, and more rows than cells or two rows of a cell refused either way."""
    import numpy as np

    from dp_spark.backends import spark as backend
    from dp_spark.errors import SchemaError

    rows = [(c, None if c % 5 == 0 else c * 3 - 40, (1 << 62) + c) for c in random.Random(3).sample(range(500), 300)]
    df = spark.createDataFrame(rows, f"{backend.CELL} long, a long, b long").repartition(7)

    def both(frame, n):
        got = []
        for limit in (backend.ARROW_COLLECT_VALUES, 0):  # 0: every collect streams
            monkeypatch.setattr(backend, "ARROW_COLLECT_VALUES", limit)
            got.append(backend.stream_partial_columns(frame, n, batch=64))
        return got

    arrow, streamed = both(df, 500)
    want = sorted(rows)
    for got in (arrow, streamed):
        assert got.index.tolist() == [r[0] for r in want]
        assert got.columns["a"].dtype == np.int64 and got.columns["a"].tolist() == [r[1] or 0 for r in want]
        assert got.columns["b"].tolist() == [r[2] for r in want]
    for frame, n in ((df, 299), (df.union(df.limit(1)), 500)):
        for limit in (backend.ARROW_COLLECT_VALUES, 0):
            monkeypatch.setattr(backend, "ARROW_COLLECT_VALUES", limit)
            with pytest.raises(SchemaError):
                backend.stream_partial_columns(frame, n, batch=64)
