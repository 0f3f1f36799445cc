"""The release write is at most once per release id, through Delta's public API only.

``write_release`` is the DataFrame writer's idempotent append keyed by the release id
(``txnAppId`` = ``dp_spark_release:<id>``, ``txnVersion`` = 1). Delta looks the key up in the
snapshot its commit is made on (an earlier write of the id: ours is skipped) and records the
key as read, so a write of the same id that commits while ours is in the middle of its commit
makes ours fail (``ConcurrentReleaseWrite``: nothing of ours lands). Tested here with the write
held inside its Spark job (after Delta's lookup, while it writes its files): the concurrent
write of the same id wins and ours fails; without the key both draws would land (shown, so the
race test can fail); a write of another release id meanwhile does not stop ours; the session's
``userMetadata`` is recorded.
"""

from __future__ import annotations

import threading

import pytest

from dp_spark.delta import release_table as W
from tests.spark.stall import release, stalled, wait_started
from tests.spark.test_release_writer import _rows


def _table(spark, tmp_path):
    path = str(tmp_path / "rel")
    W.ensure_release_table(spark, path)
    return path


def _count(spark, path):
    return spark.read.format("delta").load(path).count()


def _held_write(spark, path, rows, sync, monkeypatch, write=W.write_release):
    """Start ``write(spark, path, rows)`` in a thread with its Spark job held (see
    tests/spark/stall.py); returns (thread, outcome: {"result": ...} or {"error": exc})."""
    real = W._cells_frame
    monkeypatch.setattr(W, "_cells_frame", lambda s, r: stalled(real(s, r), sync))
    outcome: dict = {}

    def run():
        try:
            outcome["result"] = write(spark, path, rows)
        except Exception as exc:  # noqa: BLE001 - reported to the test
            outcome["error"] = exc

    t = threading.Thread(target=run, name="held-write")
    t.start()
    wait_started(sync)
    monkeypatch.setattr(W, "_cells_frame", real)  # the other writes are not held
    return t, outcome


def test_a_write_of_the_same_release_committed_meanwhile_makes_it_fail(spark, tmp_path, monkeypatch):
    path = _table(spark, tmp_path)
    t, outcome = _held_write(spark, path, _rows("r1", 10.0), tmp_path, monkeypatch)
    try:
        W.write_release(spark, path, _rows("r1", 77.0))  # a run that took the reservation over
    finally:
        release(tmp_path)
        t.join(300)
    assert isinstance(outcome.get("error"), W.ConcurrentReleaseWrite), outcome
    assert W.same_cells(W.read_release(spark, path, "r1"), _rows("r1", 77.0)) and _count(spark, path) == 3


def test_without_the_release_key_both_draws_would_land(spark, tmp_path, monkeypatch):
    """The race test above can fail: the same held write without Delta's idempotency options
    (a plain append) lets both draws commit."""
    path = _table(spark, tmp_path)

    def plain_append(s, p, rows):
        W._cells_frame(s, rows).write.format("delta").mode("append").save(p)

    t, outcome = _held_write(spark, path, _rows("r1", 10.0), tmp_path, monkeypatch, write=plain_append)
    try:
        W.write_release(spark, path, _rows("r1", 77.0))
    finally:
        release(tmp_path)
        t.join(300)
    assert "error" not in outcome
    assert _count(spark, path) == 6  # two draws of one release: what the key prevents


def test_a_write_of_another_release_meanwhile_does_not_stop_it(spark, tmp_path, monkeypatch):
    path = _table(spark, tmp_path)
    mine, other = _rows("r1", 10.0), _rows("r2", 5.0)
    t, outcome = _held_write(spark, path, mine, tmp_path, monkeypatch)
    try:
        W.write_release(spark, path, other)
    finally:
        release(tmp_path)
        t.join(300)
    assert "error" not in outcome, outcome
    assert W.same_cells(W.read_release(spark, path, "r1"), mine) and W.same_cells(W.read_release(spark, path, "r2"), other)
    assert _count(spark, path) == 6


def test_a_later_write_of_the_same_release_is_skipped_whichever_the_draw(spark, tmp_path):
    path = _table(spark, tmp_path)
    W.write_release(spark, path, _rows("r1", 10.0))
    head = W.latest_commit(spark, path)["version"]
    assert W.write_release(spark, path, _rows("r1", 99.0)) is None  # skipped silently: no commit
    assert W.latest_commit(spark, path)["version"] == head
    assert W.same_cells(W.read_release(spark, path, "r1"), _rows("r1", 10.0)) and _count(spark, path) == 3


def test_the_session_user_metadata_is_recorded(spark, tmp_path):
    path = _table(spark, tmp_path)
    conf = "spark.databricks.delta.commitInfo.userMetadata"
    spark.conf.set(conf, "nightly refresh")
    try:
        W.write_release(spark, path, _rows("r1", 1.0))
    finally:
        spark.conf.unset(conf)
    assert W.latest_commit(spark, path)["userMetadata"] == "nightly refresh"


@pytest.mark.parametrize("rows, error", [([], ValueError), (None, ValueError)])
def test_a_write_holds_the_cells_of_one_release(spark, tmp_path, rows, error):
    rows = _rows("a", 1.0) + _rows("b", 1.0) if rows is None else rows
    with pytest.raises(error):
        W.write_release(spark, str(tmp_path / "x"), rows)
    assert not (tmp_path / "x").exists()
