"""Sampler distributions (RELIABILITY "Statistical tests (recipe)", first line).

A contract suite run over BOTH sources: OpenDPNoiseSource (production) and SeededNoiseSource
(pure-Python CKS20 on SHAKE-256). Each draws 100,000 values per case (the pure-Python source
is fast enough, ~5 us per draw, to use the full count).

* chi-squared against the exact pmf, tail bins merged (every bin expects >= 20 draws):
  pass at p > 1e-20; the SAME test on draws whose scale is off by 30% (x1.3 and x0.7) must
  give p < 1e-20;
* mean ~ 0 (|mean| <= 6 sd / sqrt(n)) and symmetry (chi-squared of counts at +k vs -k),
  each with a failing variant (draws shifted by +1);
* scales beyond the i64 range of OpenDP's integers: the exact tail redraw (Laplace) and the
  pure-Python path (Gaussian, sigma > 2^56) follow the right law (KS, 5,000 / 12,000 draws).

The reference pmf is computed here independently of dp_spark.mechanisms.accuracy.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dp_spark.mechanisms import OpenDPNoiseSource, SeededNoiseSource

pytestmark = pytest.mark.slow

N = 100_000
P_PASS = 1e-20
MIN_EXPECTED = 20.0

CASES = [
    ("discrete_laplace", Fraction(3)),
    ("discrete_laplace", Fraction(10, 3)),  # a scale that is not a double
    ("discrete_laplace", Fraction(1, 2)),
    ("discrete_gaussian", Fraction(2)),
    ("discrete_gaussian", Fraction(15, 2)),
    ("discrete_gaussian", Fraction(7, 10)),
]


@pytest.fixture(params=["opendp", "opendp_sliced", "seeded"], scope="module")
def source(request):
    if request.param == "opendp":
        return OpenDPNoiseSource(threads=1)
    if request.param == "opendp_sliced":  # N draws in 4 slices drawn on 4 threads at once
        return OpenDPNoiseSource(threads=4)
    mp = pytest.MonkeyPatch()
    mp.setenv("DP_SPARK_TEST_MODE", "1")
    try:
        return SeededNoiseSource(31337)
    finally:
        mp.undo()


def exact_pmf(kind: str, scale: float, support: np.ndarray) -> np.ndarray:
    """P(X = x) on ``support``, normalised over a range wide enough for double precision."""
    span = int(60 * scale) + 60
    x = np.arange(-span, span + 1, dtype=np.float64)
    if kind == "discrete_laplace":
        def logw(v):
            return -np.abs(v) / scale
    else:
        def logw(v):
            return -(v * v) / (2.0 * scale * scale)
    z = math.fsum(np.exp(logw(x)))
    return np.exp(logw(support.astype(np.float64))) / z


def chi2_pvalue(draws: np.ndarray, kind: str, scale: float) -> float:
    """Chi-squared goodness of fit of integer draws to the exact pmf; tails merged so that
    every bin expects at least MIN_EXPECTED draws."""
    n = draws.size
    m = 0
    while True:  # central bins [-m, m] individually; expected counts decrease with |x|
        if n * exact_pmf(kind, scale, np.array([m + 1]))[0] < MIN_EXPECTED:
            break
        m += 1
    centre = np.arange(-m, m + 1)
    p_centre = exact_pmf(kind, scale, centre)
    p_tail = max(0.0, (1.0 - math.fsum(p_centre)) / 2.0)
    expected = [n * p_tail] + list(n * p_centre) + [n * p_tail]
    inside = draws[(draws >= -m) & (draws <= m)] + m
    counts = np.bincount(inside, minlength=2 * m + 1)
    observed = [np.sum(draws < -m)] + list(counts) + [np.sum(draws > m)]
    observed, expected = np.array(observed, float), np.array(expected, float)
    if expected[0] < MIN_EXPECTED:  # merge the tails into their neighbours
        observed = np.concatenate([[observed[0] + observed[1]], observed[2:-2], [observed[-2] + observed[-1]]])
        expected = np.concatenate([[expected[0] + expected[1]], expected[2:-2], [expected[-2] + expected[-1]]])
    if observed.size < 2:
        return 1.0
    stat = float(np.sum((observed - expected) ** 2 / expected))
    return float(stats.chi2.sf(stat, observed.size - 1))


def symmetry_pvalue(draws: np.ndarray) -> float:
    """Counts at +k against -k (k >= 1 with >= 20 draws in the pair), chi-squared."""
    stat, dof = 0.0, 0
    for k in range(1, int(np.abs(draws).max()) + 1):
        a, b = np.sum(draws == k), np.sum(draws == -k)
        if a + b < MIN_EXPECTED:
            break
        stat += (a - b) ** 2 / (a + b)
        dof += 1
    a, b = np.sum(draws > 0), np.sum(draws < 0)
    stat += (a - b) ** 2 / max(a + b, 1)
    dof += 1
    return float(stats.chi2.sf(stat, dof))


def mean_ok(draws: np.ndarray, sd: float) -> bool:
    return abs(float(draws.mean())) <= 6.0 * sd / math.sqrt(draws.size)


def _draw(source, kind, scale, n=N) -> np.ndarray:
    return np.array(source.draw(kind, scale, n), dtype=np.int64)


@pytest.mark.parametrize("kind,scale", CASES)
def test_chi_squared_exact_pmf(source, kind, scale):
    draws = _draw(source, kind, scale)
    assert chi2_pvalue(draws, kind, float(scale)) > P_PASS
    # the same draws against a pmf whose scale is off by 30% must be rejected
    assert chi2_pvalue(draws, kind, 1.3 * float(scale)) < P_PASS
    assert chi2_pvalue(draws, kind, float(scale) / 1.3) < P_PASS


@pytest.mark.parametrize(
    "kind,scale,factor",
    [
        (*CASES[0], Fraction(13, 10)),
        (*CASES[1], Fraction(7, 10)),
        (*CASES[3], Fraction(13, 10)),
        (*CASES[4], Fraction(7, 10)),
    ],
)
def test_chi_squared_rejects_draws_with_wrong_scale(source, kind, scale, factor):
    """Draws made at 1.3x or 0.7x the scale, tested against the nominal pmf: p < 1e-20."""
    off = _draw(source, kind, scale * factor)
    assert chi2_pvalue(off, kind, float(scale)) < P_PASS


@pytest.mark.parametrize("kind,scale", [CASES[0], CASES[3]])
def test_mean_zero_and_symmetry(source, kind, scale):
    draws = _draw(source, kind, scale)
    x = np.arange(-2000, 2001)
    sd = math.sqrt(float(np.sum(exact_pmf(kind, float(scale), x) * x * x)))
    assert mean_ok(draws, sd)
    assert symmetry_pvalue(draws) > P_PASS
    shifted = draws + 1  # the failing variant
    assert not mean_ok(shifted, sd)
    assert symmetry_pvalue(shifted) < P_PASS


# --- scales beyond i64 (OpenDP's integer type) --------------------------------------------
N_HUGE = 5_000
N_HUGE_GAUSS = 12_000  # KS against N(0, 1.3^2) needs this many for p < 1e-20 with margin


@pytest.mark.parametrize("scale", [Fraction(2**63), Fraction(2**66)])
def test_opendp_laplace_beyond_i64_law(scale):
    """At scale 2^63 about 37% of OpenDP's raw draws saturate (2^66: 88%) and are redrawn
    from the exact conditional tail; |X| / t must still be Exp(1) (exact up to O(1/t))."""
    src = OpenDPNoiseSource()
    draws = src.discrete_laplace(scale, N_HUGE)
    t = float(scale)
    mags = np.array([abs(x) / t for x in draws])
    assert stats.kstest(mags, "expon").pvalue > P_PASS
    assert stats.kstest(mags, "expon", args=(0, 1.3)).pvalue < P_PASS  # can fail
    pos = sum(x > 0 for x in draws)
    assert stats.binomtest(pos, N_HUGE, 0.5).pvalue > 1e-9
    assert sum(abs(x) > 2**63 for x in draws) > 0


def test_opendp_gaussian_huge_sigma_law():
    """sigma = 2^60 > 2^56: drawn by the exact pure-Python CKS20 sampler on the OS CSPRNG."""
    src = OpenDPNoiseSource()
    sigma = Fraction(2**60)
    draws = src.discrete_gaussian(sigma, N_HUGE_GAUSS)
    z = np.array([x / float(sigma) for x in draws])
    assert stats.kstest(z, "norm").pvalue > P_PASS
    assert stats.kstest(z, "norm", args=(0, 1.3)).pvalue < P_PASS
