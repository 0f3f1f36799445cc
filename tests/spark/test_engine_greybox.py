"""Grey-box replay on the Spark path (RELIABILITY, statistical recipe, last item).

D and D' differ by all the records of one heavy unit (10^4 rows over every key, with
NaN, inf and absurd values). The engine's Spark bounding and partials, then its driver-side
noise step, run on both with a recording wrapper around ``add_noise``: the sequence of noise
calls (statistic, mechanism, scale, cells) must be identical, and at every call the true
inputs may differ by at most the declared sensitivity (per cell, L1 and L2, in grid units).
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

import dp_spark.mechanisms.release as release_mod
from dp_spark.backends.spark import build_query_partials, collect_query_partials
from dp_spark.config import release_spec_from_dict
from dp_spark.engine import plan_for
from dp_spark.mechanisms.samplers import OpenDPNoiseSource

REGIONS = [f"r{i}" for i in range(6)]
DAYS = ["2026-11-01", "2026-11-02", "2026-11-03", "2026-11-04"]
SCHEMA = T.StructType([
    T.StructField("user_id", T.StringType()), T.StructField("region", T.StringType()),
    T.StructField("day", T.DateType()), T.StructField("order_value", T.DoubleType()),
])


def _spec(metric, measure, **extra):
    d = {
        "name": f"g_{metric}", "dataset": "x", "privacy_unit": {"kind": "user", "column": "user_id"},
        "metric": metric,
        "group_by": {"column": "region", "public_keys": {"values": REGIONS}},
        "bounds": {"max_rows_per_unit": 3, "max_partitions_per_unit": 2, "max_rows_per_partition": 2},
        "budget": {"id": "b", "measure": measure, **({"epsilon": 1} if measure == "pure_dp" else {"rho": 0.5})},
    }
    if metric in ("sum", "mean"):
        d["value"] = {"column": "order_value", "lower": -10, "upper": 100}
    if metric == "mean":
        d["mean"] = {"assumed_group_size": 50, "min_count": 5}
    if metric == "distinct_units":
        d["group_by"] = {"column": "day", "public_keys": {"dates": {"start": DAYS[0], "end": DAYS[-1]}}}
        d["bounds"] = {"max_rows_per_unit": 4, "max_partitions_per_unit": 4, "max_rows_per_partition": 1}
    d.update(extra)
    return release_spec_from_dict(d, source="greybox")


@pytest.fixture(scope="module")
def datasets(spark):
    from datetime import date

    rows = []
    for u in range(60):
        for j in range(1 + u % 5):
            rows.append((f"u{u}", REGIONS[(u + j) % len(REGIONS)], date(2026, 11, 1 + (u + j) % 4),
                         float((u * 7 + j * 13) % 90)))
    d = spark.createDataFrame(rows, SCHEMA)
    heavy = (spark.range(10_000)
             .select(F.lit("heavy").alias("user_id"),
                     F.concat(F.lit("r"), (F.col("id") % len(REGIONS)).cast("string")).alias("region"),
                     F.date_add(F.lit("2026-11-01").cast("date"), (F.col("id") % 4).cast("int")).alias("day"),
                     F.when(F.col("id") % 3 == 0, F.lit(float("nan")))
                     .when(F.col("id") % 3 == 1, F.lit(float("inf")))
                     .otherwise(F.lit(1e12)).alias("order_value")))
    return d, d.unionByName(heavy)


_REAL_ADD_NOISE = release_mod.add_noise_array  # QueryPlan.noise's one call per component


def _replay(spark, df, spec, monkeypatch):
    calls = []
    real = _REAL_ADD_NOISE

    def recording(plan, true_values, source):
        calls.append((plan, [int(v) for v in true_values]))
        return real(plan, true_values, source)

    monkeypatch.setattr(release_mod, "add_noise_array", recording)
    plan = plan_for(spec)  # the one path: a single-metric spec runs as its rewrite
    partials = collect_query_partials(build_query_partials(df, plan, "salt"), plan)
    plan.noise(partials, OpenDPNoiseSource())
    return calls


@pytest.mark.parametrize("metric", ["count", "distinct_units", "sum", "mean"])
@pytest.mark.parametrize("measure", ["pure_dp", "zcdp"])
def test_neighbours_differ_by_at_most_the_sensitivity(spark, datasets, monkeypatch, metric, measure):
    d, d_prime = datasets
    spec = _spec(metric, measure)
    a = _replay(spark, d, spec, monkeypatch)
    b = _replay(spark, d_prime, spec, monkeypatch)
    sig = lambda calls: [(p.statistic, p.mechanism, p.scale, len(v)) for p, v in calls]  # noqa: E731
    assert sig(a) == sig(b)  # the same noise calls, whatever the data
    assert len(a) == (2 if metric == "mean" else 1)
    for (plan, va), (_, vb) in zip(a, b):
        diff = [abs(x - y) for x, y in zip(va, vb)]
        assert any(diff), "the heavy unit must change something, or this test proves nothing"
        sens = plan.sensitivity_grid  # what calibrated the noise, from the enforced bounds
        assert max(diff) <= sens.per_partition
        assert sum(diff) <= sens.l1
        assert sum(Fraction(x) ** 2 for x in diff) <= sens.l2_squared


def test_replay_detects_a_missing_bound(spark, datasets, monkeypatch):
    """The check can fail: without the K/L0 bounds the heavy unit breaks the sensitivity."""
    import dp_spark.backends.spark as query

    d, d_prime = datasets
    spec = _spec("count", "pure_dp")
    monkeypatch.setattr(query, "bound_contributions", lambda df, **kw: df)
    a = _replay(spark, d, spec, monkeypatch)
    b = _replay(spark, d_prime, spec, monkeypatch)
    (plan, va), (_, vb) = a[0], b[0]
    sens = plan.sensitivity_grid
    assert sum(abs(x - y) for x, y in zip(va, vb)) > sens.l1
