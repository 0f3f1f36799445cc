"""The at-most-once release write on Spark Connect: the concurrent-writer and takeover tests of
tests/jobs/test_publish_e2e.py (which run on the local session) run again, unchanged, on a
Spark Connect session of the test session's one server (.ci/connect.sh).

They run in ONE client process (tests/jobs/connect_runner.py; pyspark switches a whole process
to Connect once a remote session exists), each on its own env; a module fixture runs them
once and each test here reports one. The Delta commits, the held Spark task of a write "in the
middle of its commit" and Delta's conflict check on the release's key all happen in the server;
the engine, the ledger and the noise in the client.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import ROOT, child_env, make_warehouse

RUNNER = Path(__file__).with_name("connect_runner.py")
#: the tests of test_publish_e2e.py run again on Spark Connect
CASES = (
    "test_two_concurrent_runs_one_output_one_charge",  # a concurrent writer of the same release id
    "test_takeover_while_the_first_run_lives_its_write_is_skipped",
    "test_takeover_inside_the_first_runs_commit_makes_it_fail",  # takeover in the middle of a commit
    "test_takeover_while_the_first_run_lives_its_write_lands_first",
    "test_crash_before_write_rerun_reuses_reservation",
    "test_crash_after_write_is_healed",
)


@pytest.fixture(scope="module")
def connect_outcomes(connect_url, demo_input, tmp_path_factory):
    args = []
    for case in CASES:
        base = tmp_path_factory.mktemp(case[5:40])
        make_warehouse(base, demo_input)
        args.append(f"test_publish_e2e::{case}={base}")
    out = tmp_path_factory.mktemp("connect_runner") / "outcomes.json"
    t0 = time.monotonic()
    run = subprocess.run([sys.executable, str(RUNNER), connect_url, str(out), *args], capture_output=True,
                         text=True, timeout=1200, env=child_env(), cwd=str(ROOT), stdin=subprocess.DEVNULL)
    assert run.returncode == 0 and out.is_file(), f"exit {run.returncode}:\n{run.stderr[-4000:]}"
    outcomes = json.loads(out.read_text())
    print(f"\nconnect runner: {len(CASES)} tests in one client, {time.monotonic() - t0:.0f}s: "
          + ", ".join(f"{k.split('::')[1]} {v['seconds']}s" for k, v in outcomes.items()))
    return outcomes


@pytest.mark.parametrize("case", CASES)
def test_on_spark_connect(connect_outcomes, case):
    outcome = connect_outcomes[f"test_publish_e2e::{case}"]
    assert outcome["ok"], f"{case} on Spark Connect ({outcome['seconds']}s):\n{outcome['error']}"
