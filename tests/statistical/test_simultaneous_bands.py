"""Family-wise coverage of the simultaneous bands (``confidence: {simultaneous: true}``) and of
the chart's significant changes, over 2,000 seeded 60-cell releases drawn by the engine's own
noise step (:meth:`QueryPlan.noise` with the test-only exact sampler; no Spark).

* The band: the share of releases whose 60 cells are ALL inside their bands is >= the level
  within 3 standard errors (tolerance 3 sqrt(L (1 - L) / 2000) = 0.0146 at 0.95). The same
  check FAILS for a band that is too narrow: the pointwise interval used as the band (all 60
  inside about 0.95^60 = 5% of the time), and a Sidak level for 30 cells instead of 60
  (about 90%): the check can fail.
* The changes: on a flat truth no change is there, so the share of releases in which the chart
  marks ANY change significant is <= 1 - level within the same tolerance; the pointwise
  intervals of the changes (no multiplicity correction) fail that check.
"""

from __future__ import annotations

import math
from datetime import date, timedelta
from fractions import Fraction

import pytest

from dp_spark.config import release_spec_from_dict
from dp_spark.evaluation.chart_data import series_chart_data
from dp_spark.mechanisms.samplers import SeededNoiseSource
from dp_spark.statistics.noise import joint_alpha
from dp_spark.statistics.plan import plan_query

REPS, CELLS, LEVEL = 2000, 60, 0.95
TOL = 3 * math.sqrt(LEVEL * (1 - LEVEL) / REPS)  # 0.0146
START = date(2026, 9, 1)
TRUE_UNITS = 100_000  # every day: far from 0 (bands of about 1,000), so the count's clamp at 0 never acts


@pytest.fixture(autouse=True)
def _test_mode(monkeypatch):
    monkeypatch.setenv("DP_SPARK_TEST_MODE", "1")


def _plan(measure: str, simultaneous: bool = True):
    budget = {"id": "b", "measure": measure, **({"rho": "0.02"} if measure == "zcdp" else {"epsilon": "0.4"})}
    return plan_query(release_spec_from_dict({
        "name": "bands", "dataset": "x", "privacy_unit": {"kind": "user", "column": "user_id"},
        "group_by": [{"column": "day", "public_keys": {"dates": {
            "start": START.isoformat(), "end": (START + timedelta(days=CELLS - 1)).isoformat()}}}],
        "bounds": {"max_rows_per_unit": 60, "max_partitions_per_unit": 60},
        "statistics": [{"name": "dau", "kind": "distinct_units"}],
        "budget": budget, "confidence": {"level": LEVEL, "simultaneous": simultaneous}, "max_cells": 100}, "b.yaml"))


def _releases(measure: str, seed: int):
    plan = _plan(measure)
    partials = {i: {"dp_rows": TRUE_UNITS, "dp_units": TRUE_UNITS} for i in range(CELLS)}
    src = SeededNoiseSource(seed)
    for _ in range(REPS):
        cells = plan.noise(partials, src)
        assert len(cells) == CELLS
        yield plan, cells


def _covered(cells, lo: str, hi: str) -> bool:
    return all(c[lo] <= TRUE_UNITS <= c[hi] for c in cells)


@pytest.mark.slow  # 2 x 2,000 releases: about 45 s each
@pytest.mark.parametrize("measure, seed", [("pure_dp", 61), ("zcdp", 62)])
def test_band_covers_all_cells_together_and_a_narrow_band_fails(measure, seed):
    band = pointwise = sidak_30 = any_change = 0
    narrow_any_change = 0
    for plan, cells in _releases(measure, seed):
        band += _covered(cells, "band_low", "band_high")
        pointwise += _covered(cells, "ci_low", "ci_high")
        # a too-narrow band: the same construction at the Sidak level for 30 cells, not 60
        p = plan.statistics[0]
        h = float(p.halfwidth_grid(Fraction(joint_alpha(Fraction(1) - Fraction(LEVEL), 30))) * p.grid_unit)
        sidak_30 += all(abs(c["value"] - TRUE_UNITS) <= h for c in cells)
        rows = [{**c, "confidence": LEVEL, "release_id": "r"} for c in cells]
        (chart,) = series_chart_data(rows)
        assert chart.change_method == "exact" and chart.simultaneous
        any_change += bool(chart.significant)
        # the changes' pointwise intervals (no correction for the 59 changes) on the same rows
        from dp_spark.evaluation.utility import trend_differences

        diffs = trend_differences(rows, statistic="dau", confidence=LEVEL)
        narrow_any_change += any(d["ci_low"] > 0 or d["ci_high"] < 0 for d in diffs)
    band_cov, point_cov, s30_cov = band / REPS, pointwise / REPS, sidak_30 / REPS
    false_marks, narrow_marks = any_change / REPS, narrow_any_change / REPS
    print(f"{measure}: family-wise coverage band {band_cov:.4f}, pointwise {point_cov:.4f}, "
          f"Sidak-for-30 {s30_cov:.4f}; any false change marked {false_marks:.4f} "
          f"(pointwise changes {narrow_marks:.4f}) over {REPS} releases of {CELLS} cells")
    assert band_cov >= LEVEL - TOL, band_cov
    # the check can fail: too-narrow bands fail the same check
    assert not point_cov >= LEVEL - TOL, point_cov
    assert not s30_cov >= LEVEL - TOL, s30_cov
    # the chart's significant changes: family-wise error <= 1 - level; uncorrected ones fail
    assert false_marks <= (1 - LEVEL) + TOL, false_marks
    assert not narrow_marks <= (1 - LEVEL) + TOL, narrow_marks


@pytest.mark.slow  # 400 releases through the per-cell finish: 10-70 s
def test_a_mean_band_covers_all_cells_together():
    """A mean (two noises, a clamped ratio; per-cell interval construction at the Sidak
    level): 400 releases of 30 cells, coverage of the bounded mean >= the level within 3 se.
    Measured: 0.945 (seed 63; 3 se = 0.033 at 400 releases)."""
    reps, cells_n = 400, 30
    spec = release_spec_from_dict({
        "name": "bands_mean", "dataset": "x", "privacy_unit": {"kind": "user", "column": "user_id"},
        "group_by": [{"column": "day", "public_keys": {"dates": {
            "start": START.isoformat(), "end": (START + timedelta(days=cells_n - 1)).isoformat()}}}],
        "bounds": {"max_rows_per_unit": 1, "max_partitions_per_unit": 1},
        "statistics": [{"name": "avg", "kind": "mean", "column": "v", "lower": 0, "upper": 100}],
        "budget": {"id": "b", "measure": "zcdp", "rho": "0.5"},
        "confidence": {"level": LEVEL, "simultaneous": True}, "max_cells": 100}, "m.yaml")
    plan = plan_query(spec)
    n, per_row = 100, 37  # every day: 100 users with one row of value 37 (the partials from
    # the local reference backend, the definition the Spark path is tested against)
    from dp_spark.backends.local import query_partials as qp_local

    rows = [{"user_id": f"u{d}_{i}", "day": (START + timedelta(days=d)).isoformat(), "v": per_row}
            for d in range(cells_n) for i in range(n)]
    partials = qp_local(rows, plan, "salt", schema={"user_id": "string", "day": "string", "v": "long"}).cells
    src = SeededNoiseSource(63)
    hit = 0
    for _ in range(reps):
        cells = plan.noise(partials, src)
        hit += all(c["band_low"] <= per_row <= c["band_high"] for c in cells)
        assert all(c["band_low"] <= c["ci_low"] and c["ci_high"] <= c["band_high"] for c in cells)
        # not trivial: the band is a few units wide on a range of 100
        assert all(c["band_high"] - c["band_low"] < 10 for c in cells)
    cov = hit / reps
    tol = 3 * math.sqrt(LEVEL * (1 - LEVEL) / reps)
    print(f"mean: family-wise band coverage {cov:.4f} over {reps} releases of {cells_n} cells")
    assert cov >= LEVEL - tol, cov
