"""Choosing contribution bounds: the bias/variance trade-off of K and [L, U], and a DP quantile.

Two tools:

1. :func:`bias_variance_table` (EXPLORATION: reads evaluation data, not publishable). For a
   grid of K (rows kept per unit) and U (upper clamp), on the rows of one cell of evaluation
   data given per unit, it computes exactly (no simulation):

   * the **bias** E[bounded statistic] - unbounded truth. The engine keeps a uniform random
     K-subset of a unit's rows (bottom-K by keyed hash priority), so each of the n_u rows of a
     unit is kept with probability min(1, K/n_u) and E[kept sum] = min(1, K/n_u) * sum of the
     unit's clamped values;
   * the **variance**: the noise variance the engine's plan gives for that K and [L, U]
     (:func:`dp_spark.engine.plan_for` on the re-bounded spec, so sensitivities, grid and
     budget split are the engine's own) plus the sampling variance of the K-subset
     (K (n_u - K) / (n_u - 1) * s_u^2 per unit, s_u^2 the population variance of its clamped
     values; 0 when n_u <= K). For a mean, the delta method over the bounded count;
   * RMSE = sqrt(bias^2 + variance), absolute and relative to the unbounded truth.

   Small K and U shrink the noise (sensitivity ~ K * max(|L|, |U|)) but bias the answer
   down; large ones remove the bias and inflate the noise. The table shows where the sum of
   the two is smallest *for that data*; the data of a production release must not be used
   to choose its own bounds unless the choice itself is DP (tool 2).

   It returns exact (non-DP) values of the data it is given, so it runs only in tests
   (``DP_SPARK_TEST_MODE=1``, on synthetic data); outside them it refuses
   (:class:`~dp_spark.errors.TestModeError`).

2. :func:`dp_quantile`: a differentially private quantile over a PUBLIC candidate grid, to
   choose U (or K) from the data at a stated cost. With ``engine=`` and ``budget_id=`` it goes
   through the ledger like a release: the engine's principal must be allowed to explore that
   budget (audited refusal otherwise), the charge is reserved BEFORE any noise is drawn (a
   refused charge draws nothing), drawn from the engine's noise source, committed, and audited
   (family ``dp_quantile``; every call is a new release: a rerun is a new draw and a new
   charge). Without an engine it charges nothing and therefore runs only in tests
   (``DP_SPARK_TEST_MODE=1``).

   Mechanism: report noisy max over integer rank scores with discrete Laplace noise drawn by
   the engine's exact sampler. An exponential mechanism via "report noisy max with Gumbel
   noise" would need an exact Gumbel sampler, which the vetted samplers do not provide; a
   floating-point Gumbel would reintroduce the floating-point attacks the grid avoids.

   Theorem relied on (report noisy max, Dwork & Roth 2014, Claim 3.9, in its general
   non-monotone form): let s_1..s_m be integer-valued scores, each with sensitivity at most
   Delta (|s_j(D) - s_j(D')| <= Delta for neighbours D, D'), and Z_j iid discrete Laplace with
   scale t (P(z) ~ exp(-|z|/t)). Releasing only argmax_j (s_j + Z_j), ties broken towards the
   lowest index, is (2 Delta / t)-DP. Proof: fix Z_{-j}. Candidate j wins iff Z_j >= T_j, an
   integer threshold T_j = max(max_{i<j}(s_i+Z_i) + 1, max_{i>j}(s_i+Z_i)) - s_j; on a
   neighbour both the max and s_j move by at most Delta, so T_j moves by at most 2 Delta, and
   for the discrete Laplace P(Z >= c) <= e^{d/t} P(Z >= c + d) for every integer c and d >= 0
   (the pmf ratio p(x)/p(x+d) is at most e^{d/t} term by term). Integrating over Z_{-j} gives
   P[j | D] <= e^{2 Delta / t} P[j | D']. So t = 2 Delta / epsilon gives epsilon-DP (pure).
   The one-sided e^{Delta/t} version needs monotone scores, which rank scores are not, so it
   is not used.

   Scores: with q = a/b (a rational quantile), n the number of rows kept and below_j the
   number of rows with value < c_j, s_j = -|b * below_j - a * n|. Adding or removing one unit
   with m <= K rows moves below_j by some c in [0, m] and n by m, so b*below_j - a*n moves by
   b c - a m in [-a m, (b - a) m]: Delta = max(a, b - a) * K (add/remove). Replacing a unit
   is a removal and an addition: Delta doubles. Event level: K = 1. Each unit's rows are
   truncated to its first K values *before* scoring (a function of that unit's data alone),
   so the bound holds whatever the input.

Nothing here imports pyspark.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Iterable, Optional, Sequence, Union

import numpy as np
import pandas as pd

from dp_spark.core.budget import Budget, PureDP, ZCDP, to_fraction
from dp_spark.config import ReleaseSpec, ValueSpec
from dp_spark.errors import ConfigError, InvalidBoundsError, MeasureMismatchError
from dp_spark.core.units import ContributionBounds, Neighbouring

__all__ = [
    "rebound_spec",
    "bias_variance_table",
    "DpQuantile",
    "dp_quantile",
    "candidate_grid",
]


# --------------------------------------------------------------------------------------
# Re-bounding a spec (public parameters only)
# --------------------------------------------------------------------------------------
def _value_of(spec: ReleaseSpec) -> ValueSpec:
    """The value column of a sum or mean spec (the config gives every one; None is a bug)."""
    if spec.value is None:
        raise ConfigError(f"metric '{spec.metric}' has no value column")
    return spec.value


def rebound_spec(spec: ReleaseSpec, *, max_rows_per_unit: Optional[int] = None,
                 lower: Any = None, upper: Any = None) -> ReleaseSpec:
    """``spec`` with another K and/or clamp [L, U], re-validated and grid-aligned like a YAML
    spec (the config's own alignment of the clamp to the fixed-point grid)."""
    from dp_spark.spec.legacy import legacy_statistics  # the spec's alignment and rewrite
    from dp_spark.spec.runtime import grid_align

    b = spec.bounds
    k = b.max_rows_per_unit if max_rows_per_unit is None else max_rows_per_unit
    linf = b.max_rows_per_partition
    if linf is not None:
        linf = k if linf >= b.max_rows_per_unit else min(linf, k)
    value = spec.value
    if lower is not None or upper is not None:
        if value is None:
            raise ConfigError(f"metric '{spec.metric}' has no value clamp to change")
        lo = to_fraction(value.declared_lower if lower is None else lower, "lower")
        hi = to_fraction(value.declared_upper if upper is None else upper, "upper")
        if lo > hi:
            raise InvalidBoundsError("lower clamp bound is above the upper clamp bound")
        e_lo, e_hi, gk = grid_align(lo, hi)
        value = ValueSpec(column=value.column, lower=e_lo, upper=e_hi, declared_lower=lo,
                          declared_upper=hi, grid_exponent=gk)
    bounds = ContributionBounds(
        max_rows_per_unit=k, max_partitions_per_unit=b.max_partitions_per_unit,
        max_rows_per_partition=linf,
        lower=None if value is None else value.lower, upper=None if value is None else value.upper,
    )
    if spec.metric is None:
        raise ConfigError("rebound_spec takes a single-metric spec")
    return dataclasses.replace(spec, bounds=bounds, value=value,
                               statistics=legacy_statistics(spec.metric, value, spec.mean))


# --------------------------------------------------------------------------------------
# Bias / variance of K and U
# --------------------------------------------------------------------------------------
def _as_units(per_unit_values: Iterable[Sequence[float]]) -> list[np.ndarray]:
    units = [np.asarray([float(v) for v in vals if v is not None and not (isinstance(v, float) and math.isnan(v))],
                        dtype=float) for vals in per_unit_values]
    return [u for u in units if u.size > 0]


def _noise_variances(spec: ReleaseSpec) -> dict[str, float]:
    """Per-cell noise variances (real units) of the spec's noisy components, from the engine's
    plan: ``count`` (rows), ``sum``, ``normalised_sum``."""
    from dp_spark.engine import plan_for

    plan = plan_for(spec)
    out = {}
    for comp, p in zip(plan.components, plan.statistics):
        name = {"rows": "count", "units": "distinct_units", "sum": "sum",
                "nsum": "sum" if spec.metric == "sum" else "normalised_sum"}[comp.kind]
        out[name] = (float(p.stddev_grid) * float(p.grid_unit)) ** 2
    return out


def bias_variance_table(spec: ReleaseSpec, per_unit_values: Iterable[Sequence[float]], *,
                        ks: Sequence[int], uppers: Optional[Sequence[Any]] = None,
                        lower: Any = None) -> pd.DataFrame:
    """Bias^2, variance and RMSE of one cell of ``spec`` for each K in ``ks`` and U in ``uppers``.

    ``per_unit_values``: for each unit of the evaluation cell, the values of its rows (for a
    ``count`` spec only the number of rows matters). ``uppers`` defaults to the spec's U;
    ``lower`` to the spec's L. The budget and the relation are the spec's. Returns a DataFrame
    with columns K, U (enforced, grid-aligned), statistic, truth (unbounded), expected
    (E[bounded]), bias, bias_sq, noise_variance, sampling_variance, variance, rmse,
    relative_rmse, bias_share (bias^2 / MSE), publishable (False).
    """
    from dp_spark.governance.trust import require_test_mode

    require_test_mode("bias_variance_table (exact, non-DP values of the data it is given)",
                      "run it in tests on synthetic data; choose a bound from protected data with "
                      "dp_quantile(..., engine=Engine(env, mode='exploration'), budget_id=...), which is charged")
    if spec.metric not in ("count", "sum", "mean"):
        raise ConfigError("bias_variance_table handles count, sum and mean specs "
                          "(a distinct-unit count's bound is L0, not K or U)")
    units = _as_units(per_unit_values)
    if not units:
        raise ConfigError("the evaluation cell has no rows")
    counts = np.array([u.size for u in units], dtype=float)
    all_vals = np.concatenate(units)
    n_raw = float(all_vals.size)
    if spec.metric == "count":
        truth = n_raw
        uppers = [None]
    else:
        truth = float(all_vals.sum()) if spec.metric == "sum" else float(all_vals.mean())
        uppers = list(uppers) if uppers is not None else [_value_of(spec).declared_upper]
    records = []
    for k in ks:
        kk = int(k)
        keep = np.minimum(1.0, kk / counts)  # P(a row of unit u is kept)
        kept_n = float(np.minimum(counts, kk).sum())
        for u_raw in uppers:
            s = rebound_spec(spec, max_rows_per_unit=kk, lower=lower, upper=u_raw) if spec.value is not None \
                else rebound_spec(spec, max_rows_per_unit=kk)
            noise = _noise_variances(s)
            if spec.metric == "count":
                expected, sampling, noise_var, u_out = kept_n, 0.0, noise["count"], None
            else:
                lo_b, hi_b = float(_value_of(s).lower), float(_value_of(s).upper)
                e_sum = 0.0
                samp = 0.0
                for c, p, vals in zip(counts, keep, units):
                    cv = np.clip(vals, lo_b, hi_b)
                    e_sum += p * float(cv.sum())
                    if c > kk:  # sampling K of c rows without replacement
                        samp += kk * (c - kk) / (c - 1) * float(cv.var())
                u_out = float(_value_of(s).upper)
                if spec.metric == "sum":
                    expected, sampling, noise_var = e_sum, samp, noise["sum"]
                else:
                    expected = e_sum / kept_n
                    sampling = samp / kept_n ** 2
                    d = expected - (lo_b + hi_b) / 2
                    noise_var = (noise["normalised_sum"] + d * d * noise["count"]) / kept_n ** 2
            bias = expected - truth
            var = noise_var + sampling
            mse = bias * bias + var
            records.append({
                "K": kk, "U": u_out, "statistic": spec.metric, "truth": truth, "expected": expected,
                "bias": bias, "bias_sq": bias * bias, "noise_variance": noise_var,
                "sampling_variance": sampling, "variance": var, "rmse": math.sqrt(mse),
                "relative_rmse": math.sqrt(mse) / abs(truth) if truth else math.inf,
                "bias_share": bias * bias / mse if mse > 0 else 0.0, "publishable": False,
            })
    frame = pd.DataFrame.from_records(records)
    frame.attrs["publishable"] = False
    return frame


# --------------------------------------------------------------------------------------
# DP quantile (report noisy max with discrete Laplace on integer rank scores)
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DpQuantile:
    """The DP choice of a quantile over a public grid, and what it costs.

    ``value`` is the chosen candidate (the only data-dependent output); ``charge`` is the
    budget in the budget's measure, ``event`` the DP event. ``release_id`` is the ledger entry
    that charged it (None: test mode, nothing charged).
    """

    value: float
    index: int
    quantile: Fraction
    epsilon: Fraction
    charge: Budget
    event: Any
    candidates: tuple[float, ...]
    score_sensitivity: int
    note: str = ""
    release_id: Optional[str] = None


def candidate_grid(lower: float, upper: float, n: int = 64, *, geometric: bool = True) -> list[float]:
    """A public candidate grid on [lower, upper] (geometric when lower > 0, else linear)."""
    if n < 2 or not (upper > lower):
        raise ConfigError("a candidate grid needs n >= 2 and upper > lower")
    if geometric and lower > 0:
        return [float(x) for x in np.geomspace(lower, upper, n)]
    return [float(x) for x in np.linspace(lower, upper, n)]


def _epsilon_of(budget: Union[Budget, Any]) -> tuple[Fraction, str]:
    if isinstance(budget, PureDP):
        return budget.epsilon, "pure_dp"
    if isinstance(budget, ZCDP):
        # a pure eps-DP mechanism is (eps^2 / 2)-zCDP: the largest rational eps <= sqrt(2 rho)
        two_rho = 2 * budget.rho
        eps = Fraction(math.sqrt(float(two_rho))).limit_denominator(10**9)
        while eps * eps > two_rho:
            eps -= Fraction(1, 10**9)
        if eps <= 0:
            raise ConfigError("rho too small for a DP quantile")
        return eps, "zcdp"
    return to_fraction(budget, "epsilon"), "pure_dp"


def dp_quantile(per_unit_values: Iterable[Sequence[float]], candidates: Sequence[float], quantile: Any,
                budget: Union[Budget, float, str, Fraction], *, max_rows_per_unit: int,
                relation: Union[Neighbouring, str] = Neighbouring.ADD_REMOVE_UNIT,
                source=None, engine=None, budget_id: Optional[str] = None) -> DpQuantile:
    """An epsilon-DP choice of the ``quantile`` of the rows' values among public ``candidates``.

    * ``per_unit_values``: the values of each unit's rows; each unit is truncated to its first
      ``max_rows_per_unit`` values before scoring (this is what bounds the sensitivity);
    * ``candidates``: a PUBLIC, data-independent grid (e.g. :func:`candidate_grid`);
    * ``quantile``: q in (0, 1), read exactly (0.99 is 99/100);
    * ``budget``: ``PureDP(epsilon)`` (or a number: epsilon), or ``ZCDP(rho)``: then
      epsilon = sqrt(2 rho) rounded down to a rational and the charge is ZCDP(epsilon^2/2);
    * ``engine`` and ``budget_id``: charge the choice through ``engine``'s ledger to budget
      ``budget_id`` (declared in the env's policies; the engine's principal needs
      ``publish:exploration`` on it). Reserve before drawing, commit after, one audit row;
      the noise comes from ``engine.source``. Without them nothing is charged and the call
      is refused outside test mode (``DP_SPARK_TEST_MODE=1``);
    * ``source``: the noise source, tests only (default: the engine's, else the production
      sampler).

    Privacy contract: (report noisy max theorem in the module docstring) the output index is
    epsilon-DP under ``relation`` for units contributing at most ``max_rows_per_unit`` rows
    after the truncation done here. Only ``value``/``index`` depend on the data; the noisy
    scores are never returned. The returned ``event`` is a discrete Laplace event with
    ``sensitivity`` = 2 * Delta and the scale used, so the accountant prices it at exactly
    epsilon (its L1-sensitivity field carries the 2 Delta of the theorem, not the L1 norm of
    the score vector, which report-noisy-max does not need); ``cells`` = 1 (one released
    value).
    """
    from dp_spark.core.events import NoiseEvent
    from dp_spark.governance.trust import require_test_mode
    from dp_spark.mechanisms.samplers import default_source
    from dp_spark.core.units import as_relation

    charge_to = ""  # the budget charged, set exactly when an engine is given
    if engine is None:
        require_test_mode("dp_quantile without engine= and budget_id= (a draw on data with no ledger charge)",
                          "pass engine=Engine(env, mode='exploration') and budget_id= so the choice is charged")
    elif not budget_id:
        raise ConfigError("dp_quantile(engine=...) needs the budget_id it charges")
    else:
        charge_to = budget_id
    if source is not None:
        require_test_mode(f"dp_quantile(source={type(source).__name__})", "omit source: the engine's is used")

    cands = [float(c) for c in candidates]
    if len(cands) < 2 or any(not math.isfinite(c) for c in cands) or sorted(cands) != cands:
        raise ConfigError("candidates must be a finite, increasing public grid of at least 2 values")
    q = to_fraction(quantile, "quantile")
    if not (0 < q < 1):
        raise ConfigError("quantile must be in (0, 1)")
    if isinstance(max_rows_per_unit, bool) or not isinstance(max_rows_per_unit, int) or max_rows_per_unit < 1:
        raise ConfigError("max_rows_per_unit must be an integer >= 1")
    rel = as_relation(relation)
    eps, measure = _epsilon_of(budget)
    if eps <= 0:
        raise ConfigError("epsilon must be > 0")
    a, b = q.numerator, q.denominator
    k = 1 if rel is Neighbouring.EVENT else max_rows_per_unit
    delta = max(a, b - a) * k * (2 if rel is Neighbouring.REPLACE_UNIT else 1)
    scale = Fraction(2 * delta) / eps

    # data: each unit truncated to its first K values (a per-unit function), NaN/null dropped
    event = NoiseEvent("discrete_laplace", "dp_quantile", scale, sensitivity=Fraction(2 * delta), cells=1)
    cost = event.natural_cost()  # PureDP(eps), exact
    if not isinstance(cost, PureDP):  # a discrete Laplace event is priced in pure DP
        raise MeasureMismatchError("the quantile's report-noisy-max event needs a pure-DP cost")
    charge: Budget = cost if measure == "pure_dp" else ZCDP(cost.epsilon ** 2 / 2)
    charged = None if engine is None else _reserve_quantile(engine, charge_to, charge, event)
    if source is None and engine is not None:
        source = engine.source

    rows = np.sort(np.concatenate([np.asarray(_clean(v)[:k], dtype=float) for v in per_unit_values] or [np.array([])]))
    n = int(rows.size)
    below = np.searchsorted(rows, np.asarray(cands), side="left")  # rows with value < c_j
    scores = [-abs(b * int(bj) - a * n) for bj in below]
    src = source or default_source()
    noise = src.discrete_laplace(scale, len(cands))
    noisy = [s + z for s, z in zip(scores, noise)]
    _, neg_best = max((v, -j) for j, v in enumerate(noisy))  # ties: lowest index
    best = -neg_best
    del rows, below, scores, noisy  # nothing data-dependent leaves but the index
    if charged is not None:
        _commit_quantile(engine, charge_to, charge, *charged)
    return DpQuantile(value=cands[best], index=best, quantile=q, epsilon=cost.epsilon, charge=charge,
                      event=event, candidates=tuple(cands), score_sensitivity=delta,
                      note="report noisy max, discrete Laplace(2*Delta/epsilon) on integer rank scores",
                      release_id=None if charged is None else charged[0])


QUANTILE_FAMILY = "dp_quantile"


def _reserve_quantile(engine, budget_id: str, charge: Budget, event) -> tuple[str, str]:
    """Authorise (exploration on ``budget_id``), register the budget and reserve the charge,
    before any noise is drawn. Returns (release id, owner token)."""
    import secrets as _secrets

    from dp_spark import __version__
    from dp_spark.core.events import canonical_json
    from dp_spark.governance.access import authorize

    ledger = engine.ledger
    authorize(engine.access, engine.principal, "publish", mode="exploration", budget_id=budget_id, ledger=ledger,
              spec_name=QUANTILE_FAMILY)
    if budget_id not in engine.policies:
        raise ConfigError(f"budget {budget_id!r} is not declared in {engine.env.policies}")
    ledger.register_budget(engine.policies[budget_id])
    release_id = f"dpq-{_secrets.token_hex(14)}"  # every call is a new draw: a new release
    owner = _secrets.token_hex(16)
    try:
        ledger.reserve(budget_id, release_id, charge, canonical_json(event), principal=engine.principal,
                       code_version=__version__, release_family=QUANTILE_FAMILY, owner_token=owner,
                       lease_seconds=engine.env.lease_seconds)
    except Exception as exc:
        from dp_spark.errors import BudgetExceededError

        if isinstance(exc, BudgetExceededError):
            ledger.append_audit(principal=engine.principal, action="publish:exploration", spec_name=QUANTILE_FAMILY,
                                spec_version=None, decision="refused_budget", release_id=None, charge_json=None,
                                detail=f"dp_quantile on budget {budget_id}")
        raise
    return release_id, owner


def _commit_quantile(engine, budget_id: str, charge: Budget, release_id: str, owner: str) -> None:
    import json as _json

    engine.ledger.commit(release_id, owner)
    engine.ledger.append_audit(principal=engine.principal, action="publish:exploration", spec_name=QUANTILE_FAMILY,
                               spec_version=None, decision="published", release_id=release_id,
                               charge_json=_json.dumps(charge.to_json(), sort_keys=True),
                               detail=f"dp_quantile on budget {budget_id}")


def _clean(values: Sequence[Any]) -> list[float]:
    return [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
