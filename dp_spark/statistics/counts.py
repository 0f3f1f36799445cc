"""Statistic kinds ``count`` (rows per key tuple) and ``distinct_units`` (units per key tuple).

Privacy contract (from the enforced bounds; see :mod:`dp_spark.statistics.components`):

* ``count``: the ``rows`` component; per cell a unit adds <= Linf' rows, over all cells
  <= min(K, L0' Linf') (L1), L2^2 <= min(K^2, L0' Linf'^2) under add/remove; x2 (L1, L2^2)
  under replace; 1 under event.
* ``distinct_units``: the ``units`` component, counted from the (unit, cell) pairs after the
  cut of the pairs to L0' = min(L0, K) cells (the first of the unit's L0 cells by the row
  bounding's own priority) and never by the Linf / K row cuts (a unit with many rows in few
  cells is counted in each of them); a unit is in <= L0' cells, 1 each: L1 = L0', L2^2 = L0'
  (add/remove); 2 L0' under replace; 1 under event.

Post-processing: the noisy count clamped at 0 (value and interval), an exact noise interval.
A distinct count over a column other than the unit is refused (its sensitivity is not bounded
by the enforced bounds: one unit can bring K new distinct values to many cells... and remove
values shared with other units, so the engine does not offer it).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Mapping

from dp_spark.statistics.base import StatisticKind, StatisticSpec, register
from dp_spark.statistics.components import Component
from dp_spark.statistics.moments import GroupSizeOptions
from dp_spark.statistics.noise import count_cell, interval_columns


class _Count(StatisticKind):
    component_kind = "rows"
    options = GroupSizeOptions

    def components(self, stat: StatisticSpec, *, rows_shared: bool) -> tuple:
        return (Component(self.component_kind),)

    def error_coefficients(self, stat: StatisticSpec, comps: tuple) -> dict:
        n = stat.option("assumed_group_size")
        return {comps[0]: 1.0 / (n * n)}

    def finish(self, stat, noisy: Mapping, plans: Mapping, alpha: Fraction) -> dict[str, Any]:
        (c,) = noisy
        return count_cell(noisy[c], plans[c], alpha)

    def finish_columns(self, stat, grids: Mapping, plans: Mapping, alpha: Fraction):
        (c,) = grids
        return interval_columns(grids[c], plans[c], alpha, at_least_zero=True)


@register
class Count(_Count):
    kind = "count"


@register
class DistinctUnits(_Count):
    kind = "distinct_units"
    component_kind = "units"


@register
class Distinct(StatisticKind):
    """``{kind: distinct, column: X}`` for X other than the unit: refused with the reason."""

    kind = "distinct"
    refusal = ("a distinct count of a column other than the privacy unit has no sensitivity "
               "bounded by the enforced bounds (one unit can add a new value to every cell it "
               "touches, and the count of values it shares with others is unbounded): use "
               "'distinct_units' for the unit, or make the column the privacy unit")
