"""Partition-aware partial aggregates (rows, distinct units, fixed-point sums) per public key.

See :mod:`dp_spark.aggregations.partials`.
"""

from dp_spark.aggregations.partials import (
    GLOBAL_KEY,
    SUM_TYPE,
    collect_partials,
    compute_partials,
)

__all__ = ["GLOBAL_KEY", "SUM_TYPE", "collect_partials", "compute_partials"]
