"""Versions of a release family, and rollback: rows of the SQL ledger, and their Delta copy.

The version record is state that needs compare-and-set, so it lives in the SQL ledger
(``dp_versions``, see :mod:`dp_spark.ledger.versions`), written in the ledger's write
transactions under the budget lock of the releases' budgets:

    family       release family (the release table's ``release_family``)
    version_no   1, 2, ... per family
    release_id   the release this version points to (one version per release id)
    state        current | superseded | withdrawn
    reason       why it was withdrawn (null otherwise)
    principal    who published it
    at           when it was published (UTC)
    changed_by   who made the last state change (null while current since publication)
    changed_at   when (UTC)
    series_key   the key a version of a series publishes (the day of a day-keyed release
                 refreshed a day at a time); null for a version of the whole family

Invariant: at most one ``current`` version per (family, series key) (a unique index of the
ledger, checked again on every read): a family that is not a series has one current version,
each new one superseding the last; a series keeps every day current, a day superseded only by
a re-publication of that same day. Every state change is one ledger transaction: publishing supersedes the
old current version and inserts the new one together; a rollback withdraws the current version
and restores the previous one together. A crash leaves the old state or the new; two
concurrent changes of a family are serialised by the ledger (a lost compare-and-set is
retried on the new state). Each row is MAC'd like the ledger's other rows.

``<output_root>/_published`` is a derived Delta table with the same columns, for readers in
Spark SQL: :func:`refresh_published` rewrites it from the ledger (a tiny table: one row per
version) in one commit carrying Delta's idempotent-write options (``txnAppId =
dp_spark.published``, ``txnVersion`` = the ledger's count of version changes), so a refresh
planned from an older state than the table's is skipped. The engine refreshes it with the
ledger mirror, in the background; nothing reads it to decide anything. A deployment whose
``_published`` table predates the ledger's version record has it adopted into the ledger once
(:func:`adopt_published`), before the ledger's first version change.

Rollback keeps the history (rows are never deleted) and refunds NO budget: the withdrawn
release was published, so whoever read it holds its privacy loss; the ledger keeps its
charge and the privacy statement lists it under errata. The published view
(:func:`published_view`) serves only the current version's rows. Exploration releases are
never versioned: :func:`published_view` keeps ``mode = official`` rows only.

Only Delta's public API (the DataFrame reader and writer, ``DESCRIBE HISTORY``), so this works
on Spark Connect and Databricks.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from typing import Any, Callable, Optional, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.window import Window

from dp_spark.errors import ConfigError, DpSparkError
from dp_spark.delta.release_table import delta_schema, is_concurrent_change, latest_commit
from dp_spark.governance.series import is_series, series_days

__all__ = [
    "PUBLISHED_SCHEMA",
    "STATES",
    "TXN_APP_ID",
    "VersionInvariantError",
    "adopt_published",
    "record_publication",
    "record_publications",
    "refresh_published",
    "rollback",
    "current_release_id",
    "history",
    "published_view",
    "published_path_for",
    "is_series",
    "register_series_current",
    "series_current_path",
    "series_days",
    "series_view",
    "series_view_name",
    "write_series_current",
]

STATES = ("current", "superseded", "withdrawn")
MAX_REASON = 500
TXN_APP_ID = "dp_spark.published"
_META_KEY = "dp_spark_published"
_ATTEMPTS = 4

PUBLISHED_SCHEMA = T.StructType([
    T.StructField("family", T.StringType(), False),
    T.StructField("version_no", T.LongType(), False),
    T.StructField("release_id", T.StringType(), False),
    T.StructField("state", T.StringType(), False),
    T.StructField("reason", T.StringType(), True),
    T.StructField("principal", T.StringType(), False),
    T.StructField("at", T.TimestampType(), False),
    T.StructField("changed_by", T.StringType(), True),
    T.StructField("changed_at", T.TimestampType(), True),
    T.StructField("series_key", T.StringType(), True),
])
# the columns of a _published table written before versions had series keys (still adopted)
_KEYLESS_FIELDS = [f for f in PUBLISHED_SCHEMA.fields if f.name != "series_key"]


class VersionInvariantError(DpSparkError):
    """A family has more than one current version."""


def published_path_for(output_root: str) -> str:
    """``<output_root>/_published``: the derived versions table beside the release tables."""
    return f"{output_root.rstrip('/')}/_published"


def _now(clock: Optional[Callable[[], datetime]]) -> Optional[datetime]:
    if clock is None:
        return None  # the ledger's clock
    t = clock()
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t


def _text(value: Any, name: str, limit: int = 256) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        raise ConfigError(f"{name} must be a non-empty string of at most {limit} characters")
    return value


def _row(v) -> dict[str, Any]:
    """A ledger ``VersionRecord`` as a row of PUBLISHED_SCHEMA (timestamps aware UTC)."""
    return {"family": v.family, "version_no": v.version_no, "release_id": v.release_id, "state": v.state,
            "reason": v.reason, "principal": v.principal, "at": v.at, "changed_by": v.changed_by,
            "changed_at": v.changed_at, "series_key": v.series_key}


def record_publication(ledger: Any, family: str, release_id: str, principal: str, *,
                       clock: Optional[Callable[[], datetime]] = None, series_key: Optional[str] = None) -> int:
    """Make ``release_id`` the current version of ``family`` (of the key ``series_key`` of
    it: the day of a day-keyed release refreshed a day at a time); return its version number.

    The previous current version (of that key) becomes ``superseded`` in the same ledger
    transaction.
    Idempotent per release id: a release id that already has a version (in any state) changes
    nothing and returns that version number, so a rerun (cache hit) of a withdrawn release does
    not bring it back. Call it only for official releases, after the release write and ledger
    commit.
    """
    return record_publications(ledger, [(family, release_id, series_key)], principal, clock=clock)[0]


def record_publications(ledger: Any, items: Sequence[tuple[str, ...]], principal: str, *,
                        clock: Optional[Callable[[], datetime]] = None) -> list[int]:
    """:func:`record_publication` for several (family, release id[, series key]) items, in
    order, in ONE ledger transaction: a batch job versions all its releases at once. Within a
    family (a key of it), each new release supersedes the one before it, so the last new
    release of each ends up current. Returns the version number of each item."""
    norm = [(_text(it[0], "family", 64), _text(it[1], "release_id", 128),
             None if len(it) < 3 or it[2] is None else _text(it[2], "series_key", 64)) for it in items]
    _text(principal, "principal")
    if not norm:
        return []
    return ledger.record_versions(norm, principal, now=_now(clock))


def rollback(ledger: Any, family: str, principal: str, reason: str, *,
             clock: Optional[Callable[[], datetime]] = None,
             series_key: Optional[str] = None) -> tuple[str, Optional[str]]:
    """Withdraw the current version of ``family`` and restore the latest earlier version
    that was not withdrawn (one ledger transaction). Returns (withdrawn release id, restored
    release id or None when no earlier version remains: the published view is then empty).
    A series: the current version of the day ``series_key`` (default: the latest published
    current version), its day's earlier version restored.

    Keeps the history and refunds no budget (see the module docstring). ``reason`` is
    recorded and shown in the privacy statement's errata: write why, never data values.
    Check the principal's ``rollback`` permission (role admin) and write the audit row in
    the caller.
    """
    _text(family, "family", 64)
    _text(principal, "principal")
    _text(reason, "reason", MAX_REASON)
    if series_key is not None:
        _text(series_key, "series_key", 64)
    return ledger.withdraw_version(family, principal, reason, now=_now(clock), series_key=series_key)


def history(ledger: Any, family: str) -> list[dict[str, Any]]:
    """Every version of the family (rows of PUBLISHED_SCHEMA as dicts), oldest first."""
    rows = [_row(v) for v in ledger.versions(family)]
    current = [(r["series_key"]) for r in rows if r["state"] == "current"]
    if len(current) != len(set(current)):  # (the ledger refuses it too)
        raise VersionInvariantError(f"family {family!r} has several current versions")
    return rows


def current_release_id(ledger: Any, family: str) -> Optional[str]:
    """The release id of the family's current version (of a series: its latest published
    current version), or None."""
    cur = [r for r in history(ledger, family) if r["state"] == "current"]
    return cur[-1]["release_id"] if cur else None


def published_view(spark: SparkSession, releases_path: str, ledger: Any, family: str) -> DataFrame:
    """The release table's rows of the family's current version only (official mode), as the
    ledger has it now (read when this is called); of a series (a family with versions keyed by
    day), :func:`series_view`. Empty when the family has no current version."""
    versions = history(ledger, family)
    if is_series(versions):
        return series_view(spark, releases_path, ledger, family, versions=versions)
    rel = spark.read.format("delta").load(releases_path).where(
        (F.col("release_family") == family) & (F.col("mode") == "official"))
    current = [r["release_id"] for r in versions if r["state"] == "current"]
    if not current:
        return rel.where(F.lit(False))
    return rel.where(F.col("release_id") == current[-1])


def series_view(spark: SparkSession, releases_path: str, ledger: Any, family: str, *,
                versions: Optional[Sequence[dict[str, Any]]] = None) -> DataFrame:
    """A family published as a series (e.g. one release per day, ``dp-spark refresh``): for
    each (key, statistic), the row of the latest version that published it and is not
    withdrawn. Exactly one row per key and statistic: a day re-published later shows its newer
    value, a withdrawn version's days fall back to the version before it (or vanish). Official
    mode only; empty without versions. Read from the ledger's version record when called
    (``versions``: :func:`history`, read already). A day of a series is current in the ledger
    until that same day is re-published; versions recorded before the ledger kept series keys
    read ``superseded`` there, and are served here all the same."""
    live = [r for r in (history(ledger, family) if versions is None else versions) if r["state"] != "withdrawn"]
    rel = spark.read.format("delta").load(releases_path).where(
        (F.col("release_family") == family) & (F.col("mode") == "official"))
    if not live:
        return rel.where(F.lit(False))
    order = F.create_map(*[x for r in live for x in (F.lit(r["release_id"]), F.lit(r["version_no"]))])
    rank = "dp_series_version"
    latest = Window.partitionBy("key", "statistic").orderBy(F.col(rank).desc())
    return (rel.where(F.col("release_id").isin([r["release_id"] for r in live]))
            .withColumn(rank, order[F.col("release_id")])
            .withColumn("dp_series_rank", F.row_number().over(latest))
            .where(F.col("dp_series_rank") == 1).drop(rank, "dp_series_rank"))


def series_current_path(output_root: str, family: str) -> str:
    """Where :func:`write_series_current` keeps a family's ``<family>_current`` Delta table."""
    return f"{output_root.rstrip('/')}/{family}_current"


def write_series_current(spark: SparkSession, releases_path: str, ledger: Any, family: str, path: str, *,
                         catalog_schema: Optional[str] = None) -> int:
    """Overwrite the Delta table ``<family>_current`` at ``path`` with :func:`series_view` (one
    commit; a BI tool reads it as a table), and, with ``catalog_schema``, register it in the
    session's catalog (:func:`register_series_current`). Returns its number of rows."""
    df = series_view(spark, releases_path, ledger, family).cache()
    try:
        n = df.count()
        df.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(path)
    finally:
        df.unpersist()
    if catalog_schema is not None:
        register_series_current(spark, catalog_schema, family, path)
    return n


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def series_view_name(catalog_schema: str, family: str) -> str:
    """``<catalog_schema>.<family>_current``, each part quoted (ConfigError for a schema that
    is not one or two identifiers, or a family that is not an identifier)."""
    parts = catalog_schema.split(".")
    if not 1 <= len(parts) <= 2 or not all(_IDENT.fullmatch(p) for p in parts):
        raise ConfigError("series_schema must be a schema name, or catalog.schema (letters, digits, _)")
    if not _IDENT.fullmatch(family):
        raise ConfigError(f"family {family!r} is not a catalog name (letters, digits, _): its series has no view")
    return ".".join(f"`{p}`" for p in (*parts, f"{family}_current"))


def register_series_current(spark: SparkSession, catalog_schema: str, family: str, path: str) -> str:
    """Register the Delta table at ``path`` (:func:`write_series_current`) in the session's
    catalog as the view ``<catalog_schema>.<family>_current`` (``CREATE OR REPLACE VIEW ... AS
    SELECT * FROM delta.`path```: public SQL; the view reads the path when queried, so each
    refresh's overwrite shows through it). Returns the view's name."""
    if "`" in path:
        raise ConfigError("the output path of a series cannot contain a backquote")
    name = series_view_name(catalog_schema, family)
    spark.sql(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM delta.`{path}`")
    return name


# --------------------------------------------------------------------------------------
# the derived Delta table
# --------------------------------------------------------------------------------------
def _recorded_count(head: Optional[dict[str, Any]]) -> Optional[int]:
    """The ledger's count of version changes the table's latest commit was refreshed at, when
    that commit is one of :func:`refresh_published`'s; None otherwise."""
    try:
        meta = json.loads((head or {}).get("userMetadata") or "null")
        return int(meta[_META_KEY]) if isinstance(meta, dict) and _META_KEY in meta else None
    except (TypeError, ValueError, KeyError):
        return None


#: path -> the count of version changes this process last found ``_published`` refreshed at,
#: or refreshed it at (see :func:`refresh_published`)
_KNOWN_COUNT: dict[str, int] = {}


def refresh_published(ledger: Any, spark: SparkSession, path: str) -> bool:
    """Rewrite the derived ``_published`` table from the ledger's version record when it is
    behind (its latest commit records an older count of version changes, or is not a refresh);
    a no-op while the ledger has no version. One overwrite commit with Delta's idempotent-write
    options (``txnVersion`` = the count), so of two refreshes the one planned from the older
    state never lands after the newer one. Returns whether it wrote (or, when the table was
    behind, tried to: Delta skips a write another refresh made obsolete meanwhile).

    The table's latest commit is read only to skip a refresh that has nothing to do: when this
    process refreshed the table at a count the ledger has passed since, the rewrite is due
    anyway (the options above keep it from undoing a newer one), and the read is saved."""
    for _ in range(_ATTEMPTS):
        count, records = ledger.versions_snapshot()
        if count == 0:
            return False
        known = _KNOWN_COUNT.get(path)
        if known is None or count <= known:
            done = _recorded_count(latest_commit(spark, path))
            if done is not None and done >= count:
                _KNOWN_COUNT[path] = done
                return False
        df = spark.createDataFrame([tuple(_row(v)[f.name] for f in PUBLISHED_SCHEMA.fields) for v in records],
                                   PUBLISHED_SCHEMA).coalesce(1)
        try:
            (df.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
             .option("txnAppId", TXN_APP_ID).option("txnVersion", count)
             .option("userMetadata", json.dumps({_META_KEY: count})).save(path))
            _KNOWN_COUNT[path] = count
            return True
        except Exception as exc:
            if not is_concurrent_change(exc):
                raise
            # another refresh committed meanwhile: look again
    return False


def adopt_published(ledger: Any, spark: SparkSession, path: str) -> bool:
    """Adopt the version history of a ``_published`` Delta table written before the ledger
    kept the version record (its rows were the record then) into the ledger, once: only while
    the ledger holds no version, and only from a table that is not a refresh of the ledger's.
    Returns whether rows were imported. Call before the ledger's first version change."""
    from dp_spark.ledger.records import VersionRecord

    if ledger.versions_snapshot()[0] != 0:  # (an import counts as a change)
        return False
    schema = delta_schema(spark, path)
    if schema is None or _recorded_count(latest_commit(spark, path)) is not None:
        return False
    have = {(f.name, f.dataType.simpleString()) for f in schema.fields}
    if not any(have == {(f.name, f.dataType.simpleString()) for f in fields}
               for fields in (PUBLISHED_SCHEMA.fields, _KEYLESS_FIELDS)):
        raise ConfigError(f"versions table '{path}' exists with another schema")

    def utc(t: Optional[datetime]) -> Optional[datetime]:  # naive UTC as stored (the session is UTC)
        return None if t is None else (t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t)

    rows = spark.read.format("delta").load(path).collect()
    records = [VersionRecord(r["family"], int(r["version_no"]), r["release_id"], r["state"], r["reason"],
                             r["principal"], utc(r["at"]), r["changed_by"], utc(r["changed_at"]),
                             r.asDict().get("series_key")) for r in rows]
    return ledger.import_versions(records)
