"""The coverage table's checks can fail (fast, not ``slow``): for every statistic kind under both
measures, the half-width that kind's interval is built from is monkeypatched smaller (on the
vectorised path the simulation takes, as a release does, and on the per-cell one), and the
same small seeded run (:func:`dp_spark.evaluation.coverage.simulate`, 200 releases of a cell of
50 units at levels 0.8 and 0.95) then fails the coverage check (coverage below nominal - 2 se),
while the unpatched run passes it. Likewise the error check fails (in a cell of 200 units)
when every kind's published error figures are halved. The full table (every size and level, 1,000 releases) is
tests/statistical/test_coverage_table.py (slow)."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import pytest

from dp_spark.evaluation import coverage
from dp_spark.mechanisms.release import StatisticPlan
from dp_spark.statistics import moments, noise, quantile
from dp_spark.statistics.base import KINDS

REPS, SIZE, LEVELS = 200, 50, ("0.8", "0.95")


def _run(measure: str, size: int = SIZE) -> list:
    return coverage.simulate(measure, reps=REPS, sizes=(size,), levels=LEVELS)


def _low(entries, kind: str) -> list[str]:
    return [line for line in coverage.check([e for e in entries if e.kind == kind]) if "nominal - 2 se" in line]


def _shrink_noise_halfwidth(mp, factor):
    """count, distinct_units, sum alone: the one noise's exact half-width (per cell, and on the
    grid for the vectorised path)."""
    real = noise.halfwidth
    mp.setattr(noise, "halfwidth", lambda plan, alpha: real(plan, alpha) * Fraction(factor))
    mp.setattr(moments, "halfwidth", lambda plan, alpha: real(plan, alpha) * Fraction(factor))
    real_grid = StatisticPlan.halfwidth_grid
    mp.setattr(StatisticPlan, "halfwidth_grid", lambda plan, alpha: int(real_grid(plan, alpha) * factor))


def _shrink_shared_sum(mp, factor):
    real = moments.shared_sum_accuracy

    def shrunk(*args):
        h, sd, expected = real(*args)
        return h * factor, sd, expected

    mp.setattr(moments, "shared_sum_accuracy", shrunk)


def _shrink_mean(mp, factor):
    real = moments.mean_cell_accuracy
    f = Fraction(factor)

    def shrunk(*args, **kwargs):
        out = real(*args, **kwargs)
        v = out["value"]
        return {**out, "ci_low": v - f * (v - out["ci_low"]), "ci_high": v + f * (out["ci_high"] - v)}

    mp.setattr(moments, "mean_cell_accuracy", shrunk)
    real_columns = moments.mean_cell_accuracy_columns

    def shrunk_columns(*args, **kwargs):
        out = real_columns(*args, **kwargs)
        if out is None:
            return None
        v = out["value"]
        return {**out, "ci_low": v - factor * (v - out["ci_low"]), "ci_high": v + factor * (out["ci_high"] - v)}

    mp.setattr(moments, "mean_cell_accuracy_columns", shrunk_columns)


def _shrink_variance_box(mp, factor):
    """variance, stddev: the three noises' half-widths entering the box."""
    real = moments.variance_box_columns

    def shrunk(c, h_c, s, h_s, q, h_q, w, e):
        return real(c, int(h_c * factor), s, h_s * factor, q, h_q * factor, w, e)

    mp.setattr(moments, "variance_box_columns", shrunk)


def _shrink_edge_thresholds(mp, factor):
    real = quantile.edge_thresholds
    mp.setattr(quantile, "edge_thresholds", lambda *a: tuple(h * factor for h in real(*a)))


# kind -> (what to shrink, factor): the factor is the largest of 0.5, 0.25, 0.1 that makes the
# fast run fail (the proven bounds are conservative, so they need a deeper cut to under-cover)
SHRINK = {
    "distinct_units": (_shrink_noise_halfwidth, 0.5),
    "count": (_shrink_noise_halfwidth, 0.5),
    "sum_shared_count": (_shrink_shared_sum, 0.5),
    "sum_alone": (_shrink_noise_halfwidth, 0.5),
    "mean": (_shrink_mean, 0.5),
    "variance": (_shrink_variance_box, 0.25),
    "stddev": (_shrink_variance_box, 0.25),
    "quantile_q50": (_shrink_edge_thresholds, 0.1),
    "quantile_q90": (_shrink_edge_thresholds, 0.1),
}


def test_every_kind_has_a_shrunk_half_width():
    assert set(SHRINK) == set(coverage.KINDS)


@pytest.fixture(scope="module")
def honest():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DP_SPARK_TEST_MODE", "1")
        return {m: _run(m) for m in coverage.MEASURES}


@pytest.mark.parametrize("measure", coverage.MEASURES)
@pytest.mark.parametrize("kind", coverage.KINDS)
def test_the_coverage_check_fails_on_a_smaller_half_width(honest, monkeypatch, measure, kind):
    monkeypatch.setenv("DP_SPARK_TEST_MODE", "1")
    assert not _low(honest[measure], kind), "the unpatched run must pass"
    patch, factor = SHRINK[kind]
    patch(monkeypatch, factor)
    for cached in (moments.mean_error, moments.spread_error, moments.stddev_error, quantile.quantile_error):
        cached.cache_clear()
    bad = _low(_run(measure), kind)
    assert bad, f"{kind} ({measure}): half-widths x{factor} still pass the coverage check"


@pytest.mark.parametrize("measure", coverage.MEASURES)
def test_the_error_check_fails_on_misreported_errors(honest, monkeypatch, measure):
    """Every kind's error figures halved where the engine publishes them (``noise.cell``): the
    error check fails for every kind; doubled (the check's arithmetic): likewise."""
    monkeypatch.setenv("DP_SPARK_TEST_MODE", "1")
    real = noise.cell

    def halved(value, lo, hi, *, plan, sd, expected):
        return real(value, lo, hi, plan=plan, sd=sd / 2, expected=expected / 2)

    for module in (noise, moments, quantile):
        monkeypatch.setattr(module, "cell", halved)
    for cls in {type(k) for k in KINDS.values()}:  # the vectorised path: the columns it publishes
        real_columns = cls.finish_columns

        def halved_columns(self, *args, _real=real_columns):
            out = _real(self, *args)
            if out is None:
                return None
            return {**out, "noise_stddev": out["noise_stddev"] / 2, "expected_abs_error": out["expected_abs_error"] / 2}

        monkeypatch.setattr(cls, "finish_columns", halved_columns)
    entries = _run(measure, 200)  # a cell where every kind's figures are held to 25%
    for kind in coverage.KINDS:
        mine = [e for e in entries if e.kind == kind]
        assert any("measured" in line for line in coverage.check(mine)), kind
        doubled = [dataclasses.replace(e, reported_abs=2 * e.measured_abs, reported_rms=2 * e.measured_rms)
                   for e in mine]
        assert any("measured" in line for line in coverage.check(doubled)), kind
