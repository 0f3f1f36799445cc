"""``release.writer.append_if_unchanged``: a conditional append through Delta's transaction.

The contract the ledger mirror relies on: a commit lands only when the table is still at the
planned version and no other non-blind commit gets in first; it records the same key
(``txnAppId``/``txnVersion``) and ``userMetadata`` as the DataFrame writer's idempotent append,
so the two paths recognise each other's writes; and it reconstructs no table state (fewer Spark
jobs than the DataFrame writer's conditional append on a fresh snapshot).
"""

from __future__ import annotations

import json

import pytest
from pyspark.sql import types as T

from dp_spark.release import writer as W
from tests.spark.test_versions_state_cache import jobs  # (fn(), Spark jobs it ran)

SCHEMA = T.StructType([T.StructField("seq", T.LongType(), False), T.StructField("note", T.StringType(), False)])
APP = "dp_spark.test_append"


def _table(spark, tmp_path, name="t"):
    path = str(tmp_path / name)
    spark.createDataFrame([(1, "a")], SCHEMA).write.format("delta").save(path)
    return path


def _df(spark, *seqs):
    return spark.createDataFrame([(s, "x") for s in seqs], SCHEMA).coalesce(1)


def _seqs(spark, path):
    return sorted(r["seq"] for r in spark.read.format("delta").load(path).collect())


def _version(spark, path):
    return W._fast_snapshot(spark, path).version


def _commit_info(path, version):
    with open(f"{path}/_delta_log/{version:020d}.json", encoding="utf-8") as f:
        return next(json.loads(line)["commitInfo"] for line in f if line.startswith('{"commitInfo"'))


def _append(spark, path, df, version, meta="m", **kw):
    return W.append_if_unchanged(spark, path, df, version=version, app_id=APP, user_metadata=meta, **kw)


def test_commits_at_the_next_version_with_the_key_and_user_metadata(spark, tmp_path):
    path = _table(spark, tmp_path)
    v = _version(spark, path)
    assert _append(spark, path, _df(spark, 2, 3), v, meta='{"from": 0}') == v + 1
    assert _seqs(spark, path) == [1, 2, 3]
    info = _commit_info(path, v + 1)
    assert info["userMetadata"] == '{"from": 0}' and info["operation"] == "WRITE"
    assert info["isBlindAppend"] is False  # it declared a read: concurrent writers of this kind conflict
    snap = W._jvm_snapshot(spark, path)
    assert snap.transactions().get(APP).get() == v + 1
    # the DataFrame writer's idempotent append planned from the same version is skipped
    (_df(spark, 2, 3).write.format("delta").option("txnAppId", APP).option("txnVersion", v + 1)
     .mode("append").save(path))
    assert _seqs(spark, path) == [1, 2, 3]


def test_nothing_is_committed_when_the_table_moved_on(spark, tmp_path):
    path = _table(spark, tmp_path)
    v = _version(spark, path)
    assert _append(spark, path, _df(spark, 2), v) == v + 1
    assert _append(spark, path, _df(spark, 2), v) == 0  # planned from v: the table is at v + 1
    # a DataFrame writer's conditional append from v + 1 lands; a fast one planned from v + 1 then not
    (_df(spark, 3).write.format("delta").option("txnAppId", APP).option("txnVersion", v + 2)
     .mode("append").save(path))
    assert _append(spark, path, _df(spark, 3), v + 1) == 0
    assert _seqs(spark, path) == [1, 2, 3] and _version(spark, path) == v + 2


def test_a_concurrent_conditional_append_makes_the_later_commit_fail(spark, tmp_path):
    """Two writers planned from the same version, the second committing while the first has
    written its files: exactly one lands (Delta's conflict check), no row is doubled."""
    path = _table(spark, tmp_path)
    v = _version(spark, path)
    inner: list = []
    outer = _append(spark, path, _df(spark, 2), v,
                    _before_commit=lambda: inner.append(_append(spark, path, _df(spark, 2), v)))
    assert inner == [v + 1] and outer == 0
    assert _seqs(spark, path) == [1, 2] and _version(spark, path) == v + 1


def test_a_blind_append_in_between_is_never_reported_as_the_next_version(spark, tmp_path):
    """A blind append (no key, no read) committing meanwhile: the transaction either conflicts
    (0, nothing of ours committed: Delta 4.4 does so) or lands later than v + 1 (the caller then
    treats it as a race); never "committed at v + 1"."""
    path = _table(spark, tmp_path)
    v = _version(spark, path)

    def blind():
        _df(spark, 9).write.format("delta").mode("append").save(path)

    got = _append(spark, path, _df(spark, 2), v, _before_commit=blind)
    assert got in (0, v + 2)
    assert _seqs(spark, path) == ([1, 9] if got == 0 else [1, 2, 9])


def test_not_available_for_another_schema_or_no_table(spark, tmp_path):
    path = _table(spark, tmp_path)
    v = _version(spark, path)
    for other in (T.StructType([T.StructField("seq", T.IntegerType(), False), T.StructField("note", T.StringType())]),
                  T.StructType([T.StructField("note", T.StringType()), T.StructField("seq", T.LongType())]),
                  T.StructType([T.StructField("seq", T.LongType())])):
        row = {"seq": 2, "note": "x"}
        assert _append(spark, path, spark.createDataFrame([tuple(row[f.name] for f in other.fields)], other), v) is None
    assert _append(spark, str(tmp_path / "none"), _df(spark, 2), -1) is None
    assert _seqs(spark, path) == [1] and _version(spark, path) == v
    assert not (tmp_path / "none").exists()


def test_rows_of_nullable_type_go_into_the_tables_columns(spark, tmp_path):
    """The table's schema (nullability included) is what is written: the same columns and
    types are enough."""
    path = _table(spark, tmp_path)
    v = _version(spark, path)
    nullable = T.StructType([T.StructField("seq", T.LongType(), True), T.StructField("note", T.StringType(), True)])
    assert _append(spark, path, spark.createDataFrame([(2, "x")], nullable), v) == v + 1
    assert _seqs(spark, path) == [1, 2]


def test_an_error_after_the_files_are_written_is_raised(spark, tmp_path):
    path = _table(spark, tmp_path)
    v = _version(spark, path)

    def fail():
        raise RuntimeError("injected")

    with pytest.raises(Exception, match="injected"):
        _append(spark, path, _df(spark, 2), v, _before_commit=fail)
    assert _seqs(spark, path) == [1]


def test_no_state_reconstruction(spark, tmp_path):
    """On a table whose latest snapshot is new (no state computed yet), the transaction runs
    only the write's job; Delta 4.x's conditional DataFrame append (``txnVersion``) also
    reconstructs the table state first."""
    path = _table(spark, tmp_path)
    for i in range(3):  # a few commits, then a fresh snapshot each time
        _df(spark, 10 + i).write.format("delta").mode("append").save(path)
    v = _version(spark, path)
    committed, fast = jobs(spark, lambda: _append(spark, path, _df(spark, 2), v))
    assert committed == v + 1
    _, slow = jobs(spark, lambda: _df(spark, 3).write.format("delta").option("txnAppId", "other")
                   .option("txnVersion", 1).mode("append").save(path))
    assert fast < slow, (fast, slow)
    assert fast <= 2, fast


def test_warm_tables_takes_the_state_reconstruction_off_the_next_merge(spark, tmp_path, monkeypatch):
    """``warm_tables`` computes a table's state on its latest snapshot; the next MERGE (the
    version record of a batch; one family's is not a MERGE) then runs fewer Spark jobs than the
    same MERGE on an unwarmed twin table at the same Delta version; a missing table is a no-op."""
    from dp_spark.governance import versions as V

    monkeypatch.setattr(V, "_rewrite_family", lambda *a: False)  # the MERGE path

    counts = []
    for name, warm in (("cold", False), ("warm", True)):
        pub = str(tmp_path / name / "_published")
        V.ensure_published_table(spark, pub)
        for i in range(3):
            V.record_publication(spark, pub, "fam", f"r{i}", "p")
        V.clear_cache()
        V.history(spark, pub, "fam")  # the rows are cached: the MERGE below reads no rows
        if warm:
            W.warm_tables(spark, [pub, str(tmp_path / "missing")])
        counts.append(jobs(spark, lambda: V.record_publication(spark, pub, "fam", "r9", "p"))[1])
    assert counts[1] < counts[0], counts
    assert not (tmp_path / "missing").exists()
