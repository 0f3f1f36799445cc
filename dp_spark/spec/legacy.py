"""The single-``metric`` form, rewritten into the ``statistics`` form when a spec is read.

A spec written with ``metric``, ``group_by`` (one mapping), ``value`` and ``mean`` publishes
what :func:`legacy_statistics` says, under the names it always published, through the one
engine path. The spec keeps what it declared (``ReleaseSpec.metric``, ``group_by``, ``value``,
``mean``) so that its canonical form, and so its release ids, stay what they always were
(``tests/unit/golden_release_ids.json``).
"""

from __future__ import annotations

from typing import Optional

from dp_spark.spec.runtime import MeanOptions, ValueSpec
from dp_spark.statistics.base import StatisticSpec, align_clamp
from dp_spark.statistics.moments import DEFAULT_GROUP_SIZE

__all__ = ["legacy_statistics", "METRICS"]

#: the metrics of the single-``metric`` form
METRICS = ("count", "distinct_units", "sum", "mean")


def legacy_statistics(metric: str, value: Optional[ValueSpec], mean: Optional[MeanOptions]) -> tuple[StatisticSpec, ...]:
    """The ``statistics`` a single-``metric`` spec is rewritten into (what it publishes, under
    the names it always published): ``count`` -> a count; ``distinct_units`` -> a distinct
    count of units; ``sum`` -> a sum of ``value``; ``mean`` -> a count and a mean of ``value``
    (one noisy row count, shared), with the mean's options."""
    n = mean.assumed_group_size if mean is not None else DEFAULT_GROUP_SIZE
    size = (("assumed_group_size", n),)
    if metric in ("count", "distinct_units"):
        return (StatisticSpec(name=metric, kind=metric, options=size),)
    clamp = align_clamp(value.column, value.declared_lower, value.declared_upper)
    if metric == "sum":
        return (StatisticSpec(name="sum", kind="sum", clamp=clamp, options=size),)
    opts = {"assumed_group_size": n, "min_count": mean.min_count,
            **({} if mean.assumed_mean is None else {"assumed_mean": mean.assumed_mean})}
    return (StatisticSpec(name="count", kind="count", options=size),
            StatisticSpec(name="mean", kind="mean", clamp=clamp, options=tuple(sorted(opts.items()))))
