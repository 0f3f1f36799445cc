"""The binary-tree mechanism's error matches its analytic law (slow, seeded exact samplers).

2,000 seeded runs of a 365-day stream (distinct units ever seen, pure DP epsilon 1: discrete
Laplace of scale 9 on each of the 724 nodes; and a sum under zCDP: discrete Gaussian), each
drawing its node noises ONCE (:func:`tree.draw_node_noise`) and publishing the running totals
through :func:`tree.released_prefixes`. At days 1, 2, 30, 64, 65, 127, 128, 200, 364, 365:

* the empirical variance of the error S~_t - S_t is the analytic popcount(t) x Var(node) within
  4 standard errors (the standard error from the sample's fourth moment);
* the empirical variance of the error's change between two days (t1, t2) is |nodes(t1) xor
  nodes(t2)| x Var(node) within 4 standard errors: the joint law, which is what storing each
  node's noise once buys (64 -> 65 shares node (6, 0): one node's variance, not three).

The can-fail check: the same test on a variant that redraws a node's noise every time a point
reads it (the noise mapping draws afresh per lookup) fails it: the points' variances alone
still match, but the changes between days are 3x (64 -> 65) too noisy, and the check says so.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Callable, Mapping

import numpy as np
import pytest

from dp_spark.core.budget import PureDP, ZCDP
from dp_spark.mechanisms import tree
from dp_spark.mechanisms.samplers import SeededNoiseSource

pytestmark = pytest.mark.slow

HORIZON, REPS = 365, 2000
DAYS = (1, 2, 30, 64, 65, 127, 128, 200, 364, 365)
PAIRS = ((64, 65), (1, 2), (127, 128), (364, 365), (30, 200))
Z = 4.0


@pytest.fixture(autouse=True)
def _test_mode(monkeypatch):
    monkeypatch.setenv("DP_SPARK_TEST_MODE", "1")


def _increments(n: int) -> list[int]:
    return [(7 * d) % 23 for d in range(n)]  # any truth: the error does not depend on it


def _within(sample: np.ndarray, expected: float) -> bool:
    """sample variance (mean known: 0) within Z standard errors of ``expected``."""
    sq = sample.astype(np.float64) ** 2
    se = math.sqrt(sq.var(ddof=1) / len(sq))
    return abs(sq.mean() - expected) <= Z * se


def check(errors: np.ndarray, cal: tree.TreeCalibration) -> list[str]:
    """The failures of the analytic law (``errors[r, i]``: run r's error at DAYS[i])."""
    var = cal.node_variance
    out = []
    for i, t in enumerate(DAYS):
        if not _within(errors[:, i], tree.point_variance(t, cal)):
            out.append(f"day {t}: variance")
    for t1, t2 in PAIRS:
        shared = set(tree.prefix_nodes(t1, HORIZON)) ^ set(tree.prefix_nodes(t2, HORIZON))
        diff = errors[:, DAYS.index(t2)] - errors[:, DAYS.index(t1)]
        if not _within(diff, len(shared) * var):
            out.append(f"days {t1}->{t2}: variance of the change")
    return out


def simulate(cal: tree.TreeCalibration, noise_of: Callable[[SeededNoiseSource], Mapping]) -> np.ndarray:
    xs = _increments(HORIZON)
    truth = np.cumsum(xs)
    src = SeededNoiseSource(20261206)
    out = np.empty((REPS, len(DAYS)), dtype=np.int64)
    true_nodes = tree.node_values(xs, HORIZON)
    for r in range(REPS):
        noise = noise_of(src)
        out[r] = [tree.released_prefix(t, true_nodes, noise, HORIZON) - truth[t - 1] for t in DAYS]
    return out


class RedrawnPerQuery(Mapping):
    """The broken variant: every lookup of a node draws its noise afresh."""

    def __init__(self, cal: tree.TreeCalibration, src: SeededNoiseSource) -> None:
        self.cal, self.src = cal, src

    def __getitem__(self, node):
        return self.src.draw(self.cal.mechanism, self.cal.scale, 1)[0]

    def __iter__(self):
        return iter(tree.tree_nodes(self.cal.horizon))

    def __len__(self) -> int:
        return len(tree.tree_nodes(self.cal.horizon))


CALS = {
    "distinct_units_pure": lambda: tree.calibrate(HORIZON, tree.distinct_units_contribution(), PureDP(1)),
    "sum_zcdp": lambda: tree.calibrate(HORIZON, tree.StreamContribution(max_days=3, per_day=4),
                                       ZCDP(Fraction(1, 2))),
}


@pytest.mark.parametrize("name", sorted(CALS))
def test_error_matches_the_analytic_law(name):
    cal = CALS[name]()
    errors = simulate(cal, lambda src: tree.draw_node_noise(cal, source=src))
    assert check(errors, cal) == []


@pytest.mark.parametrize("name", sorted(CALS))
def test_redrawing_a_nodes_noise_per_query_fails_the_check(name):
    cal = CALS[name]()
    errors = simulate(cal, lambda src: RedrawnPerQuery(cal, src))
    failures = check(errors, cal)
    assert "days 64->65: variance of the change" in failures
    assert not any(f.endswith(": variance") for f in failures)  # pointwise alone would not see it
