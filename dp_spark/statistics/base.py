"""The statistic is the unit of extension: specs, noisy components and the kind registry.

A multi-statistic release computes several statistics over one bounded pass. Each statistic
is built from *noisy components*: vectors of exact integer partials per cell (a row count,
a distinct-unit count, a clamped sum, a normalised sum, a normalised sum of squares, a
histogram over public bins) to which noise is added once per entry. Statistics that need the
same information share one component (a ``count``, a ``sum`` and a ``mean`` of one column
use ONE noisy row count and ONE noisy normalised sum, as PipelineDP does), so the release
never pays twice for it.

A statistic kind lives in ONE module (``counts``, ``moments``, ``quantile``) that declares:

* the fields it accepts in a spec: its :attr:`StatisticKind.options` model (pydantic; the
  spec's ``statistics[]`` entries and the JSON Schema are built from these,
  :mod:`dp_spark.spec.release`);
* its components (:meth:`StatisticKind.components`); each component brings its partial
  columns (Spark expressions) and its sensitivity from the enforced bounds under each
  neighbour relation (:mod:`dp_spark.statistics.components`);
* the first-order error model that the budget split minimises
  (:meth:`StatisticKind.error_coefficients`);
* its post-processing into a value, an interval and an expected error per cell
  (:meth:`StatisticKind.finish`).

Adding a kind: write its module and register it with :func:`register`. The engine stays
generic (``dp_spark.statistics.plan`` and ``dp_spark.backends.spark``).

Nothing here imports pyspark.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, ClassVar, Mapping, Optional

from dp_spark.errors import ConfigError

__all__ = ["Clamp", "StatisticSpec", "StatisticKind", "register", "kind_of", "kinds", "KINDS", "align_clamp"]


@dataclass(frozen=True)
class Clamp:
    """A value column and its clamp bounds, aligned outward to the fixed-point grid 2^(k+1)."""

    column: str
    lower: Fraction  # enforced (grid-aligned)
    upper: Fraction
    declared_lower: Fraction
    declared_upper: Fraction
    grid_exponent: int

    @property
    def midpoint(self) -> Fraction:
        return (self.lower + self.upper) / 2

    @property
    def half_width(self) -> Fraction:
        return (self.upper - self.lower) / 2

    def to_json(self) -> dict[str, Any]:
        return {"column": self.column, "lower": str(self.lower), "upper": str(self.upper),
                "grid_exponent": self.grid_exponent}


def align_clamp(column: str, declared_lower: Fraction, declared_upper: Fraction) -> Clamp:
    """Round the clamp bounds outward to multiples of 2^(k+1), k from the public bounds only.

    Then the lower bound, the upper bound and their midpoint are exact grid points, so the
    sensitivity derived from the enforced bounds is exactly what the Spark path produces.
    """
    from dp_spark.core.grid import grid_exponent_for

    k = grid_exponent_for(declared_lower, declared_upper)
    step = Fraction(2) ** (k + 1)
    lower = (declared_lower / step).__floor__() * step
    upper = (declared_upper / step).__ceil__() * step
    return Clamp(column=column, lower=lower, upper=upper, declared_lower=declared_lower,
                 declared_upper=declared_upper, grid_exponent=k)


@dataclass(frozen=True)
class StatisticSpec:
    """One statistic of a release, as declared (validated by its kind's ``parse``)."""

    name: str
    kind: str
    clamp: Optional[Clamp] = None
    weight: Optional[Fraction] = None
    # kind-specific options, as a sorted tuple of (name, value) pairs (hashable, frozen)
    options: tuple[tuple[str, Any], ...] = field(default=())
    #: a rolling window over the release's date key, in days: the cell of day d covers the
    #: rows of days d-N+1 .. d (None: the day itself)
    window: Optional[int] = None

    def option(self, key: str, default: Any = None) -> Any:
        for k, v in self.options:
            if k == key:
                return v
        return default

    def canonical(self) -> dict[str, Any]:
        return {
            "name": self.name, "kind": self.kind,
            "clamp": None if self.clamp is None else self.clamp.to_json(),
            "weight": None if self.weight is None else str(self.weight),
            "options": {k: (str(v) if isinstance(v, Fraction) else v) for k, v in self.options},
            # only when set: statistics without a window keep their release ids
            **({} if self.window is None else {"window": {"days": self.window}}),
        }

    @property
    def column(self) -> Optional[str]:
        return None if self.clamp is None else self.clamp.column


class StatisticKind:
    """Base class of a statistic kind; subclasses live one per module and register."""

    kind: ClassVar[str] = ""
    #: the fields this kind accepts besides name, kind and weight (and column, lower, upper
    #: when ``needs_value``): a pydantic model mixed into the kind's ``statistics[]`` entry
    #: model (its validators may read ``self.lower`` / ``self.upper``); its set fields become
    #: :attr:`StatisticSpec.options`. None: the kind is refused with :attr:`refusal`.
    options: ClassVar[Optional[type]] = None
    #: why a spec may not use this kind (with the fix), when ``options`` is None
    refusal: ClassVar[Optional[str]] = None
    needs_value: ClassVar[bool] = False

    # -- plan ----------------------------------------------------------------------------
    def components(self, stat: StatisticSpec, *, rows_shared: bool) -> tuple:
        """The noisy components this statistic is computed from. ``rows_shared``: another
        statistic of the release needs the row count anyway."""
        raise NotImplementedError

    def error_coefficients(self, stat: StatisticSpec, comps: tuple) -> dict:
        """First-order model of the statistic's squared error, relative to a public reference
        magnitude: {component: a} with error^2 ~ sum_c a_c Var(component c, real units)."""
        raise NotImplementedError

    # -- post-processing -----------------------------------------------------------------
    def finish(self, stat: StatisticSpec, noisy: Mapping, plans: Mapping, alpha: Fraction) -> dict[str, Any]:
        """One cell: value, ci_low, ci_high, noise_stddev, expected_abs_error, mechanism,
        noise_scale, grid. ``noisy[c]``: for each component c planned for this statistic, its
        noisy value(s) in real units for this cell (a Fraction, or a list for a histogram);
        ``plans[c]``: its StatisticPlan."""
        raise NotImplementedError


    def finish_columns(self, stat: StatisticSpec, grids: Mapping, plans: Mapping,
                       alpha: Fraction) -> Optional[dict[str, Any]]:
        """:meth:`finish` over every cell at once, or None when this kind (or these values)
        has no vectorised form: ``grids[c]``, each component's noisy values on its grid, a
        numpy integer vector (``width`` entries per cell). Returns ``value``, ``ci_low`` and
        ``ci_high`` as float64 vectors, the other fields of :meth:`finish` as one value each
        when they do not depend on the cell, else as float64 vectors too (a mean's error
        figures); equal to :meth:`finish` cell by cell."""
        return None


KINDS: dict[str, StatisticKind] = {}


def register(cls: type[StatisticKind]) -> type[StatisticKind]:
    if not cls.kind or cls.kind in KINDS:
        raise ValueError(f"statistic kind {cls.kind!r} is empty or registered twice")
    KINDS[cls.kind] = cls()
    return cls


def kinds() -> dict[str, StatisticKind]:
    """Every registered kind, by name (the kinds' modules register themselves when the
    package ``dp_spark.statistics`` is imported, which importing this module does first)."""
    return dict(KINDS)


def kind_of(name: str) -> StatisticKind:
    if name not in KINDS:
        raise ConfigError(f"unknown statistic kind (allowed: {sorted(KINDS)})")
    return KINDS[name]


