"""A helper of the Spark tests: how many Spark jobs a call ran (a structural check, not a timing)."""

from __future__ import annotations

import uuid


def jobs(spark, fn):
    """(fn(), number of Spark jobs it ran)."""
    sc = spark.sparkContext
    group = f"dp-spark-test-{uuid.uuid4().hex}"
    sc.setJobGroup(group, "dp_spark test")
    try:
        result = fn()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    return result, len(sc.statusTracker().getJobIdsForGroup(group))
