"""Write the synthetic demo event table (dp_spark.demo_data) to a Delta path.

    python jobs/generate_demo_data.py --out /tmp/dp_spark/events
    spark-submit --jars "$(python -c 'import dp_spark.spark as s; print(",".join(s.delta_jar_paths()))')" \\
        jobs/generate_demo_data.py --out s3://bucket/demo/events --users 20000 --rows-scale 50

``--rows-scale S`` multiplies the number of users (and so the row count, ~20 rows per user):
``--users 20000 --rows-scale 50`` gives about 20 M rows. The table is overwritten.
"""

from __future__ import annotations

import argparse
import sys
from datetime import date
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dp_spark.demo_data import generate_events  # noqa: E402
from dp_spark.spark import get_or_create_session  # noqa: E402


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="Delta table path to (over)write")
    p.add_argument("--users", type=_positive_int, default=20000, help="number of users (default 20000)")
    p.add_argument(
        "--rows-scale", type=_positive_float, default=1.0,
        help="multiply the number of users (and rows) by this factor (default 1)",
    )
    p.add_argument("--days", type=_positive_int, default=30, help="number of days (default 30)")
    p.add_argument("--start-date", type=date.fromisoformat, default=date(2026, 11, 1),
                   help="first day, YYYY-MM-DD (default 2026-11-01)")
    p.add_argument("--regions", type=_positive_int, default=20, help="number of regions (default 20)")
    p.add_argument("--heavy-users", type=_non_negative_int, default=3, help="bot users (default 3)")
    p.add_argument("--heavy-rows", type=_positive_int, default=10000, help="rows per bot (default 10000)")
    p.add_argument("--seed", type=int, default=7, help="data seed (default 7)")
    p.add_argument("--partitions", type=_positive_int, default=None, help="input partitions")
    p.add_argument("--master", default=None, help="Spark master when no session exists (default local[2])")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    n_users = max(1, round(args.users * args.rows_scale))
    spark = get_or_create_session("dp_spark.generate_demo_data", master=args.master)
    events = generate_events(
        spark,
        n_users=n_users,
        days=args.days,
        start_date=args.start_date,
        regions=args.regions,
        seed=args.seed,
        heavy_users=min(args.heavy_users, n_users),
        heavy_rows=args.heavy_rows,
        partitions=args.partitions,
    )
    (
        events.write.format("delta")
        .mode("overwrite")
        .option("overwriteSchema", "true")
        .save(args.out)
    )
    rows = spark.read.format("delta").load(args.out).count()
    print(f"wrote {args.out} rows={rows}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
