"""Executor-side noise (``dp_spark.backends.spark.noisy_release_frame``) against the driver path
(``collect_query_partials`` + ``QueryPlan.noise``): the same cells through the same
post-processing, every cell noised, seeded sources reproducible per batch, and (slow) the same
distribution of the published noise with the production sampler -- which a biased sampler fails."""

from __future__ import annotations

import datetime as dt
import random
from fractions import Fraction

import numpy as np
import pytest
from pyspark.sql import types as T

from tests.noise_sources import Shift
from dp_spark.backends.local import query_partials
from dp_spark.backends.spark import (NOISY_CELL_FIELDS, NOISY_KEY_PREFIX, build_query_partials,
                                     collect_query_partials, noisy_release_frame)
from dp_spark.config import release_spec_from_dict
from dp_spark.mechanisms.samplers import NoiseSource, OpenDPNoiseSource, SeededNoiseSource
from dp_spark.statistics.plan import key_tuples, key_tuples_at, plan_query

pytestmark = pytest.mark.spark

SALT = "executor-noise-salt"
SCHEMA = T.StructType([T.StructField("user_id", T.StringType()), T.StructField("region", T.StringType()),
                       T.StructField("day", T.DateType()), T.StructField("v", T.DoubleType())])
TYPES = {"user_id": "string", "region": "string", "day": "date", "v": "double"}
STATS = [{"name": "rows", "kind": "count"},
         {"name": "total", "kind": "sum", "column": "v", "lower": 0, "upper": 100},
         {"name": "avg", "kind": "mean", "column": "v", "lower": 0, "upper": 100},
         {"name": "med", "kind": "quantile", "column": "v", "lower": 0, "upper": 100, "q": 0.5}]


class Scaled(NoiseSource):
    """A deliberately biased sampler: OpenDP's draws at ``factor`` times the plan's scale."""

    name = "scaled"

    def __init__(self, factor: Fraction):
        self.factor = factor
        self.inner = OpenDPNoiseSource()

    def discrete_laplace(self, scale, n):
        return self.inner.discrete_laplace(Fraction(scale) * self.factor, n)

    def discrete_gaussian(self, sigma, n):
        return self.inner.discrete_gaussian(Fraction(sigma) * self.factor, n)


def _rows(seed: int, regions: list[str], n_rows: int = 1200, n_users: int = 150):
    rng = random.Random(seed)  # test data only
    days = [dt.date(2026, 11, 1) + dt.timedelta(days=i) for i in range(3)]
    return [{"user_id": f"u{rng.randrange(n_users)}", "region": rng.choice(regions[:20]), "day": rng.choice(days),
             "v": rng.choice([rng.uniform(-5, 120), None])} for _ in range(n_rows)]


def _plan(regions, *, statistics=STATS, confidence=0.9, rho=1):
    d = {"name": "exec", "dataset": "x", "privacy_unit": {"kind": "user", "column": "user_id"},
         "group_by": [{"column": "region", "public_keys": {"values": regions}},
                      {"column": "day", "public_keys": {"dates": {"start": "2026-11-01", "end": "2026-11-03"}}}],
         "bounds": {"max_rows_per_unit": 6, "max_partitions_per_unit": 2}, "statistics": statistics,
         "budget": {"id": "b", "measure": "zcdp", "rho": rho}, "confidence": confidence, "max_cells": 10**6}
    return plan_query(release_spec_from_dict(d, "exec.yaml"))


def _partials_df(spark, rows, plan):
    df = spark.createDataFrame([tuple(r[f.name] for f in SCHEMA.fields) for r in rows], SCHEMA)
    return build_query_partials(df.repartition(3), plan, SALT)


def _driver(partials_df, plan, source):
    return plan.noise(collect_query_partials(partials_df, plan), source)


def _executor(partials_df, plan, source, batch=64):
    frame = noisy_release_frame(partials_df, plan, source, batch=batch)
    names = [ks.column for ks in plan.spec.key_sets]
    out = []
    for r in frame.collect():  # the test reads the frame; the engine writes it (never collects)
        d = r.asDict()
        d["keys"] = {c: d.pop(f"{NOISY_KEY_PREFIX}{j}") for j, c in enumerate(names)}
        out.append(d)
    return out


def _by_cell(cells):
    return {(c["statistic"], c["key"]): c for c in cells}


def test_key_tuples_at_decodes_the_cross_product():
    plan = _plan([f"r{i}" for i in range(7)])
    every = key_tuples(plan.spec.key_sets)
    assert key_tuples_at(plan.spec.key_sets, range(len(every))) == every
    assert key_tuples_at(plan.spec.key_sets, [20, 3]) == [every[20], every[3]]


@pytest.mark.parametrize("confidence", [0.9, {"level": 0.9, "simultaneous": True}])
def test_both_paths_publish_the_same_cells_through_the_same_post_processing(spark, confidence):
    regions = [f"r{i:03d}" for i in range(120)]  # 360 key tuples, most absent from the data
    plan = _plan(regions, confidence=confidence)
    rows = _rows(3, regions)
    pdf = _partials_df(spark, rows, plan)
    fields = [f for f, _ in NOISY_CELL_FIELDS] + ["keys"]
    driver = _by_cell(_driver(pdf, plan, Shift(3)))
    executor = _by_cell(_executor(pdf, plan, Shift(3), batch=50))  # 8 slices of the grid
    assert len(executor) == len(driver) == 360 * len(STATS)
    for cell, d in driver.items():
        e = executor[cell]
        assert {f: e.get(f) for f in fields} == {f: d.get(f) for f in fields}, cell
    # every cell went through the noise: against the reference (local) backend's partials
    # noised with 0, each count is its true value + 3 grid units, never the true value
    local = query_partials(rows, plan, SALT, schema=TYPES).cells
    true = _by_cell(plan.noise(local, Shift(0)))
    for (stat, key), c in executor.items():
        if stat == "rows":
            assert c["value"] == true[(stat, key)]["value"] + 3 * c["grid"]


def test_the_executor_frame_has_no_partial_columns(spark):
    regions = [f"r{i}" for i in range(30)]
    plan = _plan(regions)
    frame = noisy_release_frame(_partials_df(spark, _rows(4, regions), plan), plan, Shift(1))
    assert frame.columns == [f for f, _ in NOISY_CELL_FIELDS] + ["dp_key_0", "dp_key_1"]


def test_seeded_sources_are_reproducible_and_batches_never_share_draws(spark, monkeypatch):
    monkeypatch.setenv("DP_SPARK_TEST_MODE", "1")
    regions = [f"r{i:03d}" for i in range(200)]
    plan = _plan(regions, statistics=STATS[:1])
    rows = _rows(5, regions)
    pdf = _partials_df(spark, rows, plan)
    a = _by_cell(_executor(pdf, plan, SeededNoiseSource(9), batch=100))
    b = _by_cell(_executor(pdf, plan, SeededNoiseSource(9), batch=100))
    c = _by_cell(_executor(pdf, plan, SeededNoiseSource(10), batch=100))
    assert {k: v["value"] for k, v in a.items()} == {k: v["value"] for k, v in b.items()}
    assert {k: v["value"] for k, v in a.items()} != {k: v["value"] for k, v in c.items()}
    # the noise of consecutive slices differs (each slice has its own derived stream)
    local = query_partials(rows, plan, SALT, schema=TYPES).cells
    true = _by_cell(plan.noise(local, Shift(0)))
    keys = [k for k in true]  # grid order
    noise = [a[k]["value"] - true[k]["value"] for k in keys]
    assert noise[:100] != noise[100:200]
    assert SeededNoiseSource(9).for_batch(0).seed != SeededNoiseSource(9).for_batch(100).seed


def _residuals(cells, true):
    return np.array([(c["value"] - true[(c["statistic"], c["key"])]["value"]) / c["grid"] for c in cells])


@pytest.mark.slow
def test_both_paths_publish_identically_distributed_noise_and_a_biased_sampler_fails(spark):
    """Two-sample Kolmogorov-Smirnov on the noise of 6,000 cells (OpenDP's sampler) of each path;
    a sampler drawing at 1.3x the scale on the executors must fail the same test."""
    from scipy.stats import ks_2samp

    regions = [f"r{i:04d}" for i in range(2000)]
    plan = _plan(regions, statistics=STATS[:1], rho=Fraction(1, 20))  # sigma ~ 4.5 grid units
    rows = _rows(8, regions)
    pdf = _partials_df(spark, rows, plan)
    local = query_partials(rows, plan, SALT, schema=TYPES).cells
    true = _by_cell(plan.noise(local, Shift(0)))
    driver = _residuals(_driver(pdf, plan, OpenDPNoiseSource()), true)
    executor = _residuals(_executor(pdf, plan, OpenDPNoiseSource(), batch=1000), true)
    assert len(driver) == len(executor) == 6000
    assert ks_2samp(driver, executor).pvalue > 1e-3
    biased = _residuals(_executor(pdf, plan, Scaled(Fraction(13, 10)), batch=1000), true)
    assert ks_2samp(driver, biased).pvalue < 1e-3
