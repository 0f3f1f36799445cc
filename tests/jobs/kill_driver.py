"""One run of the at-most-once tests (tests/jobs/test_kill_stages.py): publish a spec of an
env, official, one release; or rerun it on several envs.

    python kill_driver.py [--remote URL] publish ENV_FILE SPEC_NAME SYNC_DIR [--stop-at STAGE]
    python kill_driver.py [--remote URL] rerun SPEC_NAME ENV_FILE [ENV_FILE ...]

Without ``--remote`` the run builds a local session (local[1], its own JVM, a child of this
process); with ``--remote sc://host:port`` it is a Spark Connect client of that server (no JVM
here: the server runs the Spark jobs and the Delta commits, and keeps running when this
process is killed).

``--stop-at STAGE``: when the run reaches STAGE it creates ``SYNC_DIR/at.STAGE`` and waits there
for ever: the test then kills it (kill -9 of its process group). Stages, in the order a release
goes through them:

    reserved       right after the budget's reservation
    aggregation    in the bounding + aggregation stage (the reservation held, nothing written)
    write          inside the release write's Spark job (Delta's transaction started, its key
                   looked up, its files being written): the stalled task creates
                   ``SYNC_DIR/started``
    before_commit  after the release write landed, before the ledger commit
    versions       after the ledger commit, before the version record
    refresh        during the refresh of the derived Delta tables (the ledger mirror's write, in
                   the background: the run waits for it in ``close()``)

``publish`` prints one JSON line {"status", "release_id", "charge", "family", "table_path",
"cells": [[statistic, key, value], ...]} when the run ends; ``rerun`` publishes the spec on each
env in turn (one engine each, closed: the derived tables refreshed) and prints one such line per
env, in order. Exit 0 then.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

STAGES = ("reserved", "aggregation", "write", "before_commit", "versions", "refresh")


def _stop_here(sync: Path, stage: str):
    (sync / f"at.{stage}").touch()
    while True:  # killed here
        time.sleep(1)


def _install(stage: str, sync: Path) -> None:
    import dp_spark.backends.spark as query
    import dp_spark.governance.versions as versions
    import dp_spark.delta.mirror as mirror
    import dp_spark.delta.release_table as writer
    from dp_spark.engine import Engine
    from tests.spark.stall import stalled

    if stage == "reserved":
        real_reserve = Engine._reserve

        def reserve(self, *a, **kw):
            real_reserve(self, *a, **kw)
            _stop_here(sync, stage)
        Engine._reserve = reserve
    elif stage == "aggregation":
        query.collect_query_partials = lambda *a, **kw: _stop_here(sync, stage)
    elif stage == "write":
        real_frame = writer._cells_frame
        writer._cells_frame = lambda s, rows: stalled(real_frame(s, rows), sync, timeout=3600)
    elif stage == "before_commit":
        Engine._commit_if_owner = lambda self, *a, **kw: _stop_here(sync, stage)
    elif stage == "versions":
        for name in ("record_publications", "record_publication"):
            setattr(versions, name, lambda *a, **kw: _stop_here(sync, stage))
    elif stage == "refresh":
        mirror._write = lambda *a, **kw: _stop_here(sync, stage)
    else:
        raise SystemExit(f"unknown stage {stage}")


def _publish(spark, env_file: str, spec_name: str) -> dict:
    from dp_spark.config import load_env, load_release_spec
    from dp_spark.engine import Engine

    env = load_env(env_file)
    spec = load_release_spec(Path(env_file).parents[1] / "releases" / f"{spec_name}.yaml")
    engine = Engine(env, spark=spark, principal="publisher_bob")
    try:
        result = engine.publish(spec)
    finally:
        engine.close()
    return {"status": result.status, "release_id": result.release_id,
            "charge": None if result.charge is None else str(result.charge),
            "family": result.family, "table_path": result.table_path,
            "cells": sorted([r["statistic"], r["key"], r["value"]] for r in result.rows)}


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--remote", help="a Spark Connect URL; default: a local session")
    sub = ap.add_subparsers(dest="command", required=True)
    pub = sub.add_parser("publish")
    pub.add_argument("env_file")
    pub.add_argument("spec")
    pub.add_argument("sync")
    pub.add_argument("--stop-at", choices=STAGES)
    rerun = sub.add_parser("rerun")
    rerun.add_argument("spec")
    rerun.add_argument("env_files", nargs="+")
    args = ap.parse_args(argv)

    from dp_spark.spark import get_or_create_session, is_connect_session

    spark = get_or_create_session("dp_spark-kill-driver", master="local[1]", remote=args.remote)
    assert is_connect_session(spark) == bool(args.remote), type(spark)
    if args.command == "publish":
        if args.stop_at:
            _install(args.stop_at, Path(args.sync))
        print(json.dumps(_publish(spark, args.env_file, args.spec)), flush=True)
    else:
        for env_file in args.env_files:
            print(json.dumps(_publish(spark, env_file, args.spec)), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
