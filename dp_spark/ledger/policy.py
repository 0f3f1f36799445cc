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
from typing import Any, Mapping, Optional

import yaml

from dp_spark.core.budget import MEASURES, Budget, parse_budget, to_fraction
from dp_spark.errors import ConfigError, InvalidBudgetError

__all__ = [
    "WINDOW_KINDS",
    "WindowPolicy",
    "BudgetPolicy",
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
# Loading
# --------------------------------------------------------------------------------------
_POLICY_KEYS = {
    "dataset", "privacy_unit", "measure", "cap", "statement_delta", "window", "max_per_release",
    "description", "delta_cap",
}
_TOP_KEYS = {"version", "budgets"}


def _err(source: str, field: str, problem: str) -> ConfigError:
    return ConfigError(f"{source}: field '{field}': {problem}")


def _amount(raw: Any, measure: str, source: str, field: str) -> Budget:
    if not isinstance(raw, Mapping):
        raise _err(source, field, f"must be a mapping of {list(MEASURES[measure].FIELDS)}")
    if "measure" in raw and raw["measure"] != measure:
        raise _err(source, field, f"is in {raw['measure']!r} but the budget's measure is {measure!r}")
    values = {str(k): v for k, v in raw.items() if k != "measure"}
    try:
        return parse_budget(measure, **values)
    except InvalidBudgetError as exc:
        raise _err(source, field, str(exc)) from None


def _window(raw: Any, source: str, field: str) -> WindowPolicy:
    if raw is None:
        raw = "none"
    if isinstance(raw, str):
        raw = {"kind": raw}
    if not isinstance(raw, Mapping):
        raise _err(source, field, "must be a kind name or a mapping {kind, days}")
    unknown = sorted(set(map(str, raw)) - {"kind", "days"})
    if unknown:
        raise _err(source, f"{field}.{unknown[0]}", "unknown field (allowed: ['days', 'kind'])")
    try:
        return WindowPolicy(kind=raw.get("kind", "none"), days=raw.get("days"))
    except ConfigError as exc:
        raise _err(source, field, str(exc)) from None


def _policy(budget_id: Any, raw: Any, source: str) -> BudgetPolicy:
    prefix = f"budgets.{budget_id}"
    if not isinstance(budget_id, str) or not _ID_RE.match(budget_id):
        raise _err(source, prefix, "budget id must be 1-128 characters of [A-Za-z0-9_.:-]")
    if not isinstance(raw, Mapping):
        raise _err(source, prefix, "must be a mapping")
    unknown = sorted(set(map(str, raw)) - _POLICY_KEYS)
    if unknown:
        raise _err(source, f"{prefix}.{unknown[0]}", f"unknown field (allowed: {sorted(_POLICY_KEYS)})")
    for key in ("dataset", "privacy_unit", "measure", "cap"):
        if raw.get(key) is None:
            raise _err(source, f"{prefix}.{key}", "is required")
    measure = raw["measure"]
    if measure not in MEASURES:
        raise _err(source, f"{prefix}.measure", f"must be one of {sorted(MEASURES)}")
    if measure != "approx_dp" and isinstance(raw["cap"], Mapping) and "delta" in raw["cap"]:
        raise _err(source, f"{prefix}.cap", f"the delta cap of a {measure} budget is `delta_cap:`, not cap.delta")
    cap = _amount(raw["cap"], measure, source, f"{prefix}.cap")
    if raw.get("delta_cap") is not None:
        if measure == "approx_dp":
            raise _err(source, f"{prefix}.delta_cap", "an approx_dp budget carries its delta in cap: {epsilon, delta}")
        try:
            delta_cap = to_fraction(raw["delta_cap"], "delta_cap")
        except InvalidBudgetError as exc:
            raise _err(source, f"{prefix}.delta_cap", str(exc)) from None
        if not 0 <= delta_cap < 1:
            raise _err(source, f"{prefix}.delta_cap", "must be >= 0 and < 1")
        cap = parse_budget(measure, **{f: getattr(cap, f) for f in MEASURES[measure].FIELDS if f != "delta"},
                           delta=delta_cap)
    max_per_release = None
    if raw.get("max_per_release") is not None:
        max_per_release = _amount(raw["max_per_release"], measure, source, f"{prefix}.max_per_release")
    delta = raw.get("statement_delta")
    if delta is not None:
        try:
            delta = to_fraction(delta, "statement_delta")
        except InvalidBudgetError as exc:
            raise _err(source, f"{prefix}.statement_delta", str(exc)) from None
    window = _window(raw.get("window"), source, f"{prefix}.window")
    for key in ("dataset", "privacy_unit"):
        if not isinstance(raw[key], str):
            raise _err(source, f"{prefix}.{key}", "must be a string")
    try:
        return BudgetPolicy(
            budget_id=budget_id,
            dataset=raw["dataset"],
            privacy_unit=raw["privacy_unit"],
            measure=measure,
            cap=cap,
            statement_delta=delta,
            window=window,
            max_per_release=max_per_release,
        )
    except ConfigError as exc:
        # name the field: the dataclass message names the budget and the problem
        text = str(exc)
        field = next(
            (k for k in ("statement_delta", "max_per_release", "privacy_unit", "dataset", "cap")
             if k in text),
            "",
        )
        raise _err(source, f"{prefix}.{field}" if field else prefix, text) from None


def policies_from_dict(data: Any, source: str = "<dict>") -> dict[str, BudgetPolicy]:
    """Validate a parsed policy document; ``source`` names it in errors."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: top level must be a mapping")
    unknown = sorted(set(map(str, data)) - _TOP_KEYS)
    if unknown:
        raise _err(source, unknown[0], f"unknown field (allowed: {sorted(_TOP_KEYS)})")
    version = data.get("version", 1)
    if version != 1:
        raise _err(source, "version", "only version 1 is supported")
    budgets = data.get("budgets")
    if not isinstance(budgets, Mapping) or not budgets:
        raise _err(source, "budgets", "must be a non-empty mapping of budget id -> policy")
    return {str(bid): _policy(bid, raw, source) for bid, raw in budgets.items()}


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
