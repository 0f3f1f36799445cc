"""Reference computations the tests hold the engine's faster ones to (not shipped)."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np


def plugin_error(estimate: Callable[..., np.ndarray], truth: float, laws: list) -> tuple[float, float]:
    """(E|estimate - truth|, sqrt(E (estimate - truth)^2)) when the noises are independent
    with the discretised ``laws`` (``dp_spark.statistics.noise.law_nodes``): ``estimate(*noises)``
    evaluated at every combination of their nodes (numpy broadcasting), the definition the
    engine's mean and variance figures (``moments.mean_error_columns``,
    ``moments.spread_error_columns``: clamped lines summed from prefix sums) are held to."""
    axes = len(laws)
    grids, weight = [], np.ones((1,) * axes)
    for i, (x, p) in enumerate(laws):
        shape = [1] * axes
        shape[i] = len(x)
        grids.append(np.asarray(x).reshape(shape))
        weight = weight * np.asarray(p).reshape(shape)
    err = np.asarray(estimate(*grids), dtype=np.float64) - truth
    err = np.broadcast_to(err, weight.shape)
    return float(np.sum(weight * np.abs(err))), math.sqrt(float(np.sum(weight * err * err)))
