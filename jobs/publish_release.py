"""spark-submit entry point: publish pre-registered DP releases.

    spark-submit jobs/publish_release.py --env conf/envs/local.yaml \
        --conf conf/releases/dau_daily.yaml [--conf ...] [--date 2026-11-30]

The same as ``dp-spark publish`` (docs/cli.md). Thin: arguments -> config -> engine
(dp_spark.cli.publish_main).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a source checkout without install

from dp_spark.cli import closed_pipe_safe, publish_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(closed_pipe_safe(lambda: publish_main(sys.argv[1:])))
