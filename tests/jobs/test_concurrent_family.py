"""Concurrent releases of one family (issue 13, item 3).

N real processes publish different one-day restrictions of ``dau_daily`` (as two ``--date``
backfills of the daily refresh would) on one throwaway env and SQLite ledger, each on its own
local session or each a Spark Connect client of the test session's one server, start together,
and call ``finish()`` only once all of them have published: each finish() sees the others'
releases committed but not yet versioned. All must exit 0; every release is versioned exactly
once and the statement written last lists all of them.

Plus the rule itself, on hand-made inputs: what is pending (another live run's release) and
what is still a real inconsistency.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import pytest

from dp_spark.config import load_release_spec
from dp_spark.governance.statement import privacy_statement, statement_markdown
from tests.governance.test_statement import (  # noqa: F401  (the ledger fixture)
    DAU,
    NOV,
    charge_release,
    ledger,
    rows_for,
    version,
)
from tests.jobs.conftest import child_env, write_env

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("concurrent_family_driver.py")
DAYS = ["2026-11-01", "2026-11-02", "2026-11-03"]


# --------------------------------------------------------------------------------------
# the rule, without Spark
# --------------------------------------------------------------------------------------
def reserve_only(led, rid, at, lease_seconds=60):
    led.clock.t = at
    led.reserve("demo_events_user", rid, DAU.charge, "{}", principal="publisher_bob", code_version="0.1.0",
                release_family="dau_daily", owner_token="own-" + rid, lease_seconds=lease_seconds)


def problems(d):
    return " | ".join(d["consistency"]["problems"])


def test_other_runs_releases_in_flight_are_pending_not_problems(ledger):  # noqa: F811
    charge_release(ledger, "mine", "dau_daily", DAU.charge, NOV)
    charge_release(ledger, "theirs_committed", "dau_daily", DAU.charge, NOV + timedelta(seconds=5))
    reserve_only(ledger, "theirs_reserved", NOV + timedelta(seconds=6))
    rows = (rows_for(DAU, "mine", NOV.replace(tzinfo=None))
            + rows_for(DAU, "theirs_committed", NOV.replace(tzinfo=None))
            + rows_for(DAU, "theirs_reserved", NOV.replace(tzinfo=None)))
    versions = [version(1, "mine", "current", NOV)]
    now = NOV + timedelta(seconds=10)
    d = privacy_statement("dau_daily", [DAU], ledger, rows, versions, now=now, lease_seconds=60)
    assert d["consistency"] == {"ok": True, "problems": []}
    assert [p["release_id"] for p in d["pending"]] == ["theirs_committed", "theirs_reserved"]
    assert "not versioned yet" in d["pending"][0]["why"] and "live run" in d["pending"][1]["why"]
    assert [v["release_id"] for v in d["versions"]] == ["mine"]
    kinds = {r["release_id"]: r["kind"] for r in d["charges"]["per_release"]}
    assert kinds["theirs_reserved"].startswith("pending") and kinds["mine"] == "official"
    assert "## Pending releases" in statement_markdown(d)
    # the default lease is the one the entry was reserved with (60 s here)
    d = privacy_statement("dau_daily", [DAU], ledger, rows, versions, now=now)
    assert d["consistency"]["ok"], d["consistency"]


def test_beyond_the_lease_it_is_a_real_inconsistency_again(ledger):  # noqa: F811
    charge_release(ledger, "mine", "dau_daily", DAU.charge, NOV)
    charge_release(ledger, "orphan", "dau_daily", DAU.charge, NOV + timedelta(seconds=5))
    reserve_only(ledger, "crashed", NOV + timedelta(seconds=6))
    rows = (rows_for(DAU, "mine", NOV.replace(tzinfo=None)) + rows_for(DAU, "orphan", NOV.replace(tzinfo=None))
            + rows_for(DAU, "crashed", NOV.replace(tzinfo=None)))
    versions = [version(1, "mine", "current", NOV)]
    later = NOV + timedelta(seconds=5 + 61)
    d = privacy_statement("dau_daily", [DAU], ledger, rows, versions, now=later, lease_seconds=60)
    p = problems(d)
    assert "orphan is in the official table but has no version (committed" in p
    assert "crashed: ledger entry is reserved, not committed" in p and "crashed is in the official table" in p
    assert d["pending"] == []
    # a versioned release without rows, and a version whose entry is only reserved, stay problems
    d = privacy_statement("dau_daily", [DAU], ledger, rows_for(DAU, "mine", NOV.replace(tzinfo=None)),
                          versions + [version(2, "orphan", "superseded", NOV), version(3, "crashed", "current", NOV)],
                          now=NOV + timedelta(seconds=10), lease_seconds=60)
    p = problems(d)
    assert "orphan has no rows in the official release table" in p
    assert "ledger entry of release crashed is not committed" in p


# --------------------------------------------------------------------------------------
# N real processes
# --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_input(spark, tmp_path_factory) -> Path:
    from dp_spark.demo_data import generate_events

    path = tmp_path_factory.mktemp("concurrent_input") / "demo_events"
    generate_events(spark, n_users=300, days=5, start_date=date(2026, 11, 1), seed=5, heavy_users=1,
                    heavy_rows=100).write.format("delta").mode("overwrite").save(str(path))
    return path


def test_concurrent_runs_of_one_family_all_finish(spark, tmp_path, small_input, backend):
    import shutil

    from dp_spark.config import load_env
    from dp_spark.governance.versions import history
    from dp_spark.ledger import open_ledger

    env_file = write_env(tmp_path, lease_seconds=300)  # a live run's lease outlasts this test
    shutil.copytree(small_input, tmp_path / "wh" / "input" / "demo_events")
    sync = tmp_path / "sync"
    sync.mkdir()
    remote = [backend] if backend else []  # a Connect URL, or a local session each
    procs = [subprocess.Popen([sys.executable, str(DRIVER), str(env_file), day, str(sync), str(len(DAYS)), *remote],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
                              cwd=str(ROOT), start_new_session=True, stdin=subprocess.DEVNULL)
             for day in DAYS]
    try:
        deadline = time.monotonic() + 240
        while len(list(sync.glob("ready.*"))) < len(DAYS) and time.monotonic() < deadline \
                and all(p.poll() is None for p in procs):
            time.sleep(0.2)
        (sync / "go").touch()  # all start publishing together
        outs = [p.communicate(timeout=400) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
    failed = [(day, p.returncode, err[-3000:]) for day, p, (_, err) in zip(DAYS, procs, outs) if p.returncode != 0]
    assert not failed, "\n\n".join(f"{d}: exit {rc}\n{err}" for d, rc, err in failed)
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert all(r["status"] == "published" for r in results), results
    rids = {r["release_id"] for r in results}
    assert len(rids) == len(DAYS)

    env = load_env(env_file)
    with open_ledger(env.ledger_url) as led:
        versions = history(led, "dau_daily")
    assert sorted(v["release_id"] for v in versions) == sorted(rids)  # each versioned exactly once
    assert sorted(v["version_no"] for v in versions) == list(range(1, len(DAYS) + 1))
    # each run publishes its own day of the series: a day is superseded only by that same day
    assert [v["state"] for v in versions].count("current") == len(DAYS)
    st = json.loads((Path(env.warehouse) / "statements" / "dau_daily.json").read_text())
    assert st["consistency"] == {"ok": True, "problems": []}
    assert st["pending"] == []  # the statement written last lists every release
    assert sorted(v["release_id"] for v in st["versions"]) == sorted(rids)
    assert [(d["day"], d["state"]) for d in st["days"]] == [(day, "current") for day in sorted(DAYS)]
    assert {r["release_id"] for r in st["charges"]["per_release"]} == rids
