"""Privacy units, neighbour relations, contribution bounds and the sensitivities they imply.

The privacy unit (user, account, device or event) is declared first and is a column of the
input. The neighbour relation says which pairs of datasets DP must make indistinguishable:

* ``add_remove_unit`` (default): D' = D plus or minus *all* the records of one unit;
* ``replace_unit``: all the records of one unit are replaced by those of another unit
  (no public number of rows per unit);
* ``event``: D' = D plus or minus one event (one row).

The engine *enforces* :class:`ContributionBounds` (at most K rows per unit, at most L0
partitions per unit, at most Linf rows per unit and partition, each value clamped to
[L, U]) and derives the sensitivity from them with :func:`sensitivity`; a sensitivity is
never typed in by hand. The table of every (relation, aggregate) pair and the reason for
each entry is in ``docs/privacy-semantics.md`` and in ``tests/unit/test_units.py``.

Nothing here imports pyspark; errors never carry data values.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import Enum
from fractions import Fraction
from numbers import Integral
from typing import Any, Optional, TypeVar, Union

from dp_spark.core.budget import to_fraction
from dp_spark.errors import ConfigError, DpSparkError, InvalidBoundsError, UnknownRelationError

__all__ = [
    "UnitKind",
    "PrivacyUnit",
    "Neighbouring",
    "Aggregate",
    "ContributionBounds",
    "Sensitivity",
    "sensitivity",
    "as_relation",
    "as_aggregate",
    "as_unit_kind",
]

# A plain column name, or a dotted path into a struct column (``user.id``).
_COLUMN_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class UnitKind(str, Enum):
    """What one privacy unit is. Many events of one user belong to one ``USER`` unit."""

    USER = "user"
    ACCOUNT = "account"
    DEVICE = "device"
    EVENT = "event"


class Neighbouring(str, Enum):
    """The neighbour relation a release is private under; every release states it."""

    ADD_REMOVE_UNIT = "add_remove_unit"
    REPLACE_UNIT = "replace_unit"
    EVENT = "event"


class Aggregate(str, Enum):
    """The per-partition statistic whose sensitivity is derived.

    ``NORMALISED_SUM`` is the sum of ``value - (L + U) / 2``: the midpoint-centred sum used by
    the mean (its per-row magnitude is bounded by the half-width ``W = (U - L) / 2``).
    """

    ROW_COUNT = "row_count"
    DISTINCT_UNITS = "distinct_units"
    SUM = "sum"
    NORMALISED_SUM = "normalised_sum"


_E = TypeVar("_E", bound=Enum)


def _as_enum(enum_cls: type[_E], value: Any, what: str) -> _E:
    if isinstance(value, enum_cls):
        return value
    try:
        return enum_cls(value)
    except (ValueError, TypeError):
        raise UnknownRelationError(
            f"unknown {what}; expected one of {[m.value for m in enum_cls]}"
        ) from None


def as_unit_kind(value: Any) -> UnitKind:
    """``UnitKind`` from an enum member or its string; else UnknownRelationError."""
    return _as_enum(UnitKind, value, "privacy-unit kind")


def as_relation(value: Any) -> Neighbouring:
    """``Neighbouring`` from an enum member or its string; else UnknownRelationError."""
    return _as_enum(Neighbouring, value, "neighbour relation")


def as_aggregate(value: Any) -> Aggregate:
    """``Aggregate`` from an enum member or its string; else UnknownRelationError."""
    return _as_enum(Aggregate, value, "aggregate")


@dataclass(frozen=True)
class PrivacyUnit:
    """The privacy unit: its kind and the column that identifies it.

    ``column`` must be an identifier (``user_id``) or a dotted path into a struct column
    (``buyer.id``). A hashed ID is still a unit ID: hashing is not privacy.
    """

    kind: UnitKind
    column: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", as_unit_kind(self.kind))
        if not isinstance(self.column, str) or not _COLUMN_RE.match(self.column):
            raise ConfigError("privacy unit column must be a non-empty identifier-like column name")

    def default_relation(self) -> Neighbouring:
        """``event`` for an event-level unit, ``add_remove_unit`` otherwise."""
        return Neighbouring.EVENT if self.kind is UnitKind.EVENT else Neighbouring.ADD_REMOVE_UNIT


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise InvalidBoundsError(f"{name} must be an integer")
    value = int(value)
    if value < 1:
        raise InvalidBoundsError(f"{name} must be >= 1")
    return value


def _bound(value: Any, name: str) -> Fraction:
    try:
        frac = to_fraction(value, name)
    except DpSparkError:
        raise InvalidBoundsError(f"{name} must be a finite number") from None
    return frac


@dataclass(frozen=True)
class ContributionBounds:
    """Bounds the engine *enforces* on each unit's contribution (never assumed).

    * ``max_rows_per_unit`` K >= 1: rows kept per unit (bottom-K by keyed priority);
    * ``max_partitions_per_unit`` L0 >= 1: partitions (public keys) a unit may touch;
    * ``max_rows_per_partition`` Linf >= 1 or None (None means K): rows per unit and partition;
    * ``lower``/``upper``: clamp of each value (both or neither; finite; lower <= upper),
      exact Fractions (floats are read through their shortest repr, so 0.1 is 1/10).

    The effective values used in sensitivities are ``effective_l0 = min(L0, K)`` (a unit
    with K rows cannot touch more than K partitions) and ``effective_linf = min(Linf, K)``.
    Messages of the errors raised here name fields only, never values.
    """

    max_rows_per_unit: int
    max_partitions_per_unit: int = 1
    max_rows_per_partition: Optional[int] = None
    lower: Optional[Fraction] = None
    upper: Optional[Fraction] = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "max_rows_per_unit", _positive_int(self.max_rows_per_unit, "max_rows_per_unit"))
        set_(self, "max_partitions_per_unit",
             _positive_int(self.max_partitions_per_unit, "max_partitions_per_unit"))
        if self.max_rows_per_partition is not None:
            set_(self, "max_rows_per_partition",
                 _positive_int(self.max_rows_per_partition, "max_rows_per_partition"))
        if (self.lower is None) != (self.upper is None):
            raise InvalidBoundsError("give both lower and upper clamp bounds, or neither")
        if self.lower is not None:
            lo = _bound(self.lower, "lower")
            hi = _bound(self.upper, "upper")
            if lo > hi:
                raise InvalidBoundsError("lower clamp bound is above the upper clamp bound")
            set_(self, "lower", lo)
            set_(self, "upper", hi)

    # --- effective bounds ---------------------------------------------------------------
    @property
    def effective_l0(self) -> int:
        """L0' = min(L0, K)."""
        return min(self.max_partitions_per_unit, self.max_rows_per_unit)

    @property
    def effective_linf(self) -> int:
        """Linf' = min(Linf, K), Linf defaulting to K."""
        linf = self.max_rows_per_partition
        k = self.max_rows_per_unit
        return k if linf is None else min(linf, k)

    @property
    def has_values(self) -> bool:
        return self.lower is not None

    @property
    def clamp(self) -> tuple[Fraction, Fraction]:
        """(L, U); InvalidBoundsError when the bounds have no clamp (a count's bounds)."""
        if self.lower is None or self.upper is None:
            raise InvalidBoundsError("a sum or mean needs lower and upper clamp bounds")
        return self.lower, self.upper

    @property
    def magnitude(self) -> Fraction:
        """M = max(|L|, |U|): the largest magnitude of one clamped value."""
        lower, upper = self.clamp
        return max(abs(lower), abs(upper))

    @property
    def midpoint(self) -> Fraction:
        """(L + U) / 2: the centre used by the normalised sum."""
        lower, upper = self.clamp
        return (lower + upper) / 2

    @property
    def half_width(self) -> Fraction:
        """W = (U - L) / 2: the largest magnitude of one centred value."""
        lower, upper = self.clamp
        return (upper - lower) / 2

    def to_json(self) -> dict[str, Any]:
        return {
            "max_rows_per_unit": self.max_rows_per_unit,
            "max_partitions_per_unit": self.max_partitions_per_unit,
            "max_rows_per_partition": self.max_rows_per_partition,
            "lower": None if self.lower is None else str(self.lower),
            "upper": None if self.upper is None else str(self.upper),
        }


@dataclass(frozen=True)
class Sensitivity:
    """How much one neighbour can change a release, derived from enforced bounds.

    * ``per_partition``: the largest change of one cell;
    * ``l1``: the largest L1 norm of the change of the vector of all partitions' values;
    * ``l2_squared``: the exact square of the largest L2 norm of that change.
    """

    per_partition: Fraction
    l1: Fraction
    l2_squared: Fraction

    def __post_init__(self) -> None:
        for name in ("per_partition", "l1", "l2_squared"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (Fraction, Integral)):
                raise ConfigError(f"sensitivity {name} must be an exact rational")
            v = Fraction(v)
            if v < 0:
                raise ConfigError(f"sensitivity {name} must be >= 0")
            object.__setattr__(self, name, v)

    @property
    def l2(self) -> float:
        return math.sqrt(self.l2_squared)

    def scaled(self, factor: Fraction) -> "Sensitivity":
        """The sensitivity of ``factor * f`` (e.g. real units -> grid units, factor 2^-k)."""
        factor = Fraction(factor)
        if factor <= 0:
            raise ConfigError("a sensitivity scale factor must be > 0")
        return Sensitivity(self.per_partition * factor, self.l1 * factor,
                           self.l2_squared * factor * factor)

    def to_json(self) -> dict[str, str]:
        return {"per_partition": str(self.per_partition), "l1": str(self.l1),
                "l2_squared": str(self.l2_squared)}


def _add_remove_count(k: int, l0: int, linf: int) -> tuple[Fraction, Fraction, Fraction]:
    """One unit's count vector: entries in [0, Linf'], at most L0' non-zero, sum <= K."""
    per = Fraction(linf)
    l1 = Fraction(min(k, l0 * linf))
    l2sq = Fraction(min(k * k, l0 * linf * linf))
    return per, l1, l2sq


def sensitivity(aggregate: Union[Aggregate, str], bounds: ContributionBounds,
                relation: Union[Neighbouring, str]) -> Sensitivity:
    """The sensitivity of ``aggregate`` over all partitions, under ``relation``.

    Privacy contract: derived only from the enforced ``bounds`` (public), never from data.
    With K, L0' = min(L0, K), Linf' = min(Linf, K), M = max(|L|, |U|), W = (U - L) / 2:

    ======================  ==================  ======================  ==========================
    relation / aggregate    per_partition       l1                      l2_squared
    ======================  ==================  ======================  ==========================
    add_remove row_count    Linf'               min(K, L0'Linf')        min(K^2, L0'Linf'^2)
    add_remove distinct     1                   L0'                     L0'
    add_remove sum          Linf' M             M min(K, L0'Linf')      M^2 min(K^2, L0'Linf'^2)
    add_remove norm. sum    Linf' W             W min(K, L0'Linf')      W^2 min(K^2, L0'Linf'^2)
    replace row_count       Linf'               2 x add_remove          2 x add_remove
    replace distinct        1                   2 L0'                   2 L0'
    replace sum             Linf'(U+ - L-)      2 x add_remove          4 x add_remove
    replace norm. sum       Linf'(U - L)        2 x add_remove          4 x add_remove
    event row_count         1                   1                       1
    event distinct          1                   1                       1
    event sum               M                   M                       M^2
    event norm. sum         W                   W                       W^2
    ======================  ==================  ======================  ==========================

    (U+ = max(U, 0), L- = min(L, 0).) The reasons are in ``docs/privacy-semantics.md``.
    SUM and NORMALISED_SUM need clamp bounds, else InvalidBoundsError. ``event`` needs
    K = L0 = Linf = 1 (Linf may be None), else InvalidBoundsError: its entries are those of
    add_remove with these bounds, and hold for one row in or out only because the engine
    keeps one row per event id and drops the ids with two different rows.
    """
    agg = as_aggregate(aggregate)
    rel = as_relation(relation)
    if not isinstance(bounds, ContributionBounds):
        raise InvalidBoundsError("bounds must be ContributionBounds")
    valued = agg in (Aggregate.SUM, Aggregate.NORMALISED_SUM)
    if valued and not bounds.has_values:
        raise InvalidBoundsError(f"aggregate {agg.value!r} needs lower and upper clamp bounds")

    # the clamp range of one value: None exactly when the aggregate is not valued
    value_range: Optional[tuple[Fraction, Fraction]]
    if agg is Aggregate.SUM:
        value_range = bounds.clamp
    elif agg is Aggregate.NORMALISED_SUM:
        value_range = -bounds.half_width, bounds.half_width
    else:
        value_range = None
    mag = Fraction(1) if value_range is None else max(abs(value_range[0]), abs(value_range[1]))

    if rel is Neighbouring.EVENT:
        # One event (one row, one event id) in or out. The engine enforces it by keeping
        # exactly one row per event id (K = L0 = Linf = 1) after dropping the ids that carry
        # two different rows (:func:`dp_spark.backends.bounding.keep_unique_events`);
        # with larger bounds the rows kept per id could exceed one event: refuse.
        linf = bounds.max_rows_per_partition
        if bounds.max_rows_per_unit != 1 or bounds.max_partitions_per_unit != 1 or linf not in (None, 1):
            raise InvalidBoundsError(
                "neighbouring 'event' needs max_rows_per_unit = max_partitions_per_unit = "
                "max_rows_per_partition = 1 (one row per event id); use add_remove_unit for "
                "larger bounds"
            )
        if agg is Aggregate.ROW_COUNT or agg is Aggregate.DISTINCT_UNITS:
            one = Fraction(1)
            return Sensitivity(one, one, one)
        return Sensitivity(mag, mag, mag * mag)

    k = bounds.max_rows_per_unit
    l0 = bounds.effective_l0
    linf = bounds.effective_linf
    if agg is Aggregate.DISTINCT_UNITS:
        per, l1, l2sq = Fraction(1), Fraction(l0), Fraction(l0)
    else:
        per, l1, l2sq = _add_remove_count(k, l0, linf)
        per, l1, l2sq = per * mag, l1 * mag, l2sq * mag * mag

    if rel is Neighbouring.ADD_REMOVE_UNIT:
        return Sensitivity(per, l1, l2sq)

    # REPLACE_UNIT: the change is c(new) - c(old), two contributions of one bounded unit.
    if value_range is None:
        # Non-negative count vectors: |a_p - b_p| <= max(a_p, b_p) <= Linf' per cell;
        # ||a - b||_1 <= ||a||_1 + ||b||_1; ||a - b||_2^2 <= ||a||^2 + ||b||^2 as a.b >= 0.
        return Sensitivity(per, 2 * l1, 2 * l2sq)
    # Signed values: one cell ranges over [Linf' min(L,0), Linf' max(U,0)]; the vector
    # change obeys the triangle inequality, so ||a - b||_2^2 <= (2 ||a||_2)^2.
    lo, hi = value_range
    per_replace = linf * (max(hi, Fraction(0)) - min(lo, Fraction(0)))
    return Sensitivity(per_replace, 2 * l1, 4 * l2sq)
