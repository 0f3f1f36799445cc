"""A 90-day cumulative series: the binary-tree mechanism vs 90 independent daily releases.

    .venv/bin/python benchmarks/stream_vs_daily.py [--days 90] [--rho 0.5] [--reps 2000]

Both publish the running total S_t = x_1 + ... + x_t of a daily count, every day for 90 days,
for the same total budget rho (zCDP, discrete Gaussian noise), when one unit (user) adds at
most 1 to each of at most L0 days of the 90:

* tree: ``stream: {horizon_days: 90}``, one charge rho for the horizon; the node vector's
  sensitivity derived by :func:`dp_spark.mechanisms.tree.node_sensitivity`; the point t sums
  popcount(t) node noises;
* daily: 90 releases of the day's count, each charged rho / 90 (what a daily refresh of a
  day-keyed spec does), sensitivity 1 each; the running total at day t sums t daily noises.

Prints, for L0 = 1 ("distinct users ever seen": each user counted on the first day), 7, 30
and 90, the noise standard deviation of the running total at days 1, 30 and 90: the analytic
value and the value measured over ``reps`` seeded runs of the project's exact samplers
(DP_SPARK_TEST_MODE=1 is set here: the seeded source is test-only).
"""

from __future__ import annotations

import argparse
import math
import os
from fractions import Fraction

import numpy as np

os.environ.setdefault("DP_SPARK_TEST_MODE", "1")

from dp_spark.core.budget import ZCDP  # noqa: E402
from dp_spark.mechanisms import accuracy, calibration, tree  # noqa: E402
from dp_spark.mechanisms.samplers import DISCRETE_GAUSSIAN, SeededNoiseSource  # noqa: E402

DAYS_SHOWN = (1, 30, 90)


def measured_tree(cal: tree.TreeCalibration, reps: int, src: SeededNoiseSource, days) -> list[float]:
    nodes = tree.tree_nodes(cal.horizon)
    index = {n: i for i, n in enumerate(nodes)}
    draws = src.draw_array(cal.mechanism, cal.scale, reps * len(nodes)).reshape(reps, len(nodes))
    out = []
    for t in days:
        cols = [index[n] for n in tree.prefix_nodes(t, cal.horizon)]
        out.append(float(np.sqrt(np.mean(draws[:, cols].sum(axis=1).astype(np.float64) ** 2))))
    return out


def measured_daily(sigma: Fraction, horizon: int, reps: int, src: SeededNoiseSource, days) -> list[float]:
    draws = src.draw_array(DISCRETE_GAUSSIAN, sigma, reps * horizon).reshape(reps, horizon)
    running = np.cumsum(draws.astype(np.float64), axis=1)
    return [float(np.sqrt(np.mean(running[:, t - 1] ** 2))) for t in days]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=int, default=90)
    ap.add_argument("--rho", type=str, default="0.5")
    ap.add_argument("--reps", type=int, default=2000)
    args = ap.parse_args()
    horizon, rho = args.days, Fraction(args.rho)
    days = [d for d in DAYS_SHOWN if d <= horizon]
    src = SeededNoiseSource(20261206)
    # daily: each day's count (sensitivity 1) charged rho / horizon
    sigma_day = Fraction(calibration.gaussian_sigma_zcdp(rho / horizon, 1))
    var_day = accuracy.discrete_gaussian_variance(sigma_day)
    daily_sd = [math.sqrt(t * var_day) for t in days]
    daily_meas = measured_daily(sigma_day, horizon, args.reps, src, days)
    head = " ".join(f"{'day ' + str(d):>22}" for d in days)
    print(f"running total of a daily count over {horizon} days, total budget rho={rho} (zCDP); "
          f"noise stddev, analytic (measured over {args.reps} seeded runs)")
    print(f"{'mechanism':<28}{head}")
    print(f"{'daily, rho/' + str(horizon) + ' each':<28}"
          + " ".join(f"{a:>12.3g} ({m:>7.3g})" for a, m in zip(daily_sd, daily_meas)))
    for l0 in (1, 7, 30, horizon):
        contribution = tree.StreamContribution(max_days=l0, per_day=1)
        cal = tree.calibrate(horizon, contribution, ZCDP(rho))
        sd = [math.sqrt(tree.point_variance(t, cal)) for t in days]
        meas = measured_tree(cal, args.reps, src, days)
        label = f"tree, L0={l0} (L2^2={cal.sensitivity.l2_squared})"
        print(f"{label:<28}" + " ".join(f"{a:>12.3g} ({m:>7.3g})" for a, m in zip(sd, meas)))


if __name__ == "__main__":
    main()
