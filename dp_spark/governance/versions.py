"""Versions of a release family, and rollback: the ``_published`` Delta table.

One Delta table (``<output_root>/_published``) holds one row per published version::

    family       string     release family (the release table's ``release_family``)
    version_no   long       1, 2, ... per family
    release_id   string     the release this version points to (one version per release id)
    state        string     current | superseded | withdrawn
    reason       string     why it was withdrawn (null otherwise)
    principal    string     who published it
    at           timestamp  when it was published (UTC)
    changed_by   string     who made the last state change (null while current since publication)
    changed_at   timestamp  when (UTC)

Invariant: at most one ``current`` row per family. Every state change is ONE Delta commit, a
``MERGE``: publishing supersedes the old current row and inserts the new one together; a
rollback withdraws the current row and restores the previous one together. A crash therefore
leaves either the old state or the new, never two current versions. The table is created with
``delta.isolationLevel = Serializable``; two concurrent changes of one family both rewrite the
file of its current row, so Delta refuses the second commit (ConcurrentAppend/ConcurrentDelete...),
which is retried on the new state. A publication checks the MERGE's metrics (one row inserted,
every current row superseded) and re-reads the table only when they differ; a rollback always
re-reads. Every read checks the invariant, so a log store that lost a commit is detected by the
next change or reader.

Rollback keeps the history (rows are never deleted) and refunds NO budget: the withdrawn
release was published, so whoever read it holds its privacy loss; the ledger keeps its
charge and the privacy statement lists it under errata. The published view
(:func:`published_view`) serves only the current version's rows. Exploration releases are
never versioned: :func:`published_view` keeps ``mode = official`` rows only.

Only SQL and DataFrame APIs (Delta's public API), so this works on Spark Connect and Databricks.
"""

from __future__ import annotations

import random
import time
import uuid
from datetime import datetime, timezone
from typing import Any, Callable, Optional, Sequence, Union

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dp_spark.errors import ConfigError, DpSparkError, ReleaseConflictError
from dp_spark.release.writer import _NO_TABLE_CONDITIONS, _condition, _delta_schema

__all__ = [
    "PUBLISHED_SCHEMA",
    "STATES",
    "VersionInvariantError",
    "ensure_published_table",
    "record_publication",
    "record_publications",
    "rollback",
    "current_release_id",
    "history",
    "published_view",
    "published_path_for",
]

STATES = ("current", "superseded", "withdrawn")
MAX_REASON = 500
RETRIES = 8

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
])

# the MERGE source: one row per version to insert or change
_CHANGE_SCHEMA = T.StructType([
    T.StructField("family", T.StringType(), False),
    T.StructField("version_no", T.LongType(), False),
    T.StructField("release_id", T.StringType(), True),
    T.StructField("op", T.StringType(), False),  # insert | change
    T.StructField("expect_state", T.StringType(), True),
    T.StructField("new_state", T.StringType(), False),
    T.StructField("reason", T.StringType(), True),
    T.StructField("principal", T.StringType(), False),
    T.StructField("at", T.TimestampType(), False),
])


class VersionInvariantError(DpSparkError):
    """The ``_published`` table has more than one current version of a family."""


def published_path_for(output_root: str) -> str:
    """``<output_root>/_published``: the versions table beside the official release tables."""
    return f"{output_root.rstrip('/')}/_published"


def _ref(path: str) -> str:
    return "delta.`" + path.replace("`", "``") + "`"


def _exists(spark: SparkSession, path: str) -> bool:
    return _delta_schema(spark, path) is not None


def _now(clock: Optional[Callable[[], datetime]]) -> datetime:
    t = (clock or (lambda: datetime.now(timezone.utc)))()
    if t.tzinfo is not None:
        t = t.astimezone(timezone.utc).replace(tzinfo=None)  # naive UTC (session time zone is UTC)
    return t


def _text(value: Any, name: str, limit: int = 256) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        raise ConfigError(f"{name} must be a non-empty string of at most {limit} characters")
    return value


def ensure_published_table(spark: SparkSession, path: str) -> None:
    """Create the versions table (Serializable isolation) if absent; check its schema."""
    schema = _delta_schema(spark, path)
    if schema is not None:
        have = {(f.name, f.dataType.simpleString()) for f in schema.fields}
        want = {(f.name, f.dataType.simpleString()) for f in PUBLISHED_SCHEMA.fields}
        if have != want:
            raise ConfigError(f"versions table '{path}' exists with another schema")
        return
    cols = ", ".join(f"{f.name} {f.dataType.simpleString().upper()}{'' if f.nullable else ' NOT NULL'}"
                     for f in PUBLISHED_SCHEMA.fields)
    try:
        spark.sql(f"CREATE TABLE IF NOT EXISTS {_ref(path)} ({cols}) USING DELTA "
                  "TBLPROPERTIES ('delta.isolationLevel' = 'Serializable')")
    except Exception:
        # a concurrent creator got there first: its directory can exist a moment before its
        # first commit (Delta then refuses "location not empty and not a Delta table"), so
        # wait for the table to appear before giving up
        deadline = time.monotonic() + 30
        while not _exists(spark, path):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _sorted(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: (r["family"], r["version_no"]))


def _rows(spark: SparkSession, path: str, family: Union[str, Sequence[str]]) -> list[dict[str, Any]]:
    """The versions of one family (or of several), ordered by (family, version_no): one Spark
    job. The table is loaded directly (its absence is told apart from a damaged table only
    when the load fails) and the few rows of these families are sorted here, not by a
    distributed sort (two more jobs)."""
    families = [family] if isinstance(family, str) else list(family)
    for attempt in range(3):
        try:
            df = spark.read.format("delta").load(path)
            rows = [r.asDict() for r in df.where(F.col("family").isin(families)).collect()]
            break
        except Exception as exc:  # (Spark Connect loads lazily: a missing table fails the collect)
            if not _exists(spark, path):  # no table (yet); a damaged one raises there
                return []
            if attempt == 2 or _condition(exc) not in _NO_TABLE_CONDITIONS:
                raise
            # "no table", and now there is one: another process's creation landed meanwhile
            # (seen with three runs creating the table at once): read again
            time.sleep(0.1 * (attempt + 1))
    return _sorted(rows)


def _check_invariant(rows: list[dict[str, Any]], family: str) -> None:
    cur = [r for r in rows if r["state"] == "current"]
    if len(cur) > 1:
        raise VersionInvariantError(
            f"family {family!r} has {len(cur)} current versions ({[r['version_no'] for r in cur]}): "
            "a state change was lost or the table was edited outside dp_spark; an admin must repair it")
    if len({r["release_id"] for r in rows}) != len(rows) or len({r["version_no"] for r in rows}) != len(rows):
        raise VersionInvariantError(f"family {family!r} has a duplicated version or release id")


def _is_conflict(exc: Exception) -> bool:
    text = f"{type(exc).__name__} {exc}"
    return "Concurrent" in text or "DELTA_CONCURRENT" in text


def _merge(spark: SparkSession, path: str, changes: list[tuple]) -> tuple[int, int]:
    """Apply ``changes`` (rows of _CHANGE_SCHEMA) in one MERGE = one Delta commit.

    Returns the MERGE's metrics: (rows inserted, rows updated)."""
    src = spark.createDataFrame(changes, _CHANGE_SCHEMA).coalesce(1)  # a few rows: one task
    view = f"__dp_versions_src_{uuid.uuid4().hex}"
    src.createOrReplaceTempView(view)
    try:
        metrics = spark.sql(f"""
            MERGE INTO {_ref(path)} AS t
            USING {view} AS s
            ON t.family = s.family AND t.version_no = s.version_no
            WHEN MATCHED AND s.op = 'change' AND t.state = s.expect_state THEN UPDATE SET
                t.state = s.new_state,
                t.reason = coalesce(s.reason, t.reason),
                t.changed_by = s.principal,
                t.changed_at = s.at
            WHEN NOT MATCHED AND s.op = 'insert' THEN INSERT
                (family, version_no, release_id, state, reason, principal, at, changed_by, changed_at)
                VALUES (s.family, s.version_no, s.release_id, s.new_state, NULL, s.principal, s.at,
                        CASE WHEN s.new_state = 'current' THEN NULL ELSE s.principal END,
                        CASE WHEN s.new_state = 'current' THEN NULL ELSE s.at END)
        """).first()
    finally:
        spark.catalog.dropTempView(view)
    try:
        return int(metrics["num_inserted_rows"]), int(metrics["num_updated_rows"])
    except (TypeError, KeyError, ValueError):
        return -1, -1  # no metrics from this Delta: callers re-read the table


def _with_retries(fn: Callable[[], Any]) -> Any:
    for attempt in range(RETRIES):
        try:
            return fn()
        except Exception as exc:
            if not _is_conflict(exc) or attempt == RETRIES - 1:
                if _is_conflict(exc):
                    raise ReleaseConflictError("the versions table kept changing concurrently; retry later") from None
                raise
            # jittered: writers that conflicted together do not retry in lockstep
            time.sleep(0.2 * (attempt + 1) * (0.5 + random.random()))


def record_publication(spark: SparkSession, path: str, family: str, release_id: str, principal: str, *,
                       clock: Optional[Callable[[], datetime]] = None) -> int:
    """Make ``release_id`` the current version of ``family``; return its version number.

    The previous current version becomes ``superseded`` in the same commit. Idempotent per
    release id: a release id that already has a version (in any state) changes nothing and
    returns that version number, so a rerun (cache hit) of a withdrawn release does not bring
    it back. Call it only for official releases, after the release write and ledger commit.
    """
    return record_publications(spark, path, [(family, release_id)], principal, clock=clock)[0]


def record_publications(spark: SparkSession, path: str, items: Sequence[tuple[str, str]], principal: str, *,
                        clock: Optional[Callable[[], datetime]] = None) -> list[int]:
    """:func:`record_publication` for several (family, release id) pairs, in order, in ONE
    commit: a batch job versions all its releases with one MERGE. Within a family, each new
    release supersedes the one before it, so the family's last new release ends up current.
    Returns the version number of each item."""
    items = [(_text(f, "family", 64), _text(r, "release_id", 128)) for f, r in items]
    _text(principal, "principal")
    if not items:
        return []
    ensure_published_table(spark, path)
    families = sorted({f for f, _ in items})

    def attempt() -> list[int]:
        rows = _rows(spark, path, families)
        by_family = {f: [r for r in rows if r["family"] == f] for f in families}
        for f in families:
            _check_invariant(by_family[f], f)
        at = _now(clock)
        known = {(r["family"], r["release_id"]): int(r["version_no"]) for r in rows}
        inserts: dict[tuple[str, str], int] = {}
        last_new: dict[str, tuple[str, str]] = {}
        next_no = {f: max((int(r["version_no"]) for r in by_family[f]), default=0) + 1 for f in families}
        for item in items:
            if item in known or item in inserts:
                continue
            inserts[item] = next_no[item[0]]
            next_no[item[0]] += 1
            last_new[item[0]] = item
        if not inserts:
            return [known[i] for i in items]
        changes = [(f, no, rid, "insert", None, "current" if last_new[f] == (f, rid) else "superseded", None,
                    principal, at) for (f, rid), no in inserts.items()]
        changes += [(f, int(r["version_no"]), r["release_id"], "change", "current", "superseded", None,
                     principal, at) for f in last_new for r in by_family[f] if r["state"] == "current"]
        inserted, updated = _merge(spark, path, changes)
        if (inserted, updated) != (len(inserts), len(changes) - len(inserts)):
            # not the expected effect (or no metrics): check the new state, retry if it moved
            after = _rows(spark, path, families)
            for f in families:
                _check_invariant([r for r in after if r["family"] == f], f)
            mine = {(r["family"], r["release_id"]): int(r["version_no"]) for r in after}
            if any(mine.get(i) != no for i, no in inserts.items()):
                raise _Conflict("version numbers taken concurrently")
        # Serializable isolation: a concurrent change of these families fails this commit
        return [known[i] if i in known else inserts[i] for i in items]

    return _with_retries(attempt)


class _Conflict(Exception):
    """Internal: retry on the new table state (name contains 'Conflict', not 'Concurrent')."""

    def __str__(self) -> str:  # recognised by _is_conflict
        return "Concurrent change: " + super().__str__()


def rollback(spark: SparkSession, path: str, family: str, principal: str, reason: str, *,
             clock: Optional[Callable[[], datetime]] = None) -> tuple[str, Optional[str]]:
    """Withdraw the current version of ``family`` and restore the latest earlier version
    that was not withdrawn (one commit). Returns (withdrawn release id, restored release id
    or None when no earlier version remains: the published view is then empty).

    Keeps the history and refunds no budget (see the module docstring). ``reason`` is
    recorded and shown in the privacy statement's errata: write why, never data values.
    Check the principal's ``rollback`` permission (role admin) and write the audit row in
    the caller.
    """
    _text(family, "family", 64)
    _text(principal, "principal")
    _text(reason, "reason", MAX_REASON)
    if not _exists(spark, path):
        raise ConfigError(f"family {family!r} has no published versions to roll back")

    def attempt() -> tuple[str, Optional[str]]:
        rows = _rows(spark, path, family)
        _check_invariant(rows, family)
        cur = [r for r in rows if r["state"] == "current"]
        if not cur:
            raise ConfigError(f"family {family!r} has no current version to roll back")
        c = cur[0]
        earlier = [r for r in rows if r["version_no"] < c["version_no"] and r["state"] == "superseded"]
        prev = earlier[-1] if earlier else None
        at = _now(clock)
        changes = [(family, int(c["version_no"]), c["release_id"], "change", "current", "withdrawn", reason,
                    principal, at)]
        if prev is not None:
            changes.append((family, int(prev["version_no"]), prev["release_id"], "change", "superseded",
                            "current", None, principal, at))
        _merge(spark, path, changes)
        after = {r["version_no"]: r for r in _rows(spark, path, family)}
        _check_invariant(list(after.values()), family)
        if after[c["version_no"]]["state"] != "withdrawn" or (
                prev is not None and after[prev["version_no"]]["state"] != "current"):
            raise _Conflict("the family changed concurrently")
        return c["release_id"], None if prev is None else prev["release_id"]

    return _with_retries(attempt)


def current_release_id(spark: SparkSession, path: str, family: str) -> Optional[str]:
    """The release id of the family's current version, or None."""
    rows = _rows(spark, path, family)
    _check_invariant(rows, family)
    cur = [r for r in rows if r["state"] == "current"]
    return cur[0]["release_id"] if cur else None


def history(spark: SparkSession, path: str, family: str) -> list[dict[str, Any]]:
    """Every version of the family (rows of PUBLISHED_SCHEMA as dicts), oldest first."""
    return _rows(spark, path, family)


def published_view(spark: SparkSession, releases_path: str, published_path: str, family: str) -> DataFrame:
    """The release table's rows of the family's current version only (official mode).

    Lazy: evaluated when queried, so it always reflects the versions table at that time.
    Empty when the family has no current version.
    """
    rel = spark.read.format("delta").load(releases_path).where(
        (F.col("release_family") == family) & (F.col("mode") == "official"))
    if not _exists(spark, published_path):
        return rel.where(F.lit(False))
    cur = (spark.read.format("delta").load(published_path)
           .where((F.col("family") == family) & (F.col("state") == "current"))
           .select("release_id"))
    return rel.join(cur, on="release_id", how="left_semi")
