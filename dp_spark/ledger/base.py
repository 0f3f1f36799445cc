"""The budget ledger: one interface, one SQL implementation shared by SQLite and PostgreSQL.

Tables (the same SQL on both stores; timestamps are fixed-width UTC text, charges are exact
canonical JSON, so every row hashes to the same bytes on either store)::

    dp_ledger_meta(name PK, value)                      schema version, key check, audit head
    dp_budgets(budget_id PK, policy columns..., head_seq, head_hash, updated_at, mac)
    dp_bindings(dataset_identity, privacy_unit, budget_id, created_at, mac)
        PRIMARY KEY (dataset_identity, privacy_unit)
    dp_entries(budget_id, seq, release_id UNIQUE, release_family, charge, event_json, state,
               principal, code_version, owner_token, lease_expires_at, created_at,
               committed_at, row_hash, state_mac)   PRIMARY KEY (budget_id, seq)
    dp_audit(seq PK, at, principal, action, spec_name, spec_version, decision, release_id,
             charge, detail, row_hash)
    dp_versions(family, version_no, release_id, state, reason, principal, at, changed_by,
                changed_at, mac)   PRIMARY KEY (family, version_no), UNIQUE (family, release_id),
                at most one 'current' row per family (a partial unique index)

Protocol (exactly once; see docs/ledger.md): ``reserve`` is a compare-and-set append at the
end of a budget's log inside one write transaction (SQLite ``BEGIN IMMEDIATE``; PostgreSQL
locks the budget row ``FOR UPDATE``); ``commit`` flips reserved -> committed. A charge is
never refunded: reserved entries count as spent.

Integrity: every entry carries ``row_hash = HMAC-SHA256(key, prev_row_hash, immutable
fields)`` chained per budget, and ``state_mac`` over its mutable fields (state, owner, lease,
commit time); the budget row carries a MAC over its policy and the chain head (last seq,
last hash), so an edited, inserted or deleted row, a raised cap or a truncated tail fails
:meth:`Ledger.verify`. Triggers refuse UPDATE/DELETE of immutable columns as a first line.

The write path (``reserve``, ``commit``) costs O(1) in the number of entries: it verifies the
budget row, the chain's tail from the MAC'd head back (the last ``verify_tail`` entries, their
links, and that nothing lies past the head), the entry it acts on, and reads ``spent`` from a
per-budget spend summary (``dp_ledger_meta`` row ``spend:<budget_id>``: the lifetime total and
per-UTC-day totals, MAC'd together with the chain head it describes). A summary that does not
describe the current head (none yet, or written by an older ledger) makes that one call verify
the whole chain and rebuild it. :meth:`Ledger.verify` still recomputes everything.

Nothing here imports pyspark.
"""

from __future__ import annotations

import abc
import hashlib
import hmac
import json
import os
import random
import secrets
import stat
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

from dp_spark.accountant import budget_exceeded
from dp_spark.core.budget import MEASURES, Budget, budget_from_json
from dp_spark.errors import (
    BudgetExceededError,
    ConfigError,
    DpSparkError,
    InvalidBudgetError,
    LedgerError,
    LedgerIntegrityError,
    LedgerUnavailableError,
    MeasureMismatchError,
    ReleaseConflictError,
)
from dp_spark.ledger.policy import BudgetPolicy, WindowPolicy, as_utc

__all__ = [
    "AuditRow",
    "BudgetStatus",
    "PolicyChangedError",
    "PolicyRecord",
    "policy_hash",
    "Ledger",
    "LedgerEntry",
    "ReleaseLimitExceededError",
    "Reservation",
    "SqlLedger",
    "UnknownBudgetError",
    "UnknownReleaseError",
    "VersionRecord",
    "VERSION_STATES",
    "KEY_ENV",
    "KEY_FILE_ENV",
    "resolve_key",
]

UTC = timezone.utc
SCHEMA_VERSION = "1"
GENESIS = "0" * 64
KEY_ENV = "DP_SPARK_LEDGER_KEY"
KEY_FILE_ENV = "DP_SPARK_LEDGER_KEY_FILE"
MIN_KEY_BYTES = 16
MAX_LEASE_SECONDS = 7 * 24 * 3600
MAX_TEXT = 512
STATES = ("reserved", "committed")
VERSION_STATES = ("current", "superseded", "withdrawn")
VERSIONS_SEQ = "versions_seq"  # dp_ledger_meta: the number of version-record changes so far
SPEND_PREFIX = "spend:"  # dp_ledger_meta name of a budget's spend summary
Clock = Callable[[], datetime]


# --------------------------------------------------------------------------------------
# Errors specific to the ledger (subclasses of the package's errors)
# --------------------------------------------------------------------------------------
class UnknownBudgetError(ConfigError):
    """The budget id is not registered in the ledger."""

    def __init__(self, budget_id: str):
        self.budget_id = budget_id
        super().__init__(f"unknown budget {budget_id!r}: register its policy first")


class UnknownReleaseError(LedgerError):
    """No ledger entry has this release id."""


class ReleaseLimitExceededError(BudgetExceededError):
    """A single charge exceeds the budget's per-release maximum (``cap`` is that maximum)."""

    def __init__(self, budget_id: str, max_per_release, spent, requested):
        super().__init__(budget_id, max_per_release, spent, requested)
        self.args = (
            f"budget {budget_id!r}: charge {requested} exceeds the per-release maximum "
            f"{max_per_release}",
        )


# --------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LedgerEntry:
    budget_id: str
    seq: int
    release_id: str
    charge: Budget
    event_json: str
    state: str
    principal: str
    code_version: str
    owner_token: str
    lease_expires_at: datetime
    created_at: datetime
    committed_at: Optional[datetime]
    release_family: str
    row_hash: str


@dataclass(frozen=True)
class BudgetStatus:
    """``spent`` = reserved + committed charges of the entries in the current window.

    ``window_start``/``window_end`` are None for a budget without window; ``entries`` is the
    number of entries counted in ``spent``.
    """

    budget_id: str
    measure: str
    cap: Budget
    spent: Budget
    remaining: Budget
    window_start: Optional[datetime]
    window_end: Optional[datetime]
    entries: int


@dataclass(frozen=True)
class Reservation:
    """``reused`` is True when no new charge was made (already committed, or taken over)."""

    entry: LedgerEntry
    reused: bool


@dataclass(frozen=True)
class AuditRow:
    seq: int
    at: datetime
    principal: str
    action: str
    spec_name: Optional[str]
    spec_version: Optional[str]
    decision: str
    release_id: Optional[str]
    charge_json: Optional[str]
    detail: Optional[str]
    row_hash: str


# --------------------------------------------------------------------------------------
# Canonical forms
# --------------------------------------------------------------------------------------
class PolicyChangedError(ConfigError):
    """The policy file of a budget differs from the policy the ledger registered: a change
    takes effect only when an admin accepts it (``dp-spark budget accept-policy``)."""

    def __init__(self, budget_id: str, registered: BudgetPolicy, new: BudgetPolicy):
        self.budget_id = budget_id
        self.registered_hash = policy_hash(registered)
        self.new_hash = policy_hash(new)
        self.changes = policy_changes(registered, new)
        super().__init__(
            f"budget {budget_id!r}: the budget policy file differs from the policy the ledger registered "
            f"(registered {self.registered_hash[:12]}, file {self.new_hash[:12]}; "
            + "; ".join(self.changes) + "). A policy change takes effect only when an admin accepts it: "
            f'dp-spark budget accept-policy --budget {budget_id} --reason "..." (recorded in the audit log '
            "and the budget's policy history); until then releases on this budget are refused"
        )


@dataclass(frozen=True)
class PolicyRecord:
    """One policy the ledger registered for a budget (``version`` 1 = first registration)."""

    budget_id: str
    version: int
    policy_hash: str
    policy: dict
    principal: str
    reason: str
    at: datetime
    changes: tuple[str, ...] = ()  # against the previous version

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "policy_hash": self.policy_hash, "policy": self.policy,
                "principal": self.principal, "reason": self.reason, "at": ts_text(self.at),
                "changes": list(self.changes)}


@dataclass(frozen=True)
class VersionRecord:
    """One published version of a release family (``dp_versions``): ``state`` is current,
    superseded or withdrawn; ``changed_by``/``changed_at`` name the last state change (None
    while current since publication); ``reason`` why it was withdrawn."""

    family: str
    version_no: int
    release_id: str
    state: str
    reason: Optional[str]
    principal: str
    at: datetime
    changed_by: Optional[str]
    changed_at: Optional[datetime]


def policy_json(p: BudgetPolicy) -> str:
    return canonical(p.to_json())


def policy_hash(p: BudgetPolicy) -> str:
    """SHA-256 of the policy's canonical JSON (the same bytes on every store)."""
    return hashlib.sha256(policy_json(p).encode("utf-8")).hexdigest()


def _changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    def show(v: Any) -> str:
        return "none" if v is None else canonical(v) if isinstance(v, (dict, list)) else str(v)

    return [f"{k}: {show(old.get(k))} -> {show(new.get(k))}"
            for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]


def policy_changes(old: BudgetPolicy, new: BudgetPolicy) -> list[str]:
    """Human-readable field changes from ``old`` to ``new`` (e.g. ``cap: {...} -> {...}``)."""
    return _changes(old.to_json(), new.to_json())


def ts_text(dt: datetime) -> str:
    """Fixed-width UTC text (sorts like the instant): ``2026-01-31T23:59:59.000000Z``."""
    d = as_utc(dt, "timestamp")
    return (
        f"{d.year:04d}-{d.month:02d}-{d.day:02d}T{d.hour:02d}:{d.minute:02d}:{d.second:02d}"
        f".{d.microsecond:06d}Z"
    )


def parse_ts(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def charge_text(charge: Budget) -> str:
    return canonical(charge.to_json())


def parse_charge(text: str) -> Budget:
    return budget_from_json(json.loads(text))


def _utc_now() -> datetime:
    return datetime.now(UTC)


# --------------------------------------------------------------------------------------
# The key
# --------------------------------------------------------------------------------------
def _key_from_text(text: str, where: str) -> bytes:
    key = text.strip().encode("utf-8")
    if len(key) < MIN_KEY_BYTES:
        raise ConfigError(f"ledger key from {where} is shorter than {MIN_KEY_BYTES} bytes")
    return key


def _read_key_file(path: Path) -> bytes:
    try:
        mode = path.stat().st_mode
    except OSError:
        raise ConfigError(f"ledger key file {path} cannot be read") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"ledger key file {path} is accessible by group or others: chmod 600 it")
    try:
        return _key_from_text(path.read_text(encoding="utf-8"), f"file {path}")
    except (OSError, UnicodeDecodeError):
        raise ConfigError(f"ledger key file {path} cannot be read") from None


def _create_key_file(path: Path) -> bytes:
    """Create ``path`` with a fresh random key (0600), atomically; another process may win."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(secrets.token_hex(32) + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # fails if another process created the key first
        except FileExistsError:
            pass
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return _read_key_file(path)


def resolve_key(key: Optional[bytes], default_file: Optional[Path] = None, *, create: bool = True) -> bytes:
    """The HMAC key: ``key``, else ``$DP_SPARK_LEDGER_KEY`` (text), else the file named by
    ``$DP_SPARK_LEDGER_KEY_FILE``, else ``default_file`` (created 0600 when missing)."""
    if key is not None:
        if isinstance(key, str):
            key = key.encode("utf-8")
        if not isinstance(key, (bytes, bytearray)) or len(key) < MIN_KEY_BYTES:
            raise ConfigError(f"ledger key must be at least {MIN_KEY_BYTES} bytes")
        return bytes(key)
    env = os.environ.get(KEY_ENV)
    if env:
        return _key_from_text(env, f"${KEY_ENV}")
    env_file = os.environ.get(KEY_FILE_ENV)
    if env_file:
        return _read_key_file(Path(env_file))
    if default_file is None:
        raise ConfigError(f"this ledger needs an HMAC key: pass key=, or set ${KEY_ENV} or ${KEY_FILE_ENV}")
    if default_file.exists():
        return _read_key_file(default_file)
    if not create:
        raise ConfigError(f"ledger key file {default_file} is missing")
    return _create_key_file(default_file)


# --------------------------------------------------------------------------------------
# The interface
# --------------------------------------------------------------------------------------
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


# --------------------------------------------------------------------------------------
# The SQL implementation
# --------------------------------------------------------------------------------------
BUDGET_COLS = (
    "budget_id, dataset, privacy_unit, measure, cap, statement_delta, window_kind, window_days, "
    "max_per_release, head_seq, head_hash, updated_at, mac"
)
ENTRY_COLS = (
    "budget_id, seq, release_id, release_family, charge, event_json, state, principal, "
    "code_version, owner_token, lease_expires_at, created_at, committed_at, row_hash, state_mac"
)
AUDIT_COLS = (
    "seq, at, principal, action, spec_name, spec_version, decision, release_id, charge, detail, row_hash"
)

# The policy history of each budget: one row per policy the ledger registered (the first
# registration, then each change an admin accepted), chained per budget by an HMAC.
POLICIES_DDL = """CREATE TABLE IF NOT EXISTS dp_policies (
        budget_id TEXT NOT NULL REFERENCES dp_budgets (budget_id),
        version BIGINT NOT NULL CHECK (version >= 1),
        policy_hash TEXT NOT NULL,
        policy_json TEXT NOT NULL,
        principal TEXT NOT NULL,
        reason TEXT NOT NULL,
        at TEXT NOT NULL,
        row_hash TEXT NOT NULL,
        PRIMARY KEY (budget_id, version)
    )"""
POLICY_COLS = "budget_id, version, policy_hash, policy_json, principal, reason, at, row_hash"

# The version record of each release family (publish, supersede, withdraw, restore): rows
# whose state changes, each MAC'd over all its fields. Added to existing ledgers on open.
VERSIONS_DDL = (
    """CREATE TABLE IF NOT EXISTS dp_versions (
        family TEXT NOT NULL,
        version_no BIGINT NOT NULL CHECK (version_no >= 1),
        release_id TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('current', 'superseded', 'withdrawn')),
        reason TEXT,
        principal TEXT NOT NULL,
        at TEXT NOT NULL,
        changed_by TEXT,
        changed_at TEXT,
        mac TEXT NOT NULL,
        PRIMARY KEY (family, version_no),
        UNIQUE (family, release_id)
    )""",
    "CREATE UNIQUE INDEX IF NOT EXISTS dp_versions_one_current ON dp_versions (family) WHERE state = 'current'",
)
VERSION_COLS = "family, version_no, release_id, state, reason, principal, at, changed_by, changed_at, mac"
IMMUTABLE_VERSION_COLUMNS = "family, version_no, release_id, principal, at"

TABLES_DDL = (
    """CREATE TABLE IF NOT EXISTS dp_ledger_meta (
        name TEXT PRIMARY KEY,
        value TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS dp_budgets (
        budget_id TEXT PRIMARY KEY,
        dataset TEXT NOT NULL,
        privacy_unit TEXT NOT NULL,
        measure TEXT NOT NULL,
        cap TEXT NOT NULL,
        statement_delta TEXT,
        window_kind TEXT NOT NULL,
        window_days INTEGER,
        max_per_release TEXT,
        head_seq BIGINT NOT NULL,
        head_hash TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        mac TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS dp_bindings (
        dataset_identity TEXT NOT NULL,
        privacy_unit TEXT NOT NULL,
        budget_id TEXT NOT NULL REFERENCES dp_budgets (budget_id),
        created_at TEXT NOT NULL,
        mac TEXT NOT NULL,
        PRIMARY KEY (dataset_identity, privacy_unit)
    )""",
    """CREATE TABLE IF NOT EXISTS dp_entries (
        budget_id TEXT NOT NULL REFERENCES dp_budgets (budget_id),
        seq BIGINT NOT NULL CHECK (seq >= 1),
        release_id TEXT NOT NULL UNIQUE,
        release_family TEXT NOT NULL,
        charge TEXT NOT NULL,
        event_json TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('reserved', 'committed')),
        principal TEXT NOT NULL,
        code_version TEXT NOT NULL,
        owner_token TEXT NOT NULL,
        lease_expires_at TEXT NOT NULL,
        created_at TEXT NOT NULL,
        committed_at TEXT,
        row_hash TEXT NOT NULL,
        state_mac TEXT NOT NULL,
        PRIMARY KEY (budget_id, seq)
    )""",
    "CREATE INDEX IF NOT EXISTS dp_entries_family ON dp_entries (release_family, state)",
    "CREATE INDEX IF NOT EXISTS dp_entries_created ON dp_entries (budget_id, created_at)",
    POLICIES_DDL,
    *VERSIONS_DDL,
    """CREATE TABLE IF NOT EXISTS dp_audit (
        seq BIGINT PRIMARY KEY,
        at TEXT NOT NULL,
        principal TEXT NOT NULL,
        action TEXT NOT NULL,
        spec_name TEXT,
        spec_version TEXT,
        decision TEXT NOT NULL,
        release_id TEXT,
        charge TEXT,
        detail TEXT,
        row_hash TEXT NOT NULL
    )""",
)

# Columns no code path ever updates (the protocol only touches state, owner, lease, commit time).
IMMUTABLE_ENTRY_COLUMNS = (
    "budget_id, seq, release_id, release_family, charge, event_json, principal, code_version, "
    "created_at, row_hash"
)


class _Retry(Exception):
    """A compare-and-set lost a race: run the transaction again."""


class Cursor:
    """A thin cursor over either driver; SQL is written with ``?`` placeholders."""

    def __init__(self, execute: Callable[..., Any], paramstyle: str):
        self._execute = execute
        self._pg = paramstyle == "format"

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self._pg else sql

    def _run(self, sql: str, params: Sequence[Any]) -> Any:
        # no parameters -> no placeholder parsing (DDL may contain a literal '%')
        return self._execute(self._sql(sql), tuple(params)) if params else self._execute(sql)

    def q(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        return list(self._run(sql, params).fetchall())

    def one(self, sql: str, params: Sequence[Any] = ()) -> Optional[tuple]:
        rows = self.q(sql, params)
        return rows[0] if rows else None

    def x(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self._run(sql, params).rowcount


@dataclass(frozen=True)
class _BudgetRow:
    policy: BudgetPolicy
    head_seq: int
    head_hash: str
    updated_at: str
    texts: tuple  # the stored policy columns, as text, in BUDGET_COLS order (without head/mac)


@dataclass(frozen=True)
class _Spend:
    """A budget's spend summary at chain head (seq, hash): the lifetime total of its charges
    and, for every UTC day >= ``from_day`` (YYYY-MM-DD), the total of the entries created that
    day (days without entries are absent). Days before ``from_day`` were pruned."""

    seq: int
    hash: str
    total: Budget
    from_day: str
    days: Mapping[str, Budget]


def _day(ts: str) -> str:
    return ts[:10]


def _horizon(policy: BudgetPolicy, t: datetime) -> str:
    """The first UTC day whose total the current window (at ``t``) may need."""
    start, _ = policy.window.bounds(t)
    return _day(ts_text(start if start is not None else t))


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


def _check_text(value: Any, name: str, *, optional: bool = False) -> Optional[str]:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_TEXT:
        raise LedgerError(f"{name} must be a non-empty string of at most {MAX_TEXT} characters")
    if any(ord(c) < 32 for c in value):
        raise LedgerError(f"{name} must not contain control characters")
    return value


class SqlLedger(Ledger):
    """The ledger over a DB-API connection; subclasses supply the connection and dialect."""

    dialect = "sql"
    paramstyle = "qmark"
    for_update = ""
    max_attempts = 50
    # reserve/commit fully verify this many entries at the end of a budget's chain (plus the
    # link to the entry before them and the absence of any entry past the head): O(1) work.
    verify_tail = 8

    def __init__(self, *, key: bytes, clock: Optional[Clock], description: str):
        self._key = key
        self._clock: Clock = clock or _utc_now
        self._lock = threading.RLock()
        self._closed = False
        self.description = description

    # -- subclass hooks --------------------------------------------------------------
    @abc.abstractmethod
    def _transaction(self, write: bool) -> Iterator[Cursor]:
        """Context manager: one transaction (write: serialised with other writers)."""

    @abc.abstractmethod
    def _classify(self, exc: BaseException) -> Optional[str]:
        """'retry' | 'unavailable' | 'corrupt' | None for a driver exception."""

    @abc.abstractmethod
    def _schema_exists(self, cur: Cursor) -> bool: ...

    @abc.abstractmethod
    def _guard_ddl(self) -> Sequence[str]:
        """Triggers refusing UPDATE/DELETE of immutable rows (dialect-specific)."""

    @abc.abstractmethod
    def _table_exists(self, cur: Cursor, name: str) -> bool: ...

    def _schema_lock(self, cur: Cursor) -> None:
        """Serialise schema creation between processes (PostgreSQL: advisory lock)."""

    def _close_connection(self) -> None: ...

    # -- plumbing --------------------------------------------------------------------
    def _mac(self, domain: str, *parts: Any) -> str:
        msg = domain.encode() + b"\x00" + canonical(list(parts)).encode("utf-8")
        return hmac.new(self._key, msg, hashlib.sha256).hexdigest()

    def _now(self, now: Optional[datetime]) -> datetime:
        return as_utc(now if now is not None else self._clock(), "now")

    def _run(self, op: str, fn: Callable[[Cursor], Any], *, write: bool) -> Any:
        if self._closed:
            raise LedgerError(f"{self.description} is closed")
        for attempt in range(1, self.max_attempts + 1):
            try:
                with self._lock:
                    with self._transaction(write) as cur:
                        return fn(cur)
            except DpSparkError:
                raise
            except _Retry:
                kind = "retry"
                exc: BaseException = _Retry()
            except Exception as e:  # driver errors
                exc = e
                kind = self._classify(e)
            if kind == "retry" and attempt < self.max_attempts:
                time.sleep(random.uniform(0, 0.002 * min(attempt, 20)))
                continue
            reason = self._reason(exc)
            if kind == "unavailable":
                raise LedgerUnavailableError(
                    f"{self.description} is unavailable ({op}): {reason}; nothing was recorded"
                ) from None
            if kind == "corrupt":
                raise LedgerIntegrityError(f"{self.description} is corrupt or was tampered with ({op}): {reason}") from None
            raise LedgerError(f"{self.description}: {op} failed: {reason}") from None
        raise AssertionError("unreachable")

    def _reason(self, exc: BaseException) -> str:
        text = str(exc).strip().splitlines()
        return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._close_connection()

    # -- schema ----------------------------------------------------------------------
    def _init_schema(self) -> None:
        key_check = self._mac("key-check", SCHEMA_VERSION)

        def fn(cur: Cursor) -> None:
            if not self._schema_exists(cur):
                self._schema_lock(cur)
                for stmt in TABLES_DDL:
                    cur.x(stmt)
                for stmt in self._guard_ddl():
                    cur.x(stmt)
            else:
                # a ledger created before the policy history or the version record: add the
                # missing tables and (re)create every guard (idempotent)
                missing = [ddl for name, ddl in (("dp_policies", (POLICIES_DDL,)), ("dp_versions", VERSIONS_DDL))
                           if not self._table_exists(cur, name)]
                if missing:
                    self._schema_lock(cur)
                    for ddl in missing:
                        for stmt in ddl:
                            cur.x(stmt)
                    for stmt in self._guard_ddl():
                        cur.x(stmt)
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
    def _budget_mac(self, texts: tuple, head_seq: int, head_hash: str, updated_at: str) -> str:
        return self._mac("budget", *texts, head_seq, head_hash, updated_at)

    def _load_budget(self, cur: Cursor, budget_id: str, *, lock: bool) -> _BudgetRow:
        row = cur.one(
            f"SELECT {BUDGET_COLS} FROM dp_budgets WHERE budget_id = ?" + (self.for_update if lock else ""),
            (budget_id,),
        )
        if row is None:
            raise UnknownBudgetError(budget_id)
        return self._budget_from_row(row)

    def _budget_from_row(self, row: tuple) -> _BudgetRow:
        texts = tuple(row[:9])
        head_seq, head_hash, updated_at, mac = row[9], row[10], row[11], row[12]
        bid = texts[0]
        if not hmac.compare_digest(str(mac), self._budget_mac(texts, head_seq, head_hash, updated_at)):
            raise LedgerIntegrityError(
                f"ledger integrity check failed: budget {bid!r}: the budget row was edited "
                f"outside the ledger (policy or chain head), or the key is wrong"
            )
        try:
            policy = BudgetPolicy(
                budget_id=texts[0],
                dataset=texts[1],
                privacy_unit=texts[2],
                measure=texts[3],
                cap=parse_charge(texts[4]),
                statement_delta=None if texts[5] is None else Fraction(texts[5]),
                window=WindowPolicy(kind=texts[6], days=texts[7]),
                max_per_release=None if texts[8] is None else parse_charge(texts[8]),
            )
        except (DpSparkError, ValueError, TypeError):
            raise LedgerIntegrityError(f"ledger integrity check failed: budget {bid!r}: unreadable policy") from None
        return _BudgetRow(policy, int(head_seq), head_hash, updated_at, texts)

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
        _check_text(principal, "principal")
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

    def _check_policy_change(self, cur: Cursor, b: _BudgetRow, policy: BudgetPolicy, now: datetime) -> None:
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
            bound = cur.one("SELECT COUNT(*) FROM dp_bindings WHERE budget_id = ?", (policy.budget_id,))[0]
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
        _check_text(principal, "principal")
        _check_text(reason, "reason")
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
                raise _Retry()
            rec = self._append_policy(cur, policy, principal, reason, stamp, b.policy)
            self._append_audit_in(cur, stamp, (
                principal, "admin", None, None, "policy_accepted", None, None,
                canonical({"budget_id": policy.budget_id, "from": policy_hash(b.policy), "to": rec.policy_hash,
                           "version": rec.version, "reason": reason, "changes": changes}),
            ))
            return rec

        return self._run("accept_policy", fn, write=True)

    # -- policy history ----------------------------------------------------------------
    def _policy_row_hash(self, prev: str, r: Sequence[Any]) -> str:
        return self._mac("policy", prev, r[0], int(r[1]), *r[2:7])

    def _last_policy(self, cur: Cursor, budget_id: str) -> Optional[tuple]:
        return cur.one(f"SELECT {POLICY_COLS} FROM dp_policies WHERE budget_id = ? ORDER BY version DESC LIMIT 1",
                       (budget_id,))

    def _append_policy(self, cur: Cursor, policy: BudgetPolicy, principal: str, reason: str, stamp: str,
                       previous: Optional[BudgetPolicy]) -> PolicyRecord:
        last = self._last_policy(cur, policy.budget_id)
        version = 1 if last is None else int(last[1]) + 1
        prev_hash = GENESIS if last is None else str(last[7])
        r = (policy.budget_id, version, policy_hash(policy), policy_json(policy), principal, reason, stamp)
        cur.x(f"INSERT INTO dp_policies ({POLICY_COLS}) VALUES ({', '.join(['?'] * 8)})",
              (*r, self._policy_row_hash(prev_hash, r)))
        return PolicyRecord(policy.budget_id, version, r[2], json.loads(r[3]), principal, reason, parse_ts(stamp),
                            tuple(policy_changes(previous, policy)) if previous is not None else ())

    def _policy_problems(self, cur: Cursor, b: _BudgetRow) -> tuple[list[str], list[PolicyRecord]]:
        bid = b.policy.budget_id
        rows = cur.q(f"SELECT {POLICY_COLS} FROM dp_policies WHERE budget_id = ? ORDER BY version", (bid,))
        problems: list[str] = []
        records: list[PolicyRecord] = []
        prev, prev_policy = GENESIS, None
        for i, r in enumerate(rows, start=1):
            if int(r[1]) != i:
                problems.append(f"budget {bid!r}: policy version {r[1]}: sequence gap (expected {i})")
            if not hmac.compare_digest(str(r[7]), self._policy_row_hash(prev, r)):
                problems.append(f"budget {bid!r}: policy version {r[1]}: edited or inserted outside the ledger")
            try:
                content = json.loads(r[3])
            except ValueError:
                content = {}
            if hashlib.sha256(str(r[3]).encode("utf-8")).hexdigest() != r[2]:
                problems.append(f"budget {bid!r}: policy version {r[1]}: content does not match its hash")
            records.append(PolicyRecord(bid, int(r[1]), str(r[2]), content, str(r[4]), str(r[5]), parse_ts(r[6]),
                                        tuple(_changes(prev_policy, content)) if prev_policy is not None else ()))
            prev, prev_policy = str(r[7]), content
        if rows and str(rows[-1][2]) != policy_hash(b.policy):
            problems.append(f"budget {bid!r}: the registered policy is not the last one in its policy history "
                            "(changed or history truncated outside the ledger)")
        return problems, records

    def policy_history(self, budget_id: str) -> list[PolicyRecord]:
        """Every policy the ledger registered for ``budget_id``, oldest first, verified (MAC
        chain, content hashes, and that the last is the policy in force)."""
        def fn(cur: Cursor) -> list[PolicyRecord]:
            b = self._load_budget(cur, budget_id, lock=False)
            problems, records = self._policy_problems(cur, b)
            self._raise_problems(problems)
            return records

        return self._run("policy_history", fn, write=False)

    def get_policy(self, budget_id: str) -> BudgetPolicy:
        """The policy registered for ``budget_id`` (UnknownBudgetError if none)."""
        return self._run("get_policy", lambda cur: self._load_budget(cur, budget_id, lock=False).policy, write=False)

    def budget_ids(self) -> list[str]:
        return [r[0] for r in self._run(
            "budget_ids", lambda cur: cur.q("SELECT budget_id FROM dp_budgets ORDER BY budget_id"), write=False)]

    # -- bindings --------------------------------------------------------------------
    def _binding_mac(self, identity: str, unit: str, budget_id: str, created_at: str) -> str:
        return self._mac("binding", identity, unit, budget_id, created_at)

    def _check_binding(self, row: tuple) -> str:
        identity, unit, budget_id, created_at, mac = row
        if not hmac.compare_digest(str(mac), self._binding_mac(identity, unit, budget_id, created_at)):
            raise LedgerIntegrityError(
                f"ledger integrity check failed: the binding of a dataset to budget {budget_id!r} "
                f"was edited outside the ledger"
            )
        return budget_id

    def bind_dataset(self, budget_id: str, dataset_identity: str, privacy_unit: str) -> None:
        """Bind a dataset identity (e.g. a Delta table id) and privacy unit to one budget.

        The pair (dataset_identity, privacy_unit) belongs to at most one budget, for ever:
        binding it to another budget raises ConfigError, so a copied config under a new budget
        id, or a renamed or moved table, cannot start from a fresh budget. Binding the same
        pair to the same budget again is a no-op.
        """
        _check_text(dataset_identity, "dataset_identity")
        _check_text(privacy_unit, "privacy_unit")

        def existing(cur: Cursor) -> Optional[str]:
            row = cur.one(
                "SELECT dataset_identity, privacy_unit, budget_id, created_at, mac FROM dp_bindings "
                "WHERE dataset_identity = ? AND privacy_unit = ?",
                (dataset_identity, privacy_unit),
            )
            return None if row is None else self._check_binding(row)

        def conflict(other: str, cur: Optional[Cursor] = None) -> ConfigError:
            how = ""
            if cur is not None:
                try:
                    measure = self._load_budget(cur, other, lock=False).policy.measure
                    amount = "rho: ..." if measure == "zcdp" else "epsilon: ..."
                    how = (f" To publish from this data, charge that budget: "
                           f"budget: {{id: {other}, measure: {measure}, {amount}}} in the spec.")
                except DpSparkError:  # an unreadable budget row: the message stays useful without the hint
                    how = ""
            return ConfigError(
                f"dataset identity {dataset_identity!r} (unit {privacy_unit!r}) is already governed "
                f"by budget {other!r}; it cannot also draw on budget {budget_id!r}: one budget per "
                f"dataset and unit, so that one accountant composes every release of it (a copied "
                f"config or a new budget id does not reset a budget).{how}"
            )

        def fn(cur: Cursor) -> None:
            b = self._load_budget(cur, budget_id, lock=True)
            if privacy_unit != b.policy.privacy_unit:
                raise ConfigError(
                    f"budget {budget_id!r} protects unit {b.policy.privacy_unit!r}, not {privacy_unit!r}"
                )
            other = existing(cur)
            if other is not None:
                if other != budget_id:
                    raise conflict(other, cur)
                return
            stamp = ts_text(self._now(None))
            n = cur.x(
                "INSERT INTO dp_bindings (dataset_identity, privacy_unit, budget_id, created_at, mac) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (dataset_identity, privacy_unit) DO NOTHING",
                (dataset_identity, privacy_unit, budget_id, stamp,
                 self._binding_mac(dataset_identity, privacy_unit, budget_id, stamp)),
            )
            if n != 1:  # a concurrent binder won: read its binding (READ COMMITTED sees it)
                other = existing(cur)
                if other is None:
                    raise _Retry()
                if other != budget_id:
                    raise conflict(other, cur)

        self._run("bind_dataset", fn, write=True)

    def budget_for_dataset(self, dataset_identity: str, privacy_unit: str) -> Optional[str]:
        """The budget a dataset identity and unit are bound to, or None."""
        def fn(cur: Cursor) -> Optional[str]:
            row = cur.one(
                "SELECT dataset_identity, privacy_unit, budget_id, created_at, mac FROM dp_bindings "
                "WHERE dataset_identity = ? AND privacy_unit = ?",
                (dataset_identity, privacy_unit),
            )
            return None if row is None else self._check_binding(row)

        return self._run("budget_for_dataset", fn, write=False)

    def bindings(self, budget_id: Optional[str] = None) -> list[tuple[str, str, str]]:
        """(dataset_identity, privacy_unit, budget_id) triples, verified."""
        def fn(cur: Cursor) -> list[tuple[str, str, str]]:
            sql = "SELECT dataset_identity, privacy_unit, budget_id, created_at, mac FROM dp_bindings"
            rows = cur.q(sql + " WHERE budget_id = ? ORDER BY 1, 2", (budget_id,)) if budget_id else cur.q(sql + " ORDER BY 1, 2")
            return [(r[0], r[1], self._check_binding(r)) for r in rows]

        return self._run("bindings", fn, write=False)

    # -- entries ---------------------------------------------------------------------
    def _row_hash(self, prev: str, r: tuple) -> str:
        # immutable fields: budget_id, seq, release_id, release_family, charge, event_json,
        # principal, code_version, created_at
        return self._mac("entry", prev, r[0], r[1], r[2], r[3], r[4], r[5], r[7], r[8], r[11])

    def _state_mac(self, row_hash: str, state: str, owner: str, lease: str, committed: Optional[str]) -> str:
        return self._mac("entry-state", row_hash, state, owner, lease, committed)

    @staticmethod
    def _entry(r: tuple) -> LedgerEntry:
        return LedgerEntry(
            budget_id=r[0],
            seq=int(r[1]),
            release_id=r[2],
            charge=parse_charge(r[4]),
            event_json=r[5],
            state=r[6],
            principal=r[7],
            code_version=r[8],
            owner_token=r[9],
            lease_expires_at=parse_ts(r[10]),
            created_at=parse_ts(r[11]),
            committed_at=None if r[12] is None else parse_ts(r[12]),
            release_family=r[3],
            row_hash=r[13],
        )

    def _chain_problems(self, b: _BudgetRow, rows: list[tuple]) -> tuple[list[str], list[LedgerEntry]]:
        """Problems of a budget's whole chain (``rows``: all its entries in seq order)."""
        problems, entries, prev = self._link_problems(b, rows, GENESIS, 1)
        if b.head_seq != len(rows) or b.head_hash != prev:
            problems.append(
                f"budget {b.policy.budget_id!r}: chain head says {b.head_seq} entries but {len(rows)} are stored "
                f"(rows deleted or inserted outside the ledger)"
            )
        return problems, entries

    def _link_problems(
        self, b: _BudgetRow, rows: Sequence[tuple], prev: str, first: int
    ) -> tuple[list[str], list[LedgerEntry], str]:
        """Check ``rows`` as consecutive links seq ``first``, ``first + 1``, ... chained from
        ``prev`` (the row hash before them). Returns (problems, entries, last row hash)."""
        problems: list[str] = []
        entries: list[LedgerEntry] = []
        bid = b.policy.budget_id
        for i, r in enumerate(rows, start=first):
            seq = int(r[1])
            where = f"budget {bid!r} seq {seq}"
            if seq != i:
                problems.append(f"{where}: sequence gap or duplicate (expected seq {i})")
            if not hmac.compare_digest(str(r[13]), self._row_hash(prev, r)):
                problems.append(f"{where}: row hash mismatch (row edited or inserted outside the ledger)")
            elif not hmac.compare_digest(str(r[14]), self._state_mac(r[13], r[6], r[9], r[10], r[12])):
                problems.append(f"{where}: state, owner or lease edited outside the ledger")
            try:
                e = self._entry(r)
                if e.state not in STATES:
                    raise ValueError("state")
                if e.charge.MEASURE != b.policy.measure:
                    problems.append(f"{where}: charge is not in the budget's measure")
                entries.append(e)
            except (DpSparkError, ValueError, TypeError, KeyError):
                problems.append(f"{where}: unreadable row")
            prev = str(r[13])
        return problems, entries, prev

    @staticmethod
    def _raise_problems(problems: list[str]) -> None:
        if problems:
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            raise LedgerIntegrityError("ledger integrity check failed: " + "; ".join(problems[:5]) + more)

    def _verified_entries(self, cur: Cursor, b: _BudgetRow) -> list[LedgerEntry]:
        rows = cur.q(f"SELECT {ENTRY_COLS} FROM dp_entries WHERE budget_id = ? ORDER BY seq", (b.policy.budget_id,))
        problems, entries = self._chain_problems(b, rows)
        self._raise_problems(problems)
        return entries

    # -- the write path's O(1) checks ---------------------------------------------------
    def _verified_tail(self, cur: Cursor, b: _BudgetRow) -> dict[str, LedgerEntry]:
        """Verify the end of the budget's chain against its (MAC-checked) head: the last
        ``verify_tail`` entries' row hashes and state MACs, their links back to the entry
        before them, that the last one is the head (seq and hash) and that no entry lies past
        it. Catches a truncated, rewritten or extended tail. Returns those entries by release id."""
        bid = b.policy.budget_id
        lo = b.head_seq - self.verify_tail
        if lo >= 1:
            rows = cur.q(f"SELECT {ENTRY_COLS} FROM dp_entries WHERE budget_id = ? AND seq >= ? ORDER BY seq LIMIT ?",
                         (bid, lo, self.verify_tail + 2))
            if not rows or int(rows[0][1]) != lo:
                self._raise_problems([f"budget {bid!r} seq {lo}: missing (rows deleted outside the ledger)"])
            prev, body, first = str(rows[0][13]), rows[1:], lo + 1
        else:
            body = cur.q(f"SELECT {ENTRY_COLS} FROM dp_entries WHERE budget_id = ? ORDER BY seq LIMIT ?",
                         (bid, b.head_seq + 1))
            prev, first = GENESIS, 1
        problems, entries, last = self._link_problems(b, body, prev, first)
        if first + len(body) - 1 != b.head_seq or last != b.head_hash:
            end = int(body[-1][1]) if body else first - 1
            problems.append(
                f"budget {bid!r}: chain head says {b.head_seq} entries but the stored chain ends at seq {end} "
                f"(rows deleted or inserted outside the ledger)"
            )
        self._raise_problems(problems)
        return {e.release_id: e for e in entries}

    def _after_watermark(self, rows: Sequence[tuple], w: int, seq_i: int, hash_i: int,
                         where: str) -> tuple[str, Sequence[tuple]]:
        """``rows`` (seq >= max(w, 1), in order) split into the stored hash of row ``w`` (the
        link the next row must chain from; the genesis when ``w`` is 0) and the rows after it."""
        if w < 1:
            return GENESIS, rows
        if not rows or int(rows[0][seq_i]) != w:
            self._raise_problems([f"{where} {w}: missing (rows deleted outside the ledger)"])
        return str(rows[0][hash_i]), rows[1:]

    def _verified_entry(self, cur: Cursor, b: _BudgetRow, r: tuple) -> LedgerEntry:
        """Verify one entry row of budget ``b`` (its row hash, linked to the stored hash of the
        entry before it, and its state MAC) without reading the rest of the chain."""
        bid = b.policy.budget_id
        seq = int(r[1])
        if seq > b.head_seq:
            self._raise_problems([f"budget {bid!r} seq {seq}: past the chain head (inserted outside the ledger)"])
        if seq == 1:
            prev = GENESIS
        else:
            p = cur.one("SELECT row_hash FROM dp_entries WHERE budget_id = ? AND seq = ?", (bid, seq - 1))
            if p is None:
                self._raise_problems([f"budget {bid!r} seq {seq - 1}: missing (rows deleted outside the ledger)"])
            prev = str(p[0])
        problems, entries, _ = self._link_problems(b, [r], prev, seq)
        self._raise_problems(problems)
        return entries[0]

    # -- spend summaries ---------------------------------------------------------------
    def _spend_mac(self, bid: str, seq: int, head: str, total: dict, from_day: str, days: dict) -> str:
        return self._mac("spend", bid, seq, head, total, from_day, days)

    def _load_spend(self, cur: Cursor, b: _BudgetRow) -> Optional[_Spend]:
        """The budget's spend summary if it describes its current head; None when there is none
        or it describes an older head. A summary whose MAC fails is an integrity error."""
        bid = b.policy.budget_id
        row = cur.one("SELECT value FROM dp_ledger_meta WHERE name = ?", (SPEND_PREFIX + bid,))
        if row is None:
            return None
        s = self._parse_spend(bid, row[0])
        if s.seq != b.head_seq or s.hash != b.head_hash or s.total.MEASURE != b.policy.measure:
            return None
        return s

    def _parse_spend(self, bid: str, text: str) -> _Spend:
        try:
            d = json.loads(text)
            seq, head, total, from_day, days, mac = (
                int(d["seq"]), str(d["hash"]), d["total"], str(d["from"]), d["days"], str(d["mac"]))
            ok = hmac.compare_digest(mac, self._spend_mac(bid, seq, head, total, from_day, days))
            if ok:
                return _Spend(seq, head, budget_from_json(total), from_day,
                              {str(k): budget_from_json(v) for k, v in days.items()})
        except (TypeError, ValueError, KeyError, AttributeError, DpSparkError):
            pass
        raise LedgerIntegrityError(
            f"ledger integrity check failed: budget {bid!r}: the spend summary was edited outside the ledger"
        )

    def _store_spend(self, cur: Cursor, bid: str, s: _Spend) -> None:
        total = s.total.to_json()
        days = {k: v.to_json() for k, v in sorted(s.days.items())}
        value = canonical({"seq": s.seq, "hash": s.hash, "total": total, "from": s.from_day, "days": days,
                           "mac": self._spend_mac(bid, s.seq, s.hash, total, s.from_day, days)})
        cur.x("INSERT INTO dp_ledger_meta (name, value) VALUES (?, ?) "
              "ON CONFLICT (name) DO UPDATE SET value = excluded.value", (SPEND_PREFIX + bid, value))

    @staticmethod
    def _spend_of(b: _BudgetRow, entries: Sequence[LedgerEntry], from_day: str) -> _Spend:
        zero = MEASURES[b.policy.measure].zero()
        total, days = zero, {}
        for e in entries:
            total = total + e.charge
            d = _day(ts_text(e.created_at))
            if d >= from_day:
                days[d] = days.get(d, zero) + e.charge
        return _Spend(b.head_seq, b.head_hash, total, from_day, days)

    def _summary_spent(self, cur: Cursor, b: _BudgetRow, s: _Spend, t: datetime) -> Optional[Budget]:
        """Spent in the window at ``t`` from the summary, or None if it lacks the days needed."""
        policy = b.policy
        zero = MEASURES[policy.measure].zero()
        start, end = policy.window.bounds(t)
        if start is None:
            return s.total
        sd = _day(ts_text(start))
        if sd < s.from_day:
            return None
        if policy.window.kind != "rolling":
            ed = _day(ts_text(end))
            return sum((v for d, v in s.days.items() if sd <= d < ed), zero)
        # rolling: whole days from the start's day on (later ones too: a skewed clock cannot
        # hide spend), less the entries of the start's day created before the start. Those are
        # verified one by one: a forged or inflated one could only lower spent, so none is trusted.
        spent = sum((v for d, v in s.days.items() if d >= sd), zero)
        early = cur.q(f"SELECT {ENTRY_COLS} FROM dp_entries WHERE budget_id = ? AND created_at >= ? "
                      "AND created_at < ? ORDER BY seq", (policy.budget_id, sd + "T00:00:00.000000Z", ts_text(start)))
        for r in early:
            spent = spent - self._verified_entry(cur, b, r).charge
        return spent

    def _window_spent(self, cur: Cursor, b: _BudgetRow, t: datetime) -> tuple[Budget, _Spend]:
        """Spent in the window at ``t`` and the summary at the current head. From the stored
        summary when it describes the head and covers the window (O(1)); otherwise the whole
        chain is verified and the summary rebuilt from it."""
        if b.head_seq == 0:
            return MEASURES[b.policy.measure].zero(), _Spend(0, GENESIS, MEASURES[b.policy.measure].zero(),
                                                             _horizon(b.policy, t), {})
        s = self._load_spend(cur, b)
        if s is not None:
            spent = self._summary_spent(cur, b, s, t)
            if spent is not None:
                return spent, s
        entries = self._verified_entries(cur, b)
        return self._spent(b.policy, entries, t)[0], self._spend_of(b, entries, _horizon(b.policy, t))

    def _spend_problems(self, cur: Cursor, b: _BudgetRow, entries: Sequence[LedgerEntry]) -> list[str]:
        """verify(): the summary's MAC, and its totals when it describes the head."""
        bid = b.policy.budget_id
        row = cur.one("SELECT value FROM dp_ledger_meta WHERE name = ?", (SPEND_PREFIX + bid,))
        if row is None:
            return []
        try:
            s = self._parse_spend(bid, row[0])
        except LedgerIntegrityError as exc:
            return [str(exc).replace("ledger integrity check failed: ", "")]
        if s.seq != b.head_seq or s.hash != b.head_hash:
            return []  # describes an older head: ignored, rebuilt by the next reserve
        want = self._spend_of(b, entries, s.from_day)
        if s.total != want.total or dict(s.days) != dict(want.days):
            return [f"budget {bid!r}: the spend summary does not match the entries"]
        return []

    @staticmethod
    def _spent(policy: BudgetPolicy, entries: list[LedgerEntry], now: datetime) -> tuple[Budget, int]:
        spent = MEASURES[policy.measure].zero()
        n = 0
        for e in entries:
            if policy.window.contains(e.created_at, now):
                spent = spent + e.charge
                n += 1
        return spent, n

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
                        sql, args = sql + " AND created_at < ?", args + [ts_text(end)]
                    n = int(cur.one(sql, tuple(args))[0])
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
        _check_text(budget_id, "budget_id")
        _check_text(release_id, "release_id")
        _check_text(principal, "principal")
        _check_text(code_version, "code_version")
        _check_text(release_family, "release_family")
        _check_text(owner_token, "owner_token")
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
                    raise _Retry()
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
                raise _Retry()
            keep = max(summary.from_day, _horizon(policy, t))
            days = {d: v for d, v in summary.days.items() if d >= keep}
            if _day(created) >= keep:
                days[_day(created)] = days.get(_day(created), MEASURES[policy.measure].zero()) + charge
            self._store_spend(cur, budget_id, _Spend(seq, rh, summary.total + charge, keep, days))
            return Reservation(self._entry((*row, rh, smac)), False)

        return self._run("reserve", fn, write=True)

    def commit(self, release_id: str, owner_token: str, now: Optional[datetime] = None) -> LedgerEntry:
        """reserved -> committed. Already committed: a no-op returning the entry. Another
        owner with a live lease: ReleaseConflictError. Unknown release: UnknownReleaseError."""
        _check_text(release_id, "release_id")
        _check_text(owner_token, "owner_token")

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
                    self._raise_problems([f"release {release_id!r}: its entry vanished (deleted outside the ledger)"])
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
                raise _Retry()
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
            self._raise_problems(problems)

        self._run("verify", fn, write=False)

    def _version_problems(self, cur: Cursor) -> list[str]:
        """Every version row's MAC and at most one current version per family."""
        problems = []
        current: dict[str, int] = {}
        for r in cur.q(f"SELECT {VERSION_COLS} FROM dp_versions ORDER BY family, version_no"):
            if not hmac.compare_digest(str(r[9]), self._version_mac(r)):
                problems.append(f"version {r[1]} of family {r[0]!r} edited outside the ledger")
            if r[3] == "current":
                current[r[0]] = current.get(r[0], 0) + 1
        problems.extend(f"family {f!r} has {n} current versions" for f, n in sorted(current.items()) if n > 1)
        return problems

    # -- audit -----------------------------------------------------------------------
    def _audit_head_value(self, seq: int, head: str) -> str:
        return canonical({"seq": seq, "hash": head, "mac": self._mac("audit-head", seq, head)})

    def _audit_head(self, cur: Cursor, *, lock: bool) -> tuple[int, str]:
        row = cur.one("SELECT value FROM dp_ledger_meta WHERE name = 'audit_head'" + (self.for_update if lock else ""))
        try:
            d = json.loads(row[0])
            seq, head, mac = int(d["seq"]), str(d["hash"]), str(d["mac"])
        except (TypeError, ValueError, KeyError):
            raise LedgerIntegrityError("ledger integrity check failed: the audit chain head is missing or unreadable") from None
        if not hmac.compare_digest(mac, self._mac("audit-head", seq, head)):
            raise LedgerIntegrityError("ledger integrity check failed: the audit chain head was edited")
        return seq, head

    def _audit_hash(self, prev: str, r: tuple) -> str:
        return self._mac("audit", prev, *r[:10])

    def _audit_problems(self, cur: Cursor) -> list[str]:
        try:
            seq, head = self._audit_head(cur, lock=False)
        except LedgerIntegrityError as exc:
            return [str(exc).replace("ledger integrity check failed: ", "")]
        problems = []
        prev = GENESIS
        rows = cur.q(f"SELECT {AUDIT_COLS} FROM dp_audit ORDER BY seq")
        for i, r in enumerate(rows, start=1):
            if int(r[0]) != i:
                problems.append(f"audit seq {r[0]}: sequence gap (expected {i})")
            if not hmac.compare_digest(str(r[10]), self._audit_hash(prev, r)):
                problems.append(f"audit seq {r[0]}: row hash mismatch (edited or inserted outside the ledger)")
            prev = str(r[10])
        if seq != len(rows) or head != prev:
            problems.append(f"audit chain head says {seq} rows but {len(rows)} are stored")
        return problems

    def audit_rows_since(self, after: int) -> tuple[list[AuditRow], int]:
        """Audit rows with ``seq > after`` and the audit head's seq, verified in O(rows
        returned): each row's hash links to the stored row ``after`` (or the genesis) and the
        last one is the MAC'd audit head. An edit to a row at or before ``after`` (other than
        row ``after``'s own hash) is not seen here: ``verify()`` finds it."""
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise LedgerError("after must be a non-negative integer")

        def fn(cur: Cursor) -> tuple[list[AuditRow], int]:
            seq, head = self._audit_head(cur, lock=False)
            if after >= seq:
                return [], seq
            rows = cur.q(f"SELECT {AUDIT_COLS} FROM dp_audit WHERE seq >= ? AND seq <= ? ORDER BY seq",
                         (max(after, 1), seq))
            prev, body = self._after_watermark(rows, after, 0, 10, "audit seq")
            problems = []
            for i, r in enumerate(body, start=after + 1):
                if int(r[0]) != i:
                    problems.append(f"audit seq {r[0]}: sequence gap (expected {i})")
                if not hmac.compare_digest(str(r[10]), self._audit_hash(prev, r)):
                    problems.append(f"audit seq {r[0]}: row hash mismatch (edited or inserted outside the ledger)")
                prev = str(r[10])
            if after + len(body) != seq or prev != head:
                problems.append(f"audit chain head says {seq} rows but the stored chain ends at seq {after + len(body)}")
            self._raise_problems(problems)
            return [self._audit(r) for r in body], seq

        return self._run("audit_rows_since", fn, write=False)

    @staticmethod
    def _audit(r: tuple) -> AuditRow:
        return AuditRow(int(r[0]), parse_ts(r[1]), r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10])

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
    ) -> AuditRow:
        """Append one audit row (append-only, hash-chained). Never pass data values.

        ``charge_json``: JSON text, a budget amount, or None. ``detail``: text, a mapping
        (stored as canonical JSON) or None.
        """
        _check_text(principal, "principal")
        _check_text(action, "action")
        _check_text(decision, "decision")
        _check_text(spec_name, "spec_name", optional=True)
        _check_text(spec_version, "spec_version", optional=True)
        _check_text(release_id, "release_id", optional=True)
        if charge_json is not None and not isinstance(charge_json, str):
            if type(charge_json) in MEASURES.values():
                charge_json = charge_text(charge_json)
            else:
                raise LedgerError("charge_json must be JSON text, a budget amount or None")
        if isinstance(charge_json, str):
            try:
                json.loads(charge_json)
            except ValueError:
                raise LedgerError("charge_json is not valid JSON") from None
        if isinstance(detail, Mapping):
            detail = canonical(dict(detail))
        elif detail is not None and not isinstance(detail, str):
            raise LedgerError("detail must be text, a mapping or None")
        if detail == "":
            detail = None

        def fn(cur: Cursor) -> AuditRow:
            return self._append_audit_in(cur, ts_text(self._now(now)), (
                principal, action, spec_name, spec_version, decision, release_id, charge_json, detail))

        return self._run("append_audit", fn, write=True)

    def _append_audit_in(self, cur: Cursor, at: str, fields: tuple) -> AuditRow:
        """Append one audit row inside the caller's write transaction."""
        seq, head = self._audit_head(cur, lock=True)
        r = (seq + 1, at, *fields)
        rh = self._audit_hash(head, r)
        cur.x(f"INSERT INTO dp_audit ({AUDIT_COLS}) VALUES ({', '.join(['?'] * 11)})", (*r, rh))
        n = cur.x(
            "UPDATE dp_ledger_meta SET value = ? WHERE name = 'audit_head' AND value = ?",
            (self._audit_head_value(seq + 1, rh), self._audit_head_value(seq, head)),
        )
        if n != 1:
            raise _Retry()
        return self._audit((*r, rh))

    def audit_rows(self, limit: Optional[int] = None) -> list[AuditRow]:
        """Audit rows in order; with ``limit``, the latest ``limit`` rows (still in order)."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise LedgerError("limit must be a non-negative integer")

        def fn(cur: Cursor) -> list[AuditRow]:
            if limit is None:
                rows = cur.q(f"SELECT {AUDIT_COLS} FROM dp_audit ORDER BY seq")
            else:
                rows = cur.q(f"SELECT {AUDIT_COLS} FROM dp_audit ORDER BY seq DESC LIMIT ?", (limit,))[::-1]
            return [self._audit(r) for r in rows]

        return self._run("audit_rows", fn, write=False)

    # -- the version record of release families ----------------------------------------
    def _version_mac(self, r: Sequence[Any]) -> str:
        return self._mac("version", *r[:9])

    def _version(self, r: Sequence[Any]) -> VersionRecord:
        """A dp_versions row (VERSION_COLS order), its MAC checked."""
        if not hmac.compare_digest(str(r[9]), self._version_mac(r)):
            raise LedgerIntegrityError(
                f"ledger integrity check failed: version {r[1]} of family {r[0]!r} was edited outside the ledger")
        return VersionRecord(family=r[0], version_no=int(r[1]), release_id=r[2], state=r[3], reason=r[4],
                             principal=r[5], at=parse_ts(r[6]), changed_by=r[7],
                             changed_at=None if r[8] is None else parse_ts(r[8]))

    def _family_versions(self, cur: Cursor, families: Sequence[str]) -> list[VersionRecord]:
        """Every version of ``families``, ordered by (family, version_no), MACs checked, and
        at most one current version per family (else LedgerIntegrityError)."""
        if not families:
            return []
        marks = ", ".join("?" * len(families))
        out = [self._version(r) for r in cur.q(
            f"SELECT {VERSION_COLS} FROM dp_versions WHERE family IN ({marks}) ORDER BY family, version_no",
            tuple(families))]
        for f in families:
            if sum(1 for v in out if v.family == f and v.state == "current") > 1:
                raise LedgerIntegrityError(f"ledger integrity check failed: family {f!r} has several current versions")
        return out

    def _lock_budgets_of(self, cur: Cursor, release_ids: Sequence[str]) -> None:
        """Take the budget lock (the budget row, ``FOR UPDATE`` on PostgreSQL; SQLite's write
        transaction is already exclusive) of every budget that charged one of ``release_ids``,
        in budget order, so a version change is serialised with that budget's reservations."""
        ids = sorted(set(release_ids))
        if not ids:
            return
        marks = ", ".join("?" * len(ids))
        budgets = sorted({r[0] for r in cur.q(
            f"SELECT DISTINCT budget_id FROM dp_entries WHERE release_id IN ({marks})", tuple(ids))})
        for bid in budgets:
            self._load_budget(cur, bid, lock=True)

    def _bump_versions_seq(self, cur: Cursor) -> int:
        """Count one more version-record change (``dp_ledger_meta``: an atomic increment);
        returns the new count. The derived ``_published`` Delta table records the count it
        was refreshed at."""
        n = cur.x("UPDATE dp_ledger_meta SET value = CAST(CAST(value AS BIGINT) + 1 AS TEXT) WHERE name = ?",
                  (VERSIONS_SEQ,))
        if n == 0:
            cur.x("INSERT INTO dp_ledger_meta (name, value) VALUES (?, ?)", (VERSIONS_SEQ, "1"))
        return int(cur.one("SELECT value FROM dp_ledger_meta WHERE name = ?", (VERSIONS_SEQ,))[0])

    def _insert_version(self, cur: Cursor, r: tuple) -> None:
        cur.x(f"INSERT INTO dp_versions ({VERSION_COLS}) VALUES ({', '.join(['?'] * 10)})",
              (*r, self._version_mac(r)))

    def _change_version(self, cur: Cursor, v: VersionRecord, new_state: str, principal: str, at: str,
                        reason: Optional[str] = None) -> None:
        """Compare-and-set one version's state (from ``v.state``); a lost race is retried."""
        r = (v.family, v.version_no, v.release_id, new_state, v.reason if reason is None else reason,
             v.principal, ts_text(v.at), principal, at)
        n = cur.x("UPDATE dp_versions SET state = ?, reason = ?, changed_by = ?, changed_at = ?, mac = ? "
                  "WHERE family = ? AND version_no = ? AND state = ?",
                  (new_state, r[4], principal, at, self._version_mac(r), v.family, v.version_no, v.state))
        if n != 1:
            raise _Retry()

    def record_versions(self, items: Sequence[tuple[str, str]], principal: str,
                        now: Optional[datetime] = None) -> list[int]:
        """Make each (family, release id) of ``items``, in order, the current version of its
        family, in ONE write transaction under the budget lock of the releases' budgets: a new
        version supersedes the family's current one, so the family's last new release ends up
        current. Idempotent per (family, release id): one that already has a version (in any
        state) changes nothing, so a withdrawn release never comes back. Returns each item's
        version number."""
        items = [(_check_text(f, "family"), _check_text(r, "release_id")) for f, r in items]
        _check_text(principal, "principal")
        at = ts_text(self._now(now))

        def fn(cur: Cursor) -> list[int]:
            self._lock_budgets_of(cur, [r for _, r in items])
            families = sorted({f for f, _ in items})
            rows = self._family_versions(cur, families)
            known = {(v.family, v.release_id): v.version_no for v in rows}
            next_no = {f: max((v.version_no for v in rows if v.family == f), default=0) + 1 for f in families}
            out = []
            changed = False
            for f, rid in items:
                if (f, rid) not in known:
                    for v in rows:
                        if v.family == f and v.state == "current":
                            self._change_version(cur, v, "superseded", principal, at)
                    rows = [replace(v, state="superseded") if v.family == f and v.state == "current" else v
                            for v in rows]
                    no = next_no[f]
                    next_no[f] += 1
                    self._insert_version(cur, (f, no, rid, "current", None, principal, at, None, None))
                    rows.append(VersionRecord(f, no, rid, "current", None, principal, parse_ts(at), None, None))
                    known[(f, rid)] = no
                    changed = True
                out.append(known[(f, rid)])
            if changed:
                self._bump_versions_seq(cur)
            return out

        if not items:
            return []
        return self._run("record_versions", fn, write=True)

    def withdraw_version(self, family: str, principal: str, reason: str,
                         now: Optional[datetime] = None) -> tuple[str, Optional[str]]:
        """Withdraw the family's current version and make the latest earlier superseded one
        current, in one write transaction under the budget lock of both releases' budgets.
        Returns (withdrawn release id, restored release id or None). Rows are never deleted.
        ConfigError when the family has no current version."""
        _check_text(family, "family")
        _check_text(principal, "principal")
        _check_text(reason, "reason")
        at = ts_text(self._now(now))

        def fn(cur: Cursor) -> tuple[str, Optional[str]]:
            rows = self._family_versions(cur, [family])
            self._lock_budgets_of(cur, [v.release_id for v in rows if v.state in ("current", "superseded")])
            rows = self._family_versions(cur, [family])  # under the lock
            cur_ = [v for v in rows if v.state == "current"]
            if not cur_:
                raise ConfigError(f"family {family!r} has no current version to roll back")
            c = cur_[0]
            earlier = [v for v in rows if v.version_no < c.version_no and v.state == "superseded"]
            prev = earlier[-1] if earlier else None
            self._change_version(cur, c, "withdrawn", principal, at, reason)
            if prev is not None:
                self._change_version(cur, prev, "current", principal, at)
            self._bump_versions_seq(cur)
            return c.release_id, None if prev is None else prev.release_id

        return self._run("withdraw_version", fn, write=True)

    def versions(self, family: Optional[str] = None) -> list[VersionRecord]:
        """The versions of ``family`` (of every family by default), ordered by (family,
        version_no), each row's MAC checked."""
        return self.versions_snapshot(family)[1]

    def versions_snapshot(self, family: Optional[str] = None) -> tuple[int, list[VersionRecord]]:
        """(the number of version-record changes so far, :meth:`versions`), read in one
        transaction: the derived ``_published`` table is refreshed from it."""
        def fn(cur: Cursor) -> tuple[int, list[VersionRecord]]:
            row = cur.one("SELECT value FROM dp_ledger_meta WHERE name = ?", (VERSIONS_SEQ,))
            if family is not None:
                return (0 if row is None else int(row[0])), self._family_versions(cur, [family])
            families = [r[0] for r in cur.q("SELECT DISTINCT family FROM dp_versions ORDER BY family")]
            return (0 if row is None else int(row[0])), self._family_versions(cur, families)

        return self._run("versions", fn, write=False)

    def import_versions(self, records: Sequence[VersionRecord]) -> bool:
        """Adopt a version history kept elsewhere (the ``_published`` Delta table of a
        deployment older than the ledger's version record), once: inserted in one transaction
        only while the ledger holds no version at all; True when imported. Every row is checked
        like the ledger's own (states, one current version per family, unique numbers)."""
        recs = sorted(records, key=lambda v: (v.family, v.version_no))
        for v in recs:
            _check_text(v.family, "family")
            _check_text(v.release_id, "release_id")
            _check_text(v.principal, "principal")
            if v.state not in VERSION_STATES:
                raise LedgerError(f"version {v.version_no} of family {v.family!r}: unknown state")

        def fn(cur: Cursor) -> bool:
            if cur.one("SELECT 1 FROM dp_versions LIMIT 1") is not None:
                return False
            for v in recs:
                self._insert_version(cur, (v.family, v.version_no, v.release_id, v.state, v.reason, v.principal,
                                           ts_text(v.at), v.changed_by,
                                           None if v.changed_at is None else ts_text(v.changed_at)))
            if recs:
                self._bump_versions_seq(cur)
            return bool(recs)

        return self._run("import_versions", fn, write=True)
