"""The process-wide cache of the ``_published`` rows (``versions._rows``): served only at the
table identity (table id, Delta version) the rows are known to be of, so a read never returns
rows of an older state -- whoever changed the table (this process, another writer, a table
recreated at the same path) -- and a publication's own post-state is served without a job."""

from __future__ import annotations

import shutil
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from dp_spark.governance import versions
from dp_spark.governance.versions import (
    PUBLISHED_SCHEMA,
    current_release_id,
    history,
    record_publication,
    record_publications,
    rollback,
)

# microseconds and a date near a daylight-saving change: the cached timestamps must be the
# ones a Spark read returns, not the clock's values
T0 = datetime(2026, 3, 29, 0, 58, 59, 123457, tzinfo=timezone.utc)


def clock_from(start=T0):
    t = [start]

    def now():
        t[0] = t[0] + timedelta(minutes=1, microseconds=7)
        return t[0]
    return now


@pytest.fixture
def pub(tmp_path):
    versions.clear_cache()
    yield str(tmp_path / "_published")
    versions.clear_cache()


def jobs(spark, fn):
    """(fn(), number of Spark jobs it ran): a structural check, not a timing."""
    sc = spark.sparkContext
    group = f"versions-cache-{uuid.uuid4().hex}"
    sc.setJobGroup(group, "versions cache test")
    try:
        result = fn()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    return result, len(sc.statusTracker().getJobIdsForGroup(group))


def table_rows(spark, pub, family):
    """The family's rows read straight from the table (no dp_spark code), oldest first."""
    rows = spark.read.format("delta").load(pub).where(f"family = '{family}'").collect()
    return sorted((r.asDict() for r in rows), key=lambda r: r["version_no"])


def fresh(spark, pub, family):
    """history() with the cache cleared: a read of the table."""
    versions.clear_cache()
    return history(spark, pub, family)


def outside_row(family, no, rid, state, who="mallory"):
    at = datetime(2026, 12, 2, 9, 30, 0, 250000)
    return (family, no, rid, state, None if state != "withdrawn" else "edited outside", who, at,
            None if state == "current" else who, None if state == "current" else at)


def append_outside(spark, pub, rows, mode="append"):
    spark.createDataFrame(rows, PUBLISHED_SCHEMA).write.format("delta").mode(mode).save(pub)


def test_a_publications_cached_post_state_is_what_a_read_returns(spark, pub):
    clk = clock_from()
    record_publication(spark, pub, "dau", "r1", "bob", clock=clk)
    record_publication(spark, pub, "dau", "r2", "bob", clock=clk)
    rollback(spark, pub, "dau", "carol", "wrong input", clock=clk)  # r2 withdrawn (reason kept), r1 current
    # one MERGE: r1 superseded, r3 superseded on arrival, r4 current, a1 a new family's first version
    assert record_publications(spark, pub, [("dau", "r3"), ("aov", "a1"), ("dau", "r4")], "dave",
                               clock=clk) == [3, 1, 4]
    identity = versions._identity(spark, pub)
    cached = versions._cached_rows(pub, identity, ["aov", "dau"])
    assert cached is not None, "the publication's post-state is cached (nothing read the table since)"
    cached = {f: sorted((r for r in cached if r["family"] == f), key=lambda r: r["version_no"])
              for f in ("aov", "dau")}
    for family in ("aov", "dau"):
        read = fresh(spark, pub, family)
        assert read == table_rows(spark, pub, family)
        assert len(cached[family]) == len(read)
        for c, r in zip(cached[family], read):
            for field in PUBLISHED_SCHEMA.fieldNames():  # field by field, timestamps included
                assert c[field] == r[field], (family, r["version_no"], field, c[field], r[field])
                assert type(c[field]) is type(r[field]), (family, field)
    dau = {r["version_no"]: r for r in cached["dau"]}
    assert [dau[n]["state"] for n in (1, 2, 3, 4)] == ["superseded", "withdrawn", "superseded", "current"]
    assert dau[1]["changed_by"] == "dave" and dau[2]["reason"] == "wrong input" and dau[4]["changed_at"] is None


def test_history_after_a_publication_runs_no_job_and_never_serves_an_older_state(spark, pub):
    clk = clock_from()
    record_publication(spark, pub, "dau", "r1", "bob", clock=clk)
    record_publication(spark, pub, "dau", "r2", "bob", clock=clk)
    first, _ = jobs(spark, lambda: history(spark, pub, "dau"))
    second, n = jobs(spark, lambda: history(spark, pub, "dau"))
    assert n == 0 and second == first == table_rows(spark, pub, "dau")
    _, n = jobs(spark, lambda: fresh(spark, pub, "dau"))
    assert n >= 1  # the counter sees a read's job

    # another writer updates the table behind dp_spark's back (warm cache first)
    assert jobs(spark, lambda: history(spark, pub, "dau"))[1] == 0
    spark.sql(f"UPDATE delta.`{pub}` SET state = 'withdrawn', reason = 'outside' WHERE release_id = 'r2'")
    assert [r["state"] for r in history(spark, pub, "dau")] == ["superseded", "withdrawn"]
    assert history(spark, pub, "dau") == table_rows(spark, pub, "dau")

    # a plain Delta append, then OPTIMIZE (same rows, new version): read again, never stale
    assert jobs(spark, lambda: history(spark, pub, "dau"))[1] == 0
    append_outside(spark, pub, [outside_row("dau", 3, "rX", "current")])
    assert [r["release_id"] for r in history(spark, pub, "dau")] == ["r1", "r2", "rX"]
    before = versions._identity(spark, pub)
    spark.sql(f"OPTIMIZE delta.`{pub}`")
    after = versions._identity(spark, pub)
    assert after[0] == before[0] and after[1] > before[1]
    rows, n = jobs(spark, lambda: history(spark, pub, "dau"))
    assert n >= 1 and rows == table_rows(spark, pub, "dau")

    # a rollback by this process: its result is read, not the pre-rollback rows
    assert jobs(spark, lambda: history(spark, pub, "dau"))[1] == 0
    assert rollback(spark, pub, "dau", "carol", "bad", clock=clk) == ("rX", "r1")
    assert [r["state"] for r in history(spark, pub, "dau")] == ["current", "withdrawn", "withdrawn"]
    assert history(spark, pub, "dau") == table_rows(spark, pub, "dau")


@pytest.mark.parametrize("how", ["merge", "transaction"])
def test_a_commit_between_the_merge_and_its_check_leaves_the_post_state_uncached(spark, pub, monkeypatch, how):
    """Another writer commits right after the publication's commit: its post-state is never
    served at the table's new version (the MERGE path: not cached; the transaction path, which
    knows its own commit's version: cached at that version only)."""
    record_publication(spark, pub, "dau", "r1", "bob")
    if how == "merge":
        real = versions._merge
        monkeypatch.setattr(versions, "_rewrite_family", lambda *a: False)

        def merge_then_another_writer(spark_, path, changes):
            out = real(spark_, path, changes)
            append_outside(spark, pub, [outside_row("dau", 3, "rX", "withdrawn")])
            return out

        monkeypatch.setattr(versions, "_merge", merge_then_another_writer)
    else:
        real = versions._rewrite_family

        def rewrite_then_another_writer(*args):
            assert real(*args) is True  # the transaction path committed
            append_outside(spark, pub, [outside_row("dau", 3, "rX", "withdrawn")])
            return True

        monkeypatch.setattr(versions, "_rewrite_family", rewrite_then_another_writer)
    record_publication(spark, pub, "dau", "r2", "bob")
    monkeypatch.undo()
    assert versions._cached_rows(pub, versions._identity(spark, pub), ["dau"]) is None
    rows, n = jobs(spark, lambda: history(spark, pub, "dau"))
    assert n >= 1 and [(r["release_id"], r["state"]) for r in rows] == [
        ("r1", "superseded"), ("r2", "current"), ("rX", "withdrawn")]
    assert rows == table_rows(spark, pub, "dau")


def test_a_table_recreated_at_the_same_path_is_read(spark, pub):
    record_publication(spark, pub, "dau", "r1", "bob")
    record_publication(spark, pub, "dau", "r2", "bob")
    old = versions._identity(spark, pub)
    assert jobs(spark, lambda: history(spark, pub, "dau"))[1] == 0  # cached at the old identity
    shutil.rmtree(pub)
    # recreated by plain Delta writes up to the SAME Delta version: only the table id differs
    append_outside(spark, pub, [outside_row("dau", 1, "n1", "superseded")], mode="overwrite")
    for v in range(1, old[1] + 1):
        append_outside(spark, pub, [outside_row("dau", v + 1, f"n{v + 1}",
                                                "current" if v == old[1] else "superseded")])
    new = versions._identity(spark, pub)
    assert new[1] == old[1] and new[0] != old[0]
    rows, n = jobs(spark, lambda: history(spark, pub, "dau"))
    assert n >= 1 and [r["release_id"] for r in rows] == [f"n{i}" for i in range(1, old[1] + 2)]
    assert current_release_id(spark, pub, "dau") == f"n{old[1] + 1}"


def test_without_the_delta_log_fast_path_nothing_is_cached(spark, pub, monkeypatch):
    import dp_spark.release.writer as writer

    monkeypatch.setattr(writer, "_fast_snapshot", lambda spark, path: None)  # as on Spark Connect
    clk = clock_from()
    record_publication(spark, pub, "dau", "r1", "bob", clock=clk)
    record_publication(spark, pub, "dau", "r2", "bob", clock=clk)
    assert pub not in versions._cache
    for _ in range(2):
        rows, n = jobs(spark, lambda: history(spark, pub, "dau"))
        assert n >= 1 and rows == table_rows(spark, pub, "dau")
    assert [r["state"] for r in rows] == ["superseded", "current"]
    spark.sql(f"UPDATE delta.`{pub}` SET state = 'withdrawn' WHERE release_id = 'r2'")
    assert [r["state"] for r in history(spark, pub, "dau")] == ["superseded", "withdrawn"]
    assert pub not in versions._cache


def test_one_entry_per_path_and_a_bounded_number_of_paths(monkeypatch):
    versions.clear_cache()
    monkeypatch.setattr(versions, "CACHED_PATHS", 2)
    row = dict(zip(PUBLISHED_SCHEMA.fieldNames(), outside_row("dau", 1, "r1", "current")))
    versions._remember("p1", ("id", 1), ["dau"], [row])
    versions._remember("p1", ("id", 2), ["aov"], [])  # a new identity replaces the path's entry
    assert versions._cached_rows("p1", ("id", 1), ["dau"]) is None
    assert versions._cached_rows("p1", ("id", 2), ["dau"]) is None  # dau not read at version 2
    assert versions._cached_rows("p1", ("id", 2), ["aov"]) == []
    versions._remember("p1", ("id", 2), ["dau"], [row])  # same identity: families accumulate
    assert versions._cached_rows("p1", ("id", 2), ["aov", "dau"]) == [row]
    versions._remember("p2", ("id", 1), ["dau"], [row])
    versions._remember("p3", ("id", 1), ["dau"], [row])
    assert list(versions._cache) == ["p2", "p3"]
    got = versions._cached_rows("p3", ("id", 1), ["dau"])
    got[0]["state"] = "withdrawn"  # callers get copies
    assert versions._cached_rows("p3", ("id", 1), ["dau"]) == [row]
    versions.clear_cache()


def test_the_statement_after_a_publication_reads_no_rows_and_sees_a_later_change(spark, pub, tmp_path, monkeypatch):
    from dp_spark.governance import statement as st

    monkeypatch.setattr(st, "specs_for_family", lambda releases_dir, family: [])
    monkeypatch.setattr(st, "privacy_statement",
                        lambda family, specs, ledger, summaries, rows, **kw: {"v": [(r["release_id"], r["state"])
                                                                                   for r in rows]})
    monkeypatch.setattr(st, "write_statement", lambda out_dir, d, force=False: (tmp_path / "s.json", tmp_path / "s.md"))

    def build():
        return st.build_and_write_statement(
            spark, family="dau", ledger=None, releases_dir=tmp_path, releases_path=str(tmp_path / "rel"),
            published_path=pub, out_dir=tmp_path, summaries=[])[0]["v"]

    record_publications(spark, pub, [("dau", "r1"), ("aov", "a1"), ("dau", "r2")], "bob")
    d, n = jobs(spark, build)
    assert n == 0 and d == [("r1", "superseded"), ("r2", "current")]
    spark.sql(f"UPDATE delta.`{pub}` SET state = 'withdrawn' WHERE release_id = 'r2'")  # another writer
    d, n = jobs(spark, build)
    assert n >= 1 and d == [("r1", "superseded"), ("r2", "withdrawn")]


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


def test_a_table_that_appears_during_the_read_is_read_again(spark, pub):
    record_publication(spark, pub, "dau", "r1", "bob")
    versions.clear_cache()
    flaky = _TableAppearsDuringTheRead(spark)
    rows, _ = versions._rows_at(flaky, pub, ["dau"])
    assert flaky.failed == 1 and [r["release_id"] for r in rows] == ["r1"]
