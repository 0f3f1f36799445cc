"""The version record of one family through Delta's transaction (``versions._rewrite_family``,
``writer.replace_rows_if_unchanged``) instead of a MERGE.

The contract: the family's rows are replaced by exactly the state the MERGE would leave (the
same rows, field by field, as a read returns them, and cached as such); each family's rows stay
in files that hold only that family, and no other family's file is touched; a table whose
files mix families (an old table, a batch's MERGE, an edit outside dp_spark), a family name
whose statistics Delta truncates, another table identity or a concurrent commit never give a
wrong state (the MERGE takes over, or the commit conflicts and is retried); and it runs fewer
Spark jobs than the MERGE.
"""

from __future__ import annotations

import json

import pytest

from dp_spark.governance import versions
from dp_spark.governance.versions import PUBLISHED_SCHEMA, history, record_publication, record_publications, rollback
from dp_spark.release import writer as W
from tests.spark.test_versions_state_cache import (
    append_outside,
    clock_from,
    fresh,
    jobs,
    outside_row,
    pub,  # noqa: F401  (fixture)
    table_rows,
)


def _files(spark, pub):
    """[(family min, family max)] of the table's data files, from their Delta statistics."""
    snap = W._jvm_snapshot(spark, pub)
    out = []
    for f in snap.allFiles().collectAsList():
        stats = json.loads(f.stats())
        out.append((stats["minValues"]["family"], stats["maxValues"]["family"]))
    return sorted(out)


def _spy(monkeypatch):
    """Count the publications that went through the transaction (True) or not (False)."""
    seen = []
    real = versions._rewrite_family

    def spy(*args):
        seen.append(real(*args))
        return seen[-1]

    monkeypatch.setattr(versions, "_rewrite_family", spy)
    return seen


def _same_as_read(spark, pub, family):
    cached = versions._cached_rows(pub, versions._identity(spark, pub), [family])
    assert cached is not None, "the new state is cached"
    read = fresh(spark, pub, family)
    assert read == table_rows(spark, pub, family)
    assert len(cached) == len(read)
    for c, r in zip(sorted(cached, key=lambda r: r["version_no"]), read):
        for field in PUBLISHED_SCHEMA.fieldNames():
            assert c[field] == r[field] and type(c[field]) is type(r[field]), (field, c[field], r[field])
    return read


def test_one_familys_publications_replace_its_rows_in_one_file(spark, pub, monkeypatch):
    seen = _spy(monkeypatch)
    clk = clock_from()
    for i in range(3):
        assert record_publication(spark, pub, "dau", f"r{i}", "bob", clock=clk) == i + 1
    assert record_publication(spark, pub, "aov", "a0", "bob", clock=clk) == 1
    assert record_publication(spark, pub, "dau", "r1", "bob", clock=clk) == 2  # known: no commit
    assert seen == [True, True, True, True]
    read = _same_as_read(spark, pub, "dau")
    assert [(r["version_no"], r["state"]) for r in read] == [(1, "superseded"), (2, "superseded"), (3, "current")]
    assert read[0]["changed_by"] == "bob" and read[2]["changed_by"] is None and read[2]["changed_at"] is None
    assert [(r["release_id"], r["state"]) for r in history(spark, pub, "aov")] == [("a0", "current")]
    assert _files(spark, pub) == [("aov", "aov"), ("dau", "dau")]  # one file per family, nothing else
    # rows of one family written outside in two files: both are replaced
    append_outside(spark, pub, [outside_row("dau", 7, "rY", "withdrawn"), outside_row("dau", 8, "rZ", "withdrawn")])
    assert _files(spark, pub).count(("dau", "dau")) == 3
    assert record_publication(spark, pub, "dau", "r9", "bob", clock=clk) == 9
    assert seen[-1] is True and _files(spark, pub) == [("aov", "aov"), ("dau", "dau")]
    assert [(r["version_no"], r["state"]) for r in _same_as_read(spark, pub, "dau")] == [
        (1, "superseded"), (2, "superseded"), (3, "superseded"), (7, "withdrawn"), (8, "withdrawn"), (9, "current")]
    info = spark.sql(f"DESCRIBE HISTORY delta.`{pub}` LIMIT 1").first()
    assert info["operation"] == "WRITE" and info["operationParameters"]["mode"] == "Overwrite"


def test_after_a_rollback_and_a_batch_the_state_is_the_merges(spark, pub, monkeypatch):
    """A rollback and a batch MERGE (which may mix families in a file) between transaction
    publications: every step leaves the rows the MERGE-only sequence leaves."""
    clk = clock_from()
    record_publication(spark, pub, "dau", "r1", "bob", clock=clk)
    record_publication(spark, pub, "dau", "r2", "bob", clock=clk)
    rollback(spark, pub, "dau", "carol", "wrong input", clock=clk)  # r2 withdrawn, r1 current
    record_publications(spark, pub, [("dau", "r3"), ("aov", "a1")], "dave", clock=clk)
    seen = _spy(monkeypatch)
    record_publication(spark, pub, "dau", "r4", "erin", clock=clk)
    record_publication(spark, pub, "aov", "a2", "erin", clock=clk)
    read = fresh(spark, pub, "dau")
    assert [(r["release_id"], r["state"]) for r in read] == [
        ("r1", "superseded"), ("r2", "withdrawn"), ("r3", "superseded"), ("r4", "current")]
    assert read[1]["reason"] == "wrong input" and read[2]["changed_by"] == "erin"
    assert [(r["release_id"], r["state"]) for r in fresh(spark, pub, "aov")] == [("a1", "superseded"), ("a2", "current")]
    assert len(seen) == 2  # whichever path each took, the state is the MERGE's


def test_a_file_holding_several_families_goes_to_the_merge(spark, pub, monkeypatch):
    record_publication(spark, pub, "dau", "r1", "bob")
    # an edit outside dp_spark: one file with a row of two families
    (spark.createDataFrame([outside_row("aov", 1, "a1", "current"), outside_row("dau", 9, "rX", "withdrawn")],
                           PUBLISHED_SCHEMA).coalesce(1).write.format("delta").mode("append").save(pub))
    assert ("aov", "dau") in _files(spark, pub)
    seen = _spy(monkeypatch)
    assert record_publication(spark, pub, "dau", "r2", "bob") == 10
    assert record_publication(spark, pub, "aov", "a2", "bob") == 2
    assert seen == [False, False]  # both families have a row in the mixed file: the MERGE
    assert [(r["release_id"], r["state"]) for r in fresh(spark, pub, "dau")] == [
        ("r1", "superseded"), ("rX", "withdrawn"), ("r2", "current")]
    assert [(r["release_id"], r["state"]) for r in fresh(spark, pub, "aov")] == [("a1", "superseded"), ("a2", "current")]


def test_a_family_name_longer_than_delta_keeps_in_its_statistics(spark, pub, monkeypatch):
    """Delta truncates a long string's bounds (32 characters): they are no longer equal, so
    the transaction path cannot prove a file holds only this family, and the MERGE does it."""
    seen = _spy(monkeypatch)
    family = "a_family_name_well_beyond_thirty_two_characters"
    for i in range(2):
        record_publication(spark, pub, family, f"r{i}", "bob")
    assert seen[1] is False
    assert [(r["release_id"], r["state"]) for r in fresh(spark, pub, family)] == [("r0", "superseded"), ("r1", "current")]


def test_a_family_name_beyond_printable_ascii_goes_to_the_merge(spark, pub, monkeypatch):
    """Outside printable ASCII the transaction path compares no bounds: the MERGE versions such
    a family and, while a file of it is in the table, every other family (slower, never wrong)."""
    seen = _spy(monkeypatch)
    record_publication(spark, pub, "dau_été", "r0", "bob")
    record_publication(spark, pub, "dau_été", "r1", "bob")
    record_publication(spark, pub, "aov", "a0", "bob")
    assert seen == [False, False, False]
    assert [(r["release_id"], r["state"]) for r in fresh(spark, pub, "dau_été")] == [
        ("r0", "superseded"), ("r1", "current")]
    assert [(r["release_id"], r["state"]) for r in fresh(spark, pub, "aov")] == [("a0", "current")]


def test_a_commit_landing_during_the_rewrite_makes_it_retry(spark, pub, monkeypatch):
    """Another writer commits between the transaction's snapshot and its commit: the commit
    conflicts (it declared the whole table read) and the publication is retried on the new
    state, which it keeps."""
    record_publication(spark, pub, "dau", "r1", "bob")
    real = W.replace_rows_if_unchanged
    calls = []

    def with_a_writer_in_between(*args, **kw):
        calls.append(1)
        if len(calls) == 1:
            kw["_before_commit"] = lambda: append_outside(spark, pub, [outside_row("aov", 1, "a1", "current")])
        return real(*args, **kw)

    monkeypatch.setattr(W, "replace_rows_if_unchanged", with_a_writer_in_between)
    assert record_publication(spark, pub, "dau", "r2", "bob") == 2
    assert len(calls) == 2  # the first commit conflicted; the retry committed
    assert [(r["release_id"], r["state"]) for r in fresh(spark, pub, "dau")] == [("r1", "superseded"), ("r2", "current")]
    assert [(r["release_id"], r["state"]) for r in fresh(spark, pub, "aov")] == [("a1", "current")]


def test_another_identity_or_column_writes_nothing(spark, pub):
    record_publication(spark, pub, "dau", "r1", "bob")
    table_id, version = versions._identity(spark, pub)
    df = spark.createDataFrame([outside_row("dau", 1, "r1", "current")], PUBLISHED_SCHEMA)
    for identity in ((table_id, version - 1), ("another-table", version)):
        assert W.replace_rows_if_unchanged(spark, pub, df, identity=identity, column="family", value="dau") is None
    assert W.replace_rows_if_unchanged(spark, pub, df.drop("reason"), identity=(table_id, version),
                                       column="family", value="dau") is None
    assert versions._identity(spark, pub) == (table_id, version)


def test_it_runs_fewer_spark_jobs_than_the_merge(spark, pub, monkeypatch):
    record_publication(spark, pub, "dau", "r0", "bob")
    record_publication(spark, pub, "aov", "a0", "bob")
    W.warm_tables(spark, [pub])
    _, rewrite = jobs(spark, lambda: record_publication(spark, pub, "dau", "r1", "bob"))
    monkeypatch.setattr(versions, "_rewrite_family", lambda *a: False)
    W.warm_tables(spark, [pub])
    _, merge = jobs(spark, lambda: record_publication(spark, pub, "aov", "a1", "bob"))
    assert rewrite < merge, (rewrite, merge)


def test_the_transaction_path_keeps_the_invariant_checks(spark, pub):
    """A second current row added outside: the publication refuses before any commit."""
    from dp_spark.governance.versions import VersionInvariantError

    record_publication(spark, pub, "dau", "r1", "bob")
    append_outside(spark, pub, [outside_row("dau", 2, "rX", "current")])
    version = versions._identity(spark, pub)[1]
    with pytest.raises(VersionInvariantError):
        record_publication(spark, pub, "dau", "r3", "bob")
    assert versions._identity(spark, pub)[1] == version
