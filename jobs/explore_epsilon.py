"""The epsilon explorer: the same as ``dp-spark explore`` (kept for existing invocations).

    python jobs/explore_epsilon.py --conf conf/releases/aov_by_region.yaml \
        --group-sizes 50,500,5000 --budgets 0.1,0.25,0.5,1,2 --target 0.05 --out explorer/

Budgets are epsilons for a pure_dp spec and rhos for a zcdp spec. Prints a table of the
expected absolute and relative error (and the interval half-width at the spec's confidence)
per budget and group size, the smallest budget meeting ``--target`` for each group size, and
writes ``<release>_explorer.png`` and ``<release>_explorer.csv`` into ``--out`` (default: the
env's ``warehouse/explorer``). Public inputs only: no data is read, no Spark session is
started, nothing is charged. ``dp-spark explore --help`` for every option; docs/cli.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dp_spark.cli import closed_pipe_safe, explore_main  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return explore_main(argv)


if __name__ == "__main__":
    sys.exit(closed_pipe_safe(lambda: main(sys.argv[1:])))
