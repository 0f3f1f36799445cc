"""The write path (reserve, commit) costs O(1) in the number of entries, on SQLite and PostgreSQL.

``reserve`` and ``commit`` verify the budget row, the tail of the chain against its MAC'd head
and the entry they act on, and take ``spent`` from the MAC'd spend summary; ``verify()`` still
checks every entry. Here: an edited old entry is caught by ``verify()`` (and buys no budget),
a tampered head, truncated tail or edited summary is caught by ``reserve``, the summary gives
the same ``spent`` as the whole chain in every window, and the work per call (rows read, MACs
computed; counted, not timed) is the same at 10 and at 1,000 entries.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest

from dp_spark.core.budget import PureDP
from dp_spark.errors import BudgetExceededError, LedgerIntegrityError
from dp_spark.ledger.dialects import Cursor
from dp_spark.ledger.schema import SPEND_PREFIX
from dp_spark.ledger.store import SqlLedger

UTC = timezone.utc
N = 30  # entries in the seeded chain: more than the tail reserve verifies
TAIL = SqlLedger.verify_tail
assert N > TAIL + 5


def reserve(ledger, release_id, charge, *, budget="b", owner="owner-1", **kw):
    return ledger.reserve(budget, release_id, charge, "{}", principal="alice", code_version="v1",
                          release_family="fam", owner_token=owner, **kw)


def _seed(ledger, policy, n=N, *, budget="b", cap=1, charge=None, commit=True):
    """``n`` entries of cap/n each: the budget is exactly spent."""
    ledger.register_budget(policy(budget, cap=cap))
    charge = charge or PureDP(f"{cap}/{n}")
    for i in range(1, n + 1):
        reserve(ledger, f"{budget}-r{i}", charge, budget=budget)
        if commit:
            ledger.commit(f"{budget}-r{i}", "owner-1")


def _no_new_entry(store):
    assert store.raw("SELECT release_id FROM dp_entries WHERE release_id = 'r-new'") == []


# -- (a) an edited OLD entry: the full verify() catches it; it buys nothing -------------------
def test_edited_old_charge_is_caught_by_verify_and_refunds_nothing(ledger_factory, ledger, policy):
    _seed(ledger, policy)
    ledger.verify()
    ledger_factory.drop_guards()
    old = N // 2  # mid-chain, far before the tail the write path checks
    assert old < N - TAIL
    ledger_factory.raw("UPDATE dp_entries SET charge = '{\"epsilon\":\"1/100000\",\"measure\":\"pure_dp\"}' "
                       "WHERE seq = ?", (old,))
    with pytest.raises(LedgerIntegrityError, match=f"budget 'b' seq {old}: row hash mismatch"):
        ledger.verify()
    with pytest.raises(LedgerIntegrityError, match=f"seq {old}"):
        ledger.verify("b")
    with pytest.raises(LedgerIntegrityError):
        ledger.status("b")  # status reads (and verifies) every entry
    # the write path does not read that entry, and spent comes from the MAC'd summary: the
    # "refund" buys nothing
    with pytest.raises(BudgetExceededError) as info:
        reserve(ledger, "r-new", PureDP("1/100"))
    assert info.value.spent == PureDP(1)
    _no_new_entry(ledger_factory)
    # ... and an entry the write path does act on is verified first
    with pytest.raises(LedgerIntegrityError, match=f"seq {old}"):
        reserve(ledger, f"b-r{old}", PureDP(f"1/{N}"))
    with pytest.raises(LedgerIntegrityError, match=f"seq {old}"):
        ledger.commit(f"b-r{old}", "owner-1")


@pytest.mark.parametrize("sql", [
    "UPDATE dp_entries SET state = 'reserved', committed_at = NULL WHERE seq = ?",
    "UPDATE dp_entries SET owner_token = 'mallory' WHERE seq = ?",
    "UPDATE dp_entries SET created_at = '2020-01-01T00:00:00.000000Z' WHERE seq = ?",
], ids=["uncommitted", "owner_stolen", "window_widened"])
def test_other_edits_of_an_old_entry_are_caught_by_verify_and_when_used(ledger_factory, ledger, policy, sql):
    _seed(ledger, policy)
    ledger_factory.drop_guards()
    old = 3
    ledger_factory.raw(sql, (old,))
    with pytest.raises(LedgerIntegrityError, match=f"seq {old}"):
        ledger.verify()
    with pytest.raises(LedgerIntegrityError, match=f"seq {old}"):
        reserve(ledger, f"b-r{old}", PureDP(f"1/{N}"), owner="mallory")
    with pytest.raises(LedgerIntegrityError, match=f"seq {old}"):
        ledger.commit(f"b-r{old}", "mallory")


# -- (b) a tampered head, a truncated or extended tail, an edited summary: reserve refuses ------
def _head_hash(store, seq):
    return store.raw("SELECT row_hash FROM dp_entries WHERE budget_id = 'b' AND seq = ?", (seq,))[0][0]


def _forged_row(seq):
    return ("INSERT INTO dp_entries (budget_id, seq, release_id, release_family, charge, event_json, state, "
            "principal, code_version, owner_token, lease_expires_at, created_at, committed_at, row_hash, "
            f"state_mac) VALUES ('b', {seq}, 'forged', 'fam', '{{\"epsilon\":\"1/100\",\"measure\":\"pure_dp\"}}', "
            "'{}', 'committed', 'mallory', 'v1', 'x', '2026-01-15T12:00:00.000000Z', "
            "'2026-01-15T12:00:00.000000Z', NULL, '" + "ab" * 32 + "', '" + "cd" * 32 + "')")


HEAD_TAMPERING = {
    "head_charge_edited": lambda s: [
        ("UPDATE dp_entries SET charge = '{\"epsilon\":\"1/100000\",\"measure\":\"pure_dp\"}' WHERE seq = ?", (N,))],
    "head_state_edited": lambda s: [
        ("UPDATE dp_entries SET state = 'reserved', committed_at = NULL WHERE seq = ?", (N,))],
    "tail_entry_edited": lambda s: [
        ("UPDATE dp_entries SET charge = '{\"epsilon\":\"1/100000\",\"measure\":\"pure_dp\"}' WHERE seq = ?",
         (N - TAIL + 1,))],
    "tail_truncated": lambda s: [("DELETE FROM dp_entries WHERE seq > ?", (N - 3,))],
    "head_deleted": lambda s: [("DELETE FROM dp_entries WHERE seq = ?", (N,))],
    "whole_tail_truncated": lambda s: [("DELETE FROM dp_entries WHERE seq > ?", (N - TAIL - 3,))],
    "truncated_and_head_moved_back": lambda s: [
        ("DELETE FROM dp_entries WHERE seq > ?", (N - 3,)),
        ("UPDATE dp_budgets SET head_seq = ?, head_hash = ?", (N - 3, _head_hash(s, N - 3)))],
    "row_appended_past_head": lambda s: [(_forged_row(N + 1), ())],
    "summary_total_lowered": lambda s: [
        ("UPDATE dp_ledger_meta SET value = replace(value, '\"total\":{\"epsilon\":\"2\"', "
         "'\"total\":{\"epsilon\":\"1\"') WHERE name = ?", (SPEND_PREFIX + "b",))],
}


@pytest.mark.parametrize("kind", sorted(HEAD_TAMPERING))
def test_tampered_head_or_tail_is_refused_by_reserve(ledger_factory, ledger, policy, kind):
    _seed(ledger, policy, cap=2)  # N entries of 2/N: spent 2
    ledger.accept_policy(policy("b", cap=10), principal="admin", reason="room")  # room left, so only the integrity check can refuse
    ledger.verify()
    ledger_factory.drop_guards()
    for sql, params in HEAD_TAMPERING[kind](ledger_factory):
        ledger_factory.raw(sql, params)
    with pytest.raises(LedgerIntegrityError, match="integrity check failed"):
        reserve(ledger, "r-new", PureDP("1/100"))
    _no_new_entry(ledger_factory)
    with pytest.raises(LedgerIntegrityError):
        ledger.commit(f"b-r{N - 20}", "owner-1")
    with pytest.raises(LedgerIntegrityError, match="integrity check failed"):
        ledger.verify()


def test_a_replayed_or_deleted_summary_falls_back_to_the_whole_chain(ledger_factory, ledger, policy):
    ledger.register_budget(policy("b", cap=1))
    for i in range(1, 11):
        reserve(ledger, f"b-r{i}", PureDP("1/20"))
    name = SPEND_PREFIX + "b"
    (old,) = ledger_factory.raw("SELECT value FROM dp_ledger_meta WHERE name = ?", (name,))[0]
    for i in range(11, 21):
        reserve(ledger, f"b-r{i}", PureDP("1/20"))  # spent: 1 = the cap
    # an old (validly MAC'd) summary put back: it describes an older head, so reserve verifies
    # the whole chain and counts every entry
    ledger_factory.raw("UPDATE dp_ledger_meta SET value = ? WHERE name = ?", (old, name))
    ledger.verify()  # a summary of an older head is not an integrity problem, just stale
    with pytest.raises(BudgetExceededError) as info:
        reserve(ledger, "r-new", PureDP("1/100"))
    assert info.value.spent == PureDP(1)
    ledger_factory.raw("DELETE FROM dp_ledger_meta WHERE name = ?", (name,))
    with pytest.raises(BudgetExceededError):
        reserve(ledger, "r-new", PureDP("1/100"))
    _no_new_entry(ledger_factory)
    ledger.accept_policy(policy("b", cap=2), principal="admin", reason="room")
    reserve(ledger, "r-new", PureDP("1/100"))  # rebuilds the summary at the new head
    (new,) = ledger_factory.raw("SELECT value FROM dp_ledger_meta WHERE name = ?", (name,))[0]
    assert '"seq":21' in new
    ledger.verify()


# -- the summary gives the same spent as the whole chain, in every window ----------------------
@pytest.mark.parametrize("window,days", [("none", None), ("daily", None), ("monthly", None),
                                         ("rolling", 1), ("rolling", 7)])
def test_summary_spent_equals_the_whole_chain(ledger_factory, policy, clock, window, days):
    ledger = ledger_factory(clock=clock)
    ledger.register_budget(policy("b", cap=10**6, window=window, days=days))
    rng = random.Random(f"{window}{days}")
    t0 = datetime(2026, 1, 25, 0, 0, tzinfo=UTC)
    calls = {"summary": 0, "chain": 0}
    real_verified = SqlLedger._verified_entries

    def spy(self, cur, b):
        calls["chain"] += 1
        return real_verified(self, cur, b)

    def check(t):
        def fn(cur):
            b = ledger._load_budget(cur, "b", lock=False)
            got, _ = ledger._window_spent(cur, b, t)
            want, _ = ledger._spent(b.policy, real_verified(ledger, cur, b), t)
            return got, want
        got, want = ledger._run("check", fn, write=False)
        assert got == want, (t, got, want)

    for i in range(120):
        # mostly forward in time with several entries a day; sometimes a skewed clock (backwards
        # or ahead), so the summary must fall back and rebuild correctly
        t = t0 + timedelta(hours=i * 7 + rng.randint(0, 6), minutes=rng.randint(0, 59))
        if rng.random() < 0.05:
            t = t - timedelta(days=rng.randint(1, 10))
        elif rng.random() < 0.05:
            t = t + timedelta(days=rng.randint(1, 3))
        clock.set(t)
        before = calls["chain"]
        SqlLedger._verified_entries = spy
        try:
            reserve(ledger, f"r{i}", PureDP(f"{rng.randint(1, 9)}/1000"))
        finally:
            SqlLedger._verified_entries = real_verified
        if calls["chain"] == before:
            calls["summary"] += 1
        for dt in (timedelta(0), timedelta(hours=5), timedelta(days=1, hours=3), timedelta(days=8)):
            check(t + dt)
    ledger.verify()
    assert calls["summary"] >= 100  # the summary path, not the fallback, answered nearly every reserve


# -- (c) the work per call does not depend on the number of entries (counted, not timed) ------
class _Counter:
    def __init__(self, monkeypatch):
        self.rows = 0
        self.macs = 0
        real_q, real_mac = Cursor.q, SqlLedger._mac

        def q(cur, sql, params=()):
            rows = real_q(cur, sql, params)
            self.rows += len(rows)
            return rows

        def mac(ledger, domain, *parts):
            self.macs += 1
            return real_mac(ledger, domain, *parts)

        monkeypatch.setattr(Cursor, "q", q)
        monkeypatch.setattr(SqlLedger, "_mac", mac)

    def cost(self, fn):
        r0, m0 = self.rows, self.macs
        fn()
        return self.rows - r0, self.macs - m0


@pytest.mark.parametrize("window,days", [("none", None), ("monthly", None), ("rolling", 30)])
def test_reserve_and_commit_cost_does_not_grow_with_entries(ledger_factory, policy, clock, monkeypatch,
                                                            window, days):
    ledger = ledger_factory(clock=clock)
    sizes = {"small": 10, "big": 1000}
    for bid, n in sizes.items():
        ledger.register_budget(policy(bid, cap=10**6, window=window, days=days))
        for i in range(n):  # spread over days, so the summary holds several day totals
            clock.set(datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=(i * 40 * 1000) // n))
            reserve(ledger, f"{bid}-{i}", PureDP("1/1000"), budget=bid)
    clock.set(datetime(2026, 1, 29, 12, 0, tzinfo=UTC))
    counter = _Counter(monkeypatch)
    costs = {}
    for bid in sizes:
        for k in range(3):
            rid = f"{bid}-new-{k}"
            c_reserve = counter.cost(lambda: reserve(ledger, rid, PureDP("1/1000"), budget=bid))
            c_commit = counter.cost(lambda: ledger.commit(rid, "owner-1"))
            c_retry = counter.cost(lambda: reserve(ledger, rid, PureDP("1/1000"), budget=bid))  # cached
            costs[bid, k] = (c_reserve, c_commit, c_retry)
    for k in range(3):
        assert costs["small", k] == costs["big", k], costs
    (rows, macs), (crows, cmacs), _ = costs["big", 2]
    assert rows <= 3 * TAIL and macs <= 3 * TAIL + 10 and crows <= 3 * TAIL and cmacs <= 3 * TAIL + 10, costs
    # the spy does see the whole chain when something reads it
    assert counter.cost(lambda: ledger.verify("big"))[0] > 1000
