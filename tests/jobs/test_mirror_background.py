"""The Delta tables derived from the SQL ledger are refreshed off the release's critical path.

``publish`` (``refresh="each"``) and ``finish`` (``"deferred"``) start the refresh of the
ledger's mirror and of ``_published`` (the version record's copy) in a background thread and
return without waiting for it; ``Engine.close()`` (the CLI, ``with Engine(...)``, the one-shot
``publish()`` and the interpreter's exit) waits until they equal the SQL ledger. These tests
hold the refresh at a gate to show both halves."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import dp_spark.engine as engine_mod
import dp_spark.delta.mirror as mirror
import dp_spark.governance.versions as versions_mod
from dp_spark.config import load_env
from dp_spark.engine import Engine, publish
from dp_spark.governance import statement_dir
from dp_spark.governance.versions import current_release_id, published_path_for

from .conftest import register

BUDGET = "demo_events_user"


@pytest.fixture
def gated(monkeypatch):
    """Every refresh of the derived tables (the ledger's mirror, and ``_published`` beside it in
    a second thread) waits at a gate (then runs for real); yields (entered, gate)."""
    entered, gate = threading.Event(), threading.Event()

    def holding(real):
        def held(*args, **kwargs):
            entered.set()
            assert gate.wait(120)
            return real(*args, **kwargs)
        return held

    monkeypatch.setattr(mirror, "mirror_to_delta", holding(mirror.mirror_to_delta))
    monkeypatch.setattr(versions_mod, "refresh_published", holding(versions_mod.refresh_published))
    yield entered, gate
    gate.set()


def _mirrored(spark, env) -> set[tuple[str, str]]:
    return {(r["release_id"], r["state"]) for r in spark.read.format("delta").load(env.ledger_mirror).collect()}


def _ledger(eng) -> set[tuple[str, str]]:
    return {(e.release_id, e.state) for e in eng.ledger.entries(BUDGET)}


def _published(spark, env) -> set[tuple[str, int, str, str]]:
    return {(r["family"], r["version_no"], r["release_id"], r["state"])
            for r in spark.read.format("delta").load(published_path_for(env.output_root)).collect()}


def _versions(eng) -> set[tuple[str, int, str, str]]:
    return {(v.family, v.version_no, v.release_id, v.state) for v in eng.ledger.versions()}


def test_publish_returns_before_the_mirror_refresh_and_close_waits_for_it(spark, warehouse, gated):
    entered, gate = gated
    env = load_env(warehouse)
    eng = Engine(env, spark=spark, principal="publisher_bob")  # refresh="each"
    result = eng.publish(register(warehouse, "dau_daily"))
    assert result.status == "published"
    # versioned (in the ledger) and stated before publish returned; the derived tables are
    # still held at the gate
    assert current_release_id(eng.ledger, result.family) == result.release_id
    assert entered.wait(60)
    assert eng.close(timeout=0.2) is False
    assert not Path(env.ledger_mirror, "_delta_log").exists()
    assert not Path(published_path_for(env.output_root), "_delta_log").exists()
    gate.set()
    assert eng.close(timeout=120) is True
    assert _mirrored(spark, env) == _ledger(eng) == {(result.release_id, "committed")}
    assert _published(spark, env) == _versions(eng) == {(result.family, 1, result.release_id, "current")}


def test_finish_versions_the_batch_and_leaves_the_mirror_to_the_background(spark, warehouse, gated):
    entered, gate = gated
    env = load_env(warehouse)
    with Engine(env, spark=spark, principal="publisher_bob", refresh="deferred") as eng:
        results = [eng.publish(register(warehouse, n)) for n in ("dau_daily", "aov_by_region")]
        assert not entered.is_set()  # deferred: nothing started before finish
        eng.finish()
        for r in results:
            assert current_release_id(eng.ledger, r.family) == r.release_id
            assert (statement_dir(env) / f"{r.family}.md").exists()
        assert entered.wait(60) and eng.close(timeout=0.2) is False
        gate.set()
    # leaving the block closed the engine: the mirror has caught up with both releases
    assert eng._mirror_task.idle
    assert _mirrored(spark, env) == _ledger(eng) == {(r.release_id, "committed") for r in results}
    assert _published(spark, env) == _versions(eng) == {(r.family, 1, r.release_id, "current") for r in results}


def test_one_shot_publish_and_the_exit_hook_wait_for_the_mirror(spark, warehouse, gated):
    entered, gate = gated
    env = load_env(warehouse)
    # the one-shot helper closes its engine: it returns only after the refresh ran
    threading.Timer(0.5, gate.set).start()
    first = publish(register(warehouse, "dau_daily"), env, spark=spark, principal="publisher_bob")
    assert entered.is_set() and gate.is_set()
    assert (first.release_id, "committed") in _mirrored(spark, env)

    # an engine nobody closes: the interpreter's exit hook (registered once, after the
    # session exists) waits for its refresh
    gate.clear()
    entered.clear()
    eng = Engine(env, spark=spark, principal="publisher_bob")
    assert engine_mod._EXIT_HOOK == [True] and eng in engine_mod._LIVE
    second = eng.publish(register(warehouse, "aov_by_region"))
    assert entered.wait(60) and not eng._mirror_task.idle
    threading.Timer(0.5, gate.set).start()
    engine_mod._drain_at_exit()
    assert eng._mirror_task.idle
    assert _mirrored(spark, env) == _ledger(eng) == {(first.release_id, "committed"),
                                                     (second.release_id, "committed")}


def test_an_exploration_engine_writes_no_published_table(spark, warehouse):
    env = load_env(warehouse)
    with Engine(env, spark=spark, principal="analyst_alice", mode="exploration") as explore:
        assert explore.publish(register(warehouse, "dau_daily")).status == "published"
    assert explore.ledger.versions() == []
    assert not Path(published_path_for(env.output_root)).exists()
