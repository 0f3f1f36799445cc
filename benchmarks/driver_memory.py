"""Driver-side cost of a release's cells, without Spark: Python memory (tracemalloc peak) and
time of each driver step at N cells of one ``count`` (or ``--statistic sum|mean|variance|stddev``) by day x product.

    DP_SPARK_TEST_MODE=1 .venv/bin/python benchmarks/driver_memory.py --cells 1000000 [--statistic mean]

Steps, as the engine runs them after the executors aggregated: the partials as the streamed
collect packs them (:class:`dp_spark.statistics.plan.PartialColumns`, int64 vectors; built
here from synthetic counts, no Spark), ``QueryPlan.noise_columns`` with the production source
(OpenDP's exact discrete Gaussian), the Arrow table the Delta write is built from (the cells'
columns with the release's common fields, as ``Engine._rows`` adds them:
:func:`dp_spark.delta.release_table.cells_arrow_table`), and the rows ``publish`` returns (one
dict per cell, ordered as the table reads back). Prints per N the time of each step,
the noise throughput (cells/s) and the process's peak RSS above its RSS before the first step
(``resource.getrusage``: Python and the noise library, no JVM here), with the load average.
Give one N per run for a clean peak (the peak of a process only grows).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import resource
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _sum_partials(plan) -> list[str]:
    """The partial columns a sum's components read (names derived from the spec's column and clamp)."""
    seen: list[str] = []

    class Probe(dict):
        def get(self, k, d=None):
            seen.append(k)
            return 0
    for c in plan.components:
        if c.kind not in ("rows", "units"):
            c.true_values(Probe())
    return list(dict.fromkeys(seen))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", default="100000,1000000")
    ap.add_argument("--statistic", choices=("count", "sum", "mean", "variance", "stddev"), default="count",
                    help="the one statistic of the release (all but count: order_value in [0, 500])")
    args = ap.parse_args()
    import numpy as np

    from dp_spark.config import release_spec_from_dict
    from dp_spark.delta.release_table import RELEASE_SCHEMA, cells_arrow_table
    from dp_spark.mechanisms.samplers import default_source
    from dp_spark.statistics.plan import PartialColumns, plan_query

    src = default_source()
    for target in [int(x) for x in args.cells.split(",")]:
        products = max(1, target // 30)
        cells = products * 30
        spec = release_spec_from_dict({
            "name": "mem", "dataset": "x", "privacy_unit": {"kind": "user", "column": "user_id"},
            "group_by": [{"column": "day", "public_keys": {"dates": {"start": "2026-11-01", "end": "2026-11-30"}}},
                         {"column": "product", "public_keys": {"values": [f"p_{i:06d}" for i in range(products)]}}],
            "bounds": {"max_rows_per_unit": 10, "max_partitions_per_unit": cells},
            "statistics": [{"name": "orders", "kind": "count"} if args.statistic == "count" else
                           {"name": "orders", "kind": args.statistic, "column": "order_value", "lower": 0,
                            "upper": 500}], "max_cells": cells,
            "budget": {"id": "b", "measure": "zcdp", "rho": 0.01}}, "mem.yaml")
        plan = plan_query(spec)
        load = os.getloadavg()[0]
        before = _rss_mib()
        t = {}
        t0 = time.monotonic()
        present = np.arange(0, cells, 2, dtype=np.int64)  # half the cells present in the data
        rows_col = (present % 50) + 1
        # a sum's or mean's partials at zero: every row's value at the clamp's midpoint
        partials = PartialColumns(present, {"dp_rows": rows_col,
                                            **{name: np.zeros_like(rows_col) for name in _sum_partials(plan)}})
        t["partials"] = time.monotonic() - t0
        t0 = time.monotonic()
        out = plan.noise_columns(partials, src)
        t["noise"] = time.monotonic() - t0
        t0 = time.monotonic()
        common = {f.name: None for f in RELEASE_SCHEMA.fields}
        common.update(release_id="r" * 32, release_family="mem", release_name="mem", spec_version="v", mode="official",
                      key_column="day,product", confidence=0.95, charge_json="{}", budget_id="b", bounds_json="{}",
                      privacy_unit="user", unit_column="user_id", neighbouring="add_remove_unit",
                      parallel_composition=False, suppressed=False, input_table_id="t", input_version=1,
                      code_version="c", created_at=datetime(2026, 12, 5))
        rows = out.with_common(common)
        del out
        t0 = time.monotonic()
        table = cells_arrow_table(rows)
        t["arrow"] = time.monotonic() - t0
        t0 = time.monotonic()
        result = sorted(rows.dicts([f.name for f in RELEASE_SCHEMA.fields]), key=lambda r: (r["statistic"], r["key"]))
        t["rows"] = time.monotonic() - t0
        peak = (_peak_mib() - before) * 2**20
        del rows, table, partials, result
        print(f"cells={cells:,} {args.statistic} load {load:.1f}: partials {t['partials']:.2f}s, noise "
              f"{t['noise']:.2f}s ({cells / t['noise']:,.0f} cells/s), arrow table {t['arrow']:.2f}s, "
              f"returned rows {t['rows']:.2f}s; "
              f"peak RSS above the start {peak / 2**20:,.0f} MiB = {peak / cells:,.0f} bytes/cell", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
