"""A damaged Delta log is never taken for "no table": absent tables read as None / [], tables
that exist but cannot be read raise UnreadableTableError (an OutputSchemaError) naming the path."""

from __future__ import annotations

import glob
import os
import shutil

import pytest

from dp_spark.errors import OutputSchemaError
from dp_spark.delta import release_table as W

from .test_release_writer import _rows

DATA_VALUE = 987654.25  # a cell value: it must never appear in an error


def _log(path: str) -> list[str]:
    return sorted(glob.glob(os.path.join(path, "_delta_log", "*.json")))


@pytest.fixture(scope="module")
def release_table(spark, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("damaged") / "rel")
    W.ensure_release_table(spark, path)
    W.write_release(spark, path, _rows("r1", DATA_VALUE))
    assert len(_log(path)) == 2
    return path


def _copy(src: str, dst, *, keep_crc: bool) -> str:
    out = str(dst)
    shutil.copytree(src, out)
    if not keep_crc:  # Delta resolves a schema from its .crc files alone
        for f in glob.glob(os.path.join(out, "_delta_log", "*.crc")):
            os.remove(f)
    return out


def test_no_table_is_none(spark, tmp_path):
    missing = str(tmp_path / "missing")
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "x.txt").write_text("not a table")
    empty_log = tmp_path / "empty_log"
    (empty_log / "_delta_log").mkdir(parents=True)
    for p in (missing, str(plain), str(empty_log)):
        assert W.delta_schema(spark, p) is None
        assert not W.table_exists(spark, p)
        assert W.read_release(spark, p, "r1") == []
        assert not W.release_present(spark, p, "r1")
        assert W.stream_points(spark, p, "fam", "official", "s1", "r1") == {}
        assert W.latest_release_id(spark, p, "fam") is None


def _damage(kind: str, path: str) -> None:
    log = _log(path)
    if kind == "garbled":
        with open(log[0], "w") as f:
            f.write("{not json at all\n")
    elif kind == "truncated":
        text = open(log[-1]).read()
        with open(log[-1], "w") as f:
            f.write(text[: len(text) // 2])
    elif kind == "first_commit_deleted":
        os.remove(log[0])


@pytest.mark.parametrize("keep_crc", [False, True], ids=["no_crc", "with_crc"])
@pytest.mark.parametrize("kind", ["garbled", "truncated", "first_commit_deleted"])
def test_damaged_log_raises_naming_the_path(spark, release_table, tmp_path, kind, keep_crc):
    path = _copy(release_table, tmp_path / "t", keep_crc=keep_crc)
    assert W.read_release(spark, path, "r1")  # intact copy: the cells are there
    spark.catalog.clearCache()
    path2 = _copy(release_table, tmp_path / "t2", keep_crc=keep_crc)  # fresh path: no cached log
    _damage(kind, path2)
    reads = {"read_release": lambda: W.read_release(spark, path2, "r1"),
             "release_present": lambda: W.release_present(spark, path2, "r1"),
             "stream_points": lambda: W.stream_points(spark, path2, "fam", "official", "s1", "r1"),
             "latest_release_id": lambda: W.latest_release_id(spark, path2, "fam")}
    for name, call in reads.items():  # a read never answers "nothing there"
        with pytest.raises(W.UnreadableTableError) as exc:
            call()
        msg = str(exc.value)
        assert isinstance(exc.value, OutputSchemaError), name
        assert f"Delta table '{path2}' exists but cannot be read" in msg, name
        assert str(DATA_VALUE) not in msg and "987654" not in msg, name
    if keep_crc:
        return  # Delta resolves the schema from the .crc file: the table is found, not created over
    with pytest.raises(W.UnreadableTableError):
        W.ensure_release_table(spark, path2)  # never "absent": no new table over a damaged one
