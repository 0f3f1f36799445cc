"""``dp-spark budget status|history|verify`` (python -m dp_spark.cli budget)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from dp_spark.core.budget import ZCDP
from dp_spark.ledger import open_ledger
from dp_spark.cli.budget import budget_command
from dp_spark.ledger.policy import load_policies

REPO = Path(__file__).resolve().parents[2]
POLICIES = str(REPO / "conf" / "policies" / "budgets.yaml")


ROOT = Path(__file__).resolve().parents[2]


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = budget_command(list(argv), out=out, err=err)
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture
def used_ledger(tmp_path):
    url = f"sqlite:{tmp_path / 'warehouse' / 'ledger.db'}"
    policy = load_policies(POLICIES)["demo_events_user"]
    with open_ledger(url) as led:
        led.register_budget(policy)
        for rid, fam in (("rel-dau-1", "dau_daily"), ("rel-aov-1", "aov_by_region")):
            led.reserve(policy.budget_id, rid, ZCDP("0.25"), "{}", principal="alice", code_version="v1",
                        release_family=fam, owner_token="o")
        led.commit("rel-dau-1", "o")
    return url


def test_status_shows_cap_spent_remaining_window_and_releases(used_ledger):
    rc, out, err = run("status", "--ledger", used_ledger, "--policies", POLICIES)
    assert rc == 0, err
    block = out.split("budget demo_events_user_pure")[0]
    assert "budget demo_events_user" in block
    assert "cap        rho=2" in block and "spent      rho=0.5" in block and "remaining  rho=1.5" in block
    assert "window     monthly, " in block and "statement delta 1e-07" in block
    assert "rel-dau-1" in block and "dau_daily" in block and "committed" in block
    assert "rel-aov-1" in block and "reserved" in block
    # declared but never used: shown with nothing spent
    assert "budget demo_events_user_pure" in out and "declared but never used" in out


def test_status_of_one_budget_as_json(used_ledger):
    rc, out, _ = run("status", "--budget", "demo_events_user", "--ledger", used_ledger, "--policies", POLICIES,
                     "--json")
    assert rc == 0
    [b] = json.loads(out)
    assert b["spent"] == {"measure": "zcdp", "rho": "1/2"} and b["remaining"]["rho"] == "3/2"
    assert {r["release_id"] for r in b["releases"]} == {"rel-dau-1", "rel-aov-1"}


def test_history_lists_every_release(used_ledger):
    rc, out, _ = run("history", "--budget", "demo_events_user", "--ledger", used_ledger, "--policies", POLICIES)
    assert rc == 0
    assert "2 releases" in out
    lines = [line for line in out.splitlines() if line.strip().startswith(("1 ", "2 "))]
    assert len(lines) == 2 and "rel-dau-1" in lines[0] and "rho=0.25" in lines[0]


def test_verify_and_errors(used_ledger, tmp_path):
    assert run("verify", "--ledger", used_ledger)[0] == 0
    rc, _, err = run("status", "--budget", "nope", "--ledger", used_ledger, "--policies", POLICIES)
    assert rc == 1 and "unknown budget 'nope'" in err
    rc, _, err = run("status", "--ledger", used_ledger, "--policies", str(tmp_path / "none.yaml"))
    assert rc == 2 and "not found" in err  # a configuration error
    assert run("history", "--ledger", used_ledger)[0] == 2  # --budget is required
    assert run("bogus")[0] == 2


def test_missing_ledger_is_an_error_naming_its_path_and_is_not_created(tmp_path):
    url = f"sqlite:{tmp_path / 'nowhere' / 'ledger.db'}"
    for argv in (("status",), ("history", "--budget", "demo_events_user"), ("verify",)):
        rc, out, err = run(*argv, "--ledger", url, "--policies", POLICIES)
        assert rc == 2 and out == "", argv
        assert f"no ledger at {tmp_path / 'nowhere' / 'ledger.db'}" in err and "Traceback" not in err
    assert not (tmp_path / "nowhere").exists()


def test_a_budget_declared_but_never_used_shows_nothing_spent(used_ledger):
    rc, out, _ = run("status", "--budget", "demo_events_user_pure", "--ledger", used_ledger, "--policies", POLICIES)
    assert rc == 0 and "declared but never used" in out


def test_ledger_url_from_environment(used_ledger, monkeypatch):
    monkeypatch.setenv("DP_SPARK_LEDGER_URL", used_ledger)
    rc, out, _ = run("history", "--budget", "demo_events_user", "--policies", POLICIES)
    assert rc == 0 and "rel-aov-1" in out


def test_runs_as_a_module(used_ledger):
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-m", "dp_spark.cli", "budget", "status", "--ledger", used_ledger],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "budget demo_events_user" in proc.stdout and "remaining" in proc.stdout


# -- accept-policy (issue 13, item 15) ----------------------------------------------------
def _policy_env(tmp_path, name="local"):
    import shutil

    import yaml

    pol = tmp_path / "conf" / "policies"
    pol.mkdir(parents=True)
    shutil.copy(ROOT / "conf/policies/budgets.yaml", pol / "budgets.yaml")
    (pol / "access.yaml").write_text(yaml.safe_dump({"version": 1, "releases_dir": str(tmp_path), "principals": {
        "publisher_bob": {"roles": ["publisher"]}, "admin_carol": {"roles": ["admin"]}}}))
    (tmp_path / "conf" / "envs").mkdir(parents=True)
    env = tmp_path / "conf" / "envs" / "t.yaml"
    env.write_text(yaml.safe_dump({"name": name, "warehouse": str(tmp_path / "wh"), "datasets": {},
                                   "policies": str(pol / "budgets.yaml"),
                                   "ledger_url": f"sqlite:{tmp_path}/wh/ledger.db"}))
    return env, pol / "budgets.yaml"


def test_an_edited_cap_is_refused_until_an_admin_accepts_it(tmp_path, monkeypatch):
    import yaml

    from dp_spark.ledger.records import PolicyChangedError

    env, budgets = _policy_env(tmp_path)
    url = f"sqlite:{tmp_path}/wh/ledger.db"
    with open_ledger(url) as led:
        led.register_budget(load_policies(budgets)["demo_events_user"])  # what a publish does first
    doc = yaml.safe_load(budgets.read_text())
    doc["budgets"]["demo_events_user"]["cap"] = {"rho": 20.0}  # edited upward
    budgets.write_text(yaml.safe_dump(doc))
    with open_ledger(url) as led:
        with pytest.raises(PolicyChangedError, match="accept-policy --budget demo_events_user"):
            led.register_budget(load_policies(budgets)["demo_events_user"])  # the next publish: refused
        assert led.get_policy("demo_events_user").cap == ZCDP(2, Fraction(1, 10**6))

    # a publisher cannot accept it (refused, audited)
    monkeypatch.setenv("DP_SPARK_PRINCIPAL", "publisher_bob")
    code, _, err = run("accept-policy", "--budget", "demo_events_user", "--reason", "more", "--env", str(env))
    assert code == 1 and "may not admin" in err and "role admin is required" in err
    with open_ledger(url) as led:
        assert led.audit_rows()[-1].decision == "refused_permission"
        assert len(led.policy_history("demo_events_user")) == 1

    # the admin accepts it: recorded in the history and the audit log; the publish proceeds
    monkeypatch.setenv("DP_SPARK_PRINCIPAL", "admin_carol")
    code, out, err = run("accept-policy", "--budget", "demo_events_user", "--reason", "yearly review",
                         "--env", str(env))
    assert code == 0, err
    assert "policy version 2 accepted by admin_carol" in out and "cap:" in out
    with open_ledger(url) as led:
        led.register_budget(load_policies(budgets)["demo_events_user"])
        assert led.get_policy("demo_events_user").cap == ZCDP(20, Fraction(1, 10**6))
        hist = led.policy_history("demo_events_user")
        assert [(h.version, h.principal, h.reason) for h in hist][1] == (2, "admin_carol", "yearly review")
        row = led.audit_rows()[-1]
        assert (row.principal, row.action, row.decision) == ("admin_carol", "admin", "policy_accepted")
        led.verify()
    code, out, _ = run("accept-policy", "--budget", "demo_events_user", "--reason", "again", "--env", str(env))
    assert code == 0 and "nothing to accept" in out
