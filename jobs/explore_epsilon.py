"""The epsilon explorer as a command: expected error against budget and assumed group size.

    python jobs/explore_epsilon.py --conf conf/releases/aov_by_region.yaml \
        --group-sizes 50,500,5000 --budgets 0.1,0.25,0.5,1,2 --target 0.05 --out explorer/

Budgets are epsilons for a pure_dp spec and rhos for a zcdp spec. Prints a table of the
expected absolute and relative error (and the interval half-width at the spec's confidence)
per budget and group size, the smallest budget meeting ``--target`` (relative half-width) for
each group size, and writes ``<release>_explorer.png`` and ``<release>_explorer.csv`` into
``--out``. Public inputs only: no data is read, no Spark session is started, nothing is
charged. A multi-statistic spec prints its plan per statistic instead (components, shares,
expected error and half-width per group size). ``--assumed-mean`` is the assumed value per row for sums and means (default: the
spec's own ``mean.assumed_mean``, else the midpoint of the clamp bounds).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dp_spark.errors import DpSparkError  # noqa: E402


def _list(kind):
    def parse(text: str):
        try:
            values = [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {kind.__name__}s") from None
        if not values or any(v <= 0 for v in values):
            raise argparse.ArgumentTypeError("values must be > 0")
        return values
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--conf", required=True, help="release spec YAML")
    p.add_argument("--group-sizes", type=_list(int), default=[50, 500, 5000],
                   help="assumed public group sizes (rows; distinct users for distinct_units)")
    p.add_argument("--budgets", type=_list(float), default=[0.1, 0.25, 0.5, 1, 2],
                   help="epsilons (pure_dp spec) or rhos (zcdp spec)")
    p.add_argument("--target", type=float, default=0.05,
                   help="relative error target: interval half-width / true value (default 0.05)")
    p.add_argument("--assumed-mean", type=float, default=None, help="assumed value per row (sum, mean)")
    p.add_argument("--out", default="explorer", help="output folder for the PNG and CSV")
    return p


def _plan_multi(spec, args) -> int:
    """A multi-statistic spec: its plan (dp_spark.api.plan_table) at each group size, for the
    spec's own charge (the split over components is fixed by the spec). No data read."""
    from dp_spark.api import plan_table

    print(f"== {spec.name}: {len(spec.statistics)} statistics x {spec.cells} key tuples, "
          f"{spec.charge.MEASURE} {spec.charge.to_json()}, confidence {float(spec.confidence):.0%}")
    print(f"{'statistic':<16}{'kind':<16}{'group size':>11}{'E|error|':>14}{'half-width':>14}  components (share)")
    for n in args.group_sizes:
        for r in plan_table(spec, group_size=n):
            shares = ", ".join(f"{c} ({s})" for c, s in zip(r["components"], r["share_of_charge"]))
            print(f"{r['statistic']:<16}{r['kind']:<16}{n:>11,}{r['expected_abs_error']:>14.4g}"
                  f"{r['interval_half_width']:>14.4g}  {shares}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from dp_spark.config import load_release_spec
    from dp_spark.evaluation import explorer
    from dp_spark.evaluation.charts import explorer_chart

    try:
        spec = load_release_spec(args.conf)
        if spec.statistics:
            return _plan_multi(spec, args)
        rows = explorer.explore(spec, args.group_sizes, args.budgets, assumed_mean=args.assumed_mean)
        stat = explorer.headline_statistic(spec)
        budget_name = "epsilon" if spec.charge.MEASURE == "pure_dp" else "rho"
        print(f"== {spec.name}: {stat}, {spec.charge.MEASURE}, unit {spec.unit.kind.value} "
              f"({spec.neighbouring.value}), {spec.cells} cells, confidence {float(spec.confidence):.0%}")
        print(explorer.format_table(rows, statistic=stat))
        print()
        smallest = {}
        for n in args.group_sizes:
            try:
                b = explorer.smallest_budget(spec, n, args.target, assumed_mean=args.assumed_mean)
                value = float(b.epsilon if budget_name == "epsilon" else b.rho)
                smallest[n] = value
                print(f"smallest {budget_name} for +-{args.target:.1%} at {float(spec.confidence):.0%} "
                      f"with group size {n:,}: {value:.4g}")
            except DpSparkError as exc:
                print(f"smallest {budget_name} for group size {n:,}: none ({exc})")
        print(f"(this release is configured with {budget_name} = {float(spec.charge.epsilon if budget_name == 'epsilon' else spec.charge.rho):.4g})")
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        caption = (f"{spec.name}: {spec.charge.MEASURE}; bounds {spec.bounds.max_rows_per_unit} rows/unit, "
                   f"{spec.cells} public cells; group size = assumed public size, no data read; "
                   f"relative error of the {float(spec.confidence):.0%} interval target {args.target:.0%}")
        png = explorer_chart(rows, out / f"{spec.name}_explorer.png", caption, statistic=stat,
                             target=args.target, error_column="rel_halfwidth")
        csv_path = out / f"{spec.name}_explorer.csv"
        with csv_path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            w.writeheader()
            w.writerows(rows)
        print(f"wrote {png}")
        print(f"wrote {csv_path}")
    except DpSparkError as exc:
        print(f"explore_epsilon: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
