"""Full dp_spark release vs plain Spark of the same metrics, side by side in one run.

    .venv/bin/python benchmarks/release_vs_plain.py [--rows 2000000[,20000000]] [--reps 3]
        [--layout time|user] [--case aov|multi|multi_day_region|general|tiny|drift] [--releases 50]
        [--threads on|compare] [--case cells --cells 1000,100000 [--statistic count|mean]]

``--rows`` (alias ``--sizes``): rows per dataset, comma separated; 2M by default, 20M opt-in
(``--rows 2000000,20000000`` also prints the 20M/2M ratio).

``--case tiny``: the FIXED cost of a release: ``Engine.publish`` + ``Engine.finish`` of one
statistic (a count per region) on a 1,000-row input, warm (after one cold release in the same
JVM, printed too), median of ``--reps``, with the time of every stage (validate, bounding +
aggregation, noise, ledger calls, the Delta write, versions, mirror, statement). Target <= 3 s
on publish + finish; the ledger mirror is refreshed in the background (after the versions and
statement, once ``finish`` returns), so the job's end, after ``Engine.close()`` waited for it, is printed
beside it.
With ``--threads compare`` it alternates repetitions with dp_spark's background threads on and
off (each overlapped step run before what it overlapped) and prints both medians.

``--case drift``: ``--releases`` (default 50) releases of the tiny input, one after the other, in
ONE engine and process (publish + finish each; each release's background mirror refresh
overlaps the next release, the engine is closed once at the end); prints each release's time and the process's
memory (Python RSS, the driver JVM's RSS and its heap after a full GC, live threads, cached RDDs), then the medians of
the first 5 and of the last 5 and their ratio. Target: flat (last 5 / first 5 within 1.5x).

``--case cells``: the cost per cell. One ``count`` (``--statistic mean``: one mean of the order value
held to [0, 500], against plain Spark's ``avg`` of the same clamped value) by day x product (30 days x P products, K = 10
rows per user, no L0 / Linf limit) for each ``--cells`` target (default ``1000,100000``: 33 and
3,333 products, 990 and 99,990 cells) on ``--rows`` rows (a ``product`` column hashed from the
event id, one input table per product count), against plain Spark's groupBy(day, product)
count after the same 10-row cap per user, side by side in one process: plain, then the whole
dp_spark release (publish + finish + close, a fresh release each time), ``--reps`` times (3 by
default); the first repetition warms the JVM and the LAST is reported, with its time by stage,
the load average before it, and the driver's peak memory.

``--case general``: the multi-statistic release per region with the GENERAL bounding (L0 = 3
regions per user, Linf = 2 rows per user and region, K = 5 rows per user), against plain Spark
enforcing the same three limits with three windows ordered by event id.

Every case prints the time by stage of the dp_spark runs (median over the repetitions) and the
peak memory of the driver: the JVM's (VmHWM, where the partials are collected) and Python's.

Data: the demo generator with n/10 users and a mean of 10 rows per user (the issue's 200k users
for 2M rows, 2M users for 20M), 20 regions, 30 days. ``--layout time`` (default) stores the
rows in event-time order, as an append-only event log is; ``--layout user`` keeps the
generator's user-major order, in which every user's rows are already contiguous and sorted by
event_id (a layout that flatters (a): its window sorts presorted input).

(a) plain Spark: read the Delta input, truncate each user to K rows with a window ordered by
    event_id, groupBy region: distinct users, sum and mean of clamped order values, collect.
(b) dp_spark: ``Engine.publish`` of the AOV-per-region release, in a new engine as a job
    would: bounding (a uniform bottom-K sample per user by a keyed hash priority, L0 = 1
    region per user), clamping, fixed-point partials, noise on the driver, ledger charge,
    the Delta write (an idempotent append keyed by the release id); then, printed beside it,
(c) the same plus ``Engine.finish()`` (the version record, rows of the SQL ledger, and the
    privacy statement) and ``Engine.close()`` (waiting for the Delta tables derived from the
    ledger, its mirror and ``_published``, refreshed in the background), i.e. the whole
    one-release job.

``--case multi``: ONE multi-statistic release (distinct users, orders, revenue and mean order
value per region; K = 5 rows per user, clamp [0, 500], no L0 or Linf limit, so users count in
every region they have rows in) against plain Spark computing the same four aggregates with the
same K-row truncation. ``--case multi_day_region``: the same per day x region (600 key tuples).

Each repetition rebuilds its DataFrames from the Delta table (no reuse of shuffle files) and
(b)/(c) publish a new release (a new spec name, so a new release id and a real charge).
Prints per size: median seconds of (a), (b), (c), the ratios of the medians to (a), the
median of the per-repetition ratios b_i/a_i (each (b) run right after its (a): less exposed to
this machine's drifts), the driver's peak RSS; then the 20M/2M time ratio. Targets (issue 15),
on the WHOLE release (c), as a one-release job runs it: c/a <= 1.5 at 2M and <= 1.3 at 20M
(ratio of the medians), 20M/2M <= 10, flat driver memory. ``--threads compare`` adds a run of
(c) with dp_spark's background threads off per repetition.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import re
import resource
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# a benchmark runs on throwaway data and warehouses: test mode lets it name its principal and
# read exact values of its own generated data (the noise is still OpenDP's production sampler)
os.environ.setdefault("DP_SPARK_TEST_MODE", "1")

import yaml  # noqa: E402


def _rss_mb() -> float:
    """Peak RSS of this Python process (MB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _proc_mb(pid: int, field: str) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


class Memory:
    """The driver's memory: the JVM (where partials are collected) and this Python process."""

    def __init__(self, spark):
        self.spark = spark
        self.jvm_pid = int(spark._jvm.java.lang.ProcessHandle.current().pid())

    def now(self) -> dict[str, float]:
        """Memory now; the JVM heap is measured after a full GC (what stays reachable: a leak
        grows it, heap expansion and garbage do not)."""
        self.spark._jvm.java.lang.System.gc()
        rt = self.spark._jvm.java.lang.Runtime.getRuntime()
        return {"py_rss": _proc_mb(os.getpid(), "VmRSS"), "jvm_rss": _proc_mb(self.jvm_pid, "VmRSS"),
                "jvm_heap": (rt.totalMemory() - rt.freeMemory()) / 2**20,
                "jvm_threads": int(self.spark._jvm.java.lang.Thread.activeCount()),
                "cached_rdds": int(self.spark._jsc.getPersistentRDDs().size()),
                "py_threads": threading.active_count()}

    def peak(self) -> str:
        return (f"driver peak memory: JVM {_proc_mb(self.jvm_pid, 'VmHWM'):.0f} MB (VmHWM), "
                f"Python {_rss_mb():.0f} MB")


class Threads:
    """``--threads compare``: switch dp_spark's background threads (``dp_spark.background.
    alongside``: the release write's key preparation beside the aggregation, the audit mirror
    beside the entries mirror, the statement inputs beside the version record) off, i.e. run each one to completion before what it overlapped."""

    def __init__(self):
        import dp_spark.background as bg
        import dp_spark.engine as eng
        import dp_spark.delta.mirror as mirror

        self._mods = (bg, eng, mirror)
        self._real = bg.alongside

    def serial(self, on: bool) -> None:
        @contextmanager
        def one_after_the_other(fn, *args, name):
            fn(*args)
            yield

        for m in self._mods:
            m.alongside = one_after_the_other if on else self._real


RETURNED = "= publish + finish returned"


class Stages:
    """Time per stage of one dp_spark release: wraps the engine's steps (benchmark only)."""

    STAGE_LINE = re.compile(r"stage (\S+) done in ([0-9.]+)s")

    def __init__(self):
        self.current: dict[str, float] = defaultdict(float)
        self.runs: list[dict[str, float]] = []
        self._local = threading.local()

    def install(self) -> None:
        import dp_spark.governance as gov
        import dp_spark.governance.versions as versions
        import dp_spark.delta.release_table as writer
        import dp_spark.engine as engine
        import dp_spark.governance.statement as statement
        from dp_spark.engine import Engine

        def wrap(owner, name, label):
            fn = getattr(owner, name)

            def timed(*a, **kw):
                if getattr(self._local, "depth", 0):  # only the outermost timed call counts
                    return fn(*a, **kw)
                self._local.depth = 1
                t0 = time.monotonic()
                try:
                    return fn(*a, **kw)
                finally:
                    self._local.depth = 0
                    self.current[label] += time.monotonic() - t0
            setattr(owner, name, timed)

        wrap(Engine, "validate", "validate (plan, pin snapshot, access)")
        wrap(Engine, "_reserve", "ledger reserve")
        wrap(Engine, "_commit_if_owner", "ledger commit")
        wrap(Engine, "_audit", "ledger audit rows")
        wrap(Engine, "_result", "result (budget status)")
        wrap(writer, "ensure_release_table", "release table check")
        wrap(writer, "write_release", "Delta write (release)")
        wrap(writer, "prepare_release_write", "prepare write keys (thread, overlaps aggregation)")
        wrap(versions, "record_publications", "finish: versions (ledger)")
        wrap(gov, "_refresh_statement", "finish: privacy statement")
        wrap(Engine, "_refresh_mirror", "mirror + _published (background thread)")
        wrap(statement, "load_release_summaries", "finish: release summaries (thread, overlaps versions)")
        wrap(engine, "_as_written", "returned rows")
        stages = self

        class Handler(logging.Handler):
            def emit(self, record):
                m = stages.STAGE_LINE.search(record.getMessage())
                if m and m.group(1) != "write":
                    stages.current[f"stage {m.group(1)}"] += float(m.group(2))

        lg = logging.getLogger("dp_spark.engine")
        lg.addHandler(Handler())
        lg.setLevel(logging.INFO)

    @contextmanager
    def run(self):
        self.current = defaultdict(float)
        t0 = time.monotonic()
        yield
        self.current["TOTAL"] = time.monotonic() - t0
        self.runs.append(dict(self.current))

    def report(self, title: str, last: int | None = None) -> None:
        runs = self.runs[-last:] if last else self.runs
        if not runs:
            return
        labels = sorted({k for r in runs for k in r}, key=lambda k: (k == "TOTAL", k))
        print(f"  time by stage, {title} (median of {len(runs)} runs; the mirror runs in the background, after "
              f"the versions and statement, once finish returned; TOTAL includes waiting for it unless the case says not):")
        for k in labels:
            print(f"    {k:42s} {statistics.median(r.get(k, 0.0) for r in runs):7.2f}s")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", "--sizes", dest="rows", default=None,
                    help="rows per dataset, comma separated (default 2000000; 1000 for tiny and drift)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--releases", type=int, default=50, help="--case drift: releases in one engine")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--layout", choices=("time", "user"), default="time",
                    help="row order of the input table (see the module docstring)")
    ap.add_argument("--threads", choices=("on", "compare"), default="on",
                    help="--case tiny: 'compare' alternates repetitions with the background threads on and off")
    ap.add_argument("--cells", default="1000,100000",
                    help="--case cells: target cell counts (day x product), comma separated")
    ap.add_argument("--statistic", choices=("count", "mean"), default="count",
                    help="--case cells: the statistic per cell")
    ap.add_argument("--case", choices=("aov", "multi", "multi_day_region", "general", "tiny", "drift", "cells"),
                    default="aov", help="the release measured (see the module docstring)")
    args = ap.parse_args()
    small_case = args.case in ("tiny", "drift")
    sizes = [int(s) for s in (args.rows or ("1000" if small_case else "2000000")).split(",")]

    t_start = time.monotonic()
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from dp_spark.config import env_from_dict, load_release_spec
    from dp_spark.demo_data import generate_events
    from dp_spark.engine import Engine
    from dp_spark.spark import get_or_create_session

    spark = get_or_create_session(master="local[2]", extra_conf={"spark.driver.memory": "8g"})
    spark.sparkContext.setLogLevel("ERROR")
    print(f"imports + session: {time.monotonic() - t_start:.1f}s (machine: 2 cores shared with other "
          f"engineers, load average {os.getloadavg()[0]:.1f})", flush=True)
    mem = Memory(spark)
    stages = Stages()
    stages.install()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="dp_bench_"))
    (work / "releases").mkdir(parents=True, exist_ok=True)
    aov = yaml.safe_load((ROOT / "conf/releases/aov_by_region.yaml").read_text())
    K, lo, hi = aov["bounds"]["max_rows_per_unit"], aov["value"]["lower"], aov["value"]["upper"]
    keys = ["region"] if args.case != "multi_day_region" else ["day", "region"]
    L0, LINF = None, None
    regions = [f"region_{i:02d}" for i in range(1, 21)]
    if small_case:
        aov = {"privacy_unit": {"kind": "user", "column": "user_id"},
               "group_by": [{"column": "region", "public_keys": {"values": regions}}],
               "bounds": {"max_rows_per_unit": 5, "max_partitions_per_unit": 20},
               "statistics": [{"name": "orders", "kind": "count"}]}
    elif args.case != "aov":
        K = 5
        group_by = [{"column": "region", "public_keys": {"values": regions}}]
        if args.case == "multi_day_region":
            group_by.insert(0, {"column": "day", "public_keys": {"dates": {"start": "2026-11-01",
                                                                             "end": "2026-11-30"}}})
        value = {"column": "order_value", "lower": lo, "upper": hi}
        bounds = {"max_rows_per_unit": K, "max_partitions_per_unit": 600}
        if args.case == "general":
            L0, LINF = 3, 2
            bounds = {"max_rows_per_unit": K, "max_partitions_per_unit": L0, "max_rows_per_partition": LINF}
        aov = {"privacy_unit": {"kind": "user", "column": "user_id"}, "group_by": group_by,
               "bounds": bounds,
               "statistics": [{"name": "users", "kind": "distinct_units"}, {"name": "orders", "kind": "count"},
                              dict(value, name="revenue", kind="sum"), dict(value, name="aov", kind="mean")],
               "max_cells": 3000}
    policies = work / "budgets.yaml"
    policies.write_text(yaml.safe_dump({"version": 1, "budgets": {"bench": {
        "dataset": "bench_events", "privacy_unit": "user", "measure": "zcdp",
        "cap": {"rho": 1000}, "statement_delta": 1e-7, "window": "none",
        "max_per_release": {"rho": 1}}}}))
    # the benchmark's principal publishes pre-registered specs written under work/releases
    (work / "access.yaml").write_text(yaml.safe_dump({
        "version": 1, "releases_dir": str(work / "releases"),
        "principals": {"bench": {"roles": ["publisher"]}}}))

    if args.case == "cells":
        return _cells_case(args, spark, sizes, work, policies, stages, mem)
    results = {}
    for n in sizes:
        users = max(1, n // 10)  # mean 10 rows per user
        data = work / f"events_{n}_{args.layout}"
        if not (data / "_delta_log").exists():
            t0 = time.monotonic()
            df = generate_events(spark, n_users=users, days=30, start_date=date(2026, 11, 1), seed=3,
                                 mean_rows_per_user=10)
            if small_case:
                df = df.limit(n)
            if args.layout == "time":
                df = df.repartitionByRange(max(2, n // 1_000_000), "event_time").sortWithinPartitions("event_time")
            df.write.format("delta").mode("overwrite").save(str(data))
            print(f"generated {n:,} rows ({args.layout} order) in {time.monotonic() - t0:.0f}s", flush=True)
        # a fresh warehouse (ledger, release tables) per run: every dp_spark repetition below
        # is a real release with a real charge, never a cache hit
        wh = Path(tempfile.mkdtemp(prefix=f"wh_{n}_", dir=work))
        env = env_from_dict({"name": "bench", "warehouse": str(wh),
                             "datasets": {"bench_events": str(data)}, "policies": str(policies)},
                            source="bench", root=work)

        def plain():
            # the DataFrame is rebuilt from the Delta table at every repetition (no reuse)
            df = spark.read.format("delta").load(str(data)).where(F.col("user_id").isNotNull())
            if L0 is not None:  # the same three limits, the textbook way: three windows
                w0 = Window.partitionBy("user_id").orderBy(F.xxhash64("user_id", "region"), "region")
                df = df.withColumn("r0", F.dense_rank().over(w0)).where(F.col("r0") <= L0)
                w1 = Window.partitionBy("user_id", "region").orderBy("event_id")
                df = df.withColumn("r1", F.row_number().over(w1)).where(F.col("r1") <= LINF)
            w = Window.partitionBy("user_id").orderBy("event_id")
            df = df.withColumn("rn", F.row_number().over(w)).where(F.col("rn") <= K)
            v = F.least(F.greatest(F.col("order_value"), F.lit(lo)), F.lit(hi))
            if args.case == "aov":
                return df.groupBy("region").agg(F.countDistinct("user_id"), F.sum(v), F.avg(v)).collect()
            return df.groupBy(*keys).agg(F.countDistinct("user_id"), F.count(F.lit(1)), F.sum(v),
                                         F.avg(v)).collect()

        eng_shared: list = []

        def dp(i, full=False, engine=None, close=True):
            d = dict(aov, name=f"aov_bench_{n}_{i + 1}", family="aov_bench", dataset="bench_events",
                     budget={"id": "bench", "measure": "zcdp", "rho": 0.01})
            f = work / "releases" / f"aov_bench_{n}_{i}.yaml"
            f.write_text(yaml.safe_dump(d))
            # one job, one engine (or the drift case's one engine for every release)
            eng = engine or Engine(env, spark=spark, principal="bench", refresh="deferred")
            with stages.run():
                t0 = time.monotonic()
                result = eng.publish(load_release_spec(f))
                assert result.status == "published", result.status
                if full:
                    eng.finish()  # + version record and privacy statement; starts the mirror
                stages.current[RETURNED] = time.monotonic() - t0
                if close:  # the job's end: the ledger mirror's background refresh has finished
                    eng.close()
            return eng

        if args.case == "tiny":
            t0 = time.monotonic(); dp(-1, full=True); cold = time.monotonic() - t0
            print(f"cold (first release in this JVM, after the session started): {cold:.2f}s", flush=True)
            stages.runs.clear()
            tt = []
            if args.threads == "compare":
                threads, by_mode = Threads(), {True: [], False: []}
                for i in range(2 * max(args.reps, 5)):
                    serial = i % 2 == 1
                    threads.serial(serial)
                    t0 = time.monotonic(); dp(i, full=True); by_mode[serial].append(time.monotonic() - t0)
                threads.serial(False)
                on, off = statistics.median(by_mode[False]), statistics.median(by_mode[True])
                print(f"case=tiny rows={n:,}: publish + finish, background threads ON median {on:.2f}s, OFF (each "
                      f"one run before what it overlapped) median {off:.2f}s: OFF/ON = {off / on:.2f}  "
                      f"(alternating, {len(by_mode[True])} runs each)")
                continue
            for i in range(max(args.reps, 5)):
                t0 = time.monotonic(); dp(i, full=True); tt.append(time.monotonic() - t0)
            med = statistics.median(tt)
            ret = [r[RETURNED] for r in stages.runs]
            mret = statistics.median(ret)
            print(f"case=tiny rows={n:,}: fixed cost publish + finish (warm; the mirror refreshes in the "
                  f"background) median {mret:.2f}s  runs {', '.join(f'{x:.2f}' for x in ret)}  TARGET <= 3s: "
                  f"{'PASS' if mret <= 3 else 'FAIL'}")
            print(f"case=tiny rows={n:,}: the job's end (+ Engine.close(): the mirror has caught up) median "
                  f"{med:.2f}s  runs {', '.join(f'{x:.2f}' for x in tt)}")
            stages.report("tiny release, warm")
            print("  " + mem.peak())
            continue
        if args.case == "drift":
            eng = Engine(env, spark=spark, principal="bench", refresh="deferred")
            dp(-1, full=True, engine=eng)
            tt, mm = [], []
            for i in range(args.releases):
                # one long-lived engine: each release's mirror refresh overlaps the next release
                t0 = time.monotonic(); dp(i, full=True, engine=eng, close=False); tt.append(time.monotonic() - t0)
                gc.collect()
                mm.append(mem.now())
                m = mm[-1]
                print(f"release {i + 1:3d}: {tt[-1]:6.2f}s  Python RSS {m['py_rss']:6.0f} MB  JVM RSS "
                      f"{m['jvm_rss']:6.0f} MB  JVM heap after GC {m['jvm_heap']:6.0f} MB  threads JVM "
                      f"{m['jvm_threads']} Python {m['py_threads']}  cached RDDs {m['cached_rdds']}  | "
                      + "  ".join(f"{k.split(':')[-1].split('(')[0].strip()} {v:.1f}s"
                                  for k, v in stages.runs[-1].items() if k.startswith(("finish", "stage", "Delta"))),
                      flush=True)
            k = min(5, len(tt))

            def med(xs):
                return statistics.median(xs)
            first, last = med(tt[:k]), med(tt[-k:])
            print(f"case=drift releases={args.releases} in one engine: time first {k} {first:.2f}s, last {k} "
                  f"{last:.2f}s (x{last / first:.2f}); JVM RSS first {med([m['jvm_rss'] for m in mm[:k]]):.0f} "
                  f"MB, last {med([m['jvm_rss'] for m in mm[-k:]]):.0f} MB; JVM heap after GC first "
                  f"{med([m['jvm_heap'] for m in mm[:k]]):.0f} MB, last {med([m['jvm_heap'] for m in mm[-k:]]):.0f} "
                  f"MB; Python RSS first {med([m['py_rss'] for m in mm[:k]]):.0f} MB, last "
                  f"{med([m['py_rss'] for m in mm[-k:]]):.0f} MB  TARGET flat (x <= 1.5): "
                  f"{'PASS' if last / first <= 1.5 else 'FAIL'}")
            runs = stages.runs[1:]  # without the warm-up release
            stages.runs = runs[:k]
            stages.report(f"first {k} releases")
            stages.runs = runs[-k:]
            stages.report(f"last {k} releases")
            print("  " + mem.peak())
            continue

        plain()  # warm-up both paths once (JIT, Delta log cache)
        dp(-1, full=True)
        stages.runs.clear()
        ta, tb, tc, td = [], [], [], []
        threads = Threads() if args.threads == "compare" else None

        def without(switch, i, times):
            """(c) again with one mechanism switched off (``switch(True)``), not in the stages."""
            switch(True)
            try:
                t0 = time.monotonic(); dp(i, full=True); times.append(time.monotonic() - t0)
            finally:
                switch(False)
            stages.runs.pop()

        for i in range(args.reps):
            t0 = time.monotonic(); plain(); ta.append(time.monotonic() - t0)
            t0 = time.monotonic(); eng = dp(i); tb.append(time.monotonic() - t0)
            eng.finish()  # untimed: (b) is publish() alone; its job's end is timed in (c)
            eng.close()
            t0 = time.monotonic(); dp(100 + i, full=True); tc.append(time.monotonic() - t0)
            if threads is not None:  # (c) again with the background threads off
                without(threads.serial, 200 + i, td)
        a, b, c = statistics.median(ta), statistics.median(tb), statistics.median(tc)
        results[n] = (a, c)
        print(f"case={args.case} rows={n:,} users={users:,} layout={args.layout}: (a) plain {a:.2f}s  (b) dp_spark publish "
              f"{b:.2f}s  ratio b/a={b / a:.2f}  | (c) publish + finish (versions, mirror, statement) "
              f"{c:.2f}s ratio c/a={c / a:.2f}  | paired median b_i/a_i="
              f"{statistics.median(x / y for x, y in zip(tb, ta)):.2f}  c_i/a_i="
              f"{statistics.median(x / y for x, y in zip(tc, ta)):.2f}", flush=True)
        if td:
            d = statistics.median(td)
            print(f"  background threads OFF: publish + finish {d:.2f}s = {d / c:.2f} x (c) with them ON", flush=True)
        stages.runs = stages.runs[1::2]  # the (c) runs: publish + finish
        stages.report(f"(c) at {n:,} rows")
        print("  " + mem.peak(), flush=True)
    if len(sizes) >= 2 and results:
        small, big = sizes[0], sizes[-1]
        print(f"time ratio {big:,}/{small:,} rows: plain {results[big][0] / results[small][0]:.2f}  "
              f"dp_spark (publish + finish) {results[big][1] / results[small][1]:.2f}  TARGET <= 10: "
              f"{'PASS' if results[big][1] / results[small][1] <= 10 else 'FAIL'}")
    for n, (a, c) in results.items():  # the whole release: publish + finish, as a one-release job runs
        target = 1.5 if n < 10_000_000 else 1.3
        print(f"TARGET whole release c/a <= {target} at {n:,}: {'PASS' if c / a <= target else 'FAIL'} ({c / a:.2f})")
    return 0


def _cells_case(args, spark, sizes, work, policies, stages, mem) -> int:
    """``--case cells`` (module docstring): one count (or mean) by day x product at each ``--cells``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from dp_spark.config import env_from_dict, load_release_spec
    from dp_spark.demo_data import generate_events
    from dp_spark.engine import Engine

    K, days = 10, 30
    for n in sizes:
        base = work / f"events_{n}_{args.layout}"
        if not (base / "_delta_log").exists():
            t0 = time.monotonic()
            df = generate_events(spark, n_users=max(1, n // 10), days=days, start_date=date(2026, 11, 1),
                                 seed=3, mean_rows_per_user=10)
            df = df.repartitionByRange(max(2, n // 1_000_000), "event_time").sortWithinPartitions("event_time")
            df.write.format("delta").mode("overwrite").save(str(base))
            print(f"generated {n:,} rows in {time.monotonic() - t0:.0f}s", flush=True)
        for target in [int(c) for c in args.cells.split(",")]:
            products = max(1, target // days)
            cells = products * days
            data = work / f"events_{n}_{args.layout}_p{products}"
            if not (data / "_delta_log").exists():
                (spark.read.format("delta").load(str(base))
                 .withColumn("product", F.format_string("p_%05d", F.pmod(F.xxhash64("event_id"), F.lit(products))))
                 .write.format("delta").mode("overwrite").save(str(data)))
            wh = Path(tempfile.mkdtemp(prefix=f"wh_cells_{cells}_", dir=work))
            env = env_from_dict({"name": "bench", "warehouse": str(wh),
                                 "datasets": {"bench_events": str(data)}, "policies": str(policies)},
                                source="bench", root=work)
            stat = ({"name": "aov", "kind": "mean", "column": "order_value", "lower": 0, "upper": 500}
                    if args.statistic == "mean" else {"name": "orders", "kind": "count"})
            spec = {"privacy_unit": {"kind": "user", "column": "user_id"},
                    "group_by": [{"column": "day", "public_keys": {"dates": {"start": "2026-11-01",
                                                                                 "end": "2026-11-30"}}},
                                 {"column": "product", "public_keys": {
                                     "values": [f"p_{i:05d}" for i in range(products)]}}],
                    "bounds": {"max_rows_per_unit": K, "max_partitions_per_unit": cells},
                    "statistics": [stat], "max_cells": cells}

            def plain():
                df = spark.read.format("delta").load(str(data)).where(F.col("user_id").isNotNull())
                w = Window.partitionBy("user_id").orderBy("event_id")
                df = df.withColumn("rn", F.row_number().over(w)).where(F.col("rn") <= K)
                if args.statistic == "mean":
                    v = F.least(F.greatest(F.col("order_value"), F.lit(0.0)), F.lit(500.0))
                    return df.groupBy("day", "product").agg(F.avg(v)).collect()
                return df.groupBy("day", "product").agg(F.count(F.lit(1))).collect()

            def dp(i):
                d = dict(spec, name=f"cells_{cells}_{i}", family=f"cells_{cells}", dataset="bench_events",
                         budget={"id": "bench", "measure": "zcdp", "rho": 0.01})
                f = work / "releases" / f"cells_{cells}_{i}.yaml"
                f.write_text(yaml.safe_dump(d))
                eng = Engine(env, spark=spark, principal="bench", refresh="deferred")
                with stages.run():
                    result = eng.publish(load_release_spec(f))
                    assert result.status == "published", result.status
                    eng.finish()
                    eng.close()

            stages.runs.clear()
            ta, tc, loads = [], [], []
            for i in range(args.reps):
                loads.append(os.getloadavg()[0])
                t0 = time.monotonic(); plain(); ta.append(time.monotonic() - t0)
                t0 = time.monotonic(); dp(i); tc.append(time.monotonic() - t0)
                print(f"  run {i + 1}: load {loads[-1]:.1f}  plain {ta[-1]:.2f}s  dp_spark {tc[-1]:.2f}s "
                      f"({tc[-1] / ta[-1]:.1f}x)", flush=True)
            a, c = ta[-1], tc[-1]
            print(f"case=cells statistic={args.statistic} rows={n:,} cells={cells:,} ({products} products x {days} days), run {args.reps} of "
                  f"{args.reps}, load average {loads[-1]:.1f}: plain groupBy + {K}-row cap {a:.2f}s  dp_spark whole "
                  f"release {c:.2f}s  ratio {c / a:.2f}", flush=True)
            stages.report(f"cells={cells:,}, last run", last=1)
    print("  " + mem.peak(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
