"""The ``charge_delta`` column of release tables: written by new releases, added (with
``keys``) to a table written before it existed, old rows reading it as null."""

from __future__ import annotations

from datetime import datetime

from pyspark.sql import types as T

from dp_spark.delta import release_table as W


def _row(release_id: str, charge_delta):
    r = {f.name: None for f in W.RELEASE_SCHEMA.fields}
    r.update(release_id=release_id, release_family="f", release_name="n", spec_version="v", mode="official",
             statistic="count", key="a", keys={"region": "a"}, value=1.0, ci_low=0.0, ci_high=2.0,
             confidence=0.95, expected_abs_error=1.0, mechanism="discrete_laplace", noise_scale=1.0,
             noise_stddev=1.0, grid=1.0, charge_json="{}", budget_id="b", bounds_json="{}", privacy_unit="user",
             unit_column="user_id", neighbouring="add_remove_unit", parallel_composition=True, suppressed=False,
             input_table_id="t", input_version=1, code_version="c", created_at=datetime(2026, 1, 1),
             charge_delta=charge_delta)
    return r


def test_an_old_table_gets_charge_delta_and_keys_and_old_rows_read_null(spark, tmp_path):
    path = str(tmp_path / "rel")
    old_schema = T.StructType([f for f in W.RELEASE_SCHEMA.fields if f.name not in ("keys", "charge_delta")])
    old = {k: v for k, v in _row("old", None).items() if k not in ("keys", "charge_delta")}
    spark.createDataFrame([tuple(old[f.name] for f in old_schema.fields)], old_schema) \
        .write.format("delta").save(path)
    assert W.check_release_table(spark, path) == "needs_columns"
    W.ensure_release_table(spark, path)
    assert W.check_release_table(spark, path) == "ok"
    W.write_release(spark, path, [_row("new", 1e-8)])
    got = {r["release_id"]: r["charge_delta"] for r in spark.read.format("delta").load(path).collect()}
    assert got == {"old": None, "new": 1e-8}


def test_a_table_with_keys_but_without_charge_delta_is_migrated(spark, tmp_path):
    path = str(tmp_path / "rel2")
    schema = T.StructType([f for f in W.RELEASE_SCHEMA.fields if f.name != "charge_delta"])
    r = {k: v for k, v in _row("old", None).items() if k != "charge_delta"}
    spark.createDataFrame([tuple(r[f.name] for f in schema.fields)], schema).write.format("delta").save(path)
    assert W.check_release_table(spark, path) == "needs_columns"
    W.ensure_release_table(spark, path)
    W.write_release(spark, path, [_row("new", None)])
    assert spark.read.format("delta").load(path).where("charge_delta IS NOT NULL").count() == 0
