"""Ledger cost per release: one ``reserve`` + one ``commit`` against a budget that already
holds 1, 1,000 and 10,000 entries, on SQLite and (with a DSN) PostgreSQL.

    .venv/bin/python benchmarks/ledger_cost.py
    .venv/bin/python benchmarks/ledger_cost.py --pg postgresql://user@host:5432/db
    DP_SPARK_BENCH_PG_DSN=postgresql://... .venv/bin/python benchmarks/ledger_cost.py
    .venv/bin/python benchmarks/ledger_cost.py --sizes 1,1000 --releases 20   # quicker

The write path verifies the chain's tail from its MAC'd head and reads ``spent`` from the MAC'd
spend summary, so the cost should not grow with the entry count: the last line per store is
the ratio of the cost at the largest size to the cost at 1 entry (about 1 when O(1)).

How the ledger is filled: through the ledger API (``reserve`` only; the entries stay
reserved, which counts as spent exactly like committed), one transaction per entry, so the
fill is what a real workload writes (SQLite: a temporary file; PostgreSQL: a schema
``bench_<random>`` dropped afterwards). Each size gets its own budget in the same database;
the budget's window is ``none`` unless ``--window`` says otherwise. Each figure is the median
over ``--releases`` fresh releases (reserve + commit, new release id each), after two warm-up
releases, taken round-robin over the sizes once all are filled (same database, same load). With ``--full-verify`` it also times ``verify()`` of the budget at each size, for
comparison (that one is O(entries) by design).
"""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dp_spark.core.budget import PureDP  # noqa: E402
from dp_spark.ledger import open_ledger  # noqa: E402
from dp_spark.ledger.policy import BudgetPolicy, WindowPolicy  # noqa: E402

PG_ENV = "DP_SPARK_BENCH_PG_DSN"
KEY = b"dp_spark ledger benchmark key, not secret"
CHARGE = PureDP("1/1000000")


def _reserve(ledger, budget_id: str, release_id: str):
    return ledger.reserve(budget_id, release_id, CHARGE, "{}", principal="bench", code_version="v1",
                          release_family="bench", owner_token="bench-run", lease_seconds=600)


def _policy(budget_id: str, window: str) -> BudgetPolicy:
    kind, _, days = window.partition(":")
    return BudgetPolicy(budget_id=budget_id, dataset="bench", privacy_unit="user", measure="pure_dp",
                        cap=PureDP(1000), window=WindowPolicy(kind, int(days) if days else None))


def measure(url: str, sizes: list[int], releases: int, window: str, full_verify: bool) -> dict[int, dict]:
    out: dict[int, dict] = {n: {} for n in sizes}
    with open_ledger(url, key=KEY) as ledger:
        for n in sizes:
            bid = f"bench_{n}"
            ledger.register_budget(_policy(bid, window))
            t0 = time.perf_counter()
            for i in range(n):
                _reserve(ledger, bid, f"{bid}-fill-{i}")
            fill = time.perf_counter() - t0
            out[n].update(fill_s=fill, fill_per_entry_ms=fill / n * 1e3)
        # timed releases, round-robin over the sizes (same database state and machine load)
        times: dict[int, list[float]] = {n: [] for n in sizes}
        for k in range(releases + 2):
            for n in sizes:
                bid, rid = f"bench_{n}", f"bench_{n}-rel-{k}"
                t = time.perf_counter()
                _reserve(ledger, bid, rid)
                ledger.commit(rid, "bench-run")
                if k >= 2:  # two warm-up releases
                    times[n].append(time.perf_counter() - t)
        for n in sizes:
            row = out[n]
            row.update(median_ms=statistics.median(times[n]) * 1e3, min_ms=min(times[n]) * 1e3)
            if full_verify:
                t = time.perf_counter()
                ledger.verify(f"bench_{n}")
                row["verify_ms"] = (time.perf_counter() - t) * 1e3
            print(f"  {n:>6} entries: reserve+commit median {row['median_ms']:7.2f} ms (min {row['min_ms']:.2f})"
                  f"   [fill {row['fill_s']:6.1f} s, {row['fill_per_entry_ms']:.2f} ms/entry]"
                  + (f"   verify() {row['verify_ms']:8.1f} ms" if full_verify else ""), flush=True)
    return out


def report(name: str, res: dict[int, dict]) -> None:
    sizes = sorted(res)
    lo, hi = sizes[0], sizes[-1]
    ratio = res[hi]["median_ms"] / res[lo]["median_ms"]
    print(f"  ratio {hi:,} vs {lo:,} entries ({name}): {ratio:.2f}x")


def _pg_schema(dsn: str):
    import psycopg

    schema = "bench_" + secrets.token_hex(6)
    admin = psycopg.connect(dsn, autocommit=True)
    admin.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in dsn else "?"
    return admin, schema, f"{dsn}{sep}options=-csearch_path%3D{schema}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pg", default=os.environ.get(PG_ENV), help=f"PostgreSQL DSN (default ${PG_ENV})")
    ap.add_argument("--sizes", default="1,1000,10000", help="entry counts (default 1,1000,10000)")
    ap.add_argument("--releases", type=int, default=50, help="timed releases per size (default 50)")
    ap.add_argument("--window", default="none", help="none | daily | monthly | rolling:DAYS (default none)")
    ap.add_argument("--full-verify", action="store_true", help="also time verify() of the budget")
    ap.add_argument("--no-sqlite", action="store_true")
    args = ap.parse_args(argv)
    sizes = sorted({int(x) for x in args.sizes.split(",")})
    print(f"ledger cost per release (reserve + commit), window {args.window}; "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    if not args.no_sqlite:
        with tempfile.TemporaryDirectory() as d:
            print(f"SQLite ({d}/ledger.db):")
            report("SQLite", measure(f"sqlite:{d}/ledger.db", sizes, args.releases, args.window, args.full_verify))
    if args.pg:
        admin, schema, url = _pg_schema(args.pg)
        try:
            print(f"PostgreSQL (schema {schema}):")
            report("PostgreSQL", measure(url, sizes, args.releases, args.window, args.full_verify))
        finally:
            admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            admin.close()
    else:
        print(f"PostgreSQL: skipped (pass --pg DSN or set ${PG_ENV})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
