"""The statement's "did anyone version meanwhile?" check: after writing, the family's versions
are read again, and a statement built from rows that another run changed meanwhile is rebuilt,
so the statement written last reflects every version committed before it."""

from __future__ import annotations

from dp_spark.governance import statement as st
from dp_spark.governance import versions
from dp_spark.governance.versions import record_publication, record_publications


def _build(spark, tmp_path, pub):
    return st.build_and_write_statement(
        spark, family="fam", ledger=None, releases_dir=tmp_path, releases_path=str(tmp_path / "rel"),
        published_path=pub, out_dir=tmp_path, summaries=[])


def test_statement_rebuilt_when_a_version_lands_meanwhile_and_built_once_otherwise(spark, tmp_path, monkeypatch):
    pub = str(tmp_path / "_published")
    record_publication(spark, pub, "fam", "r1", "alice")
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

    # nothing changes meanwhile: one build, the rows read before it and once after it
    built.clear()
    reads: list[int] = []
    real = versions.history
    monkeypatch.setattr(versions, "history", lambda *a: reads.append(1) or real(*a))
    _build(spark, tmp_path, pub)
    assert built == [["r1", "r2"]] and len(reads) == 2


def test_the_statement_sees_a_change_made_outside_dp_spark(spark, tmp_path, monkeypatch):
    pub = str(tmp_path / "_published")
    monkeypatch.setattr(st, "specs_for_family", lambda releases_dir, family: [])
    monkeypatch.setattr(st, "privacy_statement",
                        lambda family, specs, ledger, summaries, rows, **kw: {"v": [(r["release_id"], r["state"])
                                                                                   for r in rows]})
    monkeypatch.setattr(st, "write_statement", lambda out_dir, d, force=False: (tmp_path / "s.json", tmp_path / "s.md"))
    record_publications(spark, pub, [("fam", "r1"), ("aov", "a1"), ("fam", "r2")], "bob")
    assert _build(spark, tmp_path, pub)[0]["v"] == [("r1", "superseded"), ("r2", "current")]
    spark.sql(f"UPDATE delta.`{pub}` SET state = 'withdrawn' WHERE release_id = 'r2'")  # another writer
    assert _build(spark, tmp_path, pub)[0]["v"] == [("r1", "superseded"), ("r2", "withdrawn")]
