"""The budget ledger: one interface (:class:`Ledger`) and one SQL implementation
(:class:`SqlLedger`) shared by SQLite and PostgreSQL.

Protocol (exactly once; see docs/ledger.md): ``reserve`` is a compare-and-set append at the
end of a budget's log inside one write transaction (SQLite ``BEGIN IMMEDIATE``; PostgreSQL
locks the budget row ``FOR UPDATE``); ``commit`` flips reserved -> committed. A charge is
never refunded: reserved entries count as spent.

The write path (``reserve``, ``commit``) costs O(1) in the number of entries: it verifies the
budget row, the chain's tail from the MAC'd head back, the entry it acts on, and reads
``spent`` from the budget's spend summary (:mod:`dp_spark.ledger.windows`).
:meth:`SqlLedger.verify` still recomputes everything.

:class:`SqlLedger` is assembled from one class per concern, each in its module, all on
:class:`~dp_spark.ledger.integrity.Integrity` (the MACs and chain checks), itself on
:class:`~dp_spark.ledger.transactions.Transactions` (the transaction protocol) and
:class:`~dp_spark.ledger.dialects.SqlDialect` (the store's hooks):
:mod:`~dp_spark.ledger.bindings`, :mod:`~dp_spark.ledger.history` (policy history),
:mod:`~dp_spark.ledger.windows` (spend), :mod:`~dp_spark.ledger.audit`,
:mod:`~dp_spark.ledger.versions`, :mod:`~dp_spark.ledger.fingerprints` (input fingerprints),
:mod:`~dp_spark.ledger.streams` (the noisy nodes of streams).
Budgets, entries, reserve, commit and verify are here.

Nothing here imports pyspark.
"""

from __future__ import annotations

import abc
import hmac
import json
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, Mapping, Optional

from dp_spark.accountant import budget_exceeded
from dp_spark.core.budget import MEASURES, Budget
from dp_spark.errors import (
    ConfigError,
    DpSparkError,
    InvalidBudgetError,
    LedgerError,
    LedgerIntegrityError,
    MeasureMismatchError,
    ReleaseConflictError,
)
from dp_spark.ledger.audit import AuditLog
from dp_spark.ledger.bindings import Bindings
from dp_spark.ledger.dialects import Cursor, Retry
from dp_spark.ledger.fingerprints import Fingerprints
from dp_spark.ledger.streams import StreamNodes
from dp_spark.ledger.history import PolicyHistory
from dp_spark.ledger.integrity import BudgetRow
from dp_spark.ledger.keys import KEY_ENV
from dp_spark.ledger.migrations import migrate
from dp_spark.ledger.policy import BudgetPolicy
from dp_spark.ledger.records import (
    GENESIS,
    AuditRow,
    BudgetStatus,
    LedgerEntry,
    PolicyChangedError,
    PolicyRecord,
    ReleaseLimitExceededError,
    Reservation,
    UnknownReleaseError,
    canonical,
    charge_text,
    check_text,
    parse_ts,
    policy_changes,
    policy_hash,
    ts_text,
)
from dp_spark.ledger.schema import BUDGET_COLS, ENTRY_COLS, SCHEMA_VERSION
from dp_spark.ledger.versions import Versions
from dp_spark.ledger.windows import Spend, SpendWindows, utc_day, window_horizon

__all__ = ["Ledger", "SqlLedger"]

MAX_LEASE_SECONDS = 7 * 24 * 3600


class Ledger(abc.ABC):
    """A durable, append-only, exactly-once privacy-budget ledger."""

    @abc.abstractmethod
    def register_budget(self, policy: BudgetPolicy) -> None: ...

    @abc.abstractmethod
    def bind_dataset(self, budget_id: str, dataset_identity: str, privacy_unit: str) -> None: ...

    @abc.abstractmethod
    def status(self, budget_id: str, now: Optional[datetime] = None, *, full: bool = True) -> BudgetStatus: ...

    @abc.abstractmethod
    def find(self, release_id: str) -> Optional[LedgerEntry]: ...

    @abc.abstractmethod
    def reserve(
        self,
        budget_id: str,
        release_id: str,
        charge: Budget,
        event_json: str,
        *,
        principal: str,
        code_version: str,
        release_family: str,
        owner_token: str,
        lease_seconds: float = 600,
        now: Optional[datetime] = None,
    ) -> Reservation: ...

    @abc.abstractmethod
    def commit(self, release_id: str, owner_token: str, now: Optional[datetime] = None) -> LedgerEntry: ...

    @abc.abstractmethod
    def entries(self, budget_id: Optional[str] = None) -> list[LedgerEntry]: ...

    @abc.abstractmethod
    def verify(self, budget_id: Optional[str] = None) -> None: ...

    @abc.abstractmethod
    def append_audit(
        self,
        principal: str,
        action: str,
        spec_name: Optional[str],
        spec_version: Optional[str],
        decision: str,
        release_id: Optional[str],
        charge_json: Any,
        detail: Any,
        now: Optional[datetime] = None,
    ) -> AuditRow: ...

    @abc.abstractmethod
    def audit_rows(self, limit: Optional[int] = None) -> list[AuditRow]: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    # -- what changed since a watermark (the Delta mirror's incremental refresh) ----------
    def entries_since(self, after: Mapping[str, int]) -> tuple[list[LedgerEntry], dict[str, int]]:
        """Every budget's entries with ``seq > after.get(budget_id, 0)``, in (budget, seq)
        order, and each budget's chain head (its entry count). A store may verify only what it
        returns; this default reads (and verifies) everything."""
        out: list[LedgerEntry] = []
        heads: dict[str, int] = {}
        for e in self.entries():
            heads[e.budget_id] = max(heads.get(e.budget_id, 0), e.seq)
            if e.seq > int(after.get(e.budget_id, 0)):
                out.append(e)
        return out, heads

    def audit_rows_since(self, after: int) -> tuple[list[AuditRow], int]:
        """Audit rows with ``seq > after``, in order, and the audit chain's head (its row
        count). This default reads everything."""
        rows = self.audit_rows()
        return [a for a in rows if a.seq > after], len(rows)

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _policy_texts(p: BudgetPolicy) -> tuple:
    return (
        p.budget_id,
        p.dataset,
        p.privacy_unit,
        p.measure,
        charge_text(p.cap),
        None if p.statement_delta is None else str(p.statement_delta),
        p.window.kind,
        p.window.days,
        None if p.max_per_release is None else charge_text(p.max_per_release),
    )


class SqlLedger(Bindings, PolicyHistory, SpendWindows, AuditLog, Versions, Fingerprints, StreamNodes, Ledger):
    """The ledger over a DB-API connection; subclasses supply the connection and dialect."""

    # -- schema ----------------------------------------------------------------------
    def _init_schema(self) -> None:
        key_check = self._mac("key-check", SCHEMA_VERSION)

        def fn(cur: Cursor) -> None:
            migrate(cur, table_exists=self._table_exists, column_exists=self._column_exists,
                    schema_lock=self._schema_lock, guard_ddl=self._guard_ddl)
            rows = dict(cur.q("SELECT name, value FROM dp_ledger_meta"))
            if "schema_version" not in rows:
                cur.x("INSERT INTO dp_ledger_meta (name, value) VALUES (?, ?)", ("schema_version", SCHEMA_VERSION))
                cur.x("INSERT INTO dp_ledger_meta (name, value) VALUES (?, ?)", ("key_check", key_check))
                cur.x(
                    "INSERT INTO dp_ledger_meta (name, value) VALUES (?, ?)",
                    ("audit_head", self._audit_head_value(0, GENESIS)),
                )
                return
            if rows["schema_version"] != SCHEMA_VERSION:
                raise LedgerError(
                    f"{self.description} has schema version {rows['schema_version']!r}; "
                    f"this dp_spark reads version {SCHEMA_VERSION}"
                )
            if not hmac.compare_digest(rows.get("key_check", ""), key_check):
                raise LedgerIntegrityError(
                    f"{self.description}: the HMAC key does not match the key this ledger was "
                    f"created with (check ${KEY_ENV} or the key file)"
                )

        self._run("open", fn, write=True)

    # -- budgets ---------------------------------------------------------------------
    def register_budget(self, policy: BudgetPolicy, *, principal: str = "dp_spark") -> None:
        """Register a budget's policy (idempotent), and record it in the policy history.

        A new budget is inserted with history version 1. An unchanged policy is a no-op (a
        budget registered before the history existed gets its version 1 recorded as found).
        A CHANGED policy is refused with :class:`PolicyChangedError` naming the budget, the
        changes and the admin command that accepts them (:meth:`accept_policy`): an edited
        policy file never applies silently.
        """
        if not isinstance(policy, BudgetPolicy):
            raise ConfigError("register_budget needs a BudgetPolicy")
        check_text(principal, "principal")
        texts = _policy_texts(policy)

        def fn(cur: Cursor) -> None:
            now = self._now(None)
            stamp = ts_text(now)
            inserted = cur.x(
                f"INSERT INTO dp_budgets ({BUDGET_COLS}) VALUES ({', '.join(['?'] * 13)}) "
                "ON CONFLICT (budget_id) DO NOTHING",
                (*texts, 0, GENESIS, stamp, self._budget_mac(texts, 0, GENESIS, stamp)),
            )
            if inserted == 1:
                self._append_policy(cur, policy, principal, "first registration of the budget", stamp, None)
                return
            b = self._load_budget(cur, policy.budget_id, lock=True)
            if b.texts != texts:
                raise PolicyChangedError(policy.budget_id, b.policy, policy)
            if self._last_policy(cur, policy.budget_id) is None:
                self._append_policy(cur, policy, principal,
                                    "registered before the ledger kept a policy history (recorded as found)",
                                    stamp, None)

        self._run("register_budget", fn, write=True)

    def _check_policy_change(self, cur: Cursor, b: BudgetRow, policy: BudgetPolicy, now: datetime) -> None:
        """Refused (ConfigError) even by an admin: changing the measure of a budget that has
        entries; changing its privacy unit once it has entries or bindings; a cap (under the
        new window) below what is already spent in the current window."""
        entries = self._verified_entries(cur, b)
        old = b.policy
        if policy.measure != old.measure and entries:
            raise ConfigError(
                f"budget {policy.budget_id!r} has {len(entries)} ledger entries in "
                f"{old.measure}; its measure cannot change to {policy.measure}"
            )
        if policy.privacy_unit != old.privacy_unit:
            bound = cur.scalar("SELECT COUNT(*) FROM dp_bindings WHERE budget_id = ?", (policy.budget_id,))
            if entries or bound:
                raise ConfigError(
                    f"budget {policy.budget_id!r} protects unit {old.privacy_unit!r} and has "
                    f"entries or bound datasets; its privacy unit cannot change"
                )
        if entries:
            spent, _ = self._spent(policy, entries, now)
            if not spent.fits_in(policy.cap):
                raise ConfigError(
                    f"budget {policy.budget_id!r}: new cap {policy.cap} is below what is already "
                    f"spent in the current window ({spent}); a cap cannot be lowered below spent"
                )

    def accept_policy(self, policy: BudgetPolicy, *, principal: str, reason: str,
                      now: Optional[datetime] = None) -> Optional[PolicyRecord]:
        """Apply a changed policy to a registered budget: the admin's decision (the caller
        checks the role). In ONE write transaction: the checks of :meth:`_check_policy_change`,
        the budget row, a new policy-history version (principal, reason, changes) and an audit
        row (action ``admin``, decision ``policy_accepted``). Returns the new record, or None
        when the policy equals the registered one (nothing recorded)."""
        if not isinstance(policy, BudgetPolicy):
            raise ConfigError("accept_policy needs a BudgetPolicy")
        check_text(principal, "principal")
        check_text(reason, "reason")
        texts = _policy_texts(policy)

        def fn(cur: Cursor) -> Optional[PolicyRecord]:
            t = self._now(now)
            stamp = ts_text(t)
            b = self._load_budget(cur, policy.budget_id, lock=True)
            last = self._last_policy(cur, policy.budget_id)
            if b.texts == texts and last is not None:
                return None
            if last is None:  # a budget registered before the history: record what was in force
                self._append_policy(cur, b.policy, principal,
                                    "registered before the ledger kept a policy history (recorded as found)",
                                    stamp, None)
            changes = policy_changes(b.policy, policy)
            self._check_policy_change(cur, b, policy, t)
            n = cur.x(
                "UPDATE dp_budgets SET dataset = ?, privacy_unit = ?, measure = ?, cap = ?, "
                "statement_delta = ?, window_kind = ?, window_days = ?, max_per_release = ?, "
                "updated_at = ?, mac = ? WHERE budget_id = ? AND head_seq = ?",
                (*texts[1:], stamp, self._budget_mac(texts, b.head_seq, b.head_hash, stamp),
                 policy.budget_id, b.head_seq),
            )
            if n != 1:
                raise Retry()
            rec = self._append_policy(cur, policy, principal, reason, stamp, b.policy)
            self._append_audit_in(cur, stamp, (
                principal, "admin", None, None, "policy_accepted", None, None,
                canonical({"budget_id": policy.budget_id, "from": policy_hash(b.policy), "to": rec.policy_hash,
                           "version": rec.version, "reason": reason, "changes": changes}),
            ))
            return rec

        return self._run("accept_policy", fn, write=True)

    def get_policy(self, budget_id: str) -> BudgetPolicy:
        """The policy registered for ``budget_id`` (UnknownBudgetError if none)."""
        return self._run("get_policy", lambda cur: self._load_budget(cur, budget_id, lock=False).policy, write=False)

    def budget_ids(self) -> list[str]:
        return [r[0] for r in self._run(
            "budget_ids", lambda cur: cur.q("SELECT budget_id FROM dp_budgets ORDER BY budget_id"), write=False)]

    # -- entries: status, reads, reserve, commit ---------------------------------------
    def status(self, budget_id: str, now: Optional[datetime] = None, *, full: bool = True) -> BudgetStatus:
        """Cap, spent (reserved + committed, in the current window), remaining. Verifies the
        budget's whole chain; with ``full=False`` (a release's result, a statement) O(1) in the
        number of entries, as the write path: the budget row's MAC, the chain's tail against its
        head, spent from the MAC'd spend summary, and the window's entry count by one SQL count."""
        def fn(cur: Cursor) -> BudgetStatus:
            t = self._now(now)
            b = self._load_budget(cur, budget_id, lock=False)
            start, end = b.policy.window.bounds(t)
            if full:
                entries = self._verified_entries(cur, b)
                spent, n = self._spent(b.policy, entries, t)
            else:
                self._verified_tail(cur, b)
                spent = self._window_spent(cur, b, t)[0]
                if start is None:
                    n = b.head_seq
                else:
                    sql, args = "SELECT count(*) FROM dp_entries WHERE budget_id = ? AND created_at >= ?", [
                        budget_id, ts_text(start)]
                    if b.policy.window.kind != "rolling":
                        assert end is not None  # a calendar window has an end
                        sql, args = sql + " AND created_at < ?", args + [ts_text(end)]
                    n = int(cur.scalar(sql, tuple(args)))
            return BudgetStatus(budget_id, b.policy.measure, b.policy.cap, spent, b.policy.cap - spent, start, end, n)

        return self._run("status", fn, write=False)

    def find(self, release_id: str) -> Optional[LedgerEntry]:
        def fn(cur: Cursor) -> Optional[LedgerEntry]:
            r = cur.one(f"SELECT {ENTRY_COLS} FROM dp_entries WHERE release_id = ?", (release_id,))
            if r is None:
                return None
            try:
                return self._entry(r)
            except (DpSparkError, ValueError, TypeError, KeyError):
                raise LedgerIntegrityError(f"ledger integrity check failed: release {release_id!r}: unreadable row") from None

        return self._run("find", fn, write=False)

    def entries(self, budget_id: Optional[str] = None) -> list[LedgerEntry]:
        """A budget's entries in seq order (all budgets when None), after verifying them."""
        def fn(cur: Cursor) -> list[LedgerEntry]:
            if budget_id is not None:
                return self._verified_entries(cur, self._load_budget(cur, budget_id, lock=False))
            out: list[LedgerEntry] = []
            for row in cur.q(f"SELECT {BUDGET_COLS} FROM dp_budgets ORDER BY budget_id"):
                out.extend(self._verified_entries(cur, self._budget_from_row(row)))
            return out

        return self._run("entries", fn, write=False)

    def entries_since(self, after: Mapping[str, int]) -> tuple[list[LedgerEntry], dict[str, int]]:
        """Every budget's entries past ``after[budget_id]`` (0 when absent) and every budget's
        chain head seq, verified in O(entries returned): the budget row's MAC, the links from
        the stored entry at the watermark (or the genesis) to the MAC'd chain head, each row's
        hash and state MAC. Entries at or before a watermark are not read: an edit there is found
        by ``verify()``, not here. A watermark past a head returns nothing for that budget (the
        caller sees it in the heads)."""
        def fn(cur: Cursor) -> tuple[list[LedgerEntry], dict[str, int]]:
            out: list[LedgerEntry] = []
            heads: dict[str, int] = {}
            for row in cur.q(f"SELECT {BUDGET_COLS} FROM dp_budgets ORDER BY budget_id"):
                b = self._budget_from_row(row)
                bid = b.policy.budget_id
                heads[bid] = b.head_seq
                w = int(after.get(bid, 0))
                if w < 0:
                    raise LedgerError("a watermark must be a non-negative integer")
                if w >= b.head_seq:
                    continue
                rows = cur.q(f"SELECT {ENTRY_COLS} FROM dp_entries WHERE budget_id = ? AND seq >= ? AND seq <= ? "
                             "ORDER BY seq", (bid, max(w, 1), b.head_seq))
                prev, body = self._after_watermark(rows, w, 1, 13, f"budget {bid!r} seq")
                problems, entries, last = self._link_problems(b, body, prev, w + 1)
                if w + len(body) != b.head_seq or last != b.head_hash:
                    problems.append(f"budget {bid!r}: chain head says {b.head_seq} entries but the stored chain "
                                    f"ends at seq {w + len(body)} (rows deleted or inserted outside the ledger)")
                self._raise_problems(problems)
                out.extend(entries)
            return out, heads

        return self._run("entries_since", fn, write=False)

    def latest_committed(self, release_family: str, budget_id: Optional[str] = None) -> Optional[LedgerEntry]:
        """The most recently committed entry of a release family (for ``return_existing``)."""
        def fn(cur: Cursor) -> Optional[LedgerEntry]:
            sql = f"SELECT {ENTRY_COLS} FROM dp_entries WHERE release_family = ? AND state = 'committed'"
            params: tuple = (release_family,)
            if budget_id is not None:
                sql += " AND budget_id = ?"
                params += (budget_id,)
            rows = cur.q(sql + " ORDER BY committed_at DESC, seq DESC", params)
            if not rows:
                return None
            b = self._load_budget(cur, rows[0][0], lock=False)
            verified = {e.release_id: e for e in self._verified_entries(cur, b)}
            return verified[rows[0][2]]

        return self._run("latest_committed", fn, write=False)

    def reserve(
        self,
        budget_id: str,
        release_id: str,
        charge: Budget,
        event_json: str,
        *,
        principal: str,
        code_version: str,
        release_family: str,
        owner_token: str,
        lease_seconds: float = 600,
        now: Optional[datetime] = None,
    ) -> Reservation:
        """Charge ``charge`` to ``budget_id`` for ``release_id``, exactly once.

        * release already committed -> Reservation(entry, reused=True): serve the stored
          release, no charge;
        * reserved by ``owner_token``, or its lease expired -> taken over (new owner and
          lease), no second charge, reused=True;
        * reserved by another owner with a live lease -> ReleaseConflictError;
        * otherwise, in one write transaction: check the measure (MeasureMismatchError), the
          per-release maximum (ReleaseLimitExceededError) and spent + charge <= cap exactly
          (BudgetExceededError), then append at seq = last + 1 and update the spend summary.

        Before anything else it verifies the budget row, the tail of the chain against its head
        and the entry it acts on; ``spent`` comes from the MAC'd spend summary. All O(1) in the
        number of entries (a missing or stale summary: the whole chain, once). :meth:`verify`
        checks every entry.
        """
        check_text(budget_id, "budget_id")
        check_text(release_id, "release_id")
        check_text(principal, "principal")
        check_text(code_version, "code_version")
        check_text(release_family, "release_family")
        check_text(owner_token, "owner_token")
        if type(charge) not in MEASURES.values():
            raise InvalidBudgetError("charge must be a PureDP, ZCDP or ApproxDP amount")
        if charge.is_zero():
            raise InvalidBudgetError("charge must be > 0")
        if not isinstance(event_json, str):
            raise LedgerError("event_json must be serialised JSON text")
        try:
            json.loads(event_json)
        except ValueError:
            raise LedgerError("event_json is not valid JSON") from None
        if isinstance(lease_seconds, bool) or not isinstance(lease_seconds, (int, float)) or not (
            0 < lease_seconds <= MAX_LEASE_SECONDS
        ):
            raise LedgerError(f"lease_seconds must be in (0, {MAX_LEASE_SECONDS}]")
        ctext = charge_text(charge)

        def fn(cur: Cursor) -> Reservation:
            t = self._now(now)
            lease = ts_text(t + timedelta(seconds=lease_seconds))
            b = self._load_budget(cur, budget_id, lock=True)
            tail = self._verified_tail(cur, b)
            r = cur.one(f"SELECT {ENTRY_COLS} FROM dp_entries WHERE release_id = ?" + self.for_update, (release_id,))
            if r is not None:
                if r[0] != budget_id:
                    raise ReleaseConflictError(
                        f"release {release_id!r} is recorded under budget {r[0]!r}, not {budget_id!r}"
                    )
                e = tail.get(release_id) or self._verified_entry(cur, b, r)
                if e.state == "committed":
                    return Reservation(e, True)
                if e.charge != charge:
                    raise ReleaseConflictError(
                        f"release {release_id!r} is reserved with a different charge ({e.charge}); "
                        f"a release id must always carry the same charge"
                    )
                if e.owner_token != owner_token and e.lease_expires_at > t:
                    raise ReleaseConflictError(
                        f"release {release_id!r} is reserved by another run until "
                        f"{ts_text(e.lease_expires_at)}"
                    )
                smac = self._state_mac(e.row_hash, "reserved", owner_token, lease, None)
                n = cur.x(
                    "UPDATE dp_entries SET owner_token = ?, lease_expires_at = ?, state_mac = ? "
                    "WHERE release_id = ? AND state = 'reserved' AND owner_token = ?",
                    (owner_token, lease, smac, release_id, e.owner_token),
                )
                if n != 1:
                    raise Retry()
                return Reservation(
                    replace(e, owner_token=owner_token, lease_expires_at=parse_ts(lease)),
                    True,
                )
            policy = b.policy
            if charge.MEASURE != policy.measure:
                raise MeasureMismatchError(
                    f"budget {budget_id!r} accounts in {policy.measure}; the release charges {charge.MEASURE}"
                )
            spent, summary = self._window_spent(cur, b, t)
            if not policy.within_release_limit(charge):
                raise ReleaseLimitExceededError(budget_id, policy.max_per_release, spent, charge)
            if not (spent + charge).fits_in(policy.cap):
                # names delta_cap when the delta is what does not fit (DeltaCapExceededError)
                raise budget_exceeded(budget_id, policy.cap, spent, charge)
            seq = b.head_seq + 1
            created = ts_text(t)
            row = (budget_id, seq, release_id, release_family, ctext, event_json, "reserved", principal,
                   code_version, owner_token, lease, created, None)
            rh = self._row_hash(b.head_hash, row)
            smac = self._state_mac(rh, "reserved", owner_token, lease, None)
            cur.x(
                f"INSERT INTO dp_entries ({ENTRY_COLS}) VALUES ({', '.join(['?'] * 15)})",
                (*row, rh, smac),
            )
            n = cur.x(
                "UPDATE dp_budgets SET head_seq = ?, head_hash = ?, mac = ? WHERE budget_id = ? AND head_seq = ?",
                (seq, rh, self._budget_mac(b.texts, seq, rh, b.updated_at), budget_id, b.head_seq),
            )
            if n != 1:
                raise Retry()
            keep = max(summary.from_day, window_horizon(policy, t))
            days = {d: v for d, v in summary.days.items() if d >= keep}
            if utc_day(created) >= keep:
                days[utc_day(created)] = days.get(utc_day(created), MEASURES[policy.measure].zero()) + charge
            self._store_spend(cur, budget_id, Spend(seq, rh, summary.total + charge, keep, days))
            return Reservation(self._entry((*row, rh, smac)), False)

        return self._run("reserve", fn, write=True)

    def commit(self, release_id: str, owner_token: str, now: Optional[datetime] = None) -> LedgerEntry:
        """reserved -> committed. Already committed: a no-op returning the entry. Another
        owner with a live lease: ReleaseConflictError. Unknown release: UnknownReleaseError."""
        check_text(release_id, "release_id")
        check_text(owner_token, "owner_token")

        def fn(cur: Cursor) -> LedgerEntry:
            t = self._now(now)
            r = cur.one("SELECT budget_id FROM dp_entries WHERE release_id = ?", (release_id,))
            if r is None:
                raise UnknownReleaseError(f"no ledger entry for release {release_id!r}: reserve it first")
            b = self._load_budget(cur, r[0], lock=True)
            tail = self._verified_tail(cur, b)
            self._load_spend(cur, b)  # not needed to commit, but an edited summary refuses here too
            e = tail.get(release_id)
            if e is None:  # read again under the budget's lock
                row = cur.one(f"SELECT {ENTRY_COLS} FROM dp_entries WHERE release_id = ?", (release_id,))
                if row is None:
                    self._fail(f"release {release_id!r}: its entry vanished (deleted outside the ledger)")
                e = self._verified_entry(cur, b, row)
            if e.state == "committed":
                return e
            if e.owner_token != owner_token and e.lease_expires_at > t:
                raise ReleaseConflictError(
                    f"release {release_id!r} is reserved by another run until {ts_text(e.lease_expires_at)}"
                )
            committed = ts_text(t)
            lease = ts_text(e.lease_expires_at)
            smac = self._state_mac(e.row_hash, "committed", owner_token, lease, committed)
            n = cur.x(
                "UPDATE dp_entries SET state = 'committed', committed_at = ?, owner_token = ?, state_mac = ? "
                "WHERE release_id = ? AND state = 'reserved' AND owner_token = ?",
                (committed, owner_token, smac, release_id, e.owner_token),
            )
            if n != 1:
                raise Retry()
            return replace(e, state="committed", committed_at=parse_ts(committed), owner_token=owner_token)

        return self._run("commit", fn, write=True)

    # -- verification ----------------------------------------------------------------
    def verify(self, budget_id: Optional[str] = None) -> None:
        """Check every budget row, entry chain, spend summary, binding and the audit chain
        (or one budget's row, chain and summary). ``reserve``/``commit`` check only a chain's
        tail and the entries they touch: this is what finds an edited old entry.

        Raises LedgerIntegrityError naming the budgets and sequence numbers that fail.
        """
        def fn(cur: Cursor) -> None:
            problems: list[str] = []
            if budget_id is not None:
                b = self._load_budget(cur, budget_id, lock=False)
                problems, entries = self._chain_problems(b, cur.q(
                    f"SELECT {ENTRY_COLS} FROM dp_entries WHERE budget_id = ? ORDER BY seq", (budget_id,)))
                self._raise_problems(problems + self._spend_problems(cur, b, entries)
                                     + self._policy_problems(cur, b)[0])
                return
            known = set()
            for row in cur.q(f"SELECT {BUDGET_COLS} FROM dp_budgets ORDER BY budget_id"):
                try:
                    b = self._budget_from_row(row)
                except LedgerIntegrityError as exc:
                    problems.append(str(exc).replace("ledger integrity check failed: ", ""))
                    known.add(row[0])
                    continue
                known.add(b.policy.budget_id)
                rows = cur.q(f"SELECT {ENTRY_COLS} FROM dp_entries WHERE budget_id = ? ORDER BY seq",
                             (b.policy.budget_id,))
                chain, entries = self._chain_problems(b, rows)
                problems.extend(chain)
                problems.extend(self._spend_problems(cur, b, entries))
                problems.extend(self._policy_problems(cur, b)[0])
            for (bid,) in cur.q("SELECT DISTINCT budget_id FROM dp_entries"):
                if bid not in known:
                    problems.append(f"entries of unregistered budget {bid!r}")
            for (bid,) in cur.q("SELECT DISTINCT budget_id FROM dp_policies"):
                if bid not in known:
                    problems.append(f"policy history of unregistered budget {bid!r}")
            for row in cur.q("SELECT dataset_identity, privacy_unit, budget_id, created_at, mac FROM dp_bindings"):
                try:
                    self._check_binding(row)
                except LedgerIntegrityError:
                    problems.append(f"binding to budget {row[2]!r} edited outside the ledger")
                if row[2] not in known:
                    problems.append(f"binding to unregistered budget {row[2]!r}")
            problems.extend(self._audit_problems(cur))
            problems.extend(self._version_problems(cur))
            problems.extend(self._fingerprint_problems(cur))
            problems.extend(self._stream_node_problems(cur))
            self._raise_problems(problems)

        self._run("verify", fn, write=False)
