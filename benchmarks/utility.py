"""Utility benchmark: RMSE of DAU and of AOV per region at epsilon 0.5, 1 and 2 on the demo data,
with the engine's budget split of the mean and with a naive 50/50 split, side by side.

    .venv/bin/python benchmarks/utility.py [--env conf/envs/local.yaml] [--repeats 1000]
        [--measure pure_dp|zcdp] [--users N]

How:
* exact partials of the demo data are computed ONCE per spec by the engine's own Spark
  bounding (``dp_spark.evaluation.utility.exact_partials``), plus the unbounded truth;
* for each epsilon the release is re-planned and its noise repeated ``--repeats`` times over
  those partials (``utility.evaluate``: the engine's ``noise_cells``, nothing else), with the
  production sampler (no seed);
* ``--measure pure_dp`` (default): pure-DP variants of the two specs (``charge = PureDP(eps)``,
  discrete Laplace), so "epsilon" means exactly epsilon. ``--measure zcdp``: the specs' own zCDP
  measure with rho = ``calibration.approx_to_zcdp_rho(eps, 1e-7)`` (the largest rho whose
  (eps, 1e-7) statement is within eps; OpenDP's conversion), discrete Gaussian.

Prints, per epsilon: the DAU RMSE (distinct users per day; no split, one statistic); per region
the AOV RMSE (noise only: against the bounded truth, which both splits share) with the engine's
split, with 50/50 and their ratio; the clipping/truncation bias of the AOV (bounded - unbounded
truth, identical for both splits); and the verdict on the target: the engine's split is never
worse than 50/50 (within 3 Monte Carlo standard errors) and better on the small regions.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

EPSILONS = (0.5, 1.0, 2.0)
SMALL_SHARE = 0.25  # "small regions": the quarter of regions with the fewest bounded rows


def _demo_frame(spark, env, users):
    from dp_spark.demo_data import generate_events
    from dp_spark.release.writer import table_exists

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
    from dp_spark.budget import PureDP, ZCDP
    from dp_spark.mechanisms.calibration import approx_to_zcdp_rho

    if measure == "pure_dp":
        return PureDP(eps)
    return ZCDP(approx_to_zcdp_rho(eps, 1e-7))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default=str(ROOT / "conf/envs/local.yaml"))
    ap.add_argument("--repeats", type=int, default=1000)
    ap.add_argument("--measure", choices=("pure_dp", "zcdp"), default="pure_dp")
    ap.add_argument("--users", type=int, default=None,
                    help="generate fresh demo data with this many users (default: the env's demo table)")
    args = ap.parse_args(argv)

    import numpy as np

    from dp_spark.config import load_env, load_release_spec
    from dp_spark.engine import plan_release
    from dp_spark.evaluation import utility
    from dp_spark.spark import get_or_create_session

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
        eng_plan = plan_release(a_spec)
        half_plan = utility.plan_with_mean_split(a_spec, "1/2")
        e_frame, _ = utility.evaluate(a_spec, aov_parts, repeats=args.repeats, plan=eng_plan, unbounded=aov_unbounded)
        h_frame, _ = utility.evaluate(a_spec, aov_parts, repeats=args.repeats, plan=half_plan, unbounded=aov_unbounded)
        e = e_frame[e_frame.statistic == "mean"].set_index("key")
        h = h_frame[h_frame.statistic == "mean"].set_index("key")
        print()
        print(f"=== epsilon {eps:g} ({charge}) ===")
        print(f"DAU (distinct users/day, {len(dau_parts)} days): RMSE {d_frame['rmse'].mean():.2f} users "
              f"(relative {d_frame['rel_rmse'].median():.2%} median); coverage {d_frame['coverage'].mean():.1%}")
        print(f"AOV per region: engine split to the sum = {eng_plan.mean_split} vs naive 1/2")
        print(f"{'region':>10} {'rows':>7} {'true AOV':>9} {'clip bias':>10} {'RMSE engine':>12} {'RMSE 50/50':>11} {'ratio':>6}")
        worse, small_gain = [], []
        for k in sorted(regions, key=lambda k: sizes[k]):
            re_, rh = e.loc[k, "rmse"], h.loc[k, "rmse"]
            # MC standard error of an RMSE estimate ~ RMSE / sqrt(2 R); of the difference ~ sqrt(2) x that
            se = math.hypot(re_, rh) / math.sqrt(2 * args.repeats)
            if re_ > rh + 3 * se:
                worse.append(k)
            if k in small:
                small_gain.append(rh - re_ > 3 * se)
            mark = " *" if k in small else ""
            print(f"{k:>10} {sizes[k]:>7,} {e.loc[k, 'true_bounded']:>9.2f} {e.loc[k, 'clipping_bias']:>10.2f} "
                  f"{re_:>12.3f} {rh:>11.3f} {re_ / rh:>6.2f}{mark}")
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
