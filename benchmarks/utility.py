"""Utility benchmark: RMSE of DAU and of AOV per region at epsilon 0.5, 1 and 2 on the demo data,
with the engine's budget split of the mean and with a naive 50/50 split, side by side.

    .venv/bin/python benchmarks/utility.py [--env conf/envs/local.yaml] [--repeats 1000]
        [--measure pure_dp|zcdp] [--users N]
    .venv/bin/python benchmarks/utility.py --peer-job [--rows 2000000] [--runs 20]

``--peer-job``: the peers' utility job (2M events, n/10 users in many regions; distinct users,
sum and mean of order_value per region, <= 5 rows per user, clamp [0, 500], pure epsilon = 1)
as ONE multi-statistic release: exact partials once through the engine's own Spark pass, then
``--runs`` releases' noise with the production sampler through the engine's own post-processing
(``QueryPlan.noise``). Prints each statistic's RMSE against the bounded ("capped") truth,
pooled over regions and runs, beside the peers' figures measured on that job (issue 12).

How:
* exact partials of the demo data are computed ONCE per spec by the engine's own Spark
  bounding (``dp_spark.evaluation.utility.exact_partials``), plus the unbounded truth;
* for each epsilon the release is re-planned and its noise repeated over those partials with
  the production sampler (no seed): the DAU through ``utility.evaluate`` (the engine's
  ``QueryPlan.noise``, ``--repeats`` times); the AOV through the same estimator vectorised in numpy
  (``mean_rmse``, ``--fast-repeats`` draws), cross-checked against ``utility.evaluate`` on the
  engine's plan;
* the verdict compares the two splits on common random numbers (``paired_mean_errors``,
  ``--paired-repeats`` draws: the same uniforms drive both plans' noise by inverse CDF), so a
  difference of 0.1% in MSE is resolved; independent draws could not tell 1% apart;
* ``--measure pure_dp`` (default): pure-DP variants of the two specs (``charge = PureDP(eps)``,
  discrete Laplace), so "epsilon" means exactly epsilon. ``--measure zcdp``: the specs' own zCDP
  measure with rho = ``calibration.approx_to_zcdp_rho(eps, 1e-7)`` (the largest rho whose
  (eps, 1e-7) statement is within eps; OpenDP's conversion), discrete Gaussian.

Prints, per epsilon: the DAU RMSE (distinct users per day; no split, one statistic); per region
the AOV RMSE (noise only: against the bounded truth, which both splits share) with the engine's
split, with 50/50 and their ratio; the clipping/truncation bias of the AOV (bounded - unbounded
truth, identical for both splits); the paired MSE gain of the engine's split with 3 standard
errors; and the verdict on the target: the engine's split is never significantly worse than
50/50 and significantly better (gain > 3 standard errors) on every small region.
Exploration: reads true values of the demo data, prints errors only; nothing is published or
charged.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import tempfile
import time
from datetime import date
from fractions import Fraction
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# a benchmark runs on throwaway data and warehouses: test mode lets it name its principal and
# read exact values of its own generated data (the noise is still OpenDP's production sampler)
os.environ.setdefault("DP_SPARK_TEST_MODE", "1")

EPSILONS = (0.5, 1.0, 2.0)
SMALL_SHARE = 0.25  # "small regions": the quarter of regions with the fewest bounded rows


def _demo_frame(spark, env, users):
    from dp_spark.demo_data import generate_events
    from dp_spark.delta.release_table import table_exists

    demo = dict(env.demo)
    location = env.dataset_location(demo.get("dataset", "demo_events"))
    if users is None and table_exists(spark, location):
        return spark.read.format("delta").load(location), location
    start = demo.get("start_date", date(2026, 11, 1))
    start = start if isinstance(start, date) else date.fromisoformat(str(start))
    n = users or int(demo.get("users", 20000))
    path = str(Path(tempfile.mkdtemp(prefix="dp_utility_bench_")) / "demo_events")
    generate_events(spark, n_users=n, days=int(demo.get("days", 30)), start_date=start,
                    seed=int(demo.get("seed", 7))).write.format("delta").save(path)
    return spark.read.format("delta").load(path), path


def _charge(measure: str, eps: float):
    from dp_spark.core.budget import PureDP, ZCDP
    from dp_spark.mechanisms.calibration import approx_to_zcdp_rho

    if measure == "pure_dp":
        return PureDP(eps)
    return ZCDP(approx_to_zcdp_rho(eps, 1e-7))


def _mean_errors(plan, partials, draw):
    """Errors (repeats x keys) of the engine's mean estimator under ``plan``: noisy normalised
    sum / max(noisy count, min_count) + midpoint, clamped to [L, U] (the formula of
    ``mechanisms.mean.mean_from_noisy``), vectorised in numpy. ``draw(plan_statistic)`` returns
    that statistic's noise, an array (repeats x keys) in grid units."""
    import numpy as np

    spec = plan.spec
    by = {c.kind: p for c, p in zip(plan.components, plan.statistics)}  # rows, nsum
    keys = list(spec.keys)
    k = spec.value.grid_exponent
    unit = 2.0 ** k
    lo, hi = float(spec.value.lower), float(spec.value.upper)
    mid = (lo + hi) / 2
    mid_fixed = int((spec.value.lower + spec.value.upper) / 2 / (Fraction(2) ** k))
    rows = np.array([partials[x]["rows"] for x in keys], dtype=float)
    norm = np.array([partials[x]["sum_fixed"] - partials[x]["rows"] * mid_fixed for x in keys], dtype=float)
    truth = np.array([partials[x]["sum_fixed"] for x in keys], dtype=float) * unit / np.maximum(rows, 1)
    zc, zs = draw(by["rows"]), draw(by["nsum"])
    est = np.clip(mid + (norm + zs) * unit / np.maximum(rows + zc, spec.mean.min_count), lo, hi)
    return est - truth


def mean_rmse(plan, partials, repeats: int, source):
    """Noise-only RMSE of each region's mean under ``plan`` (:func:`_mean_errors`) over
    ``repeats`` draws of the engine's own sampler at the plan's scales. Cross-checked against
    ``utility.evaluate`` (the engine's ``QueryPlan.noise``) in the output."""
    import numpy as np

    keys = list(plan.spec.keys)

    def draw(p):
        z = source.draw(p.mechanism, p.scale, repeats * len(keys))
        return np.array(z, dtype=float).reshape(repeats, len(keys))

    rmse = np.sqrt(np.mean(_mean_errors(plan, partials, draw) ** 2, axis=0))
    return dict(zip(keys, rmse))


def _coupled(mechanism: str, scale: float, u1, u2):
    """Draws of the plan's noise from COMMON uniforms (u1, u2), by inverse CDF, so that two plans
    that differ only in their scales see the same underlying randomness (common random numbers:
    their error difference is then measured with a far smaller Monte Carlo error).

    discrete_laplace(t): the difference of two i.i.d. geometrics on {0, 1, ...} with ratio
    q = exp(-1/t), each floor(-t log U): exactly the discrete Laplace. discrete_gaussian(sigma):
    the rounded normal sigma * Phi^-1(u1), within a negligible total variation of the discrete
    Gaussian at the scales here (sigma >> 1). Evaluation noise only: never used for a release.
    """
    import numpy as np
    from scipy.special import ndtri

    if mechanism == "discrete_laplace":
        return np.floor(-scale * np.log(u1)) - np.floor(-scale * np.log(u2))
    return np.rint(scale * ndtri(u1))


def paired_mean_errors(plans, partials, repeats: int, seed: int):
    """Errors (repeats x keys) of each plan's mean estimator, all driven by the same uniforms.

    The estimator is the engine's (see :func:`mean_rmse`); only the noise differs: coupled
    draws (:func:`_coupled`) instead of the production sampler, so that the difference between
    two budget splits is resolved at the ~0.1% level with a few 10^4 draws."""
    import numpy as np

    rng = np.random.default_rng(seed)  # benchmark randomness (evaluation), not release noise
    shape = (repeats, len(plans[0].spec.keys))
    u = {name: (1.0 - rng.random(shape), 1.0 - rng.random(shape)) for name in ("rows", "nsum")}  # (0, 1]

    def draw(p):  # a component's plan is named by its kind ("rows", "nsum:<column>[L,U]")
        return _coupled(p.mechanism, float(p.scale), *u[p.statistic.split(":")[0]])

    return [_mean_errors(plan, partials, draw) for plan in plans]


# RMSE vs the capped truth on the peer job at pure epsilon = 1, 20 runs (issue 12's figures)
PEERS = {"dp_spark before (three single-metric releases)": {"aov": 0.370, "revenue": 14_100},
         "PipelineDP": {"aov": 0.235, "revenue": 11_840}}


def peer_job(rows: int, runs: int, l0: int = 20) -> int:
    import numpy as np

    from dp_spark.backends.spark import build_query_partials, collect_query_partials
    from dp_spark.config import release_spec_from_dict
    from dp_spark.demo_data import generate_events
    from dp_spark.mechanisms.samplers import default_source
    from dp_spark.spark import get_or_create_session
    from dp_spark.statistics.components import Component
    from dp_spark.statistics.plan import plan_query

    spark = get_or_create_session("dp_spark.benchmark.utility", master="local[2]",
                                  extra_conf={"spark.driver.memory": "8g"})
    spark.sparkContext.setLogLevel("ERROR")
    regions = [f"region_{i:02d}" for i in range(1, 21)]
    value = {"column": "order_value", "lower": 0, "upper": 500}
    spec = release_spec_from_dict({
        "name": "peer_job", "dataset": "bench", "privacy_unit": {"kind": "user", "column": "user_id"},
        "group_by": [{"column": "region", "public_keys": {"values": regions}}],
        "bounds": {"max_rows_per_unit": 5, "max_partitions_per_unit": l0},
        "statistics": [{"name": "users", "kind": "distinct_units"}, dict(value, name="revenue", kind="sum"),
                       dict(value, name="aov", kind="mean")],
        "budget": {"id": "bench", "measure": "pure_dp", "epsilon": 1}}, "peer_job")
    plan = plan_query(spec)
    t0 = time.monotonic()
    df = generate_events(spark, n_users=rows // 10, days=30, start_date=date(2026, 11, 1), seed=3,
                         mean_rows_per_user=10)
    partials = collect_query_partials(build_query_partials(df, plan, "benchmark-salt"), plan)
    print(f"exact partials of {rows:,} rows in {time.monotonic() - t0:.0f}s; split "
          f"{ {c.name: str(f) for c, f in zip(plan.components, plan.fractions)} }", flush=True)
    clamp = spec.statistics[1].clamp
    unit = float(Fraction(2) ** clamp.grid_exponent)
    truth = {}
    for i, r in enumerate(regions):
        p = partials.get(i, {})
        total = Component("sum", clamp).true_values(p)[0] * unit
        n = p.get("dp_rows", 0)
        truth[("users", r)] = p.get("dp_units", 0)
        truth[("revenue", r)] = total
        truth[("aov", r)] = total / n if n else float("nan")
    # the region-sample expectation of the users per region: a user with r distinct regions
    # keeps min(r, L0) of them, each region with probability min(1, L0 / r) (plain Spark,
    # exact data: benchmark only)
    from pyspark.sql import functions as F

    l0 = spec.bounds.max_partitions_per_unit
    per_user = df.select("user_id", "region").distinct()
    n_regions = per_user.groupBy("user_id").agg(F.count(F.lit(1)).alias("r"))
    expect = {row["region"]: float(row["e"]) for row in per_user.join(n_regions, "user_id").groupBy("region")
              .agg(F.sum(F.least(F.lit(1.0), F.lit(float(l0)) / F.col("r"))).alias("e")).collect()}
    source = default_source()
    users_noisy: dict = {}
    errs: dict = {}
    for _ in range(runs):
        for c in plan.noise(partials, source):
            errs.setdefault((c["statistic"], c["key"]), []).append(c["value"] - truth[(c["statistic"], c["key"])])
            if c["statistic"] == "users":
                users_noisy.setdefault(c["key"], []).append(c["value"])
    print(f"RMSE vs the capped truth, pure epsilon = 1, {runs} runs over {len(regions)} regions "
          "(pooled: root of the mean squared error over all regions and runs; per-region mean: the "
          "mean over regions of each region's RMSE; smallest / largest region):")
    sizes = {r: partials.get(i, {}).get("dp_rows", 0) for i, r in enumerate(regions)}
    small, large = min(sizes, key=sizes.get), max(sizes, key=sizes.get)
    for stat in ("users", "revenue", "aov"):
        per = {r: float(np.sqrt(np.mean(np.square(errs[(stat, r)])))) for r in regions}
        pooled = float(np.sqrt(np.mean([np.mean(np.square(errs[(stat, r)])) for r in regions])))
        peers = "  ".join(f"{k}: {v[stat]:,}" for k, v in PEERS.items() if stat in v)
        print(f"  {stat:8s} dp_spark pooled {pooled:,.3f}  per-region mean {float(np.mean(list(per.values()))):,.3f}"
              f"  smallest ({sizes[small]:,} rows) {per[small]:,.3f}  largest ({sizes[large]:,} rows) "
              f"{per[large]:,.3f}   | {peers}")
    ratio = {r: float(np.mean(users_noisy[r])) / expect[r] for r in regions}
    exact = {r: truth[("users", r)] / expect[r] for r in regions}
    sd = float(np.sqrt(np.mean([np.var(users_noisy[r]) for r in regions])))
    print(f"users per region vs the region-sample expectation (each user keeps L0 = {l0} of its regions): "
          f"published mean over {runs} runs / expectation = {np.mean(list(ratio.values())):.4f} "
          f"(min {min(ratio.values()):.4f}, max {max(ratio.values()):.4f}); exact partial / expectation = "
          f"{np.mean(list(exact.values())):.4f}; noise sd {sd:.1f} users on ~{np.mean(list(expect.values())):,.0f}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default=str(ROOT / "conf/envs/local.yaml"))
    ap.add_argument("--repeats", type=int, default=2000, help="repeats of the engine's QueryPlan.noise path")
    ap.add_argument("--fast-repeats", type=int, default=20000,
                    help="draws of the vectorised AOV estimator (resolves ~1%% RMSE differences)")
    ap.add_argument("--paired-repeats", type=int, default=50000,
                    help="draws of the paired (common random numbers) comparison behind the verdict")
    ap.add_argument("--measure", choices=("pure_dp", "zcdp"), default="pure_dp")
    ap.add_argument("--users", type=int, default=None,
                    help="generate fresh demo data with this many users (default: the env's demo table)")
    ap.add_argument("--peer-job", action="store_true", help="the peers' job instead (see the docstring)")
    ap.add_argument("--rows", type=int, default=2_000_000, help="--peer-job: rows of generated events")
    ap.add_argument("--runs", type=int, default=20, help="--peer-job: noisy releases per statistic")
    ap.add_argument("--l0", type=int, default=20, help="--peer-job: regions per user (L0; the peers' job: 20)")
    args = ap.parse_args(argv)
    if args.peer_job:
        return peer_job(args.rows, args.runs, args.l0)

    from dp_spark.config import load_env, load_release_spec
    from dp_spark.engine import plan_for
    from dp_spark.evaluation import utility
    from dp_spark.mechanisms.samplers import default_source
    from dp_spark.spark import get_or_create_session

    source = default_source()

    env = load_env(args.env)
    spark = get_or_create_session("dp_spark.benchmark.utility", master=env.master, extra_conf=dict(env.spark_conf))
    spark.sparkContext.setLogLevel("ERROR")
    df, location = _demo_frame(spark, env, args.users)
    dau = load_release_spec(ROOT / "conf/releases/dau_daily.yaml")
    aov = load_release_spec(ROOT / "conf/releases/aov_by_region.yaml")
    t0 = time.monotonic()
    dau_parts = utility.exact_partials(df, dau)
    aov_parts = utility.exact_partials(df, aov)
    aov_unbounded = utility.unbounded_truth(df, aov)
    print(f"demo data: {location}; partials in {time.monotonic() - t0:.1f}s "
          f"({len(dau_parts)} days, {len(aov_parts)} regions); repeats {args.repeats}; measure {args.measure}"
          + ("" if args.measure == "pure_dp" else " (rho = approx_to_zcdp_rho(eps, 1e-7))"))

    regions = list(aov.keys)
    sizes = {k: aov_parts[k]["rows"] for k in regions}
    small = set(sorted(regions, key=lambda k: sizes[k])[: max(1, int(len(regions) * SMALL_SHARE))])
    verdicts = []
    for eps in EPSILONS:
        charge = _charge(args.measure, eps)
        d_spec = dataclasses.replace(dau, charge=charge)
        a_spec = dataclasses.replace(aov, charge=charge)
        d_frame, _ = utility.evaluate(d_spec, dau_parts, repeats=args.repeats)
        eng_plan = plan_for(a_spec)
        half_plan = utility.plan_with_mean_split(a_spec, "1/2")
        # the engine's own path (QueryPlan.noise) at --repeats, for the cross-check and the bias
        e_frame, _ = utility.evaluate(a_spec, aov_parts, repeats=args.repeats, plan=eng_plan, unbounded=aov_unbounded)
        e = e_frame[e_frame.statistic == "mean"].set_index("key")
        r_eng = mean_rmse(eng_plan, aov_parts, args.fast_repeats, source)
        r_half = mean_rmse(half_plan, aov_parts, args.fast_repeats, source)
        # the verdict: paired (common random numbers) difference of the mean squared errors
        err_eng, err_half = paired_mean_errors([eng_plan, half_plan], aov_parts, args.paired_repeats,
                                               seed=int(eps * 1000))
        dsq = err_eng ** 2 - err_half ** 2  # per draw and region
        mse_half = (err_half ** 2).mean(axis=0)
        gain = -dsq.mean(axis=0) / mse_half  # relative MSE reduction of the engine's split
        gain_se = dsq.std(axis=0, ddof=1) / math.sqrt(args.paired_repeats) / mse_half
        # for information: the best fixed split for THIS data (paired draws, splits 0.40..0.70)
        grid = [Fraction(f, 100) for f in range(40, 71, 2)]
        errs = paired_mean_errors([utility.plan_with_mean_split(a_spec, f) for f in grid], aov_parts,
                                  max(1000, args.paired_repeats // 5), seed=int(eps * 1000) + 1)
        best_f = grid[min(range(len(grid)), key=lambda i: float((errs[i] ** 2).mean()))]
        agree = max(abs(e.loc[k, "rmse"] / r_eng[k] - 1) for k in regions)
        print()
        print(f"=== epsilon {eps:g} ({charge}) ===")
        print(f"DAU (distinct users/day, {len(dau_parts)} days): RMSE {d_frame['rmse'].mean():.2f} users "
              f"(relative {d_frame['rel_rmse'].median():.2%} median); coverage {d_frame['coverage'].mean():.1%}; "
              "no budget split (one statistic)")
        print(f"AOV per region: engine split to the sum = {eng_plan.mean_split} vs naive 1/2 "
              f"(for information: the best fixed split for THIS data, total MSE over regions, is {best_f})")
        print(f"   RMSE over {args.fast_repeats:,} draws; QueryPlan.noise cross-check ({args.repeats:,} repeats) "
              f"agrees within {agree:.1%}; clip bias = bounded - raw mean (the raw data holds absurd 1e9 orders)")
        print(f"   paired: MSE gain of the engine's split over 50/50 from {args.paired_repeats:,} draws on common "
              "random numbers, +- 3 standard errors (the verdict uses these)")
        print(f"{'region':>10} {'rows':>7} {'true AOV':>9} {'clip bias':>12} {'RMSE engine':>12} {'RMSE 50/50':>11} "
              f"{'ratio':>6} {'paired MSE gain':>18}")
        worse, small_gain = [], []
        for i, k in sorted(enumerate(regions), key=lambda ik: sizes[ik[1]]):
            re_, rh = r_eng[k], r_half[k]
            g, g3 = float(gain[i]), 3 * float(gain_se[i])
            if g < -g3:  # significantly worse
                worse.append(k)
            if k in small:
                small_gain.append(g > g3)  # significantly better
            mark = " *" if k in small else ""
            print(f"{k:>10} {sizes[k]:>7,} {e.loc[k, 'true_bounded']:>9.2f} {e.loc[k, 'clipping_bias']:>12.1f} "
                  f"{re_:>12.3f} {rh:>11.3f} {re_ / rh:>6.3f} {g:>+8.2%} +- {g3:.2%}{mark}")
        never_worse = not worse
        better_small = all(small_gain)
        verdicts.append((eps, never_worse, better_small))
        print(f"(* = the {len(small)} smallest regions) engine never worse than 50/50: {never_worse}"
              + (f" (worse on {worse})" if worse else "") + f"; better on every small region: {better_small}")
    print()
    print("target (engine split never worse than 50/50 and better on small regions): "
          + ", ".join(f"eps {e:g}: {'met' if a and b else 'NOT met'}" for e, a, b in verdicts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
