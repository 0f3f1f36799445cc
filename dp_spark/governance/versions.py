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

Invariant: at most one ``current`` row per family. Every state change is ONE Delta commit:
publishing supersedes the old current row and inserts the new one together; a rollback
withdraws the current row and restores the previous one together. A crash therefore leaves
either the old state or the new, never two current versions. The commit is a ``MERGE``,
except for the publication of one family on a classic session (:func:`_rewrite_family`): the
family's rows, read at a known table version, are replaced by their new state -- the rows the
MERGE would leave, computed here -- through Delta's transaction on exactly that version, which
removes the family's files and writes one new file, when every file that may hold the family
holds nothing else (their statistics say so; a file of several families, written by a batch's
MERGE or outside dp_spark, sends the publication to the MERGE, and so does any family name
beyond 32 characters or printable ASCII in the table, whose bounds Delta truncates or this
path does not compare). It declares the whole table
read, so any concurrent commit makes it conflict and retry. Two Spark jobs instead of the
MERGE's seven to nine (0.45 s against 0.75 s on an idle 2-core machine); a new table keeps one
file per family. The
table is created with ``delta.isolationLevel = Serializable``; two concurrent changes of
one family both rewrite the file of its current row, so Delta refuses the second commit
(ConcurrentAppend/ConcurrentDelete...), which is retried on the new state. A publication
checks the MERGE's metrics (one row inserted, every current row superseded) and re-reads
the table only when they differ; a rollback always re-reads. Every read checks the
invariant, so a log store that lost a commit is detected by the next change or reader.

Reads are cached per process, one entry per path: the rows last read (or written) at the
table's identity ``(table id, Delta version)`` taken from its log, served again only while
the identity is unchanged (every commit, RESTORE or OPTIMIZE is a new version; a recreated
table a new id), and cached only when the identity was the same before and after the read.
A publication caches its post-state when the table is at exactly the read version + 1 after
its MERGE (nobody else committed), so the statement then reads no rows; without the log
(Spark Connect) every read goes to the table.

Rollback keeps the history (rows are never deleted) and refunds NO budget: the withdrawn
release was published, so whoever read it holds its privacy loss; the ledger keeps its
charge and the privacy statement lists it under errata. The published view
(:func:`published_view`) serves only the current version's rows. Exploration releases are
never versioned: :func:`published_view` keeps ``mode = official`` rows only.

Only SQL and DataFrame APIs, so this works on Spark Connect, except the optional fast paths
(the table's identity from its log, the transaction above) that reach Delta through the JVM
gateway and fall back to SQL and the MERGE without it.
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
from dp_spark.release.identity_cache import Identity, IdentityCache
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
    "table_version",
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


# --------------------------------------------------------------------------------------
# the process-wide cache of the table's rows (see the module docstring)
# --------------------------------------------------------------------------------------
CACHED_PATHS = 64  # one entry per path; the least recently used path is dropped beyond this

_Identity = Identity  # (Delta table id, Delta version)


def _copy_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [dict(r) for r in rows]


#: path -> (identity, {family: every row of the family in the table at that identity})
_cache: "IdentityCache[list[dict[str, Any]]]" = IdentityCache(lambda: CACHED_PATHS, copy=_copy_rows)


def _identity(spark: SparkSession, path: str) -> Optional[_Identity]:
    """The table's (id, latest Delta version) from its log (no Spark job), or None where that
    is not available (Spark Connect, no table yet, any failure): then nothing is cached."""
    from dp_spark.release.writer import _fast_snapshot

    try:
        snap = _fast_snapshot(spark, path)
    except Exception:
        return None
    return None if snap is None else (snap.table_id, snap.version)


def _cached_rows(path: str, identity: Optional[_Identity], families: Sequence[str]) -> Optional[list[dict[str, Any]]]:
    """Copies of the cached rows of ``families`` when cached for exactly ``identity``."""
    hit = _cache.get(path, identity, families)
    return None if hit is None else [r for rows in hit.values() for r in rows]


def _remember(path: str, identity: _Identity, families: Sequence[str], rows: Sequence[dict[str, Any]]) -> None:
    """Cache ``rows`` as every row of ``families`` at ``identity``: replaces the path's entry
    (rows of other families cached for the same identity are kept)."""
    _cache.put(path, identity, {f: [r for r in rows if r["family"] == f] for f in families})


def clear_cache(path: Optional[str] = None) -> None:
    """Forget the cached rows of ``path`` (of every path by default). Never needed for
    correctness (an entry is served only at its own table identity): frees memory, and lets
    a test compare the cache with a fresh read."""
    _cache.clear(path)


def _as_read(t: Optional[datetime]) -> Optional[datetime]:
    """``t`` as a Spark read of a TIMESTAMP column returns it (through Spark's internal
    microseconds since the epoch, in the Python process's local time like a collect)."""
    if t is None:
        return None
    ts = T.TimestampType()
    return ts.fromInternal(ts.toInternal(t))


def _sorted(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: (r["family"], r["version_no"]))


def _rows(spark: SparkSession, path: str, family: Union[str, Sequence[str]]) -> list[dict[str, Any]]:
    """The versions of one family (or of several), ordered by (family, version_no)."""
    return _rows_at(spark, path, family)[0]


def _rows_at(spark: SparkSession, path: str,
             family: Union[str, Sequence[str]]) -> tuple[list[dict[str, Any]], Optional[_Identity]]:
    """:func:`_rows` and the table identity they are known to be the rows of (None when
    unknown: no log access, or the table changed during the read).

    Served from the cache when it holds these families at the table's current identity;
    otherwise one resolution of the table's Delta log and one Spark job: the table is loaded
    directly (its absence is told apart from a damaged table only when the load fails) and the
    few rows of these families are sorted here, not by a distributed sort (two more jobs)."""
    families = [family] if isinstance(family, str) else list(family)
    before = _identity(spark, path)
    hit = _cached_rows(path, before, families)
    if hit is not None:
        return _sorted(hit), before
    for attempt in range(3):
        try:
            df = spark.read.format("delta").load(path)
            rows = [r.asDict() for r in df.where(F.col("family").isin(families)).collect()]
            break
        except Exception as exc:  # (Spark Connect loads lazily: a missing table fails the collect)
            if not _exists(spark, path):  # no table (yet); a damaged one raises there
                return [], None
            if attempt == 2 or _condition(exc) not in _NO_TABLE_CONDITIONS:
                raise
            # "no table", and now there is one: another process's creation landed meanwhile
            # (seen with three runs creating the table at once): read again
            time.sleep(0.1 * (attempt + 1))
    rows = _sorted(rows)
    if before is None or _identity(spark, path) != before:
        return rows, None  # a commit may have landed during the read: these rows are of no known version
    _remember(path, before, families, rows)
    return rows, before


def _merged(rows: Sequence[dict[str, Any]], changes: Sequence[tuple]) -> tuple[list[dict[str, Any]], tuple[int, int]]:
    """``rows`` after :func:`_merge` of ``changes`` exactly as its MERGE applies them (each
    change matched against the rows before it), and (rows inserted, rows updated)."""
    before = {(r["family"], r["version_no"]): r for r in rows}
    after = {k: dict(r) for k, r in before.items()}
    inserted = updated = 0
    for family, no, release_id, op, expect_state, new_state, reason, principal, at in changes:
        at = _as_read(at)
        t = before.get((family, no))
        if t is not None:
            if op == "change" and t["state"] == expect_state:
                after[(family, no)].update(state=new_state, reason=t["reason"] if reason is None else reason,
                                           changed_by=principal, changed_at=at)
                updated += 1
        elif op == "insert":
            current = new_state == "current"
            after[(family, no)] = dict(
                family=family, version_no=no, release_id=release_id, state=new_state, reason=None,
                principal=principal, at=at, changed_by=None if current else principal,
                changed_at=None if current else at)
            inserted += 1
    return _sorted(list(after.values())), (inserted, updated)


def _remember_merge(spark: SparkSession, path: str, read_at: _Identity, families: Sequence[str],
                    rows: Sequence[dict[str, Any]], changes: Sequence[tuple], metrics: tuple[int, int]) -> None:
    """After a MERGE of ``changes`` into ``rows`` (every row of ``families`` at ``read_at``):
    cache the post-state when the table is now exactly at ``read_at``'s next version (the MERGE
    was the only commit since the read) and the MERGE's metrics are the expected ones."""
    if _identity(spark, path) != (read_at[0], read_at[1] + 1):
        return
    post, counts = _merged(rows, changes)
    if counts == metrics:
        _remember(path, (read_at[0], read_at[1] + 1), families, post)


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
        clear_cache(path)  # a commit (or maybe one): only a read or a proven post-state caches again
    try:
        return int(metrics["num_inserted_rows"]), int(metrics["num_updated_rows"])
    except (TypeError, KeyError, ValueError):
        return -1, -1  # no metrics from this Delta: callers re-read the table


def _rewrite_family(spark: SparkSession, path: str, family: str, rows: Sequence[dict[str, Any]],
                    read_at: _Identity, changes: list[tuple]) -> bool:
    """Apply ``changes`` to ONE family by replacing its rows (``rows``: all of them, read at
    ``read_at``) with their new state as :func:`_merge` would leave them, in one commit made
    on exactly ``read_at`` that rewrites no other family's rows (``writer.replace_rows_if_unchanged``:
    Delta's transaction, no MERGE: a few Spark jobs fewer). True when it committed (the new
    state is then cached); False when that path does not apply (nothing written: the caller
    MERGEs). A concurrent commit raises Delta's conflict error (retried by the caller)."""
    from dp_spark.release.writer import replace_rows_if_unchanged

    post, _counts = _merged(rows, changes)
    post = [r for r in post if r["family"] == family]
    df = spark.createDataFrame([tuple(r[f.name] for f in PUBLISHED_SCHEMA.fields) for r in post], PUBLISHED_SCHEMA)
    try:
        committed = replace_rows_if_unchanged(spark, path, df, identity=read_at, column="family", value=family)
    finally:
        clear_cache(path)  # a commit (or maybe one): only a read or a proven post-state caches again
    if committed is None:
        return False
    if committed == read_at[1] + 1:
        _remember(path, (read_at[0], committed), [family], post)
    return True


def _with_retries(fn: Callable[[], Any]) -> Any:
    for attempt in range(RETRIES):
        try:
            return fn()
        except Exception as exc:
            if not _is_conflict(exc) or attempt == RETRIES - 1:
                if _is_conflict(exc):
                    raise ReleaseConflictError("the versions table kept changing concurrently; retry later") from None
                raise
            # jittered: writers that conflicted together do not retry in lockstep (a version
            # record through the transaction takes a fraction of a MERGE's time)
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
        rows, read_at = _rows_at(spark, path, families)
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
        if len(families) == 1 and read_at is not None and _rewrite_family(
                spark, path, families[0], rows, read_at, changes):
            # one commit replaced the family's rows by their new state (computed from the rows
            # read at ``read_at``, the version the commit was made on): cached, no check needed
            return [known[i] if i in known else inserts[i] for i in items]
        inserted, updated = _merge(spark, path, changes)
        if (inserted, updated) != (len(inserts), len(changes) - len(inserts)):
            # not the expected effect (or no metrics): check the new state, retry if it moved
            after = _rows(spark, path, families)
            for f in families:
                _check_invariant([r for r in after if r["family"] == f], f)
            mine = {(r["family"], r["release_id"]): int(r["version_no"]) for r in after}
            if any(mine.get(i) != no for i, no in inserts.items()):
                raise _Conflict("version numbers taken concurrently")
        elif read_at is not None:  # the expected effect: the statement reads the new state from the cache
            _remember_merge(spark, path, read_at, families, rows, changes, (inserted, updated))
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


def table_version(spark: SparkSession, path: str) -> Optional[int]:
    """The versions table's latest Delta version from its log (no Spark job), or None where that
    is not available (Spark Connect, no table yet, any failure): callers then compare rows.

    Every change of any version record is a new Delta version, so an unchanged version means
    unchanged records: a cheap "did anyone version meanwhile?" for a statement writer."""
    identity = _identity(spark, path)
    return None if identity is None else identity[1]


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
