"""The binary-tree mechanism: running totals of a daily stream under continual release.

Dwork, Naor, Pitassi, Rothblum 2010 ("Differential privacy under continual observation");
Chan, Shi, Song 2011 ("Private and continual release of statistics"). A stream of daily
increments x_1 .. x_T over a declared horizon of T days is published as its running totals
S_t = x_1 + ... + x_t, one point per day, for ONE charge covering the whole horizon.

The tree
    Node (h, j) (level h >= 0, index j >= 0) covers the days j 2^h + 1 .. (j + 1) 2^h. The tree
    of a horizon T holds every node that ends on or before day T, (j + 1) 2^h <= T, at levels
    0 .. floor(log2 T): about 2T nodes. Its true value is the sum of the increments it covers.

The dyadic decomposition of a prefix
    [1, t] is the disjoint union of popcount(t) nodes, one per bit of t (largest first):
    :func:`prefix_nodes`. The published S~_t is the sum of those nodes' noisy values.

Sensitivity of the node vector (derived, never typed)
    One unit changes the increments of at most ``max_days`` days, each by at most ``per_day``
    (and all of them together by at most ``total``, when that is smaller), all in one direction
    (add or remove the unit). Each day lies in exactly one node of a level, so at level h:
      * the L1 change is at most S = min(max_days x per_day, total);
      * each node changes by at most M_h = min(min(2^h, max_days) x per_day, S), so the squared
        L2 change is at most S x M_h (sum d^2 <= max d x sum d).
    Over the levels: L1 = levels x S, L2^2 = sum_h S x M_h (:func:`node_sensitivity`).
    "Distinct units ever seen" (each unit counted once, on its first kept day) is one day with
    one unit: L1 = L2^2 = levels. A brute-force test holds these bounds against every
    neighbouring pair of small streams (tests/unit/test_tree.py).

Noise and charge
    Every node gets ONE independent draw of the project's exact samplers
    (:mod:`dp_spark.mechanisms.samplers`): discrete Laplace with scale L1 / epsilon (pure DP) or
    discrete Gaussian with sigma = sqrt(L2^2 / (2 rho)) (rho-zCDP), so the node vector, and every
    point computed from it, costs the one charge (post-processing). A node's noise must be drawn
    once and reused by every point that uses it: redrawing per query would average the noise
    away and break the claim (the statistical test shows such a variant is caught).

Accuracy
    The noise of S~_t is the sum of popcount(t) iid node noises: variance popcount(t) x Var
    (exact variance of the discrete distribution), so at most (floor(log2 T) + 1) node variances,
    each growing like log^2 T through the sensitivity (pure DP); the interval is the exact law
    of that sum (FFT of the pmf) when affordable, else a proven Chernoff bound. A simultaneous
    band over m points (:func:`band_halfwidth`) is the same construction at the per-point miss
    probability (1 - level) / m: Bonferroni, valid for the dependent points of a stream.

Everything is in grid units (integers) like the rest of :mod:`dp_spark.mechanisms`; nothing here
imports pyspark.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from dp_spark.core.budget import Budget, PureDP, ZCDP
from dp_spark.errors import ConfigError, InvalidBoundsError
from dp_spark.mechanisms import accuracy, calibration
from dp_spark.mechanisms.samplers import DISCRETE_GAUSSIAN, DISCRETE_LAPLACE, NoiseSource, default_source

__all__ = [
    "MAX_HORIZON_DAYS",
    "ERROR_DAYS",
    "Node",
    "StreamContribution",
    "NodeSensitivity",
    "TreeCalibration",
    "levels",
    "tree_nodes",
    "prefix_nodes",
    "node_values",
    "node_sensitivity",
    "distinct_units_contribution",
    "calibrate",
    "draw_node_noise",
    "released_prefix",
    "released_prefixes",
    "point_variance",
    "point_halfwidth",
    "band_alpha",
    "band_halfwidth",
    "error_profile",
    "chernoff_halfwidth",
    "point_expected_abs",
]

#: the longest declared horizon (ten years of days)
MAX_HORIZON_DAYS = 3660
#: the days whose error plans and statements show
ERROR_DAYS = (1, 30, 365)

Node = tuple[int, int]  # (level h, index j): days j 2^h + 1 .. (j + 1) 2^h


def _horizon(horizon: Any) -> int:
    if isinstance(horizon, bool) or not isinstance(horizon, int) or not 1 <= horizon <= MAX_HORIZON_DAYS:
        raise ConfigError(f"a stream's horizon must be an integer number of days in 1..{MAX_HORIZON_DAYS}")
    return horizon


def _day(t: Any, horizon: int) -> int:
    if isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= horizon:
        raise ConfigError("a stream's day must be an integer within its horizon (1 .. horizon)")
    return t


def levels(horizon: int) -> int:
    """The number of levels of the tree of ``horizon`` days: floor(log2 T) + 1."""
    return _horizon(horizon).bit_length()


@functools.lru_cache(maxsize=64)
def tree_nodes(horizon: int) -> tuple[Node, ...]:
    """Every node of the tree, level by level: (h, j) with (j + 1) 2^h <= T."""
    t = _horizon(horizon)
    return tuple((h, j) for h in range(t.bit_length()) for j in range(t >> h))


def prefix_nodes(t: int, horizon: int) -> tuple[Node, ...]:
    """The dyadic decomposition of days 1 .. t: popcount(t) disjoint nodes, largest first."""
    t = _day(t, _horizon(horizon))
    out, start = [], 0
    for h in range(t.bit_length() - 1, -1, -1):
        if t >> h & 1:
            out.append((h, start >> h))
            start += 1 << h
    return tuple(out)


def node_values(increments: Sequence[int], horizon: int) -> dict[Node, int]:
    """The true value of every node that ends on or before the last given day (increments[i]
    is day i + 1; at most ``horizon`` of them)."""
    t = _horizon(horizon)
    xs = [int(v) for v in increments]
    if len(xs) > t:
        raise ConfigError("more days of increments than the stream's horizon")
    prefix = [0]
    for v in xs:
        prefix.append(prefix[-1] + v)
    n = len(xs)
    return {(h, j): prefix[(j + 1) << h] - prefix[j << h]
            for h in range(n.bit_length()) for j in range(n >> h)}


# ---------------------------------------------------------------------------------------
# Sensitivity
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StreamContribution:
    """What one unit can do to the daily increments (grid units): change at most ``max_days``
    days, each by at most ``per_day``, all together by at most ``total`` (None: no bound beyond
    max_days x per_day), in one direction (add or remove the unit)."""

    max_days: int
    per_day: int
    total: Optional[int] = None

    def __post_init__(self) -> None:
        for name in ("max_days", "per_day") + (("total",) if self.total is not None else ()):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidBoundsError(f"a stream's contribution bound {name} must be a positive integer")

    @property
    def most(self) -> int:
        """The most one unit changes the increments in total (L1 over the days)."""
        s = self.max_days * self.per_day
        return s if self.total is None else min(s, self.total)


def distinct_units_contribution() -> StreamContribution:
    """"Distinct units ever seen": each unit counted once, on its first kept day."""
    return StreamContribution(max_days=1, per_day=1)


@dataclass(frozen=True)
class NodeSensitivity:
    """Sensitivity of the whole node vector (grid units): L1 and the squared L2."""

    l1: int
    l2_squared: int


def node_sensitivity(horizon: int, contribution: StreamContribution) -> NodeSensitivity:
    """The node vector's L1 and squared L2 sensitivity, derived level by level (module text)."""
    t = _horizon(horizon)
    s = contribution.most
    l1 = l2sq = 0
    for h in range(levels(t)):
        nodes_here = t >> h
        m = min(min(1 << h, contribution.max_days) * contribution.per_day, s)
        l1 += min(s, nodes_here * m)
        l2sq += min(s * m, nodes_here * m * m)
    return NodeSensitivity(l1=l1, l2_squared=l2sq)


# ---------------------------------------------------------------------------------------
# Calibration and noise
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TreeCalibration:
    """The noise of every node: mechanism and scale (grid units) for the whole horizon's charge."""

    horizon: int
    mechanism: str
    scale: Fraction
    sensitivity: NodeSensitivity

    @property
    def node_variance(self) -> float:
        if self.mechanism == DISCRETE_LAPLACE:
            return accuracy.discrete_laplace_variance(self.scale)
        return accuracy.discrete_gaussian_variance(self.scale)


def calibrate(horizon: int, contribution: StreamContribution, charge: Budget) -> TreeCalibration:
    """Scale every node's noise so that the whole node vector costs ``charge`` (one charge for
    the horizon): discrete Laplace L1 / epsilon (PureDP), discrete Gaussian sqrt(L2^2 / 2 rho)
    (ZCDP). A charge that spends delta is refused (the tree publishes no private keys)."""
    sens = node_sensitivity(horizon, contribution)
    if getattr(charge, "delta", 0):
        raise ConfigError("a stream's charge spends no delta")
    if isinstance(charge, PureDP):
        return TreeCalibration(horizon, DISCRETE_LAPLACE, Fraction(calibration.laplace_scale(charge.epsilon, sens.l1)),
                               sens)
    if isinstance(charge, ZCDP):
        return TreeCalibration(horizon, DISCRETE_GAUSSIAN,
                               Fraction(calibration.gaussian_sigma_zcdp(charge.rho, sens.l2_squared)), sens)
    raise ConfigError("a stream is charged in pure_dp or zcdp")


def draw_node_noise(cal: TreeCalibration, *, source: Optional[NoiseSource] = None) -> dict[Node, int]:
    """One draw per node of the tree, in one vector call (a fixed number of draws: the tree's
    size depends on the horizon only). Draw once, store, reuse: never call again for a stream."""
    nodes = tree_nodes(cal.horizon)
    src = default_source() if source is None else source
    return dict(zip(nodes, src.draw(cal.mechanism, cal.scale, len(nodes))))


def released_prefix(t: int, true_nodes: Mapping[Node, int], noise: Mapping[Node, int], horizon: int) -> int:
    """S~_t: the sum of the noisy values of the nodes of days 1 .. t (grid units)."""
    return sum(true_nodes[n] + noise[n] for n in prefix_nodes(t, horizon))


def released_prefixes(increments: Sequence[int], noise: Mapping[Node, int], horizon: int) -> list[int]:
    """S~_1 .. S~_n for the n given days of increments, each from the stored node noises."""
    true_nodes = node_values(increments, horizon)
    return [released_prefix(t, true_nodes, noise, horizon) for t in range(1, len(increments) + 1)]


# ---------------------------------------------------------------------------------------
# Accuracy
# ---------------------------------------------------------------------------------------
def point_variance(t: int, cal: TreeCalibration) -> float:
    """Var(S~_t - S_t) = popcount(t) x the node noise's exact variance (grid units^2)."""
    return len(prefix_nodes(t, cal.horizon)) * cal.node_variance


_TAIL_CUT = 1e-16  # pmf mass left out per noise, counted as exceedance
_FFT_MAX = 1 << 22  # the longest pmf of a sum computed exactly


def point_halfwidth(t: int, cal: TreeCalibration, confidence: Any) -> float:
    """h with P(|S~_t - S_t| <= h) >= confidence (grid units): the exact law of the sum of
    popcount(t) iid node noises by FFT when its support fits in 2^22 points (the mass left out
    counted as exceedance), else the Chernoff bound (exact MGF of the discrete Laplace; the
    discrete Gaussian's sub-Gaussian bound). Both are proven; the first is tight."""
    m = len(prefix_nodes(t, cal.horizon))
    c = float(confidence)
    if not 0.0 < c < 1.0:
        raise ConfigError("confidence must be in (0, 1)")
    return _sum_halfwidth(cal.mechanism, cal.scale, m, 1.0 - c)


def band_alpha(confidence: Any, points: int) -> float:
    """The per-point miss probability of a simultaneous band over ``points`` points:
    (1 - confidence) / points (Bonferroni)."""
    c = float(confidence)
    if not 0.0 < c < 1.0:
        raise ConfigError("confidence must be in (0, 1)")
    if isinstance(points, bool) or not isinstance(points, int) or points < 1:
        raise ConfigError("a band covers at least one point")
    return (1.0 - c) / points


def band_halfwidth(t: int, cal: TreeCalibration, confidence: Any, points: int) -> float:
    """h (grid units) with P(|S~_t - S_t| > h) <= (1 - confidence) / ``points``: the point's
    own interval construction (:func:`point_halfwidth`: the exact law of the sum of its
    popcount(t) node noises, else the Chernoff bound) at the Bonferroni level.

    Simultaneous band. Points of a stream share node noises, so they are dependent and Sidak's
    product does not apply; the union bound does, under any dependence: if each of ``points``
    points misses with probability at most (1 - confidence) / points, then
    P(some point misses) <= sum of the misses <= 1 - confidence, so ALL points are inside
    their bands together with probability >= confidence. ``points`` is fixed by the stream's
    declaration (horizon x statistics), never by the days published so far, so a point's band
    is the same in every refresh."""
    m = len(prefix_nodes(t, cal.horizon))
    return _sum_halfwidth(cal.mechanism, cal.scale, m, band_alpha(confidence, points))


@functools.lru_cache(maxsize=64)
def _sum_law(mechanism: str, scale: Fraction, m: int) -> Optional[tuple[int, np.ndarray]]:
    """(centre, pmf) of the sum of m iid node noises (pmf[centre + x] = P(S = x)), each noise's
    pmf truncated at tail mass 1e-16; None when its support exceeds 2^22 points."""
    k = accuracy.noise_halfwidth(mechanism, scale, _TAIL_CUT)
    length = 2 * m * k + 1
    if length > _FFT_MAX:
        return None
    pmf = accuracy.discrete_laplace_pmf if mechanism == DISCRETE_LAPLACE else accuracy.discrete_gaussian_pmf
    base = np.asarray(pmf(scale, np.arange(-k, k + 1)), dtype=np.float64)
    size = 1 << (length - 1).bit_length()
    p = np.maximum(np.fft.irfft(np.fft.rfft(base, size) ** m, size)[:length], 0.0)
    return m * k, p


@functools.lru_cache(maxsize=1024)
def _sum_halfwidth(mechanism: str, scale: Fraction, m: int, alpha: float) -> float:
    if m == 1:
        return float(accuracy.noise_halfwidth(mechanism, scale, alpha))
    law = _sum_law(mechanism, scale, m)
    if law is not None:
        centre, p = law
        # P(|S| > h) for h = 0 .. m k: the two tails from the centre
        upper = np.cumsum(p[::-1])[::-1]  # upper[i] = P(S >= i - centre)
        tails = 2.0 * upper[centre + 1:]  # tails[h] = P(|S| > h), the law being symmetric
        budget = alpha - m * _TAIL_CUT - 1e-10
        if budget > 0:
            ok = np.nonzero(tails <= budget)[0]
            if ok.size:
                return float(ok[0])
    return chernoff_halfwidth(mechanism, float(scale), m, alpha)


def point_expected_abs(t: int, cal: TreeCalibration) -> float:
    """E|S~_t - S_t| (grid units): from the exact law of the sum of the point's node noises
    when affordable, else the normal approximation sqrt(2 / pi) x stddev (the sum of several
    iid noises; never above the stddev)."""
    m = len(prefix_nodes(t, cal.horizon))
    law = _sum_law(cal.mechanism, cal.scale, m)
    if law is None:
        return math.sqrt(2.0 / math.pi * point_variance(t, cal))
    centre, p = law
    return float(np.dot(np.abs(np.arange(len(p)) - centre), p))


def chernoff_halfwidth(mechanism: str, t: float, m: int, alpha: float) -> float:
    """min over lambda of (m log E e^(lambda X) + log(2 / alpha)) / lambda (two-sided)."""
    log_term = math.log(2.0 / alpha)
    if mechanism == DISCRETE_GAUSSIAN:  # E e^(lambda X) <= e^(lambda^2 sigma^2 / 2) (CKS20)
        return math.sqrt(2.0 * m * t * t * log_term)
    from scipy.optimize import minimize_scalar

    a = math.exp(-1.0 / t)
    log_norm = 2.0 * math.log1p(-a)

    def h_of(lam: float) -> float:
        log_mgf = log_norm - math.log1p(-a * math.exp(lam)) - math.log1p(-a * math.exp(-lam))
        return (m * log_mgf + log_term) / lam

    top = 1.0 / t
    res = minimize_scalar(h_of, bounds=(top * 1e-6, top * (1 - 1e-9)), method="bounded",
                          options={"xatol": top * 1e-9})
    return float(min(res.fun, h_of(top * 0.5)))


def error_profile(cal: TreeCalibration, confidence: Any, days: Sequence[int] = ERROR_DAYS,
                  grid_exponent: int = 0) -> list[dict[str, Any]]:
    """Per day of ``days`` within the horizon: the nodes summed, the noise's standard deviation
    and the interval's half-width, in real units (grid units x 2^grid_exponent)."""
    unit = 2.0 ** grid_exponent
    out = []
    for d in days:
        if not 1 <= d <= cal.horizon:
            continue
        out.append({"day": d, "nodes": len(prefix_nodes(d, cal.horizon)),
                    "stddev": math.sqrt(point_variance(d, cal)) * unit,
                    "halfwidth": point_halfwidth(d, cal, confidence) * unit})
    return out
