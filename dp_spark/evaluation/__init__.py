"""Accuracy you can see: the epsilon explorer, utility evaluation, bound choice and charts.

* :mod:`~dp_spark.evaluation.explorer` -- expected error against budget and an assumed
  group size, and the smallest budget meeting a target (public inputs only, nothing charged);
* :mod:`~dp_spark.evaluation.utility` -- repeated noise over fixed exact partials of
  evaluation data: error, interval coverage, error by group size, clipping bias
  (EXPLORATION only: outputs are marked not publishable);
* :mod:`~dp_spark.evaluation.bounds` -- bias/variance of K and [L, U] on evaluation data,
  and a DP quantile to choose a bound from the data at a stated, returned charge;
* :mod:`~dp_spark.evaluation.charts` -- DAU trend with interval bands, AOV per region with
  error bars, the explorer chart (PNG, Agg canvas).

See docs/accuracy.md. The submodules are imported on first use (pandas and matplotlib are
loaded only by the parts that need them); nothing here imports pyspark at import time.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "explore",
    "smallest_budget",
    "evaluate",
    "trend_differences",
    "bias_variance_table",
    "dp_quantile",
    "dau_trend_chart",
    "aov_chart",
    "explorer_chart",
]

_WHERE = {
    "explore": "explorer",
    "smallest_budget": "explorer",
    "evaluate": "utility",
    "trend_differences": "utility",
    "bias_variance_table": "bounds",
    "dp_quantile": "bounds",
    "dau_trend_chart": "charts",
    "aov_chart": "charts",
    "explorer_chart": "charts",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"dp_spark.evaluation.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'dp_spark.evaluation' has no attribute {name!r}")
