"""Noisy components: exact integer partials per cell, their sensitivity and their Spark columns.

Each component is one vector of integers per release (``width`` entries per cell) to which
noise is added once per entry. Its sensitivity is derived from the bounds the engine
enforces (K rows per unit, L0 cells per unit, Linf rows per cell, each value clamped), under
the release's neighbour relation, with :func:`dp_spark.core.units.sensitivity` (the table and its
proofs are in ``docs/privacy-semantics.md``):

=============  ========================================  ==========================================
component      per-row contribution (grid units)          sensitivity (as for)
=============  ========================================  ==========================================
rows           1                                          row count
units          1 per (unit, cell): the pairs cut to L0'    distinct units (<= L0' = min(L0, K)
               = min(L0, K) cells, never by Linf or K     cells, 1 each)
               rows
sum            round(clamp(v) 2^-k) in [L', U']           sum with bounds [L, U]
nsum           round(clamp(v) 2^-k) - mid' in [-W', W']   normalised sum (W = (U - L) / 2)
nsumsq         round(((clamp(v) - mid)^2 - W^2/2)         sum with bounds [-S, S], S = ceil(W^2/2
               2^-k2) clamped to [-S, S]                  2^-k2), on its own grid 2^k2
hist           1 in the value's bin (B public bins)       row count: per cell the bins of one unit
                                                          sum to <= Linf, so every norm of the
                                                          (cell, bin) vector is at most that of
                                                          the row-count vector
=============  ========================================  ==========================================

Each backend computes these partials its own way: the Spark backend builds them as columns
(:func:`dp_spark.backends.spark.component_row_columns`, :func:`~dp_spark.backends.spark.component_aggregates`),
the local backend from rows (:mod:`dp_spark.backends.local`); an equivalence test holds them equal.
Nothing here imports pyspark.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Optional

from dp_spark.statistics.base import Clamp
from dp_spark.core.units import Aggregate, ContributionBounds, Neighbouring

_PART_BITS = 21
_PART_MASK = 2**_PART_BITS - 1
#: an exact sum's partials are three long parts: bits [0, 21), [21, 42) and the rest (public for
#: the reference backend, dp_spark.backends.local)
SUM_PART_BITS = _PART_BITS


def window_suffix(window: int) -> str:
    """The suffix of the collected partial columns of an N-day window ("" for the day itself)."""
    return "" if window == 1 else f"@{window}"


def _tag(clamp: Optional[Clamp], extra: str = "") -> str:
    if clamp is None:
        return extra
    blob = f"{clamp.column}|{clamp.lower}|{clamp.upper}|{clamp.grid_exponent}|{extra}"
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


@dataclass(frozen=True)
class Component:
    """One noisy vector. ``kind``: rows | units | sum | nsum | nsumsq | hist."""

    kind: str
    clamp: Optional[Clamp] = None
    bins: int = 1
    #: a rolling window of N days over the date key (1: the day itself); its partials are
    #: collected under the names ``<partial>@N`` (:func:`window_suffix`)
    window: int = 1

    # -- identity --------------------------------------------------------------------------
    @property
    def name(self) -> str:
        rolling = "" if self.window == 1 else f"@{self.window}d"
        if self.clamp is None:
            return self.kind + rolling
        extra = f"[{self.clamp.lower},{self.clamp.upper}]"
        if self.kind == "hist":
            extra += f"/{self.bins}"
        return f"{self.kind}:{self.clamp.column}{extra}{rolling}"

    @property
    def width(self) -> int:
        return self.bins if self.kind == "hist" else 1

    # -- sensitivity -------------------------------------------------------------------------
    @property
    def square_grid(self) -> tuple[int, int]:
        """(k2, S) of ``nsumsq``: the grid 2^k2 of the centred squares and their bound S."""
        from dp_spark.core.grid import grid_exponent_for

        half = self.clamp.half_width * self.clamp.half_width / 2
        k2 = grid_exponent_for(-half, half)
        return k2, math.ceil(half / Fraction(2) ** k2)

    @property
    def grid_exponent(self) -> int:
        if self.kind in ("sum", "nsum"):
            return self.clamp.grid_exponent
        if self.kind == "nsumsq":
            return self.square_grid[0]
        return 0

    def _plan_inputs(self, bounds: ContributionBounds) -> tuple[Aggregate, ContributionBounds]:
        if self.kind in ("rows", "hist"):
            return Aggregate.ROW_COUNT, replace(bounds, lower=None, upper=None)
        if self.kind == "units":
            return Aggregate.DISTINCT_UNITS, replace(bounds, lower=None, upper=None)
        if self.kind == "sum":
            return Aggregate.SUM, replace(bounds, lower=self.clamp.lower, upper=self.clamp.upper)
        if self.kind == "nsum":
            return Aggregate.NORMALISED_SUM, replace(bounds, lower=self.clamp.lower, upper=self.clamp.upper)
        if self.kind == "nsumsq":
            k2, s = self.square_grid
            edge = s * Fraction(2) ** k2
            return Aggregate.SUM, replace(bounds, lower=-edge, upper=edge)
        raise ValueError(f"unknown component kind {self.kind!r}")

    def plan(self, bounds: ContributionBounds, relation: Neighbouring, share, cells: int):
        """The :class:`~dp_spark.mechanisms.release.StatisticPlan` of this component over
        ``cells`` key tuples (``cells * width`` noisy entries)."""
        from dp_spark.mechanisms.release import plan_statistic

        agg, b = self._plan_inputs(bounds)
        return plan_statistic(self.name, agg, b, relation, share, self.grid_exponent, cells * self.width)

    def real_sensitivity(self, bounds: ContributionBounds, relation: Neighbouring, cells: int,
                         measure: str) -> float:
        """L1 (pure_dp) or L2 (zcdp) sensitivity in real units: what the budget split weighs."""
        from dp_spark.mechanisms.release import grid_sensitivity

        agg, b = self._plan_inputs(bounds)
        if b.max_partitions_per_unit > cells:
            b = replace(b, max_partitions_per_unit=cells)
        s = grid_sensitivity(agg, b, relation, self.grid_exponent)
        unit = 2.0 ** self.grid_exponent
        return float(s.l1) * unit if measure == "pure_dp" else math.sqrt(float(s.l2_squared)) * unit

    # -- Spark: per-row columns and aggregates ---------------------------------------------
    @property
    def tag(self) -> str:
        """The short name shared by the partial columns of equal components (clamp, bins)."""
        return _tag(self.clamp)

    @property
    def bin_tag(self) -> str:
        return _tag(self.clamp, str(self.bins))

    @property
    def fixed_column(self) -> str:
        return f"dp_fx_{_tag(self.clamp)}"

    def bin_column(self, j: int) -> str:
        """The partial column of bin ``j`` of a ``hist`` component."""
        return f"{self.hist_alias}_{j}"

    @property
    def sum_alias(self) -> str:
        """The prefix of the partial columns of a ``sum`` / ``nsum`` component's clamped value
        sum (``<alias>_lo``, ``_mid``, ``_hi``: three exact long parts)."""
        return f"dp_s_{_tag(self.clamp)}"

    @property
    def square_alias(self) -> str:
        """The prefix of an ``nsumsq`` component's partial columns (``_lo``, ``_mid``, ``_hi``)."""
        return f"dp_sq_{_tag(self.clamp)}"

    @property
    def hist_alias(self) -> str:
        """The prefix of a ``hist`` component's partial columns, one per bin (``_0``, ``_1``, ...)."""
        return f"dp_h_{_tag(self.clamp, str(self.bins))}"

    def exact_sum(self, partials: dict[str, int], alias: Optional[str] = None) -> int:
        """The exact sum of the parts ``<alias>_hi`` 2^42 + ``_mid`` 2^21 + ``_lo`` of one cell."""
        alias = alias or self.sum_alias
        return (partials.get(f"{alias}_hi", 0) << (2 * _PART_BITS)) + \
            (partials.get(f"{alias}_mid", 0) << _PART_BITS) + partials.get(f"{alias}_lo", 0)

    def true_values(self, partials: dict[str, int]) -> list[int]:
        """This component's exact grid integers for one cell, from the collected partials
        (a dict of longs; a cell absent from the data has all zeros). A windowed component reads
        the partials of its window (``<partial>@N``)."""
        if self.window != 1:
            sfx = window_suffix(self.window)
            partials = {k[:-len(sfx)]: v for k, v in partials.items() if k.endswith(sfx)}

        def exact(alias: str) -> int:
            return self.exact_sum(partials, alias)

        if self.kind == "rows":
            return [partials.get("dp_rows", 0)]
        if self.kind == "units":
            return [partials.get("dp_units", 0)]
        if self.kind == "sum":
            return [exact(f"dp_s_{_tag(self.clamp)}")]
        if self.kind == "nsum":
            from dp_spark.mechanisms.release import grid_midpoint

            b = ContributionBounds(max_rows_per_unit=1, lower=self.clamp.lower, upper=self.clamp.upper)
            mid = grid_midpoint(b, self.clamp.grid_exponent)
            return [exact(f"dp_s_{_tag(self.clamp)}") - partials.get("dp_rows", 0) * mid]
        if self.kind == "nsumsq":
            return [exact(self.square_alias)]
        if self.kind == "hist":
            return [partials.get(self.bin_column(j), 0) for j in range(self.bins)]
        raise ValueError(f"unknown component kind {self.kind!r}")

    def true_column(self, dense) -> Optional[list[int]]:
        """:meth:`true_values` of every cell at once (one value per cell), from
        ``dense(name)``: partial ``name`` over the cells (an int64 vector, zeros where a cell
        is absent). Exact Python integers, without a dict per cell. None for a histogram
        (several values per cell: the per-cell path)."""
        sfx = window_suffix(self.window)

        def exact(alias: str) -> list[int]:
            hi, mid, lo = (dense(f"{alias}_{part}{sfx}").tolist() for part in ("hi", "mid", "lo"))
            return [(h << (2 * _PART_BITS)) + (m << _PART_BITS) + v for h, m, v in zip(hi, mid, lo)]

        if self.kind in ("rows", "units"):
            return dense(("dp_rows" if self.kind == "rows" else "dp_units") + sfx).tolist()
        if self.kind == "sum":
            return exact(f"dp_s_{_tag(self.clamp)}")
        if self.kind == "nsum":
            from dp_spark.mechanisms.release import grid_midpoint

            b = ContributionBounds(max_rows_per_unit=1, lower=self.clamp.lower, upper=self.clamp.upper)
            mid = grid_midpoint(b, self.clamp.grid_exponent)
            return [t - r * mid for t, r in zip(exact(f"dp_s_{_tag(self.clamp)}"), dense("dp_rows" + sfx).tolist())]
        if self.kind == "nsumsq":
            return exact(self.square_alias)
        return None
