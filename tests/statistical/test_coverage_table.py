"""The coverage table (docs/accuracy.md, ``benchmarks/coverage.py``): every statistic kind x
{pure DP, zCDP} x cell sizes {10, 20, 50, 200, 1000} x levels {0.5, 0.8, 0.9, 0.95, 0.99}, 1,000
seeded releases of each cell through the engine's own noise and post-processing
(:mod:`dp_spark.evaluation.coverage`; no Spark).

Checks (:func:`dp_spark.evaluation.coverage.check`): coverage at least nominal - 2 se; at most
the upper band (exact-law intervals: nominal + the lattice's atom + 3 se; proven bounds: no
limit); reported errors within 25% of the measured ones (40% where the noise dominates,
:data:`dp_spark.evaluation.coverage.NOISE_DOMINATED`). Each check is shown able to fail: the
same releases with every half-width x0.7 (x0.25 for the proven bounds) fail the coverage check
for every kind and measure, error figures x0.7 or x1.4 fail the error check, a sum's interval
twice too wide fails the upper band; the fast
tests/statistical/test_coverage_checks_can_fail.py monkeypatches each kind's half-width
smaller in the engine's own code and sees the coverage check fail.
"""

from __future__ import annotations

import pytest

from dp_spark.evaluation import coverage

pytestmark = pytest.mark.slow

CASES = [(m, k) for m in coverage.MEASURES for k in coverage.KINDS]


@pytest.fixture(scope="module")
def entries():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DP_SPARK_TEST_MODE", "1")
        return {m: coverage.simulate(m) for m in coverage.MEASURES}


def _of(entries, measure, kind):
    return [e for e in entries[measure] if e.kind == kind]


@pytest.mark.parametrize("measure,kind", CASES)
def test_coverage_within_its_band(entries, measure, kind):
    mine = _of(entries, measure, kind)
    assert [e.size for e in mine] == list(coverage.SIZES)
    bad = [line for line in coverage.check(mine) if "coverage" in line]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("measure,kind", CASES)
def test_reported_errors_within_25_percent(entries, measure, kind):
    bad = [line for line in coverage.check(_of(entries, measure, kind)) if "coverage" not in line]
    assert not bad, "\n".join(bad)


#: the shrink that must fail: x0.7 where the interval sits near its level (the exact laws, the
#: mean), x0.25 for the proven bounds (conservative: the variance's box covers 0.95 at 0.5)
SHRINK = {"variance": 0.25, "stddev": 0.25, "quantile_q50": 0.25, "quantile_q90": 0.25}


@pytest.mark.parametrize("measure,kind", CASES)
def test_the_coverage_check_fails_on_shrunk_half_widths(entries, measure, kind):
    """Half-widths shrunk (the same releases): some entry falls below nominal - 2 se."""
    factor = SHRINK.get(kind, 0.7)
    bad = [line for line in coverage.check(coverage.shrunk(_of(entries, measure, kind), factor))
           if "< " in line and "coverage" in line]
    assert bad, f"{kind} ({measure}): no entry fails with half-widths x{factor}"


@pytest.mark.parametrize("measure,kind", CASES)
def test_the_error_check_fails_on_misreported_errors(entries, measure, kind):
    import dataclasses

    for factor in (0.7, 1.4):
        off = [dataclasses.replace(e, reported_abs=e.reported_abs * factor, reported_rms=e.reported_rms * factor)
               for e in _of(entries, measure, kind)]
        assert any("measured" in line for line in coverage.check(off)), (kind, measure, factor)


def test_upper_band_catches_over_coverage(entries):
    """An exact-law interval twice too wide covers far above its band: the check says so (the
    sum's noise, whose lattice excess is small; a count's small-sigma lattice can hide it)."""
    sums = _of(entries, "zcdp", "sum_alone")
    assert any("upper band" in line for line in coverage.check(coverage.shrunk(sums, 2.0)))
