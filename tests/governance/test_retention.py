"""Staging areas die with their job (success or failure); the retention list is complete."""

from __future__ import annotations

import os
import stat
import time
from types import SimpleNamespace

import pytest

from dp_spark.errors import ConfigError
from dp_spark.governance.retention import MARKER, RETENTION, staging_area, staging_root, sweep_stale


def test_created_unique_private_and_deleted_on_success(tmp_path):
    with staging_area(tmp_path, job="publish") as a, staging_area(tmp_path, job="publish") as b:
        assert a != b and a.is_dir() and b.is_dir() and a.parent == tmp_path
        assert stat.S_IMODE(a.stat().st_mode) == 0o700
        (a / "part-0000.parquet").write_bytes(b"raw rows")
        (a / "nested").mkdir()
        (a / "nested" / "x").write_text("y")
    assert not a.exists() and not b.exists()
    assert list(tmp_path.iterdir()) == []


def test_deleted_on_failure_and_exception_propagates(tmp_path):
    seen = {}
    with pytest.raises(RuntimeError, match="boom"):
        with staging_area(tmp_path, job="publish") as d:
            seen["d"] = d
            (d / "checkpoint").write_text("raw")
            raise RuntimeError("boom")
    assert not seen["d"].exists()


def test_deleted_on_keyboard_interrupt_and_read_only_content(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with staging_area(tmp_path) as d:
            sub = d / "ro"
            sub.mkdir()
            (sub / "f").write_text("x")
            os.chmod(sub, 0o500)  # a read-only folder: plain rmtree fails on it
            raise KeyboardInterrupt
    assert not d.exists()


def test_env_root_and_bad_job_names(tmp_path):
    env = SimpleNamespace(warehouse=tmp_path / "wh")
    assert staging_root(env) == tmp_path / "wh" / "_staging"
    with staging_area(env, job="aov") as d:
        assert d.parent == tmp_path / "wh" / "_staging" and d.name.startswith("aov-")
    for bad in ("../x", "", "a b"):
        with pytest.raises(ConfigError):
            with staging_area(tmp_path, job=bad):
                pass
    with pytest.raises(ConfigError):
        staging_root(42)


def test_sweep_removes_only_stale_marked_staging_dirs(tmp_path):
    # an abandoned area of a killed job (marker present, old), a fresh one, and foreign folders
    old = tmp_path / "publish-20260101T000000Z-0123456789ab"
    old.mkdir()
    (old / MARKER).write_text("pid=1")
    (old / "data").write_text("raw")
    past = time.time() - 3 * 24 * 3600
    os.utime(old / MARKER, (past, past))
    fresh = tmp_path / "publish-20260102T000000Z-0123456789ac"
    fresh.mkdir()
    (fresh / MARKER).write_text("pid=2")
    foreign = tmp_path / "publish-20260101T000000Z-0123456789ad"  # right name, no marker
    foreign.mkdir()
    other = tmp_path / "releases"
    other.mkdir()
    (other / MARKER).write_text("x")
    os.utime(other / MARKER, (past, past))
    assert sweep_stale(tmp_path, stale_after=24 * 3600) == [old]
    assert not old.exists() and fresh.exists() and foreign.exists() and other.exists()
    # a new staging area sweeps on entry
    os.utime(fresh / MARKER, (past, past))
    with staging_area(tmp_path):
        assert not fresh.exists()
    assert sweep_stale(tmp_path / "missing") == []


def test_checkpoint_dir_set_for_the_block(spark, tmp_path):
    with staging_area(tmp_path, job="ckpt", spark=spark) as d:
        ck = spark.sparkContext.getCheckpointDir()
        assert ck is not None and str(d / "checkpoints") in ck
        assert spark.range(5).checkpoint(eager=True).count() == 5
        assert any((d / "checkpoints").rglob("*"))
    assert not d.exists()


def test_retention_list_names_every_store():
    assert {"staging", "release_tables", "exploration_tables", "versions", "ledger", "audit", "mirrors",
            "summaries"} <= set(RETENTION)
    for name, entry in RETENTION.items():
        assert set(entry) == {"what", "where", "kept", "why"} and all(entry.values()), name
    assert "never" in RETENTION["ledger"]["kept"] and "job ends" in RETENTION["staging"]["kept"]
