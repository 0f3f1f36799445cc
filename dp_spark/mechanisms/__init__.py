"""Mechanisms: exact noise sources, calibration, accuracy and the fixed-point grid.

* :mod:`.samplers`    -- the only source of noise (OpenDP exact samplers; a seeded test source);
* :mod:`.calibration` -- scales and sigmas from budgets and sensitivities (and inverses);
* :mod:`.accuracy`    -- exact stddev and confidence half-widths of the noise (grid units);
* :mod:`.grid`        -- the data-independent fixed-point grid 2^k.

This package adds the small "mechanism path" used by the engine and by the DP tests:
:func:`add_noise` draws ONE vector of noise for the whole public key set (a fixed number of
draws per release, RELIABILITY 4) and adds it to the true values in grid units;
:func:`release_on_grid` does the same from real values and returns exact grid values.
See docs/noise.md. Nothing here imports pyspark.
"""

from __future__ import annotations

import operator
from fractions import Fraction
from typing import Iterable, Sequence

from dp_spark.errors import ConfigError
from dp_spark.core.grid import (
    GRID_DEFAULT_EXPONENT,
    GRID_FINEST_EXPONENT,
    from_grid,
    grid_exponent_for,
    on_grid,
    to_grid,
)
from dp_spark.mechanisms.samplers import (
    DISCRETE_GAUSSIAN,
    DISCRETE_LAPLACE,
    KINDS,
    NoiseCall,
    NoiseSource,
    OpenDPNoiseSource,
    RecordingNoiseSource,
    SeededNoiseSource,
    default_source,
)

__all__ = [
    "DISCRETE_GAUSSIAN",
    "DISCRETE_LAPLACE",
    "KINDS",
    "GRID_DEFAULT_EXPONENT",
    "GRID_FINEST_EXPONENT",
    "NoiseCall",
    "NoiseSource",
    "OpenDPNoiseSource",
    "RecordingNoiseSource",
    "SeededNoiseSource",
    "default_source",
    "grid_exponent_for",
    "to_grid",
    "from_grid",
    "on_grid",
    "add_noise",
    "release_on_grid",
]


def add_noise(
    mechanism: str,
    true_grid_values: Sequence[int],
    scale: Fraction,
    *,
    source: NoiseSource | None = None,
) -> list[int]:
    """true + noise, in grid units, with one vector draw of len(true_grid_values) values.

    ``mechanism`` is "discrete_laplace" (``scale`` = the calibrated scale in grid units) or
    "discrete_gaussian" (``scale`` = sigma in grid units). ``source`` defaults to
    :func:`default_source` (production). The scale is validated before anything is drawn;
    the number of draws depends only on the length of the (public) key set.

    Privacy contract: if the true vectors of neighbouring inputs differ by at most the
    sensitivity the scale was calibrated for (L1 for Laplace, L2 for Gaussian, in grid
    units), the output is epsilon-DP / rho-zCDP as calibrated.
    """
    if mechanism not in KINDS:
        raise ConfigError(f"unknown mechanism {mechanism!r}; expected one of {list(KINDS)}")
    src = default_source() if source is None else source
    try:
        values = [operator.index(v) for v in true_grid_values]
    except TypeError:
        raise ConfigError("true values on the grid must be integers") from None
    for v in true_grid_values:
        if isinstance(v, bool):
            raise ConfigError("true values on the grid must be integers, not booleans")
    noise = src.draw(mechanism, scale, len(values))
    return [v + z for v, z in zip(values, noise)]


def release_on_grid(
    mechanism: str,
    true_values: Iterable[int | float | Fraction],
    scale: Fraction,
    k: int,
    *,
    source: NoiseSource | None = None,
) -> list[Fraction]:
    """Real true values -> exact released values on the grid 2^k (round half to even first).

    Every returned value v satisfies v * 2^-k in Z, whatever the true values (0, 1, 2^40 ...).
    ``scale`` is in grid units.
    """
    grid_values = [to_grid(v, k) for v in true_values]
    return [from_grid(n, k) for n in add_noise(mechanism, grid_values, scale, source=source)]
