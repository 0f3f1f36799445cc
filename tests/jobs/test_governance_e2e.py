"""Governance through the engine: roles, pre-registration, thresholds, versions, statement."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from pyspark.sql import functions as F

from dp_spark.core.budget import ZCDP
from dp_spark.config import load_env, load_release_spec
from dp_spark.engine import Engine
from dp_spark.errors import PermissionDeniedError

from .conftest import ROOT, register


def engine(spark, env_file, principal, **kw):
    return Engine(load_env(env_file), spark=spark, principal=principal, **kw)


def test_unknown_principal_is_refused_before_any_data(spark, warehouse):
    eng = engine(spark, warehouse, "mallory")
    with pytest.raises(PermissionDeniedError) as exc:
        eng.publish(register(warehouse, "dau_daily"))
    assert "mallory" in str(exc.value)
    assert eng.ledger.entries(None) == []
    rows = eng.ledger.audit_rows()
    assert len(rows) == 1 and rows[0].decision == "refused_permission"
    assert not (Path(load_env(warehouse).output_root) / "dau_daily").exists()


def test_analyst_explores_but_cannot_publish(spark, warehouse):
    with pytest.raises(PermissionDeniedError):
        engine(spark, warehouse, "analyst_alice").publish(register(warehouse, "dau_daily"))
    eng = engine(spark, warehouse, "analyst_alice", mode="exploration")
    res = eng.publish(register(warehouse, "dau_daily"))
    assert res.status == "published"
    env = load_env(warehouse)
    assert res.table_path.startswith(env.exploration_root)
    assert {r["mode"] for r in res.rows} == {"exploration"}
    # exploration spends the same budget: it composes with official releases
    assert eng.ledger.status("demo_events_user").spent == ZCDP("0.25")
    # and never becomes a published version
    assert not (Path(env.output_root) / "_published").exists()
    with pytest.raises(PermissionDeniedError):
        engine(spark, warehouse, "publisher_bob", mode="exploration").publish(register(warehouse, "dau_daily"))


def test_edited_or_unregistered_spec_is_refused_for_official(spark, warehouse, tmp_path):
    d = yaml.safe_load((ROOT / "conf/releases/dau_daily.yaml").read_text())
    d["budget"]["rho"] = 0.5
    outside = tmp_path / "elsewhere.yaml"
    outside.write_text(yaml.safe_dump(d))
    eng = engine(spark, warehouse, "publisher_bob")
    with pytest.raises(PermissionDeniedError, match="pre-registered|registered"):
        eng.publish(load_release_spec(outside))
    assert eng.ledger.entries(None) == []


def test_min_group_size_on_noisy_counts_is_recorded(spark, warehouse):
    d = yaml.safe_load((ROOT / "conf/releases/aov_by_region.yaml").read_text())
    d["name"] = "aov_thresholded"
    d["min_group_size"] = {"threshold": 400, "strategy": "suppress"}
    spec = register(warehouse, "aov_thresholded", d)
    eng = engine(spark, warehouse, "publisher_bob")
    res = eng.publish(spec)
    counts = {r["key"]: r for r in res.rows if r["statistic"] == "count"}
    sup = {k for k, r in counts.items() if r["suppressed"]}
    assert sup, "the demo data has regions below 400 orders"
    assert len(sup) < 20
    for r in res.rows:
        assert r["suppressed"] == (r["key"] in sup)
        if r["suppressed"]:
            assert r["value"] != r["value"]  # NaN: nothing published for that cell
    assert f"suppressed {len(sup)} of 20" in eng.ledger.audit_rows()[-1].detail


def test_rollback_restores_previous_version_without_refund(spark, warehouse, capsys, monkeypatch):
    from dp_spark.cli import rollback_main
    from dp_spark.governance.versions import current_release_id, history

    env = load_env(warehouse)
    eng = engine(spark, warehouse, "publisher_bob")
    spec = register(warehouse, "dau_daily")
    first = eng.publish(spec)
    path = env.datasets["demo_events"]
    spark.read.format("delta").load(path).limit(3).write.format("delta").mode("append").save(path)
    second = eng.publish(spec)
    assert current_release_id(eng.ledger, "dau_daily") == second.release_id
    spent = eng.ledger.status("demo_events_user").spent

    monkeypatch.setenv("DP_SPARK_PRINCIPAL", "publisher_bob")
    assert rollback_main(["--env", str(warehouse), "--family", "dau_daily", "--reason", "bad input"]) == 2
    monkeypatch.setenv("DP_SPARK_PRINCIPAL", "admin_carol")
    assert rollback_main(["--env", str(warehouse), "--family", "dau_daily", "--reason", "bad input"]) == 0
    assert current_release_id(eng.ledger, "dau_daily") == first.release_id
    states = [h["state"] for h in history(eng.ledger, "dau_daily")]
    assert sorted(states) == ["current", "withdrawn"]
    assert eng.ledger.status("demo_events_user").spent == spent  # no refund
    statement = json.loads((Path(env.warehouse) / "statements" / "dau_daily.json").read_text())
    text = json.dumps(statement)
    assert second.release_id in text and "bad input" in text
    # the release table keeps both releases (history), the published view only the current one
    from dp_spark.governance.versions import published_view

    view = published_view(spark, f"{env.output_root}/dau_daily", eng.ledger, "dau_daily")
    assert {r["release_id"] for r in view.select("release_id").distinct().collect()} == {first.release_id}


def test_deferred_engine_versions_the_batch_at_finish_and_a_rerun_heals(spark, warehouse):
    from dp_spark.governance.versions import current_release_id, history

    env = load_env(warehouse)
    spec = register(warehouse, "dau_daily")
    eng = engine(spark, warehouse, "publisher_bob", refresh="deferred")
    first = eng.publish(spec)
    assert first.status == "published"
    # published (table and ledger) but not yet versioned: that waits for finish()
    assert current_release_id(eng.ledger, "dau_daily") is None
    statement = Path(env.warehouse) / "statements" / "dau_daily.json"
    assert not statement.exists()
    # the engine "crashes" here: a new engine's rerun is a cache hit, and its finish() heals
    again = engine(spark, warehouse, "publisher_bob", refresh="deferred")
    hit = again.publish(spec)
    assert hit.status == "cache_hit" and hit.release_id == first.release_id and hit.charge is None
    again.finish()
    assert current_release_id(eng.ledger, "dau_daily") == first.release_id
    assert [h["version_no"] for h in history(eng.ledger, "dau_daily")] == [1]
    assert first.release_id in statement.read_text()
    eng.finish()  # the crashed engine's pending record is idempotent
    assert [h["state"] for h in history(eng.ledger, "dau_daily")] == ["current"]
