"""The ledger contract: every behaviour, on SQLite and on PostgreSQL (same tests)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from fractions import Fraction

import pytest

from dp_spark.core.budget import ApproxDP, PureDP, ZCDP
from dp_spark.errors import (
    BudgetExceededError,
    ConfigError,
    InvalidBudgetError,
    LedgerError,
    MeasureMismatchError,
    ReleaseConflictError,
)
from dp_spark.ledger import ReleaseLimitExceededError, UnknownBudgetError, UnknownReleaseError
from dp_spark.ledger.records import LedgerEntry, PolicyChangedError, Reservation, policy_hash
from dp_spark.ledger.store import Ledger

UTC = timezone.utc
EVENT = json.dumps({"kind": "laplace", "scale": "10"})


def reserve(ledger: Ledger, release_id: str, charge, *, budget: str = "b", owner: str = "owner-1",
            family: str = "fam", **kw) -> Reservation:
    return ledger.reserve(budget, release_id, charge, EVENT, principal="alice", code_version="v1",
                          release_family=family, owner_token=owner, **kw)


# -- register_budget -------------------------------------------------------------------
def test_register_is_idempotent_and_status_starts_empty(ledger, policy, clock):
    p = policy("b", cap=2, window="monthly")
    ledger.register_budget(p)
    ledger.register_budget(p)
    st = ledger.status("b")
    assert st.budget_id == "b" and st.measure == "pure_dp"
    assert st.cap == PureDP(2) and st.spent == PureDP.zero() and st.remaining == PureDP(2)
    assert st.entries == 0
    assert (st.window_start, st.window_end) == (datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 2, 1, tzinfo=UTC))
    assert ledger.get_policy("b") == p
    assert ledger.budget_ids() == ["b"]


def test_register_updates_policy_and_raising_the_cap_is_allowed(ledger, policy):
    ledger.register_budget(policy("b", cap=1))
    reserve(ledger, "r1", PureDP("0.5"))
    with pytest.raises(PolicyChangedError, match="accept-policy --budget b"):
        ledger.register_budget(policy("b", cap=3, max_per_release=1))  # a file edit never applies silently
    assert ledger.status("b").cap == PureDP(1)
    ledger.accept_policy(policy("b", cap=3, max_per_release=1), principal="admin_carol", reason="test")
    ledger.register_budget(policy("b", cap=3, max_per_release=1))  # accepted: the file is the policy again
    assert ledger.status("b").cap == PureDP(3)
    assert ledger.get_policy("b").max_per_release == PureDP(1)
    ledger.accept_policy(policy("b", cap="0.5"), principal="admin_carol", reason="test")  # exactly what is spent: allowed
    assert ledger.status("b").remaining == PureDP.zero()


def test_lowering_the_cap_below_spent_is_refused(ledger, policy):
    ledger.register_budget(policy("b", cap=1))
    reserve(ledger, "r1", PureDP("0.6"))
    with pytest.raises(ConfigError, match="below what is already spent"):
        ledger.accept_policy(policy("b", cap="0.5"), principal="admin_carol", reason="test")
    assert ledger.status("b").cap == PureDP(1)


def test_measure_change_refused_once_there_are_entries(ledger, policy):
    ledger.register_budget(policy("b", cap=1))
    ledger.accept_policy(policy("b", measure="zcdp", cap=1), principal="admin_carol", reason="test")  # no entries yet: allowed
    assert ledger.status("b").measure == "zcdp"
    reserve(ledger, "r1", ZCDP("0.1"))
    with pytest.raises(ConfigError, match="measure cannot change"):
        ledger.accept_policy(policy("b", measure="pure_dp", cap=1), principal="admin_carol", reason="test")


def test_privacy_unit_change_refused_once_bound(ledger, policy):
    ledger.register_budget(policy("b"))
    ledger.bind_dataset("b", "table-uuid-1", "user")
    with pytest.raises(ConfigError, match="privacy unit cannot change"):
        ledger.accept_policy(policy("b", unit="device"), principal="admin_carol", reason="test")


def test_register_needs_a_policy(ledger):
    with pytest.raises(ConfigError):
        ledger.register_budget({"budget_id": "b"})


# -- bind_dataset ------------------------------------------------------------------------
def test_bind_dataset_same_binding_is_a_noop(ledger, policy):
    ledger.register_budget(policy("b"))
    ledger.bind_dataset("b", "delta-table-id-1", "user")
    ledger.bind_dataset("b", "delta-table-id-1", "user")
    assert ledger.bindings() == [("delta-table-id-1", "user", "b")]
    assert ledger.budget_for_dataset("delta-table-id-1", "user") == "b"
    assert ledger.budget_for_dataset("delta-table-id-1", "device") is None


def test_bind_dataset_to_another_budget_is_refused(ledger, policy):
    ledger.register_budget(policy("b"))
    ledger.register_budget(policy("copy_of_b"))
    ledger.bind_dataset("b", "delta-table-id-1", "user")
    with pytest.raises(ConfigError, match="already governed by budget 'b'") as exc:
        ledger.bind_dataset("copy_of_b", "delta-table-id-1", "user")
    # the error says which budget governs the data and how to charge it
    measure = policy("b").measure
    assert f"budget: {{id: b, measure: {measure}," in str(exc.value)
    assert ledger.budget_for_dataset("delta-table-id-1", "user") == "b"


def test_bind_dataset_checks_budget_and_unit(ledger, policy):
    with pytest.raises(UnknownBudgetError, match="'nope'"):
        ledger.bind_dataset("nope", "id", "user")
    ledger.register_budget(policy("b", unit="user"))
    with pytest.raises(ConfigError, match="protects unit 'user'"):
        ledger.bind_dataset("b", "id", "device")


# -- reserve / commit ------------------------------------------------------------------
def test_reserve_appends_and_commit_flips_state(ledger, policy, clock):
    ledger.register_budget(policy("b", cap=1))
    r = reserve(ledger, "r1", PureDP("0.25"), lease_seconds=60)
    assert not r.reused
    e = r.entry
    assert (e.budget_id, e.seq, e.release_id, e.state) == ("b", 1, "r1", "reserved")
    assert e.charge == PureDP(Fraction(1, 4)) and e.event_json == EVENT
    assert (e.principal, e.code_version, e.release_family, e.owner_token) == ("alice", "v1", "fam", "owner-1")
    assert e.created_at == clock.now and e.lease_expires_at == clock.now + timedelta(seconds=60)
    assert e.committed_at is None and len(e.row_hash) == 64
    assert ledger.find("r1") == e
    assert ledger.status("b").spent == PureDP("0.25")  # reserved counts as spent

    clock.advance(seconds=5)
    c = ledger.commit("r1", "owner-1")
    assert c.state == "committed" and c.committed_at == clock.now and c.seq == 1
    assert ledger.find("r1") == c
    assert ledger.commit("r1", "someone-else") == c  # already committed: a no-op
    assert ledger.entries("b") == [c]
    ledger.verify()


def test_committed_release_is_reused_without_a_charge(ledger, policy):
    ledger.register_budget(policy("b", cap=1))
    reserve(ledger, "r1", PureDP("0.5"))
    ledger.commit("r1", "owner-1")
    again = reserve(ledger, "r1", PureDP("0.5"), owner="owner-2")
    assert again.reused and again.entry.state == "committed" and again.entry.owner_token == "owner-1"
    assert ledger.status("b").spent == PureDP("0.5")
    assert len(ledger.entries("b")) == 1


def test_same_owner_retry_takes_its_reservation_back(ledger, policy, clock):
    ledger.register_budget(policy("b", cap=1))
    first = reserve(ledger, "r1", PureDP("0.5"), lease_seconds=30)
    clock.advance(seconds=10)
    again = reserve(ledger, "r1", PureDP("0.5"), lease_seconds=30)
    assert again.reused and again.entry.seq == first.entry.seq
    assert again.entry.lease_expires_at == clock.now + timedelta(seconds=30)  # lease renewed
    assert ledger.status("b").spent == PureDP("0.5")


def test_other_owner_with_live_lease_conflicts_then_takes_over_after_expiry(ledger, policy, clock):
    ledger.register_budget(policy("b", cap=1))
    reserve(ledger, "r1", PureDP("0.5"), owner="A", lease_seconds=60)
    with pytest.raises(ReleaseConflictError, match="reserved by another run"):
        reserve(ledger, "r1", PureDP("0.5"), owner="B")
    with pytest.raises(ReleaseConflictError):
        ledger.commit("r1", "B")
    clock.advance(seconds=60)  # lease_expires_at <= now: expired
    taken = reserve(ledger, "r1", PureDP("0.5"), owner="B", lease_seconds=60)
    assert taken.reused and taken.entry.owner_token == "B"
    with pytest.raises(ReleaseConflictError):  # A lost the reservation
        ledger.commit("r1", "A")
    assert ledger.commit("r1", "B").state == "committed"
    assert ledger.status("b").spent == PureDP("0.5") and len(ledger.entries("b")) == 1
    ledger.verify()


def test_commit_after_own_lease_expired_still_works(ledger, policy, clock):
    ledger.register_budget(policy("b", cap=1))
    reserve(ledger, "r1", PureDP("0.5"), owner="A", lease_seconds=1)
    clock.advance(seconds=5)
    assert ledger.commit("r1", "A").state == "committed"


def test_release_id_keeps_its_charge_and_budget(ledger, policy):
    ledger.register_budget(policy("b", cap=1))
    ledger.register_budget(policy("b2", cap=1, dataset="other"))
    reserve(ledger, "r1", PureDP("0.5"))
    with pytest.raises(ReleaseConflictError, match="different charge"):
        reserve(ledger, "r1", PureDP("0.4"))
    with pytest.raises(ReleaseConflictError, match="under budget 'b'"):
        reserve(ledger, "r1", PureDP("0.5"), budget="b2")


def test_unknown_budget_and_release(ledger):
    with pytest.raises(UnknownBudgetError, match="'ghost'"):
        reserve(ledger, "r1", PureDP("0.1"), budget="ghost")
    with pytest.raises(UnknownBudgetError):
        ledger.status("ghost")
    with pytest.raises(UnknownBudgetError):
        ledger.entries("ghost")
    with pytest.raises(UnknownReleaseError):
        ledger.commit("nope", "owner")
    assert ledger.find("nope") is None
    assert isinstance(UnknownBudgetError("x"), ConfigError)


def test_measure_mismatch(ledger, policy):
    ledger.register_budget(policy("b", measure="zcdp", cap=1))
    with pytest.raises(MeasureMismatchError, match="accounts in zcdp"):
        reserve(ledger, "r1", PureDP("0.1"))
    with pytest.raises(MeasureMismatchError):
        reserve(ledger, "r2", ApproxDP("0.1", "1e-9"))
    assert ledger.entries("b") == []


def test_exhaustion_names_budget_cap_spent_requested(ledger, policy):
    ledger.register_budget(policy("b", cap=1))
    reserve(ledger, "r1", PureDP("0.7"))
    with pytest.raises(BudgetExceededError) as info:
        reserve(ledger, "r2", PureDP("0.4"))
    err = info.value
    assert (err.budget_id, err.cap, err.spent, err.requested) == ("b", PureDP(1), PureDP("0.7"), PureDP("0.4"))
    assert "'b'" in str(err)
    reserve(ledger, "r3", PureDP("0.3"))  # exactly fills the cap
    assert ledger.status("b").remaining == PureDP.zero()
    assert [e.seq for e in ledger.entries("b")] == [1, 2]  # the refused charge left no trace


def test_max_per_release(ledger, policy):
    ledger.register_budget(policy("b", cap=10, max_per_release=1))
    with pytest.raises(ReleaseLimitExceededError, match="per-release maximum") as info:
        reserve(ledger, "r1", PureDP("1.5"))
    assert isinstance(info.value, BudgetExceededError) and info.value.cap == PureDP(1)
    reserve(ledger, "r2", PureDP(1))


def test_approx_dp_budget_checks_both_components(ledger, policy):
    ledger.register_budget(policy("b", measure="approx_dp", cap=(1, "1e-6")))
    reserve(ledger, "r1", ApproxDP("0.5", "1e-6"))
    with pytest.raises(BudgetExceededError):  # epsilon fits, delta does not
        reserve(ledger, "r2", ApproxDP("0.1", "1e-9"))


def test_bad_arguments_are_refused(ledger, policy):
    ledger.register_budget(policy("b", cap=1))
    with pytest.raises(LedgerError, match="valid JSON"):
        ledger.reserve("b", "r1", PureDP("0.1"), "{not json", principal="a", code_version="v",
                       release_family="f", owner_token="o")
    with pytest.raises(LedgerError, match="lease_seconds"):
        reserve(ledger, "r1", PureDP("0.1"), lease_seconds=0)
    with pytest.raises(InvalidBudgetError):
        reserve(ledger, "r1", Fraction(1, 10))
    with pytest.raises(InvalidBudgetError):
        reserve(ledger, "r1", PureDP.zero())
    with pytest.raises(LedgerError, match="release_id"):
        reserve(ledger, "", PureDP("0.1"))
    with pytest.raises(ConfigError, match="timezone-aware"):
        reserve(ledger, "r1", PureDP("0.1"), now=datetime(2026, 1, 1))
    assert ledger.entries("b") == []


def test_entries_are_ordered_per_budget(ledger, policy):
    ledger.register_budget(policy("a", cap=1))
    ledger.register_budget(policy("b", cap=1, dataset="other"))
    for i in range(3):
        reserve(ledger, f"a{i}", PureDP("0.1"), budget="a")
        reserve(ledger, f"b{i}", PureDP("0.1"), budget="b")
    assert [(e.budget_id, e.seq) for e in ledger.entries("a")] == [("a", 1), ("a", 2), ("a", 3)]
    assert [e.release_id for e in ledger.entries()] == ["a0", "a1", "a2", "b0", "b1", "b2"]


def test_latest_committed_of_a_family(ledger, policy, clock):
    ledger.register_budget(policy("b", cap=1))
    assert ledger.latest_committed("fam") is None
    for rid in ("r1", "r2", "r3"):
        reserve(ledger, rid, PureDP("0.1"))
    for rid in ("r2", "r1"):
        clock.advance(seconds=1)
        ledger.commit(rid, "owner-1")
    assert ledger.latest_committed("fam").release_id == "r1"
    assert ledger.latest_committed("fam", budget_id="b").release_id == "r1"
    assert ledger.latest_committed("other") is None


# -- audit -----------------------------------------------------------------------------
def test_audit_is_append_only_and_chained(ledger, clock):
    assert ledger.audit_rows() == []
    a = ledger.append_audit("alice", "publish:official", "dau", "v1", "published", "r1", PureDP("0.5"),
                            {"suppressed_cells": 2})
    clock.advance(seconds=1)
    b = ledger.append_audit("bob", "publish:official", "dau", "v1", "cache_hit", "r1", None, "")
    c = ledger.append_audit("bob", "budget", None, None, "refused_budget", None, '{"epsilon":"1"}', "exhausted")
    rows = ledger.audit_rows()
    assert [r.seq for r in rows] == [1, 2, 3] and rows[0] == a and rows[1] == b and rows[2] == c
    assert a.charge_json == '{"epsilon":"1/2","measure":"pure_dp"}' and a.detail == '{"suppressed_cells":2}'
    assert b.detail is None and b.at == clock.now
    assert ledger.audit_rows(limit=2) == [b, c]
    assert ledger.audit_rows(limit=0) == []
    ledger.verify()
    with pytest.raises(LedgerError):
        ledger.append_audit("", "a", None, None, "d", None, None, None)
    with pytest.raises(LedgerError):
        ledger.append_audit("p", "a", None, None, "d", None, "{bad", None)


# -- lifecycle -------------------------------------------------------------------------
def test_context_manager_closes_and_data_persists(ledger_factory, policy):
    with ledger_factory() as led:
        led.register_budget(policy("b", cap=1))
        reserve(led, "r1", PureDP("0.1"))
    with pytest.raises(LedgerError, match="closed"):
        led.status("b")
    with ledger_factory() as again:
        assert again.find("r1").seq == 1
        again.verify()


def test_wrong_key_is_detected_on_open(ledger_factory, policy):
    with ledger_factory() as led:
        led.register_budget(policy("b"))
    from dp_spark.errors import LedgerIntegrityError
    from dp_spark.ledger import open_ledger

    with pytest.raises(LedgerIntegrityError, match="key does not match"):
        open_ledger(ledger_factory.url, key=b"another key of enough length!!")


def test_find_returns_entry_dataclass(ledger, policy):
    ledger.register_budget(policy("b", cap=1))
    r = reserve(ledger, "r1", PureDP("0.1"))
    assert isinstance(r.entry, LedgerEntry) and isinstance(r, Reservation)


# -- Delta mirror (Spark) --------------------------------------------------------------
@pytest.mark.spark
def test_mirror_to_delta(ledger, policy, spark, tmp_path):
    from dp_spark.delta.mirror import mirror_to_delta

    ledger.register_budget(policy("b", measure="zcdp", cap=1))
    reserve(ledger, "r1", ZCDP("0.125"))
    reserve(ledger, "r2", ZCDP("0.25"))
    ledger.commit("r1", "owner-1")
    ledger.append_audit("alice", "publish:official", "dau", "v1", "published", "r1", ZCDP("0.125"), None)
    lpath, apath = str(tmp_path / "ledger_mirror"), str(tmp_path / "audit_mirror")
    assert mirror_to_delta(ledger, spark, ledger_path=lpath, audit_path=apath) == (2, 1)
    reserve(ledger, "r3", ZCDP("0.25"))
    # a refresh copies what changed: the new entry only (r2, still reserved, is unchanged)
    assert mirror_to_delta(ledger, spark, ledger_path=lpath, audit_path=apath) == (1, 0)
    assert mirror_to_delta(ledger, spark, ledger_path=lpath, audit_path=apath) == (0, 0)
    df = spark.read.format("delta").load(lpath)
    rows = {r["release_id"]: r for r in df.collect()}
    assert set(rows) == {"r1", "r2", "r3"}
    assert rows["r1"]["state"] == "committed" and rows["r2"]["state"] == "reserved"
    assert rows["r1"]["rho"] == 0.125 and rows["r1"]["charge"] == '{"measure":"zcdp","rho":"1/8"}'
    assert rows["r1"]["epsilon"] is None and rows["r1"]["seq"] == 1
    audit = spark.read.format("delta").load(apath).collect()
    assert [(a["seq"], a["decision"]) for a in audit] == [(1, "published")]
    # r2 settles: the row the mirror shows as reserved changed, so the table is rewritten
    ledger.commit("r2", "owner-1")
    ledger.append_audit("alice", "publish:official", "dau", "v1", "published", "r2", ZCDP("0.25"), None)
    assert mirror_to_delta(ledger, spark, ledger_path=lpath, audit_path=apath) == (3, 1)
    rows = {r["release_id"]: r["state"] for r in spark.read.format("delta").load(lpath).collect()}
    assert rows == {"r1": "committed", "r2": "committed", "r3": "reserved"}
    assert [a["seq"] for a in spark.read.format("delta").load(apath).orderBy("seq").collect()] == [1, 2]


# -- what changed since a watermark (the mirror's incremental refresh) -------------------
def test_entries_since_and_audit_rows_since(ledger, policy):
    ledger.register_budget(policy("b", cap=10))
    ledger.register_budget(policy("c", cap=10))
    for i in range(1, 6):
        reserve(ledger, f"b{i}", PureDP("0.1"))
    reserve(ledger, "c1", PureDP("0.1"), budget="c")
    for i in range(3):
        ledger.append_audit("alice", "publish", "dau", "v1", "published", f"b{i + 1}", None, None)
    new, heads = ledger.entries_since({"b": 3})
    assert heads == {"b": 5, "c": 1}
    assert [(e.budget_id, e.seq) for e in new] == [("b", 4), ("b", 5), ("c", 1)]
    assert ledger.entries_since({"b": 5, "c": 1}) == ([], {"b": 5, "c": 1})
    assert [e.release_id for e in ledger.entries_since({})[0]] == ["b1", "b2", "b3", "b4", "b5", "c1"]
    assert ledger.entries_since({"b": 9})[1]["b"] == 5  # past the head: nothing, and the head tells
    rows, head = ledger.audit_rows_since(1)
    assert head == 3 and [a.seq for a in rows] == [2, 3]
    assert ledger.audit_rows_since(3) == ([], 3) and [a.seq for a in ledger.audit_rows_since(0)[0]] == [1, 2, 3]
    with pytest.raises(LedgerError):
        ledger.audit_rows_since(-1)


# -- policy history (issue 13, item 15) --------------------------------------------------
def test_policy_history_records_registration_and_accepted_changes(ledger, policy):
    p1 = policy("b", cap=1)
    ledger.register_budget(p1)
    ledger.register_budget(p1)  # unchanged: nothing new recorded
    (v1,) = ledger.policy_history("b")
    assert (v1.version, v1.policy_hash, v1.changes) == (1, policy_hash(p1), ())
    assert v1.policy["cap"] == {"epsilon": "1", "measure": "pure_dp"}
    reserve(ledger, "r1", PureDP("0.5"))

    p2 = policy("b", cap=2)
    with pytest.raises(PolicyChangedError) as ei:
        ledger.register_budget(p2)
    assert "'b'" in str(ei.value) and "cap:" in str(ei.value) and 'accept-policy --budget b --reason' in str(ei.value)
    assert len(ledger.policy_history("b")) == 1 and ledger.status("b").cap == PureDP(1)
    audit_before = len(ledger.audit_rows())

    rec = ledger.accept_policy(p2, principal="admin_carol", reason="yearly review")
    assert rec.version == 2 and rec.policy_hash == policy_hash(p2)
    assert rec.changes == ('cap: {"epsilon":"1","measure":"pure_dp"} -> {"epsilon":"2","measure":"pure_dp"}',)
    assert ledger.accept_policy(p2, principal="admin_carol", reason="again") is None  # nothing to accept
    ledger.register_budget(p2)
    assert ledger.status("b").cap == PureDP(2)
    hist = ledger.policy_history("b")
    assert [(h.version, h.principal, h.reason) for h in hist] == [
        (1, "dp_spark", "first registration of the budget"), (2, "admin_carol", "yearly review")]
    assert hist[1].changes == rec.changes
    (row,) = ledger.audit_rows()[audit_before:]
    assert (row.principal, row.action, row.decision) == ("admin_carol", "admin", "policy_accepted")
    detail = json.loads(row.detail)
    assert detail["budget_id"] == "b" and detail["to"] == policy_hash(p2) and detail["from"] == policy_hash(p1)
    ledger.verify()
    ledger.verify("b")


# -- status(full=False): the O(1) status of a release's result (issue 15) ---------------------
@pytest.mark.parametrize("window,days", [("none", None), ("daily", None), ("monthly", None), ("rolling", 3)])
def test_quick_status_equals_the_full_status(ledger, policy, clock, window, days):
    import random

    rng = random.Random(f"{window}{days}")
    ledger.register_budget(policy("b", cap=1000, window=window, days=days))
    for i in range(40):
        reserve(ledger, f"r{i}", PureDP(f"{rng.randint(1, 9)}/100"))
        if rng.random() < 0.7:
            ledger.commit(f"r{i}", "owner-1")
        clock.advance(hours=rng.choice([1, 5, 13, 30]))
        for probe in (clock.now, clock.now + timedelta(hours=7)):
            assert ledger.status("b", probe, full=False) == ledger.status("b", probe), (i, probe)


# -- the version record of release families --------------------------------------------
def _states(ledger, family):
    return [(v.version_no, v.release_id, v.state) for v in ledger.versions(family)]


def test_versions_publish_supersede_and_are_idempotent_per_release(ledger, policy, clock):
    from dp_spark.ledger.records import VersionRecord

    ledger.register_budget(policy("b", cap=1))
    reserve(ledger, "r1", PureDP("0.1"))
    assert ledger.versions() == [] and ledger.versions_snapshot() == (0, [])
    assert ledger.record_versions([("dau", "r1")], "bob") == [1]
    v = ledger.versions("dau")[0]
    assert isinstance(v, VersionRecord) and (v.state, v.principal, v.at, v.changed_by, v.changed_at) == (
        "current", "bob", clock.now, None, None)
    clock.advance(seconds=5)
    assert ledger.record_versions([("dau", "r2")], "carol") == [2]
    assert _states(ledger, "dau") == [(1, "r1", "superseded"), (2, "r2", "current")]
    old = ledger.versions("dau")[0]
    assert (old.changed_by, old.changed_at) == ("carol", clock.now)
    seq = ledger.versions_snapshot()[0]
    # a rerun (cache hit) of either release changes nothing, not even the change count
    assert ledger.record_versions([("dau", "r1"), ("dau", "r2")], "bob") == [1, 2]
    assert _states(ledger, "dau") == [(1, "r1", "superseded"), (2, "r2", "current")]
    assert ledger.versions_snapshot()[0] == seq
    # a batch, in order: each new release supersedes the one before, per family
    assert ledger.record_versions([("aov", "a1"), ("dau", "r3"), ("aov", "a2"), ("dau", "r2")], "bob") == [1, 3, 2, 2]
    assert _states(ledger, "aov") == [(1, "a1", "superseded"), (2, "a2", "current")]
    assert _states(ledger, "dau")[-1] == (3, "r3", "current")
    assert ledger.versions_snapshot()[0] == seq + 1  # one transaction, one change
    assert [v.family for v in ledger.versions()] == ["aov", "aov", "dau", "dau", "dau"]
    assert ledger.record_versions([], "bob") == []
    with pytest.raises(LedgerError):
        ledger.record_versions([("", "r9")], "bob")


def test_withdraw_restores_the_previous_version_and_a_withdrawn_release_stays_out(ledger, clock):
    for rid in ("r1", "r2", "r3"):
        ledger.record_versions([("dau", rid)], "bob")
    clock.advance(minutes=1)
    assert ledger.withdraw_version("dau", "admin_carol", "wrong filter") == ("r3", "r2")
    assert _states(ledger, "dau") == [(1, "r1", "superseded"), (2, "r2", "current"), (3, "r3", "withdrawn")]
    w = ledger.versions("dau")[2]
    assert (w.reason, w.changed_by, w.changed_at) == ("wrong filter", "admin_carol", clock.now)
    assert ledger.record_versions([("dau", "r3")], "bob") == [3]  # a rerun does not bring it back
    assert ledger.versions("dau")[2].state == "withdrawn"
    assert ledger.withdraw_version("dau", "admin_carol", "again") == ("r2", "r1")
    assert ledger.withdraw_version("dau", "admin_carol", "again") == ("r1", None)
    with pytest.raises(ConfigError, match="no current version"):
        ledger.withdraw_version("dau", "admin_carol", "nothing left")
    with pytest.raises(ConfigError, match="no current version"):
        ledger.withdraw_version("never", "admin_carol", "x")
    assert ledger.record_versions([("dau", "r4")], "bob") == [4]
    assert [v.state for v in ledger.versions("dau")] == ["withdrawn"] * 3 + ["current"]


def test_versions_are_macd_and_guarded(ledger_factory, clock):
    from dp_spark.errors import LedgerIntegrityError

    led = ledger_factory(clock=clock)
    led.record_versions([("dau", "r1")], "bob")
    led.record_versions([("dau", "r2")], "bob")
    for sql in ("DELETE FROM dp_versions", "UPDATE dp_versions SET release_id = 'rX' WHERE version_no = 1",
                "UPDATE dp_versions SET state = 'current' WHERE version_no = 1"):
        with pytest.raises(Exception):  # the guards, or the one-current index
            ledger_factory.raw(sql)
    led.withdraw_version("dau", "admin_carol", "x")  # r2 withdrawn, r1 current
    with pytest.raises(Exception):
        ledger_factory.raw("UPDATE dp_versions SET state = 'superseded' WHERE version_no = 2")
    ledger_factory.drop_guards()  # an insider: the MAC still tells
    led.verify()
    ledger_factory.raw("UPDATE dp_versions SET principal = 'mallory' WHERE version_no = 1")
    with pytest.raises(LedgerIntegrityError, match="version 1 of family 'dau'"):
        led.versions("dau")
    with pytest.raises(LedgerIntegrityError, match="version 1 of family 'dau' edited"):
        led.verify()


def _older_ledger_without(ledger_factory, policy, table: str) -> None:
    """A ledger of a previous dp_spark, before ``table`` existed: release r1 charged, ``table``
    dropped (its index and guards go with it)."""
    with ledger_factory() as led:
        led.register_budget(policy("b", cap=1))
        reserve(led, "r1", PureDP("0.1"))
    ledger_factory.raw(f"DROP TABLE {table}")


def test_an_older_ledger_gains_the_version_record_on_open(ledger_factory, policy):
    _older_ledger_without(ledger_factory, policy, "dp_versions")
    with ledger_factory() as led:
        led.verify()
        assert led.find("r1").seq == 1 and led.versions() == []
        assert led.record_versions([("fam", "r1")], "bob") == [1]
    with ledger_factory() as led:  # and opens again as it is
        assert _states(led, "fam") == [(1, "r1", "current")]
    with pytest.raises(Exception):
        ledger_factory.raw("DELETE FROM dp_versions")  # guarded as in a new ledger


# -- versions keyed by day (a series) -----------------------------------------------------
def _keyed(ledger, family):
    return [(v.version_no, v.series_key, v.state) for v in ledger.versions(family)]


def test_a_series_keeps_every_day_current_and_rolls_back_per_day(ledger, clock):
    d1, d2 = "2026-11-01", "2026-11-02"
    assert ledger.record_versions([("s", "a1", d1), ("s", "a2", d2), ("other", "o1"), ("other", "o2")], "bob") == \
        [1, 2, 1, 2]
    assert _keyed(ledger, "s") == [(1, d1, "current"), (2, d2, "current")]
    assert _keyed(ledger, "other") == [(1, None, "superseded"), (2, None, "current")]  # not a series: as before
    assert ledger.record_versions([("s", "b1", d1), ("s", "a2", d2)], "bob") == [3, 2]  # day 1 re-published
    assert _keyed(ledger, "s") == [(1, d1, "superseded"), (2, d2, "current"), (3, d1, "current")]
    # a day's rollback restores that day's earlier version, never another day's
    assert ledger.withdraw_version("s", "admin_carol", "bad day 2", series_key=d2) == ("a2", None)
    assert ledger.withdraw_version("s", "admin_carol", "bad input") == ("b1", "a1")  # the latest current
    assert _keyed(ledger, "s") == [(1, d1, "current"), (2, d2, "withdrawn"), (3, d1, "withdrawn")]
    with pytest.raises(ConfigError, match="no current version for that key"):
        ledger.withdraw_version("s", "admin_carol", "x", series_key=d2)
    ledger.verify()


def test_version_keys_are_macd_and_guarded(ledger_factory, clock):
    from dp_spark.errors import LedgerIntegrityError

    led = ledger_factory(clock=clock)
    led.record_versions([("s", "a1", "2026-11-01"), ("s", "b1", "2026-11-01"), ("s", "a2", "2026-11-02")], "bob")
    for sql in ("UPDATE dp_versions SET series_key = '2026-11-03' WHERE version_no = 3",
                "UPDATE dp_versions SET state = 'current' WHERE version_no = 1"):  # the guard, the index
        with pytest.raises(Exception):
            ledger_factory.raw(sql)
    ledger_factory.drop_guards()  # an insider: the MAC still tells
    ledger_factory.raw("UPDATE dp_versions SET series_key = '2026-11-03' WHERE version_no = 3")
    with pytest.raises(LedgerIntegrityError, match="version 3 of family 's' edited"):
        led.verify()


def test_an_older_ledger_gains_version_keys_on_open(ledger_factory, policy):
    """A ledger of a previous dp_spark (before migration 5): its versions (no key) verify and
    keep their states; new versions of a series are keyed; guarded as in a new ledger."""
    with ledger_factory() as led:
        led.record_versions([("fam", "r1"), ("fam", "r2")], "bob")
    ledger_factory.drop_guards()
    ledger_factory.raw("DROP INDEX dp_versions_one_current_key")
    ledger_factory.raw("ALTER TABLE dp_versions DROP COLUMN series_key")
    ledger_factory.raw("CREATE UNIQUE INDEX dp_versions_one_current ON dp_versions (family) WHERE state = 'current'")
    with ledger_factory() as led:
        led.verify()
        assert _keyed(led, "fam") == [(1, None, "superseded"), (2, None, "current")]
        assert led.record_versions([("s", "d1", "2026-11-01"), ("s", "d2", "2026-11-02"), ("fam", "r3")], "bob") == \
            [1, 2, 3]
    with ledger_factory() as led:  # and opens again as it is
        assert _keyed(led, "s") == [(1, "2026-11-01", "current"), (2, "2026-11-02", "current")]
        assert _keyed(led, "fam") == [(1, None, "superseded"), (2, None, "superseded"), (3, None, "current")]
        led.verify()
    with pytest.raises(Exception):
        ledger_factory.raw("UPDATE dp_versions SET series_key = 'x' WHERE family = 's'")  # guarded
    with pytest.raises(Exception):
        ledger_factory.raw("DELETE FROM dp_versions")


# -- input fingerprints (dp_fingerprints) ---------------------------------------------------
FP = "ab" * 32


def test_a_fingerprint_is_recorded_once_for_a_charged_release(ledger, policy):
    ledger.register_budget(policy("b", cap=1))
    reserve(ledger, "r1", PureDP("0.1"))
    assert ledger.fingerprint("r1") is None  # recorded before fingerprints, or not yet
    assert ledger.record_fingerprint("r1", FP) is True
    assert ledger.record_fingerprint("r1", "cd" * 32) is False  # written once: the first is kept
    assert ledger.fingerprint("r1") == FP
    with pytest.raises(UnknownReleaseError):
        ledger.record_fingerprint("never-charged", FP)
    with pytest.raises(LedgerError) as err:
        ledger.record_fingerprint("r1", "")
    assert FP not in str(err.value)
    ledger.verify()
    # the fingerprint is the ledger's own: not in the entries, the audit rows or their mirror
    assert all(FP not in repr(e) for e in ledger.entries()) and all(FP not in repr(a) for a in ledger.audit_rows())


def test_fingerprints_are_macd_and_guarded(ledger_factory, policy, clock):
    from dp_spark.errors import LedgerIntegrityError

    led = ledger_factory(clock=clock)
    led.register_budget(policy("b", cap=1))
    reserve(led, "r1", PureDP("0.1"))
    led.record_fingerprint("r1", FP)
    for sql in ("DELETE FROM dp_fingerprints", "UPDATE dp_fingerprints SET fingerprint = 'x'"):
        with pytest.raises(Exception):
            ledger_factory.raw(sql)
    ledger_factory.drop_guards()  # an insider: the MAC still tells
    led.verify()
    ledger_factory.raw("UPDATE dp_fingerprints SET fingerprint = ? WHERE release_id = 'r1'", ("cd" * 32,))
    with pytest.raises(LedgerIntegrityError, match="input fingerprint of release 'r1'") as err:
        led.fingerprint("r1")
    assert FP not in str(err.value) and "cd" * 32 not in str(err.value)
    with pytest.raises(LedgerIntegrityError, match="input fingerprint of release 'r1' edited"):
        led.verify()


def test_an_older_ledger_gains_the_fingerprints_on_open(ledger_factory, policy):
    _older_ledger_without(ledger_factory, policy, "dp_fingerprints")
    with ledger_factory() as led:
        led.verify()
        assert led.fingerprint("r1") is None  # a release recorded before fingerprints
        assert led.record_fingerprint("r1", FP) is True
    with ledger_factory() as led:
        assert led.fingerprint("r1") == FP
    with pytest.raises(Exception):
        ledger_factory.raw("DELETE FROM dp_fingerprints")  # guarded as in a new ledger


def test_import_versions_adopts_a_history_once(ledger, clock):
    from dp_spark.ledger.records import VersionRecord

    t = clock.now
    old = [VersionRecord("dau", 1, "r1", "withdrawn", "bad", "bob", t, "carol", t),
           VersionRecord("dau", 2, "r2", "current", None, "bob", t, None, None)]
    assert ledger.import_versions(old) is True
    assert ledger.versions("dau") == old and ledger.versions_snapshot()[0] == 1
    assert ledger.import_versions([VersionRecord("aov", 1, "a1", "current", None, "bob", t, None, None)]) is False
    assert ledger.record_versions([("dau", "r3")], "bob") == [3]
    with pytest.raises(LedgerError):
        ledger.import_versions([VersionRecord("x", 1, "r", "bogus", None, "bob", t, None, None)])


def test_concurrent_version_records_leave_one_current_and_distinct_numbers(ledger_factory, policy):
    import threading

    with ledger_factory() as led:
        led.register_budget(policy("b", cap=10))
        for i in range(8):
            reserve(led, f"c{i}", PureDP("0.1"), owner=f"o{i}")
    ledgers = [ledger_factory() for _ in range(4)]
    errors: list[BaseException] = []

    def run(k):
        try:
            for j in range(2):
                ledgers[k].record_versions([("fam", f"c{2 * k + j}")], f"p{k}")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    vs = ledgers[0].versions("fam")
    assert sorted(v.version_no for v in vs) == list(range(1, 9))
    assert sorted(v.release_id for v in vs) == [f"c{i}" for i in range(8)]
    assert sum(v.state == "current" for v in vs) == 1 and vs[-1].state == "current"
    assert ledgers[0].versions_snapshot()[0] == 8
