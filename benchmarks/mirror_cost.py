"""Cost of the ledger's Delta mirror refresh after one release, against a ledger that already
holds 1, 1,000 and 10,000 entries (and as many audit rows), incremental vs a full rewrite.

    .venv/bin/python benchmarks/mirror_cost.py [--sizes 1,1000,10000] [--releases 6]

The engine refreshes the mirror after each job's releases (``mirror_to_delta``): it appends the
rows the ledger gained since the mirror's Delta version, verified against their chains' heads.
``full=True`` (``dp-spark budget rebuild-mirror``) verifies the whole ledger and rewrites both
tables. After a warm-up round at the first size, per size: a SQLite ledger filled through the ledger API (reserve + commit + one audit
row per release), both mirrors built once, then ``--releases`` releases each followed by one
refresh of each mirror; the median of all but the first refresh is printed, and the ratio of the
largest size to the smallest (about 1 when the cost does not grow with the ledger).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from ledger_cost import KEY, _policy, _reserve  # noqa: E402

from dp_spark.ledger import open_ledger  # noqa: E402
from dp_spark.delta.mirror import mirror_to_delta  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1,1000,10000")
    ap.add_argument("--releases", type=int, default=6)
    args = ap.parse_args()
    from dp_spark.spark import get_or_create_session

    spark = get_or_create_session(master="local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    work = Path(tempfile.mkdtemp(prefix="dp_mirror_bench_"))
    print(f"machine load average {os.getloadavg()[0]:.1f}", flush=True)
    out = {}
    sizes = [int(x) for x in args.sizes.split(",")]
    for j, n in enumerate([sizes[0]] + sizes):  # the first round warms the JVM up, not printed
        with open_ledger(f"sqlite:///{work}/ledger_{j}_{n}.db", key=KEY) as led:
            led.register_budget(_policy("b", "none"))
            t0 = time.monotonic()
            for i in range(n):
                _reserve(led, "b", f"r{i}")
                led.commit(f"r{i}", "bench-run")
                led.append_audit("bench", "publish", "s", "v", "published", f"r{i}", None, None)
            fill = time.monotonic() - t0
            res = {}
            for full in (False, True):
                lp, ap_ = str(work / f"lm_{j}_{n}_{full}"), str(work / f"am_{j}_{n}_{full}")
                mirror_to_delta(led, spark, ledger_path=lp, audit_path=ap_, full=True)
                xs = []
                for k in range(args.releases):
                    rid = f"x{full}{k}"
                    _reserve(led, "b", rid)
                    led.commit(rid, "bench-run")
                    led.append_audit("bench", "publish", "s", "v", "published", rid, None, None)
                    t0 = time.perf_counter()
                    mirror_to_delta(led, spark, ledger_path=lp, audit_path=ap_, full=full)
                    xs.append(time.perf_counter() - t0)
                res[full] = statistics.median(xs[1:])
            t0 = time.perf_counter()
            led.verify()
            verify = time.perf_counter() - t0
        if j == 0:
            continue
        out[n] = res
        print(f"entries {n:>6,} (filled in {fill:.0f}s): refresh after one release: incremental {res[False]:.3f}s  "
              f"full rewrite {res[True]:.3f}s  (verify() alone {verify:.3f}s)", flush=True)
    lo, hi = min(out), max(out)
    print(f"ratio {hi:,} / {lo:,} entries: incremental {out[hi][False] / out[lo][False]:.2f}  "
          f"full {out[hi][True] / out[lo][True]:.2f}   TARGET incremental within 2x: "
          f"{'PASS' if out[hi][False] / out[lo][False] <= 2 else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
