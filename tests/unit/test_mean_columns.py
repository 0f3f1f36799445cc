"""The mean over a vector of cells publishes exactly what the per-cell post-processing on exact
Fractions publishes: the value and the interval bit for bit (both regimes of the interval, any
size of the noisy values), the large-count quantile's bisection the same for a cell alone or in
a block, and the error figures equal to the estimator evaluated at every pair of noise nodes."""

from __future__ import annotations

import os
from fractions import Fraction

import numpy as np
import pytest

from dp_spark.mechanisms import accuracy
from dp_spark.mechanisms import mean as mean_mod
from dp_spark.mechanisms.mean import (mean_cell_accuracy, mean_cell_accuracy_columns, mean_error_quantile,
                                      mean_error_quantiles)
from dp_spark.mechanisms.samplers import SeededNoiseSource
from dp_spark.statistics import moments
from dp_spark.statistics.base import kind_of
from dp_spark.statistics.noise import law_nodes
from tests.unit.reference_errors import plugin_error

FIELDS = ("value", "ci_low", "ci_high")
#: (lower, upper, sum grid exponent): integer bounds, dyadic bounds, a bound snapped to 2^-19
BOUNDS = [(-10, 100, -8), (0, 500, -4), (Fraction(1, 8), Fraction(3), -12), (0, Fraction(157287, 2**19), -20)]
LAWS = [("discrete_gaussian", 300.0, 7.0), ("discrete_laplace", 50.0, 3.0), ("discrete_gaussian", 40.0, 1.5)]


@pytest.fixture(autouse=True)
def _test_mode(monkeypatch):
    monkeypatch.setenv("DP_SPARK_TEST_MODE", "1")


def _per_cell(s, c, k, lo, hi, floor, alpha, mech, t_s, t_c):
    mid = (Fraction(lo) + Fraction(hi)) / 2
    unit = Fraction(2) ** k
    out = []
    for i in range(len(s)):
        want = mean_cell_accuracy(Fraction(int(s[i])) * unit, Fraction(int(c[i])), mid, lo, hi, floor, alpha,
                                  mechanism=mech, sum_scale=t_s, sum_unit=unit, count_scale=t_c)
        out.append([float(want[f]) for f in FIELDS])
    return out


def _cells(rng, lo, hi, k, n):
    """Noisy counts from negative to large (both interval regimes) and sums around the clamp range."""
    c = np.concatenate([rng.integers(-20, 40, n // 2), rng.integers(0, 5000, n - n // 2)]).astype(np.int64)
    w = float(Fraction(hi) - Fraction(lo)) / 2
    s = np.array([int(rng.uniform(-1.2, 1.2) * w * max(int(x), 1) / 2.0 ** k) + int(rng.integers(-500, 500))
                  for x in c], dtype=np.int64)
    return s, c


@pytest.mark.parametrize("law", LAWS)
@pytest.mark.parametrize("bounds", BOUNDS)
def test_value_and_interval_equal_the_per_cell_fractions(law, bounds):
    mech, t_s, t_c = law
    lo, hi, k = bounds
    rng = np.random.default_rng(7)  # test data only, never noise
    regimes = set()
    for floor in (1, 5):
        for alpha in (0.5, 0.05, 0.01):
            s, c = _cells(rng, lo, hi, k, 60)
            got = mean_cell_accuracy_columns(s, c, k, (Fraction(lo) + Fraction(hi)) / 2, lo, hi, floor, alpha,
                                             mechanism=mech, sum_scale=t_s, count_scale=t_c)
            want = _per_cell(s, c, k, lo, hi, floor, alpha, mech, t_s, t_c)
            assert [[got[f][i] for f in FIELDS] for i in range(len(s))] == want
            g = accuracy.noise_halfwidth(mech, t_c, min(alpha, 0.05))
            regimes |= {bool(x - g >= floor and 10 * g <= x) for x in c.tolist()}
    assert regimes == {True, False}  # both the union bound and the large-count interval were compared


@pytest.mark.parametrize("k", [-8, -30])
def test_values_beyond_2_53_are_exact_too(k):
    """Sums and counts whose products leave the doubles' exact integers take Python integers:
    still the Fractions' floats; beyond 2^62 the caller's per-cell path."""
    c = np.array([3, 10**6, 2**40, 2**61, -5, 7, 2**55], dtype=np.int64)
    s = np.array([2**60, -(2**61), 2**59 + 12345, 2**61, 5, -(2**55), 3], dtype=np.int64)
    for lo, hi in [(-10, 100), (0, Fraction(157287, 2**19))]:
        mid = (Fraction(lo) + Fraction(hi)) / 2
        got = mean_cell_accuracy_columns(s, c, k, mid, lo, hi, 2, 0.05, mechanism="discrete_gaussian",
                                         sum_scale=300.0, count_scale=7.0)
        want = _per_cell(s, c, k, lo, hi, 2, 0.05, "discrete_gaussian", 300.0, 7.0)
        assert [[got[f][i] for f in FIELDS] for i in range(len(s))] == want
    huge = np.array([2**62], dtype=np.int64)
    assert mean_cell_accuracy_columns(huge, huge, k, 0, -1, 1, 1, 0.05, mechanism="discrete_gaussian",
                                      sum_scale=300.0, count_scale=7.0) is None
    # bounds that are no dyadic rationals (a direct call; a spec's are snapped): the per-cell path
    assert mean_cell_accuracy_columns(s, c, k, Fraction(1, 6), 0, Fraction(1, 3), 1, 0.05,
                                      mechanism="discrete_gaussian", sum_scale=300.0, count_scale=7.0) is None


def test_a_double_rounding_would_be_caught():
    """The comparison above can fail: the value rounded twice (mid and s / n apart) differs from
    the Fraction's float in some cells of this very input."""
    rng = np.random.default_rng(7)
    lo, hi, k = BOUNDS[3]
    s, c = _cells(rng, lo, hi, k, 400)
    want = _per_cell(s, c, k, lo, hi, 1, 0.05, "discrete_gaussian", 300.0, 7.0)
    mid = float((Fraction(lo) + Fraction(hi)) / 2)
    twice = [min(max(mid + float(Fraction(int(x)) * Fraction(2) ** k / max(int(y), 1)), float(lo)), float(hi))
             for x, y in zip(s, c)]
    assert twice != [w[0] for w in want]


@pytest.mark.parametrize("mech,t_s,t_c", LAWS)
def test_the_bisection_is_the_same_alone_or_in_a_block(mech, t_s, t_c, monkeypatch):
    d = np.random.default_rng(1).uniform(0, 200, 40)
    d[:3] = [0.0, 1e-9, 150.0]
    kw = dict(mechanism=mech, sum_scale=t_s, sum_unit=2.0 ** -10, count_scale=t_c)
    block = mean_error_quantiles(0.05, d, **kw)
    assert [mean_error_quantile(0.05, x, **kw) for x in d] == block.tolist()
    monkeypatch.setattr(mean_mod, "_QUANTILE_BLOCK", 1)  # one cell per block
    assert mean_error_quantiles(0.05, d, **kw).tolist() == block.tolist()
    # each is the smallest covering h to the tolerance: covered at h, not at h (1 - 2e-7)
    for x, h in zip(d[3:8], block[3:8]):
        cover = mean_mod._linear_coverage(np.array([h, h * (1 - 2e-7)]), np.array([x, x]), mech, t_s, 2.0 ** -10, t_c)
        assert cover[0] >= 0.95 > cover[1]


MEAN = {"name": "avg", "kind": "mean", "column": "v", "lower": 0, "upper": 500, "min_count": 3}


def plan_40_cells(measure, statistics=(MEAN,)):
    """A plan of ``statistics`` over 40 public keys (shared with tests/unit/test_spread_columns.py)."""
    from dp_spark.config import release_spec_from_dict
    from dp_spark.statistics.plan import plan_query

    budget = {"id": "b", "measure": measure, **({"rho": 0.5} if measure == "zcdp" else {"epsilon": 1})}
    return plan_query(release_spec_from_dict({
        "name": "m", "dataset": "x", "privacy_unit": {"kind": "user", "column": "user_id"},
        "group_by": [{"column": "p", "public_keys": {"values": [str(i) for i in range(40)]}}],
        "bounds": {"max_rows_per_unit": 3, "max_partitions_per_unit": 2},
        "statistics": list(statistics), "budget": budget, "max_cells": 1000}, "m.yaml"))


def partials_40_cells(plan, seed):
    """Partials of 40 cells, 20 small (0-19 rows) and 20 large (500-4,999 rows): test data only."""
    rng = np.random.default_rng(seed)
    partials = {}
    for i in range(40):
        rows = int(rng.integers(0, 20)) if i < 20 else int(rng.integers(500, 5000))
        partials[i] = {"dp_rows": rows, "dp_units": rows}
        for comp in plan.components:
            if comp.clamp is not None:
                partials[i].update({f"{comp.sum_alias}_lo": int(rng.integers(0, 2**21)),
                                    f"{comp.sum_alias}_mid": int(rng.integers(0, rows + 1)),
                                    f"{comp.sum_alias}_hi": 0})
    return partials


def assert_equal_to_the_per_cell_finish(plan, partials, seed):
    """QueryPlan.noise equal, field by field, to every statistic's per-cell finish on exact
    Fractions from the same draws."""
    from tests.unit.test_vector_noise import _per_cell as reference

    got = plan.noise(partials, SeededNoiseSource(seed))
    want = reference(plan, partials, seed)
    assert len(got) == len(want) == 40 * len(plan.spec.statistics)
    for g, w in zip(got, want):
        assert {k: v for k, v in g.items() if k != "keys"} == w
        assert all(type(v) is not np.float64 for v in g.values())


@pytest.mark.parametrize("measure", ["zcdp", "pure_dp"])
def test_error_figures_equal_the_estimator_on_every_pair_of_nodes(measure):
    plan = plan_40_cells(measure)
    stat, comps = plan.spec.statistics[0], plan.stat_components[0]
    by = {c.kind: c for c in comps}
    pc, ps = plan.plan_of(by["rows"]), plan.plan_of(by["nsum"])
    cl, floor = stat.clamp, 3
    rng = np.random.default_rng(3)
    values = rng.uniform(0, 500, 200)
    values[:4] = [0.0, 500.0, 250.0, 1e-3]
    counts = np.concatenate([rng.integers(-20, 30, 100), rng.integers(0, 3000, 100)]).astype(np.float64)
    got_e, got_r = moments.mean_error_columns(values, counts, cl, floor, pc, ps)
    mid = float(cl.midpoint)
    for v, c, e, r in zip(values, counts, got_e, got_r):
        n = max(c, float(floor))
        s_hat = (v - mid) * n

        def estimate(e_c, e_s, s_hat=s_hat, n=n):
            return np.clip(mid + (s_hat + e_s) / np.maximum(n + e_c, floor), 0.0, 500.0)

        want_e, want_r = plugin_error(estimate, v, [law_nodes(pc, 80), law_nodes(ps, 80)])
        assert e == pytest.approx(want_e, rel=1e-10, abs=1e-12)
        assert r == pytest.approx(want_r, rel=1e-10, abs=1e-12)
    # one cell alone is the same bits as in the block (the per-cell finish and the columns agree)
    assert [moments.mean_error(float(v), float(c), cl, floor, pc, ps) for v, c in zip(values[:20], counts[:20])] \
        == list(zip(got_e[:20].tolist(), got_r[:20].tolist()))


@pytest.mark.parametrize("measure", ["zcdp", "pure_dp"])
def test_the_release_takes_the_vector_path_and_publishes_the_per_cell_cells(measure):
    """QueryPlan.noise_columns over mean cells of small and large counts: every field equal to
    the per-cell finish on exact Fractions from the same draws, and the mean vectorised."""
    plan = plan_40_cells(measure)
    stat, comps = plan.spec.statistics[0], plan.stat_components[0]
    plans = {c: plan.plan_of(c) for c in comps}
    grids = {c: np.array([0, 5], dtype=np.int64) for c in comps}
    assert kind_of("mean").finish_columns(stat, grids, plans, Fraction(1, 20)) is not None
    assert_equal_to_the_per_cell_finish(plan, partials_40_cells(plan, 11), 5)
    assert os.environ["DP_SPARK_TEST_MODE"] == "1"
