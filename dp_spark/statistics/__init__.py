"""Statistics of a multi-statistic release: one module per kind (see :mod:`.base`)."""

from dp_spark.statistics.base import KINDS, Clamp, StatisticSpec, align_clamp, kind_of

# the kinds' modules register themselves in KINDS on import: importing any module of this
# package runs this file first, so the registry is complete before anyone reads it
from dp_spark.statistics import counts, moments, quantile  # noqa: E402,F401

__all__ = ["KINDS", "Clamp", "StatisticSpec", "align_clamp", "kind_of"]
