"""One bounded pass for all the statistics of a release: partials per key tuple.

::

    input (pinned snapshot)
      -> select_columns(spec.columns)           data minimisation, types checked
      -> drop_null_units; where (public, row-wise predicate); value policy per value column
         (null / NaN rows dropped: every statistic of the release counts the same rows)
      -> keys cast to string, restricted to each column's public key set by a broadcast hash
         join against a small (key, index) DataFrame per key column (O(1) per row)
      -> dp_cell: the key tuple's index in the cross product (long; public keys only); a
         bucketed date key (week, month) joins each declared day to its bucket's index
      -> rolling windows: a broadcast join with the date feeds (dp_spark.statistics.plan.DateFeeds)
         makes each row one row per (day, window) cell it feeds: dp_cell = index * windows + w;
         the bounding below cuts these cells as any others; collect splits them per window
      -> neighbouring 'event' only: keep_unique_events(unit)   one row per event id; ids with
                                               two different rows dropped (one more shuffle)
      -> bound_contributions(unit, dp_cell)    ONE shuffle by the unit: <= L0 key tuples,
                                               <= Linf rows per tuple, <= K rows per unit
      -> clamp each value column to the fixed-point grid; per-row columns of the components
      -> groupBy(dp_cell, unit), then groupBy(dp_cell): every component's partials in ONE
         aggregation of two levels; the first needs no shuffle (the rows are partitioned by the
         unit already), the second one shuffle
      -> distinct units: the (unit, dp_cell) pairs cut to L0' = min(L0, K) cells and never by
         the Linf/K row cuts (a unit is counted in every one of its <= L0' cells, whichever K
         rows the row statistics keep; sensitivity L0' as before); when the K cut cannot drop
         a pair (K >= L0 Linf') these are the (cell, unit) groups above; else, with public
         keys, still ONE pass: the K cut flags its rows instead of dropping them
         (bound_contributions' flag_col; L0 and Linf never drop a pair of the cells they keep),
         the first level groups every pair (the row statistics aggregate the flagged rows) and
         L0' is a flag on those groups (flag_partitions_per_unit); with private keys one more
         pass over the distinct pairs
      -> collect: at most key tuples rows of longs reach the driver as int64 vectors
         (stream_partial_columns): in one Spark job as Arrow up to 2^24 values, beyond that
         streamed one Spark partition at a time

Limits that cannot bind are not computed (L0 >= number of key tuples; Linf >= K).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from fractions import Fraction
from typing import Any, Iterator

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dp_spark.errors import ConfigError, SchemaError
from dp_spark.backends.bounding import (
    column_ref,
    schema_field,
    apply_value_policy,
    bound_contributions,
    clamp_to_fixed_point,
    drop_null_units,
    flag_partitions_per_unit,
    keep_unique_events,
    select_columns,
)
from dp_spark.core.units import Neighbouring
from dp_spark.statistics.components import SUM_PART_BITS, Component
from dp_spark.statistics.plan import date_feeds, split_windows

CELL = "dp_cell"
PUB, PRIV, SEL = "p", "k", "dp_sel"  # the cell struct's fields with private keys; the noisy count


_ANSI = "spark.sql.ansi.enabled"
_TOTAL_LOCK = threading.RLock()
_TOTAL_DEPTH: dict[int, tuple[int, Any]] = {}  # id(session) -> (depth, ANSI value before)


@contextmanager
def total_where(spark, active: bool = True) -> Iterator[None]:
    """Resolve and evaluate a spec's ``where`` so that no row can make it raise.

    With ``spark.sql.ansi.enabled=false``, the implicit casts Spark's analyser inserts
    (``coupon = 5`` on a string column), integer overflow and conversions give null or wrap
    instead of raising, and a null predicate makes the row not match; the functions that raise
    whatever the mode are refused by :func:`dp_spark.spec.where.check_where`. Classic Spark fixes
    each expression's mode when the plan is resolved, Spark Connect when it runs: the engine
    holds this context around both (building the partials and collecting them). The session's
    previous value is restored when the outermost holder leaves (re-entrant, thread-safe).
    Refused before any charge (ConfigError) if the session will not take the setting.
    """
    if not active:
        yield
        return
    key = id(spark)
    with _TOTAL_LOCK:
        depth, before = _TOTAL_DEPTH.get(key, (0, None))
        if depth == 0:
            before = spark.conf.get(_ANSI, None)
            spark.conf.set(_ANSI, "false")
            if str(spark.conf.get(_ANSI, "")).lower() != "false":
                spark.conf.set(_ANSI, before) if before is not None else spark.conf.unset(_ANSI)
                raise ConfigError("field 'where': this Spark session does not allow "
                                  "spark.sql.ansi.enabled=false, which a where needs to be evaluated "
                                  "without failing on a row; remove the where or allow the setting")
        _TOTAL_DEPTH[key] = (depth + 1, before)
    try:
        yield
    finally:
        with _TOTAL_LOCK:
            depth, before = _TOTAL_DEPTH[key]
            if depth == 1:
                del _TOTAL_DEPTH[key]
                if before is None:
                    spark.conf.unset(_ANSI)
                else:
                    spark.conf.set(_ANSI, before)
            else:
                _TOTAL_DEPTH[key] = (depth - 1, before)


def _free_name(name: str, taken) -> str:
    while name in taken:
        name += "_"
    return name


def key_index_frame(spark, values, key_name: str, index_name: str, indices=None) -> DataFrame:
    """A small DataFrame of a public key set: ``key_name`` string (the key as the data's
    column cast to string reads it) and ``index_name`` long (its 0-based position in
    ``values``, distinct keys; or ``indices[i]`` when given: a bucket's index for each day).
    Built on the driver from the public key set only."""
    schema = T.StructType([T.StructField(key_name, T.StringType(), False),
                           T.StructField(index_name, T.LongType(), False)])
    at = range(len(values)) if indices is None else indices
    return spark.createDataFrame([(str(v), int(i)) for v, i in zip(values, at, strict=True)], schema)


def join_key_index(df: DataFrame, column: str, values, indices=None) -> tuple[DataFrame, Any]:
    """``df`` restricted to the rows whose ``column`` (cast to string) is one of the public
    ``values``, with the key's 0-based index in ``values``: (DataFrame, index Column, long).
    A broadcast hash join against :func:`key_index_frame`, so the cost per row does not grow
    with the number of keys. Rows with a null or undeclared key are dropped (inner join)."""
    taken = set(df.columns)
    key_name = _free_name(f"dp_key_{column}", taken)
    index_name = _free_name(f"dp_kidx_{column}", taken | {key_name})
    keys = key_index_frame(df.sparkSession, values, key_name, index_name, indices)
    joined = df.join(F.broadcast(keys), column_ref(column).cast("string") == F.col(key_name), "inner")
    return joined.drop(key_name), F.col(index_name)


def key_table_frame(df: DataFrame, column: str, where, source: str, field: str) -> DataFrame:
    """The key set of a public key table (``public_keys: {table, column, where}``): the distinct
    non-null values of ``column`` in ``df`` (its pinned snapshot), cast to string as the data's
    key column is read by :func:`join_key_index`, of the rows ``where`` (a row-wise predicate
    already allowed by :func:`dp_spark.spec.where.check_where`) keeps. Lazy: one column
    ``key``; count it, then collect it (:func:`collect_table_keys`), inside :func:`total_where`
    when there is a ``where``. A missing column or an invalid ``where`` is a ConfigError naming
    the field (``field``: ``group_by[0].public_keys.table``), never a value."""
    base = field.rsplit(".", 1)[0]
    if column not in df.columns:
        raise ConfigError(f"{source}: field '{base}.column': the key table has no column '{column}'")
    try:
        with total_where(df.sparkSession, where is not None):
            if where is not None:
                df = df.where(F.expr(where))
            keys = df.select(column_ref(column).cast("string").alias("key")).where(F.col("key").isNotNull())
            keys = keys.distinct()
            _ = keys.schema  # Spark Connect analyses lazily: force it now
    except ConfigError:
        raise
    except Exception as exc:  # AnalysisException / ParseException: never echo the data
        raise ConfigError(f"{source}: field '{base}.where' is not a valid row-wise predicate over the key "
                          f"table's columns ({type(exc).__name__})") from None
    return keys


def collect_table_keys(keys: DataFrame, limit: int) -> tuple[str, ...]:
    """The keys of :func:`key_table_frame`, sorted, once their number is known to be at most
    ``limit`` (<= HARD_MAX_CELLS: they are held on the driver as any declared key set is, and
    broadcast back by :func:`join_key_index`); more is an internal error, never a silent cut."""
    rows = keys.limit(limit + 1).collect()
    if len(rows) > limit:
        raise ConfigError("internal: the key table changed while it was read at a pinned version")
    return tuple(sorted(r[0] for r in rows))


def component_row_columns(comp: Component) -> dict[str, Any]:
    """Per-row Spark columns a component aggregates: {name: Column}, over the bounded rows
    (which hold ``dp_cell``, the unit and the clamped fixed-point value ``fixed_column``
    of each clamp, and the raw value column). Names are shared by equal components."""
    if comp.kind == "nsumsq":
        k2, s = comp.square_grid
        c = comp.clamp
        unit = float(Fraction(2) ** c.grid_exponent)
        x = F.col(comp.fixed_column).cast("double") * F.lit(unit) - F.lit(float(c.midpoint))
        half = float(c.half_width * c.half_width / 2)
        y = F.round((x * x - F.lit(half)) * F.lit(float(Fraction(2) ** -k2)), 0).cast("bigint")
        y = F.least(F.greatest(y, F.lit(-s).cast("bigint")), F.lit(s).cast("bigint"))
        return {f"dp_sq_{comp.tag}": y}
    if comp.kind == "hist":
        c = comp.clamp
        lo = float(c.lower * Fraction(2) ** -c.grid_exponent)
        span = float((c.upper - c.lower) * Fraction(2) ** -c.grid_exponent)
        pos = (F.col(comp.fixed_column).cast("double") - F.lit(lo)) / F.lit(span) * F.lit(float(comp.bins))
        b = F.least(F.greatest(F.floor(pos), F.lit(0)), F.lit(comp.bins - 1)).cast("int")
        return {f"dp_bin_{comp.bin_tag}": b}
    return {}


def component_aggregates(comp: Component, unit_col: str, kept=None) -> dict[str, Any]:
    """{alias: aggregate Column} of a component's partials per cell (longs), over the rows
    where the boolean column ``kept`` holds (every row when None)."""

    def only_kept(col):
        return col if kept is None else F.when(kept, col)

    def exact_sum(col: str, alias: str) -> dict[str, Any]:
        # v = hi 2^42 + mid 2^21 + lo: three long sums, exact for up to 2^42 rows per cell
        v = only_kept(F.col(col).cast("bigint"))
        mask = F.lit((2**SUM_PART_BITS - 1)).cast("bigint")
        parts = {f"{alias}_lo": v.bitwiseAND(mask),
                 f"{alias}_mid": F.shiftright(v, SUM_PART_BITS).bitwiseAND(mask),
                 f"{alias}_hi": F.shiftright(v, 2 * SUM_PART_BITS)}
        return {a: F.coalesce(F.sum(e), F.lit(0).cast("bigint")) for a, e in parts.items()}

    rows = {"dp_rows": F.count(only_kept(F.lit(1))).cast("bigint")}
    if comp.kind == "rows":
        return rows
    if comp.kind == "units":
        # the number of (cell, unit) groups: computed by the two-level aggregation
        # (dp_spark.backends.spark), not a count(distinct) per row
        return {"dp_units": None}
    if comp.kind in ("sum", "nsum"):
        out = exact_sum(comp.fixed_column, f"dp_s_{comp.tag}")
        return {**out, **rows} if comp.kind == "nsum" else out
    if comp.kind == "nsumsq":
        name = comp.square_alias
        return exact_sum(name, name)
    if comp.kind == "hist":
        b = F.col(f"dp_bin_{comp.bin_tag}")
        return {comp.bin_column(j): F.coalesce(F.sum(F.when(only_kept(b) == j, F.lit(1)).otherwise(F.lit(0))),
                                              F.lit(0)).cast("bigint")
                for j in range(comp.bins)}
    raise ValueError(f"unknown component kind {comp.kind!r}")


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
        if not isinstance(schema_field(df, v, role="value").dataType, T.NumericType):
            raise SchemaError(f"value column {v!r} must be numeric")
    df = drop_null_units(df, unit_col=unit)
    if spec.where is not None:
        try:
            with total_where(df.sparkSession):  # classic Spark fixes the mode here
                df = df.where(F.expr(spec.where))
                _ = df.schema  # Spark Connect analyses lazily: force it now
        except ConfigError:  # total_where's own refusal: already says what to do
            raise
        except Exception as exc:  # AnalysisException / ParseException: never echo the data
            raise ConfigError(f"{spec.source}: field 'where' is not a valid row-wise predicate over "
                              f"'columns' ({type(exc).__name__})") from None
    for v in value_cols:
        df = apply_value_policy(df, value_col=v)
    cell = F.lit(0).cast("bigint")
    feeds = date_feeds(spec)  # rolling windows: a row feeds several (day, window) cells
    for ks in spec.public_key_sets:
        k = column_ref(ks.column).cast("string")
        if feeds is not None and ks.column == feeds.column:
            # the day's part comes from its feeds (joined below); the rows of undeclared days,
            # and of days no window reaches, have none and are dropped by the join
            df = df.where(k.isNotNull())
            cell = cell * F.lit(len(ks.values)).cast("bigint")
            continue
        # the key's index by a broadcast hash join on a small (key, index) DataFrame: O(1) per
        # row whatever the size of the key set; the inner join drops null and undeclared keys;
        # a bucketed date key joins each declared day to its week's or month's index
        if ks.bucket is not None:
            at = ks.bucket_index()
            df, idx = join_key_index(df, ks.column, ks.days, [at[d] for d in ks.days])
        else:
            df, idx = join_key_index(df, ks.column, ks.values)
        cell = cell * F.lit(len(ks.values)).cast("bigint") + idx
    if feeds is not None:
        # schema of the feeds: day string, t long -- one row per (day, expanded cell offset)
        day_col, t_col = _free_name("dp_feed_day", spec.columns), _free_name("dp_feed_t", spec.columns)
        feed_rows = [(d, t) for d, ts in zip(feeds.days, feeds.targets) for t in ts]
        feed_df = df.sparkSession.createDataFrame(
            feed_rows, T.StructType([T.StructField(day_col, T.StringType(), False),
                                     T.StructField(t_col, T.LongType(), False)]))
        df = df.join(F.broadcast(feed_df), column_ref(feeds.column).cast("string") == F.col(day_col))
        cell = cell * F.lit(feeds.n_windows).cast("bigint") + F.col(t_col)
    private = spec.private_key_sets
    if private:
        # keys found privately: the cell is (public tuple index, private key values); rows
        # with a null private key are dropped (a null is not a key that can be published)
        for ks in private:
            df = df.where(column_ref(ks.column).isNotNull())
        cell = F.struct(cell.alias(PUB), *[column_ref(ks.column).cast("string").alias(f"{PRIV}{j}")
                                           for j, ks in enumerate(private)])
    cell_name = _free_name(CELL, spec.columns)
    # only what the statistics read: the unit, the key tuple's index and the value columns
    df = df.select(column_ref(unit), cell.alias(cell_name), *[column_ref(v) for v in value_cols])
    if getattr(spec, "stream", None) is not None:
        # a stream (one date key: the cell index is the day's, in date order): each unit's rows
        # on its FIRST L0 days only, so a day added later never changes which earlier days a
        # unit counts on (dp_spark.statistics.stream); the L0 cut below then keeps them all
        first = _free_name("dp_first_days", spec.columns)
        by_unit = Window.partitionBy(column_ref(unit)).orderBy(column_ref(cell_name))
        df = (df.withColumn(first, F.dense_rank().over(by_unit))
              .where(F.col(first) <= F.lit(spec.bounds.max_partitions_per_unit)).drop(first))
        if any(c.kind == "units" for c in plan.components):
            # distinct units ever seen: each unit counted once, on its first day (before the row
            # cuts, so a later day's rows never move it)
            first_seen = (df.groupBy(column_ref(unit)).agg(F.min(column_ref(cell_name)).alias(CELL))
                          .groupBy(CELL).agg(F.count(F.lit(1)).cast("bigint").alias("dp_units")))
    if spec.neighbouring is Neighbouring.EVENT:
        # one row in or out must move one row of one cell: the bounding below keeps one row
        # per id, but an added row with an existing id could replace it (L1 = 2)
        df = keep_unique_events(df, unit_col=unit)
    b = spec.bounds
    # with private keys an upper bound: L0 is then always enforced; with windows, the
    # expanded (key tuple, window) cells
    cells = spec.cells * (1 if feeds is None else feeds.n_windows)
    before_rows_cut = df
    l0 = b.max_partitions_per_unit if (b.max_partitions_per_unit < cells or private) else None
    linf = b.max_rows_per_partition
    if linf is not None and linf >= b.max_rows_per_unit:
        linf = None  # the K window keeps fewer rows anyway
    units = any(c.kind == "units" for c in plan.components)
    # the K cut can drop a whole (unit, cell) pair only when it binds below L0 x Linf'
    l0_eff = min(b.max_partitions_per_unit, cells) if not private else b.max_partitions_per_unit
    pairs_cut = units and b.max_rows_per_unit < l0_eff * min(linf or b.max_rows_per_unit, b.max_rows_per_unit)
    stream_units = getattr(spec, "stream", None) is not None and units
    # distinct units the K cut would thin (public keys): ONE pass. The K cut flags its rows
    # instead of dropping them (L0 and Linf, applied, never drop a pair of the cells they
    # keep), the first level below groups EVERY (cell, unit) pair of those cells (the row
    # statistics aggregate the flagged rows only) and the pairs' own L0' cut is a flag on those
    # groups: the same partials as the row bounding plus _units_per_cell's second pass over
    # the input, with one read of it
    one_pass = pairs_cut and not private and not stream_units
    kept = _free_name("dp_kept", spec.columns)
    flag = kept if one_pass else None
    if l0 is None and linf is None:
        df = bound_contributions(df, unit_col=unit, partition_col=None, max_partitions_per_unit=None,
                                 max_rows_per_partition=None, max_rows_per_unit=b.max_rows_per_unit, salt=salt,
                                 flag_col=flag)
    else:
        df = bound_contributions(df, unit_col=unit, partition_col=cell_name, max_partitions_per_unit=l0,
                                 max_rows_per_partition=linf, max_rows_per_unit=b.max_rows_per_unit, salt=salt,
                                 flag_col=flag)
    for comp in plan.components:
        if comp.clamp is not None and comp.fixed_column not in df.columns:
            c = comp.clamp
            df = clamp_to_fixed_point(df, value_col=c.column, lower=float(c.lower), upper=float(c.upper),
                                      frac_bits=-c.grid_exponent, out_col=comp.fixed_column)
    for comp in plan.components:
        for name, col in component_row_columns(comp).items():
            if name not in df.columns:
                df = df.withColumn(name, col)
    aggs: dict[str, Any] = {}
    for comp in plan.components:
        for alias, agg in component_aggregates(comp, unit, F.col(kept) if one_pass else None).items():
            if alias != "dp_units":  # dp_units: counted below as the number of (cell, unit) groups
                aggs.setdefault(alias, agg)
    # Two levels, two shuffles in all: per (cell, unit) first -- the rows are already
    # hash-partitioned by the unit after bounding, so this needs no shuffle -- then per cell,
    # summing the per-unit partials (exact longs: a unit has <= Linf' rows in a cell) and
    # counting the units (a distinct count without Spark's Expand of count(distinct)).
    # distinct units only: the (cell, unit) groups need one aggregate (Spark refuses none);
    # it stays on the first level
    first = aggs or {"dp_rows_": F.count(F.lit(1))}
    per_unit = df.groupBy(column_ref(cell_name).alias(CELL), column_ref(unit)).agg(*[a.alias(n) for n, a in first.items()])
    final = [F.sum(F.col(n)).cast("bigint").alias(n) for n in aggs]
    if one_pass:
        # every pair of the cells the L0 cut keeps is a group here; a unit counts in its first
        # L0' = min(L0, K) cells by the row bounding's cell priority, as in _units_per_cell
        pair_l0 = min(l0_eff, b.max_rows_per_unit)
        counted = F.lit(True)
        if pair_l0 < cells:
            per_unit = flag_partitions_per_unit(per_unit, unit_col=unit, partition_col=CELL,
                                                max_partitions_per_unit=pair_l0, salt=salt, flag_col=kept)
            counted = F.col(kept)
        final.append(F.count(F.when(counted, F.lit(1))).cast("bigint").alias("dp_units"))
        return per_unit.groupBy(CELL).agg(*final)
    if stream_units:
        units = pairs_cut = False  # counted on each unit's first day (above), joined below
    if units and not pairs_cut:
        final.append(F.count(F.lit(1)).cast("bigint").alias("dp_units"))
    # schema: dp_cell: long (public keys only) or struct<p: long, k0: string, ...>, then one
    # long per partial column
    partials = per_unit.groupBy(CELL).agg(*final) if final else None
    if stream_units:
        partials = first_seen if partials is None else partials.join(first_seen, on=CELL, how="full_outer")
    if pairs_cut:
        pair_l0 = min(l0_eff, b.max_rows_per_unit)
        counted = _units_per_cell(before_rows_cut, unit, cell_name,
                                  pair_l0 if (private or pair_l0 < cells) else None, salt)
        partials = counted if partials is None else partials.join(counted, on=CELL, how="full_outer")
    if not private:
        return partials
    return _select_private_keys(partials, per_unit, plan.selection, unit)


def _units_per_cell(df: DataFrame, unit: str, cell_name: str, l0, salt: str) -> DataFrame:
    """``dp_units`` per cell: the distinct (unit, cell) pairs of the rows before bounding, cut
    to each unit's first ``l0`` = min(L0, K) cells by the row bounding's own cell priority (a
    function of the salt, the unit and the cell only: cells the row bounding keeps too), and
    never cut by Linf or K. A unit adds 1 to at most min(L0, K) cells: the sensitivity of
    ``Component('units')``, unchanged. Schema: dp_cell, dp_units: long."""
    # partitioned by the unit first: the distinct pairs and the L0 window then share ONE
    # shuffle (two in all with the count per cell)
    pairs = df.select(column_ref(unit), column_ref(cell_name)).repartition(column_ref(unit)).distinct()
    if l0 is not None:
        # one row per pair: Linf = 1 and K = L0 cannot bind below the L0 cut
        pairs = bound_contributions(pairs, unit_col=unit, partition_col=cell_name, max_partitions_per_unit=l0,
                                    max_rows_per_partition=1, max_rows_per_unit=l0, salt=salt)
    return pairs.groupBy(column_ref(cell_name).alias(CELL)).agg(F.count(F.lit(1)).cast("bigint").alias("dp_units"))


def _select_private_keys(partials: DataFrame, per_unit: DataFrame, sel, unit: str) -> DataFrame:
    """The partials of the cells whose private key tuple passes the noisy threshold (see
    :mod:`dp_spark.statistics.selection`), with the tuple's noisy count (``dp_sel``) for the
    driver's per-column limit. Same bounded data as the partials (one query: Spark reuses the
    bounding's shuffle). The noise (discrete Laplace or Gaussian, ``sel.mechanism``) is drawn on
    the executors by OpenDP's exact sampler; the
    noisy counts are never logged and never published."""
    from dp_spark.statistics.selection import keep_over_threshold

    names = [f"{PRIV}{j}" for j in range(len(sel.columns))]
    scale, threshold, mechanism = sel.scale, sel.threshold, sel.mechanism
    # schema: k0.. string, unit -- one row per (private tuple, unit): each unit adds 1 to at
    # most m tuples. Then per tuple: dp_n long, the number of distinct units.
    pairs = per_unit.select(*[F.col(f"{CELL}.{n}").alias(n) for n in names], column_ref(unit)).distinct()
    counts = pairs.groupBy(*names).agg(F.count(F.lit(1)).cast("bigint").alias("dp_n"))
    out_schema = T.StructType([T.StructField(n, T.StringType(), False) for n in names]
                              + [T.StructField(SEL, T.LongType(), False)])

    def _noisy(batches):
        import pandas as pd

        for pdf in batches:
            noisy = keep_over_threshold(pdf["dp_n"].tolist(), scale, threshold, mechanism=mechanism)
            keep = [v is not None for v in noisy]
            out = pdf.loc[keep, names].copy()
            out[SEL] = pd.Series([v for v in noisy if v is not None], index=out.index, dtype="int64")
            yield out

    selected = (counts.mapInPandas(_noisy, out_schema)
                .orderBy(F.col(SEL).desc(), *[F.col(n).asc() for n in names])
                .limit(sel.max_tuples))
    cond = [F.col(f"{CELL}.{n}") == F.col(n) for n in names]
    # schema: dp_cell struct, partial longs..., k0.. string, dp_sel long
    return partials.join(F.broadcast(selected), on=cond, how="inner").drop(*names)


def collect_query_partials(df: DataFrame, plan):
    """{cell index: {partial: int}} for the cells present in the data (absent cells are zeros
    for the noise step): a :class:`~dp_spark.statistics.plan.PartialColumns`, streamed in
    bounded batches (:func:`stream_partial_columns`).

    With private keys: ``(partials, tuples)``, ``tuples`` the key tuples of the published cells
    (in ``group_by`` order: the public key tuples x the selected private tuples) and the
    partials indexed into it."""
    spec = plan.spec
    n = spec.cells * len(spec.windows)  # with windows: the expanded (key tuple, window) cells
    if spec.private_key_sets:
        return _collect_private(df, plan)
    got = stream_partial_columns(df.where((F.col(CELL) >= 0) & (F.col(CELL) < n)), n)
    return split_windows(spec, got) if spec.windowed else got


#: rows of partials turned into numpy vectors at a time on the driver (the stream's bound)
STREAM_BATCH = 65_536
#: partials of at most this many values (rows x columns) come to the driver in ONE Spark job as
#: Arrow (at most 128 MiB of int64, well under ``spark.driver.maxResultSize``'s default 1 GiB);
#: larger ones one Spark partition at a time (toLocalIterator: one job per partition)
ARROW_COLLECT_VALUES = 1 << 24


def stream_partial_columns(df: DataFrame, n: int, batch: int = STREAM_BATCH):
    """The partials of at most ``n`` cells as int64 vectors: a
    :class:`~dp_spark.statistics.plan.PartialColumns`. Up to :data:`ARROW_COLLECT_VALUES`
    values, one Spark job collecting Arrow columns (the driver holds what the result holds
    anyway: int64 columns, no Python object per row); beyond, streamed one Spark partition at
    a time (``toLocalIterator``: never one collect of every row) and packed every ``batch``
    rows. More than ``n`` rows, or two rows of one cell, is a SchemaError (no value in the
    text)."""
    import numpy as np

    from dp_spark.statistics.plan import PartialColumns

    names = [c for c in df.columns if c != CELL]
    fields = [CELL] + names
    if n * len(fields) <= ARROW_COLLECT_VALUES:
        table = _arrow_partials(df.select(*fields), fields)
        if table.shape[0] > n:
            raise SchemaError("partials hold more rows than the release has cells")
    else:
        table = _streamed_partials(df.select(*fields), fields, n, batch)
    order = np.argsort(table[:, 0], kind="stable")
    table = table[order]
    if table.shape[0] > 1 and bool(np.any(np.diff(table[:, 0]) == 0)):
        raise SchemaError("partials hold more than one row for a key tuple")
    return PartialColumns(table[:, 0], {name: table[:, j + 1] for j, name in enumerate(names)})


def _arrow_partials(df: DataFrame, fields: list[str]):
    """The rows of ``df`` (long columns ``fields``) as one int64 matrix, collected as Arrow in
    one Spark job (a null is 0, as in the streamed path)."""
    import numpy as np
    import pyarrow as pa

    got = df.toArrow()
    if got.num_rows == 0:
        return np.zeros((0, len(fields)), dtype=np.int64)
    cols = [got.column(f).cast(pa.int64()).fill_null(0).to_numpy() for f in fields]
    return np.column_stack(cols).astype(np.int64, copy=False)


def _streamed_partials(df: DataFrame, fields: list[str], n: int, batch: int):
    """The rows of ``df`` as one int64 matrix, one Spark partition at a time, packed every
    ``batch`` rows; more than ``n`` rows is a SchemaError as soon as the n+1-th arrives."""
    import numpy as np

    chunks: list[np.ndarray] = []
    buf: list[tuple] = []
    seen = 0

    def pack() -> None:
        chunks.append(np.array([tuple(0 if v is None else v for v in r) for r in buf], dtype=np.int64)
                      .reshape(len(buf), len(fields)))
        buf.clear()

    for r in df.toLocalIterator():
        seen += 1
        if seen > n:
            raise SchemaError("partials hold more rows than the release has cells")
        buf.append(tuple(r))
        if len(buf) >= batch:
            pack()
    if buf:
        pack()
    return np.concatenate(chunks) if chunks else np.zeros((0, len(fields)), dtype=np.int64)


def _collect_private(df: DataFrame, plan):
    from dp_spark.config import PrivateKeys
    from dp_spark.statistics.plan import key_tuples
    from dp_spark.statistics.selection import limit_keys

    spec, sel = plan.spec, plan.selection
    n = spec.cells
    rows = df.limit(n + 1).collect()
    if len(rows) > n:
        raise SchemaError("partials hold more rows than the release has cells")
    by_cell: dict[tuple, dict[str, int]] = {}
    noisy: dict[tuple, int] = {}
    k = len(sel.columns)
    for r in rows:
        d = r.asDict()
        cell = d.pop(CELL)
        priv = tuple(cell[f"{PRIV}{j}"] for j in range(k))
        key = (int(cell[PUB]), priv)
        if key in by_cell:
            raise SchemaError("partials hold more than one row for a key tuple")
        noisy[priv] = int(d.pop(SEL))
        by_cell[key] = {c: int(v or 0) for c, v in d.items()}
    chosen = limit_keys([(v, t) for t, v in noisy.items()], sel.max_keys, sel.max_tuples)
    del noisy
    public = key_tuples(spec.public_key_sets)
    order = [isinstance(ks, PrivateKeys) for ks in spec.key_sets]
    tuples: list[tuple[str, ...]] = []
    partials: dict[int, dict[str, int]] = {}
    for p_idx, pub in enumerate(public):
        for priv in chosen:
            pi, vi = iter(pub), iter(priv)
            tuples.append(tuple(next(vi) if is_private else next(pi) for is_private in order))
            got = by_cell.get((p_idx, priv))
            if got is not None:
                partials[len(tuples) - 1] = got
    return partials, tuples


# --- executor-side noise (large releases of public keys) -----------------------------------------
#: the cell fields of ``QueryPlan.noise`` that the executors return (the release's common fields,
#: the key map and ``created_at`` are added by the caller as literals / from the key columns)
NOISY_CELL_FIELDS = (("statistic", T.StringType()), ("key", T.StringType()), ("value", T.DoubleType()),
                     ("ci_low", T.DoubleType()), ("ci_high", T.DoubleType()), ("mechanism", T.StringType()),
                     ("noise_scale", T.DoubleType()), ("noise_stddev", T.DoubleType()), ("grid", T.DoubleType()),
                     ("expected_abs_error", T.DoubleType()), ("band_low", T.DoubleType()),
                     ("band_high", T.DoubleType()))
#: the key columns of a noisy cell frame: ``dp_key_0``.. (one per group-by column, in order)
NOISY_KEY_PREFIX = "dp_key_"


def executor_noise_supported(spec) -> bool:
    """Whether :func:`noisy_release_frame` can noise ``spec``: public keys only (the grid is the
    declared cross product), no rolling windows, no ``min_group_size`` (its merge crosses keys)."""
    return not spec.private_key_sets and not spec.windowed and spec.min_group_size is None


def noisy_release_frame(df: DataFrame, plan, source, batch: int = STREAM_BATCH) -> DataFrame:
    """The release's noisy cells, computed on the executors: one row per (statistic, key
    tuple) of the whole data-independent grid (every declared key tuple, present in the data or
    not), ``NOISY_CELL_FIELDS`` plus the key columns ``dp_key_<j>``. Nothing comes back to the
    driver: the caller writes the frame (one Delta commit).

    ``df``: the partials (``dp_cell`` and the partial longs, as for :func:`collect_query_partials`).
    The grid's cell indices (``range(cells)``) are joined with them and partitioned by slices of
    ``batch`` consecutive cells, sorted; each Arrow batch of a partition (``mapInArrow``) runs
    :meth:`~dp_spark.statistics.plan.QueryPlan.noise` -- the same code, the same exact samplers
    and grids and the same post-processing as the driver path -- with
    ``source.for_batch(first cell)`` (OpenDP's sampler on the executor's OS CSPRNG; a seeded
    test source derives one stream per Arrow batch -- disjoint runs of cells, so distinct first
    cells -- and a seeded release is reproducible). The true
    partials exist only inside the task; only noisy values leave it. A retried task draws
    again, and only the attempt Spark commits reaches the table."""
    import numpy as np

    spec = plan.spec
    if not executor_noise_supported(spec):
        raise ConfigError(f"{spec.source}: executor-side noise needs public keys, no windows and no min_group_size")
    n = spec.cells
    names = [c for c in df.columns if c != CELL]
    present = "dp_present"
    grid = df.sparkSession.range(0, n, 1, max(1, -(-n // batch))).withColumnRenamed("id", CELL)
    parts = df.where((F.col(CELL) >= 0) & (F.col(CELL) < n)).withColumn(present, F.lit(True))
    # absent cells and null partials are 0 (as the driver's stream reads them), so the
    # columns stay exact int64 in pandas (a null would turn them into float64)
    joined = (grid.join(parts, on=CELL, how="left")
              .select(CELL, F.coalesce(F.col(present), F.lit(False)).alias(present),
                      *[F.coalesce(F.col(c), F.lit(0)).cast("bigint").alias(c) for c in names])
              # slices of ``batch`` consecutive cells, hashed to partitions (no sampling job, as a
              # range partitioning would run over the whole aggregation), sorted inside each
              .repartition(max(1, -(-n // batch)), F.floor(F.col(CELL) / F.lit(batch)))
              .sortWithinPartitions(CELL))
    key_sets = spec.key_sets
    k = len(key_sets)
    out_schema = T.StructType([T.StructField(f, t, True) for f, t in NOISY_CELL_FIELDS]
                              + [T.StructField(f"{NOISY_KEY_PREFIX}{j}", T.StringType(), True) for j in range(k)])
    import pyarrow as pa

    arrow = {T.StringType(): pa.string(), T.DoubleType(): pa.float64()}
    arrow_schema = pa.schema([pa.field(f.name, arrow[f.dataType]) for f in out_schema.fields])

    def _noise(batches):
        from dp_spark.statistics.cells import CellBlock, CellColumns
        from dp_spark.statistics.plan import PartialColumns, key_tuples_at

        for rb in batches:
            if not rb.num_rows:
                continue
            cells = rb.column(CELL).to_numpy()
            have = rb.column(present).to_numpy(zero_copy_only=False).astype(bool)
            pos = np.flatnonzero(have).astype(np.int64)
            partials = PartialColumns(pos, {c: rb.column(c).to_numpy()[have] for c in names})
            tuples = key_tuples_at(key_sets, cells.tolist())
            noisy = plan.noise_columns(partials, source.for_batch(int(cells[0])), tuples, grid_cells=n)
            del partials, tuples
            # the key columns ``dp_key_<j>`` beside the noisy fields: no Python object per cell
            keyed = CellColumns(tuple(
                CellBlock(blk.size, {**blk.fields, **{f"{NOISY_KEY_PREFIX}{j}": (blk.key_values or {})[ks.column]
                                                       for j, ks in enumerate(key_sets)}}, blk.key_values)
                for blk in noisy.blocks))
            yield from keyed.record_batches(arrow_schema)

    return joined.mapInArrow(_noise, out_schema)
