"""One bounded pass for all the statistics of a release: partials per key tuple.

::

    input (pinned snapshot)
      -> select_columns(spec.columns)           data minimisation, types checked
      -> drop_null_units; where (public, row-wise predicate); value policy per value column
         (null / NaN rows dropped: every statistic of the release counts the same rows)
      -> keys cast to string, restricted to each column's public key set
      -> dp_cell: the key tuple's index in the cross product (long; public keys only)
      -> neighbouring 'event' only: keep_unique_events(unit)   one row per event id; ids with
                                               two different rows dropped (one more shuffle)
      -> bound_contributions(unit, dp_cell)    ONE shuffle by the unit: <= L0 key tuples,
                                               <= Linf rows per tuple, <= K rows per unit
      -> clamp each value column to the fixed-point grid; per-row columns of the components
      -> groupBy(dp_cell, unit), then groupBy(dp_cell): every component's partials in ONE
         aggregation of two levels; the first needs no shuffle (the rows are partitioned by the
         unit already), the second one shuffle; distinct units = (cell, unit) groups
      -> collect: at most (key tuples + 1) rows of longs reach the driver

Limits that cannot bind are not computed (L0 >= number of key tuples; Linf >= K).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dp_spark.errors import ConfigError, SchemaError
from dp_spark.transforms.bounding import (
    _col,
    _field,
    apply_value_policy,
    bound_contributions,
    clamp_to_fixed_point,
    drop_null_units,
    keep_unique_events,
    select_columns,
)
from dp_spark.units import Neighbouring

CELL = "dp_cell"


def _free_name(name: str, taken) -> str:
    while name in taken:
        name += "_"
    return name


def build_query_partials(df: DataFrame, plan, salt: str) -> DataFrame:
    """Lazy DataFrame of the partials per key-tuple index (``dp_cell``) for every component of
    ``plan`` (a :class:`~dp_spark.statistics.plan.QueryPlan`). Schema and ``where`` errors are
    raised here, before any charge (the ``where`` is resolved by Spark's analyser against the
    input restricted to ``spec.columns``)."""
    spec = plan.spec
    unit = spec.unit.column
    key_cols = [k.column for k in spec.key_sets]
    value_cols = list(dict.fromkeys(c.clamp.column for c in plan.components if c.clamp is not None))
    df = select_columns(df, list(spec.columns), unit_col=unit, key_cols=key_cols)
    for v in value_cols:
        if not isinstance(_field(df, v, role="value").dataType, T.NumericType):
            raise SchemaError(f"value column {v!r} must be numeric")
    df = drop_null_units(df, unit_col=unit)
    if spec.where is not None:
        try:
            df = df.where(F.expr(spec.where))
            _ = df.schema  # Spark Connect analyses lazily: force it now
        except Exception as exc:  # AnalysisException / ParseException: never echo the data
            raise ConfigError(f"{spec.source}: field 'where' is not a valid row-wise predicate over "
                              f"'columns' ({type(exc).__name__})") from None
    for v in value_cols:
        df = apply_value_policy(df, value_col=v)
    cell = F.lit(0).cast(T.LongType())
    for ks in spec.key_sets:
        k = _col(ks.column).cast(T.StringType())
        idx = F.array_position(F.array(*[F.lit(x) for x in ks.values]), k)  # 1-based, 0 when absent
        df = df.where(k.isNotNull() & (idx > 0))
        cell = cell * F.lit(len(ks.values)).cast(T.LongType()) + (idx - 1).cast(T.LongType())
    cell_name = _free_name(CELL, spec.columns)
    # only what the statistics read: the unit, the key tuple's index and the value columns
    df = df.select(_col(unit), cell.alias(cell_name), *[_col(v) for v in value_cols])
    if spec.neighbouring is Neighbouring.EVENT:
        # one row in or out must move one row of one cell: the bounding below keeps one row
        # per id, but an added row with an existing id could replace it (L1 = 2)
        df = keep_unique_events(df, unit_col=unit)
    b = spec.bounds
    cells = spec.cells
    l0 = b.max_partitions_per_unit if b.max_partitions_per_unit < cells else None
    linf = b.max_rows_per_partition
    if linf is not None and linf >= b.max_rows_per_unit:
        linf = None  # the K window keeps fewer rows anyway
    if l0 is None and linf is None:
        df = bound_contributions(df, unit_col=unit, partition_col=None, max_partitions_per_unit=None,
                                 max_rows_per_partition=None, max_rows_per_unit=b.max_rows_per_unit, salt=salt)
    else:
        df = bound_contributions(df, unit_col=unit, partition_col=cell_name, max_partitions_per_unit=l0,
                                 max_rows_per_partition=linf, max_rows_per_unit=b.max_rows_per_unit, salt=salt)
    for comp in plan.components:
        if comp.clamp is not None and comp.fixed_column not in df.columns:
            c = comp.clamp
            df = clamp_to_fixed_point(df, value_col=c.column, lower=float(c.lower), upper=float(c.upper),
                                      frac_bits=-c.grid_exponent, out_col=comp.fixed_column)
    for comp in plan.components:
        for name, col in comp.row_columns().items():
            if name not in df.columns:
                df = df.withColumn(name, col)
    aggs: dict[str, Any] = {}
    units = False
    for comp in plan.components:
        for alias, agg in comp.aggregates(unit).items():
            if alias == "dp_units":
                units = True  # counted below as the number of (cell, unit) groups
            else:
                aggs.setdefault(alias, agg)
    # Two levels, two shuffles in all: per (cell, unit) first -- the rows are already
    # hash-partitioned by the unit after bounding, so this needs no shuffle -- then per cell,
    # summing the per-unit partials (exact longs: a unit has <= Linf' rows in a cell) and
    # counting the units (a distinct count without Spark's Expand of count(distinct)).
    per_unit = df.groupBy(_col(cell_name).alias(CELL), _col(unit)).agg(*[a.alias(n) for n, a in aggs.items()])
    final = [F.sum(F.col(n)).cast(T.LongType()).alias(n) for n in aggs]
    if units:
        final.append(F.count(F.lit(1)).cast(T.LongType()).alias("dp_units"))
    # schema: dp_cell: long, then one long per partial column
    return per_unit.groupBy(CELL).agg(*final)


def collect_query_partials(df: DataFrame, plan) -> dict[int, dict[str, int]]:
    """{cell index: {partial: int}} for the cells present in the data (absent cells are zeros
    for the noise step). At most (cells + 1) rows are collected."""
    n = plan.spec.cells
    rows = df.where((F.col(CELL) >= 0) & (F.col(CELL) < n)).limit(n + 1).collect()
    out: dict[int, dict[str, int]] = {}
    for r in rows:
        d = r.asDict()
        i = int(d.pop(CELL))
        if i in out:
            raise SchemaError("partials hold more than one row for a key tuple")
        out[i] = {k: int(v or 0) for k, v in d.items()}
    return out
