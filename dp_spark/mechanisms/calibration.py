"""Noise calibration, exact or rounded in the privacy-safe direction.

* Scales and sigmas are rounded UP; budgets returned by inverse functions are rounded in
  the direction that keeps the claim true (rho DOWN for a target epsilon; epsilon/rho UP
  for a target accuracy, so the accuracy is met).
* Every function validates its budget arguments first (InvalidBudgetError: epsilon or rho
  <= 0, NaN, inf; delta outside (0, 1)), then sensitivities (InvalidBoundsError), then
  anything else (ConfigError). Messages never carry data values.
* Sensitivities are in whatever units the noise is drawn in (grid units for the engine);
  ``l2_squared`` is the squared L2 sensitivity (an integer in grid units for integer sums).

References: Laplace/discrete Laplace: Dwork et al. 2006, Ghosh et al. 2012, CKS20; discrete
Gaussian under zCDP: Canonne, Kamath, Steinke 2020, Theorem 4 (the discrete Gaussian with
sigma satisfies (Delta^2 / (2 sigma^2))-zCDP, the same as the continuous one); analytic
Gaussian: Balle & Wang 2018, Theorem 8; zCDP -> (epsilon, delta): OpenDP 0.16
``make_zCDP_to_approxDP`` (the zCDP conversion of Canonne, Kamath, Steinke 2020),
never a hand-typed formula.
"""

from __future__ import annotations

import functools
import math
import threading
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal, localcontext
from fractions import Fraction
from numbers import Rational
from typing import Any

from dp_spark.core.budget import to_fraction
from dp_spark.errors import ConfigError, InvalidBoundsError, InvalidBudgetError
from dp_spark.mechanisms import accuracy

__all__ = [
    "laplace_scale",
    "epsilon_for_laplace",
    "gaussian_sigma_zcdp",
    "rho_for_gaussian",
    "gaussian_sigma_analytic",
    "analytic_gaussian_delta",
    "classic_gaussian_sigma",
    "zcdp_to_approx_epsilon",
    "approx_to_zcdp_rho",
    "min_epsilon_for_error",
    "min_rho_for_error",
]

_SIG_DIGITS = 15


# --- validation ---------------------------------------------------------------------------
def _positive(value: Any, name: str) -> Fraction:
    frac = to_fraction(value, name)  # InvalidBudgetError for NaN, inf, bool, junk
    if frac <= 0:
        raise InvalidBudgetError(f"{name} must be > 0")
    return frac


def _delta(value: Any) -> Fraction:
    frac = to_fraction(value, "delta")
    if not (0 < frac < 1):
        raise InvalidBudgetError("delta must be in (0, 1)")
    return frac


def _sensitivity(value: Any, name: str) -> Fraction:
    if isinstance(value, bool):
        raise InvalidBoundsError(f"{name} must be a number")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidBoundsError(f"{name} must be finite")
        frac = Fraction(repr(value))
    elif isinstance(value, Fraction):
        frac = value
    elif isinstance(value, Rational):
        frac = Fraction(value)
    elif isinstance(value, str):
        try:
            frac = Fraction(value.strip())
        except (ValueError, ZeroDivisionError):
            raise InvalidBoundsError(f"{name} is not a number") from None
    else:
        raise InvalidBoundsError(f"{name} must be a number")
    if frac <= 0:
        raise InvalidBoundsError(f"{name} must be > 0")
    return frac


def _grid_exponent(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k > 0:
        raise ConfigError("grid_exponent must be an integer <= 0")
    return k


def _confidence(value: Any) -> float:
    if isinstance(value, bool):
        raise ConfigError("confidence must be a number in (0, 1)")
    try:
        c = float(value)
    except (TypeError, ValueError):
        raise ConfigError("confidence must be a number in (0, 1)") from None
    if not (0.0 < c < 1.0):
        raise ConfigError("confidence must be in (0, 1)")
    return c


# --- rounding helpers ---------------------------------------------------------------------
def _round_sig(x: Fraction, digits: int, rounding: str) -> Fraction:
    """x rounded to ``digits`` significant decimal digits, up (ROUND_CEILING) or down."""
    if x == 0:
        return x
    with localcontext() as ctx:
        ctx.prec = 200
        d = Decimal(x.numerator) / Decimal(x.denominator)
        exp = d.adjusted() - digits + 1
        q = d.quantize(Decimal(1).scaleb(exp), rounding=rounding)
    out = Fraction(q)
    # guard against the 200-digit division itself rounding
    if rounding == ROUND_CEILING and out < x:
        out += Fraction(10) ** exp
    if rounding == ROUND_FLOOR and out > x:
        out -= Fraction(10) ** exp
    return out


def _round_up(x: Fraction) -> Fraction:
    return _round_sig(x, _SIG_DIGITS, ROUND_CEILING)


def _round_down(x: Fraction) -> Fraction:
    return _round_sig(x, _SIG_DIGITS, ROUND_FLOOR)


def _sqrt_up(q: Fraction) -> Fraction:
    """A Fraction >= sqrt(q) with about 64 significant bits (exact when sqrt(q) is dyadic)."""
    if q == 0:
        return q
    b = (q.numerator.bit_length() - q.denominator.bit_length()) // 2
    p = max(0, 64 - b)
    scaled = -((-q.numerator * 4**p) // q.denominator)  # ceil(q * 4^p)
    r = math.isqrt(scaled)
    if r * r < scaled:
        r += 1
    return Fraction(r, 2**p)


# --- Laplace ------------------------------------------------------------------------------
def laplace_scale(epsilon: Any, l1: Any) -> Fraction:
    """Discrete Laplace scale l1 / epsilon (exact); the mechanism is epsilon-DP (pure)."""
    eps = _positive(epsilon, "epsilon")
    sens = _sensitivity(l1, "l1 sensitivity")
    return sens / eps


def epsilon_for_laplace(scale: Any, l1: Any) -> Fraction:
    """The pure epsilon of the discrete Laplace with this scale: l1 / scale (exact)."""
    t = _positive(scale, "scale")
    sens = _sensitivity(l1, "l1 sensitivity")
    return sens / t


# --- Gaussian under zCDP ------------------------------------------------------------------
def gaussian_sigma_zcdp(rho: Any, l2_squared: Any) -> Fraction:
    """sigma = sqrt(l2^2 / (2 rho)), rounded up; rho-zCDP for the discrete Gaussian (CKS20 Thm 4)."""
    r = _positive(rho, "rho")
    l2sq = _sensitivity(l2_squared, "squared l2 sensitivity")
    exact_up = _sqrt_up(l2sq / (2 * r))
    return _round_up(exact_up)


def rho_for_gaussian(sigma: Any, l2_squared: Any) -> Fraction:
    """rho = l2^2 / (2 sigma^2), exact."""
    s = _positive(sigma, "sigma")
    l2sq = _sensitivity(l2_squared, "squared l2 sensitivity")
    return l2sq / (2 * s * s)


# --- analytic Gaussian (continuous Gaussian, (epsilon, delta)) ----------------------------
def analytic_gaussian_delta(sigma: float, epsilon: float, l2: float = 1.0) -> float:
    """Exact delta of the (continuous) Gaussian mechanism at epsilon (Balle & Wang 2018, Thm 8):

    delta = Phi(l2/(2 sigma) - eps sigma/l2) - e^eps Phi(-l2/(2 sigma) - eps sigma/l2).
    """
    from scipy import special  # lazy (issue 15): imported at first use, not with the engine

    u = l2 / (2.0 * sigma)
    v = epsilon * sigma / l2
    first = float(special.ndtr(u - v))
    second = math.exp(epsilon + float(special.log_ndtr(-u - v)))
    return max(0.0, first - second)


def classic_gaussian_sigma(epsilon: Any, delta: Any, l2: Any) -> float:
    """The classic sqrt(2 ln(1.25/delta)) l2 / epsilon (Dwork & Roth, valid only for epsilon < 1).

    For comparison and documentation only: dp_spark never calibrates with it.
    """
    eps = float(_positive(epsilon, "epsilon"))
    d = float(_delta(delta))
    sens = float(_sensitivity(l2, "l2 sensitivity"))
    return math.sqrt(2.0 * math.log(1.25 / d)) * sens / eps


def gaussian_sigma_analytic(epsilon: Any, delta: Any, l2: Any) -> Fraction:
    """Smallest sigma of the continuous Gaussian mechanism that is (epsilon, delta)-DP.

    Balle & Wang (2018) analytic calibration: bisection on the exact delta(sigma) of
    :func:`analytic_gaussian_delta` (decreasing in sigma), to a relative width of 1e-13, then
    a relative margin of 1e-9 for floating-point error in delta(sigma), rounded up to 15
    significant digits. Valid for every epsilon > 0 (unlike the classic formula).
    For the discrete Gaussian use zCDP (:func:`gaussian_sigma_zcdp`).
    """
    eps_f = _positive(epsilon, "epsilon")
    d_f = _delta(delta)
    sens_f = _sensitivity(l2, "l2 sensitivity")
    eps, d = float(eps_f), float(d_f)
    if not math.isfinite(eps) or eps <= 0 or d <= 0:
        raise InvalidBudgetError("epsilon or delta is outside the supported range")

    def delta_of(s: float) -> float:  # s = sigma / l2
        return analytic_gaussian_delta(s, eps, 1.0)

    lo, hi = 1.0, 1.0
    while delta_of(hi) > d:
        hi *= 2.0
        if hi > 1e300:
            raise InvalidBudgetError("no sigma meets this (epsilon, delta)")
    while delta_of(lo) <= d:
        lo /= 2.0
        if lo < 1e-300:
            break
    for _ in range(2000):  # invariant: delta(lo) > d >= delta(hi)
        if hi - lo <= 1e-13 * hi:
            break
        mid = 0.5 * (lo + hi)
        if delta_of(mid) <= d:
            hi = mid
        else:
            lo = mid
    s = hi * (1.0 + 1e-9)
    assert delta_of(s) <= d
    return _round_up(Fraction(s) * sens_f)


# --- zCDP <-> (epsilon, delta), via OpenDP ------------------------------------------------
_OPENDP_LOCK = threading.Lock()
_OPENDP_CONV: Any = None


def _conversion_measurement() -> Any:
    """Gaussian(scale = 1) on floats, cast zCDP -> approx DP; its map(d_in) is the privacy
    profile of rho = d_in^2 / 2 (OpenDP rounds rho up)."""
    global _OPENDP_CONV
    with _OPENDP_LOCK:
        if _OPENDP_CONV is None:
            import opendp.prelude as dp

            dp.enable_features("contrib")
            gauss = dp.m.make_gaussian(
                dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float), scale=1.0
            )
            _OPENDP_CONV = dp.c.make_zCDP_to_approxDP(gauss)
        return _OPENDP_CONV


def _float_up(x: Fraction) -> float:
    f = float(x)
    if Fraction(f) < x:
        f = math.nextafter(f, math.inf)
    return f


def _float_down(x: Fraction) -> float:
    f = float(x)
    if Fraction(f) > x:
        f = math.nextafter(f, -math.inf)
    return f


@functools.lru_cache(maxsize=4096)
def _zcdp_eps(rho_f: float, delta_f: float) -> float:
    d_in = math.sqrt(2.0 * rho_f)
    while d_in * d_in / 2.0 < rho_f:  # rho' = d_in^2 / 2 must be >= rho
        d_in = math.nextafter(d_in, math.inf)
    profile = _conversion_measurement().map(d_in)
    return float(profile.epsilon(delta_f))


def zcdp_to_approx_epsilon(rho: Any, delta: Any) -> float:
    """epsilon such that rho-zCDP implies (epsilon, delta)-DP, from OpenDP 0.16.

    Conservative in floating point: rho is rounded up and delta down before OpenDP
    computes the conversion (which itself rounds its result up). It is at or below the
    classic bound rho + 2 sqrt(rho ln(1/delta)) (Bun & Steinke 2016).
    """
    r = _positive(rho, "rho")
    d = _delta(delta)
    rho_f, delta_f = _float_up(r), _float_down(d)
    if not math.isfinite(rho_f) or delta_f <= 0:
        raise InvalidBudgetError("rho or delta is outside the supported range")
    return _zcdp_eps(rho_f, delta_f)


def approx_to_zcdp_rho(epsilon: Any, delta: Any) -> Fraction:
    """The largest rho (rounded down) with zcdp_to_approx_epsilon(rho, delta) <= epsilon."""
    eps = _positive(epsilon, "epsilon")
    d = _delta(delta)
    eps_f = float(eps)  # only for the bracket; the final check is exact against eps
    log_inv = math.log(1.0 / float(d))

    def ok(r: float) -> bool:
        return r > 0 and Fraction(zcdp_to_approx_epsilon(Fraction(r), d)) <= eps

    # Bun-Steinke closed form is a safe lower start: rho0 + 2 sqrt(rho0 L) = eps.
    lo = (math.sqrt(log_inv + eps_f) - math.sqrt(log_inv)) ** 2
    while not ok(lo):
        lo /= 2.0
        if lo < 1e-300:
            raise InvalidBudgetError("no rho meets this (epsilon, delta)")
    hi = max(2.0 * lo, eps_f)
    while ok(hi):
        lo = hi
        hi *= 2.0
        if hi > 1e300:
            raise InvalidBudgetError("epsilon is outside the supported range")
    for _ in range(200):  # invariant: ok(lo), not ok(hi)
        if hi - lo <= 1e-13 * hi:
            break
        mid = 0.5 * (lo + hi)
        if ok(mid):
            lo = mid
        else:
            hi = mid
    out = _round_down(Fraction(lo))
    if not (out > 0 and Fraction(zcdp_to_approx_epsilon(out, d)) <= eps):
        raise InvalidBudgetError("no rho meets this (epsilon, delta)")  # unreachable in practice
    return out


# --- inverses for the epsilon explorer ----------------------------------------------------
def _target_grid(target_error: Any, k: int) -> int:
    te = _sensitivity(target_error, "target_error")  # > 0, finite
    return math.floor(te * Fraction(2) ** (-k))


def _bisect_min(pred, start: float) -> float:
    """Smallest x > 0 (to relative 1e-12, from above) with pred(x) true; pred monotone."""
    hi = start
    while not pred(hi):
        hi *= 2.0
        if hi > 1e300:
            raise InvalidBudgetError("no budget reaches this accuracy")
    lo = hi / 2.0
    while pred(lo):
        hi = lo
        lo /= 2.0
        if lo < 1e-300:
            raise InvalidBudgetError("the accuracy target is met by any budget")
    for _ in range(400):  # invariant: not pred(lo), pred(hi)
        if hi - lo <= 1e-12 * hi:
            break
        mid = 0.5 * (lo + hi)
        if pred(mid):
            hi = mid
        else:
            lo = mid
    return hi


def min_epsilon_for_error(
    target_error: Any, confidence: Any, l1: Any, *, grid_exponent: int = 0
) -> Fraction:
    """Smallest epsilon (rounded up) for which discrete-Laplace noise stays within
    +-target_error with probability >= confidence.

    Units: ``target_error`` and ``l1`` are in REAL units; the noise is drawn on the grid
    2^grid_exponent, i.e. X * 2^k with X ~ DL(l1 * 2^-k / epsilon), so the condition is
    P(|X| <= floor(target_error * 2^-k)) >= confidence, from the exact tail.
    """
    k = _grid_exponent(grid_exponent)
    sens = _sensitivity(l1, "l1 sensitivity")
    h = _target_grid(target_error, k)
    alpha = 1.0 - _confidence(confidence)
    sens_grid = sens * Fraction(2) ** (-k)

    def pred(eps: float) -> bool:
        return accuracy.discrete_laplace_halfwidth(laplace_scale(Fraction(eps), sens_grid), alpha) <= h

    eps = _round_up(Fraction(_bisect_min(pred, 1.0)))
    if not accuracy.discrete_laplace_halfwidth(laplace_scale(eps, sens_grid), alpha) <= h:
        raise InvalidBudgetError("no budget reaches this accuracy")  # defensive
    return eps


def min_rho_for_error(
    target_error: Any, confidence: Any, l2_squared: Any, *, grid_exponent: int = 0
) -> Fraction:
    """Smallest rho (rounded up) for which discrete-Gaussian noise (sigma from
    :func:`gaussian_sigma_zcdp`) stays within +-target_error with probability >= confidence.

    Units: ``target_error`` real, ``l2_squared`` the squared L2 sensitivity in REAL units
    (grid units: l2_squared * 4^-k).
    """
    k = _grid_exponent(grid_exponent)
    l2sq = _sensitivity(l2_squared, "squared l2 sensitivity")
    h = _target_grid(target_error, k)
    alpha = 1.0 - _confidence(confidence)
    l2sq_grid = l2sq * Fraction(4) ** (-k)

    def meets(rho: Fraction) -> bool:
        sigma = gaussian_sigma_zcdp(rho, l2sq_grid)
        return accuracy.discrete_gaussian_tail(sigma, h) <= alpha

    rho = _round_up(Fraction(_bisect_min(lambda r: meets(Fraction(r)), 1.0)))
    if not meets(rho):
        raise InvalidBudgetError("no budget reaches this accuracy")  # defensive
    return rho
