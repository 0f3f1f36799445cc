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

The same on Spark Connect (``test_kill_9_of_a_connect_client_at_every_stage``): the killed
process is the Connect *client* (the driver's Python: the engine, the ledger, the noise); the
Connect server (the one of the test session, .ci/connect.sh) keeps running, and with it
whatever Spark operation the client had started. One module fixture kills one client per stage
(each on its own env), then ONE Connect client reruns all the envs. Inside the write, the
server's operation outlives its client, so its Delta commit either lands (once: released before
the rerun, ``write``: the rerun finds the release by id and heals) or not at all (released only
after the rerun took the reservation over and wrote, ``write_taken_over``: Delta refuses the
orphan's commit on the release's key) -- in both, one release, one charge, no duplicate cell.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.processes import kill_group
from dp_spark.core.budget import ZCDP

from .conftest import ROOT, child_env, make_warehouse, register

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
            kill_group(proc)
            out, err = proc.communicate(timeout=60)
            pytest.fail(f"the run never reached {marker.name} (exit {proc.returncode}):\n{out[-2000:]}\n{err[-4000:]}")
        time.sleep(0.1)
    return proc


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
    proc = run_until(["publish", str(warehouse), "dau_daily", str(sync), "--stop-at", stage], marker)
    kill_group(proc)
    time.sleep(2.5)  # the killed run's 2 s lease expires
    env = load_env(warehouse)
    with Engine(env, spark=spark, principal="publisher_bob") as engine:
        result = engine.publish(register(warehouse, "dau_daily"))
    assert result.status == EXPECTED[stage], (stage, result.status)
    assert result.charge is None  # the killed run made the charge; the rerun charged nothing
    check_one_release(spark, env, result)


# --------------------------------------------------------------------------------------
# Spark Connect: the killed process is the client; the server keeps running
# --------------------------------------------------------------------------------------
#: stage -> the Connect rerun's status: as on a local session, except inside the write, where
#: the server finishes the killed client's operation (see the module docstring)
CONNECT_EXPECTED = dict(EXPECTED, write="healed", write_taken_over="published")
ORPHAN_SETTLE = 5.0  # seconds given to the orphaned write between its data file and its commit


def _rows(spark, path: str) -> int:
    try:
        return spark.read.format("delta").load(path).count()
    except Exception:  # no table yet
        return 0


def _in_progress(path: str) -> set[str]:
    """Data files in the table's directory still being written (no Parquet footer yet: a
    closed Parquet file ends with the magic ``PAR1``, after its footer)."""
    open_files = set()
    for f in Path(path).glob("*.parquet"):
        with open(f, "rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(0, size - 4))
            if size < 12 or fh.read(4) != b"PAR1":
                open_files.add(f.name)
    return open_files


@pytest.fixture(scope="module")
def connect_kills(connect_url, spark, demo_input, tmp_path_factory):
    """Kill one Connect client per stage, then rerun every env in ONE Connect client. Returns
    {stage: (env, rerun result, facts)}; prints each phase's seconds."""
    from dp_spark.config import load_env

    t0 = time.monotonic()
    runs, facts = {}, {}
    for stage in CONNECT_EXPECTED:
        base = tmp_path_factory.mktemp(f"connect_{stage}")
        env_file = make_warehouse(base, demo_input)
        sync = base / "sync"
        sync.mkdir()
        driver_stage = "write" if stage.startswith("write") else stage
        marker = sync / ("started" if driver_stage == "write" else f"at.{stage}")
        proc = run_until(["--remote", connect_url, "publish", str(env_file), "dau_daily", str(sync),
                          "--stop-at", driver_stage], marker)
        kill_group(proc)  # the client only: the server still runs its held write
        env = load_env(env_file)
        table = f"{env.output_root}/dau_daily"
        if stage == "write":  # let the orphaned write go on now: its commit lands, once
            (sync / "go").touch()
            deadline = time.monotonic() + 120
            while _rows(spark, table) == 0 and time.monotonic() < deadline:
                time.sleep(0.5)
            facts[stage] = {"orphan_landed_rows": _rows(spark, table)}
        runs[stage] = (env_file, env, sync, table)
    killed = time.monotonic() - t0
    time.sleep(2.5)  # the killed clients' 2 s leases expire

    # ONE client reruns every env; the taken-over write's env first, its orphan released as
    # soon as the rerun of that env is done (the orphan holds one of the server's task slots)
    order = ["write_taken_over"] + [s for s in CONNECT_EXPECTED if s != "write_taken_over"]
    t1 = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(DRIVER), "--remote", connect_url, "rerun", "dau_daily",
                             *(str(runs[s][0]) for s in order)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=child_env(), cwd=str(ROOT), start_new_session=True,
                            stdin=subprocess.DEVNULL)
    results = {}
    try:
        for line in proc.stdout:
            if line.startswith("{"):
                stage = order[len(results)]
                results[stage] = json.loads(line)
                if stage == "write_taken_over":  # the orphan's data file is open, held
                    held = _in_progress(runs[stage][3])
                    (runs[stage][2] / "go").touch()
        err = proc.stderr.read()
        proc.wait(600)
    finally:
        if proc.poll() is None:
            kill_group(proc)
    assert proc.returncode == 0 and len(results) == len(order), f"rerun exit {proc.returncode}:\n{err[-4000:]}"
    rerun = time.monotonic() - t1

    # the taken-over write, released after the rerun: its data file is finished (closed, not
    # deleted by an abort), then its commit is refused (check_one_release: only the rerun's
    # draw is in the table)
    table = runs["write_taken_over"][3]
    deadline = time.monotonic() + 120
    while held & _in_progress(table) and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(ORPHAN_SETTLE)
    finished = {f.name for f in Path(table).glob("*.parquet")} & held
    facts["write_taken_over"] = {"held": len(held), "finished": len(finished - _in_progress(table))}
    print(f"\nconnect kill stages: kills {killed:.0f}s, one rerun client {rerun:.0f}s, "
          f"total {time.monotonic() - t0:.0f}s")
    return {s: (runs[s][1], results[s], facts.get(s, {})) for s in CONNECT_EXPECTED}


@pytest.mark.slow
@pytest.mark.parametrize("stage", list(CONNECT_EXPECTED))
def test_kill_9_of_a_connect_client_at_every_stage(spark, connect_kills, stage):
    env, res, facts = connect_kills[stage]
    assert res["status"] == CONNECT_EXPECTED[stage], (stage, res["status"])
    assert res["charge"] is None  # the killed client made the charge; the rerun charged nothing
    if stage == "write":  # the orphaned commit landed (once) before the rerun, which healed it
        assert facts["orphan_landed_rows"] == len(res["cells"])
    if stage == "write_taken_over":  # the orphan finished its file; Delta refused its commit
        assert facts == {"held": 1, "finished": 1}, facts
    result = SimpleNamespace(release_id=res["release_id"], family=res["family"], table_path=res["table_path"],
                             rows=[{"statistic": c[0], "key": c[1], "value": c[2]} for c in res["cells"]])
    check_one_release(spark, env, result)
