"""Versions and rollback of release families (Delta ``_published`` table)."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from dp_spark.errors import ConfigError
from dp_spark.governance.versions import (
    PUBLISHED_SCHEMA,
    VersionInvariantError,
    current_release_id,
    history,
    published_path_for,
    published_view,
    record_publication,
    record_publications,
    rollback,
)

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=timezone.utc)


def clock_from(start=T0):
    t = [start]

    def now():
        t[0] = t[0] + timedelta(minutes=1)
        return t[0]
    return now


def states(spark, path, family):
    return [(r["version_no"], r["release_id"], r["state"]) for r in history(spark, path, family)]


def release_rows(spark, path, family, release_ids, mode="official"):
    """A tiny release table: two cells per release (only the columns the view needs + value)."""
    from dp_spark.release.writer import RELEASE_SCHEMA

    rows = []
    for i, rid in enumerate(release_ids):
        for key in ("a", "b"):
            r = {f.name: None for f in RELEASE_SCHEMA.fields}
            r.update(release_id=rid, release_family=family, release_name=family, spec_version="v", mode=mode,
                     statistic="count", key=key, value=float(10 * i), ci_low=0.0, ci_high=1.0, confidence=0.95,
                     expected_abs_error=1.0, mechanism="discrete_laplace", noise_scale=1.0, noise_stddev=1.0,
                     grid=1.0, charge_json="{}", budget_id="b", bounds_json="{}", privacy_unit="user",
                     unit_column="user_id", neighbouring="add_remove_unit", parallel_composition=True,
                     suppressed=False, input_table_id="t", input_version=0, code_version="0",
                     created_at=datetime(2026, 12, 1, i))
            rows.append(tuple(r[f.name] for f in RELEASE_SCHEMA.fields))
    spark.createDataFrame(rows, RELEASE_SCHEMA).write.format("delta").mode("append").save(path)


@pytest.fixture
def paths(tmp_path):
    root = str(tmp_path / "releases")
    return published_path_for(root), f"{root}/dau"


def test_publish_supersede_and_idempotent(spark, paths):
    pub, _ = paths
    clk = clock_from()
    assert current_release_id(spark, pub, "dau") is None
    assert record_publication(spark, pub, "dau", "r1", "publisher_bob", clock=clk) == 1
    assert record_publication(spark, pub, "dau", "r2", "publisher_bob", clock=clk) == 2
    assert record_publication(spark, pub, "dau", "r2", "publisher_bob", clock=clk) == 2  # rerun: no-op
    assert record_publication(spark, pub, "aov", "x1", "publisher_bob", clock=clk) == 1  # other family
    assert states(spark, pub, "dau") == [(1, "r1", "superseded"), (2, "r2", "current")]
    assert current_release_id(spark, pub, "dau") == "r2" and current_release_id(spark, pub, "aov") == "x1"
    h = history(spark, pub, "dau")
    assert h[0]["principal"] == "publisher_bob" and h[0]["changed_by"] == "publisher_bob"
    assert h[1]["changed_by"] is None and h[1]["at"] > h[0]["at"]


def test_a_batch_is_versioned_in_one_commit_in_order(spark, paths):
    pub, _ = paths
    clk = clock_from()
    record_publication(spark, pub, "dau", "d0", "bob", clock=clk)
    v0 = spark.sql(f"DESCRIBE HISTORY delta.`{pub}`").agg(F.max("version")).first()[0]
    got = record_publications(spark, pub, [("dau", "d1"), ("aov", "a1"), ("dau", "d2"), ("dau", "d0")], "bob",
                              clock=clk)
    v1 = spark.sql(f"DESCRIBE HISTORY delta.`{pub}`").agg(F.max("version")).first()[0]
    assert got == [2, 1, 3, 1] and v1 - v0 == 1  # d0 already had version 1: unchanged
    assert states(spark, pub, "dau") == [(1, "d0", "superseded"), (2, "d1", "superseded"), (3, "d2", "current")]
    assert states(spark, pub, "aov") == [(1, "a1", "current")]
    h = history(spark, pub, "dau")  # d1 was superseded on arrival, in the same commit
    assert h[1]["changed_by"] == "bob" and h[1]["changed_at"] == h[1]["at"] and h[2]["changed_by"] is None
    # a rerun of the batch changes nothing and makes no commit
    assert record_publications(spark, pub, [("dau", "d1"), ("aov", "a1"), ("dau", "d2")], "bob") == [2, 1, 3]
    assert spark.sql(f"DESCRIBE HISTORY delta.`{pub}`").agg(F.max("version")).first()[0] == v1
    assert record_publications(spark, pub, [], "bob") == []


def test_each_state_change_is_one_delta_commit(spark, paths):
    pub, _ = paths
    record_publication(spark, pub, "dau", "r1", "bob")
    v0 = spark.sql(f"DESCRIBE HISTORY delta.`{pub}`").agg(F.max("version")).first()[0]
    record_publication(spark, pub, "dau", "r2", "bob")  # supersede r1 + insert r2
    v1 = spark.sql(f"DESCRIBE HISTORY delta.`{pub}`").agg(F.max("version")).first()[0]
    rollback(spark, pub, "dau", "carol", "wrong input snapshot")  # withdraw r2 + restore r1
    v2 = spark.sql(f"DESCRIBE HISTORY delta.`{pub}`").agg(F.max("version")).first()[0]
    assert (v1 - v0, v2 - v1) == (1, 1)
    props = spark.sql(f"SHOW TBLPROPERTIES delta.`{pub}`").collect()
    assert any(r["key"] == "delta.isolationLevel" and r["value"] == "Serializable" for r in props)


def test_rollback_restores_previous_and_keeps_history(spark, paths):
    pub, _ = paths
    clk = clock_from()
    for rid in ("r1", "r2", "r3"):
        record_publication(spark, pub, "dau", rid, "publisher_bob", clock=clk)
    assert rollback(spark, pub, "dau", "admin_carol", "bug in day 30", clock=clk) == ("r3", "r2")
    assert states(spark, pub, "dau") == [(1, "r1", "superseded"), (2, "r2", "current"), (3, "r3", "withdrawn")]
    h = {r["version_no"]: r for r in history(spark, pub, "dau")}
    assert h[3]["reason"] == "bug in day 30" and h[3]["changed_by"] == "admin_carol"
    assert h[3]["principal"] == "publisher_bob"  # who published it is kept
    # a second rollback skips nothing it should not: r2 withdrawn, r1 restored
    assert rollback(spark, pub, "dau", "admin_carol", "also wrong", clock=clk) == ("r2", "r1")
    # a rerun of a withdrawn release does not bring it back
    assert record_publication(spark, pub, "dau", "r3", "publisher_bob", clock=clk) == 3
    assert current_release_id(spark, pub, "dau") == "r1"
    # a new release becomes version 4 and supersedes r1; withdrawn versions stay withdrawn
    assert record_publication(spark, pub, "dau", "r4", "publisher_bob", clock=clk) == 4
    assert states(spark, pub, "dau") == [(1, "r1", "superseded"), (2, "r2", "withdrawn"),
                                         (3, "r3", "withdrawn"), (4, "r4", "current")]
    # rolling back r4 restores r1 (the latest non-withdrawn), not r3
    assert rollback(spark, pub, "dau", "admin_carol", "r4 too", clock=clk) == ("r4", "r1")


def test_rollback_of_the_only_version_empties_the_view(spark, paths):
    pub, rel = paths
    release_rows(spark, rel, "dau", ["r1"])
    record_publication(spark, pub, "dau", "r1", "bob")
    assert rollback(spark, pub, "dau", "carol", "withdrawn entirely") == ("r1", None)
    assert current_release_id(spark, pub, "dau") is None
    assert published_view(spark, rel, pub, "dau").count() == 0
    with pytest.raises(ConfigError, match="no current version"):
        rollback(spark, pub, "dau", "carol", "again")


def _sortable(df):
    """chispa sorts by every column to ignore row order; a map column cannot be sorted."""
    return df.withColumn("keys", F.to_json("keys"))


def test_published_view_serves_only_the_current_release(spark, paths):
    pub, rel = paths
    release_rows(spark, rel, "dau", ["r1", "r2"])
    release_rows(spark, rel, "dau", ["e1"], mode="exploration")
    base = spark.read.format("delta").load(rel)
    assert published_view(spark, rel, pub, "dau").count() == 0  # nothing published yet
    record_publication(spark, pub, "dau", "r1", "bob")
    record_publication(spark, pub, "dau", "r2", "bob")
    assert_df_equality(_sortable(published_view(spark, rel, pub, "dau")),
                       _sortable(base.where(F.col("release_id") == "r2")),
                       ignore_row_order=True)
    rollback(spark, pub, "dau", "carol", "bad")
    assert_df_equality(_sortable(published_view(spark, rel, pub, "dau")),
                       _sortable(base.where(F.col("release_id") == "r1")),
                       ignore_row_order=True)
    # an exploration release id recorded by mistake is still never served
    record_publication(spark, pub, "dau", "e1", "bob")
    assert published_view(spark, rel, pub, "dau").count() == 0


def test_history_schema(spark, paths):
    pub, _ = paths
    record_publication(spark, pub, "dau", "r1", "bob")
    schema = spark.read.format("delta").load(pub).schema
    assert [(f.name, f.dataType) for f in schema.fields] == [(f.name, f.dataType) for f in PUBLISHED_SCHEMA.fields]


def test_two_current_rows_are_detected(spark, paths):
    pub, _ = paths
    record_publication(spark, pub, "dau", "r1", "bob")
    # an edit outside dp_spark (or a lost commit) adds a second current row
    bad = spark.createDataFrame([("dau", 2, "rX", "current", None, "mallory", datetime(2026, 12, 2), None, None)],
                                PUBLISHED_SCHEMA)
    bad.write.format("delta").mode("append").save(pub)
    with pytest.raises(VersionInvariantError, match="2 current versions"):
        current_release_id(spark, pub, "dau")
    with pytest.raises(VersionInvariantError):
        record_publication(spark, pub, "dau", "r3", "bob")


def test_refusals(spark, paths):
    pub, _ = paths
    with pytest.raises(ConfigError, match="no published versions"):
        rollback(spark, pub, "dau", "carol", "x")
    with pytest.raises(ConfigError, match="reason"):
        rollback(spark, pub, "dau", "carol", "  ")
    with pytest.raises(ConfigError, match="principal"):
        record_publication(spark, pub, "dau", "r1", "")


@pytest.mark.slow
def test_concurrent_publications_leave_one_current(spark, paths):
    pub, _ = paths
    record_publication(spark, pub, "dau", "r0", "bob")
    errors = []

    def run(rid):
        try:
            record_publication(spark, pub, "dau", rid, "bob")
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(f"c{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    s = states(spark, pub, "dau")
    assert sorted(r[0] for r in s) == [1, 2, 3, 4]
    assert sum(1 for r in s if r[2] == "current") == 1
    assert {r[1] for r in s} == {"r0", "c0", "c1", "c2"}


class _TableAppearsDuringTheRead:
    """A session whose first Delta load says "no table" although the table is there (what a
    process saw while two others created the table at once); everything else is the real one."""

    def __init__(self, spark):
        self._spark, self.failed = spark, 0

    def __getattr__(self, name):
        return getattr(self._spark, name)

    @property
    def read(self):
        outer = self

        class Reader:
            def format(self, fmt):
                real = outer._spark.read.format(fmt)

                class Loader:
                    def load(self, path):
                        if not outer.failed:
                            outer.failed += 1
                            raise RuntimeError("[DELTA_TABLE_NOT_FOUND] Delta table doesn't exist.")
                        return real.load(path)
                return Loader()
        return Reader()


def test_a_table_that_appears_during_the_read_is_read_again(spark, paths):
    from dp_spark.governance import versions

    pub, _ = paths
    record_publication(spark, pub, "dau", "r1", "bob")
    flaky = _TableAppearsDuringTheRead(spark)
    rows = versions._rows(flaky, pub, ["dau"])
    assert flaky.failed == 1 and [r["release_id"] for r in rows] == ["r1"]
