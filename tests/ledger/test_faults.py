"""Faults (RELIABILITY "Ledger and faults"), on SQLite and PostgreSQL.

A run killed between reserve and commit, windows under an injected clock, exact arithmetic,
tampering by raw SQL, a database that is down, a cap lowered below spent, a copied config.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import sqlite3
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from dp_spark.core.budget import PureDP, ZCDP
from dp_spark.errors import (
    BudgetExceededError,
    ConfigError,
    LedgerIntegrityError,
    LedgerUnavailableError,
    ReleaseConflictError,
)
from dp_spark.ledger import open_ledger
from dp_spark.ledger.policy import load_policies

UTC = timezone.utc
T0 = datetime(2026, 1, 15, 12, 0, tzinfo=UTC)
REPO = Path(__file__).resolve().parents[2]


def reserve(ledger, release_id, charge, *, owner="owner-1", budget="b", **kw):
    return ledger.reserve(budget, release_id, charge, "{}", principal="alice", code_version="v1",
                          release_family="fam", owner_token=owner, **kw)


# -- a run killed between reserve and commit -------------------------------------------
def _reserve_then_die(url: str, key, now_iso: str, how: str) -> None:
    ledger = open_ledger(url, key=key)
    reserve(ledger, "r-crash", PureDP("0.5"), owner="dead-run", lease_seconds=300,
            now=datetime.fromisoformat(now_iso))
    # the noisy values would be computed here; they never leave memory before the write
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(3)


@pytest.mark.parametrize("how", ["sigkill", "os_exit"])
def test_killed_run_is_resumed_after_lease_expiry_without_second_charge(ledger_factory, policy, clock, how):
    ledger = ledger_factory(clock=clock)
    ledger.register_budget(policy("b", cap=1))
    ctx = multiprocessing.get_context("spawn")
    p = ctx.Process(target=_reserve_then_die, args=(ledger_factory.url, ledger_factory.key, T0.isoformat(), how))
    p.start()
    p.join(timeout=120)
    assert p.exitcode == (-signal.SIGKILL if how == "sigkill" else 3)

    clock.set(T0 + timedelta(seconds=10))
    assert ledger.status("b").spent == PureDP("0.5")  # the reservation survived the crash
    with pytest.raises(ReleaseConflictError):  # its lease is still live
        reserve(ledger, "r-crash", PureDP("0.5"), owner="rerun")
    clock.set(T0 + timedelta(seconds=301))
    r = reserve(ledger, "r-crash", PureDP("0.5"), owner="rerun")
    assert r.reused and r.entry.seq == 1 and r.entry.owner_token == "rerun"
    assert ledger.commit("r-crash", "rerun").state == "committed"
    st = ledger.status("b")
    assert st.spent == PureDP("0.5") and st.entries == 1
    assert len(ledger.entries("b")) == 1
    ledger.verify()


def test_killed_after_write_is_healed_by_commit_of_found_entry(ledger_factory, policy, clock):
    """The engine found its release already written: it commits the stored reservation."""
    ledger = ledger_factory(clock=clock)
    ledger.register_budget(policy("b", cap=1))
    ctx = multiprocessing.get_context("spawn")
    p = ctx.Process(target=_reserve_then_die, args=(ledger_factory.url, ledger_factory.key, T0.isoformat(), "sigkill"))
    p.start()
    p.join(timeout=120)
    entry = ledger.find("r-crash")
    assert entry is not None and entry.state == "reserved"
    assert ledger.commit("r-crash", entry.owner_token).state == "committed"
    assert reserve(ledger, "r-crash", PureDP("0.5"), owner="next-run").reused  # a cache hit now
    assert ledger.status("b").spent == PureDP("0.5") and len(ledger.entries("b")) == 1


# -- windows under an injected clock ----------------------------------------------------
def test_daily_window_expires_and_renews(ledger, policy, clock):
    ledger.register_budget(policy("b", cap=1, window="daily"))
    reserve(ledger, "d1", PureDP(1))
    clock.set(datetime(2026, 1, 15, 23, 59, 59, 999999, tzinfo=UTC))
    with pytest.raises(BudgetExceededError):
        reserve(ledger, "d1b", PureDP("0.001"))
    clock.set(datetime(2026, 1, 16, tzinfo=UTC))
    st = ledger.status("b")
    assert st.spent == PureDP.zero() and (st.window_start, st.window_end) == (
        datetime(2026, 1, 16, tzinfo=UTC), datetime(2026, 1, 17, tzinfo=UTC))
    reserve(ledger, "d2", PureDP(1))
    assert [e.seq for e in ledger.entries("b")] == [1, 2]  # the log keeps everything


def test_monthly_window_expires_and_renews_across_year_end(ledger, policy, clock):
    ledger.register_budget(policy("b", cap=1, window="monthly"))
    clock.set(datetime(2026, 12, 1, tzinfo=UTC))
    reserve(ledger, "m1", PureDP(1))
    clock.set(datetime(2026, 12, 31, 23, 59, tzinfo=UTC))
    with pytest.raises(BudgetExceededError):
        reserve(ledger, "m1b", PureDP("0.5"))
    clock.set(datetime(2027, 1, 1, tzinfo=UTC))
    assert ledger.status("b").window_start == datetime(2027, 1, 1, tzinfo=UTC)
    reserve(ledger, "m2", PureDP(1))


def test_rolling_7_day_window(ledger, policy, clock):
    ledger.register_budget(policy("b", cap=1, window="rolling", days=7))
    reserve(ledger, "w1", PureDP("0.6"))  # at T0
    clock.set(T0 + timedelta(days=3))
    reserve(ledger, "w2", PureDP("0.4"))
    clock.set(T0 + timedelta(days=7))  # w1 is exactly 7 days old: still inside
    with pytest.raises(BudgetExceededError):
        reserve(ledger, "w3", PureDP("0.1"))
    clock.set(T0 + timedelta(days=7, microseconds=1))  # w1 left the window
    st = ledger.status("b")
    assert st.spent == PureDP("0.4") and st.entries == 1
    reserve(ledger, "w3", PureDP("0.6"))
    with pytest.raises(BudgetExceededError):
        reserve(ledger, "w4", PureDP("0.1"))
    clock.set(T0 + timedelta(days=10, microseconds=1))  # w2 left too
    assert ledger.status("b").spent == PureDP("0.6")


def test_no_window_never_renews(ledger, policy, clock):
    ledger.register_budget(policy("b", cap=1, window="none"))
    reserve(ledger, "n1", PureDP(1))
    clock.advance(days=3650)
    st = ledger.status("b")
    assert st.spent == PureDP(1) and st.window_start is None and st.window_end is None
    with pytest.raises(BudgetExceededError):
        reserve(ledger, "n2", PureDP("0.001"))


def test_cap_lowered_in_a_new_window_is_allowed(ledger, policy, clock):
    ledger.register_budget(policy("b", cap=1, window="daily"))
    reserve(ledger, "d1", PureDP("0.8"))
    with pytest.raises(ConfigError, match="below what is already spent"):
        ledger.accept_policy(policy("b", cap="0.5", window="daily"), principal="admin_carol", reason="t")
    clock.advance(days=1)
    ledger.accept_policy(policy("b", cap="0.5", window="daily"), principal="admin_carol", reason="t")
    assert ledger.status("b").cap == PureDP("0.5")


# -- exact arithmetic --------------------------------------------------------------------
def test_point_one_plus_point_two_fits_point_three(ledger, policy):
    ledger.register_budget(policy("b", cap=0.3))
    reserve(ledger, "x1", PureDP(0.1))
    reserve(ledger, "x2", PureDP(0.2))
    st = ledger.status("b")
    assert st.spent == PureDP("0.3") and st.remaining == PureDP.zero()
    with pytest.raises(BudgetExceededError):
        reserve(ledger, "x3", PureDP("1e-12"))


def test_zcdp_thirds_are_exact(ledger, policy):
    ledger.register_budget(policy("b", measure="zcdp", cap=1))
    for i in range(3):
        reserve(ledger, f"t{i}", ZCDP("1/3"))
    assert ledger.status("b").spent == ZCDP(1)


# -- tampering: refused by triggers, detected by the HMAC chain --------------------------
def _seed(ledger, policy):
    ledger.register_budget(policy("b", cap=1))
    ledger.bind_dataset("b", "delta-id", "user")
    reserve(ledger, "r1", PureDP("0.5"))
    ledger.commit("r1", "owner-1")
    reserve(ledger, "r2", PureDP("0.25"))
    ledger.append_audit("alice", "publish", "dau", "v1", "published", "r1", None, None)
    ledger.verify()


def _raw_error(store):
    if store.kind == "sqlite":
        return sqlite3.DatabaseError
    import psycopg

    return psycopg.Error


def test_direct_update_and_delete_are_refused_by_the_schema(ledger_factory, ledger, policy):
    _seed(ledger, policy)
    err = _raw_error(ledger_factory)
    for sql in (
        "UPDATE dp_entries SET charge = '{\"epsilon\":\"1/100\",\"measure\":\"pure_dp\"}' WHERE seq = 1",
        "DELETE FROM dp_entries WHERE seq = 2",
        "UPDATE dp_entries SET state = 'reserved' WHERE seq = 1",
        "DELETE FROM dp_audit",
        "DELETE FROM dp_bindings",
        "DELETE FROM dp_budgets",
    ):
        with pytest.raises(err):
            ledger_factory.raw(sql)
    ledger.verify()
    assert ledger.status("b").spent == PureDP("0.75")


_FORGED = ("INSERT INTO dp_entries (budget_id, seq, release_id, release_family, charge, event_json, state, "
           "principal, code_version, owner_token, lease_expires_at, created_at, committed_at, row_hash, state_mac) "
           "VALUES ('b', 3, 'forged', 'fam', '{\"epsilon\":\"1/100\",\"measure\":\"pure_dp\"}', '{}', 'committed', "
           "'mallory', 'v1', 'x', '2026-01-15T12:00:00.000000Z', '2026-01-15T12:00:00.000000Z', NULL, "
           "'" + "ab" * 32 + "', '" + "cd" * 32 + "')")

TAMPERING = {
    "charge_edited": ["UPDATE dp_entries SET charge = '{\"epsilon\":\"1/100\",\"measure\":\"pure_dp\"}' WHERE seq = 1"],
    "row_inserted": [_FORGED],
    "last_row_deleted": ["DELETE FROM dp_entries WHERE seq = 2"],
    "cap_raised": ["UPDATE dp_budgets SET cap = '{\"epsilon\":\"100\",\"measure\":\"pure_dp\"}'"],
    "uncommitted": ["UPDATE dp_entries SET state = 'reserved', committed_at = NULL WHERE seq = 1"],
    "owner_stolen": ["UPDATE dp_entries SET owner_token = 'mallory' WHERE seq = 2"],
    "window_widened": ["UPDATE dp_entries SET created_at = '2020-01-01T00:00:00.000000Z' WHERE seq = 1"],
}


@pytest.mark.parametrize("kind", sorted(TAMPERING))
def test_tampered_rows_are_detected_and_reserve_refuses(ledger_factory, ledger, policy, kind):
    _seed(ledger, policy)
    ledger_factory.drop_guards()  # a determined insider drops the triggers first
    for sql in TAMPERING[kind]:
        ledger_factory.raw(sql)
    with pytest.raises(LedgerIntegrityError, match="integrity check failed"):
        ledger.verify()
    with pytest.raises(LedgerIntegrityError):  # verify runs inside reserve, before appending
        reserve(ledger, "r-new", PureDP("0.01"))
    with pytest.raises(LedgerIntegrityError):
        ledger.status("b")
    rows = ledger_factory.raw("SELECT release_id FROM dp_entries WHERE release_id = 'r-new'")
    assert rows == []  # nothing was appended


def test_incremental_reads_verify_what_they_return(ledger_factory, ledger, policy):
    """``entries_since`` / ``audit_rows_since`` (the mirror's refresh) check the rows they
    return and their link to the watermark row; an edit to an older row is left to verify()."""
    _seed(ledger, policy)  # entries r1 (seq 1), r2 (seq 2); audit row 1
    ledger.append_audit("alice", "publish", "dau", "v1", "published", "r2", None, None)
    ledger_factory.drop_guards()
    ledger_factory.raw("UPDATE dp_entries SET owner_token = 'mallory' WHERE seq = 2")
    ledger_factory.raw("UPDATE dp_audit SET decision = 'refused' WHERE seq = 2")
    with pytest.raises(LedgerIntegrityError, match="seq 2"):
        ledger.entries_since({"b": 1})
    with pytest.raises(LedgerIntegrityError, match="audit seq 2"):
        ledger.audit_rows_since(1)
    assert ledger.entries_since({"b": 2})[0] == []  # past the edit: not read here...
    with pytest.raises(LedgerIntegrityError):
        ledger.verify()  # ...and found by the full check
    ledger_factory.raw("DELETE FROM dp_audit WHERE seq = 2")
    with pytest.raises(LedgerIntegrityError, match="audit chain head"):
        ledger.audit_rows_since(1)


def test_tampered_audit_row_is_detected(ledger_factory, ledger, policy):
    _seed(ledger, policy)
    ledger_factory.drop_guards()
    ledger_factory.raw("UPDATE dp_audit SET decision = 'refused' WHERE seq = 1")
    with pytest.raises(LedgerIntegrityError, match="audit seq 1"):
        ledger.verify()


def test_tampered_binding_is_detected(ledger_factory, ledger, policy):
    ledger.register_budget(policy("b"))
    ledger.register_budget(policy("fresh"))
    ledger.bind_dataset("b", "delta-id", "user")
    ledger_factory.drop_guards()
    ledger_factory.raw("UPDATE dp_bindings SET budget_id = 'fresh'")
    with pytest.raises(LedgerIntegrityError):
        ledger.bind_dataset("fresh", "delta-id", "user")
    with pytest.raises(LedgerIntegrityError):
        ledger.verify()


# -- database down ---------------------------------------------------------------------
def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_postgres_down_is_a_clear_error_without_password():
    url = f"postgresql://ledger:s3cret-pw@127.0.0.1:{_closed_port()}/dp?connect_timeout=2"
    with pytest.raises(LedgerUnavailableError) as info:
        open_ledger(url, key=b"0123456789abcdef0123")
    text = str(info.value)
    assert "s3cret-pw" not in text and "unreachable" in text and "ledger:***@127.0.0.1" in text


@pytest.mark.parametrize("ledger_factory", ["postgres"], indirect=True)
def test_postgres_connection_lost_then_recovered(ledger_factory, ledger, policy):
    ledger.register_budget(policy("b", cap=1))
    pid = ledger._conn.info.backend_pid
    ledger_factory.raw("SELECT pg_terminate_backend(?)", (pid,))
    with pytest.raises(LedgerUnavailableError, match="nothing was recorded"):
        reserve(ledger, "r1", PureDP("0.1"))
    assert reserve(ledger, "r1", PureDP("0.1")).entry.seq == 1  # reconnected
    assert ledger.status("b").spent == PureDP("0.1")


class _EndedSession:
    """A connection the server has ended while psycopg has not yet marked it broken: its
    next statement fails (as after ``pg_terminate_backend`` raced a transaction)."""

    closed = False
    broken = False

    def transaction(self):
        import psycopg

        raise psycopg.OperationalError("sending query failed: terminating connection due to administrator command")

    def close(self):
        self.closed = True


@pytest.mark.parametrize("ledger_factory", ["postgres"], indirect=True)
def test_postgres_session_ended_before_it_is_marked_broken_reconnects(ledger_factory, ledger, policy):
    ledger.register_budget(policy("b", cap=1))
    ledger._conn = _EndedSession()
    with pytest.raises(LedgerUnavailableError, match="nothing was recorded"):
        reserve(ledger, "r1", PureDP("0.1"))
    assert reserve(ledger, "r1", PureDP("0.1")).entry.seq == 1  # a new connection, not the ended one
    assert ledger.status("b").spent == PureDP("0.1")


def test_sqlite_unopenable_path_is_unavailable(tmp_path):
    (tmp_path / "a_file").write_text("not a folder")
    with pytest.raises(LedgerUnavailableError):
        open_ledger(f"sqlite:{tmp_path / 'a_file' / 'ledger.db'}")


def test_sqlite_locked_beyond_busy_timeout_is_unavailable(tmp_path, policy):
    url = f"sqlite:{tmp_path / 'ledger.db'}"
    ledger = open_ledger(url, busy_timeout_ms=100)
    ledger.register_budget(policy("b", cap=1))
    blocker = sqlite3.connect(str(tmp_path / "ledger.db"), isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(LedgerUnavailableError, match="locked"):
            reserve(ledger, "r1", PureDP("0.1"))
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert ledger.find("r1") is None
    assert reserve(ledger, "r1", PureDP("0.1")).entry.seq == 1
    ledger.close()


def test_sqlite_corrupt_file_is_an_integrity_error(tmp_path):
    path = tmp_path / "ledger.db"
    path.write_bytes(b"this is not a sqlite database, it was overwritten" * 100)
    with pytest.raises(LedgerIntegrityError):
        open_ledger(f"sqlite:{path}")


# -- the key ---------------------------------------------------------------------------
def test_sqlite_key_file_is_created_private_and_checked(tmp_path, policy, monkeypatch):
    monkeypatch.delenv("DP_SPARK_LEDGER_KEY", raising=False)
    monkeypatch.delenv("DP_SPARK_LEDGER_KEY_FILE", raising=False)
    url = f"sqlite:{tmp_path / 'w' / 'ledger.db'}"
    with open_ledger(url) as led:
        led.register_budget(policy("b"))
    key_file = tmp_path / "w" / "ledger.db.key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    with open_ledger(url) as led:  # the same key again
        led.verify()
    key_file.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        open_ledger(url)
    key_file.chmod(0o600)
    monkeypatch.setenv("DP_SPARK_LEDGER_KEY", "a different key from the environment")
    with pytest.raises(LedgerIntegrityError, match="key does not match"):
        open_ledger(url)
    monkeypatch.setenv("DP_SPARK_LEDGER_KEY", key_file.read_text().strip())
    with open_ledger(url) as led:
        led.verify()


def test_postgres_needs_a_key(monkeypatch):
    monkeypatch.delenv("DP_SPARK_LEDGER_KEY", raising=False)
    monkeypatch.delenv("DP_SPARK_LEDGER_KEY_FILE", raising=False)
    with pytest.raises(ConfigError, match="needs an HMAC key"):
        open_ledger("postgresql://nobody@127.0.0.1:1/none")


# -- a copied config cannot reset a budget ---------------------------------------------
def test_copied_config_with_new_budget_id_is_refused_by_bind_dataset(ledger, tmp_path, clock):
    original = load_policies(REPO / "conf" / "policies" / "budgets.yaml")["demo_events_user"]
    data = yaml.safe_load((REPO / "conf" / "policies" / "budgets.yaml").read_text())
    data["budgets"]["demo_events_user_v2"] = data["budgets"].pop("demo_events_user")
    copy_path = tmp_path / "copied.yaml"
    copy_path.write_text(yaml.safe_dump(data))
    copied = load_policies(copy_path)["demo_events_user_v2"]

    ledger.register_budget(original)
    ledger.bind_dataset(original.budget_id, "0b3f1c1e-delta-table-id", "user")
    reserve(ledger, "r1", ZCDP(1), budget=original.budget_id)
    ledger.register_budget(copied)  # registering the copy is harmless...
    with pytest.raises(ConfigError, match="already governed by budget 'demo_events_user'"):
        ledger.bind_dataset(copied.budget_id, "0b3f1c1e-delta-table-id", "user")  # ...drawing on it is not
    # the same table under a new name or path has the same Delta id: same budget, same spend
    ledger.bind_dataset(original.budget_id, "0b3f1c1e-delta-table-id", "user")
    assert ledger.status(original.budget_id).spent == ZCDP(1)
