"""spark-submit entry point: scheduled daily refresh and backfill of a day-keyed release.

    spark-submit jobs/daily_refresh.py --env conf/envs/local.yaml \
        --conf conf/releases/dau_daily.yaml --date 2026-11-30        # or --date yesterday
    spark-submit jobs/daily_refresh.py --env ... --conf ... --from 2026-11-01 --to 2026-11-07 [--republish]

The same as ``dp-spark refresh`` (``dp-spark backfill --from --to`` for a range): one line per
day: status, release id, charge, remaining window budget (and, once committed, the published
cell). A rerun of a day is a no-op; a day whose input rows did not change on a new snapshot is
served by its release (unchanged); one whose rows changed after publication is reported
(input_changed), not republished, unless --republish.
Exit status: 0 ok, 1 a day failed, 2 bad arguments or config, 3 with --strict and a stale day
(docs/cli.md).

Thin: arguments -> config -> engine (dp_spark.cli.refresh_main).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a source checkout without install

from dp_spark.cli import closed_pipe_safe, refresh_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(closed_pipe_safe(lambda: refresh_main(sys.argv[1:])))
