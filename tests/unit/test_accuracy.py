"""Tests of dp_spark.mechanisms.accuracy (exact formulas; empirical coverage is @slow)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from dp_spark.errors import ConfigError, InvalidBudgetError
from dp_spark.mechanisms import OpenDPNoiseSource, SeededNoiseSource
from dp_spark.mechanisms import accuracy as acc


# --- independent brute-force references ---------------------------------------------------
def _brute_pmf(kind: str, scale: float, span: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.arange(-span, span + 1, dtype=np.float64)
    if kind == "discrete_laplace":
        logw = -np.abs(x) / scale
    else:
        logw = -(x * x) / (2 * scale * scale)
    w = np.exp(logw - logw.max())
    return x, w / math.fsum(w)


def _brute_tail(kind, scale, h, span):
    x, p = _brute_pmf(kind, scale, span)
    return math.fsum(p[np.abs(x) > h])


# --- discrete Laplace ---------------------------------------------------------------------
@pytest.mark.parametrize("t", [0.3, 1.0, 2.5, 10.0, 77.7])
def test_dl_stddev_exact(t):
    x, p = _brute_pmf("discrete_laplace", t, int(80 * t) + 50)
    assert acc.discrete_laplace_stddev(t) == pytest.approx(math.sqrt(math.fsum(p * x * x)), rel=1e-12)


def test_dl_stddev_large_scale_is_sqrt2_t():
    assert acc.discrete_laplace_stddev(1e9) == pytest.approx(math.sqrt(2) * 1e9, rel=1e-12)


@pytest.mark.parametrize("t", [0.3, 1.0, 2.5, 10.0, 77.7])
@pytest.mark.parametrize("alpha", [0.5, 0.1, 0.05, 0.01, 1e-6])
def test_dl_halfwidth_exact(t, alpha):
    h = acc.discrete_laplace_halfwidth(t, alpha)
    span = int(80 * t) + 50
    assert _brute_tail("discrete_laplace", t, h, span) <= alpha * (1 + 1e-9)
    if h > 0:
        assert _brute_tail("discrete_laplace", t, h - 1, span) > alpha * (1 - 1e-9)


def test_dl_tail_formula():
    t = 3.0
    for h in (0, 1, 5, 20):
        assert acc.discrete_laplace_tail(t, h) == pytest.approx(
            _brute_tail("discrete_laplace", t, h, 400), rel=1e-10
        )


def test_dl_halfwidth_large_scale():
    t = 1e12
    h = acc.discrete_laplace_halfwidth(t, 0.05)
    # continuous limit: t ln(1/alpha)
    assert h == pytest.approx(t * math.log(1 / 0.05), rel=1e-9)


# --- discrete Gaussian --------------------------------------------------------------------
@pytest.mark.parametrize("s", [0.2, 0.5, 1.0, 2.0, 7.5, 63.0, 100.0])
def test_dg_stddev_exact(s):
    x, p = _brute_pmf("discrete_gaussian", s, int(40 * s) + 10)
    assert acc.discrete_gaussian_stddev(s) == pytest.approx(math.sqrt(math.fsum(p * x * x)), rel=1e-12)


def test_dg_stddev_below_sigma_for_small_sigma():
    assert acc.discrete_gaussian_stddev(0.5) < 0.5
    assert acc.discrete_gaussian_stddev(1.0) < 1.0
    assert acc.discrete_gaussian_stddev(1e6) == pytest.approx(1e6, rel=1e-15)


@pytest.mark.parametrize("s", [0.2, 0.5, 1.0, 2.0, 7.5, 63.0, 300.0])
@pytest.mark.parametrize("alpha", [0.5, 0.1, 0.05, 0.01, 1e-6])
def test_dg_halfwidth_exact(s, alpha):
    h = acc.discrete_gaussian_halfwidth(s, alpha)
    span = int(40 * s) + 10
    assert _brute_tail("discrete_gaussian", s, h, span) <= alpha * (1 + 1e-9)
    if h > 0:
        assert _brute_tail("discrete_gaussian", s, h - 1, span) > alpha * (1 - 1e-9)


@pytest.mark.parametrize("s", [4000.0, 4096.0])
def test_dg_large_sigma_tail_matches_direct(s):
    direct = acc._get_direct(s)
    for h in (0, int(s), int(2 * s), int(4 * s)):
        assert acc._dg_tail_large(s, h) == pytest.approx(direct.tail(h), rel=1e-10)


def test_dg_large_sigma_halfwidth():
    s = 1e8
    h = acc.discrete_gaussian_halfwidth(s, 0.05)
    assert acc.discrete_gaussian_tail(s, h) <= 0.05 < acc.discrete_gaussian_tail(s, h - 1)
    assert h == pytest.approx(1.959963984540054 * s, rel=1e-8)


# --- dispatch and errors ------------------------------------------------------------------
def test_dispatch():
    assert acc.noise_stddev("discrete_laplace", 3) == acc.discrete_laplace_stddev(3)
    assert acc.noise_stddev("discrete_gaussian", Fraction(3)) == acc.discrete_gaussian_stddev(3)
    assert acc.noise_halfwidth("discrete_laplace", 3, 0.05) == acc.discrete_laplace_halfwidth(3, 0.05)
    assert acc.noise_halfwidth("discrete_gaussian", 3, 0.05) == acc.discrete_gaussian_halfwidth(3, 0.05)
    assert acc.noise_tail("discrete_gaussian", 3, 4) == acc.discrete_gaussian_tail(3, 4)
    with pytest.raises(ConfigError):
        acc.noise_stddev("laplace", 3)
    with pytest.raises(ConfigError):
        acc.noise_halfwidth("gaussian", 3, 0.05)


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, True])
def test_bad_scale(bad):
    with pytest.raises(InvalidBudgetError):
        acc.discrete_laplace_stddev(bad)
    with pytest.raises(InvalidBudgetError):
        acc.discrete_gaussian_halfwidth(bad, 0.05)


@pytest.mark.parametrize("bad", [0, 1, -0.1, 1.5, math.nan, True, "x"])
def test_bad_alpha(bad):
    with pytest.raises(ConfigError):
        acc.discrete_laplace_halfwidth(2, bad)
    with pytest.raises(ConfigError):
        acc.discrete_gaussian_halfwidth(2, bad)


# --- empirical coverage and stddev (100,000 draws; slow) ----------------------------------
N = 100_000


@pytest.fixture(params=["opendp", "seeded"])
def source(request, monkeypatch):
    if request.param == "opendp":
        return OpenDPNoiseSource()
    monkeypatch.setenv("DP_SPARK_TEST_MODE", "1")
    return SeededNoiseSource(77)


# (kind, scale, h0): alpha is put in the middle of the coverage step between h0 - 1 and h0,
# computed from the brute-force pmf, so halfwidth(alpha) must be exactly h0 and the empirical
# coverage at h0 / h0 - 1 must fall on either side of 1 - alpha by >= 8 standard errors.
COVERAGE_CASES = [
    ("discrete_laplace", 0.7, 2),
    ("discrete_laplace", 2.0, 5),
    ("discrete_laplace", 5.0, 12),
    ("discrete_gaussian", 0.8, 1),
    ("discrete_gaussian", 2.0, 4),
    ("discrete_gaussian", 4.0, 8),
]


@pytest.mark.slow
@pytest.mark.parametrize("kind,scale,h0", COVERAGE_CASES)
def test_halfwidth_empirical_coverage(source, kind, scale, h0):
    span = int(80 * scale) + 50
    t_h = _brute_tail(kind, scale, h0, span)
    t_hm1 = _brute_tail(kind, scale, h0 - 1, span)
    alpha = 0.5 * (t_h + t_hm1)
    se = math.sqrt(alpha * (1 - alpha) / N)
    assert (t_hm1 - t_h) / 2 >= 8 * se, "case too weak to test with this many draws"

    h = acc.noise_halfwidth(kind, Fraction(scale), alpha)
    assert h == h0
    draws = np.abs(np.array(source.draw(kind, Fraction(scale), N)))
    assert np.mean(draws <= h) >= 1 - alpha  # covers
    assert np.mean(draws <= h - 1) < 1 - alpha  # h - 1 does not


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["discrete_laplace", "discrete_gaussian"])
@pytest.mark.parametrize("scale", [0.6, 25.0])
def test_stddev_vs_empirical(source, kind, scale):
    draws = np.array(source.draw(kind, Fraction(scale), N), dtype=np.float64)
    sd = acc.noise_stddev(kind, Fraction(scale))
    emp = draws.std()
    # sd of the sample variance ~ sqrt((m4 - s^4) / N); 6 of them (kurtosis <= 6 for both)
    rel_tol = 6 * math.sqrt((6 + 2) / N) / 2
    assert emp == pytest.approx(sd, rel=rel_tol)
    assert emp != pytest.approx(1.3 * sd, rel=rel_tol)  # the check can fail
