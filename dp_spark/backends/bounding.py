"""Data minimisation, special-value policies and contribution bounding, on Spark DataFrames.

Every function here is pure: ``f(df, *, params) -> DataFrame``. None of them reads a global
SparkSession, collects data or raises an error whose occurrence depends on data values: all
checks look only at the schema and at the parameters, so they run before any Spark job.
Temporary columns are named ``__dp_*``; input columns with that prefix are refused.

The usual pipeline, each step stating its schema::

    df                                   # any schema
    select_columns(df, [...], unit_col=u, key_cols=[k], value_col=v)
                                         # (u, k, v) in that order, types checked
    drop_null_units(.., unit_col=u)      # same schema; u is never null
    apply_value_policy(.., value_col=v)  # same schema; v is never null/NaN, no -0.0
    restrict_to_public_keys(.., key_col=k, public_keys=K)
                                         # same schema; k in K
    keep_unique_events(.., unit_col=u)   # event-level units only: same schema; one row per
                                         # id, ids with two different rows dropped
    bound_contributions(.., unit_col=u, partition_col=k, L0, Linf, K, salt)
                                         # same schema; <= L0 keys, <= Linf rows per key
                                         # and <= K rows per unit
    clamp_to_fixed_point(.., value_col=v, lower, upper, frac_bits, out_col=f)
                                         # + f: long, round(clamp(v) * 2^frac_bits)

Bounding plan (general case: L0 > 1, Linf < K), measured with ``benchmarks/bounding.py``
on 2M demo rows (200k users, users in several regions, L0 = 3, Linf = 2, K = 5; local[2] on
a 2-core machine shared with other jobs, load average 14-20, 5 interleaved repetitions; every
candidate keeps the same 434,775 rows, same checksum):

=============================  ==========  =====================================
plan                           median      vs three windows (paired median)
=============================  ==========  =====================================
three windows (kept)           31.1 s      1.00 (4 sorts: 1 map-side, 3 after the shuffle)
one sort (L0 + cell rank)      51.7 s      1.20, slower in 4 of 5 pairs (2 sorts)
one sort, running frames       --          1.07 (3-repetition run; 2 sorts)
shuffle by unit, no sort       11.9 s      0.35 (the floor: read, hash, shuffle)
=============================  ==========  =====================================

The single-sort plans compute the L0 rank and the rank in the cell over ONE sort by (unit,
partition priority, partition, row priority) -- ``dense_rank`` and ``rank`` of the partition
prefix beside ``row_number`` of the whole order -- and need a second sort only for K. They
lose the partial top-L0 that Spark runs before the shuffle for the first window, and their
longer sort keys and extra window operators over every row cost more than the sorts they
save; on this machine they were not faster, so the three windows stay (one shuffle by the
unit). What changed: a window whose limit cannot bind is skipped (Linf >= K: no Linf window;
K >= L0 * Linf: no K window, as before), and without L0 the cell limit no longer shuffles by
(unit, partition) before the K window shuffles by the unit again (one shuffle, the rank in the
cell from ``row_number() - rank()`` over one sort). A per-unit aggregate with bounded
collections needs a top-k aggregate Spark SQL does not have (``collect_list`` is unbounded in
a unit's rows), so it was not pursued. ``tests/spark/test_transforms.py`` checks the kept
rows against a plain-Python reference on random data (L0 > 1, Linf < K, nulls, duplicates).

Policies (one place, every code path):

* null privacy-unit ids: rows dropped (:func:`drop_null_units`);
* null and NaN values: rows dropped (:func:`apply_value_policy`);
* +inf / -inf values: kept, clamped to the bounds (:func:`clamp_to_fixed_point`);
* -0.0: becomes 0.0; subnormals are kept (fixed point rounds them to 0);
* group keys: only declared public keys are kept (:func:`restrict_to_public_keys`).
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Iterable, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dp_spark.errors import ConfigError, InvalidBoundsError, SchemaError

__all__ = [
    "MAX_FIXED_POINT_MAGNITUDE",
    "TEMP_PREFIX",
    "apply_value_policy",
    "bound_contributions",
    "clamp_to_fixed_point",
    "dedupe_unit_partition",
    "drop_null_units",
    "flag_partitions_per_unit",
    "keep_unique_events",
    "restrict_to_public_keys",
    "select_columns",
    "validate_public_keys",
]

#: Prefix of every temporary column this package adds; input columns may not use it.
TEMP_PREFIX = "__dp_"

#: Largest allowed |bound| * 2^frac_bits: doubles represent every integer up to 2^53 exactly,
#: so clamped fixed-point values are exact and a long sum of 2^11 of them cannot wrap.
MAX_FIXED_POINT_MAGNITUDE = 2**52

_MAX_ROW_BOUND = 2**31 - 1  # row_number() / dense_rank() are 32-bit integers

_INTEGRAL_RANGES: dict[type, tuple[int, int]] = {
    T.ByteType: (-(2**7), 2**7 - 1),
    T.ShortType: (-(2**15), 2**15 - 1),
    T.IntegerType: (-(2**31), 2**31 - 1),
    T.LongType: (-(2**63), 2**63 - 1),
}


# --------------------------------------------------------------------------- helpers


def column_ref(name: str) -> Column:
    """A top-level column by exact name (dots and backticks in names are quoted)."""
    return F.col("`" + name.replace("`", "``") + "`")


def schema_field(df: DataFrame, name: str, *, role: str) -> T.StructField:
    """The schema field called exactly ``name``; SchemaError naming the column otherwise."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{role} column name must be a non-empty string")
    matches = [f for f in df.schema.fields if f.name == name]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise SchemaError(f"{role} column {name!r} is ambiguous: the input has it {len(matches)} times")
    hint = [f.name for f in df.schema.fields if f.name.lower() == name.lower()]
    suffix = f" (did you mean {hint[0]!r}? names are case-sensitive)" if hint else ""
    raise SchemaError(f"{role} column {name!r} is missing from the input{suffix}")


def _check_no_temp_columns(df: DataFrame) -> None:
    clashing = [f.name for f in df.schema.fields if f.name.startswith(TEMP_PREFIX)]
    if clashing:
        raise SchemaError(
            f"input columns {clashing!r} use the reserved prefix {TEMP_PREFIX!r}; rename them"
        )


# Not hashable/sortable as a unit or key. SpatialType appeared in pyspark 4.1 (VariantType in
# 4.0): looked up with getattr so that pyspark 4.0 (Databricks' LTS) imports this module.
_NON_UNIT_TYPES = tuple(
    t for t in (getattr(T, "VariantType", None), getattr(T, "SpatialType", None)) if t is not None
)


def _is_unit_type(dt: T.DataType) -> bool:
    return isinstance(dt, T.AtomicType) and not isinstance(dt, _NON_UNIT_TYPES)


def _is_key_type(dt: T.DataType) -> bool:
    return isinstance(dt, (T.StringType, T.CharType, T.VarcharType, T.DateType, T.IntegralType))


def _is_identity_type(dt: T.DataType) -> bool:
    """Types that xxhash64 can hash and that can be sorted (row identity, tie-breaks)."""
    if isinstance(dt, T.ArrayType):
        return _is_identity_type(dt.elementType)
    if isinstance(dt, T.StructType):
        return all(_is_identity_type(f.dataType) for f in dt.fields)
    return isinstance(dt, T.NullType) or _is_unit_type(dt)


def _check_bound(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidBoundsError(f"{name} must be an int, got {type(value).__name__}")
    if not 1 <= value <= _MAX_ROW_BOUND:
        raise InvalidBoundsError(f"{name} must be in [1, {_MAX_ROW_BOUND}], got {value}")
    return value


def _check_identity_types(df: DataFrame, purpose: str) -> None:
    """Every column must be hashable and sortable (no map, variant or spatial column)."""
    for f in df.schema.fields:
        if not _is_identity_type(f.dataType):
            raise SchemaError(
                f"column {f.name!r} has type {_type_name(f.dataType)}, which cannot be {purpose}; "
                "drop it with select_columns first"
            )


def _type_name(dt: T.DataType) -> str:
    return dt.simpleString()


_SALT_COL = "__dp_salt"


def _salt_frame(df: DataFrame, salt: str) -> DataFrame:
    """A one-row DataFrame holding the salt, on ``df``'s own session: joined instead of a
    ``F.lit(salt)``, so the salt is a value of the data and never appears in a query plan."""
    schema = T.StructType([T.StructField(_SALT_COL, T.StringType(), False)])
    return df.sparkSession.createDataFrame([(salt,)], schema)


def _with_row_priority(df: DataFrame, salt: str) -> tuple[DataFrame, list[Column]]:
    """``df`` + ``__dp_salt`` (one broadcast row: the salt is data, never a literal of the
    plan) + ``__dp_row_prio``: long, the row's keyed priority, and the row order of every cut
    by rows: (priority, then the input's columns as the tie break)."""
    original = [f.name for f in df.schema.fields]
    out = df.crossJoin(F.broadcast(_salt_frame(df, salt)))
    out = out.withColumn("__dp_row_prio", F.xxhash64(F.col(_SALT_COL), F.lit("row"),
                                                     *[column_ref(c) for c in original]))
    return out, [F.col("__dp_row_prio").asc(), *[column_ref(c).asc_nulls_first() for c in original]]


def _partition_priority(unit: Column, part: Column) -> Column:
    """A partition's keyed priority for its unit (the L0 cut keeps the smallest); needs the
    ``__dp_salt`` column."""
    return F.xxhash64(F.col(_SALT_COL), F.lit("partition"), unit, part)


# --------------------------------------------------------------------------- selection


def select_columns(
    df: DataFrame,
    columns: Sequence[str],
    *,
    unit_col: str | None = None,
    key_cols: Sequence[str] = (),
    value_col: str | None = None,
) -> DataFrame:
    """Data minimisation: keep exactly ``columns`` (in that order) and check their types.

    ``unit_col``, ``key_cols`` and ``value_col`` name the role of some of ``columns`` and must
    be members of it. Type rules:

    * unit column: any non-complex type (string, numeric, date, timestamp, binary, ...);
    * key columns: string, date or integral (byte/short/int/long);
    * value column: numeric (integral, float, double or decimal).

    Columns of ``columns`` without a role are kept unchecked (they must exist). Names are
    matched exactly (case-sensitive), whatever ``spark.sql.caseSensitive`` says.

    Raises
    ------
    ConfigError
        ``columns`` is empty, has duplicates, or a role names a column outside it.
    SchemaError
        A column is missing, ambiguous, has a reserved ``__dp_`` name or a wrong type. The
        message names the column and types, never data values.

    Privacy contract
    ----------------
    Not a DP mechanism; it bounds *what* reaches the engine (data minimisation). Columns not
    selected never reach later steps, the row identity hash or any output.
    """
    if isinstance(columns, str):
        raise ConfigError("columns must be a sequence of column names, not one string")
    columns = list(columns)
    if not columns:
        raise ConfigError("columns must name at least one column")
    if len(set(columns)) != len(columns):
        raise ConfigError("columns contains duplicate names")
    key_cols = [key_cols] if isinstance(key_cols, str) else list(key_cols)
    roles: list[tuple[str, str]] = []
    if unit_col is not None:
        roles.append(("unit", unit_col))
    roles.extend(("key", k) for k in key_cols)
    if value_col is not None:
        roles.append(("value", value_col))
    for role, name in roles:
        if name not in columns:
            raise ConfigError(f"{role} column {name!r} is not among the selected columns")
    role_names = [name for _, name in roles]
    if len(set(role_names)) != len(role_names):
        raise ConfigError("one column cannot play two roles (unit, key, value)")

    fields = {name: schema_field(df, name, role="selected") for name in columns}
    for name in columns:
        if name.startswith(TEMP_PREFIX):
            raise SchemaError(f"column {name!r} uses the reserved prefix {TEMP_PREFIX!r}")
    for role, name in roles:
        dt = fields[name].dataType
        if role == "unit" and not _is_unit_type(dt):
            raise SchemaError(
                f"unit column {name!r} has type {_type_name(dt)}; a privacy-unit id must be a "
                "non-complex type (string, number, date, timestamp, binary)"
            )
        if role == "key" and not _is_key_type(dt):
            raise SchemaError(
                f"key column {name!r} has type {_type_name(dt)}; group keys must be string, "
                "date or integer"
            )
        if role == "value" and not isinstance(dt, T.NumericType):
            raise SchemaError(
                f"value column {name!r} has type {_type_name(dt)}; a value column must be numeric"
            )
    return df.select(*[column_ref(name) for name in columns])


# --------------------------------------------------------------------------- null / special values


def drop_null_units(df: DataFrame, *, unit_col: str) -> DataFrame:
    """Drop every row whose privacy-unit id is null. Schema unchanged.

    Privacy contract
    ----------------
    Policy: a row with a null unit id cannot be attributed to any unit, so it is removed
    before bounding. (Treating all null ids as one unit would also be bounded -- and
    :func:`bound_contributions` does exactly that if this step is skipped -- but dropping is
    simpler and safe: neighbouring datasets differ in the rows of one *attributed* unit, and
    no number of null-id rows can enter any aggregate.) Only SQL NULL is dropped; other
    sentinel ids (``""``, ``"unknown"``, NaN for a float id) are each an ordinary unit, bounded
    like any other. Adding or removing one unit changes this step's output by exactly that
    unit's rows, so it adds no sensitivity.
    """
    schema_field(df, unit_col, role="unit")
    # schema: unchanged; unit_col IS NOT NULL
    return df.where(column_ref(unit_col).isNotNull())


def apply_value_policy(df: DataFrame, *, value_col: str) -> DataFrame:
    """Apply the special-value policy to a numeric value column. Schema unchanged.

    * null and NaN: the row is dropped (a value that does not exist contributes no row to a
      count or a sum of that value, whichever aggregate is computed);
    * +inf / -inf: kept; :func:`clamp_to_fixed_point` maps them to the upper / lower bound;
    * -0.0: becomes +0.0, so that no later step (hashing, sorting, formatting) can tell them
      apart;
    * subnormals: kept (the fixed-point conversion rounds them to 0).

    Integral and decimal columns can only be null (dropped).

    Privacy contract
    ----------------
    A row-wise filter/map: each output row depends on one input row only, so the step adds no
    sensitivity; the bounds enforced later hold for whatever survives. The same function is
    used on every code path so that a neighbour made only of NaN/inf rows is treated exactly
    like on the main path.
    """
    field = schema_field(df, value_col, role="value")
    dt = field.dataType
    if not isinstance(dt, T.NumericType):
        raise SchemaError(f"value column {value_col!r} has type {_type_name(dt)}; it must be numeric")
    v = column_ref(value_col)
    if isinstance(dt, (T.FloatType, T.DoubleType)):
        zero = F.lit(0.0).cast(dt)
        # schema: unchanged; value_col not null, not NaN, never -0.0
        return df.where(v.isNotNull() & ~F.isnan(v)).withColumn(
            value_col, F.when(v == zero, zero).otherwise(v)
        )
    # schema: unchanged; value_col not null
    return df.where(v.isNotNull())


# --------------------------------------------------------------------------- public keys


def validate_public_keys(public_keys: Iterable[Any], dtype: T.DataType, *, key_col: str) -> list[Any]:
    """Check a declared public key set against the key column's type; return it de-duplicated.

    Strings for string columns, ``datetime.date`` (not ``datetime``) for date columns, ``int``
    (not ``bool``, within the column's range) for integral columns. The key set must be
    non-empty and may not contain None. Order of first appearance is kept.
    """
    if isinstance(public_keys, (str, bytes)):
        raise ConfigError(f"public keys of {key_col!r} must be a collection of keys, not one string")
    if public_keys is None:
        raise ConfigError(f"public keys of {key_col!r} must be declared")
    keys = list(public_keys)
    if not keys:
        raise ConfigError(f"the public key set of {key_col!r} is empty")
    if isinstance(dtype, (T.StringType, T.CharType, T.VarcharType)):
        ok = lambda k: isinstance(k, str)  # noqa: E731
        expected = "str"
    elif isinstance(dtype, T.DateType):
        ok = lambda k: isinstance(k, _dt.date) and not isinstance(k, _dt.datetime)  # noqa: E731
        expected = "datetime.date"
    elif isinstance(dtype, T.IntegralType):
        lo, hi = _INTEGRAL_RANGES[type(dtype)]
        ok = lambda k: isinstance(k, int) and not isinstance(k, bool) and lo <= k <= hi  # noqa: E731
        expected = f"int in [{lo}, {hi}]"
    else:
        raise SchemaError(
            f"key column {key_col!r} has type {_type_name(dtype)}; group keys must be string, "
            "date or integer"
        )
    bad = [i for i, k in enumerate(keys) if not ok(k)]
    if bad:
        raise ConfigError(
            f"public keys of {key_col!r} ({_type_name(dtype)}) must be {expected}; "
            f"{len(bad)} declared key(s) are not (first at position {bad[0]})"
        )
    return list(dict.fromkeys(keys))


def restrict_to_public_keys(df: DataFrame, *, key_col: str, public_keys: Iterable[Any]) -> DataFrame:
    """Keep only rows whose ``key_col`` is in the declared public key set. Schema unchanged.

    Works for string, date and integral keys (see :func:`validate_public_keys`). Rows with a
    null key, or a key outside the set, are dropped.

    Privacy contract
    ----------------
    The key set is public (declared in the spec, never read from the data), so the set of
    released cells reveals nothing about membership (RELIABILITY 17). Run it *before*
    :func:`bound_contributions`, so that a unit's L0 budget of partitions is spent on public
    keys only (a unit with rows in non-public keys would otherwise waste its L0 slots and be
    under-counted, a bias, not a privacy leak). A row-wise filter: no added sensitivity.
    """
    field = schema_field(df, key_col, role="key")
    keys = validate_public_keys(public_keys, field.dataType, key_col=key_col)
    # schema: unchanged; key_col IN public_keys (never null)
    return df.where(column_ref(key_col).isin(keys))


# --------------------------------------------------------------------------- bounding


def bound_contributions(
    df: DataFrame,
    *,
    unit_col: str,
    partition_col: str | None,
    max_partitions_per_unit: int | None,
    max_rows_per_partition: int | None,
    max_rows_per_unit: int | None,
    salt: str,
    flag_col: str | None = None,
) -> DataFrame:
    """Enforce the contribution bounds of every privacy unit. Output schema = input schema
    (+ ``flag_col``: boolean, when given).

    In this order:

    1. L0 = ``max_partitions_per_unit``: each unit keeps its rows in at most L0 distinct
       values of ``partition_col``, those with the smallest keyed priority
       ``xxhash64(salt, "partition", unit, partition)`` (ties broken by the key itself):
       ``dense_rank() <= L0``;
    2. Linf = ``max_rows_per_partition``: at most Linf rows per (unit, partition):
       ``row_number() <= Linf``;
    3. K = ``max_rows_per_unit``: at most K rows per unit overall: ``row_number() <= K``.

    Within a unit, rows are ranked by ``xxhash64(salt, "row", <all columns of the row>)``, ties
    broken by the columns themselves, so the selection is a deterministic function of the data
    and the salt: it is the same with 1 or 200 input partitions, after a task retry and on a
    recomputation. Only byte-identical rows can tie, and which copy is kept makes no
    difference. For a salt unknown to whoever chose the data, bottom-K by a hash priority is a
    uniform sample without replacement of the unit's distinct rows (no bias towards early
    events, small ids, ...). ``F.rand()`` is never used.

    The salt is kept out of the query plan: it is never a literal. It reaches the executors as
    the one value of a one-row DataFrame (column ``__dp_salt``) cross-joined by broadcast, so
    ``EXPLAIN`` in every mode, the Spark UI's SQL tab and the event log's plan descriptions
    show ``xxhash64(__dp_salt#n, row, ...)`` and never the salt itself (tested). The priorities
    are the same numbers as with ``F.lit(salt)``. The salt is *not* hidden from whoever can
    run code on the cluster or read the salt file; see "Privacy contract" for what it protects.

    Steps 1 and 2 commute (which partitions a unit keeps does not depend on its rows), so the
    order only matters for K. Spark plans each ``rank <= n`` filter as a ``WindowGroupLimit``;
    the first one runs partially before the shuffle, so a unit with 10^6 rows ships only the
    rows of its locally top-L0 partitions (the optimiser does this for limits up to
    ``spark.sql.optimizer.windowGroupLimitThreshold``, 1000 by default; above that the result
    is the same, only slower). All windows share one shuffle (hash of the unit); a window
    whose limit cannot bind is not computed: no Linf window when Linf >= K (the unit's K first
    rows hold at most K of any cell), no K window when K >= L0 * Linf. Without L0, the cell
    limit is computed over one sort by (unit, partition, row priority) with windows partitioned
    by the unit alone (``row_number() - rank()`` of the partition prefix), so the K window
    needs no second shuffle. Why three windows and not one sort for everything: see the module
    docstring, "Bounding plan" (measured). A unit with very many rows in a *single* partition
    key is reduced only after the shuffle (one task sorts them, spilling if needed).

    With ``partition_col=None`` there is one partition per unit: L0 is irrelevant and the unit
    keeps ``min(K, Linf)`` rows (whichever are given).

    ``flag_col``: the K cut (step 3) is not applied but FLAGGED: every row the L0 and Linf cuts
    keep is returned, with ``flag_col`` True on exactly the rows K keeps (False on the others;
    True everywhere when K cannot bind). L0 and Linf never drop a whole (unit, partition) pair
    of the partitions they keep (Linf >= 1), so one aggregation can count the unit in each of
    those partitions and aggregate the flagged rows only (the distinct-units count, which the K
    cut never cuts: :func:`dp_spark.backends.spark.build_query_partials`). The flagged rows are
    the rows returned without ``flag_col``: the same bounds hold for them. Not with L0 = 1,
    whose cuts are one window (and K cannot drop the one partition's pair there).

    A bound given as None is not enforced; at least one row bound must be given (K, or Linf
    with a partition column and L0).

    Null unit ids, if still present, form one unit and are bounded like any other (see
    :func:`drop_null_units`). Every column must be hashable and sortable: drop map, variant
    and spatial columns with :func:`select_columns` first.

    Privacy contract
    ----------------
    Unit: ``unit_col``. Enforced bounds, per unit: at most L0 partitions, at most Linf rows in
    each, at most K rows overall (and at most L0 * Linf). Each unit's selection depends only
    on that unit's rows and the salt, so adding/removing one unit leaves every other unit's
    rows unchanged and changes the output by at most min(K, L0 * Linf) rows, in at most L0
    partitions, at most Linf of them in any one partition. These are the bounds from which
    :mod:`dp_spark.core.units` derives sensitivities (count: L1 = min(K, L0*Linf), per-partition
    Linf; sums: times max(|L|, |U|) after clamping).

    The DP guarantee does not depend on the salt: for *any* fixed salt, bounding is a per-unit
    (stable) transformation, so the sensitivities above hold even for someone who knows it.
    What the salt's confidentiality buys is only the *uniformity* of the sample against an
    adversary who chooses the data: whoever knows the salt can craft rows that are always
    (or never) among a unit's kept K, biasing the statistic (not its privacy). Hence it is
    kept out of plans and logs (above) and in a 0600 file (:mod:`dp_spark.salt`), one per
    warehouse; it is not a key whose disclosure breaks the guarantee.
    """
    if not isinstance(salt, str) or not salt:
        raise ConfigError("salt must be a non-empty string")
    l0 = None if max_partitions_per_unit is None else _check_bound(
        "max_partitions_per_unit", max_partitions_per_unit
    )
    linf = None if max_rows_per_partition is None else _check_bound(
        "max_rows_per_partition", max_rows_per_partition
    )
    k = None if max_rows_per_unit is None else _check_bound("max_rows_per_unit", max_rows_per_unit)
    if partition_col is not None and k is None and (l0 is None or linf is None):
        raise InvalidBoundsError(
            "contributions are unbounded: give max_rows_per_unit, or both "
            "max_partitions_per_unit and max_rows_per_partition"
        )
    if partition_col is None and k is None and linf is None:
        raise InvalidBoundsError(
            "contributions are unbounded: give max_rows_per_unit (no partition column)"
        )

    _check_no_temp_columns(df)
    schema_field(df, unit_col, role="unit")
    if partition_col is not None:
        schema_field(df, partition_col, role="partition")
        if partition_col == unit_col:
            raise ConfigError("partition_col must differ from unit_col")
    _check_identity_types(df, "hashed or sorted for row priority")

    original = [f.name for f in df.schema.fields]
    unit = column_ref(unit_col)
    out, row_order = _with_row_priority(df, salt)

    kept = [] if flag_col is None else [F.col(flag_col)]
    if partition_col is None:
        limit = min(b for b in (k, linf) if b is not None)
        w = Window.partitionBy(unit).orderBy(*row_order)
        # schema: input + __dp_row_prio + __dp_rank_unit: int, then filtered (or flagged)
        out = out.withColumn("__dp_rank_unit", F.row_number().over(w))
        if flag_col is not None and (linf is None or (k is not None and k < linf)):
            out = out.withColumn(flag_col, F.col("__dp_rank_unit") <= F.lit(limit))
        else:
            out = out.where(F.col("__dp_rank_unit") <= limit)
            if flag_col is not None:
                out = out.withColumn(flag_col, F.lit(True))
        return out.select(*[column_ref(c) for c in original], *kept)

    part = column_ref(partition_col)
    if l0 == 1 and flag_col is not None:
        raise ConfigError("internal: flag_col needs L0 > 1 (with L0 = 1 the K cut cannot drop the pair)")
    if l0 == 1:
        # One partition per unit: L0, Linf and K are one window. Rows ordered by the
        # partition's priority, then the row's: the unit's first row lies in its kept
        # partition, and that partition's min(Linf, K) first rows are the kept ones (the
        # same rows as the three windows below would keep, with one sort instead of two).
        part_prio = "__dp_part_prio"
        limit = min(b for b in (k, linf) if b is not None)
        w = Window.partitionBy(unit).orderBy(F.col(part_prio).asc(), part.asc_nulls_first(), *row_order)
        # schema: + __dp_part_prio: long, __dp_rank_unit: int; at most `limit` rows per unit
        out = out.withColumn(
            part_prio, _partition_priority(unit, part)
        ).withColumn("__dp_rank_unit", F.row_number().over(w)).where(F.col("__dp_rank_unit") <= limit)
        # schema: + __dp_first_part; a second window over the same (already sorted) order,
        # after the filter, so the first one keeps its partial top-k before the shuffle
        out = out.withColumn("__dp_first_part", F.first(part).over(w)).where(
            part.eqNullSafe(F.col("__dp_first_part"))
        )
        return out.select(*[column_ref(c) for c in original])
    # Linf >= K: the K limit alone keeps the same rows (a unit's K first rows include at most
    # K of any cell), so the cell window is skipped (one sort less)
    cell_linf = linf if linf is not None and (k is None or linf < k) else None  # None: no cell window
    max_left = None
    if l0 is not None:
        part_prio = "__dp_part_prio"
        # schema: + __dp_part_prio: long
        out = out.withColumn(
            part_prio, _partition_priority(unit, part)
        )
        w0 = Window.partitionBy(unit).orderBy(F.col(part_prio).asc(), part.asc_nulls_first())
        # schema: + __dp_rank_part: int; keep the unit's L0 partitions of smallest priority
        out = out.withColumn("__dp_rank_part", F.dense_rank().over(w0)).where(
            F.col("__dp_rank_part") <= l0
        )
        if cell_linf is not None:
            # partitioned by (unit, partition): hash partitioning by the unit satisfies it, so
            # this window shares the first one's shuffle
            w1 = Window.partitionBy(unit, part).orderBy(*row_order)
            # schema: + __dp_rank_cell: int; at most Linf rows per (unit, partition)
            out = out.withColumn("__dp_rank_cell", F.row_number().over(w1)).where(
                F.col("__dp_rank_cell") <= cell_linf
            )
            max_left = l0 * cell_linf
    elif cell_linf is not None:
        # No L0 (then K is given): a window partitioned by (unit, partition) at the bottom would
        # shuffle by both and the K window again by the unit. Instead, windows partitioned by
        # the unit alone, over ONE sort by (unit, partition, row priority, row): the row's rank
        # in its cell is row_number() - rank() of the partition prefix + 1 (the prefix window
        # needs no sort of its own).
        w_part = Window.partitionBy(unit).orderBy(part.asc_nulls_first())
        w_rows = Window.partitionBy(unit).orderBy(part.asc_nulls_first(), *row_order)
        # schema: + __dp_row_in_unit: int, __dp_first_row: int; at most Linf rows per cell
        out = out.withColumn("__dp_row_in_unit", F.row_number().over(w_rows)).withColumn(
            "__dp_first_row", F.rank().over(w_part)
        ).where(F.col("__dp_row_in_unit") - F.col("__dp_first_row") < cell_linf)
    if k is not None and (max_left is None or k < max_left):
        w2 = Window.partitionBy(unit).orderBy(*row_order)
        # schema: + __dp_rank_unit: int; at most K rows per unit (or flagged)
        out = out.withColumn("__dp_rank_unit", F.row_number().over(w2))
        if flag_col is None:
            out = out.where(F.col("__dp_rank_unit") <= k)
        else:
            out = out.withColumn(flag_col, F.col("__dp_rank_unit") <= F.lit(k))
    elif flag_col is not None:
        out = out.withColumn(flag_col, F.lit(True))
    # schema: input schema (temporary columns dropped) + flag_col when given
    return out.select(*[column_ref(c) for c in original], *kept)


def flag_partitions_per_unit(df: DataFrame, *, unit_col: str, partition_col: str,
                             max_partitions_per_unit: int, salt: str, flag_col: str) -> DataFrame:
    """Input + ``flag_col``: boolean, True on the rows in the unit's L0 partitions of
    smallest keyed priority: the partitions :func:`bound_contributions`' L0 cut keeps (the
    same priority, ties broken by the partition key). Nothing is dropped."""
    if not isinstance(salt, str) or not salt:
        raise ConfigError("salt must be a non-empty string")
    l0 = _check_bound("max_partitions_per_unit", max_partitions_per_unit)
    _check_no_temp_columns(df)
    schema_field(df, unit_col, role="unit")
    schema_field(df, partition_col, role="partition")
    original = [f.name for f in df.schema.fields]
    unit, part = column_ref(unit_col), column_ref(partition_col)
    out = df.crossJoin(F.broadcast(_salt_frame(df, salt)))
    w = Window.partitionBy(unit).orderBy(_partition_priority(unit, part).asc(), part.asc_nulls_first())
    # schema: input + flag_col: boolean
    return out.withColumn(flag_col, F.dense_rank().over(w) <= F.lit(l0)).select(
        *[column_ref(c) for c in original], F.col(flag_col))


def keep_unique_events(df: DataFrame, *, unit_col: str) -> DataFrame:
    """Event-level units: one row per event id, and no row for an ambiguous id. Output schema =
    input schema.

    The rows are first taken as a set (byte-identical copies of a row, such as an event
    ingested twice, are one event); then every id that still carries two or more *different*
    rows is dropped with all its rows. Each remaining id has exactly one row.

    One aggregation by the id (one shuffle, partial aggregation before it): per id, the
    smallest and the largest of its rows (as structs of the other columns) are kept, and the id
    only when they are equal (null-safe). No error ever depends on the data: an input with
    duplicated ids is not refused (that refusal would itself be a non-private answer about the
    data); its ambiguous ids are simply not counted.

    Privacy contract
    ----------------
    Neighbouring ``event``: D and D' differ in one row. Let x be that row's id. Other ids'
    output is unchanged; x's output goes from "its one distinct row, if it had exactly one" to
    the same for D' -- a change of at most ONE row (x had 0 distinct rows: +1; 1: -1, or 0 if
    the row was a copy; 2 or more: 0). The same holds when D and D' differ in all the rows of
    one id. So, with :func:`bound_contributions` at K = L0 = Linf = 1 after it (a no-op on its
    output, kept for uniformity), one event moves one row of one cell: the ``event`` entries of
    :func:`dp_spark.core.units.sensitivity`. Bounding alone does NOT give this: keeping one row per
    id by priority lets an added row with an existing id *replace* the kept row, moving one
    row from one cell to another (L1 = 2).

    Apply it after the row-wise steps (null units, ``where``, value policy, public keys),
    whose output then decides which rows an id carries.
    """
    _check_no_temp_columns(df)
    schema_field(df, unit_col, role="unit")
    _check_identity_types(df, "compared")
    original = [f.name for f in df.schema.fields]
    others = [c for c in original if c != unit_col]
    if not others:
        # schema: (unit_col,); distinct
        return df.select(column_ref(unit_col)).distinct()
    row = F.struct(*[column_ref(c).alias(c) for c in others])
    # schema: unit_col, __dp_lo: struct<others>, __dp_hi: struct<others>; one row per id
    agg = df.groupBy(column_ref(unit_col).alias(unit_col)).agg(
        F.min(row).alias("__dp_lo"), F.max(row).alias("__dp_hi"))
    # schema: input schema; ids whose rows are all identical, one row each
    kept = agg.where(F.col("__dp_lo").eqNullSafe(F.col("__dp_hi")))
    return kept.select(*[column_ref(unit_col) if c == unit_col else F.col("__dp_lo")[c].alias(c) for c in original])


def dedupe_unit_partition(df: DataFrame, *, unit_col: str, partition_col: str | None) -> DataFrame:
    """One row per distinct (unit, partition): the input of distinct-unit counts.

    Output schema: ``(unit_col, partition_col)`` with their input types, or ``(unit_col,)``
    when ``partition_col`` is None.

    Privacy contract
    ----------------
    After :func:`bound_contributions` (L0), each unit has at most one row in each of at most
    L0 partitions, so a count of rows per partition of this output is a distinct-unit count
    with per-partition sensitivity 1 and L1 sensitivity L0 (L2 sqrt(L0)). Deduplication alone
    does not bound L0: bound first.
    """
    schema_field(df, unit_col, role="unit")
    cols = [unit_col]
    if partition_col is not None:
        schema_field(df, partition_col, role="partition")
        if partition_col == unit_col:
            raise ConfigError("partition_col must differ from unit_col")
        cols.append(partition_col)
    # schema: (unit_col[, partition_col]); distinct
    return df.select(*[column_ref(c) for c in cols]).distinct()


# --------------------------------------------------------------------------- clamping


def _check_fixed_point_params(lower: Any, upper: Any, frac_bits: Any) -> tuple[float, float, int]:
    for name, b in (("lower", lower), ("upper", upper)):
        if isinstance(b, bool) or not isinstance(b, (int, float)):
            raise InvalidBoundsError(f"clamp bound {name} must be a real number")
        if isinstance(b, float) and not math.isfinite(b):
            raise InvalidBoundsError(f"clamp bound {name} must be finite")
    if isinstance(frac_bits, bool) or not isinstance(frac_bits, int) or not 0 <= frac_bits <= 52:
        raise InvalidBoundsError("frac_bits must be an int in [0, 52]")
    lo, hi = float(lower), float(upper)
    if lo != lower or hi != upper:
        raise InvalidBoundsError("clamp bounds must be exactly representable as doubles")
    if not lo <= hi:
        raise InvalidBoundsError("clamp bounds are inverted: lower must be <= upper")
    if max(abs(lo), abs(hi)) * 2.0**frac_bits > MAX_FIXED_POINT_MAGNITUDE:
        raise InvalidBoundsError(
            "max(|lower|, |upper|) * 2^frac_bits exceeds 2^52: lower the bounds or frac_bits"
        )
    return lo + 0.0, hi + 0.0, frac_bits  # + 0.0 turns -0.0 into 0.0


def clamp_to_fixed_point(
    df: DataFrame,
    *,
    value_col: str,
    lower: float,
    upper: float,
    frac_bits: int,
    out_col: str,
) -> DataFrame:
    """Clamp ``value_col`` to [lower, upper] and write ``round(v * 2^frac_bits)`` as a long.

    Output schema: input schema plus ``out_col: long`` (or ``value_col`` replaced when
    ``out_col == value_col``). The value is read as a double (exact for every |v| <= 2^53 and
    for all floats; larger integers and decimals only matter through their clamp), clamped,
    multiplied by 2^frac_bits (exact) and rounded half away from zero. Because every row's
    fixed-point value is an exact function of that row alone, a sum of them is an integer sum
    that does not depend on partitioning or order (RELIABILITY 7).

    +inf/-inf (and any value near 2^63, or beyond) clamp to the bounds: no overflow, no wrap,
    no exception, with ``spark.sql.ansi.enabled`` true or false (RELIABILITY 8). Null and NaN
    should have been dropped by :func:`apply_value_policy`; if not, they give a null
    ``out_col`` (no contribution to a sum) rather than an imputed bound.

    Bounds are checked here too (finite, lower <= upper, frac_bits in [0, 52],
    max(|L|, |U|) * 2^frac_bits <= 2^52), raising InvalidBoundsError before any data is read.

    Privacy contract
    ----------------
    Row-wise: |out_col| <= max(|L|, |U|) * 2^frac_bits for every row. With the bounds of
    :func:`bound_contributions`, one unit changes a per-partition sum of ``out_col`` by at most
    Linf * max(|L|, |U|) * 2^f and the L1 total by at most min(K, L0*Linf) * max(|L|, |U|) * 2^f
    (add/remove); (U - L) applies only to replace-one with a public size.
    """
    lo, hi, f = _check_fixed_point_params(lower, upper, frac_bits)
    field = schema_field(df, value_col, role="value")
    if not isinstance(field.dataType, T.NumericType):
        raise SchemaError(
            f"value column {value_col!r} has type {_type_name(field.dataType)}; it must be numeric"
        )
    if not isinstance(out_col, str) or not out_col:
        raise ConfigError("out_col must be a non-empty string")
    # out_col may use the __dp_ prefix (an engine-internal column); it may not clobber one.
    if out_col != value_col and out_col in df.columns:
        raise SchemaError(f"output column {out_col!r} already exists in the input")

    # Cast to double never fails (ANSI or not) for numeric types; decimals beyond 2^53 round,
    # then clamp. Comparisons, not arithmetic, on the raw value: nothing can overflow.
    v = column_ref(value_col).cast("double")
    lo_lit, hi_lit = F.lit(lo).cast("double"), F.lit(hi).cast("double")
    clamped = F.when(v < lo_lit, lo_lit).when(v > hi_lit, hi_lit).otherwise(v)
    # |clamped * 2^f| <= 2^52: exact in double, round() is exact, the long cast cannot overflow.
    fixed = F.round(clamped * F.lit(float(2**f)), 0).cast("bigint")
    # v IS NULL or NaN -> NULL. (NaN compares greater than every double in Spark, so without
    # this guard it would silently become `upper`.)
    result = F.when(v.isNull() | F.isnan(v), F.lit(None).cast("bigint")).otherwise(fixed)
    # schema: input + out_col: long (nullable)
    return df.withColumn(out_col, result)
