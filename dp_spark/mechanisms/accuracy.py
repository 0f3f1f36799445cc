"""Exact accuracy of the discrete noise distributions, in GRID UNITS (integers).

The engine multiplies by 2^k (see :mod:`dp_spark.core.grid`) to report real units.

Discrete Laplace with scale t, a = exp(-1/t):
    P(x) = (1 - a) / (1 + a) * a^|x|,
    Var  = 2 a / (1 - a)^2,
    P(|X| > h) = 2 a^(h+1) / (1 + a)                         (h >= 0 an integer).

Discrete Gaussian with parameter sigma (CKS20), f(x) = exp(-x^2 / (2 sigma^2)):
    Z = sum_x f(x); Var = sum_x x^2 f(x) / Z; P(|X| > h) = 2 sum_{x > h} f(x) / Z.
  For sigma <= 4096 (variance: sigma < 64) these sums are taken term by term over |x| <= 40 sigma + 2 (terms beyond
  are below 1e-347 relative, i.e. exactly zero in double precision), the tail summed from the
  smallest terms up. For larger sigma the Poisson-summation identities are used instead:
  Z = sqrt(2 pi) sigma (1 + 2 sum_k exp(-2 pi^2 sigma^2 k^2)) (the correction is exactly 0 in
  double precision for sigma > 5), Var = sigma^2 (1 - 8 pi^2 sigma^2 sum_k k^2 e^(...) / theta),
  and the tail by Euler-Maclaurin: sum_{x >= m} f(x) = integral + f(m)/2 - f'(m)/12 + O(f'''),
  whose remainder is below 1e-20 relative there.

All functions take the scale in grid units as an int, float or Fraction (> 0, finite) and
alpha in (0, 1).

Weighted sums of iid noises (:func:`edge_halfwidths`, the quantile's bin-edge tests): the
upper tail of N = (1 - q) (X_1 + ... + X_j) - q (X_{j+1} + ... + X_B) from the exact law, the
pmfs of the two partial sums computed by FFT convolution of the pmf truncated where its tail
is below 1e-16 (the truncated mass, the mass trimmed from the sums' far tails and a margin
for the FFT's rounding are all counted as exceedance, so the tail is an upper bound); when
that computation is too large, the Chernoff bound with the exact moment generating function
of the discrete Laplace, or the discrete Gaussian's sub-Gaussian bound
E e^(lambda X) <= e^(lambda^2 sigma^2 / 2) (Canonne, Kamath, Steinke 2020): proven, and
wider (about 20% at the levels used).
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import Any, Optional

import numpy as np

from dp_spark.errors import ConfigError
from dp_spark.mechanisms.samplers import DISCRETE_GAUSSIAN, DISCRETE_LAPLACE, check_scale

__all__ = [
    "discrete_laplace_stddev",
    "discrete_gaussian_stddev",
    "discrete_laplace_variance",
    "discrete_gaussian_variance",
    "discrete_laplace_tail",
    "discrete_gaussian_tail",
    "discrete_laplace_halfwidth",
    "discrete_gaussian_halfwidth",
    "discrete_laplace_pmf",
    "discrete_gaussian_pmf",
    "noise_stddev",
    "noise_halfwidth",
    "noise_tail",
    "edge_halfwidths",
]

_DIRECT_MAX_SIGMA = 4096.0
_DIRECT_VAR_MAX_SIGMA = 64.0
_SPAN = 40.0  # |x| <= 40 sigma + 2 covers all mass representable in double precision


def _scale_float(scale: Any, name: str) -> float:
    frac = check_scale(scale, name)
    f = float(frac)
    if not math.isfinite(f) or f <= 0:
        raise ConfigError(f"{name} is outside the supported range")
    return f


def _alpha(alpha: Any) -> float:
    if isinstance(alpha, bool):
        raise ConfigError("alpha must be a number in (0, 1)")
    try:
        a = float(alpha)
    except (TypeError, ValueError):
        raise ConfigError("alpha must be a number in (0, 1)") from None
    if not (0.0 < a < 1.0):  # also rejects NaN
        raise ConfigError("alpha must be in (0, 1)")
    return a


def _h(h: Any) -> int:
    if isinstance(h, bool) or not isinstance(h, (int, np.integer)) or h < 0:
        raise ConfigError("h must be a non-negative integer")
    return int(h)


# --- discrete Laplace ---------------------------------------------------------------------
def discrete_laplace_variance(scale: Any) -> float:
    t = _scale_float(scale, "scale")
    em1 = -math.expm1(-1.0 / t)  # 1 - a, accurate for large t
    if em1 == 0.0:
        return math.inf
    return 2.0 * math.exp(-1.0 / t) / (em1 * em1)


def discrete_laplace_stddev(scale: Any) -> float:
    """Exact standard deviation of the discrete Laplace with scale t: sqrt(2a)/(1-a)."""
    return math.sqrt(discrete_laplace_variance(scale))


def _dl_log_tail(t: float, h: int) -> float:
    # log P(|X| > h) = log 2 - (h + 1)/t - log(1 + e^{-1/t})
    return math.log(2.0) - (h + 1) / t - math.log1p(math.exp(-1.0 / t))


def discrete_laplace_tail(scale: Any, h: int) -> float:
    """P(|X| > h) = 2 e^{-(h+1)/t} / (1 + e^{-1/t})."""
    t = _scale_float(scale, "scale")
    return math.exp(_dl_log_tail(t, _h(h)))


def discrete_laplace_pmf(scale: Any, x: np.ndarray | int) -> np.ndarray:
    """P(X = x) = (1 - a)/(1 + a) a^|x| (vectorised)."""
    t = _scale_float(scale, "scale")
    xs = np.abs(np.asarray(x, dtype=np.float64))
    log_c = math.log(-math.expm1(-1.0 / t)) - math.log1p(math.exp(-1.0 / t))
    return np.exp(log_c - xs / t)


def discrete_laplace_halfwidth(scale: Any, alpha: float) -> int:
    """Smallest integer h >= 0 with P(|X| <= h) >= 1 - alpha (exact tail formula)."""
    t = _scale_float(scale, "scale")
    a = _alpha(alpha)
    log_a = math.log(a)
    if _dl_log_tail(t, 0) <= log_a:
        return 0
    # (h + 1) / t >= log 2 - log1p(e^{-1/t}) - log alpha
    need = t * (math.log(2.0) - math.log1p(math.exp(-1.0 / t)) - log_a)
    h = max(0, math.ceil(need) - 1)
    if h > 2**53:  # beyond integer resolution of doubles: the formula is the answer
        return h
    while h > 0 and _dl_log_tail(t, h - 1) <= log_a:
        h -= 1
    while _dl_log_tail(t, h) > log_a:
        h += 1
    return h


# --- discrete Gaussian --------------------------------------------------------------------
class _DirectDG:
    """Term-by-term sums for sigma <= 4096."""

    def __init__(self, sigma: float) -> None:
        top = int(math.ceil(_SPAN * sigma)) + 2
        x = np.arange(top + 1, dtype=np.float64)
        w = np.exp(-(x * x) / (2.0 * sigma * sigma))
        # suffix sums, accumulated from the smallest terms up
        self.suffix = np.cumsum(w[::-1])[::-1]  # suffix[i] = sum_{x >= i} w[x]
        self.z = math.fsum([w[0], 2.0 * math.fsum(w[1:])])
        self.second = 2.0 * math.fsum(x * x * w) / self.z
        self.top = top

    def tail(self, h: int) -> float:
        if h + 1 > self.top:
            return 0.0
        return 2.0 * float(self.suffix[h + 1]) / self.z


@functools.lru_cache(maxsize=32)
def _get_direct(sigma: float) -> _DirectDG:
    return _DirectDG(sigma)


def _theta_terms(sigma: float) -> tuple[float, float]:
    s1 = 0.0
    s2 = 0.0
    for k in range(1, 50):
        e = math.exp(-2.0 * math.pi**2 * sigma * sigma * k * k)
        if e == 0.0:
            break
        s1 += e
        s2 += k * k * e
    return s1, s2


def _dg_tail_large(sigma: float, h: int) -> float:
    from scipy import special  # lazy (issue 15): imported at first use, not with the engine

    m = float(h + 1)
    fm = math.exp(-(m * m) / (2.0 * sigma * sigma))
    integral = special.erfc(m / (sigma * math.sqrt(2.0)))  # 2 * int_m^inf f / (sqrt(2 pi) sigma)
    correction = (fm + m * fm / (6.0 * sigma * sigma)) / (math.sqrt(2.0 * math.pi) * sigma)
    s1, _ = _theta_terms(sigma)
    return (float(integral) + correction) / (1.0 + 2.0 * s1)


def discrete_gaussian_variance(sigma: Any) -> float:
    s = _scale_float(sigma, "sigma")
    if s < _DIRECT_VAR_MAX_SIGMA:
        return _get_direct(s).second
    s1, s2 = _theta_terms(s)
    return s * s * (1.0 - 8.0 * math.pi**2 * s * s * s2 / (1.0 + 2.0 * s1))


def discrete_gaussian_stddev(sigma: Any) -> float:
    """Exact standard deviation of the discrete Gaussian (sum of the pmf; sigma^2 minus a
    correction that vanishes in double precision for sigma > 5)."""
    return math.sqrt(discrete_gaussian_variance(sigma))


def discrete_gaussian_tail(sigma: Any, h: int) -> float:
    """P(|X| > h) for the discrete Gaussian (exact pmf, normalised numerically)."""
    s = _scale_float(sigma, "sigma")
    h = _h(h)
    if s <= _DIRECT_MAX_SIGMA:
        return _get_direct(s).tail(h)
    return _dg_tail_large(s, h)


def discrete_gaussian_pmf(sigma: Any, x: np.ndarray | int) -> np.ndarray:
    """P(X = x) (vectorised), with the numerically summed normalising constant."""
    s = _scale_float(sigma, "sigma")
    xs = np.asarray(x, dtype=np.float64)
    if s <= _DIRECT_MAX_SIGMA:
        z = _get_direct(s).z
    else:
        s1, _ = _theta_terms(s)
        z = math.sqrt(2.0 * math.pi) * s * (1.0 + 2.0 * s1)
    return np.exp(-(xs * xs) / (2.0 * s * s)) / z


def discrete_gaussian_halfwidth(sigma: Any, alpha: float) -> int:
    """Smallest integer h >= 0 with P(|X| <= h) >= 1 - alpha, from the exact pmf."""
    s = _scale_float(sigma, "sigma")
    a = _alpha(alpha)
    if s <= _DIRECT_MAX_SIGMA:
        d = _get_direct(s)
        tails = 2.0 * d.suffix[1:] / d.z  # tails[h] = P(|X| > h), non-increasing
        ok = np.nonzero(tails <= a)[0]
        return int(ok[0]) if ok.size else d.top
    lo, hi = 0, int(math.ceil(_SPAN * s)) + 2  # tail(hi) == 0 <= a
    if _dg_tail_large(s, 0) <= a:
        return 0
    while hi - lo > 1:  # invariant: tail(lo) > a >= tail(hi)
        mid = (lo + hi) // 2
        if _dg_tail_large(s, mid) <= a:
            hi = mid
        else:
            lo = mid
    return hi


# --- dispatch -----------------------------------------------------------------------------
def _mech(mechanism: str) -> str:
    if mechanism not in (DISCRETE_LAPLACE, DISCRETE_GAUSSIAN):
        raise ConfigError(
            f"unknown mechanism {mechanism!r}; expected {DISCRETE_LAPLACE!r} or {DISCRETE_GAUSSIAN!r}"
        )
    return mechanism


def noise_stddev(mechanism: str, scale: Any) -> float:
    """Standard deviation (grid units) of the named mechanism's noise at this scale/sigma."""
    if _mech(mechanism) == DISCRETE_LAPLACE:
        return discrete_laplace_stddev(scale)
    return discrete_gaussian_stddev(scale)


def noise_halfwidth(mechanism: str, scale: Any, alpha: float) -> int:
    """Smallest h with P(|noise| <= h) >= 1 - alpha (grid units) for the named mechanism.

    Memoised: a release asks it for every cell with the same few (scale, alpha)."""
    try:
        return _noise_halfwidth_cached(mechanism, scale, alpha)
    except TypeError:  # an unhashable argument: let the checks below say what is wrong
        return _noise_halfwidth(mechanism, scale, alpha)


@functools.lru_cache(maxsize=4096)
def _noise_halfwidth_cached(mechanism: str, scale: Any, alpha: Any) -> int:
    return _noise_halfwidth(mechanism, scale, alpha)


def _noise_halfwidth(mechanism: str, scale: Any, alpha: Any) -> int:
    if _mech(mechanism) == DISCRETE_LAPLACE:
        return discrete_laplace_halfwidth(scale, alpha)
    return discrete_gaussian_halfwidth(scale, alpha)


def noise_tail(mechanism: str, scale: Any, h: int) -> float:
    """P(|noise| > h) (grid units) for the named mechanism."""
    if _mech(mechanism) == DISCRETE_LAPLACE:
        return discrete_laplace_tail(scale, h)
    return discrete_gaussian_tail(scale, h)


# --- weighted sums of iid noises: the quantile's bin-edge tests ------------------------------
_EDGE_TAIL = 1e-16  # pmf mass dropped per noise, counted as exceedance
_EDGE_TRIM = 1e-13  # mass trimmed from each end of a partial sum's pmf, counted likewise
_FFT_SLACK = 1e-10  # margin for the FFT's rounding (absolute, per tail probability)
_EDGE_WORK = 2**24  # (bins - 1) x FFT length above which the Chernoff bound is used


def edge_halfwidths(mechanism: str, scale: Any, bins: int, q: Any, beta: float) -> tuple[float, ...]:
    """Thresholds h_1 .. h_{B-1} (grid units) with P(N_j > h_j) <= ``beta``, where

        N_j = (1 - q) (X_1 + ... + X_j) - q (X_{j+1} + ... + X_B),

    X_1 .. X_B iid noises of the named mechanism at ``scale`` (B = ``bins``): the noise of the
    quantile's test statistic C~_j - q T~ at bin edge j (:mod:`dp_spark.statistics.quantile`).
    N_j is symmetric, so P(N_j < -h_j) <= beta too.

    Exact law when affordable: the pmfs of the partial sums by FFT convolution of the noise's
    pmf (truncated at tail mass 1e-16), and P(N_j > h) = sum_c P(C = c) P(A > (h + q c)/(1 - q))
    with A, C the two partial sums; every mass left out (the truncation, the trimmed far tails
    of the sums, a 1e-10 margin for rounding) is counted as exceedance, so h_j is the exact
    threshold or slightly above. When (B - 1) x the FFT length exceeds 2^24 (Laplace scale
    above ~60 or Gaussian sigma above ~240 at 64 bins), the Chernoff bound
    min_lambda e^(-lambda h) E e^(lambda N_j) (exact MGF of the discrete Laplace; the discrete
    Gaussian's sub-Gaussian bound) instead: proven, and about 20% wider. Memoised.
    """
    _mech(mechanism)
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 2:
        raise ConfigError("bins must be an integer >= 2")
    qf = float(q)
    if not 0.0 < qf < 1.0:
        raise ConfigError("q must be in (0, 1)")
    b = _alpha(beta)
    return _edge_halfwidths(mechanism, Fraction(check_scale(scale, "scale")), bins, qf, b)


@functools.lru_cache(maxsize=256)
def _edge_halfwidths(mechanism: str, scale: Fraction, bins: int, q: float, beta: float) -> tuple[float, ...]:
    t = _scale_float(scale, "scale")
    k = noise_halfwidth(mechanism, scale, _EDGE_TAIL)  # P(|X| > k) <= 1e-16
    length = 1 << max(1, math.ceil(math.log2((bins - 1) * 2 * k + 1)))
    if (bins - 1) * length > _EDGE_WORK:
        return tuple(_chernoff_threshold(mechanism, t, j, bins, q, beta) for j in range(1, bins))
    sums = _partial_sum_pmfs(mechanism, scale, k, bins - 1, length)
    slack = bins * _EDGE_TAIL + _FFT_SLACK
    out: list[float] = []
    for j in range(1, bins):
        (off_a, pa, cut_a), (off_c, pc, cut_c) = sums[j], sums[bins - j]
        out.append(_exact_threshold(off_a, pa, off_c, pc, q, beta - slack - cut_a - cut_c,
                                    hint=out[-1] if out else None))
    return tuple(out)


def _partial_sum_pmfs(mechanism: str, scale: Fraction, k: int, most: int, length: int) -> dict:
    """{m: (offset, pmf, trimmed mass)} of X_1 + ... + X_m, m = 1..most (the pmf at index i is
    P(sum = offset + i), the noise's pmf truncated to [-k, k])."""
    pmf = discrete_laplace_pmf if mechanism == DISCRETE_LAPLACE else discrete_gaussian_pmf
    base = np.asarray(pmf(scale, np.arange(-k, k + 1)), dtype=np.float64)
    spectrum = np.fft.rfft(base, length)
    power = np.ones_like(spectrum)
    out = {}
    for m in range(1, most + 1):
        power = power * spectrum
        p = np.maximum(np.fft.irfft(power, length)[: 2 * m * k + 1], 0.0)
        lo = int(np.searchsorted(np.cumsum(p), _EDGE_TRIM))
        hi = len(p) - int(np.searchsorted(np.cumsum(p[::-1]), _EDGE_TRIM))
        cut = float(p[:lo].sum() + p[hi:].sum())
        out[m] = (lo - m * k, p[lo:hi], cut)
    return out


def _exact_threshold(off_a: int, pa: np.ndarray, off_c: int, pc: np.ndarray, q: float, target: float,
                     hint: Optional[float] = None) -> float:
    """Smallest h (to 1e-5 relative, rounded up: always a valid threshold) with
    sum_c pc(c) P(A > (h + q c) / (1 - q)) <= target. ``hint``: a nearby threshold (the
    previous edge's), which narrows the first bracket when it holds."""
    if target <= 0:
        raise ConfigError("the level is too extreme for the exact law of the bin-edge noise")
    suffix = np.append(np.cumsum(pa[::-1])[::-1], 0.0)  # suffix[i] = P(A >= off_a + i)
    c = off_c + np.arange(len(pc), dtype=np.float64)

    def tail(h: float) -> float:
        y = (h + q * c) / (1.0 - q)
        y = y - 1e-9 * np.maximum(1.0, np.abs(y))  # an atom on the boundary counts as above
        idx = np.clip(np.floor(y).astype(np.int64) - off_a + 1, 0, len(pa))
        return float(np.dot(pc, suffix[idx]))

    lo, hi = 0.0, (1.0 - q) * (off_a + len(pa)) + q * max(-off_c, 0) + 1.0
    t_lo = tail(lo)
    if t_lo <= target:
        return 0.0
    if hint is not None and 0.0 < hint < hi:  # narrow the bracket around the neighbour's threshold
        up = min(hint * 1.25, hi)
        t_up = tail(up)
        if t_up <= target:
            hi = up
            down = hint * 0.8
            t_down = tail(down)
            if t_down > target:
                lo, t_lo = down, t_down
        else:
            lo, t_lo = up, t_up
    # Bracketed root finding on log(tail) - log(target), which is close to linear in h for
    # these tails: false position with the Illinois correction, and a bisection step whenever
    # two steps did not halve the bracket. The bracket keeps tail(lo) > target >= tail(hi), so
    # the answer (hi) is always a valid threshold. tail is a step function (the noise is on a
    # lattice), so the last digits are found by halving: to 1e-5 relative (a hundred-thousandth
    # of the half-width, rounded up) from the neighbour's bracket costs about 18 evaluations,
    # where plain bisection to 1e-9 took 34.
    log_target = math.log(target)

    def f(t: float) -> float:
        return math.log(max(t, 1e-300)) - log_target

    f_lo, f_hi = f(t_lo), f(tail(hi))
    side, width_before = 0, [hi - lo, hi - lo]
    while hi - lo > 1e-5 * hi:
        if width_before[0] > 0 and (hi - lo) > 0.5 * width_before[0]:
            mid = (lo + hi) / 2.0  # no halving in two steps: bisect
        else:
            mid = (lo * f_hi - hi * f_lo) / (f_hi - f_lo) if f_hi != f_lo else (lo + hi) / 2.0
            if not lo < mid < hi:
                mid = (lo + hi) / 2.0
        width_before = [width_before[1], hi - lo]
        t_mid = tail(mid)
        if t_mid <= target:
            hi, f_hi = mid, f(t_mid)
            if side == 1:
                f_lo /= 2.0  # Illinois: the same end kept twice, halve the other's weight
            side = 1
        else:
            lo, f_lo = mid, f(t_mid)
            if side == -1:
                f_hi /= 2.0
            side = -1
    return hi


def _chernoff_threshold(mechanism: str, t: float, j: int, bins: int, q: float, beta: float) -> float:
    """min over lambda of (log E e^(lambda N_j) + log(1/beta)) / lambda: any lambda's value h
    has P(N_j > h) <= e^(-lambda h) E e^(lambda N_j) <= beta."""
    from scipy.optimize import minimize_scalar

    w_a, w_c, log_beta = 1.0 - q, q, math.log(beta)
    if mechanism == DISCRETE_GAUSSIAN:  # E e^(lambda X) <= e^(lambda^2 sigma^2 / 2): closed form
        v = t * t * (j * w_a * w_a + (bins - j) * w_c * w_c)
        return math.sqrt(-2.0 * v * log_beta)
    a = math.exp(-1.0 / t)
    log_norm = 2.0 * math.log1p(-a)

    def log_mgf(x: float) -> float:  # log E e^(x X), |x| < 1/t
        return log_norm - math.log1p(-a * math.exp(x)) - math.log1p(-a * math.exp(-x))

    def h_of(lam: float) -> float:
        return (j * log_mgf(w_a * lam) + (bins - j) * log_mgf(w_c * lam) - log_beta) / lam

    top = (1.0 / t) / max(w_a, w_c)
    res = minimize_scalar(h_of, bounds=(top * 1e-6, top * (1 - 1e-9)), method="bounded",
                          options={"xatol": top * 1e-9})
    return float(min(res.fun, h_of(top * 0.5)))
