"""The noisy nodes of streams (``dp_stream_nodes``, migration 6), on SQLite and PostgreSQL:
written once under the stream's ledger entry (a node another run stored first keeps its value),
MAC'd, guarded against update and delete, checked by verify, added to an older ledger on open,
and never in a message, an entry, an audit row."""

from __future__ import annotations

import json

import pytest

from dp_spark.core.budget import PureDP
from dp_spark.errors import LedgerError, LedgerIntegrityError
from dp_spark.ledger.migrations import MIGRATIONS
from dp_spark.ledger.records import UnknownReleaseError

EVENT = json.dumps({"type": "composed", "children": []})
SECRET = 987654321  # a node value that must never appear in text


def _charge(led, sid: str = "stream-1") -> None:
    led.reserve("b", sid, PureDP("0.5"), EVENT, principal="alice", code_version="v1", release_family="fam",
                owner_token="o1")


def test_nodes_are_written_once_and_the_first_value_is_kept(ledger, policy):
    ledger.register_budget(policy("b", cap=1))
    _charge(ledger)
    assert ledger.stream_nodes("stream-1", "rows") == {}
    first = {(0, 0): SECRET, (0, 1): -3, (1, 0): 12}
    assert ledger.record_stream_nodes("stream-1", "rows", first) == first
    # a second run offering other noises for the same nodes gets the stored ones back
    again = ledger.record_stream_nodes("stream-1", "rows", {(0, 1): 99, (0, 2): 7})
    assert again == {(0, 1): -3, (0, 2): 7}
    assert ledger.stream_nodes("stream-1", "rows") == {**first, (0, 2): 7}
    assert ledger.stream_nodes("stream-1", "sum:x") == {}  # per component
    with pytest.raises(UnknownReleaseError):
        ledger.record_stream_nodes("never-charged", "rows", {(0, 0): 1})
    with pytest.raises(LedgerError) as err:
        ledger.record_stream_nodes("stream-1", "rows", {(0, 0): str(SECRET)})
    assert str(SECRET) not in str(err.value)
    ledger.verify()
    assert all(str(SECRET) not in repr(e) for e in ledger.entries())
    assert all(str(SECRET) not in repr(a) for a in ledger.audit_rows())


def test_nodes_are_macd_and_guarded(ledger_factory, policy, clock):
    led = ledger_factory(clock=clock)
    led.register_budget(policy("b", cap=1))
    _charge(led)
    led.record_stream_nodes("stream-1", "rows", {(0, 0): SECRET})
    for sql in ("DELETE FROM dp_stream_nodes", "UPDATE dp_stream_nodes SET value = '0'"):
        with pytest.raises(Exception, match="written once|append-only"):
            ledger_factory.raw(sql)
    ledger_factory.drop_guards()  # an insider: the MAC still tells
    led.verify()
    ledger_factory.raw("UPDATE dp_stream_nodes SET value = '5' WHERE stream_id = 'stream-1'")
    with pytest.raises(LedgerIntegrityError, match="node of stream 'stream-1'") as err:
        led.stream_nodes("stream-1", "rows")
    assert str(SECRET) not in str(err.value) and "'5'" not in str(err.value)
    with pytest.raises(LedgerIntegrityError, match="node of stream 'stream-1' edited"):
        led.verify()


def test_an_older_ledger_gains_the_stream_nodes_on_open(ledger_factory, policy):
    assert [m.number for m in MIGRATIONS][-1] == 6  # numbered 6; the runner reads tables, not numbers
    with ledger_factory() as led:
        led.register_budget(policy("b", cap=1))
        _charge(led)
    ledger_factory.raw("DROP TABLE dp_stream_nodes")
    with ledger_factory() as led:
        led.verify()
        assert led.stream_nodes("stream-1", "rows") == {}
        assert led.record_stream_nodes("stream-1", "rows", {(2, 0): 4}) == {(2, 0): 4}
    with pytest.raises(Exception, match="written once|append-only"):
        ledger_factory.raw("DELETE FROM dp_stream_nodes")  # guarded as in a new ledger
