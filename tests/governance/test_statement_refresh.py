"""The statement's "did anyone version meanwhile?" check: after writing, the family's versions
are read again (from the SQL ledger), and a statement built from rows that another run changed
meanwhile is rebuilt, so the statement written last reflects every version committed before it."""

from __future__ import annotations

import pytest

from dp_spark.governance import statement as st
from dp_spark.governance import versions
from dp_spark.governance.versions import record_publication, record_publications, rollback
from dp_spark.ledger import open_ledger


@pytest.fixture
def ledger(tmp_path, monkeypatch):
    monkeypatch.setenv("DP_SPARK_LEDGER_KEY", "statement test key, not a secret")
    with open_ledger(f"sqlite:{tmp_path / 'ledger.db'}") as led:
        yield led


def _build(tmp_path, ledger):
    # the summaries are given: no Spark read
    return st.build_and_write_statement(
        None, family="fam", ledger=ledger, releases_dir=tmp_path, releases_path=str(tmp_path / "rel"),
        out_dir=tmp_path, summaries=[])


def test_statement_rebuilt_when_a_version_lands_meanwhile_and_built_once_otherwise(tmp_path, ledger, monkeypatch):
    record_publication(ledger, "fam", "r1", "alice")
    built: list[list[str]] = []
    monkeypatch.setattr(st, "specs_for_family", lambda releases_dir, family: [])
    monkeypatch.setattr(st, "load_release_summaries", lambda spark, **kw: [])
    monkeypatch.setattr(st, "privacy_statement",
                        lambda family, specs, led, summaries, rows, **kw: {"v": [r["release_id"] for r in rows]})

    def write(out_dir, d, force=False):
        built.append(d["v"])
        if len(built) == 1:  # another run versions the family between our read and our write
            record_publication(ledger, "fam", "r2", "bob")
        return tmp_path / "s.json", tmp_path / "s.md"

    monkeypatch.setattr(st, "write_statement", write)
    _build(tmp_path, ledger)
    assert built == [["r1"], ["r1", "r2"]], "the statement written last must list r2"

    # nothing changes meanwhile: one build, the rows read before it and once after it
    built.clear()
    reads: list[int] = []
    real = versions.history
    monkeypatch.setattr(versions, "history", lambda *a: reads.append(1) or real(*a))
    _build(tmp_path, ledger)
    assert built == [["r1", "r2"]] and len(reads) == 2


def test_the_statement_sees_a_rollback_by_another_process(tmp_path, ledger, monkeypatch):
    monkeypatch.setattr(st, "specs_for_family", lambda releases_dir, family: [])
    monkeypatch.setattr(st, "load_release_summaries", lambda spark, **kw: [])
    monkeypatch.setattr(st, "privacy_statement",
                        lambda family, specs, led, summaries, rows, **kw: {"v": [(r["release_id"], r["state"])
                                                                                for r in rows]})
    monkeypatch.setattr(st, "write_statement", lambda out_dir, d, force=False: (tmp_path / "s.json", tmp_path / "s.md"))
    record_publications(ledger, [("fam", "r1"), ("aov", "a1"), ("fam", "r2")], "bob")
    assert _build(tmp_path, ledger)[0]["v"] == [("r1", "superseded"), ("r2", "current")]
    with open_ledger(f"sqlite:{tmp_path / 'ledger.db'}") as other:
        rollback(other, "fam", "carol", "bad")  # another process, its own connection
    assert _build(tmp_path, ledger)[0]["v"] == [("r1", "current"), ("r2", "withdrawn")]
