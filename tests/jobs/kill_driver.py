"""One run of the at-most-once tests (tests/jobs/test_kill_stages.py): publish a spec of an
env, official, one release.

    python kill_driver.py ENV_FILE SPEC_NAME SYNC_DIR [--stop-at STAGE]

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

Prints one JSON line {"status", "release_id", "charge", "cells": [[statistic, key, value], ...]}
when the run ends; exits 0 then.
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


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("env_file")
    ap.add_argument("spec")
    ap.add_argument("sync")
    ap.add_argument("--stop-at", choices=STAGES)
    args = ap.parse_args(argv)
    sync = Path(args.sync)

    from dp_spark.spark import get_or_create_session

    spark = get_or_create_session("dp_spark-kill-driver", master="local[1]")
    from dp_spark.config import load_env, load_release_spec
    from dp_spark.engine import Engine

    env = load_env(args.env_file)
    spec = load_release_spec(Path(args.env_file).parents[1] / "releases" / f"{args.spec}.yaml")
    if args.stop_at:
        _install(args.stop_at, sync)
    engine = Engine(env, spark=spark, principal="publisher_bob")
    result = engine.publish(spec)
    engine.close()
    print(json.dumps({"status": result.status, "release_id": result.release_id,
                      "charge": None if result.charge is None else str(result.charge),
                      "cells": sorted([r["statistic"], r["key"], r["value"]] for r in result.rows)}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
