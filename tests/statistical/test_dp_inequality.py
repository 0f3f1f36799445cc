"""DP inequality on neighbouring datasets, through the mechanism path (RELIABILITY recipe).

For each query, true values f(D) and f(D') differ by exactly the sensitivity (in grid
units), and the release is ``add_noise`` with the scale from ``calibration`` and the
production OpenDPNoiseSource -- the path the engine takes.

Per query and per dataset: 10^6 noisy outputs in total, split into 3 votes of 333,334
(splitting, rather than 10^6 per vote, keeps each test near 10 s on the shared 2-core box;
OpenDP draws about 2e5 discrete-Laplace / 1e5 discrete-Gaussian values per second).

delta-hat test (one vote)
    Outputs are binned into fixed bins chosen in advance from the CLAIMED scale (width w,
    aligned on f(D) and f(D'); B - 2 central bins and 2 tail bins; binning is
    post-processing, so the binned outputs satisfy the same DP inequality).
    delta_hat = max over both directions of sum_o max(0, p_hat_A(o) - e^eps p_hat_B(o)).
    Tolerance, derived (no normal approximation):
      * E[delta_hat_AB] <= delta + sum_o sqrt(v_o)/2 <= delta + sqrt(B (1 + e^{2 eps}) / n) / 2,
        since max(0, x) <= max(0, mu) + max(0, x - mu), E[Y+] = E|Y|/2 <= sd(Y)/2 for a
        centred Y, and Cauchy-Schwarz with sum_o v_o <= (1 + e^{2 eps}) / n;
      * McDiarmid: moving one output of A changes delta_hat_AB by <= 1/n, one of B by
        <= e^eps / n, so P(delta_hat_AB > E + u) <= exp(-2 u^2 n / (1 + e^{2 eps})); u is set
        for probability beta/2 = 5e-7 per direction.
    A vote passes when delta_hat <= delta + tolerance; the test takes the majority of 3 votes.

Clopper-Pearson lower bound on epsilon (pooled 10^6 outputs per dataset)
    Events: all half-lines of bins {bin < c} and {bin >= c}, both directions; for those with
    P_hat_B(S) >= 0.01, eps_lcb = ln((CP_lower(P_A(S)) - delta) / CP_upper(P_B(S))), each
    bound at level alpha / (2 m) with m = every candidate event (Bonferroni over the whole
    family, so selecting events by their estimate is harmless); alpha = 1e-6. Fail when
    max eps_lcb > the claimed epsilon.

Failing variants (the tests can fail): the same procedure on a mechanism with too little
noise. Pure DP (discrete Laplace): scale / 1.2 for both the delta-hat and the CP test.
zCDP (discrete Gaussian, checked through its (eps, delta) conversion): sigma / 1.5 for both.
A Gaussian with sigma / 1.2 is NOT a violation at this (eps, delta): the zCDP -> (eps, delta)
conversion has slack for the Gaussian itself, and its exact delta at that epsilon stays
below the claim (checked in ``test_gaussian_claim_has_slack``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dp_spark.mechanisms import (
    DISCRETE_GAUSSIAN,
    DISCRETE_LAPLACE,
    OpenDPNoiseSource,
    add_noise,
    grid_exponent_for,
    to_grid,
)
from dp_spark.mechanisms import accuracy, calibration

pytestmark = pytest.mark.slow

N_TOTAL = 1_000_000
VOTES = 3
N_VOTE = -(-N_TOTAL // VOTES)  # 333,334
BETA = 1e-6  # per-vote false-alarm bound of the delta-hat test
ALPHA_CP = 1e-6  # family-wise level of the Clopper-Pearson bounds
MIN_EVENT_P = 0.01

SOURCE = OpenDPNoiseSource()


@dataclass(frozen=True)
class Case:
    name: str
    mechanism: str
    f_d: int  # true value on D, grid units
    f_dp: int  # true value on D' (D plus one unit)
    scale: Fraction  # calibrated Laplace scale or Gaussian sigma, grid units
    epsilon: float  # claimed epsilon
    delta: float  # claimed delta (0 for pure DP)
    width: int  # bin width, grid units


def _count_case() -> Case:
    # user-level count, D has 1000 units, D' one more; sensitivity 1, epsilon 1.
    eps = Fraction(1)
    return Case("count", DISCRETE_LAPLACE, 1000, 1001, calibration.laplace_scale(eps, 1), 1.0, 0.0, 1)


def _distinct_case() -> Case:
    # distinct units, D empty (RELIABILITY 15), D' a single unit; sensitivity 1, epsilon 1/2.
    eps = Fraction(1, 2)
    return Case("distinct_count", DISCRETE_LAPLACE, 0, 1, calibration.laplace_scale(eps, 1), 0.5, 0.0, 1)


def _sum_case() -> Case:
    # sum clamped to [0, 100], one value per unit; D' adds a unit whose value 1000 is clamped
    # to 100 (RELIABILITY 9). Grid k from the public bounds: 2^-20. Sensitivity = the bound
    # in grid units = 100 * 2^20.
    lo, hi = 0, 100
    k = grid_exponent_for(lo, hi)
    d_values = [3.25, 50.5, 99.0, 0.0, 17.125]
    f_d = sum(to_grid(min(max(v, lo), hi), k) for v in d_values)
    f_dp = f_d + to_grid(min(max(1000.0, lo), hi), k)
    sens = to_grid(hi, k)
    assert f_dp - f_d == sens == 100 * 2**20
    eps = Fraction(1)
    return Case("clamped_sum", DISCRETE_LAPLACE, f_d, f_dp, calibration.laplace_scale(eps, sens), 1.0, 0.0, sens // 4)


RHO = Fraction(1, 10)
GAUSS_DELTA = Fraction(1, 20)


def _gaussian_case() -> Case:
    # count under rho-zCDP (L2 sensitivity 1), checked at (eps, delta) from OpenDP's conversion.
    sigma = calibration.gaussian_sigma_zcdp(RHO, 1)
    eps = calibration.zcdp_to_approx_epsilon(RHO, GAUSS_DELTA)
    return Case("gaussian_count", DISCRETE_GAUSSIAN, 1000, 1001, sigma, eps, float(GAUSS_DELTA), 1)


CASES = {c.name: c for c in (_count_case(), _distinct_case(), _sum_case(), _gaussian_case())}


# --- the procedure ------------------------------------------------------------------------
def _reach(case: Case) -> int:
    """Bins on each side beyond f(D) / f(D'), from the CLAIMED scale (tail mass ~ 1e-3)."""
    s = float(case.scale)
    if case.mechanism == DISCRETE_LAPLACE:
        return math.ceil(s * math.log(1000.0) / case.width)
    return math.ceil(3.3 * s / case.width)


def _histogram(case: Case, outputs: np.ndarray) -> np.ndarray:
    """Counts in B fixed bins: [tail-, central..., tail+]."""
    r = _reach(case)
    shift = (case.f_dp - case.f_d) // case.width
    rel = (outputs - case.f_d) // case.width  # bin index, f(D) is the left edge of bin 0
    lo, hi = -r, shift + r  # central bins lo .. hi-1
    clipped = np.clip(rel, lo - 1, hi) - (lo - 1)
    return np.bincount(clipped, minlength=hi - lo + 2).astype(np.float64)


def _draw(case: Case, true_value: int, n: int, factor: float) -> np.ndarray:
    scale = case.scale / Fraction(factor)  # factor > 1: too little noise
    return np.array(add_noise(case.mechanism, [true_value] * n, scale, source=SOURCE), dtype=np.int64)


def delta_hat(h_a: np.ndarray, h_b: np.ndarray, eps: float) -> float:
    p, q = h_a / h_a.sum(), h_b / h_b.sum()
    return float(np.maximum(0.0, p - math.exp(eps) * q).sum())


def tolerance(eps: float, n: int, bins: int, beta: float = BETA) -> float:
    e2 = 1.0 + math.exp(2.0 * eps)
    return math.sqrt(bins * e2 / n) / 2.0 + math.sqrt(e2 * math.log(2.0 / beta) / (2.0 * n))


def vote(case: Case, factor: float) -> tuple[bool, float, float, np.ndarray, np.ndarray]:
    h_d = _histogram(case, _draw(case, case.f_d, N_VOTE, factor))
    h_dp = _histogram(case, _draw(case, case.f_dp, N_VOTE, factor))
    dh = max(delta_hat(h_d, h_dp, case.epsilon), delta_hat(h_dp, h_d, case.epsilon))
    tol = tolerance(case.epsilon, N_VOTE, h_d.size)
    return dh <= case.delta + tol, dh, tol, h_d, h_dp


def _cp_lower(k: np.ndarray, n: int, a: float) -> np.ndarray:
    out = np.zeros_like(k, dtype=np.float64)
    pos = k > 0
    out[pos] = stats.beta.ppf(a, k[pos], n - k[pos] + 1)
    return out


def _cp_upper(k: np.ndarray, n: int, a: float) -> np.ndarray:
    out = np.ones_like(k, dtype=np.float64)
    below = k < n
    out[below] = stats.beta.ppf(1.0 - a, k[below] + 1, n - k[below])
    return out


def epsilon_lcb(h_d: np.ndarray, h_dp: np.ndarray, delta: float) -> float:
    """Max over half-line events and both directions of the Bonferroni CP lower bound."""
    n_d, n_dp = int(h_d.sum()), int(h_dp.sum())
    # events: {bin < c} for c = 1..B-1 (prefix sums) and their complements
    pre_d, pre_dp = np.cumsum(h_d)[:-1], np.cumsum(h_dp)[:-1]
    ev_d = np.concatenate([pre_d, n_d - pre_d])
    ev_dp = np.concatenate([pre_dp, n_dp - pre_dp])
    m = 2 * ev_d.size  # candidate events x directions
    a = ALPHA_CP / (2 * m)
    best = -math.inf
    for k_a, n_a, k_b, n_b in ((ev_d, n_d, ev_dp, n_dp), (ev_dp, n_dp, ev_d, n_d)):
        eligible = k_b / n_b >= MIN_EVENT_P
        low = _cp_lower(k_a[eligible], n_a, a) - delta
        up = _cp_upper(k_b[eligible], n_b, a)
        ok = low > 0
        if ok.any():
            best = max(best, float(np.max(np.log(low[ok] / up[ok]))))
    return best


def run(case: Case, factor: float) -> dict:
    votes = [vote(case, factor) for _ in range(VOTES)]
    h_d = sum(v[3] for v in votes)
    h_dp = sum(v[4] for v in votes)
    return {
        "passes": [v[0] for v in votes],
        "delta_hat": [round(v[1], 5) for v in votes],
        "tolerance": round(votes[0][2], 5),
        "majority_pass": sum(v[0] for v in votes) * 2 > VOTES,
        "eps_lcb": epsilon_lcb(h_d, h_dp, case.delta),
    }


# --- tests --------------------------------------------------------------------------------
PURE = ["count", "distinct_count", "clamped_sum"]
PURE_UNDER_NOISE = 1.2
GAUSS_UNDER_NOISE = 1.5


@pytest.mark.parametrize("name", PURE + ["gaussian_count"])
def test_dp_inequality_holds(name):
    case = CASES[name]
    res = run(case, 1.0)
    assert res["majority_pass"], res
    assert res["eps_lcb"] <= case.epsilon, res


@pytest.mark.parametrize("name", PURE)
def test_dp_inequality_detects_too_little_laplace_noise(name):
    case = CASES[name]
    res = run(case, PURE_UNDER_NOISE)
    assert not res["majority_pass"], res
    assert res["eps_lcb"] > case.epsilon, res


def test_dp_inequality_detects_too_little_gaussian_noise():
    case = CASES["gaussian_count"]
    res = run(case, GAUSS_UNDER_NOISE)
    assert not res["majority_pass"], res
    assert res["eps_lcb"] > case.epsilon, res


# --- cheap checks of the set-up (no sampling) ---------------------------------------------
def _exact_binned_delta(case: Case, factor: float) -> float:
    """The exact delta of the binned mechanism at the claimed epsilon (for the design)."""
    s = float(case.scale) / factor
    r = _reach(case)
    shift = (case.f_dp - case.f_d) // case.width
    span = int(60 * s) + 10 * case.width + 60
    x = np.arange(-span, span + shift * case.width + 1)
    pmf = accuracy.discrete_laplace_pmf if case.mechanism == DISCRETE_LAPLACE else accuracy.discrete_gaussian_pmf
    if case.width == 1:
        p = pmf(s, x)
        q = pmf(s, x - shift)
        bins = np.clip(x, -r - 1, shift + r) + r + 1
        hp = np.bincount(bins, weights=p)
        hq = np.bincount(bins, weights=q)
        return max(delta_hat(hp, hq, case.epsilon), delta_hat(hq, hp, case.epsilon))
    raise NotImplementedError


def test_gaussian_claim_has_slack():
    """Design check: sigma / 1.2 still meets the (eps, delta) claim exactly; sigma / 1.5 does
    not, by more than the test's tolerance."""
    case = CASES["gaussian_count"]
    assert _exact_binned_delta(case, 1.0) < case.delta
    assert _exact_binned_delta(case, 1.2) < case.delta
    bins = _histogram(case, np.array([0])).size
    assert _exact_binned_delta(case, GAUSS_UNDER_NOISE) > case.delta + tolerance(case.epsilon, N_VOTE, bins)


@pytest.mark.parametrize("name", ["count", "distinct_count"])
def test_laplace_power_design(name):
    case = CASES[name]
    assert _exact_binned_delta(case, 1.0) < 1e-12
    bins = _histogram(case, np.array([0])).size
    assert _exact_binned_delta(case, PURE_UNDER_NOISE) > 2 * tolerance(case.epsilon, N_VOTE, bins)


def test_tolerance_values():
    # e.g. epsilon 1, n = 333,334, 17 bins
    assert tolerance(1.0, N_VOTE, 17) == pytest.approx(0.0236, abs=5e-4)
