"""The statement's "did anyone version meanwhile?" check (issue 15): by the versions table's
Delta version instead of a second read of the rows, with the same guarantee -- the statement
written last reflects every version committed before it."""

from __future__ import annotations

from dp_spark.governance import statement as st
from dp_spark.governance import versions
from dp_spark.governance.versions import record_publication, table_version


def _build(spark, tmp_path, pub):
    return st.build_and_write_statement(
        spark, family="fam", ledger=None, releases_dir=tmp_path, releases_path=str(tmp_path / "rel"),
        published_path=pub, out_dir=tmp_path, summaries=[])


def test_statement_rebuilt_when_a_version_lands_meanwhile_and_read_once_otherwise(spark, tmp_path, monkeypatch):
    pub = str(tmp_path / "_published")
    assert table_version(spark, pub) is None  # no table yet
    record_publication(spark, pub, "fam", "r1", "alice")
    v1 = table_version(spark, pub)
    assert v1 is not None and v1 >= 0
    built: list[list[str]] = []
    monkeypatch.setattr(st, "specs_for_family", lambda releases_dir, family: [])
    monkeypatch.setattr(st, "privacy_statement",
                        lambda family, specs, ledger, summaries, rows, **kw: {"v": [r["release_id"] for r in rows]})

    def write(out_dir, d, force=False):
        built.append(d["v"])
        if len(built) == 1:  # another run versions the family between our read and our write
            record_publication(spark, pub, "fam", "r2", "bob")
        return tmp_path / "s.json", tmp_path / "s.md"

    monkeypatch.setattr(st, "write_statement", write)
    _build(spark, tmp_path, pub)
    assert built == [["r1"], ["r1", "r2"]], "the statement written last must list r2"
    assert table_version(spark, pub) > v1

    # nothing changes meanwhile: one build and ONE read of the rows (the version check is free)
    built.clear()
    reads: list[int] = []
    real = versions.history
    monkeypatch.setattr(versions, "history", lambda *a: reads.append(1) or real(*a))
    _build(spark, tmp_path, pub)
    assert built == [["r1", "r2"]] and len(reads) == 1


def test_table_version_is_none_without_a_jvm_snapshot(spark, tmp_path, monkeypatch):
    # where the log cannot be read directly (Spark Connect), callers compare rows as before
    import dp_spark.release.writer as writer

    monkeypatch.setattr(writer, "_fast_snapshot", lambda spark, path: None)
    assert table_version(spark, str(tmp_path / "_published")) is None
