"""Delta release tables: schema, atomic insert-if-absent by release id, reads, snapshots.

One Delta table per release family under the env's output root. A release is written by a
single ``MERGE`` (one Delta commit): the cells of a release id are inserted only when no row
of that release id exists, so a rerun, a retry or a concurrent winner adds nothing, and the
MERGE's metrics tell the writer whether its own cells are the ones that landed.
Only SQL and DataFrame APIs are used (no RDD, no JVM access), so this runs on Spark Connect.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Optional

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dp_spark.errors import OutputSchemaError, SchemaError

RELEASE_SCHEMA = T.StructType(
    [
        T.StructField("release_id", T.StringType(), False),
        T.StructField("release_family", T.StringType(), False),
        T.StructField("release_name", T.StringType(), False),
        T.StructField("spec_version", T.StringType(), False),
        T.StructField("mode", T.StringType(), False),  # official | exploration
        T.StructField("statistic", T.StringType(), False),  # count | distinct_units | sum | mean
        T.StructField("key_column", T.StringType(), True),
        T.StructField("key", T.StringType(), False),
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


def pin_snapshot(spark: SparkSession, location: str) -> Snapshot:
    """Read the table's id and current version from its Delta log (metadata only)."""
    try:
        detail = spark.sql(f"DESCRIBE DETAIL {_sql_ref(location)}").select("id", "format").first()
        hist = spark.sql(f"DESCRIBE HISTORY {_sql_ref(location)} LIMIT 1").select("version").first()
    except Exception as exc:  # AnalysisException and friends: name the location, no data
        raise SchemaError(f"input '{location}' is not a readable Delta table ({type(exc).__name__})") from None
    if detail is None or detail["format"] != "delta" or hist is None:
        raise SchemaError(f"input '{location}' is not a Delta table")
    return Snapshot(location=location, table_id=str(detail["id"]), version=int(hist["version"]))


def _delta_schema(spark: SparkSession, location: str) -> Optional[T.StructType]:
    """The schema of the Delta table at ``location``, or None when there is none.

    For a path this resolves the table's (cached) Delta log without running a Spark job
    (milliseconds); a catalog name is checked with ``DESCRIBE DETAIL``.
    """
    try:
        if _is_path(location):
            return spark.read.format("delta").load(location).schema
        if spark.sql(f"DESCRIBE DETAIL {_sql_ref(location)}").select("format").first()["format"] != "delta":
            return None
        return spark.read.table(location).schema
    except Exception:
        return None


def table_exists(spark: SparkSession, path: str) -> bool:
    return _delta_schema(spark, path) is not None


def ensure_release_table(spark: SparkSession, path: str) -> None:
    """Create the family's table if absent; refuse an existing table with another schema.

    Runs before any budget is reserved, so a schema clash charges nothing.
    """
    existing = _delta_schema(spark, path)
    if existing is not None:
        want = {(f.name, f.dataType.simpleString()) for f in RELEASE_SCHEMA.fields}
        have = {(f.name, f.dataType.simpleString()) for f in existing.fields}
        if want != have:
            missing = sorted(n for n, _ in want - have)
            raise OutputSchemaError(
                f"output table '{path}' exists with another schema (differs in: {missing[:5]}); "
                "choose another output_root or migrate the table"
            )
        return
    empty = spark.createDataFrame([], RELEASE_SCHEMA)
    try:
        empty.write.format("delta").mode("ignore").save(path)
    except Exception:
        # A concurrent run created it first: fine if the schema matches.
        if not table_exists(spark, path):
            raise
        ensure_release_table(spark, path)


def write_release(spark: SparkSession, path: str, rows: list[dict[str, Any]]) -> int:
    """Insert the release's cells unless cells of its release id already exist (one commit).

    Returns the number of rows inserted (from the MERGE's metrics): ``len(rows)``, or 0 when
    the release id was already present. (A Delta idempotent append keyed by the release id
    would be ~0.3 s cheaper, but it cannot tell its caller whether its rows or an earlier
    writer's landed; the MERGE's metrics can, and the engine relies on that.)
    """
    if not rows:
        raise ValueError("a release has at least one cell")
    if len({r["release_id"] for r in rows}) != 1:
        raise ValueError("a release write holds the cells of one release id")
    src = spark.createDataFrame([tuple(r[f.name] for f in RELEASE_SCHEMA.fields) for r in rows], RELEASE_SCHEMA)
    view = f"__dp_release_src_{uuid.uuid4().hex}"
    src.createOrReplaceTempView(view)
    try:
        metrics = spark.sql(
            f"""
            MERGE INTO {_sql_ref(path)} AS t
            USING {view} AS s
            ON t.release_id = s.release_id
            WHEN NOT MATCHED THEN INSERT *
            """
        ).first()
    finally:
        spark.catalog.dropTempView(view)
    return _inserted(metrics, expected=len(rows))


def _inserted(metrics, *, expected: int) -> int:
    """Rows a MERGE inserted, from its result row; checked to be 0 or ``expected``."""
    try:
        n = int(metrics["num_inserted_rows"])
    except (TypeError, KeyError, ValueError):
        raise SchemaError("the Delta MERGE returned no insert metrics; upgrade delta-spark") from None
    if n not in (0, expected):
        raise SchemaError(f"a release MERGE inserted {n} of {expected} cells")
    return n


def read_release(spark: SparkSession, path: str, release_id: str) -> list[dict[str, Any]]:
    """The cells of one release id, ordered by (statistic, key); [] when there are none."""
    if _delta_schema(spark, path) is None:
        return []
    df = spark.read.format("delta").load(path).where(F.col("release_id") == release_id)
    return [r.asDict() for r in df.orderBy("statistic", "key").collect()]


def release_present(spark: SparkSession, path: str, release_id: str) -> bool:
    if _delta_schema(spark, path) is None:
        return False
    df = spark.read.format("delta").load(path).where(F.col("release_id") == release_id)
    return len(df.select("release_id").limit(1).collect()) > 0


def latest_release_id(spark: SparkSession, path: str, family: str, exclude: Optional[str] = None) -> Optional[str]:
    if _delta_schema(spark, path) is None:
        return None
    df = spark.read.format("delta").load(path).where(F.col("release_family") == family)
    if exclude:
        df = df.where(F.col("release_id") != exclude)
    row = df.groupBy("release_id").agg(F.max("created_at").alias("t")).orderBy(F.col("t").desc()).first()
    return None if row is None else row["release_id"]
