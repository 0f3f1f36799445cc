"""The warm-up job of .ci/cds.sh: a local session with Delta that writes, appends to, reads,
aggregates and joins a small Delta table, then stops and waits for its JVM to exit, so that the JVM's dynamic class-data
sharing archive (-XX:ArchiveClassesAtExit) holds the classes a test's Spark job loads. Prints
nothing a test reads; its exit status says whether the work ran."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyspark import SparkContext  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from dp_spark.spark import get_or_create_session  # noqa: E402


def main() -> int:
    spark = get_or_create_session("dp_spark-cds-warmup", master="local[2]")
    try:
        with tempfile.TemporaryDirectory(prefix="dp_spark_cds_") as tmp:
            path = f"{tmp}/t"
            rows = spark.range(2000).select(
                F.col("id"), (F.col("id") % 13).cast("string").alias("k"), (F.col("id") * 0.5).alias("v"),
                F.to_date(F.lit("2026-11-01")).alias("day"))
            rows.write.format("delta").save(path)
            rows.limit(10).write.format("delta").mode("append").option("txnAppId", "w").option("txnVersion", 1).save(path)
            df = spark.read.format("delta").load(path)
            keys = spark.createDataFrame([(str(i), i) for i in range(13)], "k string, idx long")
            agg = (df.join(F.broadcast(keys), "k").groupBy("idx")
                   .agg(F.countDistinct("id"), F.sum("v"), F.count(F.lit(1))))
            agg.toArrow()
            agg.orderBy("idx").collect()
            spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
    finally:
        proc = getattr(SparkContext._gateway, "proc", None)
        spark.stop()
    # the JVM writes the archive as it exits, once its stdin closes: wait for that here (the
    # caller reads the archive as soon as this process ends)
    if proc is not None:
        proc.stdin.close()
        proc.wait(timeout=240)
    return 0


if __name__ == "__main__":
    sys.exit(main())
