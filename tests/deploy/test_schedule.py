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

    path = load_env(deploy_env).datasets["demo_events"]  # late events of the day: a new snapshot
    late = spark.read.format("delta").load(path).where(F.col("day") == F.lit(D[0])).limit(3)
    late.write.format("delta").mode("append").save(path)

    stale = daily_refresh(local_engine(spark, deploy_env), spec, D[0])
    assert stale.status == "input_changed" and stale.charge is None and stale.rows == ()
    assert stale.release_id == stale.published_release_id == first.release_id
    assert stale.published_input_version == v0 and stale.current_input_version == v0 + 1
    assert stale.current_release_id not in (None, first.release_id)
    assert stale.budget.spent == RHO
    assert len(eng.ledger.entries(BUDGET)) == 1
    assert releases_of(spark, eng, spec, D[0]).select("release_id").distinct().count() == 1
    line = format_day(stale)
    assert "input_changed" in line and first.release_id in line and f"v{v0}" in line
    assert "the day's input rows changed" in line and "not republished" in line
    assert "distinct_units=" not in line  # nothing about values for a day not (re)published
    audit = eng.ledger.audit_rows()[-1]
    assert audit.decision == "reported_input_changed" and audit.release_id == first.release_id

    # a backfill over it: the stale day is reported again, a new day publishes on the new snapshot
    res = backfill(eng, spec, D[0], D[1])
    assert [r.status for r in res] == ["input_changed", "published"]
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


# -- the content fingerprint of a day's input rows ------------------------------------------------
def _input_path(env_file: Path) -> str:
    return load_env(env_file).datasets["demo_events"]


def _spent(eng):
    return eng.ledger.status(BUDGET).spent


def test_an_append_of_new_days_charges_nothing_for_the_old_ones(spark, deploy_env):
    path = _input_path(deploy_env)
    v0 = spark.read.format("delta").option("versionAsOf", 0).load(path)
    # the input holds the days before D3 (a rewrite: a new snapshot of the same table)
    v0.where(F.col("day") < F.lit(D[3])).write.format("delta").mode("overwrite").save(path)
    eng = local_engine(spark, deploy_env)
    spec = env_spec(deploy_env, "dau_daily")
    first = backfill(eng, spec, D[0], D[2])
    assert [r.status for r in first] == ["published"] * 3 and _spent(eng) == RHO * 3
    assert all(eng.ledger.fingerprint(r.release_id) is not None for r in first)  # recorded with each

    v0.where(F.col("day") == F.lit(D[3])).write.format("delta").mode("append").save(path)  # the nightly append
    eng2 = local_engine(spark, deploy_env)
    res = backfill(eng2, spec, D[0], D[3])
    assert [r.status for r in res] == ["unchanged"] * 3 + ["published"]
    assert [r.charge for r in res] == [None] * 3 + [RHO]
    assert _spent(eng2) == RHO * 4 and len(eng2.ledger.entries(BUDGET)) == 4
    for old, now in zip(first, res):  # each old day is served by its release, on the new snapshot
        assert now.release_id == now.published_release_id == old.release_id
        assert now.current_input_version == old.input_version + 1 and now.current_release_id != old.release_id
        assert now.rows == old.rows  # its published cells: no new noise
        assert releases_of(spark, eng2, spec, now.day).select("release_id").distinct().count() == 1
    line = format_day(res[0])
    assert "unchanged" in line and first[0].release_id in line and "distinct_units=" in line
    audits = [a for a in eng2.ledger.audit_rows() if a.decision == "unchanged"]
    assert [a.release_id for a in audits] == [r.release_id for r in first]
    assert all(f"served by release {a.release_id}" in a.detail for a in audits)

    again = backfill(local_engine(spark, deploy_env), spec, D[0], D[3])  # the next night, no new data
    assert [r.status for r in again] == ["unchanged"] * 3 + ["cache_hit"]
    assert all(r.charge is None for r in again) and _spent(eng2) == RHO * 4


def test_a_rewrite_of_the_same_rows_in_another_order_is_unchanged(spark, deploy_env):
    path = _input_path(deploy_env)
    eng = local_engine(spark, deploy_env)
    spec = env_spec(deploy_env, "dau_daily")
    first = daily_refresh(eng, spec, D[0])
    before = spark.read.format("delta").option("versionAsOf", first.input_version).load(path)
    n_files = len(spark.read.format("delta").load(path).inputFiles())
    # the nightly full rewrite: the same rows, shuffled, in another number of files
    before.orderBy(F.rand(7)).repartition(n_files + 3).write.format("delta").mode("overwrite").save(path)
    assert len(spark.read.format("delta").load(path).inputFiles()) != n_files

    r = daily_refresh(local_engine(spark, deploy_env), spec, D[0])
    assert r.status == "unchanged" and r.charge is None and r.release_id == first.release_id
    assert r.current_input_version == first.input_version + 1
    assert _spent(eng) == RHO and len(eng.ledger.entries(BUDGET)) == 1


def test_one_changed_row_reports_its_day_only_and_republish_charges_it_once(spark, deploy_env):
    path = _input_path(deploy_env)
    eng = local_engine(spark, deploy_env)
    spec = env_spec(deploy_env, "dau_daily")
    first = backfill(eng, spec, D[0], D[2])
    rows = spark.read.format("delta").load(path).where(F.col("user_id").isNotNull())
    ev = rows.where(F.col("day") == F.lit(D[1])).orderBy("event_id").first()["event_id"]
    spark.sql(f"UPDATE delta.`{path}` SET user_id = 'u_changed' WHERE event_id = {ev}")

    res = backfill(local_engine(spark, deploy_env), spec, D[0], D[2])
    assert [r.status for r in res] == ["unchanged", "input_changed", "unchanged"]
    assert all(r.charge is None for r in res) and _spent(eng) == RHO * 3
    stale = format_day(res[1])
    assert "input_changed" in stale and "the day's input rows changed" in stale and "distinct_units=" not in stale
    assert eng.ledger.audit_rows()[-2].decision == "reported_input_changed"

    rep = backfill(local_engine(spark, deploy_env), spec, D[0], D[2], republish=True)
    assert [r.status for r in rep] == ["unchanged", "republished", "unchanged"]
    assert [r.charge for r in rep] == [None, RHO, None] and _spent(eng) == RHO * 4
    assert rep[1].published_release_id == first[1].release_id and rep[1].release_id == res[1].current_release_id
    assert eng.ledger.fingerprint(rep[1].release_id) is not None
    assert daily_refresh(local_engine(spark, deploy_env), spec, D[1]).status == "cache_hit"

    # a row removed from D2: D2 only (D1 compares with its republished release)
    gone = rows.where(F.col("day") == F.lit(D[2])).orderBy("event_id").first()["event_id"]
    spark.sql(f"DELETE FROM delta.`{path}` WHERE event_id = {gone}")
    res = backfill(local_engine(spark, deploy_env), spec, D[0], D[2])
    assert [r.status for r in res] == ["unchanged", "unchanged", "input_changed"]
    assert res[1].release_id == rep[1].release_id and _spent(eng) == RHO * 4


def test_a_column_the_spec_does_not_read_changes_nothing(spark, deploy_env):
    path = _input_path(deploy_env)
    eng = local_engine(spark, deploy_env)
    spec = env_spec(deploy_env, "dau_daily")  # reads user_id and day
    first = daily_refresh(eng, spec, D[0])
    spark.sql(f"UPDATE delta.`{path}` SET region = 'elsewhere', order_value = -1.0 WHERE day = DATE'{D[0]}'")
    assert daily_refresh(local_engine(spark, deploy_env), spec, D[0]).status == "unchanged"
    spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS (channel STRING)")
    spark.sql(f"UPDATE delta.`{path}` SET channel = 'web' WHERE day = DATE'{D[0]}'")
    r = daily_refresh(local_engine(spark, deploy_env), spec, D[0])
    assert r.status == "unchanged" and r.release_id == first.release_id and r.current_input_version == 3
    assert _spent(eng) == RHO


def test_a_release_from_before_fingerprints_is_snapshot_changed(spark, deploy_env):
    eng = local_engine(spark, deploy_env)
    spec = env_spec(deploy_env, "dau_daily")
    # as before this change: releases without a fingerprint
    old = [eng.publish(day_spec(spec, d)) for d in D[:2]]
    assert [eng.ledger.fingerprint(r.release_id) for r in old] == [None, None]
    hit = daily_refresh(eng, spec, D[1])  # D1 rerun on its own snapshot: its fingerprint is recorded now
    assert hit.status == "cache_hit" and eng.ledger.fingerprint(old[1].release_id) is not None
    path = _input_path(deploy_env)
    spark.read.format("delta").load(path).where(F.col("day") == F.lit(D[9])).limit(2) \
        .write.format("delta").mode("append").save(path)
    res = backfill(local_engine(spark, deploy_env), spec, D[0], D[1])
    assert [r.status for r in res] == ["snapshot_changed", "unchanged"]
    assert [r.release_id for r in res] == [r.release_id for r in old] and all(r.charge is None for r in res)
    assert "released before input fingerprints" in format_day(res[0])
    assert _spent(eng) == RHO * 2


def test_the_fingerprint_is_keyed_by_the_salt_and_never_shown(spark, tmp_path, deploy_input, capsys, caplog,
                                                              monkeypatch):
    import logging

    from dp_spark.backends.fingerprint import day_digests
    from dp_spark.core.fingerprint import fingerprint_keys
    from dp_spark.ledger import open_ledger

    monkeypatch.setenv("DP_SPARK_PRINCIPAL", PRINCIPAL)
    caplog.set_level(logging.DEBUG)
    envs = [make_env(tmp_path / n, deploy_input) for n in ("a", "b")]  # the same rows, two salts
    fps = []
    for env_file in envs:
        argv = ["--env", str(env_file), "--conf", str(spec_path(env_file, "dau_daily")), "--verbose"]
        assert refresh_main(argv + ["--date", D[0].isoformat()]) == 0
        with open_ledger(load_env(env_file).ledger_url) as led:
            fps.append(led.fingerprint(led.entries()[0].release_id))
    assert None not in fps and fps[0] != fps[1]
    # the executors' digests differ too: the row key is mixed into each row's hash
    df = spark.read.format("delta").load(str(deploy_input))
    a, b = (day_digests(df, date_column="day", days=[D[0].isoformat()], columns=["user_id", "day"],
                        row_key=fingerprint_keys(salt)[1])[D[0].isoformat()] for salt in ("s" * 32, "t" * 32))
    assert a.rows == b.rows > 0 and a.total != b.total

    # a new snapshot: the day is compared (unchanged), with every log line on
    path = _input_path(envs[0])
    spark.read.format("delta").load(path).where(F.col("day") == F.lit(D[9])).limit(2) \
        .write.format("delta").mode("append").save(path)
    argv = ["--env", str(envs[0]), "--conf", str(spec_path(envs[0], "dau_daily")), "--verbose"]
    assert refresh_main(argv + ["--date", D[0].isoformat()]) == 0
    out, err = capsys.readouterr()
    assert "unchanged" in out and "comparing the day's input rows" in caplog.text  # the lines were captured
    env = load_env(envs[0])
    tables = [env.ledger_mirror, env.audit_mirror, f"{env.output_root}/dau_daily"]
    stored = "".join(repr(r.asDict()) for t in tables for r in spark.read.format("delta").load(t).collect())
    with open_ledger(env.ledger_url) as led:
        audit = repr(led.audit_rows())
    from dp_spark.salt import read_salt

    salt = read_salt(env.salt_file)
    secrets_ = [*fps, salt, fingerprint_keys(salt)[1], fingerprint_keys(salt)[0].hex()]
    for secret in secrets_:
        for text in (out, err, caplog.text, stored, audit):
            assert secret not in text and secret[:16] not in text


def test_a_withdrawn_release_does_not_serve_its_unchanged_day(spark, deploy_env):
    eng = local_engine(spark, deploy_env)
    spec = env_spec(deploy_env, "dau_daily")
    first = daily_refresh(eng, spec, D[0])
    assert eng.ledger.withdraw_version(spec.family, "admin_carol", "wrong filter") == (first.release_id, None)
    path = _input_path(deploy_env)
    spark.read.format("delta").load(path).where(F.col("day") == F.lit(D[9])).limit(2) \
        .write.format("delta").mode("append").save(path)
    r = daily_refresh(local_engine(spark, deploy_env), spec, D[0])
    assert r.status == "snapshot_changed" and r.charge is None and "its release was withdrawn" in format_day(r)
    assert _spent(eng) == RHO
