"""Scheduled daily refresh and backfill: idempotent reruns, one charge per day, changed
snapshots reported (not silently republished), the window budget in every result."""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path

import pytest
import yaml
from pyspark.sql import functions as F

from dp_spark.core.budget import ZCDP
from dp_spark.cli import refresh_main
from dp_spark.config import load_env
from dp_spark.errors import ConfigError
from dp_spark.schedule import (
    backfill,
    daily_refresh,
    day_spec,
    format_day,
    parse_day,
)

from .conftest import BUDGET, PRINCIPAL, ROOT, START, env_spec, local_engine, make_env, spec_path

D = [START + timedelta(days=i) for i in range(30)]
RHO = ZCDP("0.25")  # dau_daily's charge; its one-day restriction charges the same


def table(spark, eng, spec):
    return spark.read.format("delta").load(eng.table_path(spec))


def releases_of(spark, eng, spec, day):
    name = day_spec(spec, day).name
    return table(spark, eng, spec).where(F.col("release_name") == name)


# -- no Spark --------------------------------------------------------------------------------
def test_day_spec_is_one_cell_of_the_same_family():
    spec = env_spec(ROOT / "conf/envs/local.yaml", "dau_daily")
    ds = day_spec(spec, date(2026, 11, 3))
    assert ds.name == "dau_daily_20261103" and ds.family == spec.family == "dau_daily"
    assert ds.keys == ("2026-11-03",) and ds.bounds.max_partitions_per_unit == 1
    assert ds.charge == spec.charge and ds.budget_id == spec.budget_id
    with pytest.raises(ConfigError, match="outside the declared dates"):
        day_spec(spec, date(2026, 12, 1))


def test_backfill_validates_every_day_before_publishing_any():
    spec = env_spec(ROOT / "conf/envs/local.yaml", "dau_daily")

    class Untouchable:  # any use of the engine fails the test
        def __getattr__(self, name):
            raise AssertionError(f"engine.{name} used before the range was validated")

    with pytest.raises(ConfigError, match="outside the declared dates"):
        backfill(Untouchable(), spec, date(2026, 11, 29), date(2026, 12, 2))
    with pytest.raises(ConfigError, match="before it starts"):
        backfill(Untouchable(), spec, date(2026, 11, 5), date(2026, 11, 4))


def test_parse_day_relative_days_are_utc():
    assert parse_day("yesterday", today=date(2026, 12, 1)) == date(2026, 11, 30)
    assert parse_day("today", today=date(2026, 12, 1)) == date(2026, 12, 1)
    assert parse_day("2026-11-03") == date(2026, 11, 3)


# -- with Spark -------------------------------------------------------------------------------
def test_refresh_rerun_is_a_noop_and_backfill_charges_each_day_once(spark, deploy_env):
    eng = local_engine(spark, deploy_env)
    spec = env_spec(deploy_env, "dau_daily")

    first = daily_refresh(eng, spec, D[2])
    assert first.status == "published" and first.charge == RHO
    assert first.release_id == first.current_release_id
    assert [c["key"] for c in first.rows] == [D[2].isoformat()]  # the published cell, after commit
    b = first.budget
    assert b.budget_id == BUDGET and b.window == "monthly" and b.window_start is not None
    assert b.spent == RHO and b.remaining == b.cap - RHO

    again = daily_refresh(local_engine(spark, deploy_env), spec, D[2])  # a new job, same day
    assert again.status == "cache_hit" and again.charge is None
    assert again.release_id == first.release_id and again.rows == first.rows
    assert again.budget.spent == RHO

    seen = []
    res = backfill(eng, spec, D[1], D[3], on_day=seen.append)
    assert [r.status for r in res] == ["published", "cache_hit", "published"]
    assert seen == res
    assert [r.charge for r in res] == [RHO, None, RHO]
    assert res[-1].budget.spent == RHO * 3

    res2 = backfill(local_engine(spark, deploy_env), spec, D[1], D[3])
    assert [r.status for r in res2] == ["cache_hit"] * 3 and all(r.charge is None for r in res2)
    assert [r.release_id for r in res2] == [r.release_id for r in res]

    entries = eng.ledger.entries(BUDGET)
    assert len(entries) == 3 and {e.state for e in entries} == {"committed"}
    assert eng.ledger.status(BUDGET).spent == RHO * 3
    # the trend: one family table, one row per day, one release per day
    rows = table(spark, eng, spec).select("release_name", "key", "release_id").collect()
    assert sorted(r["key"] for r in rows) == [d.isoformat() for d in D[1:4]]
    assert {r["release_name"] for r in rows} == {day_spec(spec, d).name for d in D[1:4]}


def test_changed_snapshot_is_reported_not_republished(spark, deploy_env):
    eng = local_engine(spark, deploy_env)
    spec = env_spec(deploy_env, "dau_daily")
    first = daily_refresh(eng, spec, D[0])
    v0 = first.input_version

    path = load_env(deploy_env).datasets["demo_events"]  # late events arrive: a new snapshot
    spark.read.format("delta").load(path).limit(3).write.format("delta").mode("append").save(path)

    stale = daily_refresh(local_engine(spark, deploy_env), spec, D[0])
    assert stale.status == "snapshot_changed" and stale.charge is None and stale.rows == ()
    assert stale.release_id == stale.published_release_id == first.release_id
    assert stale.published_input_version == v0 and stale.current_input_version == v0 + 1
    assert stale.current_release_id not in (None, first.release_id)
    assert stale.budget.spent == RHO
    assert len(eng.ledger.entries(BUDGET)) == 1
    assert releases_of(spark, eng, spec, D[0]).select("release_id").distinct().count() == 1
    line = format_day(stale)
    assert "snapshot_changed" in line and first.release_id in line and f"v{v0}" in line
    assert "distinct_units=" not in line  # nothing about values for a day not (re)published
    audit = eng.ledger.audit_rows()[-1]
    assert audit.decision == "reported_snapshot_changed" and audit.release_id == first.release_id

    # a backfill over it: the stale day is reported again, a new day publishes on the new snapshot
    res = backfill(eng, spec, D[0], D[1])
    assert [r.status for r in res] == ["snapshot_changed", "published"]
    assert res[1].input_version == v0 + 1

    # an explicit republish: a new release for the new snapshot, charged once
    rep = daily_refresh(eng, spec, D[0], republish=True)
    assert rep.status == "republished" and rep.charge == RHO
    assert rep.release_id == stale.current_release_id and rep.published_release_id == first.release_id
    assert releases_of(spark, eng, spec, D[0]).select("release_id").distinct().count() == 2
    # and from now on the day is a no-op again
    assert daily_refresh(eng, spec, D[0]).status == "cache_hit"
    assert eng.ledger.status(BUDGET).spent == RHO * 3


def test_refresh_checks_the_principal_first(spark, deploy_env):
    from dp_spark.errors import PermissionDeniedError

    eng = local_engine(spark, deploy_env, principal="analyst_alice")  # not a publisher
    with pytest.raises(PermissionDeniedError):
        daily_refresh(eng, env_spec(deploy_env, "dau_daily"), D[0])
    assert eng.ledger.entries() == []
    assert [a.decision for a in eng.ledger.audit_rows()] == ["refused_permission"]


def _cap_policies(tmp_path: Path, rho: float) -> Path:
    src = yaml.safe_load((ROOT / "conf/policies/budgets.yaml").read_text())
    src["budgets"][BUDGET]["cap"] = {"rho": rho}
    src["budgets"][BUDGET]["max_per_release"] = {"rho": rho}
    p = tmp_path / "capped_budgets.yaml"
    p.write_text(yaml.safe_dump(src))
    return p


def test_cli_prints_one_line_per_day_and_fails_on_errors(spark, tmp_path, deploy_input, capsys, monkeypatch):
    monkeypatch.setenv("DP_SPARK_PRINCIPAL", PRINCIPAL)
    env_file = make_env(tmp_path / "p", deploy_input, policies=_cap_policies(tmp_path, 0.5))
    conf = str(spec_path(env_file, "dau_daily"))
    base = ["--env", str(env_file), "--conf", conf, "--quiet"]

    assert refresh_main(base + ["--date", D[4].isoformat()]) == 0
    out = capsys.readouterr().out.splitlines()
    day = [l for l in out if l.startswith(D[4].isoformat())]
    assert len(day) == 1 and "published" in day[0] and "release=" in day[0]
    assert "charge=zcdp(rho=0.25)" in day[0] and "remaining=zcdp(rho=0.25" in day[0]
    assert "monthly window" in day[0] and "distinct_units=" in day[0]  # committed: public
    mirror = load_env(env_file).ledger_mirror  # rebuilt once at the end of the job (Engine.finish)
    assert spark.read.format("delta").load(mirror).where(F.col("state") == "committed").count() == 1

    # D4 again (no-op), D5 (the budget's last 0.25), D6 refused, D7 not attempted
    rc = refresh_main(base + ["--from", D[4].isoformat(), "--to", D[7].isoformat()])
    assert rc == 1  # a day failed (docs/cli.md: 1 = a release failed, 2 = usage/config)
    captured = capsys.readouterr()
    lines = {l[:10]: l for l in captured.out.splitlines() if l[:4] == "2026"}
    assert "cache_hit" in lines[D[4].isoformat()] and "charge=none" in lines[D[4].isoformat()]
    assert "published" in lines[D[5].isoformat()] and "remaining=zcdp(rho=0," in lines[D[5].isoformat()]
    refused = lines[D[6].isoformat()]
    assert " error " in refused and "BudgetExceededError" in refused
    assert "distinct_units=" not in refused and "ci=[" not in refused  # nothing released, nothing shown
    assert "skipped" in lines[D[7].isoformat()]
    assert "1 failed" in captured.out

    # a day outside the declared dates fails before Spark work, with a message and no day line
    assert refresh_main(base + ["--date", "2026-12-01"]) == 2
    captured = capsys.readouterr()
    assert "outside the declared dates" in captured.err and "2026-12-01" not in captured.out
    with pytest.raises(SystemExit):  # --from without --to
        refresh_main(base + ["--from", D[1].isoformat()])


def test_rolling_spec_refreshes_a_day_after_the_old_end(spark, tmp_path, deploy_input, capsys, monkeypatch):
    """The shipped scheduled spec (dates end: today) refreshes 2026-12-02, after the fixed
    range of dau_daily ended, without editing the spec; a rerun is a no-op."""
    monkeypatch.setenv("DP_SPARK_PRINCIPAL", PRINCIPAL)
    env_file = make_env(tmp_path / "p", deploy_input)
    conf = str(spec_path(env_file, "dau_rolling"))
    base = ["--env", str(env_file), "--conf", conf, "--quiet", "--date", "2026-12-02"]
    assert refresh_main(base) == 0
    out = [l for l in capsys.readouterr().out.splitlines() if l.startswith("2026-12-02")]
    assert len(out) == 1 and "published" in out[0] and "charge=zcdp(rho=0.02)" in out[0]
    assert refresh_main(base) == 0
    again = [l for l in capsys.readouterr().out.splitlines() if l.startswith("2026-12-02")]
    assert "cache_hit" in again[0] and "charge=none" in again[0]
