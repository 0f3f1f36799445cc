"""``write_release(..., sole_writer=...)``: the release write without the key lookup.

When the caller proves that no write of the release id has landed (the engine: a fresh
reservation it still owns, asked after the commit's snapshot is read), the append commits
through Delta's transaction with the same key (``dp_spark_release:<id>``, 1) and declares the
key read instead of looking it up, so Delta reconstructs no table state. The contract, tested
here: the commit carries the key (the DataFrame writer's idempotent append of the same id is
then skipped); a write of the same id committed after the snapshot makes it fail
(``ConcurrentReleaseWrite``, nothing of ours lands) -- and without the declared read both would
land (shown, so the race test can fail); a write of another release id in between does not
stop it; an unproven or failed proof, or a table with other columns, falls back to the
DataFrame writer; and it runs fewer Spark jobs than the writer's key lookup on a new snapshot.
"""

from __future__ import annotations

import pytest

from dp_spark.release import writer as W
from dp_spark.release.delta_commits import commit_actions
from tests.spark.test_release_writer import _rows
from tests.spark.test_versions_state_cache import jobs  # (fn(), Spark jobs it ran)


def _table(spark, tmp_path):
    path = str(tmp_path / "rel")
    W.ensure_release_table(spark, path)
    return path


def _stored(spark, path, release_id):
    return W.read_release(spark, path, release_id)


def _count(spark, path):
    return spark.read.format("delta").load(path).count()


def _commit(path, version):
    return commit_actions(None, path, version)  # a local table: its commit file


def test_a_proven_sole_write_commits_with_the_release_key(spark, tmp_path):
    path = _table(spark, tmp_path)
    v = W._fast_snapshot(spark, path).version
    asked = []
    mine = _rows("r1", 10.0)
    assert W.write_release(spark, path, mine, sole_writer=lambda: asked.append(1) or True) is True
    assert asked == [1]
    assert W.same_cells(_stored(spark, path, "r1"), mine) and _count(spark, path) == 3
    actions = _commit(path, v + 1)
    assert {"appId": "dp_spark_release:r1", "version": 1} == {
        k: a["txn"][k] for a in actions if "txn" in a for k in ("appId", "version")}
    info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
    assert info["operation"] == "WRITE" and "userMetadata" not in info
    # the DataFrame writer's idempotent append of the same release id is skipped
    assert W.write_release(spark, path, _rows("r1", 99.0)) is None
    assert W.same_cells(_stored(spark, path, "r1"), mine) and _count(spark, path) == 3


def test_an_unproven_write_uses_the_dataframe_writer(spark, tmp_path):
    path = _table(spark, tmp_path)
    W.write_release(spark, path, _rows("r1", 10.0))
    for proof in (lambda: False, lambda: 1 / 0):  # not proven, or the proof failed
        # another draw of r1: the writer looks the key up and skips it
        assert W.write_release(spark, path, _rows("r1", 99.0), sole_writer=proof) is None
    assert W.same_cells(_stored(spark, path, "r1"), _rows("r1", 10.0)) and _count(spark, path) == 3
    assert W.write_release(spark, path, _rows("r2", 5.0), sole_writer=lambda: False) is None  # lands
    assert W.same_cells(_stored(spark, path, "r2"), _rows("r2", 5.0)) and _count(spark, path) == 6


def test_the_proof_is_asked_after_the_snapshot_is_read(spark, tmp_path, monkeypatch):
    path = _table(spark, tmp_path)
    order = []
    real = W._start_transaction
    monkeypatch.setattr(W, "_start_transaction", lambda *a: order.append("snapshot") or real(*a))
    assert W.write_release(spark, path, _rows("r1", 1.0), sole_writer=lambda: order.append("proof") or True)
    assert order == ["snapshot", "proof"]


def _race(spark, path):
    """Our proven write stalls between its files and its commit while another writer (the
    DataFrame writer's idempotent append: a run that took the reservation over) commits
    another draw of the same release id. Returns what our write raised (or returned)."""
    theirs = _rows("r1", 77.0)
    try:
        return W.write_release(spark, path, _rows("r1", 10.0), sole_writer=lambda: True,
                               _before_commit=lambda: W.write_release(spark, path, theirs))
    except W.ConcurrentReleaseWrite as exc:
        return exc


def test_a_write_of_the_same_release_committed_meanwhile_makes_it_fail(spark, tmp_path):
    path = _table(spark, tmp_path)
    assert isinstance(_race(spark, path), W.ConcurrentReleaseWrite)
    assert W.same_cells(_stored(spark, path, "r1"), _rows("r1", 77.0)) and _count(spark, path) == 3


def test_without_the_declared_key_read_both_draws_would_land(spark, tmp_path, monkeypatch):
    """The race test above can fail: with the declaration switched off, Delta lets both commit."""
    path = _table(spark, tmp_path)
    monkeypatch.setattr(W, "_declare_key_read", lambda txn, app_id: True)
    assert _race(spark, path) is True
    assert _count(spark, path) == 6  # two draws of one release: what the declaration prevents


def test_a_write_of_another_release_meanwhile_does_not_stop_it(spark, tmp_path):
    path = _table(spark, tmp_path)
    mine, other = _rows("r1", 10.0), _rows("r2", 5.0)
    assert W.write_release(spark, path, mine, sole_writer=lambda: True,
                           _before_commit=lambda: W.write_release(spark, path, other)) is True
    assert W.same_cells(_stored(spark, path, "r1"), mine) and W.same_cells(_stored(spark, path, "r2"), other)
    assert _count(spark, path) == 6


def test_the_session_user_metadata_is_recorded_as_the_writer_records_it(spark, tmp_path):
    path = _table(spark, tmp_path)
    v = W._fast_snapshot(spark, path).version
    spark.conf.set(W._USER_METADATA_CONF, "nightly refresh")
    try:
        W.write_release(spark, path, _rows("r1", 1.0), sole_writer=lambda: True)
        W.write_release(spark, path, _rows("r2", 1.0))
    finally:
        spark.conf.unset(W._USER_METADATA_CONF)
    for version in (v + 1, v + 2):
        info = next(a["commitInfo"] for a in _commit(path, version) if "commitInfo" in a)
        assert info.get("userMetadata") == "nightly refresh"


def test_a_table_with_its_columns_in_another_order_falls_back_to_the_writer(spark, tmp_path):
    """The transaction path writes only a table whose columns are the release schema's, in
    order; another layout (here: the same columns reversed) goes to the DataFrame writer, which
    matches columns by name."""
    from pyspark.sql import types as T

    path = str(tmp_path / "rel")
    spark.createDataFrame([], T.StructType(list(reversed(W.RELEASE_SCHEMA.fields)))).write.format("delta").save(path)
    mine = _rows("r9", 1.0)
    assert W.write_release(spark, path, mine, sole_writer=lambda: True) is None
    assert W.same_cells(_stored(spark, path, "r9"), mine) and _count(spark, path) == 3


def test_it_runs_fewer_spark_jobs_than_the_key_lookup(spark, tmp_path):
    path = _table(spark, tmp_path)
    W.write_release(spark, path, _rows("r0", 1.0))  # a new snapshot for each write below
    _, looked_up = jobs(spark, lambda: W.write_release(spark, path, _rows("r1", 1.0)))
    _, proven = jobs(spark, lambda: W.write_release(spark, path, _rows("r2", 1.0), sole_writer=lambda: True))
    assert proven < looked_up, (proven, looked_up)


@pytest.mark.parametrize("sole", [True, False])
def test_the_transaction_path_is_refused_on_a_missing_table(spark, tmp_path, sole):
    path = str(tmp_path / "none")
    assert W._append_once(spark, path, spark.range(1).toDF("x"), "a", lambda: sole, None) is False
    assert not (tmp_path / "none").exists()
