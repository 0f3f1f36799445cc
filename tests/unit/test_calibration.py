"""Unit tests of dp_spark.mechanisms.calibration."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from scipy import optimize, stats

from dp_spark.errors import ConfigError, InvalidBoundsError, InvalidBudgetError
from dp_spark.mechanisms import accuracy
from dp_spark.mechanisms import calibration as cal

NAN, INF = math.nan, math.inf
BAD_POSITIVE = [0, -1, -0.5, 0.0, Fraction(-1, 3), NAN, INF, -INF, True, "x", None]
BAD_DELTA = [0, 0.0, 1, 1.0, 1.5, -1e-9, NAN, INF, True, "x"]


# --- Laplace ------------------------------------------------------------------------------
def test_laplace_scale_exact():
    assert cal.laplace_scale(Fraction(1, 10), 1) == 10
    assert cal.laplace_scale(0.1, 1) == 10  # floats read through their shortest repr
    assert cal.laplace_scale(Fraction(1, 3), 104857600) == 314572800
    assert cal.laplace_scale("0.3", 2) == Fraction(20, 3)
    assert isinstance(cal.laplace_scale(1, 1), Fraction)


def test_epsilon_for_laplace_inverts():
    for eps, l1 in [(Fraction(1, 10), 1), (Fraction(7, 3), 5), (Fraction(2), Fraction(1, 2))]:
        assert cal.epsilon_for_laplace(cal.laplace_scale(eps, l1), l1) == eps


# --- Gaussian / zCDP ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "rho,l2sq",
    [(Fraction(1, 2), 1), (Fraction(1, 10), 1), (Fraction(1, 3), 7), (Fraction(1, 1000), 2**40), (5, 3)],
)
def test_gaussian_sigma_zcdp_rounded_up_and_tight(rho, l2sq):
    sigma = cal.gaussian_sigma_zcdp(rho, l2sq)
    target = Fraction(l2sq) / (2 * Fraction(rho))
    assert isinstance(sigma, Fraction)
    assert sigma * sigma >= target  # rounded up: never less noise
    assert float(sigma) <= math.sqrt(target) * (1 + 1e-13)
    assert cal.rho_for_gaussian(sigma, l2sq) <= Fraction(rho)  # the claim holds


def test_gaussian_sigma_zcdp_exact_when_possible():
    assert cal.gaussian_sigma_zcdp(Fraction(1, 2), 1) == 1
    assert cal.gaussian_sigma_zcdp(Fraction(1, 8), 1) == 2
    assert cal.gaussian_sigma_zcdp(Fraction(1, 2), 4**20) == 2**20


def test_rho_for_gaussian_exact():
    assert cal.rho_for_gaussian(Fraction(3), 2) == Fraction(1, 9)
    assert cal.rho_for_gaussian(2, 4) == Fraction(1, 2)


# --- analytic Gaussian --------------------------------------------------------------------
# Balle & Wang (ICML 2018), analytic Gaussian mechanism: sigma for l2 = 1. The paper reports
# sigma ~ 3.73 at (1, 1e-5) against 4.84 for the classic formula; the others are the same
# equation solved by an independent root finder in this test (scipy.stats + brentq).
PUBLISHED = [((1.0, 1e-5), 3.73)]


def _independent_sigma(eps: float, delta: float) -> float:
    def f(s):
        return stats.norm.cdf(1 / (2 * s) - eps * s) - math.exp(eps) * stats.norm.cdf(-1 / (2 * s) - eps * s) - delta

    return optimize.brentq(f, 1e-4, 1e5, xtol=1e-15, rtol=1e-15)


@pytest.mark.parametrize("params,value", PUBLISHED)
def test_analytic_gaussian_published_value(params, value):
    sigma = float(cal.gaussian_sigma_analytic(*params, 1))
    assert round(sigma, 2) == value
    assert cal.classic_gaussian_sigma(*params, 1) == pytest.approx(4.84, abs=0.005)


@pytest.mark.parametrize(
    "eps,delta", [(0.1, 1e-5), (0.5, 1e-6), (1.0, 1e-5), (2.0, 1e-8), (5.0, 1e-5), (10.0, 1e-5), (20.0, 1e-3), (1.0, 0.3)]
)
def test_analytic_gaussian_matches_independent_solver_and_is_tight(eps, delta):
    sigma = cal.gaussian_sigma_analytic(eps, delta, 1)
    assert float(sigma) == pytest.approx(_independent_sigma(eps, delta), rel=1e-8)
    assert cal.analytic_gaussian_delta(float(sigma), eps) <= delta  # valid
    assert cal.analytic_gaussian_delta(float(sigma) * (1 - 1e-6), eps) > delta  # tight
    # scales linearly in the sensitivity
    assert float(cal.gaussian_sigma_analytic(eps, delta, 3)) == pytest.approx(3 * float(sigma), rel=1e-12)


def test_classic_formula_under_noises_for_large_epsilon():
    """RELIABILITY 6: sqrt(2 ln(1.25/delta))/eps is invalid for eps >= 1 -- it can give LESS
    noise than the exact requirement, i.e. a mechanism that is not (eps, delta)-DP."""
    eps, delta = 10.0, 1e-5
    classic = cal.classic_gaussian_sigma(eps, delta, 1)
    analytic = float(cal.gaussian_sigma_analytic(eps, delta, 1))
    assert classic < analytic
    assert cal.analytic_gaussian_delta(classic, eps) > delta  # the classic sigma violates delta
    # ... whereas below 1 it is (very) conservative
    assert cal.classic_gaussian_sigma(0.5, 1e-5, 1) > float(cal.gaussian_sigma_analytic(0.5, 1e-5, 1))


# --- zCDP -> approximate DP (OpenDP) ------------------------------------------------------
@pytest.mark.parametrize("rho", [1e-4, 0.01, 0.125, 0.5, 1.0, 5.0])
@pytest.mark.parametrize("delta", [1e-10, 1e-6, 1e-3, 0.1])
def test_zcdp_to_approx_below_bun_steinke(rho, delta):
    eps = cal.zcdp_to_approx_epsilon(rho, delta)
    bound = rho + 2 * math.sqrt(rho * math.log(1 / delta))
    assert 0 <= eps <= bound  # 0 is possible: tiny rho and a large delta
    # monotone: more rho, more epsilon; more delta, less epsilon
    assert cal.zcdp_to_approx_epsilon(rho * 1.1, delta) >= eps
    assert cal.zcdp_to_approx_epsilon(rho, delta / 10) >= eps


def test_zcdp_to_approx_reference_value():
    # CKS20 / OpenDP conversion at rho = 1/8, delta = 1e-6 (Bun-Steinke would give 2.753)
    assert cal.zcdp_to_approx_epsilon(Fraction(1, 8), 1e-6) == pytest.approx(2.4191, abs=1e-3)


@pytest.mark.parametrize("eps,delta", [(0.1, 1e-6), (1.0, 1e-6), (1.0, 1e-9), (3.0, 1e-5), (10.0, 1e-3)])
def test_approx_to_zcdp_rho_is_largest(eps, delta):
    rho = cal.approx_to_zcdp_rho(eps, delta)
    assert isinstance(rho, Fraction) and rho > 0
    assert cal.zcdp_to_approx_epsilon(rho, delta) <= eps
    assert cal.zcdp_to_approx_epsilon(rho * Fraction(10001, 10000), delta) > eps
    # better than the Bun-Steinke inversion
    l = math.log(1 / delta)
    assert float(rho) >= (math.sqrt(l + eps) - math.sqrt(l)) ** 2


# --- inverses for the epsilon explorer ----------------------------------------------------
@pytest.mark.parametrize(
    "target,conf,l1,k",
    [(10, 0.95, 1, 0), (1, 0.9, 1, 0), (0.5, 0.95, 1, 0), (100, 0.99, 1, 0), (3.5, 0.95, 2, -20), (1000, 0.95, 250, -12)],
)
def test_min_epsilon_for_error(target, conf, l1, k):
    eps = cal.min_epsilon_for_error(target, conf, l1, grid_exponent=k)
    assert isinstance(eps, Fraction)
    l1_grid = Fraction(l1) * Fraction(2) ** (-k)
    h = math.floor(Fraction(target) * Fraction(2) ** (-k))

    def coverage(e):
        return 1 - accuracy.discrete_laplace_tail(cal.laplace_scale(e, l1_grid), h)

    assert coverage(eps) >= conf  # meets the target
    assert coverage(eps * Fraction(99, 100)) < conf  # 0.99x does not


@pytest.mark.parametrize(
    "target,conf,l2sq,k",
    [(10, 0.95, 1, 0), (2, 0.9, 1, 0), (100, 0.99, 4, 0), (3.5, 0.95, 2, -20), (1000, 0.95, 250**2, -12)],
)
def test_min_rho_for_error(target, conf, l2sq, k):
    rho = cal.min_rho_for_error(target, conf, l2sq, grid_exponent=k)
    assert isinstance(rho, Fraction)
    l2sq_grid = Fraction(l2sq) * Fraction(4) ** (-k)
    h = math.floor(Fraction(target) * Fraction(2) ** (-k))

    def coverage(r):
        return 1 - accuracy.discrete_gaussian_tail(cal.gaussian_sigma_zcdp(r, l2sq_grid), h)

    assert coverage(rho) >= conf
    assert coverage(rho * Fraction(99, 100)) < conf


def test_min_epsilon_for_error_sub_grid_target():
    # target below one grid step: the noise must be exactly 0 with probability >= confidence
    eps = cal.min_epsilon_for_error(0.5, 0.5, 1)
    t = cal.laplace_scale(eps, 1)
    a = math.exp(-1 / float(t))
    assert (1 - a) / (1 + a) >= 0.5 - 1e-12


# --- bad inputs: InvalidBudgetError, before anything else ---------------------------------
@pytest.mark.parametrize("bad", BAD_POSITIVE)
def test_bad_epsilon(bad):
    for call in (
        lambda: cal.laplace_scale(bad, "not a sensitivity"),
        lambda: cal.gaussian_sigma_analytic(bad, 1e-5, "not a sensitivity"),
        lambda: cal.approx_to_zcdp_rho(bad, 1e-6),
        lambda: cal.classic_gaussian_sigma(bad, 1e-5, 1),
    ):
        with pytest.raises(InvalidBudgetError):  # not InvalidBoundsError: budget checked first
            call()


@pytest.mark.parametrize("bad", BAD_POSITIVE)
def test_bad_rho(bad):
    with pytest.raises(InvalidBudgetError):
        cal.gaussian_sigma_zcdp(bad, "not a sensitivity")
    with pytest.raises(InvalidBudgetError):
        cal.zcdp_to_approx_epsilon(bad, 1e-6)


@pytest.mark.parametrize("bad", BAD_DELTA)
def test_bad_delta(bad):
    with pytest.raises(InvalidBudgetError):
        cal.gaussian_sigma_analytic(1.0, bad, "not a sensitivity")
    with pytest.raises(InvalidBudgetError):
        cal.zcdp_to_approx_epsilon(0.5, bad)
    with pytest.raises(InvalidBudgetError):
        cal.approx_to_zcdp_rho(1.0, bad)


@pytest.mark.parametrize("bad", BAD_POSITIVE)
def test_bad_scale_or_sigma(bad):
    with pytest.raises(InvalidBudgetError):
        cal.epsilon_for_laplace(bad, 1)
    with pytest.raises(InvalidBudgetError):
        cal.rho_for_gaussian(bad, 1)


@pytest.mark.parametrize("bad", [0, -1, NAN, INF, True, "x", None])
def test_bad_sensitivity(bad):
    with pytest.raises(InvalidBoundsError):
        cal.laplace_scale(1, bad)
    with pytest.raises(InvalidBoundsError):
        cal.gaussian_sigma_zcdp(1, bad)
    with pytest.raises(InvalidBoundsError):
        cal.gaussian_sigma_analytic(1, 1e-5, bad)


def test_bad_explorer_inputs():
    with pytest.raises(InvalidBoundsError):
        cal.min_epsilon_for_error(0, 0.95, 1)
    with pytest.raises(InvalidBoundsError):
        cal.min_epsilon_for_error(1, 0.95, -1)
    for conf in (0, 1, 1.5, NAN, True):
        with pytest.raises(ConfigError):
            cal.min_epsilon_for_error(1, conf, 1)
        with pytest.raises(ConfigError):
            cal.min_rho_for_error(1, conf, 1)
    with pytest.raises(ConfigError):
        cal.min_epsilon_for_error(1, 0.9, 1, grid_exponent=3)


def test_error_messages_carry_no_values():
    with pytest.raises(InvalidBudgetError) as info:
        cal.laplace_scale(-0.123456, 1)
    assert "0.123456" not in str(info.value)
