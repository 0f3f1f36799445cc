"""A Delta mirror of the ledger and the audit log, for analysts (Spark SQL).

The SQL store stays the authority: the mirror is overwritten from it, never read back to
decide a charge. Exact charges are kept as canonical JSON (``charge``); ``epsilon``,
``rho`` and ``delta`` are float copies for charts and queries. The mirror holds no data
values: the ledger and the audit log never contain any.

Only this module of dp_spark.ledger imports pyspark.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from pyspark.sql import types as T

from dp_spark.background import alongside
from dp_spark.ledger.base import Ledger, charge_text

__all__ = ["ENTRY_SCHEMA", "AUDIT_SCHEMA", "mirror_to_delta"]

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
