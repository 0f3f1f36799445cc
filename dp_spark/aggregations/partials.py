"""Partial aggregates per public key, computed in one Spark pass and collected in O(keys).

The noise is *not* added here: the driver-side accountant and mechanisms calibrate it from
the bounds that :mod:`dp_spark.transforms` enforced. This module only turns a bounded,
clamped DataFrame into exact integers per cell::

    bounded df (unit_col, key_col, fixed_col: long, ...)
      -> compute_partials   # key, rows: long[, units: long][, sum_fixed: decimal(38,0)]
      -> collect_partials   # {key: {"rows": int, "units": int[, "sum_fixed": int]}}
                            #  one entry per public key, zeros where the data has none
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dp_spark.errors import ConfigError, SchemaError
from dp_spark.transforms.bounding import _col, _field, _is_key_type, validate_public_keys

__all__ = ["GLOBAL_KEY", "SUM_TYPE", "collect_partials", "compute_partials"]

#: Key of the single cell of an aggregation without a key column.
GLOBAL_KEY = "__all__"

#: Type of ``sum_fixed``. Each long value is split into three 21-bit parts summed as longs
#: (exact for up to 2^42 rows per key, whatever the values, in ANSI mode or not); the three
#: per-key sums are combined in this type after the aggregation.
SUM_TYPE = T.DecimalType(38, 0)
_PART_BITS = 21
_PART_MASK = 2**_PART_BITS - 1


def compute_partials(
    df: DataFrame,
    *,
    key_col: str | None,
    unit_col: str,
    fixed_col: str | None = None,
    count_units: bool = True,
) -> DataFrame:
    """Exact partial aggregates per key, in one ``groupBy`` pass.

    Output schema (one row per key present in the input; an empty input gives zero rows)::

        key        <type of key_col>, or string "__all__" when key_col is None
        rows       long      count of rows
        units      long      count of distinct non-null unit ids   -- only with count_units
        sum_fixed  decimal(38,0)  sum of fixed_col (0 when all null)   -- only with fixed_col

    Privacy contract
    ----------------
    Exact (noise-free) aggregates: never publish them. Their sensitivity is inherited from the
    bounds enforced upstream by :func:`~dp_spark.transforms.bound_contributions` and
    :func:`~dp_spark.transforms.clamp_to_fixed_point`: for one added/removed unit, per cell
    ``rows`` moves by <= Linf, ``units`` by <= 1 and ``sum_fixed`` by
    <= Linf * max(|L|, |U|) * 2^f; over all cells, at most L0 cells move and ``rows`` moves by
    <= min(K, L0 * Linf) in total. Keys are whatever the input holds: restrict them to the
    public key set before (and :func:`collect_partials` filters again).
    """
    _field(df, unit_col, role="unit")
    if key_col is not None:
        key_field = _field(df, key_col, role="key")
        if not _is_key_type(key_field.dataType):
            raise SchemaError(
                f"key column {key_col!r} has type {key_field.dataType.simpleString()}; "
                "group keys must be string, date or integer"
            )
        key = _col(key_col).alias("key")
    else:
        key = F.lit(GLOBAL_KEY).alias("key")
    aggs = [F.count(F.lit(1)).cast(T.LongType()).alias("rows")]
    if count_units:
        aggs.append(F.countDistinct(_col(unit_col)).cast(T.LongType()).alias("units"))
    parts: list[str] = []
    if fixed_col is not None:
        fixed_field = _field(df, fixed_col, role="fixed-point value")
        if not isinstance(fixed_field.dataType, T.IntegralType):
            raise SchemaError(
                f"fixed-point column {fixed_col!r} has type "
                f"{fixed_field.dataType.simpleString()}; it must be an integer type "
                "(see clamp_to_fixed_point)"
            )
        # v = hi * 2^42 + mid * 2^21 + lo with |hi|, mid, lo < 2^21: three long sums, exact
        # for up to 2^42 rows per key, much cheaper than a decimal sum of every row
        v = _col(fixed_col).cast(T.LongType())
        mask = F.lit(_PART_MASK).cast(T.LongType())
        for name, expr in (("__dp_sum_lo", v.bitwiseAND(mask)),
                           ("__dp_sum_mid", F.shiftright(v, _PART_BITS).bitwiseAND(mask)),
                           ("__dp_sum_hi", F.shiftright(v, 2 * _PART_BITS))):
            aggs.append(F.coalesce(F.sum(expr), F.lit(0).cast(T.LongType())).alias(name))
            parts.append(name)
    # A global aggregation is a groupBy on a literal too, so that empty input gives zero rows
    # on every path and collect_partials is the one place that fills missing cells.
    out = df.groupBy(key).agg(*aggs)
    if not parts:
        # schema: key, rows: long[, units: long]
        return out
    d = lambda c: F.col(c).cast(SUM_TYPE)  # noqa: E731
    total = (d("__dp_sum_hi") * F.lit(2 ** (2 * _PART_BITS)).cast(SUM_TYPE)
             + d("__dp_sum_mid") * F.lit(2 ** _PART_BITS).cast(SUM_TYPE) + d("__dp_sum_lo"))
    keep = ["key", "rows"] + (["units"] if count_units else [])
    # schema: key, rows: long[, units: long], sum_fixed: decimal(38,0)
    return out.select(*[F.col(c) for c in keep], total.cast(SUM_TYPE).alias("sum_fixed"))


def _to_int(value: Any, *, column: str) -> int:
    if value is None:
        return 0
    if isinstance(value, Decimal):
        if value != value.to_integral_value():
            raise SchemaError(f"partial column {column!r} holds a non-integral decimal")
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SchemaError(f"partial column {column!r} must hold integers")
    return value


def collect_partials(
    df: DataFrame,
    *,
    key_col: str | None,
    public_keys: Iterable[Any] | None,
    has_sum: bool,
) -> dict[Any, dict[str, int]]:
    """Collect the output of :func:`compute_partials`: one entry per public key, in order.

    Returns ``{key: {"rows": int[, "units": int][, "sum_fixed": int]}}`` ("units" when ``df``
    has that column). Every public key absent
    from the data gets zeros (a released cell must exist whether or not the data has it, so
    that the set and number of noise draws do not depend on the data). Keys in ``df`` outside
    the public set are filtered out in Spark and never reach the driver; at most
    ``len(public_keys) + 1`` rows are collected. ``key_col=None`` means the global cell:
    ``public_keys`` must then be None (or ``["__all__"]``) and the result has the single key
    ``"__all__"``. Decimals become exact Python ints.

    Privacy contract
    ----------------
    Returns exact aggregates to driver memory only: do not log, print or store them; add
    noise first. The key set is the declared one, never read from the data.
    """
    if key_col is None:
        if public_keys is not None and list(public_keys) != [GLOBAL_KEY]:
            raise ConfigError("a global aggregation (no key column) takes no public keys")
        keys: list[Any] = [GLOBAL_KEY]
        key_name = "global key"
    else:
        key_field = _field(df, "key", role="partials key")
        keys = validate_public_keys(public_keys, key_field.dataType, key_col=key_col)
        key_name = key_col
    columns = ["key", "rows"] + (["units"] if "units" in df.columns else []) + (["sum_fixed"] if has_sum else [])
    for name in columns[1:]:
        _field(df, name, role="partials")

    collected = (
        df.where(_col("key").isin(keys)).select(*[_col(c) for c in columns]).limit(len(keys) + 1).collect()
    )
    found: dict[Any, dict[str, int]] = {}
    for row in collected:
        k = row["key"]
        if k in found:
            raise SchemaError(
                f"partials hold more than one row for a key of {key_name!r}; "
                "pass the output of compute_partials"
            )
        found[k] = {c: _to_int(row[c], column=c) for c in columns[1:]}
    zero = {c: 0 for c in columns[1:]}
    # schema: {public key -> {"rows", "units"[, "sum_fixed"]}: int}, in public-key order
    return {k: dict(found.get(k, zero)) for k in keys}
