"""A Delta mirror of the ledger and the audit log, for analysts (Spark SQL).

The SQL store stays the authority: the mirror is copied from it, never read back to decide a
charge.

Refresh (after each job's releases; ``mirror_to_delta``) costs what changed, not the ledger's
size. For each table it reads the mirror's latest commit (``DESCRIBE HISTORY ... LIMIT 1``: its
version ``v`` and its ``userMetadata``) and the table's state: the highest seq (per budget for
entries) and the entries not settled yet. Each write of this module records the state it leaves
in its commit (``userMetadata``); when the latest commit is such a write, planned from ``v - 1``,
that record is the state. Otherwise (the first refresh after any other commit) the table is
read: highest seq, row count, sum and sum of squares of seq (rows 1..max). The refresh then asks
the ledger only for the rows after those watermarks (``entries_since`` / ``audit_rows_since``,
which verify the new rows, their link to the stored row at the watermark and the MAC'd chain
head: O(new rows)) and appends them in one commit.

An append is the DataFrame writer's plain append, one commit that records its plan
(``userMetadata``: the version ``v`` it was planned from, the state it leaves, a mark of its
own). It counts as committed only when the table's latest commit is then exactly version ``v +
1`` and carries this write's mark; anything else counts as a race: the refresh re-plans, and its
plan reads and checks the table. Of two refreshes planned from the same version, both may
append (a blind append never conflicts in Delta), but only one can be version ``v + 1``: the
other sees the race, reads the table, finds the rows twice (a duplicate moves the count, the sum
or the sum of squares of seq) and rewrites it from the ledger; a refresh killed before that
check leaves a commit that does not record a state planned from the version before it, so the
next refresh reads the table too. The table can show such a duplicate between the two commits,
never after a refresh has finished. The append does NOT carry Delta's idempotent-write options
(``txnAppId``/``txnVersion``, which would make Delta skip the second append): Delta 4.4 answers
them from a full reconstruction of the table's state (a few Spark jobs per table), which doubled
the refresh (``docs/performance.md``). A rewrite (an overwrite, rare) keeps them (``txnAppId =
dp_spark.ledger_mirror``, ``txnVersion = v + 1``): of two rewrites planned from the same version
only one lands, and Delta's conflict check refuses an overwrite when an append landed meanwhile.

A table is rewritten whole (after a full ``verify()``) only when it must be: it is absent or of
another schema, it shows a gap or a duplicate, a budget's watermark is past the ledger's head
(another ledger's mirror), or an entry it shows as ``reserved`` has changed since (committed, or
its lease renewed: a release that was still running, or crashed and was rerun, when the mirror
was last refreshed; each such entry is one O(1) ledger lookup per refresh). Both tables stay one
row per ledger row. An edit to an OLD ledger row is not seen by a refresh (it reads only new
rows): ``dp-spark budget verify`` and ``rebuild-mirror`` (``full=True``) check everything.

Exact charges are kept as canonical JSON (``charge``); ``epsilon``,
``rho`` and ``delta`` are float copies for charts and queries. The mirror holds no data
values: the ledger and the audit log never contain any.

``dp-spark budget rebuild-mirror --env ENV`` (:func:`rebuild_mirror_command`) rebuilds both
tables from the SQL ledger on demand: after a failed refresh (the engine only logs a warning),
or when a mirror table's Delta log is damaged (a derived table: it is replaced, never repaired).

Only this module of dp_spark.ledger imports pyspark.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone
from typing import Any, Optional

from pyspark.sql import types as T

from dp_spark.background import alongside
from dp_spark.ledger.records import charge_text
from dp_spark.ledger.store import Ledger

__all__ = ["ENTRY_SCHEMA", "AUDIT_SCHEMA", "mirror_to_delta", "rebuild_mirror", "rebuild_mirror_command"]

ENTRY_SCHEMA = T.StructType([
    T.StructField("budget_id", T.StringType(), False),
    T.StructField("seq", T.LongType(), False),
    T.StructField("release_id", T.StringType(), False),
    T.StructField("release_family", T.StringType(), False),
    T.StructField("state", T.StringType(), False),
    T.StructField("measure", T.StringType(), False),
    T.StructField("charge", T.StringType(), False),
    T.StructField("epsilon", T.DoubleType(), True),
    T.StructField("rho", T.DoubleType(), True),
    T.StructField("delta", T.DoubleType(), True),
    T.StructField("principal", T.StringType(), False),
    T.StructField("code_version", T.StringType(), False),
    T.StructField("created_at", T.TimestampType(), False),
    T.StructField("committed_at", T.TimestampType(), True),
    T.StructField("lease_expires_at", T.TimestampType(), False),
    T.StructField("event_json", T.StringType(), False),
    T.StructField("row_hash", T.StringType(), False),
    T.StructField("mirrored_at", T.TimestampType(), False),
])

AUDIT_SCHEMA = T.StructType([
    T.StructField("seq", T.LongType(), False),
    T.StructField("at", T.TimestampType(), False),
    T.StructField("principal", T.StringType(), False),
    T.StructField("action", T.StringType(), False),
    T.StructField("spec_name", T.StringType(), True),
    T.StructField("spec_version", T.StringType(), True),
    T.StructField("decision", T.StringType(), False),
    T.StructField("release_id", T.StringType(), True),
    T.StructField("charge", T.StringType(), True),
    T.StructField("detail", T.StringType(), True),
    T.StructField("row_hash", T.StringType(), False),
    T.StructField("mirrored_at", T.TimestampType(), False),
])


def _float(charge: Any, name: str):
    v = getattr(charge, name, None)
    if name in getattr(charge, "OPTIONAL", ()) and v == 0:
        return None  # a pure_dp / zcdp charge without delta: null, as before delta existed
    return None if v is None else float(v)


def _entry_row(e, now: datetime) -> tuple:
    return (e.budget_id, e.seq, e.release_id, e.release_family, e.state, e.charge.MEASURE,
            charge_text(e.charge), _float(e.charge, "epsilon"), _float(e.charge, "rho"),
            _float(e.charge, "delta"), e.principal, e.code_version, e.created_at, e.committed_at,
            e.lease_expires_at, e.event_json, e.row_hash, now)


def _audit_row(a, now: datetime) -> tuple:
    return (a.seq, a.at, a.principal, a.action, a.spec_name, a.spec_version, a.decision, a.release_id,
            a.charge_json, a.detail, a.row_hash, now)


# the writer option that makes a rewrite conditional (see the module docstring, "Refresh")
TXN_APP_ID = "dp_spark.ledger_mirror"
_ATTEMPTS = 4


def _head(spark, path: str) -> Optional[dict[str, Any]]:
    """The mirror table's latest commit (``version``, ``userMetadata``, ...), or None when there
    is no readable table."""
    from dp_spark.delta.release_table import latest_commit

    return latest_commit(spark, path)


def _version(spark, path: str) -> Optional[int]:
    """The mirror table's latest Delta version, or None when there is no readable table."""
    head = _head(spark, path)
    return None if head is None else int(head["version"])


_META_KEY = "dp_spark_mirror"


def _recorded_state(head: Optional[dict[str, Any]]) -> Optional[Any]:
    """The state the table's latest commit ``head`` recorded (``userMetadata``), when that
    commit was made by this module and planned from the version before it (so nothing else
    committed in between: the table is exactly as that write left it); otherwise None, and the
    caller reads the table. Saves the aggregation over the table on every refresh but the first
    after someone else's commit."""
    try:
        meta = json.loads((head or {}).get("userMetadata") or "null")
        if not isinstance(meta, dict) or meta.get(_META_KEY) != 1 or meta.get("from") != int(head["version"]) - 1:
            return None
        return meta["state"]
    except Exception:
        return None


def _write(spark, rows, schema, path: str, *, append: bool, read_version: Optional[int], state: Any) -> bool:
    """Write ``rows`` (append or overwrite) as ONE commit planned from ``read_version`` that
    records ``state``, what the table holds after it (see :func:`_recorded_state`). Returns
    whether it was committed as planned: the table's latest commit is then exactly
    ``read_version + 1`` and carries this write's mark. An append is a plain one (another
    refresh's append may land too: the caller re-plans, and its plan reads the table and
    rewrites a duplicate away; module docstring, "Refresh"); an overwrite carries Delta's
    idempotent transaction (``txnAppId``, ``txnVersion = read_version + 1``), so Delta skips it
    when another rewrite planned from the same version or a later one recorded its key first."""
    before = -1 if read_version is None else read_version
    # ``write``: this write's own mark, so that the commit found afterwards is known to be this
    # one (a twin refresh planned from the same version records the same state)
    meta = json.dumps({_META_KEY: 1, "from": before, "state": state, "write": uuid.uuid4().hex}, sort_keys=True)
    df = spark.createDataFrame(rows, schema).coalesce(1)
    w = df.write.format("delta").option("userMetadata", meta)
    try:
        if append:
            w.mode("append").save(path)
        else:
            (w.option("txnAppId", TXN_APP_ID).option("txnVersion", before + 1)
             .mode("overwrite").option("overwriteSchema", "true").save(path))
    except Exception as exc:
        from dp_spark.delta.release_table import is_concurrent_change

        if is_concurrent_change(exc):  # another refresh committed (or created the table) meanwhile: re-plan
            return False
        raise
    head = _head(spark, path)
    # a skipped write leaves the version where it was; a commit by anyone else in between
    # lands elsewhere or records another state: both are re-planned (see the module docstring)
    return head is not None and int(head["version"]) == before + 1 and head.get("userMetadata") == meta


def _overwrite(ledger: Ledger, spark, which: str, path: str, now: datetime) -> int:
    """Rewrite one mirror table from the (already verified) ledger; retried when another
    mirror write got in first. Returns the rows written."""
    for _ in range(_ATTEMPTS):
        v = _version(spark, path)
        if which == "entries":
            entries = ledger.entries()
            rows, schema = [_entry_row(e, now) for e in entries], ENTRY_SCHEMA
            state = _entries_state({}, [], entries)
        else:
            audit = ledger.audit_rows()
            rows, schema = [_audit_row(a, now) for a in audit], AUDIT_SCHEMA
            state = {"hi": max((a.seq for a in audit), default=0)}
        if _write(spark, rows, schema, path, append=False, read_version=v, state=state):
            return len(rows)
    from dp_spark.errors import ReleaseConflictError

    raise ReleaseConflictError(f"the {which} mirror kept changing concurrently; rerun rebuild-mirror")


def _read(spark, path: str, schema):
    """The mirror table's latest state (read AFTER its version ``v`` was taken: anything a
    refresh plans from it is at least as new as ``v``), or None when its schema is another."""
    df = spark.read.format("delta").load(path)
    if [(f.name, f.dataType) for f in df.schema.fields] != [(f.name, f.dataType) for f in schema.fields]:
        return None
    return df


def _seq_aggs():
    """max, count, sum and sum of squares of seq: one aggregation (no distinct, which would cost
    another shuffle). Rows 1..max give exactly these; one row deleted, duplicated or inserted by
    hand moves the count, the max or the sum."""
    from pyspark.sql import functions as F

    seq = F.col("seq").cast("decimal(38,0)")
    return [F.max("seq"), F.count(F.lit(1)), F.sum(seq), F.sum(seq * seq)]


def _whole(hi, n, s1, s2) -> bool:
    hi, n = int(hi or 0), int(n)
    return n == hi and int(s1 or 0) == hi * (hi + 1) // 2 and int(s2 or 0) == hi * (hi + 1) * (2 * hi + 1) // 6


def _micros(t: datetime) -> int:
    t = t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)
    return round(t.timestamp() * 1_000_000)


def _entries_state(hi: dict, open_: list, added) -> dict:
    """The entries table's state after appending ``added`` to a table of watermarks ``hi`` and
    unsettled rows ``open_`` ((budget, release id, state, lease micros)): what a commit records."""
    hi = dict(hi)
    open_ = [list(o) for o in open_]
    for e in added:
        hi[e.budget_id] = max(hi.get(e.budget_id, 0), e.seq)
        if e.state != "committed":
            open_.append([e.budget_id, e.release_id, e.state, _micros(e.lease_expires_at)])
    return {"hi": hi, "open": open_}


def _refresh(ledger: Ledger, spark, path: str, now: datetime, which: str, schema, row, *,
             recorded, scanned, since, after) -> int:
    """The refresh of one mirror table (``which``: ``entries`` or ``audit``). Take the mirror's
    version ``v`` and the table's state: ``recorded(rec)`` of the state its latest commit
    recorded, else ``scanned(df)`` of the table read (None: rewrite it). ``since(state)`` is
    the ledger's rows after that state (None: rewrite the table); they are appended as
    ``row(x, now)`` in one commit conditional on ``v`` that records ``after(state, new)``."""
    for _ in range(_ATTEMPTS):
        head = _head(spark, path)
        v = None if head is None else int(head["version"])
        state = None
        rec = _recorded_state(head)
        if rec is not None:
            state = recorded(rec)
        elif v is not None:
            df = _read(spark, path, schema)
            if df is not None:
                state = scanned(df)
        new = None if state is None else since(state)
        if new is None:
            ledger.verify()
            return _overwrite(ledger, spark, which, path, now)
        if not new:
            return 0
        if _write(spark, [row(x, now) for x in new], schema, path, append=True, read_version=v,
                  state=after(state, new)):
            return len(new)
    return 0  # other mirror writes kept getting in first: each of them brought the table up to date


def _refresh_entries(ledger: Ledger, spark, path: str, now: datetime) -> int:
    """Append the entries the ledger gained since the mirror's version. The table is rewritten
    only when it is absent, has another schema, has a gap or duplicate, a watermark is past the
    ledger's head, or an entry the mirror shows as ``reserved`` has changed since (committed, or
    its lease renewed): the rare case of a release still running, or crashed and rerun, when the
    mirror was last refreshed."""
    from pyspark.sql import functions as F

    # state: budget -> (highest seq, rows 1..highest all there, unsettled (release id, state, lease))
    def recorded(rec):
        return {b: (int(hi), True, [tuple(o[1:]) for o in rec["open"] if o[0] == b]) for b, hi in rec["hi"].items()}

    def scanned(df):
        open_ = F.when(F.col("state") != "committed",
                       F.struct("release_id", "state", F.unix_micros("lease_expires_at").alias("lease")))
        return {r[0]: (int(r[1]), _whole(r[1], r[2], r[3], r[4]), list(r[5])) for r in df.groupBy(
            "budget_id").agg(*_seq_aggs(), F.collect_list(open_)).collect()}

    def since(state):
        if not all(whole for _, whole, _ in state.values()):
            return None
        for _, _, unsettled in state.values():
            for rid, st, lease in unsettled:
                e = ledger.find(rid)
                if e is None or e.state != st or _micros(e.lease_expires_at) != lease:
                    return None
        new, heads = ledger.entries_since({b: st[0] for b, st in state.items()})
        return None if any(b not in heads or st[0] > heads[b] for b, st in state.items()) else new

    def after(state, new):
        return _entries_state({b: st[0] for b, st in state.items()},
                              [(b, *o) for b, st in state.items() for o in st[2]], new)

    return _refresh(ledger, spark, path, now, "entries", ENTRY_SCHEMA, _entry_row,
                    recorded=recorded, scanned=scanned, since=since, after=after)


def _refresh_audit(ledger: Ledger, spark, path: str, now: datetime) -> int:
    """Append the audit rows the ledger gained since the mirror's version (rewrite as above
    when the table is absent, of another schema, or has a gap or duplicate)."""

    def scanned(df):  # state: the highest seq, when rows 1..highest are all there
        r = df.agg(*_seq_aggs()).first()
        return int(r[0] or 0) if _whole(r[0], r[1], r[2], r[3]) else None

    def since(hi):
        new, head = ledger.audit_rows_since(hi)
        return None if hi > head else new

    return _refresh(ledger, spark, path, now, "audit", AUDIT_SCHEMA, _audit_row,
                    recorded=lambda rec: int(rec["hi"]), scanned=scanned, since=since,
                    after=lambda hi, new: {"hi": max(a.seq for a in new)})


def mirror_to_delta(ledger: Ledger, spark, *, ledger_path: str, audit_path: str,
                    full: bool = False) -> tuple[int, int]:
    """Bring the Delta tables at ``ledger_path`` and ``audit_path`` up to date with the ledger.

    By default (the engine after each job's releases) the cost is proportional to what changed:
    the new entries and audit rows are verified against their chains' MAC'd heads and appended;
    a table is rewritten only when it must be (see :func:`_refresh_entries`). ``full=True``
    (``rebuild-mirror``) verifies the whole ledger and rewrites both tables.

    Returns (entries written, audit rows written).
    """
    now = datetime.now(timezone.utc)
    if full:
        ledger.verify()

        def audit() -> int:
            return _overwrite(ledger, spark, "audit", audit_path, now)

        def entries() -> int:
            return _overwrite(ledger, spark, "entries", ledger_path, now)
    else:
        def audit() -> int:
            return _refresh_audit(ledger, spark, audit_path, now)

        def entries() -> int:
            return _refresh_entries(ledger, spark, ledger_path, now)

    # two independent tables: the audit mirror is written in a second thread meanwhile
    out: list[int] = []
    with alongside(lambda: out.append(audit()), name="dp_spark-audit-mirror"):
        n_entries = entries()
    return n_entries, out[0]


def _replace_damaged(spark, path: str) -> bool:
    """If a Delta table exists at ``path`` but cannot be read, delete it (a mirror is derived
    from the SQL ledger, so nothing is lost) and return True; False when it is readable or
    absent. Only local paths are deleted here; elsewhere the error says to remove it."""
    from dp_spark.errors import OutputSchemaError
    from dp_spark.delta.release_table import delta_schema

    try:
        delta_schema(spark, path)
        return False
    except OutputSchemaError:
        local = path[len("file:"):] if path.startswith("file:") else path
        if "://" in path and not path.startswith("file:"):
            raise OutputSchemaError(
                f"ledger mirror '{path}' exists but cannot be read; it is derived from the SQL ledger: "
                "remove it and rerun rebuild-mirror") from None
        import shutil

        shutil.rmtree(local)
        return True


def rebuild_mirror(env, *, spark=None, ledger: Ledger | None = None) -> tuple[int, int, list[str]]:
    """Rebuild the env's two mirror tables (``ledger_mirror``, ``audit_mirror``) from its SQL
    ledger (verified first). A mirror table whose Delta log is damaged is replaced.

    Returns (entries written, audit rows written, paths of damaged tables replaced). Never
    creates a ledger: a SQLite ledger file that does not exist is a LedgerError."""
    from dp_spark.errors import LedgerError
    from dp_spark.ledger import open_ledger, sqlite_path

    own = ledger is None
    if own:
        db = sqlite_path(env.ledger_url)
        if db is not None:
            from pathlib import Path

            if not Path(db).exists():
                raise LedgerError(f"no ledger at {db}: nothing to mirror")
            ledger = open_ledger(env.ledger_url, create=False)
        else:
            ledger = open_ledger(env.ledger_url)
    try:
        if spark is None:
            from dp_spark.spark import get_or_create_session

            spark = get_or_create_session(master=env.master, extra_conf=dict(env.spark_conf))
        ledger.verify()  # before touching the mirror: a tampered ledger is not mirrored
        replaced = [p for p in (env.ledger_mirror, env.audit_mirror) if _replace_damaged(spark, p)]
        n_entries, n_audit = mirror_to_delta(ledger, spark, ledger_path=env.ledger_mirror,
                                             audit_path=env.audit_mirror, full=True)
        return n_entries, n_audit, replaced
    finally:
        if own:
            ledger.close()


def rebuild_mirror_command(env_path: str, out, *, spark=None) -> int:
    """``dp-spark budget rebuild-mirror --env ENV``: rebuild the mirror, print what was written."""
    from dp_spark.config import load_env

    env = load_env(env_path)
    n_entries, n_audit, replaced = rebuild_mirror(env, spark=spark)
    for p in replaced:
        print(f"replaced damaged mirror table {p}", file=out)
    # (the ledger URL is not printed: a PostgreSQL URL may hold a password)
    print(f"ledger mirror rebuilt from the SQL ledger: {n_entries} entries -> {env.ledger_mirror}, "
          f"{n_audit} audit rows -> {env.audit_mirror}", file=out)
    return 0
