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
from typing import Mapping, Optional, Sequence

from dp_spark.accountant import DeltaCapExceededError
from dp_spark.core.budget import Budget
from dp_spark.config import ReleaseSpec
from dp_spark.errors import BudgetExceededError, ConfigError, MeasureMismatchError, SchemaError
from dp_spark.governance.access import AccessPolicy
from dp_spark.ledger import ReleaseLimitExceededError, open_ledger, sqlite_path
from dp_spark.ledger.policy import BudgetPolicy
from dp_spark.spec.errors import did_you_mean
from dp_spark.spec.where import where_columns

__all__ = ["BudgetLeft", "LedgerNotFoundError", "budget_left", "budget_refused", "check_access", "check_charge_limits",
           "check_input_columns", "check_key_tables", "columns_read", "policy_for", "schema_names", "require_existing_ledger", "require_fit"]


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
        declared = ", ".join(sorted(policies)) or "none"
        raise ConfigError(f"{spec.source}: field 'budget.id': budget '{spec.budget_id}' is not declared in "
                          f"{policies_source}{did_you_mean(spec.budget_id, policies)} (declared budgets: {declared})")
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


def budget_refused(spec: ReleaseSpec, cap: Budget, remaining: Budget,
                   window_start: Optional[datetime] = None) -> BudgetExceededError:
    """The refusal of a charge that does not fit ``remaining`` of its budget: one message for
    ``validate`` (:func:`require_fit`) and for publish's reservation (the engine)."""
    spent = cap - remaining if remaining.fits_in(cap) else None
    exc = BudgetExceededError(spec.budget_id, cap, spent, spec.charge)
    window = "" if window_start is None else f" in the window from {window_start:%Y-%m-%d}"
    exc.args = (f"{spec.source}: the charge {spec.charge} does not fit the remaining {remaining} of budget "
                f"'{spec.budget_id}'{window} (cap {cap}): refused, nothing charged",)
    return exc


def require_fit(left: BudgetLeft, spec: ReleaseSpec, policy: BudgetPolicy) -> None:
    """Raise BudgetExceededError when the charge does not fit what is left of the budget now
    (the reservation at publish time checks it again, atomically)."""
    if not left.fits:
        raise budget_refused(spec, policy.cap, left.remaining, left.window_start)


def check_key_tables(spec: ReleaseSpec, public_datasets: frozenset, declared: Sequence[str],
                     env_source: object) -> None:
    """Refuse a key table (``public_keys.table``) that the env file does not declare, or does not
    declare ``public: true``, naming the field: before any data (the key table's included) is
    read. ``public_datasets``/``declared``: the env's public and declared datasets."""
    for i, k in enumerate(spec.key_sets):
        table = getattr(k, "table", None)
        if table is None:
            continue
        where = spec.key_table_field(i)
        if table.dataset not in declared:
            raise ConfigError(f"{spec.source}: field '{where}': dataset '{table.dataset}' is not declared under "
                              f"'datasets' in the env file {env_source}{did_you_mean(table.dataset, declared)}")
        if table.dataset not in public_datasets:
            raise ConfigError(
                f"{spec.source}: field '{where}': dataset '{table.dataset}' is not declared public in the env file "
                f"{env_source}: keys are read only from a dataset holding no personal data (nothing of it is "
                f"read before it is declared so). If it holds none (a product catalogue), whoever owns the env's "
                f"datasets declares it: datasets: {{{table.dataset}: {{location: ..., public: true}}}}; otherwise "
                "list the keys (public_keys.values) or select them privately (private_keys)")


def columns_read(spec: ReleaseSpec) -> list[tuple[str, str]]:
    """Every column ``spec`` reads, each once, with the spec field that names it first:
    ``(field path, column)``. The unit, the group-by columns, the statistics' (or the
    metric's) value columns, the ``where``'s columns, then the rest of ``columns``."""
    single = spec.metric is not None
    named: list[tuple[str, str]] = [("privacy_unit.column", spec.unit.column)]
    for i, k in enumerate(spec.key_sets):
        named.append(("group_by.column" if single else f"group_by[{i}].column", k.column))
    if single:
        if spec.value is not None:
            named.append(("value.column", spec.value.column))
    else:
        for i, st in enumerate(spec.statistics):
            if st.column is not None:
                named.append((f"statistics[{i}].column", st.column))
    if spec.where is not None:
        named += [("where", c) for c in where_columns(spec.where, spec.columns)]
    named += [(f"columns[{i}]", c) for i, c in enumerate(spec.columns)]
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for path, column in named:
        if column not in seen:
            seen.add(column)
            out.append((path, column))
    return out


def check_input_columns(spec: ReleaseSpec, input_columns: Sequence[str], nested: Sequence[str] = ()) -> None:
    """Raise SchemaError when a column ``spec`` reads is not in the input: every missing one,
    with the field that names it and a close name, then the input's column names (names only,
    never values). ``input_columns``: the input's top-level column names, from its schema
    (the Delta log: no row read); ``nested``: the dotted paths into its struct columns (a
    unit may name one)."""
    have = set(input_columns) | set(nested)
    missing = [(path, c) for path, c in columns_read(spec) if c not in have]
    if not missing:
        return
    lines = [f"field '{path}': column '{c}' is not in the input{did_you_mean(c, input_columns, names_are_case_sensitive=True)}"
             for path, c in missing]
    listed = ", ".join(input_columns) or "none"
    head = f"{spec.source}: dataset '{spec.dataset}' lacks {len(missing)} column(s) the spec reads"
    raise SchemaError(f"{head}:\n  " + "\n  ".join(lines) + f"\n  the input's columns: {listed}")


def schema_names(schema) -> tuple[list[str], list[str]]:
    """(top-level column names, dotted paths into struct columns) of a Spark schema (duck-typed:
    anything with ``fields`` of ``name`` and ``dataType``; no pyspark imported here)."""
    top = [f.name for f in schema.fields]
    nested: list[str] = []

    def walk(prefix: str, dt) -> None:
        for f in getattr(dt, "fields", None) or ():
            path = f"{prefix}.{f.name}"
            nested.append(path)
            walk(path, f.dataType)

    for f in schema.fields:
        walk(f.name, f.dataType)
    return top, nested
