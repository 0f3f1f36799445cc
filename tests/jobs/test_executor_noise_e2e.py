"""Executor-side noise end to end: a release at or above the env's ``executor_noise_cells`` is
noised on the executors and written by one idempotent Delta commit, with no partial collected on
the driver; it publishes the very cells the driver path publishes (a deterministic test source);
a rerun is a cache hit that adds no commit; below the threshold the driver path runs as before."""

from __future__ import annotations

import dataclasses

import pytest
from pyspark.sql import functions as F

from tests.noise_sources import Shift
from dp_spark.backends import spark as spark_backend
from dp_spark.config import load_env, load_release_spec
from dp_spark.engine import Engine

from .conftest import make_warehouse

FIELDS = ("statistic", "key", "keys", "value", "ci_low", "ci_high", "confidence", "expected_abs_error",
          "mechanism", "noise_scale", "noise_stddev", "grid", "charge_json", "budget_id", "input_version",
          "band_low", "band_high")


def _publish(env_file, *, threshold=None, monkeypatch=None):
    env = load_env(env_file)
    if threshold is not None:
        env = dataclasses.replace(env, executor_noise_cells=threshold)
    spec = load_release_spec(env_file.parents[1] / "releases" / "orders_by_day_region.yaml")
    if monkeypatch is not None:  # the executor path must never collect partials on the driver
        def refuse(*a, **k):
            raise AssertionError("partials collected on the driver")

        monkeypatch.setattr(spark_backend, "collect_query_partials", refuse)
        monkeypatch.setattr(spark_backend, "stream_partial_columns", refuse)
    with Engine(env, source=Shift(2), mode="exploration", principal="analyst_alice") as eng:
        assert eng.noise_on_executors(spec) == (threshold is not None and threshold <= 360)
        return env, eng.publish(spec)


def _cells(spark, path, release_id):
    rows = spark.read.format("delta").load(path).where(F.col("release_id") == release_id).collect()
    return sorted((tuple(r[f] for f in FIELDS[:2]), {f: r[f] for f in FIELDS}) for r in rows)


def _writes(spark, path):
    """Commits that added rows (the table's creation writes none)."""
    hist = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
    return sum(1 for h in hist if h["operation"] == "WRITE" and int((h["operationMetrics"] or {}).get("numOutputRows", 0)) > 0)


def test_executor_path_publishes_the_driver_paths_cells_in_one_commit(spark, tmp_path, demo_input, monkeypatch):
    import shutil

    env_a, on_exec = _publish(make_warehouse(tmp_path / "a", demo_input), threshold=360, monkeypatch=monkeypatch)
    monkeypatch.undo()
    env_file_b = make_warehouse(tmp_path / "b", demo_input)
    # the same bounding salt: the same rows kept, so the same partials
    salt_b = load_env(env_file_b).salt_file
    salt_b.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(env_a.salt_file, salt_b)
    salt_b.chmod(0o600)
    env_b, on_driver = _publish(env_file_b)  # default threshold: driver
    assert on_exec.status == on_driver.status == "published"
    assert on_exec.rows == () and "executors" in on_exec.note  # nothing came back to the driver
    assert len(on_driver.rows) == 360
    path_a = on_exec.table_path
    a, b = _cells(spark, path_a, on_exec.release_id), _cells(spark, on_driver.table_path, on_driver.release_id)
    assert len(a) == len(b) == 360
    assert [c for _, c in a] == [c for _, c in b]
    assert _writes(spark, path_a) == 1
    # a rerun is a cache hit: no charge, no new commit, the stored cells
    env_file = tmp_path / "a" / "conf" / "envs" / "test.yaml"
    _, again = _publish(env_file, threshold=360)
    assert again.status == "cache_hit" and again.charge is None and len(again.rows) == 360
    assert _writes(spark, path_a) == 1


@pytest.mark.parametrize("threshold", [361])
def test_below_the_threshold_the_driver_path_runs(spark, tmp_path, demo_input, threshold):
    _, r = _publish(make_warehouse(tmp_path, demo_input), threshold=threshold)
    assert r.status == "published" and len(r.rows) == 360 and "executors" not in r.note
