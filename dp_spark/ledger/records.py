"""The ledger's values: its errors, the records it returns, and the canonical text forms its
rows are stored (and MAC'd) in.

Timestamps are fixed-width UTC text and charges exact canonical JSON, so every row hashes to
the same bytes on SQLite and PostgreSQL. The bottom of the ledger's modules: it imports none
of them but :mod:`dp_spark.ledger.policy`. Nothing here imports pyspark.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Mapping, Optional, overload

from dp_spark.core.budget import Budget, budget_from_json
from dp_spark.errors import BudgetExceededError, ConfigError, LedgerError
from dp_spark.ledger.policy import BudgetPolicy, as_utc

__all__ = [
    "AuditRow",
    "BudgetStatus",
    "Clock",
    "GENESIS",
    "LedgerEntry",
    "MAX_TEXT",
    "PolicyChangedError",
    "PolicyRecord",
    "ReleaseLimitExceededError",
    "Reservation",
    "STATES",
    "UTC",
    "UnknownBudgetError",
    "UnknownReleaseError",
    "VERSION_STATES",
    "VersionRecord",
    "canonical",
    "charge_text",
    "check_text",
    "field_changes",
    "parse_charge",
    "parse_ts",
    "policy_changes",
    "policy_hash",
    "policy_json",
    "ts_text",
]

UTC = timezone.utc
GENESIS = "0" * 64  # the "previous hash" of the first row of every chain
MAX_TEXT = 512
STATES = ("reserved", "committed")
VERSION_STATES = ("current", "superseded", "withdrawn")
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
    while current since publication); ``reason`` why it was withdrawn. ``series_key``: the key
    (a day) this version of a series publishes, superseded only by a re-publication of that
    key; None for a version of the whole family (one current version per family)."""

    family: str
    version_no: int
    release_id: str
    state: str
    reason: Optional[str]
    principal: str
    at: datetime
    changed_by: Optional[str]
    changed_at: Optional[datetime]
    series_key: Optional[str] = None


def policy_json(p: BudgetPolicy) -> str:
    return canonical(p.to_json())


def policy_hash(p: BudgetPolicy) -> str:
    """SHA-256 of the policy's canonical JSON (the same bytes on every store)."""
    return hashlib.sha256(policy_json(p).encode("utf-8")).hexdigest()


def field_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    def show(v: Any) -> str:
        return "none" if v is None else canonical(v) if isinstance(v, (dict, list)) else str(v)

    return [f"{k}: {show(old.get(k))} -> {show(new.get(k))}"
            for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]


def policy_changes(old: BudgetPolicy, new: BudgetPolicy) -> list[str]:
    """Human-readable field changes from ``old`` to ``new`` (e.g. ``cap: {...} -> {...}``)."""
    return field_changes(old.to_json(), new.to_json())


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


@overload
def check_text(value: Any, name: str) -> str: ...


@overload
def check_text(value: Any, name: str, *, optional: bool) -> Optional[str]: ...


def check_text(value: Any, name: str, *, optional: bool = False) -> Optional[str]:
    """``value`` when it is a non-empty one-line text of at most MAX_TEXT characters (or None,
    when ``optional``); else LedgerError naming ``name``."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_TEXT:
        raise LedgerError(f"{name} must be a non-empty string of at most {MAX_TEXT} characters")
    if any(ord(c) < 32 for c in value):
        raise LedgerError(f"{name} must not contain control characters")
    return value
