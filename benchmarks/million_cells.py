"""A release of 3 statistics by product x day, products from a public key table, against plain Spark.

    DP_SPARK_TEST_MODE=1 .venv/bin/python benchmarks/million_cells.py \\
        [--rows 20000000] [--products 20000] [--days 30] [--reps 1] \\
        [--path auto|driver|executors] [--keys table|list] [--workdir DIR]

The target of the warehouse-scale work: ``orders`` (count), ``revenue`` (sum of order_value in
[0, 500]) and ``buyers`` (distinct_units) by day x product, 20,000 products x 30 days x 3
statistics = 1.8M cells, on 20M rows, the products read from a Delta table the env declares
``public: true`` (``--keys list`` lists them in the spec instead). Each repetition runs, one after
the other in one process:

(a) plain Spark: the same cap of K = 10 rows per user (``row_number`` over the user), then
    ``groupBy(day, product)`` with the three aggregates, written to a Delta table (the same
    number of cells as the release, written as the release is);
(b) dp_spark: ``Engine.publish`` + ``finish`` + ``close`` of the spec in a fresh warehouse (a
    real release with a real charge, never a cache hit).

It prints both times and their ratio, which noise path the release took (``--path driver``
sets the env's ``executor_noise_cells`` above the release's cells, ``executors`` to 1, ``auto``
keeps the default 250,000), the time by stage, the noise throughput in cells/s of that path (the
cells over the noise stage; on the executor path the noise, the aggregation and the write are
one Spark job, so it is a lower bound), the number of Delta commits that wrote cells (1), and
the driver's peak memory (JVM VmHWM and Python).

The defaults are the full size: on a shared 2-core machine run a small scale, e.g.
``--rows 200000 --products 300`` (9,000 x 3 cells). ``--rows`` is generated once per work
directory and reused. ``--spark-stages`` turns the Spark UI on and prints the slowest Spark
stages of the last dp_spark run (from the UI's REST API): where the time of the one Spark job
of the executor path goes.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("DP_SPARK_TEST_MODE", "1")

from release_vs_plain import Memory, Stages  # noqa: E402

K = 10


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=20_000_000)
    ap.add_argument("--products", type=int, default=20_000)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--path", choices=("auto", "driver", "executors"), default="auto")
    ap.add_argument("--keys", choices=("table", "list"), default="table")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--spark-stages", action="store_true",
                    help="print the slowest Spark stages of the last dp_spark run (turns the Spark UI on)")
    args = ap.parse_args()

    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from dp_spark.config import env_from_dict, load_release_spec
    from dp_spark.demo_data import generate_events
    from dp_spark.engine import Engine
    from dp_spark.spark import get_or_create_session

    conf = {"spark.driver.memory": "4g", **({"spark.ui.enabled": "true"} if args.spark_stages else {})}
    spark = get_or_create_session(master="local[2]", extra_conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    mem, stages = Memory(spark), Stages()
    stages.install()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="dp_million_"))
    (work / "releases").mkdir(parents=True, exist_ok=True)
    n, products, days = args.rows, args.products, args.days
    key_tuples = products * days
    cells = key_tuples * 3
    print(f"rows {n:,}, {products:,} products x {days} days x 3 statistics = {cells:,} cells; load average "
          f"{os.getloadavg()[0]:.1f}; work {work}", flush=True)

    data = work / f"events_{n}_p{products}_d{days}"
    if not (data / "_delta_log").exists():
        t0 = time.monotonic()
        df = generate_events(spark, n_users=max(1, n // 10), days=days, start_date=date(2026, 11, 1), seed=3,
                             mean_rows_per_user=10)
        (df.withColumn("product", F.format_string("p_%05d", F.pmod(F.xxhash64("event_id"), F.lit(products))))
         .write.format("delta").mode("overwrite").save(str(data)))
        print(f"generated the events in {time.monotonic() - t0:.0f}s", flush=True)
    catalogue = work / f"products_{products}"
    if not (catalogue / "_delta_log").exists():
        (spark.range(products).select(F.format_string("p_%05d", F.col("id")).alias("product"))
         .write.format("delta").mode("overwrite").save(str(catalogue)))

    policies = work / "budgets.yaml"
    policies.write_text(yaml.safe_dump({"version": 1, "budgets": {"bench": {
        "dataset": "bench_events", "privacy_unit": "user", "measure": "zcdp",
        "cap": {"rho": 1000}, "statement_delta": 1e-7, "window": "none", "max_per_release": {"rho": 1}}}}))
    (work / "access.yaml").write_text(yaml.safe_dump({
        "version": 1, "releases_dir": str(work / "releases"), "principals": {"bench": {"roles": ["publisher"]}}}))
    products_keys = ({"table": "products", "column": "product"} if args.keys == "table"
                     else {"values": [f"p_{i:05d}" for i in range(products)]})
    end = date.fromordinal(date(2026, 11, 1).toordinal() + days - 1).isoformat()
    value = {"column": "order_value", "lower": 0, "upper": 500}
    spec = {"privacy_unit": {"kind": "user", "column": "user_id"}, "dataset": "bench_events",
            "group_by": [{"column": "day", "public_keys": {"dates": {"start": "2026-11-01", "end": end}}},
                         {"column": "product", "public_keys": products_keys}],
            "bounds": {"max_rows_per_unit": K, "max_partitions_per_unit": K},
            "statistics": [{"name": "orders", "kind": "count"}, dict(value, name="revenue", kind="sum"),
                           {"name": "buyers", "kind": "distinct_units"}],
            "budget": {"id": "bench", "measure": "zcdp", "rho": 0.5}, "max_cells": cells}
    threshold = {"auto": 250_000, "driver": cells + 1, "executors": 1}[args.path]

    def plain(i: int) -> None:
        df = spark.read.format("delta").load(str(data)).where(F.col("user_id").isNotNull())
        w = Window.partitionBy("user_id").orderBy("event_id")
        df = df.withColumn("rn", F.row_number().over(w)).where(F.col("rn") <= K)
        (df.groupBy("day", "product")
         .agg(F.count(F.lit(1)).alias("orders"), F.sum(F.col("order_value")).alias("revenue"),
              F.countDistinct("user_id").alias("buyers"))
         .write.format("delta").mode("overwrite").save(str(work / f"plain_{i}")))

    def dp(i: int) -> tuple[str, int]:
        wh = Path(tempfile.mkdtemp(prefix=f"wh_{i}_", dir=work))
        env = env_from_dict({"name": "bench", "warehouse": str(wh), "policies": str(policies),
                             "datasets": {"bench_events": str(data),
                                          "products": {"location": str(catalogue), "public": True}},
                             "executor_noise_cells": threshold}, source="bench", root=work)
        f = work / "releases" / f"million_{i}.yaml"
        f.write_text(yaml.safe_dump(dict(spec, name=f"million_{i}", family="million")))
        with stages.run():
            eng = Engine(env, spark=spark, principal="bench", refresh="deferred")
            result = eng.publish(load_release_spec(f))
            path = "executors" if "executors" in result.note else "driver"
            assert result.status == "published", result.status
            eng.finish()
            eng.close()
        hist = spark.sql(f"DESCRIBE HISTORY delta.`{result.table_path}`").collect()
        commits = sum(1 for h in hist if h["operation"] == "WRITE"
                      and int((h["operationMetrics"] or {}).get("numOutputRows", 0)) > 0)
        return path, commits

    for i in range(args.reps):
        load = os.getloadavg()[0]
        t0 = time.monotonic()
        plain(i)
        ta = time.monotonic() - t0
        t0 = time.monotonic()
        first_stage = _last_stage_id(spark) if args.spark_stages else None
        path, commits = dp(i)
        tc = time.monotonic() - t0
        run = stages.runs[-1]
        noise_s = sum(v for k, v in run.items() if k.startswith("stage ") and "noise" in k)
        rate = f"{cells / noise_s:,.0f} cells/s" if noise_s else "n/a"
        print(f"run {i + 1}: load {load:.1f}  plain groupBy + {K}-row cap + Delta write {ta:.2f}s  dp_spark whole "
              f"release {tc:.2f}s  ratio {tc / ta:.2f}x  noise path {path}  noise stage {noise_s:.2f}s ({rate})  "
              f"Delta commits with cells {commits}", flush=True)
    stages.report("last run", last=1)
    print("  " + mem.peak(), flush=True)
    if args.spark_stages:
        _print_spark_stages(spark, first_stage)
    return 0


def _stages(spark) -> list[dict]:
    """The completed stages, from the Spark UI's REST API (public, read-only)."""
    import json
    import urllib.request

    base = spark.sparkContext.uiWebUrl
    app = spark.sparkContext.applicationId
    with urllib.request.urlopen(f"{base}/api/v1/applications/{app}/stages?status=complete") as r:
        return json.load(r)


def _last_stage_id(spark) -> int:
    return max((s["stageId"] for s in _stages(spark)), default=-1)


def _print_spark_stages(spark, after: int, top: int = 10) -> None:
    """The ``top`` slowest Spark stages after stage ``after`` (the last dp_spark run): wall time
    from submission to completion, tasks, rows read, shuffle read and write."""
    from datetime import datetime as _dt

    def secs(st) -> float:
        f = "%Y-%m-%dT%H:%M:%S.%fGMT"
        return (_dt.strptime(st["completionTime"], f) - _dt.strptime(st["submissionTime"], f)).total_seconds()

    mine = [s for s in _stages(spark) if s["stageId"] > after and s.get("submissionTime") and s.get("completionTime")]
    print(f"  Spark stages of the last dp_spark run: {len(mine)}, wall {sum(secs(s) for s in mine):.1f}s "
          f"(stages can overlap); the {top} slowest:")
    for s in sorted(mine, key=secs, reverse=True)[:top]:
        print(f"    {secs(s):7.1f}s  stage {s['stageId']:>4}  tasks {s['numTasks']:>4}  rows in {s['inputRecords']:>11,}  "
              f"shuffle read {s['shuffleReadRecords']:>11,} write {s['shuffleWriteRecords']:>11,}  {s['name'][:60]}")


if __name__ == "__main__":
    sys.exit(main())
