"""``dp-spark budget rebuild-mirror --env ENV``: the Delta mirror rebuilt from the SQL ledger."""

from __future__ import annotations

import glob
import io
import os
from pathlib import Path

import yaml

from dp_spark.core.budget import ZCDP
from dp_spark.ledger import open_ledger
from dp_spark.cli.budget import budget_command
from dp_spark.ledger.policy import load_policies

REPO = Path(__file__).resolve().parents[2]
POLICIES = str(REPO / "conf" / "policies" / "budgets.yaml")


def _env(tmp_path) -> str:
    wh = tmp_path / "wh"
    wh.mkdir()
    env = {"name": "mirror-test", "warehouse": str(wh), "datasets": {"demo_events": str(wh / "events")},
           "policies": POLICIES}
    path = tmp_path / "env.yaml"
    path.write_text(yaml.safe_dump(env))
    return str(path)


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    return budget_command(list(argv), out=out, err=err), out.getvalue(), err.getvalue()


def test_rebuild_mirror_from_the_sql_ledger_and_over_a_damaged_mirror(spark, tmp_path):
    env_file = _env(tmp_path)
    wh = tmp_path / "wh"
    # no ledger yet: an error naming it (exit 2, a configuration error), and nothing is created
    rc, _, err = run("rebuild-mirror", "--env", env_file)
    assert rc == 2 and "no ledger" in err and not (wh / "ledger.db").exists()

    policy = load_policies(POLICIES)["demo_events_user"]
    with open_ledger(f"sqlite:{wh / 'ledger.db'}") as led:
        led.register_budget(policy)
        for rid in ("rel-1", "rel-2"):
            led.reserve(policy.budget_id, rid, ZCDP("0.25"), "{}", principal="alice", code_version="v1",
                        release_family="fam", owner_token="o")
        led.commit("rel-1", "o")
        led.append_audit(principal="alice", action="publish:official", spec_name="s", spec_version="v",
                         decision="published", release_id="rel-1", charge_json=None, detail="")
        n_audit = len(led.audit_rows())

    rc, out, err = run("rebuild-mirror", "--env", env_file)
    assert rc == 0, err
    assert f"2 entries -> {wh / 'ledger_mirror'}" in out and f"{n_audit} audit rows" in out
    entries = spark.read.format("delta").load(str(wh / "ledger_mirror"))
    assert sorted((r["release_id"], r["state"]) for r in entries.collect()) == [("rel-1", "committed"),
                                                                               ("rel-2", "reserved")]
    assert spark.read.format("delta").load(str(wh / "audit_mirror")).count() == n_audit

    # the mirror's log is damaged: the rebuild replaces it (derived data) and says so
    for f in glob.glob(str(wh / "ledger_mirror" / "_delta_log" / "*.crc")):
        os.remove(f)
    first = sorted(glob.glob(str(wh / "ledger_mirror" / "_delta_log" / "*.json")))[0]
    Path(first).write_text("{not json at all\n")
    spark.catalog.clearCache()
    rc, out, err = run("rebuild-mirror", "--env", env_file)
    assert rc == 0, err
    assert f"replaced damaged mirror table {wh / 'ledger_mirror'}" in out
    assert spark.read.format("delta").load(str(wh / "ledger_mirror")).count() == 2

