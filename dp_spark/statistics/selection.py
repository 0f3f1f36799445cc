"""Private key selection: the keys of a group-by column that nobody listed, found with DP.

``group_by: [{column: region, private_keys: {max_keys: 500}}]`` publishes the regions that
have enough privacy units, and no trace of the others. The mechanism is the thresholded
noisy distinct-unit count of differentially private partition selection (Korolova, Kenthapadi,
Mishra, Ntoulas 2009, "Releasing search queries and clicks privately"; Wilson, Zhang, Lam,
Desfontaines, Simmons-Marengo, Gipson 2020, "Differentially private SQL with bounded user
contribution", PoPETs, Sec. 3.2/4; Desfontaines, Voss, Gipson, Mandayam 2022,
"Differentially private partition selection", PoPETs), on the data *after* contribution
bounding:

1. bounding keeps at most L0 key tuples (cells) per unit, so each unit is in at most
   m = min(L0, K) private key tuples (the projection of its cells onto the private columns);
2. per private key tuple, the number of distinct units ``c`` (each unit adds at most 1 to at
   most m tuples: L1 sensitivity m under add/remove, 2m under replace; 1 per event);
3. ``c + Z`` with Z discrete Laplace of scale ``b = L1 / epsilon`` (OpenDP's exact sampler,
   drawn on the executors, one draw per tuple present in the bounded data);
4. a tuple is kept when ``c + Z >= tau``, the threshold chosen so that a tuple with ``c = 1``
   passes with probability at most ``delta / m``:
   ``P[Z >= k] = t^k / (1 + t)`` for k >= 1, t = exp(-1/b), so ``tau = 1 + k`` with k the
   smallest integer >= 1 such that ``t^k / (1 + t) <= delta / m`` (computed with the scale
   rounded up to the double OpenDP uses, and a relative margin, so never below the exact one);
5. of the kept tuples, the ones with the largest noisy counts are published, greedily, so that
   no private column shows more than its ``max_keys`` values (post-processing of the noisy
   counts: ties broken by the key, never by the data).

Privacy. Let x' = x plus one unit u (add/remove). Tuples present in both inputs have a
vector of distinct-unit counts that differs by at most m in L1, so their noisy counts are
epsilon-DP (discrete Laplace, Canonne, Kamath, Steinke 2020) and any function of them --
which are kept, their statistics' noise -- composes as usual. The tuples that only u creates
(at most m) appear in x' only; each passes the threshold with probability at most delta/m, so
with probability at least 1 - delta none does (union bound), and conditioned on that event the
output is that of the epsilon-DP part on the shared tuples (the draws are independent per
tuple). That is (epsilon, delta)-DP, and under zCDP delta-approximate (epsilon^2 / 2)-zCDP
(Bun & Steinke 2016, Def. 8.1 and Prop. 1.4); the statistics of the selected keys, noised as for
public keys, add their own rho (or epsilon) and no delta: the release is one event of
(rho_selection + rho_statistics, delta) -- one pass, one charge. Replacing a unit is the same
on both sides (an event of each side with probability >= 1 - delta; L1 = 2m).

The Gaussian threshold (``private_keys: {mechanism: gaussian}`` under a zCDP charge, or
``cheaper``, which takes it when it needs fewer units): step 3 draws Z discrete Gaussian of
sigma = sqrt(L2^2 / (2 rho)) instead (L2^2 = m under add/remove, 2m under replace, 1 per event:
the same count vector, OpenDP's exact sampler), and tau = 1 + k with k the smallest integer
such that ``P[Z >= k] <= delta / m``, ``P[Z >= k]`` the exact discrete Gaussian tail (a sum of
``exp(-x^2 / (2 sigma^2))`` over x >= k over the normaliser, computed with sigma rounded up to
the double OpenDP uses and a relative margin). The shared tuples' noisy counts are then
rho-zCDP (Canonne, Kamath, Steinke 2020, Thm. 4) and the argument above gives delta-approximate
rho-zCDP directly -- no epsilon^2 / 2: for the same rho the Gaussian threshold is far lower (a
quarter of rho = 0.5, m = 3, delta = 1e-8: about 21 units against about 114 for the Laplace one).
Pure-DP charges have only the Laplace threshold. Specs that do not name a mechanism keep the
Laplace one (their release ids and behaviour are unchanged).

Private columns are selected *jointly*, as tuples, and crossed with the public key sets: the
distinct-unit count of a private tuple is summed over every public key (a region is counted
across all days), so it reaches the threshold far more often than a per-(day, region) count
would, every public key shows the same selected tuples (a table with a stable shape), and no
combination of private values that nobody has is published (a cross product of separately
selected columns would publish mostly empty combinations).

Nothing here imports pyspark.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any, Iterable, Optional, Sequence

from dp_spark.core.budget import PureDP, ZCDP
from dp_spark.errors import ConfigError
from dp_spark.core.events import GAUSSIAN, LAPLACE, NoiseEvent
from dp_spark.core.search import smallest_passing
from dp_spark.core.units import Aggregate, Neighbouring, sensitivity

__all__ = ["SelectionPlan", "plan_selection", "laplace_threshold", "gaussian_threshold", "gaussian_tail",
           "publish_probability", "keep_over_threshold", "limit_keys", "SELECTION_MECHANISMS"]

#: the values of ``private_keys.mechanism``: a threshold on discrete Laplace noise (pure DP or
#: zCDP; the default), on discrete Gaussian noise (zCDP only), or whichever of the two needs
#: fewer units to be published under the charge's measure
SELECTION_MECHANISMS = ("laplace", "gaussian", "cheaper")

#: epsilon of the selection is rounded down to a multiple of 1 / _EPS_GRID (never above the share)
_EPS_GRID = 10**9
#: a relative margin on the tail bound against floating-point error (the threshold only grows)
_MARGIN = 1e-9


def _tail(k: int, b: float) -> float:
    """P[Z >= k] for Z discrete Laplace of scale b (k >= 1): t^k / (1 + t), t = exp(-1/b)."""
    t = math.exp(-1.0 / b)
    return math.exp(-k / b) / (1.0 + t)


def _scale_float(scale: Fraction) -> float:
    from dp_spark.mechanisms.samplers import float_at_least

    return float_at_least(scale, "scale")


def _gauss_norm(s: float) -> float:
    """sum over all integers x of exp(-x^2 / (2 s^2)): directly for small s, else by the Jacobi
    theta identity sqrt(2 pi) s sum_k exp(-2 pi^2 s^2 k^2) (both exact up to rounding)."""
    if s < 2.0:
        n = int(40 * s) + 40
        return math.fsum(math.exp(-(x * x) / (2 * s * s)) for x in range(-n, n + 1))
    return math.sqrt(2 * math.pi) * s * math.fsum(math.exp(-2 * math.pi ** 2 * s * s * k * k) * (1 if k == 0 else 2)
                                                  for k in range(0, 4))


def _gauss_tail_sum(k: int, s: float) -> float:
    """sum over integers x >= k of exp(-x^2 / (2 s^2)), k >= 0, until the terms are below
    1e-18 of the sum (numpy in chunks: no sampling here, only the pmf)."""
    import numpy as np

    total = 0.0
    start = k
    chunk = int(16 * s) + 64  # enough for the usual case in one step
    while True:
        x = np.arange(start, start + chunk, dtype=np.float64)
        terms = np.exp(-(x * x) / (2 * s * s))
        total += math.fsum(terms.tolist())
        if total == 0.0 or terms[-1] < 1e-18 * total:
            return total
        start += chunk


def gaussian_tail(k: int, sigma: float) -> float:
    """P[Z >= k] for Z discrete Gaussian of parameter sigma, k >= 1 (P ~ exp(-x^2/(2 sigma^2)))."""
    if k < 1:
        raise ValueError("the tail is computed for k >= 1")
    return _gauss_tail_sum(k, sigma) / _gauss_norm(sigma)


def _per_key_delta(delta: Fraction, max_new_keys: int) -> float:
    """delta / max_new_keys: the probability a key of one unit may be published with (checked)."""
    if not 0 < delta < 1:
        raise ConfigError("the selection delta must be in (0, 1)")
    if max_new_keys < 1:
        raise ConfigError("max_new_keys must be >= 1")
    return float(Fraction(delta) / max_new_keys)


def gaussian_threshold(sigma: Fraction, delta: Fraction, max_new_keys: int) -> int:
    """The integer threshold tau: a key with one unit reaches ``count + Z >= tau`` with
    probability at most ``delta / max_new_keys``, Z discrete Gaussian of ``sigma`` (its exact
    tail, at sigma rounded up to the double the sampler uses; a relative margin on top)."""
    s = _scale_float(Fraction(sigma))
    p = _per_key_delta(delta, max_new_keys)

    def ok(k: int) -> bool:  # monotone in k
        return gaussian_tail(k, s) <= p * (1.0 - _MARGIN)

    return 1 + smallest_passing(ok, math.ceil(s * math.sqrt(2 * math.log(1.0 / p))))


def _tail_for(mechanism: str, k: int, scale: float) -> float:
    return gaussian_tail(k, scale) if mechanism == GAUSSIAN else _tail(k, scale)


def laplace_threshold(scale: Fraction, delta: Fraction, max_new_keys: int) -> int:
    """The integer threshold tau: a key with one unit (count 1) reaches ``count + Z >= tau``
    with probability at most ``delta / max_new_keys``, Z discrete Laplace of ``scale``."""
    b = _scale_float(Fraction(scale))
    p = _per_key_delta(delta, max_new_keys)
    t = math.exp(-1.0 / b)
    k = max(1, math.ceil(b * (math.log(1.0 / p) - math.log1p(t))) - 1)
    while _tail(k, b) > p * (1.0 - _MARGIN):
        k += 1
    return 1 + k


def publish_probability(count: int, scale: Fraction, threshold: int, mechanism: str = LAPLACE) -> float:
    """P[count + Z >= threshold]: how likely a key with ``count`` units is selected (Z discrete
    Laplace of ``scale``, or discrete Gaussian of sigma ``scale`` with ``mechanism=GAUSSIAN``)."""
    b = _scale_float(Fraction(scale))
    k = threshold - count
    if k >= 1:
        return _tail_for(mechanism, k, b)
    return 1.0 - _tail_for(mechanism, 1 - k, b)  # symmetric noise: P[Z <= k - 1] = P[Z >= 1 - k]


@dataclass(frozen=True)
class SelectionPlan:
    """Everything about the private key selection of a release that is fixed before data."""

    columns: tuple[str, ...]       # the private group-by columns, selected jointly as tuples
    max_keys: tuple[int, ...]      # per private column: at most this many values published
    max_tuples: int                # at most this many private tuples (product of max_keys)
    budget: Any                    # PureDP(eps) or ZCDP(rho) share of the charge (delta 0)
    epsilon: Optional[Fraction]    # the Laplace selection's epsilon (None for the Gaussian one)
    sensitivity: Fraction          # L1 (Laplace) or squared L2 (Gaussian) of the distinct-unit counts
    max_new_keys: int              # m: tuples one unit can create alone
    scale: Fraction                # discrete Laplace scale b = L1 / epsilon, or Gaussian sigma
    delta: Fraction
    threshold: int                 # tau: publish when count + Z >= tau
    event: NoiseEvent
    mechanism: str = LAPLACE       # LAPLACE or GAUSSIAN (core.events names)
    # the selections the charge could pay for, the chosen one included (the plan shows them)
    alternatives: tuple = ()

    def probability(self, count: int) -> float:
        return publish_probability(count, self.scale, self.threshold, self.mechanism)

    def count_for(self, probability: float) -> int:
        """The smallest distinct-unit count selected with at least ``probability``."""
        c = 1
        while self.probability(c) < probability:
            c += 1
        return c

    def to_json(self) -> dict[str, Any]:
        out = {"columns": list(self.columns), "max_keys": list(self.max_keys),
               "epsilon": None if self.epsilon is None else str(self.epsilon), "sensitivity": str(self.sensitivity),
               "scale": str(self.scale), "delta": str(self.delta), "threshold": self.threshold,
               "max_new_keys": self.max_new_keys}
        if self.mechanism != LAPLACE:  # only then: Laplace selections keep their JSON
            out["mechanism"] = self.mechanism
        return out

    def summary(self) -> dict[str, Any]:
        """The public parameters of this selection, for the plan table (no data)."""
        return {"mechanism": self.mechanism, "noise_scale": float(self.scale), "threshold_units": self.threshold,
                "units_for_even_odds": self.count_for(0.5), "units_for_95_percent": self.count_for(0.95)}


def _epsilon_for(share) -> Fraction:
    """The Laplace epsilon a budget share pays for: itself (pure DP), or the largest multiple of
    10^-9 with epsilon^2 / 2 <= rho (zCDP, Bun & Steinke Prop. 1.4)."""
    if isinstance(share, PureDP):
        return Fraction(share.epsilon)
    if isinstance(share, ZCDP):
        rho = Fraction(share.rho)
        eps = Fraction(math.isqrt(int(2 * rho * _EPS_GRID * _EPS_GRID)), _EPS_GRID)
        while eps * eps / 2 > rho:
            eps -= Fraction(1, _EPS_GRID)
        if eps <= 0:
            raise ConfigError("the key selection's share of the charge is too small")
        return eps
    raise ConfigError("release charges are pure_dp or zcdp")


def _laplace_plan(spec, share, delta: Fraction, m: int, columns) -> SelectionPlan:
    l1 = Fraction(sensitivity(Aggregate.DISTINCT_UNITS, spec.bounds, spec.neighbouring).l1)
    eps = _epsilon_for(share)
    scale = l1 / eps
    tau = laplace_threshold(scale, delta, m)
    event = NoiseEvent(mechanism=LAPLACE, statistic="key_selection", scale=scale, sensitivity=l1,
                       cells=1, partitions_per_unit=m, delta=delta)
    return SelectionPlan(budget=share, epsilon=eps, sensitivity=l1, max_new_keys=m, scale=scale, delta=delta,
                         threshold=tau, event=event, **columns)


def _gaussian_plan(spec, share, delta: Fraction, m: int, columns) -> SelectionPlan:
    from dp_spark.mechanisms.calibration import gaussian_sigma_zcdp

    l2sq = Fraction(sensitivity(Aggregate.DISTINCT_UNITS, spec.bounds, spec.neighbouring).l2_squared)
    sigma = gaussian_sigma_zcdp(Fraction(share.rho), l2sq)
    tau = gaussian_threshold(sigma, delta, m)
    event = NoiseEvent(mechanism=GAUSSIAN, statistic="key_selection", scale=sigma, l2_squared=l2sq,
                       cells=1, partitions_per_unit=m, delta=delta)
    return SelectionPlan(budget=share, epsilon=None, sensitivity=l2sq, max_new_keys=m, scale=sigma, delta=delta,
                         threshold=tau, event=event, mechanism=GAUSSIAN, **columns)


def _cost_key(p: SelectionPlan) -> tuple[int, int]:
    """What a selection costs the analyst: the units a key needs (the threshold, then 95% odds)."""
    return (p.threshold, p.count_for(0.95))


def plan_selection(spec, share) -> SelectionPlan:
    """The selection of ``spec``'s private key columns with ``share`` of its charge (a PureDP or
    ZCDP amount without delta) and the charge's whole delta, by ``spec.selection_mechanism``:
    ``laplace`` (the default), ``gaussian`` (zCDP only) or ``cheaper`` (zCDP: whichever needs
    fewer units, ties to Laplace; pure DP: Laplace). ``alternatives`` holds every selection the
    charge can pay for, so the plan shows both under zCDP."""
    private = spec.private_key_sets
    if not private:
        raise ConfigError(f"{spec.source}: this release has no private key columns")
    delta = Fraction(getattr(spec.charge, "delta", 0))
    if delta <= 0:
        raise ConfigError(f"{spec.source}: field 'budget.delta': a release with private_keys spends delta")
    m = 1 if spec.neighbouring is Neighbouring.EVENT else spec.bounds.effective_l0
    columns = dict(columns=tuple(k.column for k in private), max_keys=tuple(k.max_keys for k in private),
                   max_tuples=spec.max_private_tuples)
    wanted = getattr(spec, "selection_mechanism", "laplace")
    if wanted not in SELECTION_MECHANISMS:
        raise ConfigError(f"{spec.source}: unknown private key selection mechanism")
    plans = [_laplace_plan(spec, share, delta, m, columns)]
    if isinstance(share, ZCDP):
        plans.append(_gaussian_plan(spec, share, delta, m, columns))
    elif wanted == "gaussian":
        raise ConfigError(f"{spec.source}: field 'group_by.private_keys.mechanism': the Gaussian threshold needs a "
                          "zcdp charge")
    if wanted == "laplace":
        chosen = plans[0]
    elif wanted == "gaussian":
        chosen = plans[1]
    else:
        chosen = min(plans, key=_cost_key)  # min keeps the first (Laplace) on a tie
    return replace(chosen, alternatives=tuple(plans))


# --- the selection itself (run on the executors, on the distinct-unit counts) ------------------
def keep_over_threshold(counts: Sequence[int], scale: Fraction, threshold: int, source=None,
                        mechanism: str = LAPLACE) -> list[Optional[int]]:
    """Noisy counts of the tuples that pass: ``count + Z`` where it is ``>= threshold``, else
    None. One draw per tuple, in one vector call to ``source`` (OpenDP's exact sampler unless
    a test source is given): discrete Laplace of ``scale``, or discrete Gaussian of sigma
    ``scale`` with ``mechanism=GAUSSIAN``. The values are never logged."""
    if source is None:
        from dp_spark.mechanisms.samplers import OpenDPNoiseSource

        source = OpenDPNoiseSource()
    n = len(counts)
    if n == 0:
        return []
    if mechanism == GAUSSIAN:
        draws = source.discrete_gaussian(Fraction(scale), n)
    elif mechanism == LAPLACE:
        draws = source.discrete_laplace(Fraction(scale), n)
    else:
        raise ConfigError("unknown selection mechanism")
    out: list[Optional[int]] = []
    for c, z in zip(counts, draws):
        v = int(c) + int(z)
        out.append(v if v >= threshold else None)
    return out


def limit_keys(candidates: Iterable[tuple[int, tuple[str, ...]]], max_keys: Sequence[int],
               max_tuples: int) -> list[tuple[str, ...]]:
    """From (noisy count, key tuple) pairs over the threshold: the tuples kept, largest noisy
    count first (ties by the key), skipping a tuple that would make a column show more than its
    ``max_keys`` values, at most ``max_tuples`` in all. Post-processing of noisy counts only.
    Returned sorted by key (the noisy ranking is not published)."""
    seen: list[set[str]] = [set() for _ in max_keys]
    kept: list[tuple[str, ...]] = []
    for _, key in sorted(candidates, key=lambda nk: (-nk[0], nk[1])):
        if len(kept) >= max_tuples:
            break
        if any(key[j] not in seen[j] and len(seen[j]) >= max_keys[j] for j in range(len(max_keys))):
            continue
        for j, v in enumerate(key):
            seen[j].add(v)
        kept.append(tuple(key))
    return sorted(kept)
