"""The coverage table of docs/accuracy.md: every statistic kind x {pure DP, zCDP} x cell sizes
{10, 20, 50, 200, 1000} x confidence levels {0.5, 0.8, 0.9, 0.95, 0.99}, simulated through the
engine's own noise and post-processing with the seeded exact sampler (no Spark; about a minute).

    DP_SPARK_TEST_MODE=1 .venv/bin/python benchmarks/coverage.py           # print the table
    DP_SPARK_TEST_MODE=1 .venv/bin/python benchmarks/coverage.py --write   # and put it in docs/accuracy.md
    DP_SPARK_TEST_MODE=1 .venv/bin/python benchmarks/coverage.py --shape bimodal   # the quantiles' rows on other data

Exit status 0 when every entry holds (dp_spark.evaluation.coverage.check), 1 otherwise (the
failures are listed). The test tests/statistical/test_coverage_table.py runs the same checks.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dp_spark.evaluation import coverage  # noqa: E402

DOC = ROOT / "docs" / "accuracy.md"
START, END = "<!-- coverage-table:start -->", "<!-- coverage-table:end -->"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=coverage.DEFAULT_REPS, help="releases of each cell (default %(default)s)")
    ap.add_argument("--seed", type=int, default=coverage.DEFAULT_SEED)
    ap.add_argument("--write", action="store_true", help=f"replace the table in {DOC.relative_to(ROOT)}")
    ap.add_argument("--shape", choices=sorted(coverage.SHAPES), default="gamma",
                    help="the cells' data (default %(default)s, the table's); another shape prints the quantiles' rows only")
    args = ap.parse_args(argv)
    if os.environ.get("DP_SPARK_TEST_MODE") != "1":
        ap.error("the seeded sampler is test-only: run with DP_SPARK_TEST_MODE=1")
    if args.write and args.shape != "gamma":
        ap.error("--write is for the table's own data (--shape gamma)")
    t0 = time.time()
    entries = [e for m in coverage.MEASURES for e in coverage.simulate(m, args.reps, args.seed, shape=args.shape)]
    if args.shape != "gamma":
        entries = [e for e in entries if e.kind.startswith("quantile")]
    text = coverage.table(entries)
    print(text)
    bad = coverage.check(entries)
    print(f"\n{len(entries)} entries, {args.reps} releases each, seed {args.seed}, {time.time() - t0:.0f} s; "
          f"{len(bad)} failures", file=sys.stderr)
    for line in bad:
        print("  " + line, file=sys.stderr)
    if args.write:
        doc = DOC.read_text()
        head, rest = doc.split(START, 1)
        _, tail = rest.split(END, 1)
        DOC.write_text(f"{head}{START}\n{text}\n{END}{tail}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
