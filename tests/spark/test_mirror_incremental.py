"""The ledger's Delta mirror is refreshed with what changed (issue 15, item 2).

A refresh appends the new entries and audit rows (verified against their chains' heads) in one
conditional commit per table; it rewrites a table only when it must. These tests check that the
tables always equal a full rebuild, that a steady-state refresh writes only the new rows, that
a write planned from a version another refresh has moved past is skipped (no duplicate), and
that a damaged mirror or a tampered new ledger row is handled.
"""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from dp_spark.core.budget import ZCDP
from dp_spark.errors import LedgerIntegrityError
from dp_spark.ledger import open_ledger
from dp_spark.delta.mirror import AUDIT_SCHEMA, ENTRY_SCHEMA, _audit_row, _version, _write, mirror_to_delta
from dp_spark.ledger.policy import BudgetPolicy, WindowPolicy

pytestmark = pytest.mark.spark

KEY = b"mirror test key, not a secret...."


def _policy(bid: str) -> BudgetPolicy:
    return BudgetPolicy(budget_id=bid, dataset=f"ds_{bid}", privacy_unit="user", measure="zcdp",
                        cap=ZCDP(1000), statement_delta=Fraction(1, 10**7),
                        window=WindowPolicy("none", None))


def _reserve(led, bid: str, rid: str, owner: str = "o"):
    return led.reserve(bid, rid, ZCDP("1/100"), "{}", principal="alice", code_version="v1",
                       release_family="fam", owner_token=owner)


def _table(spark, path: str, schema) -> list[tuple]:
    cols = [f.name for f in schema.fields if f.name != "mirrored_at"]
    return sorted(tuple(r) for r in spark.read.format("delta").load(path).select(*cols).collect())


def _ops(spark, path: str) -> list[tuple[str, str, int]]:
    """(operation, mode, rows written) of each commit of a Delta table, oldest first."""
    rows = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()
    return [(r["operation"], (r["operationParameters"] or {}).get("mode", ""),
             int((r["operationMetrics"] or {}).get("numOutputRows", -1))) for r in rows]


def _mirrored_then_one_more(spark, tmp_path, ledger) -> tuple[str, str]:
    """Entry r0 committed and mirrored, then r1 committed and not mirrored yet: (lpath, apath)."""
    lpath, apath = str(tmp_path / "lm"), str(tmp_path / "am")
    _reserve(ledger, "a", "r0")
    ledger.commit("r0", "o")
    mirror_to_delta(ledger, spark, ledger_path=lpath, audit_path=apath)
    _reserve(ledger, "a", "r1")
    ledger.commit("r1", "o")
    return lpath, apath


@pytest.fixture
def ledger(tmp_path):
    with open_ledger(f"sqlite:{tmp_path / 'ledger.db'}", key=KEY) as led:
        led.register_budget(_policy("a"))
        led.register_budget(_policy("b"))
        yield led


def test_refresh_equals_a_full_rebuild_and_appends_only_new_rows(spark, tmp_path, ledger):
    rng = random.Random(15)
    lpath, apath = str(tmp_path / "lm"), str(tmp_path / "am")
    rpath, rapath = str(tmp_path / "rebuilt_lm"), str(tmp_path / "rebuilt_am")
    open_reservations: list[str] = []
    for step in range(12):
        # a job's releases: reserve and commit (now and then a reservation left open, later
        # committed, as a crashed run's rerun does), audit rows
        for i in range(rng.randint(0, 3)):
            rid = f"r{step}_{i}"
            _reserve(ledger, rng.choice("ab"), rid)
            if rng.random() < 0.2:
                open_reservations.append(rid)
            else:
                ledger.commit(rid, "o")
            ledger.append_audit("alice", "publish:official", "s", "v", "published", rid, None, None)
        if open_reservations and rng.random() < 0.3:
            ledger.commit(open_reservations.pop(0), "o")
        mirror_to_delta(ledger, spark, ledger_path=lpath, audit_path=apath)
        mirror_to_delta(ledger, spark, ledger_path=rpath, audit_path=rapath, full=True)
        assert _table(spark, lpath, ENTRY_SCHEMA) == _table(spark, rpath, ENTRY_SCHEMA), step
        assert _table(spark, apath, AUDIT_SCHEMA) == _table(spark, rapath, AUDIT_SCHEMA), step

    # steady state: one new committed entry and one audit row -> one append of one row each
    while open_reservations:  # settle what is open first, so the next refresh is a pure append
        ledger.commit(open_reservations.pop(), "o")
    mirror_to_delta(ledger, spark, ledger_path=lpath, audit_path=apath)
    _reserve(ledger, "b", "last2")
    ledger.commit("last2", "o")
    ledger.append_audit("alice", "publish:official", "s", "v", "published", "last2", None, None)
    n_l, n_a = len(_ops(spark, lpath)), len(_ops(spark, apath))
    assert mirror_to_delta(ledger, spark, ledger_path=lpath, audit_path=apath) == (1, 1)
    assert _ops(spark, lpath)[n_l:] == [("WRITE", "Append", 1)]
    assert _ops(spark, apath)[n_a:] == [("WRITE", "Append", 1)]
    assert mirror_to_delta(ledger, spark, ledger_path=lpath, audit_path=apath) == (0, 0)  # nothing new
    assert len(_ops(spark, lpath)) == n_l + 1 and len(_ops(spark, apath)) == n_a + 1  # no commit
    ledger.verify()


def test_a_write_planned_from_an_old_version_is_not_committed_and_its_duplicate_is_rewritten(spark, tmp_path, ledger):
    """Two refreshes planned from the same version both append (a plain append: Delta's
    idempotent-write options would cost a state reconstruction per table), but only the one
    that landed as the next version counts as committed; the other re-plans, reads the table,
    finds the duplicate and rewrites the table from the ledger."""
    apath = str(tmp_path / "am")
    lpath = str(tmp_path / "lm")
    ledger.append_audit("alice", "a", None, None, "ok", None, None, None)
    mirror_to_delta(ledger, spark, ledger_path=lpath, audit_path=apath)
    v = _version(spark, apath)
    row = ledger.append_audit("alice", "a", None, None, "ok", None, None, None)
    from datetime import datetime, timezone

    now = datetime.now(timezone.utc)
    # two refreshes planned from version v: the first commits as v + 1, the second lands
    # after it and is not reported as committed; nor is one planned from an older version
    two = {"hi": 2}
    assert _write(spark, [_audit_row(row, now)], AUDIT_SCHEMA, apath, append=True, read_version=v, state=two)
    assert not _write(spark, [_audit_row(row, now)], AUDIT_SCHEMA, apath, append=True, read_version=v, state=two)
    assert not _write(spark, [_audit_row(row, now)], AUDIT_SCHEMA, apath, append=True, read_version=v - 1,
                      state=two)
    assert sorted(r["seq"] for r in spark.read.format("delta").load(apath).collect()) == [1, 2, 2, 2]
    # the next refresh (the losers' re-plan) does not trust the last commit's record (it was
    # not planned from the version before it): it reads the table, sees the duplicates and
    # rewrites the table from the ledger
    assert mirror_to_delta(ledger, spark, ledger_path=lpath, audit_path=apath)[1] == 2
    assert sorted(r["seq"] for r in spark.read.format("delta").load(apath).collect()) == [1, 2]


def test_two_refreshes_at_once_leave_the_mirror_equal_to_the_ledger(spark, tmp_path, ledger, monkeypatch):
    """Two refreshes planned from the same mirror version, the second appending after the
    first committed (held at a gate between its plan and its write): both return, and the
    tables equal a full rebuild, each ledger row once."""
    import threading

    import dp_spark.delta.mirror as mirror

    lpath, apath = _mirrored_then_one_more(spark, tmp_path, ledger)
    planned, gate = threading.Event(), threading.Event()
    real_write = mirror._write

    def held_write(spark_, rows, schema, path, **kw):
        if threading.current_thread().name == "late" and path == lpath and kw["append"]:
            planned.set()
            assert gate.wait(120)
        return real_write(spark_, rows, schema, path, **kw)

    monkeypatch.setattr(mirror, "_write", held_write)
    late = threading.Thread(target=lambda: mirror_to_delta(ledger, spark, ledger_path=lpath, audit_path=apath),
                            name="late")
    late.start()
    assert planned.wait(120)  # the late refresh planned from the same version as the next one
    mirror_to_delta(ledger, spark, ledger_path=lpath, audit_path=apath)
    gate.set()
    late.join(120)
    assert not late.is_alive()
    rpath, rapath = str(tmp_path / "rebuilt_lm"), str(tmp_path / "rebuilt_am")
    mirror_to_delta(ledger, spark, ledger_path=rpath, audit_path=rapath, full=True)
    assert _table(spark, lpath, ENTRY_SCHEMA) == _table(spark, rpath, ENTRY_SCHEMA)
    assert sorted(r["seq"] for r in spark.read.format("delta").load(lpath).collect()) == [1, 2]


def test_a_mirror_edited_or_from_another_ledger_is_rewritten(spark, tmp_path, ledger):
    lpath, apath = str(tmp_path / "lm"), str(tmp_path / "am")
    for i in range(3):
        _reserve(ledger, "a", f"r{i}")
        ledger.commit(f"r{i}", "o")
    mirror_to_delta(ledger, spark, ledger_path=lpath, audit_path=apath)
    # a row deleted from the mirror by hand: a gap, so the table is rewritten
    spark.sql(f"DELETE FROM delta.`{lpath}` WHERE seq = 2")
    assert mirror_to_delta(ledger, spark, ledger_path=lpath, audit_path=apath)[0] == 3
    assert sorted(r["seq"] for r in spark.read.format("delta").load(lpath).collect()) == [1, 2, 3]
    # a mirror of a longer ledger (watermark past this ledger's head): rewritten, not appended to
    other = open_ledger(f"sqlite:{tmp_path / 'other.db'}", key=KEY)
    other.register_budget(_policy("a"))
    _reserve(other, "a", "x1")
    other.commit("x1", "o")
    assert mirror_to_delta(other, spark, ledger_path=lpath, audit_path=apath)[0] == 1
    assert [r["release_id"] for r in spark.read.format("delta").load(lpath).collect()] == ["x1"]
    other.close()


def test_a_tampered_new_entry_is_not_mirrored(spark, tmp_path, ledger):
    import sqlite3

    lpath, apath = _mirrored_then_one_more(spark, tmp_path, ledger)
    conn = sqlite3.connect(str(tmp_path / "ledger.db"), isolation_level=None)
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f'DROP TRIGGER "{name}"')
    conn.execute("UPDATE dp_entries SET charge = '{\"measure\":\"zcdp\",\"rho\":\"1/1000000\"}' WHERE seq = 2")
    conn.close()
    before = _ops(spark, lpath)
    with pytest.raises(LedgerIntegrityError):
        mirror_to_delta(ledger, spark, ledger_path=lpath, audit_path=apath)
    assert _ops(spark, lpath) == before
    assert [r["release_id"] for r in spark.read.format("delta").load(lpath).collect()] == ["r0"]


def test_a_refresh_after_its_own_write_reads_the_recorded_state_not_the_table(spark, tmp_path, ledger,
                                                                              monkeypatch):
    import dp_spark.delta.mirror as mirror

    lpath, apath = str(tmp_path / "lm"), str(tmp_path / "am")
    _reserve(ledger, "a", "r0")  # left reserved: the recorded state carries it
    ledger.append_audit("alice", "a", None, None, "ok", None, None, None)
    mirror_to_delta(ledger, spark, ledger_path=lpath, audit_path=apath)
    reads: list[str] = []
    real = mirror._read
    monkeypatch.setattr(mirror, "_read", lambda s, p, schema: reads.append(p) or real(s, p, schema))
    for i in range(1, 3):
        _reserve(ledger, "b", f"r{i}")
        ledger.commit(f"r{i}", "o")
        ledger.append_audit("alice", "a", None, None, "ok", None, None, None)
        assert mirror_to_delta(ledger, spark, ledger_path=lpath, audit_path=apath) == (1, 1)
    assert reads == []  # each refresh planned from the state the previous write recorded
    ledger.commit("r0", "o")  # the reservation the record lists settles: the table is rewritten
    assert mirror_to_delta(ledger, spark, ledger_path=lpath, audit_path=apath) == (3, 0)
    # someone else's commit (a compaction) comes between: the next refresh reads the table
    spark.sql(f"OPTIMIZE delta.`{apath}`")
    ledger.append_audit("alice", "a", None, None, "ok", None, None, None)
    assert mirror_to_delta(ledger, spark, ledger_path=lpath, audit_path=apath) == (0, 1)
    assert reads == [apath]
    rpath, rapath = str(tmp_path / "rebuilt_lm"), str(tmp_path / "rebuilt_am")
    mirror_to_delta(ledger, spark, ledger_path=rpath, audit_path=rapath, full=True)
    assert _table(spark, lpath, ENTRY_SCHEMA) == _table(spark, rpath, ENTRY_SCHEMA)
    assert [r["seq"] for r in spark.read.format("delta").load(apath).orderBy("seq").collect()] == [1, 2, 3, 4]


def _exc(cls_name: str, text: str) -> Exception:
    """An exception of class ``cls_name`` (as Py4J / Spark Connect name Delta's) saying ``text``."""
    return type(cls_name, (Exception,), {})(text)


@pytest.mark.parametrize("exc, concurrent", [
    # another writer committed first (classic session: the Java class in the text; Connect: the condition)
    (_exc("Py4JJavaError", "io.delta.exceptions.ConcurrentAppendException: Files were added"), True),
    (_exc("ConcurrentDeleteReadException", "This transaction attempted to read one or more files"), True),
    (_exc("SparkConnectGrpcException", "[DELTA_CONCURRENT_APPEND] Files were added to the root"), True),
    (_exc("SparkConnectGrpcException", "[DELTA_CONCURRENT_TRANSACTION] This error occurs when"), True),
    # the protocol or the metadata changed under the commit
    (_exc("SparkConnectGrpcException", "[DELTA_PROTOCOL_CHANGED] The protocol version has changed"), True),
    (_exc("ProtocolChangedException", "The protocol version of the Delta table has been changed"), True),
    (_exc("SparkConnectGrpcException", "[DELTA_METADATA_CHANGED] The metadata of the Delta table changed"), True),
    (_exc("MetadataChangedException", "The metadata of the Delta table has been changed"), True),
    # another writer created the table at the same time
    (_exc("AnalysisException", "[DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION] Cannot create table"), True),
    # anything else is a real failure, never taken for a race
    (ValueError("boom"), False),
    (KeyError("seq"), False),
    (RuntimeError(""), False),
    (_exc("AnalysisException", "[PATH_NOT_FOUND] Path does not exist: /tmp/lm"), False),
    (_exc("AnalysisException", "[DELTA_TABLE_NOT_FOUND] Delta table does not exist"), False),
    (_exc("Py4JJavaError", "java.io.FileNotFoundException: _delta_log/00000000000000000003.json"), False),
    (_exc("AnalysisException", "[DELTA_SCHEMA_CHANGED] Detected schema change"), False),
])
def test_is_concurrent_change_recognises_delta_races_only(exc, concurrent):
    from dp_spark.delta.release_table import is_concurrent_change  # the one check (mirror, _published)

    assert is_concurrent_change(exc) is concurrent
