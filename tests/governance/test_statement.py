"""The privacy statement matches the release metadata and the ledger, after publish and rollback."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from dp_spark.accountant import Accountant
from dp_spark.core.budget import ZCDP, budget_from_json
from dp_spark.config import bounds_to_json, load_release_spec
from dp_spark.governance.statement import (
    LIMITATIONS,
    StatementInconsistentError,
    privacy_statement,
    specs_for_family,
    statement_markdown,
    summarise_release_rows,
    write_statement,
)
from dp_spark.ledger import load_policies, open_ledger

ROOT = Path(__file__).resolve().parents[2]
DAU = load_release_spec(ROOT / "conf/releases/dau_daily.yaml")
AOV = load_release_spec(ROOT / "conf/releases/aov_by_region.yaml")
POLICIES = load_policies(ROOT / "conf/policies/budgets.yaml")
POLICY = POLICIES["demo_events_user"]


class Clock:
    def __init__(self, t):
        self.t = t

    def __call__(self):
        return self.t


@pytest.fixture
def ledger(tmp_path):
    clk = Clock(datetime(2026, 11, 10, 12, tzinfo=timezone.utc))
    led = open_ledger(f"sqlite:{tmp_path}/ledger.db", key=b"statement-test-key-0123456789", clock=clk)
    led.register_budget(POLICY)
    led.clock = clk
    yield led
    led.close()


def charge_release(led, release_id, family, charge, at):
    led.clock.t = at
    r = led.reserve("demo_events_user", release_id, charge, "{}", principal="publisher_bob", code_version="0.1.0",
                    release_family=family, owner_token="own-" + release_id, lease_seconds=60)
    led.commit(release_id, r.entry.owner_token)


def rows_for(spec, release_id, at, *, suppressed=()):
    """Release-table rows as the engine writes them (metadata columns that matter here)."""
    st = Accountant("zcdp", statement_delta=POLICY.statement_delta).statement(spec.charge)
    out = []
    for k in spec.keys[:3]:
        out.append({
            "release_id": release_id, "release_family": spec.family, "release_name": spec.name,
            "spec_version": spec.version(), "mode": "official", "statistic": spec.metric, "key": k,
            "value": float("nan") if k in suppressed else 100.0, "suppressed": k in suppressed,
            "mechanism": "discrete_gaussian", "charge_json": json.dumps({"charge": spec.charge.to_json()}),
            "statement_epsilon": st["epsilon"], "statement_delta": st["delta"], "budget_id": spec.budget_id,
            "privacy_unit": "user", "unit_column": "user_id", "neighbouring": "add_remove_unit",
            "bounds_json": json.dumps(bounds_to_json(spec.bounds), sort_keys=True), "created_at": at,
            "input_version": 3,
        })
    return out


def version(no, rid, state, at, reason=None, changed_by=None):
    return {"family": "dau_daily", "version_no": no, "release_id": rid, "state": state, "reason": reason,
            "principal": "publisher_bob", "at": at, "changed_by": changed_by, "changed_at": at if changed_by else None}


NOV = datetime(2026, 11, 10, 12, tzinfo=timezone.utc)
DEC = datetime(2026, 12, 2, 9, tzinfo=timezone.utc)


@pytest.fixture
def published(ledger):
    """Two DAU releases (Nov, Dec) and one AOV release (Nov, same budget), all committed."""
    charge_release(ledger, "dau1", "dau_daily", DAU.charge, NOV)
    charge_release(ledger, "aov1", "aov_by_region", AOV.charge, NOV + timedelta(hours=1))
    charge_release(ledger, "dau2", "dau_daily", DAU.charge, DEC)
    rows = rows_for(DAU, "dau1", NOV.replace(tzinfo=None)) + \
        rows_for(DAU, "dau2", DEC.replace(tzinfo=None), suppressed=("2026-11-02",))
    versions = [version(1, "dau1", "superseded", NOV), version(2, "dau2", "current", DEC)]
    return ledger, rows, versions


def check_against_sources(d, ledger, rows, versions):
    """Every number of the statement, recomputed from the ledger and the rows."""
    entries = {e.release_id: e for e in ledger.entries("demo_events_user")}
    fam = {rid: e for rid, e in entries.items() if e.release_family == "dau_daily"}
    # charge per release = the ledger's
    assert {r["release_id"]: budget_from_json(r["charge"]) for r in d["charges"]["per_release"]} == \
        {rid: e.charge for rid, e in fam.items()}
    # per-release (epsilon, delta) of each version = the release rows'
    by_rel = {r["release_id"]: r for r in rows}
    for v in d["versions"]:
        assert v["statement"]["epsilon"] == by_rel[v["release_id"]]["statement_epsilon"]
        assert v["statement"]["delta"] == by_rel[v["release_id"]]["statement_delta"]
        assert budget_from_json(v["charge"]) == fam[v["release_id"]].charge
    # versions/current/errata = the versions rows
    assert [(v["version_no"], v["release_id"], v["state"]) for v in d["versions"]] == \
        [(v["version_no"], v["release_id"], v["state"]) for v in versions]
    cur = [v for v in versions if v["state"] == "current"]
    assert d["current"] == ({"version_no": cur[0]["version_no"], "release_id": cur[0]["release_id"]} if cur else None)
    assert [(e["release_id"], e["reason"]) for e in d["errata"]] == \
        [(v["release_id"], v["reason"]) for v in versions if v["state"] == "withdrawn"]
    # all-time totals = the ledger's sums (family, and the whole budget)
    t = d["charges"]["all_time"][0]
    assert budget_from_json(t["family_total"]) == sum((e.charge for e in fam.values()), ZCDP.zero())
    assert budget_from_json(t["budget_total"]) == sum((e.charge for e in entries.values()), ZCDP.zero())
    acc = Accountant("zcdp", statement_delta=POLICY.statement_delta)
    assert t["family_statement"]["epsilon"] == acc.statement(budget_from_json(t["family_total"]))["epsilon"]
    # suppressed keys = the rows'
    supp = {r["release_id"]: r["suppressed_keys"] for r in d["thresholds"]["per_release"]}
    for rid in supp:
        assert supp[rid] == sorted(r["key"] for r in rows if r["release_id"] == rid and r["suppressed"])


def test_statement_after_publish(published):
    ledger, rows, versions = published
    d = privacy_statement("dau_daily", [DAU, AOV], ledger, rows, versions)
    assert d["consistency"] == {"ok": True, "problems": []}
    check_against_sources(d, ledger, rows, versions)
    assert d["privacy_unit"] == [{"kind": "user", "column": "user_id"}]
    assert d["neighbouring"][0]["relation"] == "add_remove_unit" and "all the records of one user" in \
        d["neighbouring"][0]["meaning"]
    assert [q["name"] for q in d["queries"]] == ["dau_daily"]  # AOV is another family
    q = d["queries"][0]
    assert q["version"] == DAU.version() and q["bounds"]["max_partitions_per_unit"] == 30
    assert q["charge_per_release"] == {"measure": "zcdp", "rho": "1/4"}
    assert d["accounting"][0]["measure"] == "zcdp" and d["accounting"][0]["window"] == "monthly"
    assert [m["name"] for m in d["mechanisms"]] == ["discrete_gaussian"]
    # per window: Nov has dau1 (family) + aov1 (budget); Dec has dau2
    w = d["charges"]["per_window"]
    assert [(x["start"][:7], x["family_total"]["rho"], x["budget_total"]["rho"], x["family_releases"],
             x["budget_releases"]) for x in w] == [("2026-11", "1/4", "1/2", 1, 2), ("2026-12", "1/4", "1/4", 1, 1)]
    assert d["current"] == {"version_no": 2, "release_id": "dau2"} and d["errata"] == []
    assert d["thresholds"]["per_release"][1]["suppressed_keys"] == ["2026-11-02"]
    assert all(x in d["limitations"] for x in LIMITATIONS)
    assert any("up to 30 cells" in x for x in d["limitations"])


def test_statement_after_rollback_keeps_the_charge(published):
    ledger, rows, versions = published
    before = privacy_statement("dau_daily", [DAU], ledger, rows, versions)
    rolled = [version(1, "dau1", "current", NOV, changed_by="admin_carol"),
              version(2, "dau2", "withdrawn", DEC, reason="wrong input snapshot", changed_by="admin_carol")]
    d = privacy_statement("dau_daily", [DAU], ledger, rows, rolled)
    assert d["consistency"]["ok"], d["consistency"]
    check_against_sources(d, ledger, rows, rolled)
    assert d["current"] == {"version_no": 1, "release_id": "dau1"}
    assert d["errata"][0]["release_id"] == "dau2" and d["errata"][0]["reason"] == "wrong input snapshot"
    assert d["errata"][0]["withdrawn_by"] == "admin_carol"
    assert d["errata"][0]["charge_kept"] == {"measure": "zcdp", "rho": "1/4"}
    # no refund: the totals did not move
    assert d["charges"]["all_time"] == before["charges"]["all_time"]
    assert d["charges"]["per_window"] == before["charges"]["per_window"]
    md = statement_markdown(d)
    assert "wrong input snapshot" in md and "Version 1 (release `dau1`)" in md


def test_inconsistencies_are_found_and_block_writing(published, tmp_path):
    ledger, rows, versions = published
    # a release row claiming a smaller charge than the ledger holds
    bad_rows = [dict(r, charge_json=json.dumps({"charge": ZCDP("0.1").to_json()})) if r["release_id"] == "dau2"
                else r for r in rows]
    d = privacy_statement("dau_daily", [DAU], ledger, bad_rows, versions)
    assert not d["consistency"]["ok"]
    assert any("recorded charge differs" in p for p in d["consistency"]["problems"])
    with pytest.raises(StatementInconsistentError, match="recorded charge differs"):
        write_statement(tmp_path, d)
    # a version whose release the ledger never charged; two current versions
    d = privacy_statement("dau_daily", [DAU], ledger, rows,
                          versions + [version(3, "ghost", "current", DEC)])
    probs = " | ".join(d["consistency"]["problems"])
    assert "ghost has no ledger entry" in probs and "2 versions are current" in probs and \
        "ghost has no rows" in probs
    # a statement epsilon that does not follow from the charge
    d = privacy_statement("dau_daily", [DAU], ledger,
                          [dict(r, statement_epsilon=0.01) for r in rows], versions)
    assert any("(epsilon, delta) differs" in p for p in d["consistency"]["problems"])
    # a release of an unregistered (edited) spec
    edited = replace(DAU, charge=ZCDP("0.3"))
    d = privacy_statement("dau_daily", [edited], ledger, rows, versions)
    assert any("dau1: its spec version is not among the registered specs" in p for p in d["consistency"]["problems"])
    # a release in the table without a version, committed longer than its lease ago (within
    # the lease it is another live run's pending release: tests/jobs/test_concurrent_family.py)
    d = privacy_statement("dau_daily", [DAU], ledger, rows, versions[:1], now=DEC + timedelta(days=1))
    assert any("dau2 is in the official table but has no version" in p for p in d["consistency"]["problems"])


def test_write_statement_files(published, tmp_path):
    ledger, rows, versions = published
    d = privacy_statement("dau_daily", [DAU], ledger, rows, versions)
    j, m = write_statement(tmp_path / "statements", d)
    assert j.name == "dau_daily.json" and m.name == "dau_daily.md"
    back = json.loads(j.read_text())
    assert back["current"] == d["current"] and back["charges"]["all_time"] == d["charges"]["all_time"]
    text = m.read_text()
    for needle in ("# Privacy statement: dau_daily", "Privacy unit: **user**", "add_remove_unit",
                   "discrete_gaussian", "Charge per window", "loss does not expire", "Errata",
                   "hashing identifiers is not anonymisation", "2026-11-02"):
        assert needle in text, needle
    assert not list((tmp_path / "statements").glob(".*tmp"))


def test_hashed_unit_column_gets_a_limitation(published):
    ledger, rows, versions = published
    hashed = replace(DAU, unit=replace(DAU.unit, column="user_id_sha256"))
    d = privacy_statement("dau_daily", [hashed], ledger, [], [])
    assert any("looks like a hashed identifier" in x for x in d["limitations"])


def test_per_day_releases_are_restrictions_of_the_registered_spec(ledger):
    day = DAU.for_keys(("2026-11-05",), name_suffix="_20261105")
    charge_release(ledger, "day5", "dau_daily", day.charge, NOV)
    rows = rows_for(day, "day5", NOV.replace(tzinfo=None))
    d = privacy_statement("dau_daily", [DAU], ledger, rows, [version(1, "day5", "current", NOV)])
    assert d["consistency"]["ok"], d["consistency"]


def test_summaries_and_spec_listing():
    rows = rows_for(DAU, "r", datetime(2026, 11, 1), suppressed=(DAU.keys[0],))
    s = summarise_release_rows(rows)
    assert len(s) == 1 and s[0]["cells"] == 3 and s[0]["suppressed_keys"] == [DAU.keys[0]]
    assert summarise_release_rows(s) == s  # summaries pass through
    assert [x.name for x in specs_for_family(ROOT / "conf/releases", "dau_daily")] == ["dau_daily"]
    with pytest.raises(Exception, match="no registered spec"):
        privacy_statement("nope", [DAU], None, [], [])


# --------------------------------------------------------------------------------------
# end to end: the real engine, versions table, rollback, statement files
# --------------------------------------------------------------------------------------
@pytest.mark.slow
def test_end_to_end_publish_rollback_statement(spark, tmp_path, monkeypatch):
    import yaml
    from datetime import date

    from pyspark.sql import functions as F

    from dp_spark.config import load_env
    from dp_spark.demo_data import generate_events
    from dp_spark.engine import Engine
    from dp_spark.errors import PermissionDeniedError
    from dp_spark.governance import after_official_release, rollback_family, statement_dir
    from dp_spark.governance.access import load_access_policy
    from dp_spark.governance.versions import current_release_id, published_path_for, published_view

    monkeypatch.delenv("DP_SPARK_PRINCIPAL", raising=False)
    (tmp_path / "conf" / "envs").mkdir(parents=True)
    env_file = tmp_path / "conf" / "envs" / "gov.yaml"
    env_file.write_text(yaml.safe_dump({
        "name": "gov", "spark": {"master": "local[2]"}, "warehouse": "wh",
        "datasets": {"demo_events": "{warehouse}/input/demo_events"},
        "policies": str(ROOT / "conf/policies/budgets.yaml"), "lease_seconds": 2}))
    env = load_env(env_file)
    inp = env.datasets["demo_events"]
    events = generate_events(spark, n_users=150, days=30, start_date=date(2026, 11, 1), seed=3,
                             heavy_users=1, heavy_rows=200)
    events.write.format("delta").mode("overwrite").save(inp)
    access = load_access_policy(ROOT / "conf/policies/access.yaml").for_env(env.name, {})
    eng = Engine(env, spark=spark, principal="publisher_bob")

    def publish_official():
        access.check("publisher_bob", "publish", mode="official", spec_path=DAU.source, spec=DAU)
        r = eng.publish(DAU)
        no, md = after_official_release(spark, env=env, family="dau_daily", release_id=r.release_id,
                                        principal="publisher_bob", ledger=eng.ledger,
                                        releases_dir=access.releases_dir)
        return r, no, md

    r1, no1, md = publish_official()
    events.limit(5).write.format("delta").mode("append").save(inp)  # a new input snapshot: a new release
    r2, no2, md = publish_official()
    assert (no1, no2) == (1, 2) and r1.release_id != r2.release_id
    again, no_again, _ = publish_official()  # rerun: cache hit, same version, no new charge
    assert again.status == "cache_hit" and no_again == 2

    sdir = statement_dir(env)
    d = json.loads((sdir / "dau_daily.json").read_text())
    rel_rows = [r.asDict() for r in spark.read.format("delta").load(r1.table_path).collect()]
    entries = {e.release_id: e for e in eng.ledger.entries("demo_events_user")}

    def matches(d, current):
        assert d["consistency"]["ok"], d["consistency"]
        assert d["current"]["release_id"] == current
        per = {x["release_id"]: x for x in d["charges"]["per_release"]}
        assert set(per) == {r1.release_id, r2.release_id}
        for rid, x in per.items():
            assert budget_from_json(x["charge"]) == entries[rid].charge and x["ledger_state"] == "committed"
            row = next(r for r in rel_rows if r["release_id"] == rid)
            v = next(v for v in d["versions"] if v["release_id"] == rid)
            assert v["statement"]["epsilon"] == row["statement_epsilon"]
            assert v["statement"]["delta"] == row["statement_delta"]
            assert v["spec_version"] == row["spec_version"] == DAU.version()
        assert d["charges"]["all_time"][0]["family_total"] == {"measure": "zcdp", "rho": "1/2"}
        assert d["queries"][0]["bounds"] == json.loads(rel_rows[0]["bounds_json"])

    matches(d, r2.release_id)
    assert d["errata"] == []
    pub = published_path_for(env.output_root)
    assert {r["release_id"] for r in published_view(spark, r1.table_path, eng.ledger, "dau_daily").select(
        "release_id").distinct().collect()} == {r2.release_id}

    # the publisher may not roll back (refusal audited); the admin may
    with pytest.raises(PermissionDeniedError):
        rollback_family(spark, env=env, family="dau_daily", principal="publisher_bob", reason="x",
                        ledger=eng.ledger, access=access)
    spent_before = eng.ledger.status("demo_events_user").spent
    assert rollback_family(spark, env=env, family="dau_daily", principal="admin_carol",
                           reason="input snapshot was incomplete", ledger=eng.ledger,
                           access=access) == (r2.release_id, r1.release_id)
    assert eng.ledger.status("demo_events_user").spent == spent_before  # no refund
    assert current_release_id(eng.ledger, "dau_daily") == r1.release_id
    # the derived _published table was refreshed from the ledger by the rollback
    assert {(r["release_id"], r["state"]) for r in spark.read.format("delta").load(pub).collect()} == {
        (r1.release_id, "current"), (r2.release_id, "withdrawn")}
    view = published_view(spark, r1.table_path, eng.ledger, "dau_daily")
    assert {r["release_id"] for r in view.select("release_id").distinct().collect()} == {r1.release_id}
    assert view.count() == 30

    d = json.loads((sdir / "dau_daily.json").read_text())
    matches(d, r1.release_id)
    assert [(e["release_id"], e["reason"], e["withdrawn_by"]) for e in d["errata"]] == \
        [(r2.release_id, "input snapshot was incomplete", "admin_carol")]
    assert "input snapshot was incomplete" in (sdir / "dau_daily.md").read_text()

    audit = eng.ledger.audit_rows()
    assert [(a.principal, a.action, a.decision) for a in audit if a.action == "rollback"] == \
        [("publisher_bob", "rollback", "refused_permission"), ("admin_carol", "rollback", "withdrawn")]
    assert all(a.charge_json is None for a in audit if a.action == "rollback")


def test_statement_shows_the_budget_policy_history(published):
    """An accepted policy change (issue 13, item 15) is in the statement: who, when, why, what."""
    import dataclasses

    from dp_spark.core.budget import ZCDP

    ledger, rows, versions = published
    raised = dataclasses.replace(POLICY, cap=ZCDP(4, POLICY.delta_cap))  # the same delta cap
    ledger.accept_policy(raised, principal="admin_carol", reason="yearly review")
    d = privacy_statement("dau_daily", [DAU], ledger, rows, versions)
    (acc,) = [a for a in d["accounting"] if a["budget_id"] == "demo_events_user"]
    hist = acc["policy_history"]
    assert [(h["version"], h["principal"], h["reason"]) for h in hist] == [
        (1, "dp_spark", "first registration of the budget"), (2, "admin_carol", "yearly review")]
    assert hist[1]["changes"] == ['cap: {"delta":"1/1000000","measure":"zcdp","rho":"2"} -> '
                                  '{"delta":"1/1000000","measure":"zcdp","rho":"4"}']
    md = statement_markdown(d)
    assert "Policy history of budget `demo_events_user`" in md
    assert "| 2 |" in md and "admin_carol" in md and "yearly review" in md and "cap:" in md
