"""The statement's release summaries read only the releases added since the last statement.

``load_release_summaries`` keeps the summaries with the release table's version (``cache_dir``)
and, next time, aggregates only the rows of the releases whose commits came after it: each
release write's commit names its release (``userMetadata``) and Delta counts its rows
(``numOutputRows``); without a cache, a young table that dp_spark created empty is read the
same way from its creation. Every case here compares the result with every official row of
the family summarised on the driver (the reference), and checks from the log which way it
went: added releases read alone; the whole table read again after a DELETE, a commit that wrote
rows of another release than it names, a session ``userMetadata`` (the commit names no
release), a table made again at the same path, another writer's commit or a first commit with
rows (no cache). A cache that trusted any of those would give summaries that differ from the
reference (shown for the forged commit and the DELETE: the cached answer would miss the rows)."""

from __future__ import annotations

import json
import logging
import shutil

import pytest

from dp_spark.delta import release_table as W
from dp_spark.governance import statement as st
from dp_spark.governance.statement import load_release_summaries, summarise_release_rows, summary_cache_dir
from tests.spark.test_release_writer import _rows

LOGGER = "dp_spark.governance.statement"


def _release(rid: str, n: int = 3, suppressed: tuple[int, ...] = ()) -> list[dict]:
    rows = _rows(rid, 10.0, n)
    for i in suppressed:
        rows[i]["suppressed"] = True
    return rows


@pytest.fixture(params=["rows to the driver", "a Spark aggregation"])
def way(request, monkeypatch):
    """The added releases summarised from their rows on the driver (a few rows) or by a Spark
    aggregation (many): both must agree with the whole read."""
    if request.param == "a Spark aggregation":
        monkeypatch.setattr(st, "SUMMARY_ROWS_ON_DRIVER", 0)
    return request.param


@pytest.fixture
def table(spark, tmp_path):
    path = str(tmp_path / "fam")
    W.ensure_release_table(spark, path)
    W.write_release(spark, path, _release("r1", 3, suppressed=(1,)))
    W.write_release(spark, path, _release("r2", 5))
    return path


def _load(spark, path, cache, caplog):
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        got = load_release_summaries(spark, family="fam", releases_path=path, cache_dir=cache)
    how = [r.getMessage() for r in caplog.records if r.name == LOGGER and "release summaries of fam" in r.getMessage()]
    assert len(how) == 1, how
    return got, how[0]


def _reference(spark, path):
    """Every official row of the family read and summarised on the driver (no cache, no history)."""
    rows = spark.read.format("delta").load(path).where("release_family = 'fam' AND mode = 'official'").collect()
    return summarise_release_rows([r.asDict() for r in rows])


def _by_id(summaries):
    return {s["release_id"]: s for s in summaries}


def test_added_releases_are_read_alone_and_agree_with_a_read_of_the_whole_table(spark, table, tmp_path, caplog,
                                                                                way):
    cache = summary_cache_dir(tmp_path / "statements")
    first, how = _load(spark, table, cache, caplog)
    assert "2 release(s) read (every commit since the table's creation" in how, how  # no cache yet: a young table
    assert first == _reference(spark, table)
    s = _by_id(first)
    assert (s["r1"]["cells"], s["r2"]["cells"], s["r1"]["suppressed_keys"]) == (3, 5, ["k1"])
    W.write_release(spark, table, _release("r3", 4, suppressed=(0, 2)))
    W.write_release(spark, table, _release("r4", 2))
    second, how = _load(spark, table, cache, caplog)
    assert "2 release(s) read" in how, how
    assert second == _reference(spark, table)
    assert [x["release_id"] for x in second] == ["r1", "r2", "r3", "r4"]
    assert _by_id(second)["r3"]["suppressed_keys"] == ["k0", "k2"]
    again, how = _load(spark, table, cache, caplog)  # nothing since: nothing read
    assert "0 release(s) read" in how and again == second
    kept = json.loads((cache / "fam.json").read_text())
    assert kept["version"] == W.latest_commit(spark, table)["version"]


def test_a_delete_since_the_cache_reads_the_whole_table(spark, table, tmp_path, caplog):
    cache = summary_cache_dir(tmp_path / "statements")
    before, _ = _load(spark, table, cache, caplog)
    spark.sql(f"DELETE FROM delta.`{table}` WHERE release_id = 'r1' AND key = 'k0'")
    W.write_release(spark, table, _release("r3"))
    after, how = _load(spark, table, cache, caplog)
    assert how.endswith("the whole table read"), how
    assert after == _reference(spark, table)
    assert _by_id(after)["r1"]["cells"] == 2 != _by_id(before)["r1"]["cells"]


def test_a_commit_that_wrote_rows_of_another_release_than_it_names_is_caught(spark, table, tmp_path, caplog, way):
    cache = summary_cache_dir(tmp_path / "statements")
    _load(spark, table, cache, caplog)
    # a writer that names r9 in its commit but writes rows of r1 (3 more) and of r9
    forged = _release("r1", 3) + _release("r9", 2)
    (spark.createDataFrame(forged, W.RELEASE_SCHEMA).write.format("delta").mode("append")
     .option("userMetadata", W.release_commit_metadata("r9")).save(table))
    after, how = _load(spark, table, cache, caplog)
    assert "a commit's rows are not its release's" in how, how
    assert after == _reference(spark, table)
    assert _by_id(after)["r1"]["cells"] == 6  # the cached 3 would hide the forged rows


def test_a_write_under_a_session_user_metadata_reads_the_whole_table(spark, table, tmp_path, caplog):
    cache = summary_cache_dir(tmp_path / "statements")
    _load(spark, table, cache, caplog)
    conf = "spark.databricks.delta.commitInfo.userMetadata"
    spark.conf.set(conf, "nightly refresh")
    try:
        W.write_release(spark, table, _release("r3"))
    finally:
        spark.conf.unset(conf)
    after, how = _load(spark, table, cache, caplog)
    assert how.endswith("the whole table read"), how
    assert after == _reference(spark, table) and "r3" in _by_id(after)


def test_a_table_made_again_at_the_same_path_is_read_whole(spark, table, tmp_path, caplog):
    cache = summary_cache_dir(tmp_path / "statements")
    _load(spark, table, cache, caplog)  # cached at version 2
    shutil.rmtree(table)
    W.ensure_release_table(spark, table)
    for rid in ("a1", "a2", "a3"):  # versions 1..3: the cached version 2 exists again, another commit
        W.write_release(spark, table, _release(rid))
    after, how = _load(spark, table, cache, caplog)
    assert how.endswith("the whole table read"), how
    assert sorted(_by_id(after)) == ["a1", "a2", "a3"] and after == _reference(spark, table)


@pytest.mark.parametrize("damage", ["not json", '{"schema": "dp_spark.release_summaries/1", "family": "fam"}'])
def test_a_damaged_cache_reads_the_whole_table(spark, table, tmp_path, caplog, damage):
    cache = summary_cache_dir(tmp_path / "statements")
    cache.mkdir(parents=True)
    (cache / "fam.json").write_text(damage)
    got, how = _load(spark, table, cache, caplog)
    assert "from the cache" not in how and got == _reference(spark, table)
    _, how = _load(spark, table, cache, caplog)  # rewritten: the next read uses it
    assert "0 release(s) read" in how


def test_the_release_commit_names_its_release(spark, table):
    commit = W.latest_commit(spark, table)
    assert W.committed_release_id(commit) == "r2"
    assert commit["operation"] == "WRITE" and int(commit["operationMetrics"]["numOutputRows"]) == 5


def test_the_cache_of_another_table_of_the_family_is_not_used(spark, table, tmp_path, caplog):
    cache = summary_cache_dir(tmp_path / "statements")
    _load(spark, table, cache, caplog)
    other = str(tmp_path / "elsewhere" / "fam")  # the env's output root moved: the same family, another table
    W.ensure_release_table(spark, other)
    W.write_release(spark, other, _release("r1", 3))
    W.write_release(spark, other, _release("b2", 4))
    got, how = _load(spark, other, cache, caplog)  # the same version numbers as the cached table's
    assert "from the cache" not in how, how
    assert sorted(_by_id(got)) == ["b2", "r1"] and got == _reference(spark, other)


def test_without_a_cache_a_young_table_dp_spark_made_is_read_by_release_id(spark, table, caplog):
    got, how = _load(spark, table, None, caplog)
    assert "2 release(s) read (every commit since the table's creation" in how, how
    assert got == _reference(spark, table)


def test_without_a_cache_a_table_with_another_writers_commit_is_read_whole(spark, table, caplog):
    # rows of a release r1 (3 more) appended by another writer: its commit names no release
    spark.createDataFrame(_release("r1", 3), W.RELEASE_SCHEMA).write.format("delta").mode("append").save(table)
    got, how = _load(spark, table, None, caplog)
    assert how.endswith("the whole table read"), how
    assert got == _reference(spark, table) and _by_id(got)["r1"]["cells"] == 6


def test_without_a_cache_a_table_not_created_empty_is_read_whole(spark, tmp_path, caplog):
    path = str(tmp_path / "fam")
    W.write_release(spark, path, _release("r1", 3))  # its first commit holds rows: not dp_spark's creation
    W.write_release(spark, path, _release("r2", 2))
    got, how = _load(spark, path, None, caplog)
    assert how.endswith("the whole table read"), how
    assert got == _reference(spark, path)
