"""The process-wide cache of a statement's release summaries (``statement.load_release_summaries``):
served only at the release table identity (table id, Delta version) the summaries are known to
be of, extended with the engine's own release write (``note_release_written``) when that write
is the only commit since the identity taken before it, so a warm process's statement reads no
rows; whoever else changes the table (an append, UPDATE, OPTIMIZE, a recreated table), the
summaries are read again and never stale."""

from __future__ import annotations

import copy
import shutil
from datetime import datetime, timedelta, timezone

import pytest

from dp_spark.governance import statement as st
from dp_spark.governance import versions
from dp_spark.release import writer as W
from tests.spark.test_versions_state_cache import jobs  # (fn(), Spark jobs it ran)

# microseconds and a date near a daylight-saving change: the cached timestamps must be the
# ones a Spark read returns (naive, local time), not the engine's aware UTC values
T0 = datetime(2026, 3, 29, 0, 58, 59, 123457, tzinfo=timezone.utc)


@pytest.fixture
def rel(tmp_path):
    st.clear_cache()
    yield str(tmp_path / "dau")
    st.clear_cache()


def release_rows(rid, *, family="dau", mode="official", keys=3, created=T0, suppressed=(),
                 statistics=("count",), epsilon=0.5):
    """The cells of one release, as the engine builds them (one row per statistic and key)."""
    base = {f.name: None for f in W.RELEASE_SCHEMA.fields}
    base.update(release_id=rid, release_family=family, release_name=family, spec_version="v3", mode=mode,
                key_column="region", confidence=0.95, expected_abs_error=1.5, noise_scale=2.0,
                noise_stddev=2.5, grid=1.0, charge_json=f'{{"epsilon": "{epsilon}"}}', charge_epsilon=epsilon,
                charge_rho=None, charge_delta=None, statement_epsilon=epsilon * 1.5, statement_delta=1e-6,
                budget_id="b", bounds_json='{"max_rows_per_unit": 3}', privacy_unit="user",
                unit_column="user_id", neighbouring="add_remove_unit", parallel_composition=True,
                input_table_id="input-1", input_version=7, code_version="test")
    out = []
    for s, stat in enumerate(statistics):
        for i in range(keys):
            key = f"k{i}"
            hidden = key in suppressed
            value = float("nan") if hidden else 10.0 * i + s
            out.append(dict(base, statistic=stat, key=key, keys={"region": key},
                            mechanism="discrete_laplace" if stat == "sum" else "discrete_gaussian",
                            value=value, ci_low=value - 2, ci_high=value + 2, suppressed=hidden,
                            # the release's created_at is its earliest cell's
                            created_at=created + timedelta(microseconds=7 * (len(statistics) * keys - i - s))))
    return out


def append_outside(spark, path, rows, mode="append"):
    """A plain Delta write by someone else (no dp_spark code, no idempotency key)."""
    (spark.createDataFrame([tuple(r[f.name] for f in W.RELEASE_SCHEMA.fields) for r in rows], W.RELEASE_SCHEMA)
     .write.format("delta").mode(mode).save(path))


def write_noted(spark, path, rows):
    """The engine's release write: identity before, the write, the note."""
    before = versions._identity(spark, path)
    W.write_release(spark, path, rows)
    st.note_release_written(spark, path, before, rows)


def load(spark, path, family="dau"):
    return st.load_release_summaries(spark, family=family, releases_path=path)


def fresh(spark, path, family="dau"):
    """The summaries read from the table, the cache cleared first."""
    st.clear_cache()
    return load(spark, path, family)


def cached(spark, path, family="dau"):
    return st._cached_summaries(path, versions._identity(spark, path), family)


def assert_same(got, read):
    assert [s["release_id"] for s in got] == [s["release_id"] for s in read]
    for g, r in zip(got, read):
        assert set(g) == set(r), r["release_id"]
        for field in r:  # field by field, types too: created_at, charges, cells, lists ...
            assert g[field] == r[field], (r["release_id"], field, g[field], r[field])
            assert type(g[field]) is type(r[field]), (r["release_id"], field)


def test_a_noted_write_extends_the_cached_summaries_exactly_as_a_read(spark, rel):
    W.write_release(spark, rel, release_rows("r1", created=T0 + timedelta(hours=2), statistics=("count", "sum")))
    W.write_release(spark, rel, release_rows("x1", mode="exploration", created=T0 - timedelta(days=1)))
    append_outside(spark, rel, release_rows("a1", family="aov", keys=2))  # another family, same table
    assert [s["release_id"] for s in load(spark, rel)] == ["r1"]
    assert [s["release_id"] for s in load(spark, rel, "aov")] == ["a1"]

    # r2: created BEFORE r1 (ordering by created_at, not by write), one key suppressed, two
    # statistics and mechanisms; then an exploration release that must not count
    write_noted(spark, rel, release_rows("r2", keys=4, suppressed=("k2",), statistics=("sum", "count"),
                                         epsilon=0.25))
    write_noted(spark, rel, release_rows("x2", mode="exploration", created=T0 - timedelta(hours=1)))
    got = {f: cached(spark, rel, f) for f in ("dau", "aov")}
    assert got["dau"] is not None and got["aov"] is not None, "the noted writes kept the cache current"
    for family in ("dau", "aov"):
        assert_same(got[family], fresh(spark, rel, family))
    r2 = got["dau"][0]
    assert [s["release_id"] for s in got["dau"]] == ["r2", "r1"]
    assert r2["cells"] == 8 and r2["suppressed_keys"] == ["k2"] and r2["statistics"] == ["count", "sum"]
    assert r2["mechanisms"] == ["discrete_gaussian", "discrete_laplace"] and r2["charge_epsilon"] == 0.25
    assert r2["created_at"].tzinfo is None  # as a read returns it


def test_in_steady_state_the_summaries_read_runs_no_job(spark, rel):
    W.write_release(spark, rel, release_rows("r0"))
    first, n = jobs(spark, lambda: load(spark, rel))
    assert n >= 1  # the counter sees a read's jobs
    kept = copy.deepcopy(first)
    first[0]["cells"] = -1  # the caller's copy, not the cached one
    assert_same(load(spark, rel), kept)
    for i in range(1, 4):  # the engine's releases, each followed by its statement
        write_noted(spark, rel, release_rows(f"r{i}", created=T0 + timedelta(minutes=i)))
        got, n = jobs(spark, lambda: load(spark, rel))
        assert n == 0
        assert [s["release_id"] for s in got] == [f"r{j}" for j in range(i + 1)]
        kept = copy.deepcopy(got)
        got[0]["cells"] = -1  # callers get copies
        got[0]["suppressed_keys"].append("mutated")
        again, n = jobs(spark, lambda: load(spark, rel))
        assert n == 0
        assert_same(again, kept)
        assert_same(again, fresh(spark, rel))


def test_a_commit_by_someone_else_around_the_write_leaves_nothing_stale(spark, rel):
    W.write_release(spark, rel, release_rows("r1"))
    load(spark, rel)
    # between the identity taken before the write and the write
    before = versions._identity(spark, rel)
    append_outside(spark, rel, release_rows("o1", created=T0 + timedelta(minutes=1)))
    W.write_release(spark, rel, release_rows("r2", created=T0 + timedelta(minutes=2)))
    st.note_release_written(spark, rel, before, release_rows("r2", created=T0 + timedelta(minutes=2)))
    assert cached(spark, rel) is None
    got, n = jobs(spark, lambda: load(spark, rel))
    assert n >= 1 and [s["release_id"] for s in got] == ["r1", "o1", "r2"]

    # right after the write, before its note
    before = versions._identity(spark, rel)
    W.write_release(spark, rel, release_rows("r3", created=T0 + timedelta(minutes=3)))
    append_outside(spark, rel, release_rows("o2", created=T0 + timedelta(minutes=4)))
    st.note_release_written(spark, rel, before, release_rows("r3", created=T0 + timedelta(minutes=3)))
    got, n = jobs(spark, lambda: load(spark, rel))
    assert n >= 1 and [s["release_id"] for s in got] == ["r1", "o1", "r2", "r3", "o2"]

    # a write skipped by Delta (this release id landed before) while someone else commits:
    # the commit after ``before`` is not this write
    W.write_release(spark, rel, release_rows("x1", mode="exploration"))
    assert [s["release_id"] for s in load(spark, rel)] == ["r1", "o1", "r2", "r3", "o2"]
    before = versions._identity(spark, rel)
    append_outside(spark, rel, release_rows("o3", created=T0 + timedelta(minutes=5)))
    write_noted_rows = release_rows("x1", mode="exploration")
    W.write_release(spark, rel, write_noted_rows)  # skipped: no commit
    st.note_release_written(spark, rel, before, write_noted_rows)
    got, n = jobs(spark, lambda: load(spark, rel))
    assert n >= 1 and [s["release_id"] for s in got][-1] == "o3"
    assert_same(got, fresh(spark, rel))


def test_a_read_during_which_the_table_changed_is_not_cached(spark, rel, monkeypatch):
    W.write_release(spark, rel, release_rows("r1"))
    real = versions._exists

    def exists_then_another_writer(spark_, path):  # after the identity taken before the read
        append_outside(spark, rel, release_rows("o1", created=T0 + timedelta(minutes=1)))
        return real(spark_, path)

    monkeypatch.setattr(versions, "_exists", exists_then_another_writer)
    assert [s["release_id"] for s in load(spark, rel)] == ["r1", "o1"]
    monkeypatch.undo()
    assert rel not in st._summaries  # of no known version: not cached
    got, n = jobs(spark, lambda: load(spark, rel))
    assert n >= 1 and [s["release_id"] for s in got] == ["r1", "o1"]
    assert jobs(spark, lambda: load(spark, rel))[1] == 0  # now read at a stable identity


def test_outside_changes_of_a_cached_table_are_read(spark, rel):
    W.write_release(spark, rel, release_rows("r1"))
    write_noted(spark, rel, release_rows("r2", created=T0 + timedelta(minutes=1)))
    load(spark, rel)
    assert jobs(spark, lambda: load(spark, rel))[1] == 0  # warm

    append_outside(spark, rel, release_rows("o1", created=T0 + timedelta(minutes=2)))
    got, n = jobs(spark, lambda: load(spark, rel))
    assert n >= 1 and [s["release_id"] for s in got] == ["r1", "r2", "o1"]

    assert jobs(spark, lambda: load(spark, rel))[1] == 0
    spark.sql(f"UPDATE delta.`{rel}` SET suppressed = true WHERE release_id = 'r2' AND key = 'k1'")
    got = load(spark, rel)
    assert got[1]["suppressed_keys"] == ["k1"]
    assert_same(got, fresh(spark, rel))

    assert jobs(spark, lambda: load(spark, rel))[1] == 0
    before = versions._identity(spark, rel)
    spark.sql(f"OPTIMIZE delta.`{rel}`")
    after = versions._identity(spark, rel)
    assert after[0] == before[0] and after[1] > before[1]
    got, n = jobs(spark, lambda: load(spark, rel))
    assert n >= 1
    assert_same(got, fresh(spark, rel))

    # then the engine's next write is noted again: the steady state comes back
    write_noted(spark, rel, release_rows("r3", created=T0 + timedelta(minutes=3)))
    got, n = jobs(spark, lambda: load(spark, rel))
    assert n == 0 and [s["release_id"] for s in got] == ["r1", "r2", "o1", "r3"]


def test_a_table_recreated_at_the_same_path_is_read(spark, rel):
    W.write_release(spark, rel, release_rows("r1"))
    write_noted(spark, rel, release_rows("r2", created=T0 + timedelta(minutes=1)))
    old = versions._identity(spark, rel)
    load(spark, rel)
    assert jobs(spark, lambda: load(spark, rel))[1] == 0
    shutil.rmtree(rel)
    # recreated by plain Delta writes up to the SAME Delta version: only the table id differs
    append_outside(spark, rel, release_rows("n0"), mode="overwrite")
    for v in range(1, old[1] + 1):
        append_outside(spark, rel, release_rows(f"n{v}", created=T0 + timedelta(minutes=v)))
    new = versions._identity(spark, rel)
    assert new[1] == old[1] and new[0] != old[0]
    got, n = jobs(spark, lambda: load(spark, rel))
    assert n >= 1 and [s["release_id"] for s in got] == [f"n{i}" for i in range(old[1] + 1)]


def test_without_the_delta_log_fast_path_nothing_is_cached(spark, rel, monkeypatch):
    monkeypatch.setattr(W, "_fast_snapshot", lambda spark, path: None)  # as on Spark Connect
    assert load(spark, rel) == []  # no table yet
    W.write_release(spark, rel, release_rows("r1"))
    for i in range(2, 4):
        write_noted(spark, rel, release_rows(f"r{i}", created=T0 + timedelta(minutes=i)))
        got, n = jobs(spark, lambda: load(spark, rel))
        assert n >= 1 and [s["release_id"] for s in got] == [f"r{j}" for j in range(1, i + 1)]
        assert rel not in st._summaries
    spark.sql(f"UPDATE delta.`{rel}` SET suppressed = true WHERE release_id = 'r3' AND key = 'k0'")
    assert load(spark, rel)[-1]["suppressed_keys"] == ["k0"]
    assert rel not in st._summaries


def test_one_entry_per_path_a_bounded_number_of_paths_and_a_note_never_raises(spark, monkeypatch):
    st.clear_cache()
    monkeypatch.setattr(st, "CACHED_PATHS", 2)
    s = {"release_id": "r1", "cells": 1, "suppressed_keys": []}
    st._remember_summaries("p1", ("id", 1), {"dau": [s]})
    st._remember_summaries("p1", ("id", 2), {"aov": []})  # a new identity replaces the path's entry
    assert st._cached_summaries("p1", ("id", 1), "dau") is None
    assert st._cached_summaries("p1", ("id", 2), "dau") is None
    st._remember_summaries("p1", ("id", 2), {"dau": [s]})  # same identity: families accumulate
    assert st._cached_summaries("p1", ("id", 2), "aov") == [] and st._cached_summaries("p1", ("id", 2), "dau") == [s]
    st._remember_summaries("p2", ("id", 1), {"dau": [s]})
    st._remember_summaries("p3", ("id", 1), {"dau": [s]})
    assert list(st._summaries) == ["p2", "p3"]
    # a note on an unreadable path or with nonsense drops the entry and raises nothing
    st.note_release_written(spark, "p3", ("id", 1), [{"no": "release"}])
    st.note_release_written(spark, "p2", object(), None)
    assert list(st._summaries) == []
    st.clear_cache()


def test_a_commits_actions_from_its_file_and_from_the_delta_log_agree(spark, rel, monkeypatch):
    """``delta_commits.commit_actions``: a local table's commit file, else DeltaLog.getChanges
    (this Delta's signature); the write key and userMetadata read either way; None when unknown."""
    from dp_spark.release import delta_commits as dc

    W.write_release(spark, rel, release_rows("r1"))
    append_outside(spark, rel, release_rows("o1"))
    (spark.createDataFrame([tuple(r[f.name] for f in W.RELEASE_SCHEMA.fields) for r in release_rows("o2")],
                           W.RELEASE_SCHEMA)
     .write.format("delta").mode("append").option("userMetadata", '{"note": 1}').save(rel))
    v = versions._identity(spark, rel)[1]
    for version in (v - 2, v - 1, v):
        from_file, from_log = dc._file_actions(rel, version), dc._log_actions(spark, rel, version)
        assert from_file is not None and from_log is not None
        for got in (from_file, from_log):
            assert all(isinstance(a, dict) and len(a) == 1 for a in got)
        kinds = [sorted(k for a in got for k in a if k != "commitInfo") for got in (from_file, from_log)]
        assert kinds[0] == kinds[1] and "add" in kinds[0]
        assert [a["txn"]["appId"] for a in from_file if "txn" in a] == [a["txn"]["appId"] for a in from_log if "txn" in a]
        meta = [[a["commitInfo"].get("userMetadata") for a in got if "commitInfo" in a] for got in (from_file, from_log)]
        assert meta[0] == [('{"note": 1}' if version == v else None)]
        assert meta[1] in (meta[0], [])  # Delta 4.0 does not write its commitInfo back as valid JSON
    assert st._commit_writes(spark, rel, v - 2, "r1") and not st._commit_writes(spark, rel, v - 1, "r1")
    assert dc.commit_actions(spark, "file:" + rel, v) == dc._file_actions(rel, v)
    assert dc.commit_actions(spark, rel, v + 1) is None  # no such commit (yet)
    assert dc.commit_actions(spark, rel + "_nowhere", 0) is None
    monkeypatch.setattr(dc, "_file_actions", lambda path, version: None)  # as for a remote table
    assert st._commit_writes(spark, rel, v - 2, "r1") and not st._commit_writes(spark, rel, v, "r1")
    load(spark, rel)
    write_noted(spark, rel, release_rows("r2", created=T0 + timedelta(minutes=1)))
    got, n = jobs(spark, lambda: load(spark, rel))
    assert n == 0 and sorted(s["release_id"] for s in got) == ["o1", "o2", "r1", "r2"]
