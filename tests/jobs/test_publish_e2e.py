"""The main job end to end: demo data -> bounded, noised, accounted Delta releases."""

from __future__ import annotations

import json
import shutil
import threading
import time
from fractions import Fraction
from pathlib import Path

import pytest
import yaml
from pyspark.sql import functions as F

from dp_spark.core.budget import ZCDP
from dp_spark.config import load_env, load_release_spec, release_spec_from_dict
from dp_spark.engine import Engine
from dp_spark.errors import BudgetExceededError, ConfigError, OutputSchemaError, ReleaseFailedError, SchemaError
from dp_spark.delta.release_table import RELEASE_SCHEMA

from .conftest import ROOT, register, write_env

DAU = ROOT / "conf/releases/dau_daily.yaml"
AOV = ROOT / "conf/releases/aov_by_region.yaml"


def engine(spark, env_file, **kw):
    kw.setdefault("principal", "publisher_bob")
    return Engine(load_env(env_file), spark=spark, **kw)


def ledger_entries(eng, budget_id="demo_events_user"):
    return eng.ledger.entries(budget_id)


def test_publish_dau_and_aov_read_back(spark, warehouse):
    eng = engine(spark, warehouse)
    dau, aov = register(warehouse, "dau_daily"), register(warehouse, "aov_by_region")
    r1 = eng.publish(dau)
    r2 = eng.publish(aov)
    assert r1.status == r2.status == "published"
    assert r1.charge == ZCDP("0.25") and r2.charge == ZCDP("0.25")

    t = spark.read.format("delta").load(r1.table_path)
    assert {(f.name, f.dataType.simpleString()) for f in t.schema.fields} == {
        (f.name, f.dataType.simpleString()) for f in RELEASE_SCHEMA.fields
    }
    rows = t.where(F.col("release_id") == r1.release_id).collect()
    assert len(rows) == 30 and {r["statistic"] for r in rows} == {"distinct_units"}
    assert sorted(r["key"] for r in rows) == list(dau.keys)
    for r in rows:
        assert r["value"] >= 0 and r["ci_low"] <= r["value"] <= r["ci_high"]
        assert r["privacy_unit"] == "user" and r["neighbouring"] == "add_remove_unit"
        assert r["mechanism"] == "discrete_gaussian" and r["charge_rho"] == 0.25
        assert r["statement_delta"] is not None and r["statement_epsilon"] > 0
        assert r["parallel_composition"] is False  # L0 = 30 days
        assert float(r["value"]).is_integer()  # counts lie on the integer grid

    arows = spark.read.format("delta").load(r2.table_path).where(F.col("release_id") == r2.release_id).collect()
    assert len(arows) == 40 and {r["statistic"] for r in arows} == {"count", "mean"}
    means = [r for r in arows if r["statistic"] == "mean"]
    assert all(0 <= r["value"] <= 500 for r in means)
    assert all(r["parallel_composition"] for r in arows)  # L0 = 1 region per user
    split = json.loads(arows[0]["charge_json"])["mean_split_to_sum"]
    assert 0 < Fraction(split) < 1

    # DAU tracks the truth within its intervals for most days (noise sd ~ sqrt(30)/sqrt(0.5))
    df = spark.read.format("delta").load(str(Path(load_env(warehouse).datasets["demo_events"])))
    true = {str(r["day"]): r["n"] for r in df.where(F.col("user_id").isNotNull()).groupBy("day")
            .agg(F.countDistinct("user_id").alias("n")).collect()}
    inside = sum(1 for r in rows if r["ci_low"] - 1 <= true.get(r["key"], 0) <= r["ci_high"] + 1)
    assert inside >= 24  # 95% intervals; bounding removes nothing for DAU (L0 = 30 = all days)

    st = eng.ledger.status("demo_events_user")
    assert st.spent == ZCDP("0.5")
    entries = ledger_entries(eng)
    assert [e.state for e in entries] == ["committed", "committed"]
    assert [e.seq for e in entries] == [1, 2]


def test_rerun_is_a_cache_hit_with_identical_output(spark, warehouse):
    eng = engine(spark, warehouse)
    dau = register(warehouse, "dau_daily")
    first = eng.publish(dau)
    for _ in range(4):  # five runs of one release
        again = engine(spark, warehouse).publish(dau)
        assert again.status == "cache_hit" and again.charge is None
        assert again.release_id == first.release_id
        assert sorted((r["key"], r["value"]) for r in again.rows) == sorted((r["key"], r["value"]) for r in first.rows)
    assert len(ledger_entries(eng)) == 1
    assert eng.ledger.status("demo_events_user").spent == ZCDP("0.25")
    n = spark.read.format("delta").load(first.table_path).count()
    assert n == 30
    decisions = [a.decision for a in eng.ledger.audit_rows()]
    assert decisions.count("published") == 1 and decisions.count("cache_hit") == 4


def test_new_input_version_is_a_new_release(spark, warehouse):
    eng = engine(spark, warehouse)
    dau = register(warehouse, "dau_daily")
    first = eng.publish(dau)
    path = load_env(warehouse).datasets["demo_events"]
    spark.read.format("delta").load(path).limit(5).write.format("delta").mode("append").save(path)
    second = eng.publish(dau)
    assert second.status == "published" and second.release_id != first.release_id
    assert eng.ledger.status("demo_events_user").spent == ZCDP("0.5")


def _policies(tmp_path, cap_rho):
    src = yaml.safe_load((ROOT / "conf/policies/budgets.yaml").read_text())
    b = src["budgets"]["demo_events_user"]
    b["cap"] = {"rho": cap_rho}
    b["max_per_release"] = {"rho": cap_rho}
    p = tmp_path / "budgets.yaml"
    p.write_text(yaml.safe_dump(src))
    return p


def test_exhausted_budget_rejects_and_writes_nothing(spark, warehouse, tmp_path):
    env_file = write_env(tmp_path, policies=_policies(tmp_path, 0.3))
    eng = engine(spark, env_file)
    eng.publish(register(env_file, "dau_daily"))
    with pytest.raises(BudgetExceededError) as exc:
        eng.publish(register(env_file, "aov_by_region"))
    assert exc.value.budget_id == "demo_events_user"
    assert "0.3" in str(exc.value) or "3/10" in str(exc.value)
    aov_path = Path(load_env(env_file).output_root) / "aov_by_region"
    assert not aov_path.exists()  # a budget refusal creates no table named like the release
    assert len(ledger_entries(eng)) == 1
    assert eng.ledger.audit_rows()[-1].decision == "refused_budget"


def test_return_existing_when_exhausted(spark, warehouse, tmp_path):
    env_file = write_env(tmp_path, policies=_policies(tmp_path, 0.3))
    eng = engine(spark, env_file)
    d = yaml.safe_load(DAU.read_text())
    d["on_exhausted"] = "return_existing"
    spec = register(env_file, "dau_existing", d)
    first = eng.publish(spec)
    path = load_env(env_file).datasets["demo_events"]
    spark.read.format("delta").load(path).limit(5).write.format("delta").mode("append").save(path)
    again = eng.publish(spec)  # new snapshot, no budget left
    assert again.status == "returned_existing" and again.release_id == first.release_id
    assert "latest committed" in again.note


def test_crash_before_write_rerun_reuses_reservation(spark, warehouse, monkeypatch):
    from dp_spark.statistics.plan import QueryPlan

    dau = register(warehouse, "dau_daily")
    eng = engine(spark, warehouse)
    real = QueryPlan.noise_columns

    def boom(*a, **k):
        raise RuntimeError("driver killed")

    monkeypatch.setattr(QueryPlan, "noise_columns", boom)
    with pytest.raises(ReleaseFailedError) as exc:  # after the reservation: the text is withheld
        eng.publish(dau)
    assert exc.value.stage == "noise" and exc.value.exception_class == "RuntimeError"
    assert "driver killed" not in str(exc.value)
    assert [e.state for e in ledger_entries(eng)] == ["reserved"]
    monkeypatch.setattr(QueryPlan, "noise_columns", real)
    again = engine(spark, warehouse).publish(dau)  # waits out the 2 s lease, takes over
    assert again.status == "published" and again.charge is None  # the reservation was reused
    assert len(ledger_entries(eng)) == 1 and ledger_entries(eng)[0].state == "committed"
    assert eng.ledger.status("demo_events_user").spent == ZCDP("0.25")


def test_crash_after_write_is_healed(spark, warehouse, monkeypatch):
    dau = register(warehouse, "dau_daily")
    eng = engine(spark, warehouse)

    def boom(*a, **k):
        raise RuntimeError("killed before commit")

    monkeypatch.setattr(eng.ledger, "commit", boom)
    with pytest.raises(ReleaseFailedError) as exc:
        eng.publish(dau)
    assert exc.value.exception_class == "RuntimeError" and "killed" not in str(exc.value)
    again = engine(spark, warehouse).publish(dau)
    assert again.status == "healed" and again.charge is None
    assert len(again.rows) == 30
    again_engine = engine(spark, warehouse)
    assert [e.state for e in ledger_entries(again_engine)] == ["committed"]
    assert again_engine.ledger.status("demo_events_user").spent == ZCDP("0.25")
    assert spark.read.format("delta").load(again.table_path).count() == 30


def test_two_concurrent_runs_one_output_one_charge(spark, warehouse):
    dau = register(warehouse, "dau_daily")
    results, errors = [], []

    def run():
        try:
            results.append(engine(spark, warehouse).publish(dau))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors, [str(e)[:2000] for e in errors]
    assert sorted(r.status for r in results) == ["cache_hit", "published"]
    a, b = results
    assert sorted((r["key"], r["value"]) for r in a.rows) == sorted((r["key"], r["value"]) for r in b.rows)
    eng = engine(spark, warehouse)
    assert len(ledger_entries(eng)) == 1
    assert spark.read.format("delta").load(a.table_path).count() == 30


def _cells(rows):
    return sorted((r["statistic"], r["key"], r["value"], r["ci_low"], r["ci_high"]) for r in rows)


def _takeover(spark, warehouse, monkeypatch, hook, release_a, *, lease_seconds=2, a_done=None):
    """Run A (thread ``run_a``) reaches its write, where ``hook(real_write, spark, path, rows, **kw)``
    stalls it; once it stalls, A's lease (the env's ``lease_seconds``) runs out and run B
    publishes the same release (taking the reservation over); then ``release_a`` lets A go on
    (``a_done``, when given, is set once A's publish has returned or raised). Returns (A's
    result, B's) after checking what both orders must give: neither raised, one set of cells in
    the table, both results showing exactly those, one committed entry and one charge, made once."""
    import dp_spark.delta.release_table as writer_mod

    real = writer_mod.write_release
    monkeypatch.setattr(writer_mod, "write_release", lambda s, p, r, **kw: hook(real, s, p, r, **kw))
    dau = register(warehouse, "dau_daily")
    out, errors = {}, []

    def run_a():
        try:
            out["a"] = engine(spark, warehouse).publish(dau)
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            if a_done is not None:
                a_done.set()

    t = threading.Thread(target=run_a, name="run_a")
    t.start()
    assert hook.a_at_write.wait(300)
    time.sleep(lease_seconds + 0.5)  # A's lease expires while it stalls
    try:
        out["b"] = engine(spark, warehouse).publish(dau)
    finally:
        release_a.set()
        t.join(300)
    assert not errors, [str(e)[:2000] for e in errors]
    a, b = out["a"], out["b"]
    assert _cells(a.rows) == _cells(b.rows)
    table = spark.read.format("delta").load(a.table_path)
    assert table.count() == 30 and _cells(r.asDict() for r in table.collect()) == _cells(a.rows)
    eng = engine(spark, warehouse)
    assert [e.state for e in ledger_entries(eng)] == ["committed"]
    assert eng.ledger.status("demo_events_user").spent == ZCDP("0.25")
    assert [r.charge for r in (a, b) if r.charge is not None] == [ZCDP("0.25")]  # A's reservation
    return a, b


def test_takeover_while_the_first_run_lives_its_write_is_skipped(spark, warehouse, monkeypatch):
    """Run A stalls before its write past its lease; run B takes the reservation over, writes
    and returns. A's write (another draw of the same release) must not land, and A must return
    B's cells, never its own."""
    b_done = threading.Event()

    def hook(real, s, p, rows, **kw):
        if threading.current_thread().name == "run_a":
            hook.a_at_write.set()
            assert b_done.wait(300)
        return real(s, p, rows, **kw)

    hook.a_at_write = threading.Event()
    a, b = _takeover(spark, warehouse, monkeypatch, hook, b_done)
    assert b.status == "published" and b.charge is None  # the reservation was taken over
    assert a.status == "cache_hit"


def test_takeover_inside_the_first_runs_commit_makes_it_fail(spark, warehouse, monkeypatch, tmp_path):
    """Run A's write (a fresh reservation) is held in the middle of its Delta commit: Delta has
    read its snapshot and looked the release's key up (absent), and A's Spark job is writing its
    files. A's lease runs out; B takes over, writes and returns. A's commit must then fail
    (Delta's conflict check on the key it read) rather than land a second draw, and A must
    return B's cells."""
    import dp_spark.delta.release_table as writer_mod
    from tests.spark.stall import release, stalled, wait_started

    sync = tmp_path / "sync"
    sync.mkdir()
    real_frame = writer_mod._cells_frame
    monkeypatch.setattr(writer_mod, "_cells_frame", lambda s, rows: stalled(real_frame(s, rows), sync)
                        if threading.current_thread().name == "run_a" else real_frame(s, rows))

    def hook(real, s, p, rows, **kw):
        if threading.current_thread().name == "run_a":
            threading.Thread(target=lambda: (wait_started(sync), hook.a_at_write.set()), daemon=True).start()
        return real(s, p, rows, **kw)

    class Go:  # _takeover's "let A go on": the held Spark task's file
        def set(self):
            release(sync)

    hook.a_at_write = threading.Event()
    a, b = _takeover(spark, warehouse, monkeypatch, hook, Go())
    assert b.status == "published" and b.charge is None
    assert a.status == "cache_hit"


def _a_writes_first(b_before_commit=None):
    """A write hook for a takeover: run A (thread ``run_a``) stalls at its write until run B
    reaches its own, then A's write lands first and B's after it; ``b_before_commit`` (an
    Event), when given, holds B after its write (before its ledger commit) until it is set.
    Returns (hook, go_a): ``go_a`` lets A go on."""
    go_a, a_wrote = threading.Event(), threading.Event()

    def hook(real, s, p, rows, **kw):
        if threading.current_thread().name == "run_a":
            hook.a_at_write.set()
            assert go_a.wait(300)
            try:
                return real(s, p, rows, **kw)
            finally:
                a_wrote.set()
        go_a.set()  # B is about to write: let A's write land first
        assert a_wrote.wait(300)
        try:
            return real(s, p, rows, **kw)
        finally:
            if b_before_commit is not None:
                assert b_before_commit.wait(300)

    hook.a_at_write = threading.Event()
    return hook, go_a


def test_takeover_while_the_first_run_lives_its_write_lands_first(spark, warehouse, monkeypatch):
    """As above, but A's write lands after B took over and before B writes: B's draw must not
    land, and B must return A's cells (A's are the release)."""
    hook, go_a = _a_writes_first()
    a, b = _takeover(spark, warehouse, monkeypatch, hook, go_a)
    assert a.status == "published" and a.charge == ZCDP("0.25")  # A's fresh reservation
    assert b.status == "cache_hit" and b.charge is None


def test_a_run_that_lost_its_reservation_does_not_version_it_before_the_new_owner_commits(
        spark, demo_input, tmp_path, monkeypatch):
    """A's write lands after B took the reservation over, and B is held between its write and
    its commit until A has returned. A's commit fails (B owns the reservation now): A must not
    record a version of a release whose ledger entry is not committed yet -- the family's
    statement would be inconsistent and A's publish would fail although its cells are the
    release (what ``test_two_concurrent_runs_one_output_one_charge`` met under load). B commits,
    then records the one version. A 6 s lease: B's is still live when A tries to commit."""
    from dp_spark.governance.versions import history

    from .conftest import make_warehouse

    warehouse = make_warehouse(tmp_path / "lease6", demo_input, lease_seconds=6)
    a_done = threading.Event()
    hook, go_a = _a_writes_first(b_before_commit=a_done)  # B's commit waits until A has returned
    a, b = _takeover(spark, warehouse, monkeypatch, hook, go_a, lease_seconds=6, a_done=a_done)
    assert a.status == "published" and b.status == "cache_hit"
    versions = history(engine(spark, warehouse).ledger, a.family)
    assert [(v["release_id"], v["state"]) for v in versions] == [(a.release_id, "current")]


def test_missing_column_charges_nothing(spark, warehouse):
    d = yaml.safe_load(AOV.read_text())
    d["value"]["column"] = "basket_value"
    spec = register(warehouse, "aov_basket", d)
    eng = engine(spark, warehouse)
    with pytest.raises(SchemaError) as exc:
        eng.publish(spec)
    assert "basket_value" in str(exc.value)
    assert eng.ledger.entries() == []  # refused before the budget is even registered


def test_output_with_other_schema_is_refused_before_charging(spark, warehouse):
    env = load_env(warehouse)
    spark.range(3).write.format("delta").save(f"{env.output_root}/dau_daily")
    eng = engine(spark, warehouse)
    with pytest.raises(OutputSchemaError):
        eng.publish(register(warehouse, "dau_daily"))
    assert eng.ledger.entries() == []  # refused before the budget is even registered


def test_copied_table_under_new_budget_is_refused(spark, warehouse, tmp_path):
    """The same data under a new name and a copied config cannot start a fresh budget."""
    env = load_env(warehouse)
    eng = engine(spark, warehouse)
    eng.publish(register(warehouse, "dau_daily"))
    copy = Path(env.warehouse) / "input" / "renamed_events"
    shutil.copytree(env.datasets["demo_events"], copy)
    pol = yaml.safe_load((ROOT / "conf/policies/budgets.yaml").read_text())
    fresh = dict(pol["budgets"]["demo_events_user"])
    fresh["dataset"] = "renamed_events"
    pol["budgets"]["fresh_budget"] = fresh
    pfile = tmp_path / "p2.yaml"
    pfile.write_text(yaml.safe_dump(pol))
    env2 = write_env(tmp_path, policies=pfile, extra_datasets={"renamed_events": "{warehouse}/input/renamed_events"})
    d = yaml.safe_load(DAU.read_text())
    d["dataset"], d["budget"]["id"], d["name"] = "renamed_events", "fresh_budget", "dau_copy"
    spec = register(env2, "dau_copy", d)
    with pytest.raises(ConfigError, match="demo_events_user"):
        engine(spark, env2).publish(spec)


def test_empty_input_and_single_user_still_noisy(spark, warehouse):
    env = load_env(warehouse)
    path = env.datasets["demo_events"]
    src = spark.read.format("delta").load(path)
    one = src.where(F.col("user_id") == src.where(F.col("user_id").isNotNull()).first()["user_id"])
    for name, df in (("empty", src.limit(0)), ("single", one)):
        p = f"{env.warehouse}/input/{name}"
        df.write.format("delta").save(p)
        shutil.rmtree(path)
        shutil.copytree(p, path)
        eng = engine(spark, warehouse)
        res = eng.publish(register(warehouse, "aov_by_region"))
        assert res.status == "published" and len(res.rows) == 40
        assert all(0 <= r["value"] <= 500 for r in res.rows if r["statistic"] == "mean")


def test_cli_job_runs(spark, warehouse, capsys, monkeypatch):
    from dp_spark.cli import publish_main

    monkeypatch.setenv("DP_SPARK_PRINCIPAL", "publisher_bob")
    DAU = Path(warehouse).parents[1] / "releases" / "dau_daily.yaml"
    rc = publish_main(["--env", str(warehouse), "--conf", str(DAU), "--quiet"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "dau_daily: published" in out and "privacy statement" in out
    rc = publish_main(["--env", str(warehouse), "--conf", str(DAU), "--date", "2026-11-07", "--quiet"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "published (1 cell (1 key x 1 statistic: distinct_units))" in out
    rc = publish_main(["--env", str(warehouse), "--conf", str(DAU), "--date", "2027-01-01", "--quiet"])
    assert rc == 2


def test_degrade_runs_the_coarser_fallback(spark, warehouse, tmp_path):
    env_file = write_env(tmp_path, policies=_policies(tmp_path, 0.3))
    eng = engine(spark, env_file)
    eng.publish(register(env_file, "dau_daily"))  # 0.25 of 0.3 spent
    coarse = yaml.safe_load(AOV.read_text())
    coarse.update(name="aov_all_regions", family="aov_all_regions", group_by=None)
    coarse["bounds"] = {"max_rows_per_unit": 10, "max_partitions_per_unit": 1}
    coarse["budget"] = {"id": "demo_events_user", "measure": "zcdp", "rho": 0.05}
    register(env_file, "aov_all_regions", coarse)
    d = yaml.safe_load(AOV.read_text())
    d["on_exhausted"] = {"policy": "degrade", "fallback": "aov_all_regions.yaml"}
    res = eng.publish(register(env_file, "aov_degrading", d))
    assert res.status == "degraded" and res.family == "aov_all_regions"
    assert res.charge == ZCDP("0.05") and len(res.rows) == 2  # one global count and mean
    assert eng.ledger.status("demo_events_user").spent == ZCDP("0.3")
    decisions = [a.decision for a in eng.ledger.audit_rows()]
    assert decisions[-2:] == ["degraded", "degraded"]


def test_a_given_snapshot_is_used_and_must_be_of_the_specs_dataset(spark, warehouse):
    from dp_spark.delta.release_table import Snapshot, pin_snapshot

    dau = register(warehouse, "dau_daily")
    eng = engine(spark, warehouse)
    with pytest.raises(ConfigError, match="snapshot given"):
        eng.publish(dau, snapshot=Snapshot(location="/elsewhere", table_id="x", version=0))
    assert eng.ledger.entries() == []  # refused before the budget is even registered
    snap = pin_snapshot(spark, load_env(warehouse).dataset_location(dau.dataset))
    res = eng.publish(dau, snapshot=snap)
    assert res.status == "published" and {r["input_version"] for r in res.rows} == {snap.version}
