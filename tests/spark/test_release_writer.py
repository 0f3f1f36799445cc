"""The release writer: idempotent appends by release id, read-back comparison, snapshot pins."""

from __future__ import annotations

import os
import time
from datetime import datetime

import pytest

from dp_spark.errors import SchemaError
from dp_spark.delta import release_table as W


def _rows(release_id: str, value: float, n: int = 3) -> list[dict]:
    base = {f.name: None for f in W.RELEASE_SCHEMA.fields}
    base.update(release_id=release_id, release_family="fam", release_name="fam", spec_version="v1",
                mode="official", key_column="region", confidence=0.95, expected_abs_error=1.0,
                mechanism="discrete_gaussian", noise_scale=1.0, noise_stddev=1.0, grid=1.0,
                charge_json="{}", budget_id="b", bounds_json="{}", privacy_unit="user",
                unit_column="user_id", neighbouring="add_remove_unit", parallel_composition=True,
                suppressed=False, input_table_id="t", input_version=0, code_version="test",
                created_at=datetime(2026, 12, 3, 12, 0, 0, 123456))
    return [dict(base, statistic="count", key=f"k{i}", value=value + i, ci_low=value + i - 2,
                 ci_high=value + i + 2) for i in range(n)]


def test_a_second_write_of_a_release_id_adds_nothing(spark, tmp_path):
    path = str(tmp_path / "rel")
    W.ensure_release_table(spark, path)
    first, second = _rows("r1", 10.0), _rows("r1", 99.0)
    W.write_release(spark, path, first)
    W.write_release(spark, path, second)  # another draw of the same release: skipped by Delta
    stored = W.read_release(spark, path, "r1")
    assert W.same_cells(stored, first) and not W.same_cells(stored, second)
    assert spark.read.format("delta").load(path).count() == 3
    W.write_release(spark, path, _rows("r2", 5.0))  # another release id lands
    assert spark.read.format("delta").load(path).count() == 6
    assert W.same_cells(W.read_release(spark, path, "r2"), _rows("r2", 5.0))


def test_a_new_release_table_collects_file_statistics_of_the_release_id_only(spark, tmp_path):
    path = str(tmp_path / "rel")
    W.ensure_release_table(spark, path)
    props = {r["key"]: r["value"] for r in spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect()}
    assert props.get(W.STATS_COLUMNS_PROPERTY) == "1" and W.RELEASE_SCHEMA.fields[0].name == "release_id"
    W.write_release(spark, path, _rows("r1", 1.0))
    W.write_release(spark, path, _rows("r2", 2.0))
    # a read by release id still skips the other release's file (with no statistics it reads both)
    df = spark.read.format("delta").load(path).where("release_id = 'r2'")
    assert df.count() == 3 and len(df.inputFiles()) == 1


def test_same_cells_compares_the_published_numbers():
    a = _rows("r", 1.0)
    assert W.same_cells(a, list(reversed(a)))
    b = [dict(r) for r in a]
    b[1]["ci_high"] += 1e-9
    assert not W.same_cells(a, b)
    assert not W.same_cells(a, a[:2])
    c = [dict(r) for r in a]  # a suppressed cell publishes NaN: equal to itself
    c[0].update(value=float("nan"), ci_low=float("nan"), ci_high=float("nan"))
    assert W.same_cells(c, [dict(r) for r in c]) and not W.same_cells(a, c)


def test_write_refuses_mixed_or_empty_releases(spark, tmp_path):
    with pytest.raises(ValueError):
        W.write_release(spark, str(tmp_path / "x"), [])
    with pytest.raises(ValueError):
        W.write_release(spark, str(tmp_path / "x"), _rows("a", 1.0) + _rows("b", 1.0))


def test_pin_follows_new_versions_and_reads_the_pinned_one(spark, tmp_path):
    path = str(tmp_path / "input")
    spark.range(5).write.format("delta").save(path)
    first = W.pin_snapshot(spark, path)
    assert first.version == 0 and first.table_id
    spark.range(2).write.format("delta").mode("append").save(path)
    after = W.pin_snapshot(spark, path)
    assert after.version == first.version + 1 and after.table_id == first.table_id
    assert after.reader(spark).count() == 7 and first.reader(spark).count() == 5


def test_pin_of_a_non_delta_location_names_it(spark, tmp_path):
    plain = tmp_path / "parquet"
    spark.range(3).write.parquet(str(plain))
    for where in (str(plain), str(tmp_path / "missing")):
        with pytest.raises(SchemaError, match="not a readable Delta table|not a Delta table"):
            W.pin_snapshot(spark, where)


def test_latest_commit_is_the_tables_last_version(spark, tmp_path):
    path = str(tmp_path / "rel")
    assert W.latest_commit(spark, path) is None  # no table
    W.ensure_release_table(spark, path)
    W.write_release(spark, path, _rows("r", 1.0))
    head = W.latest_commit(spark, path)
    assert head["version"] == 1 and head["operation"] == "WRITE"


def test_prepare_release_write_is_harmless(spark, tmp_path):
    missing = tmp_path / "nothing"
    W.prepare_release_write(spark, str(missing))  # no table: a no-op, nothing created
    assert not (missing / "_delta_log").exists() or not any((missing / "_delta_log").iterdir())
    path = str(tmp_path / "rel")
    W.ensure_release_table(spark, path)
    W.prepare_release_write(spark, path)
    W.write_release(spark, path, _rows("r", 1.0))
    W.prepare_release_write(spark, path)
    W.write_release(spark, path, _rows("r", 2.0))  # still recognised as written
    assert W.same_cells(W.read_release(spark, path, "r"), _rows("r", 1.0))


def test_prepare_release_write_takes_the_key_lookup_off_the_write(spark, tmp_path):
    """The idempotent append looks its key up in the table's Delta state; resolved ahead by
    ``prepare_release_write`` (``DESCRIBE DETAIL``), the write itself runs fewer Spark jobs."""
    from tests.spark.spark_jobs import jobs

    path = str(tmp_path / "rel")
    W.ensure_release_table(spark, path)
    W.write_release(spark, path, _rows("r0", 1.0))
    counts = {}
    for i, prepared in enumerate((False, True)):
        W.write_release(spark, path, _rows(f"n{i}", 1.0))  # a new snapshot for each measured write
        if prepared:
            W.prepare_release_write(spark, path)
        counts[prepared] = jobs(spark, lambda: W.write_release(spark, path, _rows(f"m{i}", 1.0)))[1]
    assert counts[True] < counts[False], counts


def _set_local_zone(tz):
    if tz is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = tz
    time.tzset()


def test_arrow_cells_frame_equals_the_row_by_row_frame(spark, tmp_path):
    """The write's Arrow frame holds exactly what createDataFrame(rows, RELEASE_SCHEMA) holds,
    with RELEASE_SCHEMA itself (types and nullability): every column, a NaN, nulls, a map, the
    timestamps (one per row too, and with a session time zone other than the process's: a
    naive created_at is the process's local time on both paths), read back from Delta too."""
    from chispa import assert_df_equality

    rows = _rows("r_arrow", 7.0, n=4)
    rows[1].update(keys={"region": "k1", "day": "2026-11-01"}, value=float("nan"), suppressed=True,
                   charge_epsilon=0.5, statement_delta=1e-7)
    rows[2].update(keys={})
    mixed = [dict(r, created_at=datetime(2026, 12, 3, 12, i, 0, 7 * i)) for i, r in enumerate(_rows("r_mixed", 1.0))]
    old_tz = spark.conf.get("spark.sql.session.timeZone")
    old_local = os.environ.get("TZ")
    try:
        # the session's zone, and the process's own (a naive time read as UTC would fail here)
        for tz, local in ((old_tz, old_local), ("America/Los_Angeles", old_local), (old_tz, "Asia/Kolkata")):
            spark.conf.set("spark.sql.session.timeZone", tz)
            _set_local_zone(local)
            for rs in (rows, mixed):
                want = spark.createDataFrame([tuple(r[f.name] for f in W.RELEASE_SCHEMA.fields) for r in rs],
                                             W.RELEASE_SCHEMA)
                got = W._cells_frame(spark, rs)
                assert got.schema == W.RELEASE_SCHEMA and got.rdd.getNumPartitions() == 1
                assert_df_equality(got.drop("keys"), want.drop("keys"), ignore_row_order=True,
                                   allow_nan_equality=True)
                assert (sorted((r["key"], r["keys"], r["created_at"]) for r in got.collect())
                        == sorted((r["key"], r["keys"], r["created_at"]) for r in rs))
    finally:
        spark.conf.set("spark.sql.session.timeZone", old_tz)
        _set_local_zone(old_local)
    path = str(tmp_path / "rel")
    W.ensure_release_table(spark, path)
    W.write_release(spark, path, rows)
    stored = W.read_release(spark, path, "r_arrow")
    assert W.same_cells(stored, rows) and {r["created_at"] for r in stored} == {rows[0]["created_at"]}

def test_stream_points_reads_the_days_of_one_stream_and_whether_a_release_is_written(spark, tmp_path):
    """One read answers both questions of a stream's refresh: its own release id's rows (present
    or not, whatever their charge) and the days each release of THIS stream wrote; rows of
    another stream, family or mode are not its days."""
    import json

    path = str(tmp_path / "rel")
    W.ensure_release_table(spark, path)
    assert W.stream_points(spark, path, "fam", "official", "s1", "r0") == {}  # an empty table

    def rows(rid, keys, *, stream="s1", family="fam", mode="official"):
        charge = json.dumps({"stream": {"stream_id": stream}}) if stream else "{}"
        return [dict(r, key=k, charge_json=charge, release_family=family, mode=mode)
                for r, k in zip(_rows(rid, 1.0, n=len(keys)), keys)]

    W.write_release(spark, path, rows("a", ["d1"]))
    W.write_release(spark, path, rows("b", ["d2", "d3"]))
    W.write_release(spark, path, rows("c", ["d4"], stream="s2"))  # another stream
    W.write_release(spark, path, rows("d", ["d5"], family="other"))
    W.write_release(spark, path, rows("e", ["d6"], mode="exploration"))
    W.write_release(spark, path, rows("f", ["d7"], stream=None))  # not a stream's release
    assert W.stream_points(spark, path, "fam", "official", "s1", "r0") == {"a": {"d1"}, "b": {"d2", "d3"}}
    # the release asked about is there whatever its rows say: release_present's answer
    for rid in ("c", "d", "e", "f", "b"):
        got = W.stream_points(spark, path, "fam", "official", "s1", rid)
        assert rid in got and W.release_present(spark, path, rid)
        assert set(got) - {rid} == {"a", "b"} - {rid}
    assert "zz" not in W.stream_points(spark, path, "fam", "official", "s1", "zz")
    assert not W.release_present(spark, path, "zz")
