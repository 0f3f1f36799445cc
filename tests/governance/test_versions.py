"""Versions and rollback of release families: rows of the SQL ledger, and the derived Delta
``_published`` table refreshed from them."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dp_spark.errors import ConfigError
from dp_spark.governance.versions import (
    PUBLISHED_SCHEMA,
    adopt_published,
    current_release_id,
    history,
    published_path_for,
    published_view,
    record_publication,
    record_publications,
    refresh_published,
    rollback,
)
from dp_spark.ledger import open_ledger

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=timezone.utc)


def clock_from(start=T0):
    t = [start]

    def now():
        t[0] = t[0] + timedelta(minutes=1)
        return t[0]
    return now


def states(ledger, family):
    return [(r["version_no"], r["release_id"], r["state"]) for r in history(ledger, family)]


def release_rows(spark, path, family, release_ids, mode="official"):
    """A tiny release table: two cells per release (only the columns the view needs + value)."""
    from dp_spark.delta.release_table import RELEASE_SCHEMA

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


@pytest.fixture
def ledger(tmp_path, monkeypatch):
    monkeypatch.setenv("DP_SPARK_LEDGER_KEY", "versions test key, not a secret")
    with open_ledger(f"sqlite:{tmp_path / 'ledger.db'}") as led:
        yield led


def test_publish_supersede_and_idempotent(ledger):
    clk = clock_from()
    assert current_release_id(ledger, "dau") is None
    assert record_publication(ledger, "dau", "r1", "publisher_bob", clock=clk) == 1
    assert record_publication(ledger, "dau", "r2", "publisher_bob", clock=clk) == 2
    assert record_publication(ledger, "dau", "r2", "publisher_bob", clock=clk) == 2  # rerun: no-op
    assert record_publication(ledger, "aov", "x1", "publisher_bob", clock=clk) == 1  # other family
    assert states(ledger, "dau") == [(1, "r1", "superseded"), (2, "r2", "current")]
    assert current_release_id(ledger, "dau") == "r2" and current_release_id(ledger, "aov") == "x1"
    h = history(ledger, "dau")
    assert h[0]["principal"] == "publisher_bob" and h[0]["changed_by"] == "publisher_bob"
    assert h[1]["changed_by"] is None and h[1]["at"] > h[0]["at"]


def test_a_batch_is_versioned_in_one_transaction_in_order(ledger):
    clk = clock_from()
    record_publication(ledger, "dau", "d0", "bob", clock=clk)
    c0 = ledger.versions_snapshot()[0]
    got = record_publications(ledger, [("dau", "d1"), ("aov", "a1"), ("dau", "d2"), ("dau", "d0")], "bob", clock=clk)
    assert got == [2, 1, 3, 1] and ledger.versions_snapshot()[0] == c0 + 1  # d0 already had version 1
    assert states(ledger, "dau") == [(1, "d0", "superseded"), (2, "d1", "superseded"), (3, "d2", "current")]
    assert states(ledger, "aov") == [(1, "a1", "current")]
    h = history(ledger, "dau")  # d1 was superseded on arrival, in the same transaction
    assert h[1]["changed_by"] == "bob" and h[1]["changed_at"] == h[1]["at"] and h[2]["changed_by"] is None
    # a rerun of the batch changes nothing
    assert record_publications(ledger, [("dau", "d1"), ("aov", "a1"), ("dau", "d2")], "bob") == [2, 1, 3]
    assert ledger.versions_snapshot()[0] == c0 + 1
    assert record_publications(ledger, [], "bob") == []


def test_rollback_restores_previous_and_keeps_history(ledger):
    clk = clock_from()
    for rid in ("r1", "r2", "r3"):
        record_publication(ledger, "dau", rid, "publisher_bob", clock=clk)
    assert rollback(ledger, "dau", "admin_carol", "bug in day 30", clock=clk) == ("r3", "r2")
    assert states(ledger, "dau") == [(1, "r1", "superseded"), (2, "r2", "current"), (3, "r3", "withdrawn")]
    h = {r["version_no"]: r for r in history(ledger, "dau")}
    assert h[3]["reason"] == "bug in day 30" and h[3]["changed_by"] == "admin_carol"
    assert h[3]["principal"] == "publisher_bob"  # who published it is kept
    # a second rollback skips nothing it should not: r2 withdrawn, r1 restored
    assert rollback(ledger, "dau", "admin_carol", "also wrong", clock=clk) == ("r2", "r1")
    # a rerun of a withdrawn release does not bring it back
    assert record_publication(ledger, "dau", "r3", "publisher_bob", clock=clk) == 3
    assert current_release_id(ledger, "dau") == "r1"
    # a new release becomes version 4 and supersedes r1; withdrawn versions stay withdrawn
    assert record_publication(ledger, "dau", "r4", "publisher_bob", clock=clk) == 4
    assert states(ledger, "dau") == [(1, "r1", "superseded"), (2, "r2", "withdrawn"),
                                     (3, "r3", "withdrawn"), (4, "r4", "current")]
    # rolling back r4 restores r1 (the latest non-withdrawn), not r3
    assert rollback(ledger, "dau", "admin_carol", "r4 too", clock=clk) == ("r4", "r1")


def test_rollback_of_the_only_version_empties_the_view(spark, paths, ledger):
    _, rel = paths
    release_rows(spark, rel, "dau", ["r1"])
    record_publication(ledger, "dau", "r1", "bob")
    assert published_view(spark, rel, ledger, "dau").count() == 2
    assert rollback(ledger, "dau", "carol", "withdrawn entirely") == ("r1", None)
    assert current_release_id(ledger, "dau") is None
    assert published_view(spark, rel, ledger, "dau").count() == 0
    with pytest.raises(ConfigError, match="no current version"):
        rollback(ledger, "dau", "carol", "again")


def _sortable(df):
    """chispa sorts by every column to ignore row order; a map column cannot be sorted."""
    return df.withColumn("keys", F.to_json("keys"))


def test_published_view_serves_only_the_current_release(spark, paths, ledger):
    _, rel = paths
    release_rows(spark, rel, "dau", ["r1", "r2"])
    release_rows(spark, rel, "dau", ["e1"], mode="exploration")
    base = spark.read.format("delta").load(rel)
    assert published_view(spark, rel, ledger, "dau").count() == 0  # nothing published yet
    record_publication(ledger, "dau", "r1", "bob")
    record_publication(ledger, "dau", "r2", "bob")
    assert_df_equality(_sortable(published_view(spark, rel, ledger, "dau")),
                       _sortable(base.where(F.col("release_id") == "r2")), ignore_row_order=True)
    rollback(ledger, "dau", "carol", "bad")
    assert_df_equality(_sortable(published_view(spark, rel, ledger, "dau")),
                       _sortable(base.where(F.col("release_id") == "r1")), ignore_row_order=True)
    # an exploration release id recorded by mistake is still never served
    record_publication(ledger, "dau", "e1", "bob")
    assert published_view(spark, rel, ledger, "dau").count() == 0


def _table(spark, pub):
    return sorted((r["family"], r["version_no"], r["release_id"], r["state"], r["reason"], r["changed_by"])
                  for r in spark.read.format("delta").load(pub).collect())


def _ledger_rows(ledger):
    return sorted((v.family, v.version_no, v.release_id, v.state, v.reason, v.changed_by) for v in ledger.versions())


def test_the_derived_table_follows_the_ledger_and_skips_what_it_has(spark, paths, ledger):
    pub, _ = paths
    assert refresh_published(ledger, spark, pub) is False  # no version yet: no table
    record_publications(ledger, [("dau", "r1"), ("aov", "a1"), ("dau", "r2")], "bob")
    assert refresh_published(ledger, spark, pub) is True
    schema = spark.read.format("delta").load(pub).schema
    assert [(f.name, f.dataType) for f in schema.fields] == [(f.name, f.dataType) for f in PUBLISHED_SCHEMA.fields]
    assert _table(spark, pub) == _ledger_rows(ledger)
    head = spark.sql(f"DESCRIBE HISTORY delta.`{pub}` LIMIT 1").first()["version"]
    assert refresh_published(ledger, spark, pub) is False  # up to date: no commit
    assert spark.sql(f"DESCRIBE HISTORY delta.`{pub}` LIMIT 1").first()["version"] == head
    rollback(ledger, "dau", "carol", "bad")
    assert refresh_published(ledger, spark, pub) is True and _table(spark, pub) == _ledger_rows(ledger)
    h = {r["version_no"]: r for r in spark.read.format("delta").load(pub).where("family = 'dau'").collect()}
    assert h[2]["reason"] == "bad" and h[1]["state"] == "current"


def test_a_refresh_this_process_knows_is_due_reads_no_commit(spark, paths, ledger, monkeypatch):
    """Once this process refreshed the table at count c, a ledger past c means a rewrite is
    due: the table's latest commit is not read (a refresh of every release saves that read).
    At c or below it is read, and a table another process brought further is left alone."""
    from dp_spark.governance import versions as V

    pub, _ = paths
    record_publication(ledger, "dau", "r1", "bob")
    assert refresh_published(ledger, spark, pub) is True
    reads: list[str] = []
    real = V.latest_commit
    monkeypatch.setattr(V, "latest_commit", lambda s, p: reads.append(p) or real(s, p))
    record_publication(ledger, "dau", "r2", "bob")
    assert refresh_published(ledger, spark, pub) is True and reads == []
    assert _table(spark, pub) == _ledger_rows(ledger)
    assert refresh_published(ledger, spark, pub) is False and reads == [pub]  # up to date: read, no commit
    # another process refreshed at a later count than this one's rewrite: that rewrite (due by
    # what this process knew, so nothing read) is skipped by Delta, the other's rows stay
    V._KNOWN_COUNT[pub] = 1
    record_publication(ledger, "aov", "a1", "bob")
    count, records = ledger.versions_snapshot()
    theirs = [tuple(V._row(v)[f.name] for f in PUBLISHED_SCHEMA.fields) for v in records]
    theirs = [r[:4] + ("theirs",) + r[5:] for r in theirs]  # (reason: told apart from ours)
    (spark.createDataFrame(theirs, PUBLISHED_SCHEMA).write.format("delta").mode("overwrite")
     .option("txnAppId", V.TXN_APP_ID).option("txnVersion", count + 1).save(pub))
    assert refresh_published(ledger, spark, pub) is True and reads == [pub]
    assert {r[4] for r in _table(spark, pub)} == {"theirs"}


def test_a_refresh_planned_from_an_older_state_never_lands_after_a_newer_one(spark, paths, ledger):
    """Two refreshes race: the one that read the ledger first commits last. Delta's idempotent
    options (``txnVersion`` = the ledger's change count) skip it, so the table keeps the newer
    state; a plain overwrite would have put the older one back (shown)."""
    pub, _ = paths
    record_publication(ledger, "dau", "r1", "bob")
    old = ledger.versions_snapshot()
    record_publication(ledger, "dau", "r2", "bob")
    assert refresh_published(ledger, spark, pub) is True
    newer = _table(spark, pub)

    class Stale:  # the ledger as the slower refresh read it
        def versions_snapshot(self):
            return old
    # its own check of the table's recorded count already stops it ...
    assert refresh_published(Stale(), spark, pub) is False and _table(spark, pub) == newer
    # ... and when it wrote anyway (it read the table before the newer refresh committed),
    # Delta skips the write: nothing changes
    from dp_spark.governance import versions as V

    rows = [tuple(V._row(v)[f.name] for f in PUBLISHED_SCHEMA.fields) for v in old[1]]
    (spark.createDataFrame(rows, PUBLISHED_SCHEMA).write.format("delta").mode("overwrite")
     .option("txnAppId", V.TXN_APP_ID).option("txnVersion", old[0]).save(pub))
    assert _table(spark, pub) == newer
    spark.createDataFrame(rows, PUBLISHED_SCHEMA).write.format("delta").mode("overwrite").save(pub)
    assert _table(spark, pub) != newer  # without the options the older state would be back


def test_an_older_deployments_published_table_is_adopted_once(spark, paths, ledger):
    pub, _ = paths
    at = datetime(2026, 11, 30, 9, 0)
    old = [("dau", 1, "r1", "withdrawn", "bad", "bob", at, "carol", at + timedelta(hours=1)),
           ("dau", 2, "r2", "current", None, "bob", at + timedelta(minutes=5), None, None)]
    keyless = T.StructType([f for f in PUBLISHED_SCHEMA.fields if f.name != "series_key"])  # before series keys
    spark.createDataFrame(old, keyless).write.format("delta").save(pub)  # the record before the ledger
    assert adopt_published(ledger, spark, pub) is True
    assert states(ledger, "dau") == [(1, "r1", "withdrawn"), (2, "r2", "current")]
    w = history(ledger, "dau")[0]
    assert (w["reason"], w["changed_by"], w["at"]) == ("bad", "carol", at.replace(tzinfo=timezone.utc))
    assert adopt_published(ledger, spark, pub) is False  # once
    assert record_publication(ledger, "dau", "r3", "bob") == 3
    assert refresh_published(ledger, spark, pub) is True and _table(spark, pub) == _ledger_rows(ledger)
    assert adopt_published(ledger, spark, pub) is False


def test_a_derived_table_is_never_adopted(spark, tmp_path, paths, monkeypatch):
    pub, _ = paths
    monkeypatch.setenv("DP_SPARK_LEDGER_KEY", "versions test key, not a secret")
    with open_ledger(f"sqlite:{tmp_path / 'a.db'}") as a, open_ledger(f"sqlite:{tmp_path / 'b.db'}") as b:
        record_publication(a, "dau", "r1", "bob")
        refresh_published(a, spark, pub)
        assert adopt_published(b, spark, pub) is False and b.versions() == []


def test_refusals(ledger):
    with pytest.raises(ConfigError, match="no current version"):
        rollback(ledger, "dau", "carol", "x")
    with pytest.raises(ConfigError, match="reason"):
        rollback(ledger, "dau", "carol", "  ")
    with pytest.raises(ConfigError, match="principal"):
        record_publication(ledger, "dau", "r1", "")
