"""kill -9 at every stage of a release, then a rerun: one release, one charge, no duplicate cell.

A real process (tests/jobs/kill_driver.py, its own JVM) publishes ``dau_daily`` and is killed
with SIGKILL, with its whole process group (the Python driver, its JVM, its Python workers),
at one stage: after the reservation, in the aggregation, inside the release write's Spark job
(Delta's transaction open), after the write before the ledger commit, after the ledger commit
before the version record, and during the derived tables' refresh (the ledger mirror and
``_published``, in the background). Then
this process reruns the same spec on the same input once the 2 s lease has expired. Whatever
the stage: the rerun succeeds; the ledger holds one entry for the release, committed, and the
budget was charged once; the release table holds each cell of the release once; the family's
current version (in the ledger) is the release, versioned once; and once the rerun's engine is
closed the derived Delta tables (the ledger mirror, ``_published``) equal the ledger.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dp_spark.core.budget import ZCDP

from .conftest import ROOT, child_env, register

DRIVER = Path(__file__).with_name("kill_driver.py")
# stage -> the rerun's status
EXPECTED = {
    "reserved": "published",  # took the reservation over: no second charge
    "aggregation": "published",
    "write": "published",
    "before_commit": "healed",  # found the written release by id, committed the reservation
    "versions": "cache_hit",  # committed: served, and versioned by the rerun
    "refresh": "cache_hit",
}


def run_until(args: list[str], marker: Path, timeout: float = 400) -> subprocess.Popen:
    """Start the driver; return it once ``marker`` exists (it is then stopped there)."""
    proc = subprocess.Popen([sys.executable, str(DRIVER), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=child_env(), cwd=str(ROOT), start_new_session=True,
                            stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            kill(proc)
            out, err = proc.communicate(timeout=60)
            pytest.fail(f"the run never reached {marker.name} (exit {proc.returncode}):\n{out[-2000:]}\n{err[-4000:]}")
        time.sleep(0.1)
    return proc


def kill(proc: subprocess.Popen) -> None:
    """kill -9 of the run's whole process group (driver, JVM, Python workers)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(60)


def check_one_release(spark, env, result, *, charge=ZCDP("0.25")):
    """One release, one charge, no duplicate cell, versioned once, the mirror equal to the ledger."""
    from dp_spark.governance.versions import current_release_id, history, published_path_for
    from dp_spark.ledger import open_ledger

    with open_ledger(env.ledger_url) as ledger:
        entries = [e for e in ledger.entries("demo_events_user")]
        assert [(e.release_id, e.state) for e in entries] == [(result.release_id, "committed")]
        assert ledger.status("demo_events_user").spent == charge
        ledger_rows = {(e.release_id, e.state) for e in entries}
        assert current_release_id(ledger, result.family) == result.release_id
        assert [v["release_id"] for v in history(ledger, result.family)] == [result.release_id]  # versioned once
    table = spark.read.format("delta").load(result.table_path)
    cells = [(r["release_id"], r["statistic"], r["key"]) for r in table.collect()]
    assert len(cells) == len(set(cells)) == len(result.rows) > 0
    assert {c[0] for c in cells} == {result.release_id}
    stored = sorted((r["statistic"], r["key"], r["value"]) for r in table.collect())
    assert stored == sorted((r["statistic"], r["key"], r["value"]) for r in result.rows)
    published = [(r["family"], r["release_id"], r["state"])
                 for r in spark.read.format("delta").load(published_path_for(env.output_root)).collect()]
    assert published == [(result.family, result.release_id, "current")]  # the derived copy caught up
    mirrored = {(r["release_id"], r["state"]) for r in spark.read.format("delta").load(env.ledger_mirror).collect()}
    assert mirrored == ledger_rows


@pytest.mark.slow
@pytest.mark.parametrize("stage", list(EXPECTED))
def test_kill_9_at_every_stage_then_rerun(spark, warehouse, tmp_path, stage):
    from dp_spark.config import load_env
    from dp_spark.engine import Engine

    sync = tmp_path / "sync"
    sync.mkdir()
    marker = sync / ("started" if stage == "write" else f"at.{stage}")
    proc = run_until([str(warehouse), "dau_daily", str(sync), "--stop-at", stage], marker)
    kill(proc)
    time.sleep(2.5)  # the killed run's 2 s lease expires
    env = load_env(warehouse)
    with Engine(env, spark=spark, principal="publisher_bob") as engine:
        result = engine.publish(register(warehouse, "dau_daily"))
    assert result.status == EXPECTED[stage], (stage, result.status)
    assert result.charge is None  # the killed run made the charge; the rerun charged nothing
    check_one_release(spark, env, result)
