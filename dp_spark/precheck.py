"""The checks a release passes before Spark starts: budget policy, charge limits, access, and
whether the charge fits what is left of the budget.

Pure: no pyspark, no data read, nothing written (a refused access is not audited here: that is
a dry run; the engine audits the refusal it meets when publishing). Used by ``dp-spark
validate`` and ``dp-spark plan`` (:mod:`dp_spark.commands`) and by the engine's own
validation (:meth:`dp_spark.engine.Engine.policy_for`), so each check has one implementation.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Mapping, Optional

from dp_spark.accountant import DeltaCapExceededError
from dp_spark.core.budget import Budget
from dp_spark.config import ReleaseSpec
from dp_spark.errors import BudgetExceededError, ConfigError, MeasureMismatchError
from dp_spark.governance.access import AccessPolicy
from dp_spark.ledger import ReleaseLimitExceededError, open_ledger, sqlite_path
from dp_spark.ledger.policy import BudgetPolicy

__all__ = ["BudgetLeft", "LedgerNotFoundError", "budget_left", "check_access", "check_charge_limits",
           "policy_for", "require_existing_ledger", "require_fit"]


class LedgerNotFoundError(ConfigError):
    """A command that only reads the ledger was pointed at one that does not exist."""

    def __init__(self, path: str) -> None:
        super().__init__(f"no ledger at {Path(path).resolve()}: nothing has been published with this env yet, or "
                         "--env / --ledger points at the wrong place")
        self.path = path


def require_existing_ledger(url: str) -> None:
    """A SQLite ledger that does not exist is an error naming its path (never "nothing spent")."""
    path = sqlite_path(url)
    if path is not None and not Path(path).exists():
        raise LedgerNotFoundError(path)


def policy_for(spec: ReleaseSpec, policies: Mapping[str, BudgetPolicy], policies_source: object) -> BudgetPolicy:
    """The budget policy ``spec`` charges: declared, and accounting the spec's measure on the
    spec's dataset and privacy unit."""
    if spec.budget_id not in policies:
        raise ConfigError(f"{spec.source}: budget '{spec.budget_id}' is not declared in {policies_source}")
    policy = policies[spec.budget_id]
    if policy.measure != spec.charge.MEASURE:
        raise MeasureMismatchError(f"{spec.source}: release charges {spec.charge.MEASURE} but budget "
                                   f"'{spec.budget_id}' accounts in {policy.measure}")
    if policy.dataset != spec.dataset:
        raise ConfigError(f"{spec.source}: budget '{spec.budget_id}' governs dataset '{policy.dataset}', "
                          f"not '{spec.dataset}'")
    if policy.privacy_unit != spec.unit.kind.value:
        raise ConfigError(f"{spec.source}: budget '{spec.budget_id}' protects unit '{policy.privacy_unit}', "
                          f"not '{spec.unit.kind.value}'")
    return policy


def check_charge_limits(spec: ReleaseSpec, policy: BudgetPolicy) -> None:
    """Refusals that hold whatever is spent: the per-release maximum, and a delta charged to a
    budget without a delta cap (the ledger's reserve checks both again)."""
    charge = spec.charge
    if not policy.within_release_limit(charge):
        raise ReleaseLimitExceededError(spec.budget_id, policy.max_per_release, None, charge)
    if charge.delta_part > 0 and policy.measure != "approx_dp" and policy.delta_cap == 0:
        raise DeltaCapExceededError(spec.budget_id, policy.cap, type(charge).zero(), charge)


def check_access(access: AccessPolicy, principal: str, spec: ReleaseSpec, mode: str) -> None:
    """May ``principal`` publish ``spec`` in ``mode``? Raises PermissionDeniedError; audits
    nothing (:func:`dp_spark.governance.access.authorize` is the audited form)."""
    access.check(principal, "publish", mode=mode, spec_path=spec.source, budget_id=spec.budget_id, spec=spec)


@dataclass(frozen=True)
class BudgetLeft:
    """What is left of a budget before and after one more charge (read only).

    ``ledger_path`` is set when the env's SQLite ledger does not exist yet (then the whole cap
    remains); ``after`` is None when the charge does not fit."""

    budget_id: str
    remaining: Budget
    after: Optional[Budget]
    window_start: Optional[datetime] = None
    window_end: Optional[datetime] = None
    ledger_path: Optional[str] = None

    @property
    def fits(self) -> bool:
        return self.after is not None


def budget_left(ledger_url: str, spec: ReleaseSpec, policy: BudgetPolicy) -> BudgetLeft:
    """The budget ``spec`` charges, from the ledger at ``ledger_url`` if it exists (read only:
    no ledger is created). A budget the ledger does not know yet has its whole cap left."""
    path = sqlite_path(ledger_url)
    if path is not None and not Path(path).exists():
        after = policy.cap - spec.charge if spec.charge.fits_in(policy.cap) else None
        return BudgetLeft(spec.budget_id, policy.cap, after, ledger_path=path)
    with open_ledger(ledger_url) as ledger:
        if spec.budget_id not in ledger.budget_ids():
            after = policy.cap - spec.charge if spec.charge.fits_in(policy.cap) else None
            return BudgetLeft(spec.budget_id, policy.cap, after)
        st = ledger.status(spec.budget_id)
    after = st.remaining - spec.charge if spec.charge.fits_in(st.remaining) else None
    return BudgetLeft(spec.budget_id, st.remaining, after, st.window_start, st.window_end)


def require_fit(left: BudgetLeft, spec: ReleaseSpec, policy: BudgetPolicy) -> None:
    """Raise BudgetExceededError when the charge does not fit what is left of the budget now
    (the reservation at publish time checks it again, atomically)."""
    if left.fits:
        return
    spent = policy.cap - left.remaining if left.remaining.fits_in(policy.cap) else None
    exc = BudgetExceededError(spec.budget_id, policy.cap, spent, spec.charge)
    window = "" if left.window_start is None else f" in the window from {left.window_start:%Y-%m-%d}"
    exc.args = (f"{spec.source}: the charge {spec.charge} does not fit the remaining {left.remaining} of budget "
                f"'{spec.budget_id}'{window}: publish would refuse it",)
    raise exc
