"""Delta release tables: schema, atomic insert-if-absent by release id, reads, snapshots.

One Delta table per release family under the env's output root. A release is written by one
Delta *idempotent append* (one commit) keyed by its release id (``txnAppId`` =
``dp_spark_release:<release id>``, ``txnVersion`` = 1): Delta records the key in the commit,
skips any later append carrying it and fails a concurrent one (``DELTA_CONCURRENT_TRANSACTION``,
``ConcurrentTransactionException``), so at most one write of
a release id ever lands and a rerun, a retry or a second writer adds nothing. Which writer's
cells landed is decided by the engine from the ledger (see ``Engine.publish``) or, on the
rare paths where the ledger cannot tell, by reading the cells back (:func:`same_cells`).

Everything runs through SQL and DataFrame APIs, so it works on Spark Connect. On a classic
session optional *fast paths* reach Delta's log object through the JVM gateway
(``DeltaLog``: a Delta-internal class): :func:`pin_snapshot` reads a path table's version and
id from it (milliseconds instead of two SQL commands), :func:`prepare_release_write` and
:func:`warm_tables` resolve a table's state ahead of a commit (the engine runs them while the
executors aggregate), and :func:`append_if_unchanged` makes a conditional append through
Delta's transaction (the ledger mirror's). They fall back (the SQL path; a no-op; None: the
DataFrame writer) when the gateway or the class is not there (Spark Connect, another Delta
build); the results are the same either way (tested).
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dp_spark.errors import OutputSchemaError, SchemaError
from dp_spark.spark import is_connect_session

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
    ]
)

# nullable columns added to RELEASE_SCHEMA after tables were written: name -> type, as in
# the schema (simpleString) and in SQL (ALTER TABLE ... ADD COLUMNS)
_ADDED_COLUMNS = {"keys": "map<string,string>", "charge_delta": "double"}
_ADDED_SQL = {"keys": "MAP<STRING, STRING>", "charge_delta": "DOUBLE"}


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


def _delta_log(spark: SparkSession, path: str):
    """Delta's ``DeltaLog`` of the path table ``path`` through the JVM gateway (an internal
    Delta API: the fast paths of this module and :mod:`dp_spark.release.delta_commits`).
    Raises where it is not there; callers check for Spark Connect first."""
    return spark._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)


def _jvm_snapshot(spark: SparkSession, path: str):
    """The latest snapshot of Delta's ``DeltaLog`` of ``path``, reached through the JVM
    gateway, or None (Spark Connect, no such class, any failure). Internal Delta API: used
    only for the fast paths of this module."""
    if is_connect_session(spark):
        return None  # a Connect session has no JVM gateway: never touch its classic attributes
    try:
        jvm = spark._jvm
        if jvm is None:
            return None
        empty = jvm.scala.Option.empty()
        return _delta_log(spark, path).update(False, empty, empty)  # the latest version, not a cached one
    except Exception:
        return None


def _fast_snapshot(spark: SparkSession, location: str) -> Optional[Snapshot]:
    """Version and id of a path table from its Delta log object, or None (use SQL)."""
    if not _is_path(location):
        return None
    snap = _jvm_snapshot(spark, location)
    if snap is None:
        return None
    try:
        version = int(snap.version())
        table_id = str(snap.metadata().id())
    except Exception:
        return None
    if version < 0 or not table_id:  # no Delta table there: the SQL path names the error
        return None
    return Snapshot(location=location, table_id=table_id, version=version)


def prepare_release_write(spark: SparkSession, path: str) -> None:
    """Resolve the release table's recorded write keys (its Delta ``SetTransaction`` state) now,
    so that :func:`write_release` finds them cached; a no-op where the fast path is not
    available. Never raises: it only warms a cache, and a table committed to in between is
    simply resolved again by the write (see :func:`warm_tables`)."""
    warm_tables(spark, (path,))


def warm_tables(spark: SparkSession, paths) -> None:
    """Reconstruct the state of each existing Delta table's latest snapshot now (its files, its
    ``SetTransaction`` keys: one small set of Spark jobs per table), so that the next commit to
    it, an idempotent append or a MERGE, does not pay for it on its critical path. Delta keeps
    the state with the snapshot: it is reused while no commit lands in between (after one, the
    commit pays as it would have anyway). A no-op without the fast path (Spark Connect);
    never raises."""
    for p in paths:
        snap = _jvm_snapshot(spark, p)
        if snap is None:
            continue
        try:
            if int(snap.version()) >= 0:
                snap.transactions()
        except Exception:
            pass


def _write_operation(jvm, user_metadata: Optional[str], *, overwrite_where: Optional[str] = None):
    """Delta's ``WRITE`` operation carrying ``user_metadata`` (None: none): an append, or with
    ``overwrite_where`` an overwrite of the rows that predicate selects (what the DataFrame
    writer's ``replaceWhere`` records). Built through the companion's default arguments (their
    number differs between Delta releases); checked after construction, so another argument
    layout is refused (raises) rather than guessed."""
    companion = getattr(getattr(jvm.org.apache.spark.sql.delta, "DeltaOperations$Write$"), "MODULE$")
    arity = max(m.getParameterCount() for m in companion.getClass().getMethods()
                if m.getName() == "apply" and m.getParameterCount() > 1
                and m.getParameterTypes()[0].getName() == "org.apache.spark.sql.SaveMode")
    modes = jvm.org.apache.spark.sql.SaveMode
    mode = modes.Append if overwrite_where is None else modes.Overwrite
    args = [mode]
    args += [getattr(companion, f"$lessinit$greater$default${i}")() for i in range(2, arity + 1)]
    # (mode, partitionBy, predicate, userMetadata, ...)
    if overwrite_where is not None:
        args[2] = jvm.scala.Some(overwrite_where)
    if user_metadata is not None:
        args[3] = jvm.scala.Some(user_metadata)
    op = companion.apply(*args)

    def get(option):
        return option.get() if option.isDefined() else None

    if get(op.userMetadata()) != user_metadata or get(op.predicate()) != overwrite_where or op.mode() != mode:
        raise TypeError("unexpected DeltaOperations.Write layout")
    return op


def _start_transaction(spark: SparkSession, path: str):
    """``(jvm, transaction)``: one commit to the existing Delta table at ``path`` through
    Delta's ``OptimisticTransaction`` (its snapshot is read now), or None when that path is not
    available (Spark Connect, a catalog table's name, no table). Raises on a gateway error (the
    callers fall back)."""
    if is_connect_session(spark) or not _is_path(path):
        return None
    txn = _delta_log(spark, path).startTransaction()
    return None if int(txn.snapshot().version()) < 0 else (spark._jvm, txn)


def _write_key(jvm, app_id: str, version: int):
    """The ``SetTransaction`` action the DataFrame writer's ``txnAppId``/``txnVersion`` record."""
    now = jvm.scala.Some(int(time.time() * 1000))
    return jvm.org.apache.spark.sql.delta.actions.SetTransaction(app_id, version, now)


def _commit_files(txn, df: DataFrame, op, extra_actions=(), before_commit=None) -> int:
    """Write ``df``'s files in ``txn`` and commit them with ``extra_actions`` as ``op``; the
    version committed. ``before_commit``: a test hook run between the files and the commit."""
    actions = txn.writeFiles(df._jdf)
    for action in extra_actions:
        actions = actions.appended(action)
    if before_commit is not None:
        before_commit()
    return int(txn.commit(actions, op))


def _in_table_types(txn, df: DataFrame) -> Optional[DataFrame]:
    """``df`` with the transaction's table's nullability (a NOT NULL column refuses a nullable
    one), or None when its columns or types differ from the table's (the DataFrame writer
    checks and reports those)."""
    table = T.StructType.fromJson(json.loads(txn.metadata().schema().json()))
    if [(f.name, f.dataType) for f in table.fields] != [(f.name, f.dataType) for f in df.schema.fields]:
        return None
    return df.to(table)


def append_if_unchanged(spark: SparkSession, path: str, df: DataFrame, *, version: int, app_id: str,
                        user_metadata: str, _before_commit=None) -> Optional[int]:
    """Append ``df`` to the Delta table at ``path`` as ONE commit, only if nothing else commits
    to the table from ``version`` on; without reconstructing the table's state (the DataFrame
    writer's idempotent options, ``txnAppId``/``txnVersion``, make Delta 4.4 reconstruct it
    -- three Spark jobs -- just to look the key up).

    Returns the version committed (always >= 1: ``version + 1``, or later if a commit that
    Delta's conflict check let pass landed in between, e.g. a blind append under another
    isolation level: the caller must treat that as a race), 0 when nothing was committed
    because the table is no longer at ``version`` or another write committed first (this
    transaction declares it read the whole table, so Delta's conflict check refuses it), or
    None when this fast path is not available (Spark Connect, another Delta build, columns or
    types that differ from the table's): nothing was written, and the caller uses the
    DataFrame writer. The commit records
    ``user_metadata`` and the key (``app_id``, ``version + 1``) as the DataFrame writer's
    idempotent append would, so both paths recognise each other's writes.

    Internal Delta API (``OptimisticTransaction``) reached through the JVM gateway. Any error
    after the data files are written is raised (a commit may have landed); ``_before_commit``
    is a test hook run between writing the files and committing them."""
    if version < 0:
        return None  # (no table: the DataFrame writer creates it)
    try:
        started = _start_transaction(spark, path)
        if started is None:
            return None
        jvm, txn = started
        if int(txn.snapshot().version()) != version:
            return 0
        df = _in_table_types(txn, df)
        if df is None:
            return None
        op = _write_operation(jvm, user_metadata)
        key = _write_key(jvm, app_id, version + 1)
        txn.readWholeTable()  # a concurrent non-blind commit conflicts with this one
    except Exception:
        return None
    try:
        return _commit_files(txn, df, op, (key,), _before_commit)
    except Exception as exc:
        if is_concurrent_change(exc):
            return 0
        raise


# printable ASCII: where Python's string order, UTF-8 byte order (Spark's) and Delta's bounds agree
_PLAIN = re.compile(r"[\x20-\x7e]*")


def _string_bounds(add_file, column: str) -> Optional[tuple[str, str]]:
    """A data file's (min, max) of string ``column`` from its Delta statistics, or None when
    it has none (Delta truncates long strings' bounds, keeping them bounds)."""
    stats = add_file.stats()
    if stats is None:
        return None
    parsed = json.loads(stats)
    lo, hi = parsed.get("minValues", {}).get(column), parsed.get("maxValues", {}).get(column)
    return (lo, hi) if isinstance(lo, str) and isinstance(hi, str) else None


def replace_rows_if_unchanged(spark: SparkSession, path: str, df: DataFrame, *, identity: tuple[str, int],
                              column: str, value: str, user_metadata: Optional[str] = None,
                              _before_commit=None) -> Optional[int]:
    """Replace every row of the Delta table at ``path`` whose string ``column`` is ``value`` by
    ``df``'s rows (the caller's new state of exactly those rows), as ONE commit through Delta's
    transaction, without reading or rewriting any other row: only when the table is still at
    ``identity`` (table id, version) and every data file that may hold ``value`` holds nothing
    else (its statistics' bounds of ``column`` are both ``value``), so the files can be
    removed whole. ``df`` is written as one new file, which keeps that layout.

    The transaction declares it read the whole table (with the table's isolation level), so
    any concurrent commit that adds or removes files makes it raise Delta's conflict error,
    which the caller retries on the new state. Returns the version committed, or None when
    this path does not apply (Spark Connect, another Delta build, another identity, a
    partitioned or column-mapped table, a file without statistics or holding other values, a
    ``value`` or a file's bounds outside printable ASCII -- Delta truncates a string's bounds
    beyond 32 characters and marks the upper one with a character beyond it --, a ``df`` with
    other columns): nothing was written, and the caller uses a MERGE. Any error after the
    files are written is raised. ``_before_commit``: a test hook."""
    try:
        started = _start_transaction(spark, path)
        if started is None:
            return None
        jvm, txn = started
        snap = txn.snapshot()
        if (str(snap.metadata().id()), int(snap.version())) != tuple(identity):
            return None
        meta = txn.metadata()
        mapping = meta.configuration().get("delta.columnMapping.mode")
        if meta.partitionColumns().nonEmpty() or (mapping.isDefined() and mapping.get() != "none"):
            return None
        df = _in_table_types(txn, df)
        if df is None:
            return None
        if not _PLAIN.fullmatch(value):
            return None
        touched = []
        for f in snap.allFiles().collectAsList():  # the snapshot's files (its state, warmed ahead)
            bounds = _string_bounds(f, column)
            if bounds is None or not all(_PLAIN.fullmatch(b) for b in bounds):
                return None  # unknown, or bounds outside printable ASCII (e.g. truncated ones)
            if bounds[0] <= value <= bounds[1]:
                if bounds != (value, value):
                    return None  # the file also holds other rows: a MERGE rewrites it
                touched.append(f)
        predicate = f"{column} = '{value}'" if re.fullmatch(r"[A-Za-z0-9_.:-]*", value) else f"{column} = ?"
        op = _write_operation(jvm, user_metadata, overwrite_where=predicate)
        txn.readWholeTable()
    except Exception:
        return None
    now = int(time.time() * 1000)
    removes = [f.removeWithTimestamp(now, True) for f in touched]
    return _commit_files(txn, df.coalesce(1), op, removes, _before_commit)  # one file: the rows of ``value`` only


def pin_snapshot(spark: SparkSession, location: str) -> Snapshot:
    """Read the table's id and current version from its Delta log (metadata only)."""
    fast = _fast_snapshot(spark, location)
    if fast is not None:
        return fast
    return _sql_snapshot(spark, location)


def _sql_snapshot(spark: SparkSession, location: str) -> Snapshot:
    """:func:`pin_snapshot` through SQL (``DESCRIBE DETAIL`` and ``DESCRIBE HISTORY``)."""
    try:
        detail = spark.sql(f"DESCRIBE DETAIL {_sql_ref(location)}").select("id", "format").first()
        hist = spark.sql(f"DESCRIBE HISTORY {_sql_ref(location)} LIMIT 1").select("version").first()
    except Exception as exc:  # AnalysisException and friends: name the location, no data
        raise SchemaError(f"input '{location}' is not a readable Delta table ({type(exc).__name__})") from None
    if detail is None or detail["format"] != "delta" or hist is None:
        raise SchemaError(f"input '{location}' is not a Delta table")
    return Snapshot(location=location, table_id=str(detail["id"]), version=int(hist["version"]))


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


def _delta_schema(spark: SparkSession, location: str) -> Optional[T.StructType]:
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
    return _delta_schema(spark, path) is not None


def check_release_table(spark: SparkSession, path: str) -> Optional[str]:
    """Refuse (``OutputSchemaError``) an existing table at ``path`` that a release cannot be
    written into. Creates and changes nothing: ``"absent"`` (no table yet), ``"needs_keys"``
    (a table written before the ``keys`` column existed), ``"needs_columns"`` (a table
    written before some of the nullable columns added since existed: ``keys``,
    ``charge_delta``) or ``"ok"``."""
    existing = _delta_schema(spark, path)
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


def ensure_release_table(spark: SparkSession, path: str) -> None:
    """Create the family's table if absent; refuse an existing table with another schema.

    Runs before any budget is reserved, so a schema clash charges nothing; the engine calls
    :func:`check_release_table` earlier still, while validating, so a refused release does
    not create the table.
    """
    state = check_release_table(spark, path)
    if state in ("needs_keys", "needs_columns"):
        # a table written before the ``keys`` / ``charge_delta`` columns existed: add the
        # missing ones (metadata only; its old rows read them as null)
        have = {f.name for f in _delta_schema(spark, path).fields}
        missing = [f"{name} {_ADDED_SQL[name]}" for name in _ADDED_COLUMNS if name not in have]
        spark.sql(f"ALTER TABLE {_sql_ref(path)} ADD COLUMNS ({', '.join(missing)})")
        return
    if state == "ok":
        return
    empty = spark.createDataFrame([], RELEASE_SCHEMA)
    try:
        empty.write.format("delta").mode("ignore").save(path)
    except Exception:
        # A concurrent run created it first: fine if the schema matches.
        if not table_exists(spark, path):
            raise
        ensure_release_table(spark, path)


class ConcurrentReleaseWrite(Exception):
    """A concurrent write of the same release id committed first (Delta refused ours)."""


def write_release(spark: SparkSession, path: str, rows: list[dict[str, Any]], *,
                  sole_writer: Optional[Callable[[], bool]] = None, _before_commit=None) -> Optional[bool]:
    """Append the release's cells unless a write of its release id already landed (one commit).

    A Delta idempotent append keyed by the release id: it lands, or it is skipped because an
    earlier append of this release id landed (silently: the caller learns which from the
    ledger or by :func:`same_cells`), or it raises :class:`ConcurrentReleaseWrite` when a
    concurrent append of this release id committed while it was being written. Returns None.

    ``sole_writer``: the caller's proof that no write of this release id has landed yet (the
    engine's: its ledger reservation was fresh and it still owns it; only an owner writes, and
    owners only ever change to a new one). It is asked *after* the commit's snapshot is read;
    if it answers True the append skips the key lookup (which makes Delta 4.4 reconstruct the
    table's state: a few Spark jobs) and commits through Delta's transaction with the same
    key, declaring the key read, so a write of this release id committed after that snapshot
    makes this one fail (:class:`ConcurrentReleaseWrite`) and one committed before it cannot
    exist (``sole_writer``). Then it returns True: these cells landed. On any other answer,
    and wherever that path is not available (Spark Connect, another Delta build, a table with
    other columns), it is the DataFrame writer's idempotent append above. ``_before_commit``:
    a test hook run between writing the files and committing them (transaction path only).
    """
    if not rows:
        raise ValueError("a release has at least one cell")
    ids = {r["release_id"] for r in rows}
    if len(ids) != 1:
        raise ValueError("a release write holds the cells of one release id")
    app_id = f"dp_spark_release:{ids.pop()}"
    # one task, one file per release: the cells are a driver-side list (O(cells)), and a file per
    # release keeps the table's file count (and its readers' cost) down
    src = spark.createDataFrame([tuple(r[f.name] for f in RELEASE_SCHEMA.fields) for r in rows],
                                RELEASE_SCHEMA).coalesce(1)
    if sole_writer is not None and _append_once(spark, path, src, app_id, sole_writer, _before_commit):
        return True
    try:
        (src.write.format("delta").mode("append")
         .option("txnAppId", app_id).option("txnVersion", 1).save(path))
    except Exception as exc:
        if _is_concurrent_write(exc):
            raise ConcurrentReleaseWrite() from None
        raise
    return None


_USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"  # what the DataFrame writer records


def _declare_key_read(txn, app_id: str) -> bool:
    """Record in the transaction that it depends on ``app_id``'s key, as Delta's own key lookup
    (``txnVersion``) does, without looking it up: a concurrent commit carrying that key then
    fails this one (Delta's conflict check). True when the transaction shows it."""
    read = txn.readTxn()
    read.addOne(app_id)
    return bool(read.contains(app_id))


def _append_once(spark: SparkSession, path: str, df: DataFrame, app_id: str,
                 sole_writer: Callable[[], bool], before_commit) -> bool:
    """:func:`write_release`'s transaction path: True when the cells committed; False when the
    path is not available or not proven safe (nothing was written: the caller uses the
    DataFrame writer); raises :class:`ConcurrentReleaseWrite` when a write of the key
    committed first, and any error after the files are written (a commit may have landed)."""
    try:
        started = _start_transaction(spark, path)
        if started is None:
            return False
        jvm, txn = started
        df = _in_table_types(txn, df)
        if df is None:
            return False
        op = _write_operation(jvm, spark.conf.get(_USER_METADATA_CONF, None) or None)
        key = _write_key(jvm, app_id, 1)
        if not _declare_key_read(txn, app_id):
            return False
    except Exception:
        return False
    try:  # asked after the snapshot: a write before it came from an owner before now
        if not sole_writer():
            return False
    except Exception:
        return False  # not proven: the DataFrame writer looks the key up
    try:
        _commit_files(txn, df, op, (key,), before_commit)
        return True
    except Exception as exc:
        if _is_concurrent_write(exc):
            raise ConcurrentReleaseWrite() from None
        if is_concurrent_change(exc):
            return False  # refused before anything committed (another commit changed the table): retried
        raise


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


_CELL_FIELDS = ("statistic", "key", "value", "ci_low", "ci_high")


def same_cells(stored: list[dict[str, Any]], rows: list[dict[str, Any]]) -> bool:
    """True when the stored cells publish exactly the numbers of ``rows`` (same statistics,
    keys, values and intervals). Then showing ``rows`` shows nothing that is not published;
    otherwise another writer's draw is the release and ``rows`` must never be shown."""
    def same(x):  # a suppressed cell's NaN equals NaN here
        return ("nan",) if isinstance(x, float) and math.isnan(x) else ("v", x)

    def cells(rs):
        return sorted(tuple(same(r[f]) for f in _CELL_FIELDS) for r in rs)

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
    if _delta_schema(spark, path) is None:
        return []
    return _read(path, lambda: [r.asDict() for r in spark.read.format("delta").load(path)
                                .where(F.col("release_id") == release_id).orderBy("statistic", "key").collect()])


def release_present(spark: SparkSession, path: str, release_id: str) -> bool:
    if _delta_schema(spark, path) is None:
        return False
    return _read(path, lambda: len(spark.read.format("delta").load(path).where(F.col("release_id") == release_id)
                                   .select("release_id").limit(1).collect()) > 0)


def latest_release_id(spark: SparkSession, path: str, family: str, exclude: Optional[str] = None) -> Optional[str]:
    if _delta_schema(spark, path) is None:
        return None

    def latest():
        df = spark.read.format("delta").load(path).where(F.col("release_family") == family)
        if exclude:
            df = df.where(F.col("release_id") != exclude)
        return df.groupBy("release_id").agg(F.max("created_at").alias("t")).orderBy(F.col("t").desc()).first()

    row = _read(path, latest)
    return None if row is None else row["release_id"]
