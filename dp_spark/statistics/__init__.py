"""Statistics of a multi-statistic release: one module per kind (see :mod:`.base`)."""

from dp_spark.statistics.base import KINDS, Clamp, StatisticSpec, align_clamp, kind_of

__all__ = ["KINDS", "Clamp", "StatisticSpec", "align_clamp", "kind_of"]
