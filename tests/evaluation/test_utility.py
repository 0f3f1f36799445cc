"""Utility evaluation: interval coverage, reported vs measured clipping bias, error by group size.

Everything runs on synthetic partials (no Spark): the engine's noise (QueryPlan.noise) is repeated with
seeded exact noise (DP_SPARK_TEST_MODE=1). Statistical tests are seeded, so not flaky, and
each one is shown able to fail (an interval narrowed by 20% or a bias that ignores clipping
falls outside the asserted range).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from fractions import Fraction

import numpy as np
import pytest

os.environ.setdefault("DP_SPARK_TEST_MODE", "1")

from dp_spark.config import release_spec_from_dict  # noqa: E402
from dp_spark.evaluation import utility  # noqa: E402
from dp_spark.evaluation.bounds import bias_variance_table, candidate_grid, dp_quantile  # noqa: E402

REPEATS = 2000


def make_spec(metric, measure="pure_dp", budget=1, *, keys=5, k=1, linf=None, l0=1, value=(0, 500),
              assumed=1000, min_count=1, key_kind="values"):
    names = [f"r{i:02d}" for i in range(keys)]
    pk = {"values": names} if key_kind == "values" else {"dates": {"start": "2026-11-01",
                                                                   "end": f"2026-11-{keys:02d}"}}
    d = {
        "name": f"t_{metric}", "dataset": "demo_events",
        "privacy_unit": {"kind": "user", "column": "user_id"}, "metric": metric,
        "group_by": {"column": "region" if key_kind == "values" else "day", "public_keys": pk},
        "bounds": {"max_rows_per_unit": k, "max_partitions_per_unit": l0,
                   **({"max_rows_per_partition": linf} if linf else {})},
        "budget": {"id": "b", "measure": measure, ("epsilon" if measure == "pure_dp" else "rho"): budget},
    }
    if metric in ("sum", "mean"):
        d["value"] = {"column": "order_value", "lower": value[0], "upper": value[1]}
    if metric == "mean":
        d["mean"] = {"assumed_group_size": assumed, "min_count": min_count}
    return release_spec_from_dict(d)


def coverage_of(values, lows, highs, truth):
    return float(np.mean((lows <= truth) & (truth <= highs)))


def raw_repeats(spec, partials, seed, repeats=REPEATS):
    """(values, lows, highs) arrays [repeat, key] per statistic, via the engine's noise (QueryPlan.noise)."""
    from dp_spark.engine import plan_for
    from dp_spark.evaluation.utility import noise_by_key
    from dp_spark.mechanisms.samplers import SeededNoiseSource

    plan, src = plan_for(spec), SeededNoiseSource(seed)
    keys = list(spec.keys)
    out = {}
    for r in range(repeats):
        for c in noise_by_key(plan, partials, src):
            v, lo, hi = out.setdefault(c["statistic"], tuple(np.zeros((repeats, len(keys))) for _ in range(3)))
            i = keys.index(c["key"])
            v[r, i], lo[r, i], hi[r, i] = c["value"], c["ci_low"], c["ci_high"]
    return out


def narrowed(values, lows, highs, factor=0.8):
    """The same intervals, narrowed around the estimate: a miscalibrated variant."""
    return values - (values - lows) * factor, values + (highs - values) * factor


# --------------------------------------------------------------------------------------
# Coverage of the published 95% intervals (spec: 93%-97% of repeats)
# --------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("measure,budget", [("pure_dp", Fraction(1, 10)), ("zcdp", Fraction(1, 200))])
def test_count_interval_coverage(measure, budget):
    # scale 10 (Laplace) / sigma 10 (Gaussian): the integer grid barely coarsens the quantile
    spec = make_spec("count", measure, budget)
    partials, _ = utility.synthetic_partials(spec, {k: [[1]] * (200 + 100 * i) for i, k in enumerate(spec.keys)})
    frame, summary = utility.evaluate(spec, partials, repeats=REPEATS, seed=101)
    cov = summary["statistics"]["count"]["coverage"]
    assert 0.93 <= cov <= 0.97, cov
    # able to fail: 20% narrower intervals under-cover
    reps = raw_repeats(spec, partials, seed=101)["count"]
    lo, hi = narrowed(*reps)
    truth = np.array([partials[k]["rows"] for k in spec.keys], dtype=float)
    assert coverage_of(reps[0], lo, hi, truth) < 0.93
    assert summary["publishable"] is False


@pytest.mark.slow
@pytest.mark.parametrize("measure,budget", [("pure_dp", 1), ("zcdp", Fraction(1, 2))])
def test_sum_interval_coverage(measure, budget):
    spec = make_spec("sum", measure, budget, k=2)
    cells = {k: [[40.0, 60.25]] * (100 + 50 * i) for i, k in enumerate(spec.keys)}
    partials, _ = utility.synthetic_partials(spec, cells)
    _, summary = utility.evaluate(spec, partials, repeats=REPEATS, seed=202)
    cov = summary["statistics"]["sum"]["coverage"]
    assert 0.93 <= cov <= 0.97, cov
    reps = raw_repeats(spec, partials, seed=202)["sum"]
    lo, hi = narrowed(*reps)
    truth = np.array(list(utility.bounded_truth(spec, partials)["sum"].values()))
    assert coverage_of(reps[0], lo, hi, truth) < 0.93


# The mean: group size 20,000 rows per cell with the mean at the clamp midpoint (250 in
# [0, 500]); there the count noise hardly matters and the ratio is as close to linear as it
# gets, so an interval method that is accurate at all is accurate here.
MEAN_N = 20_000


def _mean_coverage(measure, budget, seed):
    spec = make_spec("mean", measure, budget, assumed=MEAN_N)
    partials, _ = utility.synthetic_partials(spec, {k: [[250.0]] * MEAN_N for k in spec.keys})
    _, summary = utility.evaluate(spec, partials, repeats=REPEATS, seed=seed)
    return summary["statistics"]["mean"]["coverage"]


@pytest.mark.slow
@pytest.mark.parametrize("measure,budget", [("pure_dp", 1), ("zcdp", Fraction(1, 2))])
def test_mean_interval_never_undercovers(measure, budget):
    assert _mean_coverage(measure, budget, seed=303) >= 0.93


@pytest.mark.slow
@pytest.mark.parametrize("measure,budget", [("pure_dp", 1), ("zcdp", Fraction(1, 2))])
def test_mean_interval_coverage_is_calibrated(measure, budget):
    assert _mean_coverage(measure, budget, seed=303) <= 0.97


@pytest.mark.slow
def test_day_over_day_interval_coverage():
    from dp_spark.engine import plan_for
    from dp_spark.evaluation.utility import noise_by_key
    from dp_spark.mechanisms.samplers import SeededNoiseSource

    spec = make_spec("distinct_units", "zcdp", Fraction(1, 20), keys=7, k=7, l0=7, linf=1, key_kind="dates")
    partials = {k: {"rows": 1000 + 37 * i, "units": 1000 + 37 * i} for i, k in enumerate(spec.keys)}
    true = [partials[k]["units"] for k in spec.keys]
    true_diff = np.diff(true)
    plan, src = plan_for(spec), SeededNoiseSource(404)
    hits = narrow_hits = total = 0
    for _ in range(1000):
        diffs = utility.trend_differences(noise_by_key(plan, partials, src))
        assert len(diffs) == len(spec.keys) - 1
        for d, t in zip(diffs, true_diff):
            hits += d["ci_low"] <= t <= d["ci_high"]
            h = (d["ci_high"] - d["ci_low"]) / 2 * 0.8
            narrow_hits += d["value"] - h <= t <= d["value"] + h
            total += 1
    assert 0.93 <= hits / total <= 0.97, hits / total
    assert narrow_hits / total < 0.93


# --------------------------------------------------------------------------------------
# Bias from clipping and truncation: reported (bounded - unbounded truth) vs measured
# --------------------------------------------------------------------------------------
@pytest.mark.slow
def test_reported_clipping_bias_matches_measured_sum():
    # known heavy tail: 10% of the orders are 2,000 with U = 500, the rest 100
    spec = make_spec("sum", "pure_dp", 1)
    n = 1000
    cells = {k: [[2000.0]] * (n // 10) + [[100.0]] * (n - n // 10) for k in spec.keys}
    partials, unbounded = utility.synthetic_partials(spec, cells)
    frame, summary = utility.evaluate(spec, partials, repeats=REPEATS, seed=505, unbounded=unbounded)
    expected_bias = -(n // 10) * (2000 - 500)  # exactly, by construction
    assert np.allclose(frame["clipping_bias"], expected_bias)
    se = frame["estimate_sd"] / math.sqrt(REPEATS)
    gap = (frame["measured_bias"] - frame["clipping_bias"]).abs()
    assert (gap < 5 * se).all(), (gap / se).max()
    # able to fail: a report that ignored clipping (bias 0) is far from what is measured
    assert (frame["measured_bias"].abs() > 100 * se).all()
    assert summary["statistics"]["sum"]["clipping_bias_mean"] == pytest.approx(expected_bias)
    # noise-only error is much smaller than the total error: the bias dominates here
    assert (frame["rmse_total"] > 10 * frame["rmse"]).all()


@pytest.mark.slow
def test_reported_clipping_bias_matches_measured_mean():
    spec = make_spec("mean", "zcdp", 1, assumed=5000)
    n = 5000
    cells = {k: [[2000.0]] * (n // 10) + [[100.0]] * (n - n // 10) for k in spec.keys}
    partials, unbounded = utility.synthetic_partials(spec, cells)
    frame, _ = utility.evaluate(spec, partials, repeats=REPEATS, seed=606, unbounded=unbounded)
    mean = frame[frame["statistic"] == "mean"]
    # bounded mean 0.9*100 + 0.1*500 = 140, unbounded 0.9*100 + 0.1*2000 = 290
    assert np.allclose(mean["true_bounded"], 140)
    assert np.allclose(mean["true_unbounded"], 290)
    assert np.allclose(mean["clipping_bias"], -150)
    se = mean["estimate_sd"] / math.sqrt(REPEATS)
    # the ratio estimator's own bias is O(Var(C)/n^2): negligible at n = 5,000
    assert ((mean["measured_bias"] - mean["clipping_bias"]).abs() < 5 * se + 0.01).all()
    assert (mean["measured_bias"].abs() > 100 * se).all()


def test_truncation_bias_of_a_count_is_reported_exactly():
    # 10% of the users have 30 rows with K = 10: 20 rows each are dropped
    spec = make_spec("count", "pure_dp", 1, k=10)
    cells = {k: [[1] * 30] * 50 + [[1]] * 450 for k in spec.keys}
    partials, unbounded = utility.synthetic_partials(spec, cells)
    frame, _ = utility.evaluate(spec, partials, repeats=50, seed=707, unbounded=unbounded)
    assert np.allclose(frame["true_unbounded"], 50 * 30 + 450)
    assert np.allclose(frame["true_bounded"], 50 * 10 + 450)
    assert np.allclose(frame["clipping_bias"], -50 * 20)


# --------------------------------------------------------------------------------------
# Error by group size, frame and summary shape
# --------------------------------------------------------------------------------------
def test_error_by_group_size_bucket_and_not_publishable():
    spec = make_spec("count", "pure_dp", Fraction(1, 2), keys=4)
    sizes = [5, 50, 500, 5000]
    partials, unbounded = utility.synthetic_partials(spec, {k: [[1]] * n for k, n in zip(spec.keys, sizes)})
    frame, summary = utility.evaluate(spec, partials, repeats=200, seed=808, unbounded=unbounded)
    assert frame.attrs["publishable"] is False and not frame["publishable"].any()
    assert summary["publishable"] is False and summary["mode"] == "exploration"
    assert list(frame["bucket"]) == ["[0, 10)", "[10, 100)", "[100, 1,000)", "[1,000, 10,000)"]
    rel = list(frame["rel_rmse"])
    assert rel == sorted(rel, reverse=True)  # relative error falls with group size
    buckets = {b["bucket"]: b for b in summary["by_bucket"]}
    assert set(buckets) == set(frame["bucket"])
    # absolute error does not depend on the group size (same noise everywhere)
    assert max(frame["rmse"]) / min(frame["rmse"]) < 1.5
    # no bounding here: no clipping bias
    assert np.allclose(frame["clipping_bias"], 0)


def test_evaluate_without_unbounded_truth_reports_nan_bias():
    spec = make_spec("sum", "pure_dp", 1, keys=2)
    partials, _ = utility.synthetic_partials(spec, {k: [[10.0]] * 10 for k in spec.keys})
    frame, _ = utility.evaluate(spec, partials, repeats=5, seed=1)
    assert frame["clipping_bias"].isna().all()
    assert frame["coverage"].notna().all()


def test_evaluate_refuses_missing_keys():
    from dp_spark.errors import ConfigError

    spec = make_spec("count", keys=3)
    with pytest.raises(ConfigError):
        utility.evaluate(spec, {"r00": {"rows": 1, "units": 1}}, repeats=2, seed=1)


# --------------------------------------------------------------------------------------
# Choosing bounds
# --------------------------------------------------------------------------------------
def test_bias_variance_table_exact_on_a_known_cell():
    spec = make_spec("sum", "pure_dp", 1, k=10, keys=1)
    # 100 users: 90 with one order of 100, 10 with 20 orders of 1,000
    units = [[100.0]] * 90 + [[1000.0] * 20] * 10
    t = bias_variance_table(spec, units, ks=[5, 20], uppers=[500, 1000])
    truth = 90 * 100 + 10 * 20 * 1000
    assert (t["truth"] == truth).all()
    row = t[(t.K == 5) & (t.U == 500)].iloc[0]
    assert row["expected"] == pytest.approx(90 * 100 + 10 * 5 * 500)
    assert row["sampling_variance"] == 0  # equal values: which 5 rows are kept does not matter
    row = t[(t.K == 20) & (t.U == 1000)].iloc[0]
    assert row["bias"] == pytest.approx(0)
    # the noise grows with K * U: the unbiased corner pays the most noise
    assert row["noise_variance"] == t["noise_variance"].max()
    assert (t["rmse"] ** 2).to_numpy() == pytest.approx((t["bias_sq"] + t["variance"]).to_numpy())
    assert t.attrs["publishable"] is False


def test_dp_quantile_charge_event_and_sensitivity():
    from dp_spark.accountant import Accountant
    from dp_spark.core.budget import PureDP, ZCDP
    from dp_spark.mechanisms.samplers import SeededNoiseSource

    rng = np.random.default_rng(3)  # test data, not noise
    units = [list(rng.lognormal(4, 1, size=int(rng.integers(1, 15)))) for _ in range(400)]
    cands = candidate_grid(1, 5000, 48)
    res = dp_quantile(units, cands, 0.95, PureDP(1), max_rows_per_unit=10, source=SeededNoiseSource(9))
    assert res.value in cands
    assert res.charge == PureDP(1)
    assert Accountant("pure_dp").cost(res.event) == PureDP(1)
    # a zCDP budget: eps = sqrt(2 rho) rounded down, charged eps^2/2 <= rho
    rz = dp_quantile(units, cands, 0.95, ZCDP(Fraction(1, 2)), max_rows_per_unit=10, source=SeededNoiseSource(9))
    assert rz.charge.fits_in(ZCDP(Fraction(1, 2))) and rz.charge.rho > Fraction(49, 100)
    assert Accountant("zcdp").cost(rz.event) == rz.charge

    # the score sensitivity claim: removing any one unit moves every score by <= Delta
    q = Fraction(95, 100)
    a, b = q.numerator, q.denominator

    def scores(us):
        rows = np.sort(np.concatenate([np.asarray(u[:10]) for u in us]))
        below = np.searchsorted(rows, np.asarray(cands), side="left")
        return np.array([-abs(b * int(x) - a * rows.size) for x in below])

    base = scores(units)
    worst = max(np.abs(base - scores(units[:i] + units[i + 1:])).max() for i in range(0, 400, 7))
    heavy = units + [[1e6] * 50]  # a unit with 50 rows (truncated to 10) far above the grid
    worst = max(worst, np.abs(scores(heavy) - base).max())
    assert worst <= res.score_sensitivity == max(a, b - a) * 10


def test_dp_quantile_concentrates_near_the_true_quantile():
    from dp_spark.core.budget import PureDP
    from dp_spark.mechanisms.samplers import SeededNoiseSource

    units = [[float(v)] for v in range(1, 10_001)]  # 10,000 units, one row each: q90 = 9,000
    cands = [float(c) for c in range(500, 10_001, 500)]
    src = SeededNoiseSource(12)
    picks = [dp_quantile(units, cands, 0.9, PureDP(1), max_rows_per_unit=1, source=src).value for _ in range(30)]
    assert np.median(picks) == pytest.approx(9000, abs=500)


# --------------------------------------------------------------------------------------
# Trust (issue 13, item 14): a draw on data is charged, an exact value is test-only
# --------------------------------------------------------------------------------------
def _quantile_engine(tmp_path, principal):
    from dp_spark.config import env_from_dict
    from dp_spark.engine import Engine
    from dp_spark.governance.access import access_policy_from_dict
    from dp_spark.ledger import open_ledger

    root = Path(__file__).resolve().parents[2]
    env = env_from_dict({"name": "prod", "warehouse": str(tmp_path / "wh"), "datasets": {},
                         "policies": str(root / "conf/policies/budgets.yaml")}, root=tmp_path)
    access = access_policy_from_dict({"version": 1, "releases_dir": str(tmp_path), "principals": {
        "analyst_alice": {"roles": ["analyst"], "exploration_budgets": ["demo_events_user_pure"]},
        "publisher_bob": {"roles": ["publisher"]}}})
    ledger = open_ledger(f"sqlite:{tmp_path}/ledger.db", key=b"quantile-test-key-0123456789")
    return Engine(env, spark=object(), ledger=ledger, principal=principal, access=access, mode="exploration"), ledger


def test_dp_quantile_with_an_engine_is_charged_and_audited(tmp_path):
    from dp_spark.core.budget import PureDP
    from dp_spark.errors import PermissionDeniedError

    units = [[float(v)] for v in range(1, 2001)]
    cands = [float(c) for c in range(100, 2001, 100)]
    eng, led = _quantile_engine(tmp_path, "analyst_alice")
    res = dp_quantile(units, cands, 0.5, PureDP(Fraction(1, 2)), max_rows_per_unit=1, engine=eng,
                      budget_id="demo_events_user_pure")
    (entry,) = led.entries("demo_events_user_pure")
    assert entry.release_id == res.release_id and entry.state == "committed"
    assert entry.charge == PureDP(Fraction(1, 2)) and entry.release_family == "dp_quantile"
    assert entry.principal == "analyst_alice"
    last = led.audit_rows(limit=1)[0]
    assert (last.decision, last.release_id, last.action) == ("published", res.release_id, "publish:exploration")
    # a second call is a second release, a second charge
    dp_quantile(units, cands, 0.5, PureDP(Fraction(1, 2)), max_rows_per_unit=1, engine=eng,
                budget_id="demo_events_user_pure")
    assert len(led.entries("demo_events_user_pure")) == 2

    # a principal who may not explore that budget: refused (audited) before any charge
    eng2, led2 = _quantile_engine(tmp_path / "b", "publisher_bob")
    with pytest.raises(PermissionDeniedError):
        dp_quantile(units, cands, 0.5, PureDP(1), max_rows_per_unit=1, engine=eng2, budget_id="demo_events_user_pure")
    assert led2.audit_rows()[-1].decision == "refused_permission"
    assert led2.budget_ids() == [] or led2.entries("demo_events_user_pure") == []


def test_dp_quantile_refuses_an_uncharged_draw_outside_test_mode(monkeypatch, tmp_path):
    from dp_spark.core.budget import PureDP
    from dp_spark.errors import TestModeError

    units = [[1.0], [2.0], [3.0]]
    monkeypatch.delenv("DP_SPARK_TEST_MODE", raising=False)
    with pytest.raises(TestModeError, match="engine="):
        dp_quantile(units, [1.0, 2.0, 3.0], 0.5, PureDP(1), max_rows_per_unit=1)
    with pytest.raises(TestModeError):
        bias_variance_table(None, units, ks=[1])
    from dp_spark.evaluation.utility import exact_partials, unbounded_truth

    with pytest.raises(TestModeError):
        exact_partials(None, None)
    with pytest.raises(TestModeError):
        unbounded_truth(None, None)
