"""Budget policies: which budget governs which dataset and privacy unit, with what cap.

A policy file (``conf/policies/budgets.yaml``) maps budget ids to policies::

    version: 1
    budgets:
      demo_events_user:
        dataset: demo_events          # logical dataset name (the engine also binds the
        privacy_unit: user            # Delta table's own id, see Ledger.bind_dataset)
        measure: zcdp                 # pure_dp | zcdp | approx_dp
        cap: {rho: 2.0}
        statement_delta: 1.0e-7       # zcdp only: the delta of published (eps, delta) statements
        window: monthly               # none | daily | monthly | {kind: rolling, days: 7}
        max_per_release: {rho: 1.0}   # optional; may carry delta too: {rho: 1.0, delta: 1.0e-7}
        delta_cap: 1.0e-6             # optional, default 0: the delta releases may spend in a
                                      # window (private key selection); pure_dp and zcdp only

Everything is validated when the file is loaded, before any data is read; every error is a
:class:`~dp_spark.errors.ConfigError` naming the file and the field. Windows are calendar
periods in UTC (daily, monthly) or a rolling number of days ending now.

Windows bound the privacy loss *per period*; they do not make loss disappear: releases of
two periods about the same people compose (see docs/ledger.md).

Nothing here imports pyspark.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Mapping, Optional

import yaml
from pydantic import Field, PlainValidator, PrivateAttr, ValidationError, WithJsonSchema, field_validator, model_validator
from typing_extensions import Annotated

from dp_spark.core.budget import MEASURES, Budget, parse_budget, to_fraction
from dp_spark.core.fields import FreeText, SpecModel, fail, fail_at, number_type
from dp_spark.errors import ConfigError, InvalidBudgetError
from dp_spark.spec.errors import model_errors, raise_errors

__all__ = [
    "WINDOW_KINDS",
    "WindowPolicy",
    "BudgetPolicy",
    "BudgetModel",
    "PolicyFileModel",
    "WindowModel",
    "load_policies",
    "policies_from_dict",
    "as_utc",
]

UTC = timezone.utc
WINDOW_KINDS = ("none", "daily", "monthly", "rolling")
MAX_ROLLING_DAYS = 3660
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
_UNIT_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")


def as_utc(now: datetime, name: str = "now") -> datetime:
    """``now`` converted to UTC; a naive datetime is refused (its zone is unknown)."""
    if not isinstance(now, datetime):
        raise ConfigError(f"{name} must be a datetime")
    if now.tzinfo is None or now.tzinfo.utcoffset(now) is None:
        raise ConfigError(f"{name} must be timezone-aware (UTC)")
    return now.astimezone(UTC)


@dataclass(frozen=True)
class WindowPolicy:
    """When spent budget renews.

    * ``none``     -- never: the cap bounds the loss over the budget's whole life;
    * ``daily``    -- each UTC calendar day [00:00, next 00:00);
    * ``monthly``  -- each UTC calendar month [1st 00:00, next 1st 00:00);
    * ``rolling``  -- the last ``days`` days: entries created at or after ``now - days``.

    ``days`` is required for ``rolling`` and must be None otherwise.
    """

    kind: str = "none"
    days: Optional[int] = None

    def __post_init__(self) -> None:
        if self.kind not in WINDOW_KINDS:
            raise ConfigError(f"window kind must be one of {list(WINDOW_KINDS)}")
        if self.kind == "rolling":
            if isinstance(self.days, bool) or not isinstance(self.days, int):
                raise ConfigError("a rolling window needs an integer 'days'")
            if not 1 <= self.days <= MAX_ROLLING_DAYS:
                raise ConfigError(f"rolling window 'days' must be in [1, {MAX_ROLLING_DAYS}]")
        elif self.days is not None:
            raise ConfigError(f"'days' is only allowed for a rolling window, not {self.kind!r}")

    def bounds(self, now: datetime) -> tuple[Optional[datetime], Optional[datetime]]:
        """(start, end) of the window containing ``now``, in UTC; start inclusive, end exclusive.

        ``none`` -> (None, None): unbounded. ``rolling`` -> (now - days, now); a rolling window
        counts every entry created at or after its start (also one stamped later than ``now``
        by a skewed clock), so a skewed clock cannot hide spend.
        """
        now = as_utc(now)
        if self.kind == "none":
            return None, None
        if self.kind == "daily":
            start = now.replace(hour=0, minute=0, second=0, microsecond=0)
            return start, start + timedelta(days=1)
        if self.kind == "monthly":
            start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
            if start.month == 12:
                end = start.replace(year=start.year + 1, month=1)
            else:
                end = start.replace(month=start.month + 1)
            return start, end
        assert self.days is not None
        return now - timedelta(days=self.days), now

    def contains(self, created_at: datetime, now: datetime) -> bool:
        """True when an entry created at ``created_at`` counts in the window of ``now``."""
        start, end = self.bounds(now)
        if start is None:
            return True
        created_at = as_utc(created_at, "created_at")
        if self.kind == "rolling":
            return created_at >= start
        assert end is not None
        return start <= created_at < end

    def describe(self) -> str:
        return f"rolling {self.days} days" if self.kind == "rolling" else self.kind

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "days": self.days}


@dataclass(frozen=True)
class BudgetPolicy:
    """One privacy budget: a cap in one measure over one dataset and privacy unit.

    ``statement_delta`` is required for ``zcdp`` (the delta of the (epsilon, delta) statement
    published with each release) and refused for other measures. ``max_per_release``, when
    given, is in the budget's measure and fits in the cap.

    The delta cap (policy field ``delta_cap``, default 0) is the cap's ``delta`` (pure_dp and
    zcdp; an approx_dp cap has its own delta): the delta that releases spending delta (private
    key selection) may use in a window, besides the epsilon or rho cap. :attr:`delta_cap`
    reads it back.
    """

    budget_id: str
    dataset: str
    privacy_unit: str
    measure: str
    cap: Budget
    statement_delta: Optional[Fraction] = None
    window: WindowPolicy = WindowPolicy()
    max_per_release: Optional[Budget] = None

    def __post_init__(self) -> None:
        if not isinstance(self.budget_id, str) or not _ID_RE.match(self.budget_id):
            raise ConfigError("budget_id must be 1-128 characters of [A-Za-z0-9_.:-]")
        if not isinstance(self.dataset, str) or not self.dataset.strip():
            raise ConfigError(f"budget {self.budget_id!r}: dataset must be a non-empty string")
        if not isinstance(self.privacy_unit, str) or not _UNIT_RE.match(self.privacy_unit):
            raise ConfigError(f"budget {self.budget_id!r}: privacy_unit must be an identifier")
        if self.measure not in MEASURES:
            raise ConfigError(
                f"budget {self.budget_id!r}: measure must be one of {sorted(MEASURES)}"
            )
        cls = MEASURES[self.measure]
        if type(self.cap) is not cls:
            raise ConfigError(
                f"budget {self.budget_id!r}: cap is not a {self.measure} amount "
                f"(fields {list(cls.FIELDS)})"
            )
        if self.cap.is_zero():
            raise ConfigError(f"budget {self.budget_id!r}: cap must be > 0")
        if self.measure == "zcdp":
            if self.statement_delta is None:
                raise ConfigError(f"budget {self.budget_id!r}: statement_delta is required for zcdp")
            try:
                delta = to_fraction(self.statement_delta, "statement_delta")
            except InvalidBudgetError as exc:
                raise ConfigError(f"budget {self.budget_id!r}: {exc}") from None
            if not 0 < delta < 1:
                raise ConfigError(f"budget {self.budget_id!r}: statement_delta must be in (0, 1)")
            object.__setattr__(self, "statement_delta", delta)
        elif self.statement_delta is not None:
            raise ConfigError(
                f"budget {self.budget_id!r}: statement_delta is only meaningful for zcdp"
            )
        if not isinstance(self.window, WindowPolicy):
            raise ConfigError(f"budget {self.budget_id!r}: window must be a WindowPolicy")
        if self.max_per_release is not None:
            if type(self.max_per_release) is not cls:
                raise ConfigError(
                    f"budget {self.budget_id!r}: max_per_release is not a {self.measure} amount"
                )
            if not self.max_per_release.fits_in(self.cap):
                raise ConfigError(f"budget {self.budget_id!r}: max_per_release exceeds the cap")

    def within_release_limit(self, charge: Budget) -> bool:
        """True when ``charge`` fits the per-release maximum (always, without one). A maximum
        that carries no delta limits the epsilon or rho part only; the delta of a release is
        then bounded by the delta cap alone."""
        limit = self.max_per_release
        if limit is None:
            return True
        if limit.delta_part == 0 and charge.delta_part > 0 and type(charge) is type(limit) \
                and self.measure != "approx_dp":
            charge = type(charge)._build(*(getattr(charge, f) if f != "delta" else Fraction(0)
                                           for f in charge.FIELDS))
        return charge.fits_in(limit)

    @property
    def delta_cap(self) -> Fraction:
        """The delta the budget allows per window (0: releases that spend delta are refused)."""
        return self.cap.delta_part

    def to_json(self) -> dict[str, Any]:
        out = self._json()
        # only when non-zero: the stored policy (and its hash) of a budget without delta is
        # the one it always had
        if self.measure != "approx_dp" and self.delta_cap > 0:
            out["delta_cap"] = str(self.delta_cap)
        return out

    def _json(self) -> dict[str, Any]:
        return {
            "budget_id": self.budget_id,
            "dataset": self.dataset,
            "privacy_unit": self.privacy_unit,
            "measure": self.measure,
            "cap": self.cap.to_json(),
            "statement_delta": None if self.statement_delta is None else str(self.statement_delta),
            "window": self.window.to_json(),
            "max_per_release": None if self.max_per_release is None else self.max_per_release.to_json(),
        }


# --------------------------------------------------------------------------------------
# The policy file: pydantic models of the file as written, then the policies built from them
# --------------------------------------------------------------------------------------
ID_PATTERN = _ID_RE.pattern
UNIT_PATTERN = _UNIT_RE.pattern
_AMOUNT_SCHEMA = {"type": "object", "additionalProperties": {"anyOf": [{"type": "number"}, {"type": "string"}]},
                  "description": "the measure's fields: {epsilon} (pure_dp), {rho} (zcdp), {epsilon, delta} (approx_dp)"}


def _amount_map(v: Any) -> Any:
    if not isinstance(v, Mapping):
        raise fail("must be a mapping of the budget measure's fields (epsilon, rho or epsilon and delta)")
    return v


def _required_amount_map(v: Any) -> Any:
    if v is None:
        raise fail("is required")
    return _amount_map(v)


def _text(v: Any) -> str:
    if not isinstance(v, str):
        raise fail("must be a string")
    return v


def _unit(v: Any) -> str:
    if not isinstance(v, str) or not _UNIT_RE.match(v):
        raise fail("must be an identifier")
    return v


def _passthrough(v: Any) -> Any:
    return v  # checked with the other fields of its model (WindowPolicy names the problem)


Amount = Annotated[Any, PlainValidator(_required_amount_map), WithJsonSchema(_AMOUNT_SCHEMA)]
OptionalAmount = Annotated[Any, PlainValidator(_amount_map), WithJsonSchema(_AMOUNT_SCHEMA)]
Text = Annotated[str, PlainValidator(_text), WithJsonSchema({"type": "string"})]
Unit = Annotated[str, PlainValidator(_unit), WithJsonSchema({"type": "string", "pattern": UNIT_PATTERN})]
if TYPE_CHECKING:  # mypy sees the value's type; pydantic the checked exact number (a Fraction)
    StatementDelta = Fraction
    DeltaCap = Fraction
else:
    StatementDelta = number_type(gt=0, lt=1, what="in (0, 1)")
    DeltaCap = number_type(ge=0, lt=1, what=">= 0 and < 1")
WindowKind = Annotated[Any, PlainValidator(_passthrough), WithJsonSchema({"enum": list(WINDOW_KINDS)})]
WindowDays = Annotated[Any, PlainValidator(_passthrough),
                       WithJsonSchema({"type": "integer", "minimum": 1, "maximum": MAX_ROLLING_DAYS})]


class WindowModel(SpecModel):
    """``window``: a kind name (``none``, ``daily``, ``monthly``) or ``{kind: rolling, days: N}``."""

    kind: WindowKind = Field("none", description="none | daily | monthly | rolling (UTC calendar periods, "
                                                 "or the last `days` days)")
    days: Optional[WindowDays] = Field(None, description="rolling only: the window's length in days")

    @model_validator(mode="after")
    def _window(self) -> "WindowModel":
        try:
            WindowPolicy(kind=self.kind, days=self.days)
        except ConfigError as exc:
            raise fail(str(exc)) from None
        return self

    def policy(self) -> WindowPolicy:
        return WindowPolicy(kind=self.kind, days=self.days)


class BudgetModel(SpecModel):
    """``budgets.<id>``: one budget's policy as written."""

    dataset: Text = Field(description="logical dataset name (the engine also binds the Delta table's own id)")
    privacy_unit: Unit = Field(description="the unit the budget protects (an identifier, e.g. user)")
    measure: Literal["pure_dp", "zcdp", "approx_dp"] = Field(description="the measure the budget accounts in")
    cap: Amount = Field(description="the cap per window, in the measure's fields")
    statement_delta: Optional[StatementDelta] = Field(
        None, description="zcdp only (required there): the delta of the published (epsilon, delta) statements")
    window: WindowModel = Field(default_factory=lambda: WindowModel(kind="none", days=None),
                                description="when spent budget renews")
    max_per_release: Optional[OptionalAmount] = Field(
        None, description="the most one release may charge (may carry delta too)")
    delta_cap: Optional[DeltaCap] = Field(
        None, description="pure_dp and zcdp: the delta releases may spend in a window (default 0)")
    description: Optional[FreeText] = Field(None, description="free text")

    @field_validator("window", mode="before")
    @classmethod
    def _window_form(cls, v: Any) -> Any:
        if v is None:
            return {"kind": "none"}
        if isinstance(v, str):
            return {"kind": v}
        if not isinstance(v, Mapping):
            raise fail("must be a kind name or a mapping of kind and days")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "BudgetModel":
        _, problems = self.policy("budget")  # the id is checked as the key of ``budgets``
        if problems:
            raise fail_at(problems)
        return self

    def policy(self, budget_id: str) -> tuple[Optional[BudgetPolicy], list[tuple[tuple, str]]]:
        """The policy, or None and the problems (field location, message) of the fields that
        depend on each other (the amounts on the measure, the cap on the delta cap, ...)."""
        errors: list[tuple[tuple, str]] = []
        measure = self.measure
        cap = _amount(self.cap, measure, "cap", errors)
        if measure != "approx_dp" and "delta" in self.cap:
            errors.append((("cap",), f"the delta cap of a {measure} budget is `delta_cap:`, not cap.delta"))
            cap = None
        if self.delta_cap is not None:
            if measure == "approx_dp":
                errors.append((("delta_cap",), "an approx_dp budget carries its delta in cap: epsilon and delta"))
            elif cap is not None:
                cap = parse_budget(measure, **{f: getattr(cap, f) for f in MEASURES[measure].FIELDS if f != "delta"},
                                   delta=self.delta_cap)
        max_per_release = None
        if self.max_per_release is not None:
            max_per_release = _amount(self.max_per_release, measure, "max_per_release", errors)
        if errors or cap is None:
            return None, errors
        try:
            return BudgetPolicy(
                budget_id=budget_id,
                dataset=self.dataset,
                privacy_unit=self.privacy_unit,
                measure=measure,
                cap=cap,
                statement_delta=self.statement_delta,
                window=self.window.policy(),
                max_per_release=max_per_release,
            ), []
        except ConfigError as exc:
            # name the field: the dataclass message names the budget (the path does) and the problem
            text = str(exc).removeprefix(f"budget {budget_id!r}: ")
            field = next(
                (k for k in ("statement_delta", "max_per_release", "privacy_unit", "dataset", "cap")
                 if k in text),
                "",
            )
            return None, [((field,) if field else (), text)]


def _amount(raw: Mapping, measure: str, field: str, errors: list[tuple[tuple, str]]) -> Optional[Budget]:
    """``raw`` (a mapping of the measure's fields) as an amount, or None with its problem
    appended to ``errors``."""
    if "measure" in raw and raw["measure"] != measure:
        errors.append(((field,), "is in another measure than the budget's"))
        return None
    values = {str(k): v for k, v in raw.items() if k != "measure"}
    try:
        return parse_budget(measure, **values)
    except InvalidBudgetError as exc:
        errors.append(((field,), str(exc)))
        return None


def _budget_id(v: Any) -> str:
    if not isinstance(v, str) or not _ID_RE.match(v):
        raise fail("budget id must be 1-128 characters of [A-Za-z0-9_.:-]")
    return v


BudgetId = Annotated[str, PlainValidator(_budget_id), WithJsonSchema({"type": "string", "pattern": ID_PATTERN})]


class PolicyFileModel(SpecModel):
    """A budget policy file (``conf/policies/budgets.yaml``)."""

    version: Literal[1] = Field(1, description="the file format (1)")
    budgets: dict[BudgetId, BudgetModel] = Field(description="budget id -> its policy")

    _policies: dict[str, BudgetPolicy] = PrivateAttr(default_factory=dict)

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, v: Any) -> Any:
        if v != 1:
            raise fail("only version 1 is supported")
        return v

    @field_validator("budgets", mode="before")
    @classmethod
    def _budgets(cls, v: Any) -> Any:
        if not isinstance(v, Mapping) or not v:
            raise fail("must be a non-empty mapping of budget id -> policy")
        return v

    @model_validator(mode="after")
    def _build(self) -> "PolicyFileModel":
        errors: list[tuple[tuple, str]] = []
        for bid, m in self.budgets.items():
            policy, problems = m.policy(bid)
            errors.extend((("budgets", bid, *loc), msg) for loc, msg in problems)
            if policy is not None:
                self._policies[bid] = policy
        if errors:
            raise fail_at(errors)
        return self

    def policies(self) -> dict[str, BudgetPolicy]:
        """Budget id -> its policy (in the file's order)."""
        return dict(self._policies)


def policies_from_dict(data: Any, source: str = "<dict>") -> dict[str, BudgetPolicy]:
    """Validate a parsed policy document: one ConfigError naming ``source`` and every problem
    by field path (never a value of the file)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: top level must be a mapping")
    try:
        return PolicyFileModel.model_validate(data).policies()
    except ValidationError as exc:
        raise_errors(source, model_errors(exc, model=PolicyFileModel))
        raise  # unreachable: raise_errors raises


def load_policies(path: str | os.PathLike) -> dict[str, BudgetPolicy]:
    """Load and validate a budget policy file (YAML, ``yaml.safe_load``)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: policy file not found")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{p}: invalid YAML{where}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not UTF-8 text") from None
    return policies_from_dict(data, str(p))
