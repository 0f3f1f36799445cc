"""Noise sources for tests (shared by the Spark and the end-to-end tests of one feature)."""

from __future__ import annotations

from dp_spark.mechanisms.samplers import NoiseSource


class Shift(NoiseSource):
    """Every draw is ``c`` grid units: deterministic, so two paths must publish the same
    cells, and a cell whose value is not its true value + c was not noised."""

    name = "shift"

    def __init__(self, c: int):
        self.c = c

    def discrete_laplace(self, scale, n):
        return [self.c] * n

    def discrete_gaussian(self, sigma, n):
        return [self.c] * n
