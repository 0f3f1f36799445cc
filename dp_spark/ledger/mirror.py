"""A Delta mirror of the ledger and the audit log, for analysts (Spark SQL).

The SQL store stays the authority: the mirror is overwritten from it, never read back to
decide a charge. Exact charges are kept as canonical JSON (``charge``); ``epsilon``,
``rho`` and ``delta`` are float copies for charts and queries. The mirror holds no data
values: the ledger and the audit log never contain any.

``dp-spark budget rebuild-mirror --env ENV`` (:func:`rebuild_mirror_command`) rebuilds both
tables from the SQL ledger on demand: after a failed refresh (the engine only logs a warning),
or when a mirror table's Delta log is damaged (a derived table: it is replaced, never repaired).

Only this module of dp_spark.ledger imports pyspark.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from pyspark.sql import types as T

from dp_spark.background import alongside
from dp_spark.ledger.base import Ledger, charge_text

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


def mirror_to_delta(ledger: Ledger, spark, *, ledger_path: str, audit_path: str) -> tuple[int, int]:
    """Overwrite the Delta tables at ``ledger_path`` and ``audit_path`` with every ledger
    entry and audit row (verified first: a tampered ledger is not mirrored).

    Returns (entries written, audit rows written).
    """
    ledger.verify()
    now = datetime.now(timezone.utc)
    entries = [
        (
            e.budget_id, e.seq, e.release_id, e.release_family, e.state, e.charge.MEASURE,
            charge_text(e.charge), _float(e.charge, "epsilon"), _float(e.charge, "rho"),
            _float(e.charge, "delta"), e.principal, e.code_version, e.created_at, e.committed_at,
            e.lease_expires_at, e.event_json, e.row_hash, now,
        )
        for e in ledger.entries()
    ]
    audit = [
        (a.seq, a.at, a.principal, a.action, a.spec_name, a.spec_version, a.decision, a.release_id,
         a.charge_json, a.detail, a.row_hash, now)
        for a in ledger.audit_rows()
    ]

    def overwrite(rows, schema, path) -> None:
        (
            spark.createDataFrame(rows, schema)
            .coalesce(1)
            .write.format("delta")
            .mode("overwrite")
            .option("overwriteSchema", "true")
            .save(path)
        )

    # two independent tables: the audit mirror is written in a second thread meanwhile
    with alongside(overwrite, audit, AUDIT_SCHEMA, audit_path, name="dp_spark-audit-mirror"):
        overwrite(entries, ENTRY_SCHEMA, ledger_path)
    return len(entries), len(audit)


def _replace_damaged(spark, path: str) -> bool:
    """If a Delta table exists at ``path`` but cannot be read, delete it (a mirror is derived
    from the SQL ledger, so nothing is lost) and return True; False when it is readable or
    absent. Only local paths are deleted here; elsewhere the error says to remove it."""
    from dp_spark.errors import OutputSchemaError
    from dp_spark.release.writer import _delta_schema

    try:
        _delta_schema(spark, path)
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
                                             audit_path=env.audit_mirror)
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
