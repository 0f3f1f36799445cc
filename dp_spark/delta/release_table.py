"""Delta release tables: schema, atomic insert-if-absent by release id, reads, snapshots.

One Delta table per release family under the env's output root. A release is written by one
Delta *idempotent append* (one commit) keyed by its release id (``txnAppId`` =
``dp_spark_release:<release id>``, ``txnVersion`` = 1): Delta records the key in the commit,
skips any later append carrying it and fails a concurrent one (``DELTA_CONCURRENT_TRANSACTION``,
``ConcurrentTransactionException``), so at most one write of
a release id ever lands and a rerun, a retry or a second writer adds nothing. Which writer's
cells landed is decided by the engine from the ledger (see ``Engine.publish``) or, on the
rare paths where the ledger cannot tell, by reading the cells back (:func:`same_cells`).

Delta is used through its public API only: the DataFrame reader and writer (with Delta's
``txnAppId``/``txnVersion`` and ``versionAsOf`` options) and SQL (``DESCRIBE DETAIL``,
``DESCRIBE HISTORY``, ``ALTER TABLE``, ``CREATE TABLE``). Nothing reaches Delta's JVM
classes, so the same code runs on a classic session, on Spark Connect and on a Databricks
Runtime (whose Delta classes are not the open-source ones).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Optional

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dp_spark.errors import OutputSchemaError, SchemaError
from dp_spark.statistics.cells import CellColumns

RELEASE_SCHEMA = T.StructType(
    [
        T.StructField("release_id", T.StringType(), False),
        T.StructField("release_family", T.StringType(), False),
        T.StructField("release_name", T.StringType(), False),
        T.StructField("spec_version", T.StringType(), False),
        T.StructField("mode", T.StringType(), False),  # official | exploration
        T.StructField("statistic", T.StringType(), False),  # count | distinct_units | sum | mean
        T.StructField("key_column", T.StringType(), True),
        T.StructField("key", T.StringType(), False),  # canonical: the key; "__all__"; a JSON array for tuples
        T.StructField("keys", T.MapType(T.StringType(), T.StringType()), True),  # {key column: key}
        T.StructField("value", T.DoubleType(), False),
        T.StructField("ci_low", T.DoubleType(), False),
        T.StructField("ci_high", T.DoubleType(), False),
        T.StructField("confidence", T.DoubleType(), False),
        T.StructField("expected_abs_error", T.DoubleType(), False),
        T.StructField("mechanism", T.StringType(), False),
        T.StructField("noise_scale", T.DoubleType(), False),  # real units
        T.StructField("noise_stddev", T.DoubleType(), False),  # real units
        T.StructField("grid", T.DoubleType(), False),  # outputs of the noisy statistic are multiples of this
        T.StructField("charge_json", T.StringType(), False),
        T.StructField("charge_epsilon", T.DoubleType(), True),
        T.StructField("charge_rho", T.DoubleType(), True),
        # the delta the release's charge spends (private key selection); null for a charge
        # without delta and in rows written before the column existed
        T.StructField("charge_delta", T.DoubleType(), True),
        T.StructField("statement_epsilon", T.DoubleType(), True),
        T.StructField("statement_delta", T.DoubleType(), True),
        T.StructField("budget_id", T.StringType(), False),
        T.StructField("bounds_json", T.StringType(), False),
        T.StructField("privacy_unit", T.StringType(), False),
        T.StructField("unit_column", T.StringType(), False),
        T.StructField("neighbouring", T.StringType(), False),
        T.StructField("parallel_composition", T.BooleanType(), False),
        T.StructField("suppressed", T.BooleanType(), False),
        T.StructField("input_table_id", T.StringType(), False),
        T.StructField("input_version", T.LongType(), False),
        T.StructField("code_version", T.StringType(), False),
        T.StructField("created_at", T.TimestampType(), False),
        # confidence {simultaneous: true}: the cell's band (all cells of a statistic of the
        # release inside their bands together with probability >= confidence); null otherwise
        # and in rows written before the columns existed
        T.StructField("band_low", T.DoubleType(), True),
        T.StructField("band_high", T.DoubleType(), True),
    ]
)

# nullable columns added to RELEASE_SCHEMA after tables were written: name -> type, as in
# the schema (simpleString) and in SQL (ALTER TABLE ... ADD COLUMNS)
_ADDED_COLUMNS = {"keys": "map<string,string>", "charge_delta": "double", "band_low": "double",
                  "band_high": "double"}
_ADDED_SQL = {"keys": "MAP<STRING, STRING>", "charge_delta": "DOUBLE", "band_low": "DOUBLE", "band_high": "DOUBLE"}


@dataclass(frozen=True)
class Snapshot:
    """A pinned input: the Delta table's own id and the version read."""

    location: str
    table_id: str
    version: int

    def reader(self, spark: SparkSession) -> DataFrame:
        r = spark.read.format("delta").option("versionAsOf", self.version)
        return r.load(self.location) if _is_path(self.location) else r.table(self.location)


def _is_path(location: str) -> bool:
    return "/" in location or "://" in location


def _sql_ref(location: str) -> str:
    if _is_path(location):
        return "delta.`" + location.replace("`", "``") + "`"
    return location


def prepare_release_write(spark: SparkSession, path: str) -> None:
    """Resolve the state of the release table's latest Delta snapshot now (``DESCRIBE DETAIL``:
    its files and recorded write keys, a few small Spark jobs on a new snapshot), so that the
    idempotent append of :func:`write_release`, which looks its key up in that state, finds it
    computed; the engine runs it while the executors aggregate. Delta keeps the state with the
    snapshot while no commit lands (after one, the append computes it as it would have anyway).
    Only warms a cache: a no-op where there is no table, and it never raises."""
    warm_tables(spark, (path,))


def warm_tables(spark: SparkSession, paths) -> None:
    """:func:`prepare_release_write` for several tables (any commit to them, an idempotent
    append or an overwrite, then starts from the computed state). Never raises."""
    for p in paths:
        try:
            spark.sql(f"DESCRIBE DETAIL {_sql_ref(p)}").collect()
        except Exception:
            pass


def pin_snapshot(spark: SparkSession, location: str) -> Snapshot:
    """The table's id (``DESCRIBE DETAIL``) and current version (``DESCRIBE HISTORY ... LIMIT
    1``): metadata only, no data read."""
    try:
        detail = next(iter(spark.sql(f"DESCRIBE DETAIL {_sql_ref(location)}").collect()), None)
        hist = next(iter(spark.sql(f"DESCRIBE HISTORY {_sql_ref(location)} LIMIT 1").collect()), None)
    except Exception as exc:  # AnalysisException and friends: name the location, no data
        raise SchemaError(f"input '{location}' is not a readable Delta table ({type(exc).__name__})") from None
    if detail is None or detail["format"] != "delta" or hist is None:
        raise SchemaError(f"input '{location}' is not a Delta table")
    return Snapshot(location=location, table_id=str(detail["id"]), version=int(hist["version"]))


def recent_commits(spark: SparkSession, path: str, limit: int) -> list[dict[str, Any]]:
    """The latest ``limit`` commits of the Delta table at ``path`` as ``DESCRIBE HISTORY ...
    LIMIT`` shows them (``version``, ``timestamp``, ``operation``, ``operationMetrics``,
    ``userMetadata``, ...), newest first (fewer when the log holds fewer); [] when there is
    no readable table there. One SQL command; no data is read."""
    try:
        rows = spark.sql(f"DESCRIBE HISTORY {_sql_ref(path)} LIMIT {int(limit)}").collect()
    except Exception:
        return []
    return sorted((r.asDict() for r in rows), key=lambda c: -int(c["version"]))


def latest_commit(spark: SparkSession, path: str) -> Optional[dict[str, Any]]:
    """The latest commit of the Delta table at ``path`` as ``DESCRIBE HISTORY ... LIMIT 1``
    shows it (``version``, ``operation``, ``userMetadata``, ...), or None when there is no
    readable table there. One SQL command; no data is read."""
    got = recent_commits(spark, path, 1)
    return got[0] if got else None


#: Error conditions meaning "there is no table here" (as opposed to "a table that cannot be read").
_NO_TABLE_CONDITIONS = frozenset({
    "PATH_NOT_FOUND", "DELTA_TABLE_NOT_FOUND", "DELTA_MISSING_DELTA_TABLE", "DELTA_PATH_DOES_NOT_EXIST",
    "TABLE_OR_VIEW_NOT_FOUND", "DELTA_TABLE_NOT_FOUND_STREAMING",
})
_CONDITION_RE = re.compile(r"\[([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)\]")


def _condition(exc: BaseException) -> Optional[str]:
    """The error condition of a Spark/Delta exception (``PATH_NOT_FOUND``, ...) or None: the
    exception's own (Spark Connect, captured AnalysisException), else the first ``[NAME]`` of
    its text (a Py4J error carries the JVM message)."""
    for getter in ("getCondition", "getErrorClass"):
        try:
            cond = getattr(exc, getter)()
        except Exception:
            cond = None
        if cond:
            return str(cond)
    m = _CONDITION_RE.search(str(exc)[:4000])
    return m.group(1) if m else None


class UnreadableTableError(OutputSchemaError):
    """A Delta table exists at a location but cannot be read (a damaged or truncated
    transaction log, unreadable files, no permission). Never "no table": nothing is created
    or healed over it. The message names the location and the error condition, never data."""


def _unreadable(location: str, exc: BaseException) -> UnreadableTableError:
    cond = _condition(exc) or type(exc).__name__
    return UnreadableTableError(
        f"Delta table '{location}' exists but cannot be read ({cond}): its transaction log may be "
        "damaged. Nothing was read or written; restore the table (or its _delta_log) from a backup, "
        "or move it aside, then rerun"
    )


def delta_schema(spark: SparkSession, location: str) -> Optional[T.StructType]:
    """The schema of the Delta table at ``location``; None when there is **no table** there
    (the path does not exist, holds no Delta log with a commit, or the catalog has no such
    table; a catalog table in another format also counts as none).

    Raises :class:`UnreadableTableError` (an ``OutputSchemaError``) when a table exists but
    cannot be read: a garbled, truncated or partly deleted ``_delta_log``, unreadable files.
    Such a table is never taken for an absent one (a cache hit would serve 0 cells, a crash
    after the write would not be healed, a new table could be created over it).

    For a path this resolves the table's (cached) Delta log without running a Spark job
    (milliseconds); a catalog name is checked with ``DESCRIBE DETAIL``.
    """
    try:
        if _is_path(location):
            return spark.read.format("delta").load(location).schema
        if spark.sql(f"DESCRIBE DETAIL {_sql_ref(location)}").select("format").first()["format"] != "delta":
            return None
        return spark.read.table(location).schema
    except Exception as exc:
        if _condition(exc) in _NO_TABLE_CONDITIONS:
            return None
        raise _unreadable(location, exc) from None


def table_exists(spark: SparkSession, path: str) -> bool:
    return delta_schema(spark, path) is not None


def check_release_table(spark: SparkSession, path: str) -> Optional[str]:
    """Refuse (``OutputSchemaError``) an existing table at ``path`` that a release cannot be
    written into. Creates and changes nothing: ``"absent"`` (no table yet), ``"needs_keys"``
    (a table written before the ``keys`` column existed), ``"needs_columns"`` (a table
    written before some of the nullable columns added since existed: ``keys``,
    ``charge_delta``, ``band_low``, ``band_high``) or ``"ok"``."""
    existing = delta_schema(spark, path)
    if existing is None:
        return "absent"
    want = {(f.name, f.dataType.simpleString()) for f in RELEASE_SCHEMA.fields}
    have = {(f.name, f.dataType.simpleString()) for f in existing.fields}
    if want - have == {("keys", "map<string,string>")} and not have - want:
        return "needs_keys"
    if want - have and want - have <= set(_ADDED_COLUMNS.items()) and not have - want:
        return "needs_columns"
    if want != have:
        missing = sorted(n for n, _ in want - have)
        raise OutputSchemaError(
            f"output table '{path}' exists with another schema (differs in: {missing[:5]}); "
            "choose another output_root or migrate the table"
        )
    return "ok"


#: A new release table collects Delta's file statistics (min, max, nulls) for its first column
#: only, the release id: every read of the engine (a release, a release's presence, the statement's
#: summaries of the releases added) selects by release id, and the statistics of the other 31
#: columns Delta would index by default cost a quarter of a 100k-cell write (docs/performance.md).
#: Tables made before keep their setting; ``ALTER TABLE ... SET TBLPROPERTIES`` changes it.
STATS_COLUMNS_PROPERTY, STATS_COLUMNS = "delta.dataSkippingNumIndexedCols", "1"


def ensure_release_table(spark: SparkSession, path: str) -> None:
    """Create the family's table if absent (its file statistics on the release id only:
    :data:`STATS_COLUMNS`); refuse an existing table with another schema.

    The engine calls it once the release's charge is reserved, so a refused release (budget
    included) creates no table; it calls :func:`check_release_table` while validating, so a
    schema clash is refused before any charge.
    """
    state = check_release_table(spark, path)
    if state in ("needs_keys", "needs_columns"):
        # a table written before the ``keys`` / ``charge_delta`` columns existed: add the
        # missing ones (metadata only; its old rows read them as null)
        have = {f.name for f in delta_schema(spark, path).fields}
        missing = [f"{name} {_ADDED_SQL[name]}" for name in _ADDED_COLUMNS if name not in have]
        spark.sql(f"ALTER TABLE {_sql_ref(path)} ADD COLUMNS ({', '.join(missing)})")
        return
    if state == "ok":
        return
    empty = spark.createDataFrame([], RELEASE_SCHEMA)
    try:
        (empty.write.format("delta").mode("ignore")
         .option(STATS_COLUMNS_PROPERTY, STATS_COLUMNS).save(path))
    except Exception:
        # A concurrent run created it first: fine if the schema matches.
        if not table_exists(spark, path):
            raise
        ensure_release_table(spark, path)


class ConcurrentReleaseWrite(Exception):
    """A concurrent write of the same release id committed first (Delta refused ours)."""


def _arrow_type(dtype: T.DataType):
    import pyarrow as pa

    if isinstance(dtype, T.MapType):
        return pa.map_(pa.string(), pa.string())
    if isinstance(dtype, T.TimestampType):  # an instant (a naive time is local, as Spark reads a row's)
        return pa.timestamp("us", tz="UTC")
    return {T.StringType(): pa.string(), T.DoubleType(): pa.float64(), T.LongType(): pa.int64(),
            T.BooleanType(): pa.bool_()}[dtype]


def release_arrow_schema():
    """:data:`RELEASE_SCHEMA` as an Arrow schema (``created_at`` a UTC instant)."""
    import pyarrow as pa

    return pa.schema([pa.field(f.name, _arrow_type(f.dataType), f.nullable) for f in RELEASE_SCHEMA.fields])


def _release_columns(rows) -> CellColumns:
    return rows if isinstance(rows, CellColumns) else CellColumns.from_dicts(rows)


def cells_arrow_table(rows):
    """The release's cells as one Arrow table of :data:`RELEASE_SCHEMA`'s columns and types
    (one column at a time, no per-row schema check; ``created_at`` as a UTC instant): ``rows``
    as :class:`~dp_spark.statistics.cells.CellColumns` (the engine's) or one dict per row."""
    return _release_columns(rows).arrow_table(release_arrow_schema())


def _cells_frame(spark: SparkSession, rows) -> DataFrame:
    """The release's cells as one DataFrame of one partition: the cells are a driver-side list
    (O(cells)), and one file per release keeps the table's file count (and its readers' cost)
    down. Built from an Arrow table of :data:`RELEASE_SCHEMA`'s types, given that schema: no
    column is cast or reordered on the JVM side (a select of 37 casts was ~850 py4j round trips
    per release, a fifth of a daily refresh's). (Tests replace it to hold a write inside its
    Spark job.)"""
    return spark.createDataFrame(cells_arrow_table(rows), RELEASE_SCHEMA).coalesce(1)


def write_release(spark: SparkSession, path: str, rows) -> None:
    """Append the release's cells unless a write of its release id already landed (one commit).
    ``rows``: :class:`~dp_spark.statistics.cells.CellColumns` with the release's common fields
    (``with_common``), or one dict per row.

    The DataFrame writer's idempotent append, keyed by the release id (``txnAppId`` =
    ``dp_spark_release:<id>``, ``txnVersion`` = 1): Delta looks the key up in the snapshot the
    commit is made on and skips the append silently when an earlier append of this release id
    landed (the caller learns which from the ledger or by :func:`same_cells`); the lookup
    records the key as read, so when a concurrent append of this release id commits while
    this one is being written, Delta refuses this commit and :class:`ConcurrentReleaseWrite` is
    raised. Either way at most one write of a release id ever lands. The commit's
    ``userMetadata`` names the release (:func:`release_commit_metadata`); when the session sets
    ``spark.databricks.delta.commitInfo.userMetadata``, that one is recorded instead, as by any write
    (the statement's summaries then read the whole table again).
    """
    rows = _release_columns(rows)
    if not rows:
        raise ValueError("a release has at least one cell")
    ids = rows.distinct("release_id")
    if len(ids) != 1:
        raise ValueError("a release write holds the cells of one release id")
    _append_once(_cells_frame(spark, rows), path, ids.pop())


#: The key of a release commit's ``userMetadata`` (``{"dp_spark_release": <release id>}``): which
#: release a commit of the table added, read back from ``DESCRIBE HISTORY`` by the statement's
#: summaries (:func:`~dp_spark.governance.statement.load_release_summaries`) to read only the
#: releases added since the last statement.
RELEASE_COMMIT_KEY = "dp_spark_release"
_SESSION_USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


def release_commit_metadata(release_id: str) -> str:
    """The ``userMetadata`` of the commit that writes ``release_id``."""
    return json.dumps({RELEASE_COMMIT_KEY: release_id}, sort_keys=True)


def committed_release_id(commit: dict[str, Any]) -> Optional[str]:
    """The release id a commit of ``DESCRIBE HISTORY`` says it wrote (its ``userMetadata``), or None."""
    try:
        meta = json.loads(commit.get("userMetadata") or "null")
    except ValueError:
        return None
    rid = meta.get(RELEASE_COMMIT_KEY) if isinstance(meta, dict) and len(meta) == 1 else None
    return rid if isinstance(rid, str) else None


def _append_once(src: DataFrame, path: str, release_id: str) -> None:
    """The one idempotent append of a release (see :func:`write_release`), its commit's
    ``userMetadata`` naming the release (:func:`release_commit_metadata`) unless the session
    sets one (``spark.databricks.delta.commitInfo.userMetadata``: that one is recorded)."""
    app_id = f"dp_spark_release:{release_id}"
    w = src.write.format("delta").mode("append").option("txnAppId", app_id).option("txnVersion", 1)
    if not src.sparkSession.conf.get(_SESSION_USER_METADATA, None):
        w = w.option("userMetadata", release_commit_metadata(release_id))
    try:
        w.save(path)
    except Exception as exc:
        if _is_concurrent_write(exc):
            raise ConcurrentReleaseWrite() from None
        raise


def write_release_frame(path: str, cells: DataFrame, release_id: str) -> None:
    """:func:`write_release` for cells computed on the executors (executor-side noise): the
    same one Delta commit with the same ``txnAppId``/``txnVersion`` key, from a DataFrame of
    :data:`RELEASE_SCHEMA`'s columns that the driver never collects. The caller builds every
    row with ``release_id``."""
    if [f.name for f in cells.schema.fields] != [f.name for f in RELEASE_SCHEMA.fields]:
        raise ValueError("a release frame has the columns of RELEASE_SCHEMA, in order")
    _append_once(cells, path, release_id)


def _is_concurrent_write(exc: BaseException) -> bool:
    """Delta's optimistic concurrency refused the commit (the class name travels in the text
    on classic sessions, in the error class on Spark Connect); no data is in these texts."""
    text = f"{type(exc).__name__} {str(exc)[:4000]}"
    return "ConcurrentTransaction" in text or "DELTA_CONCURRENT_TRANSACTION" in text


# what Delta says when another writer committed first or changed the table under a commit
# (any ``Concurrent...Exception``, ``DELTA_CONCURRENT_*``, a protocol or metadata change) or
# created the table at the same time (``DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION``)
_CONCURRENT_MARKERS = ("Concurrent", "DELTA_CONCURRENT", "PROTOCOL_CHANGED", "ProtocolChanged",
                       "METADATA_CHANGED", "MetadataChanged", "NON_EMPTY_LOCATION")


def is_concurrent_change(exc: BaseException) -> bool:
    """Whether ``exc`` says a Delta commit lost to another writer: a concurrent commit
    (``ConcurrentAppendException``, ``DELTA_CONCURRENT_*`` ...), a protocol or metadata change
    made meanwhile (``PROTOCOL_CHANGED``, ``METADATA_CHANGED``), or a table created at the same
    time (``NON_EMPTY_LOCATION``). The caller re-plans on the table's new state instead of
    failing. Looks for these markers in the exception's class name and message (which names
    the Delta exception or error condition); no data is in these texts."""
    text = f"{type(exc).__name__} {exc}"
    return any(marker in text for marker in _CONCURRENT_MARKERS)


_CELL_FIELDS = ("statistic", "key", "value", "ci_low", "ci_high", "band_low", "band_high")


def same_cells(stored: list[dict[str, Any]], rows) -> bool:
    """True when the stored cells publish exactly the numbers of ``rows`` (same statistics,
    keys, values, intervals and bands; dicts or :class:`~dp_spark.statistics.cells.CellColumns`).
    Then showing ``rows`` shows nothing that is not published; otherwise another writer's draw
    is the release and ``rows`` must never be shown."""
    if isinstance(rows, CellColumns):
        rows = rows.dicts(_CELL_FIELDS)

    def same(x):  # a suppressed cell's NaN equals NaN here; no band is None
        if x is None:
            return ("none",)
        return ("nan",) if isinstance(x, float) and math.isnan(x) else ("v", x)

    def cells(rs):
        return sorted(tuple(same(r.get(f)) for f in _CELL_FIELDS) for r in rs)  # no band: None

    return len(stored) == len(rows) and cells(stored) == cells(rows)


def _read(path: str, action):
    """Run a read of the release table; a failure is an :class:`UnreadableTableError` naming
    the path (the table's schema resolved, e.g. from a checksum file, but its log or files do
    not read), never an empty answer."""
    try:
        return action()
    except Exception as exc:
        raise _unreadable(path, exc) from None


def read_release(spark: SparkSession, path: str, release_id: str) -> list[dict[str, Any]]:
    """The cells of one release id, ordered by (statistic, key); [] when there are none (or no
    table). UnreadableTableError when the table exists but cannot be read."""
    if delta_schema(spark, path) is None:
        return []
    return _read(path, lambda: [r.asDict() for r in spark.read.format("delta").load(path)
                                .where(F.col("release_id") == release_id).orderBy("statistic", "key").collect()])


def release_present(spark: SparkSession, path: str, release_id: str) -> bool:
    if delta_schema(spark, path) is None:
        return False
    return _read(path, lambda: len(spark.read.format("delta").load(path).where(F.col("release_id") == release_id)
                                   .select("release_id").limit(1).collect()) > 0)


def stream_points(spark: SparkSession, path: str, family: str, mode: str, stream_id: str,
                  release_id: str) -> dict[str, set[str]]:
    """One read for a stream's refresh: release id -> the keys (days) its rows hold, for every
    release of stream ``stream_id`` in the release table (rows of ``family`` in ``mode`` whose
    charge_json names the stream), and for ``release_id`` whatever its rows are (so
    ``release_id in stream_points(...)`` is :func:`release_present`). {} when there is no table.
    Metadata columns only, never values. No ``distinct``: a stream's rows are at most a row per
    statistic for each point of its horizon (``MAX_HORIZON_DAYS``) plus each release's own last
    day, and the plain scan saves the distinct's shuffle. The engine asks once, before the
    point's charge and aggregation, both whether the point is written and which days its
    stream's releases wrote (it writes only the others): one Spark job where there were two."""
    if delta_schema(spark, path) is None:
        return {}

    def points():
        in_stream = ((F.col("release_family") == family) & (F.col("mode") == mode)
                     & (F.get_json_object(F.col("charge_json"), "$.stream.stream_id") == F.lit(stream_id)))
        out: dict[str, set[str]] = {}
        for r in (spark.read.format("delta").load(path).where(in_stream | (F.col("release_id") == release_id))
                  .select("release_id", "key").collect()):
            out.setdefault(r["release_id"], set()).add(r["key"])
        return out

    return _read(path, points)


def latest_release_id(spark: SparkSession, path: str, family: str, exclude: Optional[str] = None) -> Optional[str]:
    if delta_schema(spark, path) is None:
        return None

    def latest():
        df = spark.read.format("delta").load(path).where(F.col("release_family") == family)
        if exclude:
            df = df.where(F.col("release_id") != exclude)
        return df.groupBy("release_id").agg(F.max("created_at").alias("t")).orderBy(F.col("t").desc()).first()

    row = _read(path, latest)
    return None if row is None else row["release_id"]
