"""The variance and standard deviation over a vector of cells publish exactly what their per-cell
post-processing publishes (the same float operations on vectors; the per-cell path is one cell
of them), the box interval is the scalar one, and the variance's error figures equal the
estimator evaluated at every triple of noise nodes (the sum over the squares' noise in closed
form: a clamped line)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from dp_spark.statistics import moments
from dp_spark.statistics.base import kind_of
from dp_spark.statistics.noise import law_nodes
from tests.unit.reference_errors import plugin_error
from tests.unit.test_mean_columns import assert_equal_to_the_per_cell_finish, partials_40_cells, plan_40_cells


@pytest.fixture(autouse=True)
def _test_mode(monkeypatch):
    monkeypatch.setenv("DP_SPARK_TEST_MODE", "1")


SPREAD = ({"name": "var", "kind": "variance", "column": "v", "lower": 0, "upper": 500},
          {"name": "sd", "kind": "stddev", "column": "v", "lower": 0, "upper": 500, "min_count": 3})


def _plan(measure):
    return plan_40_cells(measure, SPREAD)


@pytest.mark.parametrize("measure", ["zcdp", "pure_dp"])
@pytest.mark.parametrize("seed", [1, 2])
def test_the_release_takes_the_vector_path_and_publishes_the_per_cell_cells(measure, seed):
    plan = _plan(measure)
    for stat, comps in zip(plan.spec.statistics, plan.stat_components):
        plans = {c: plan.plan_of(c) for c in comps}
        grids = {c: np.array([0, 5], dtype=np.int64) for c in comps}
        assert kind_of(stat.kind).finish_columns(stat, grids, plans, Fraction(1, 20)) is not None
        assert kind_of(stat.kind).finish_columns(stat, {c: g.astype(object) for c, g in grids.items()}, plans,
                                                 Fraction(1, 20)) is None
    assert_equal_to_the_per_cell_finish(plan, partials_40_cells(plan, seed), seed)


def _box_reference(c, h_c, s, h_s, q, h_q, w, e):
    """The scalar box of the module docstring, written out per cell (the previous code)."""
    s_lo, s_hi, q_lo, q_hi = s - h_s, s + h_s, q - h_q, q + h_q
    top = w * w
    n_lo = max(math.ceil(c - h_c), 1, math.ceil(max(s_lo, -s_hi, 0.0) / w), math.ceil(max(q_lo, -q_hi, 0.0) / e))
    n_hi = math.floor(c + h_c)
    if n_hi < n_lo:
        return 0.0, top
    near = min(max(0.0, s_lo), s_hi)
    far = max(abs(s_lo), abs(s_hi))

    def var(n, qq, ss):
        return qq / n + top / 2 - (ss / n) ** 2

    ends = {n_lo, n_hi}
    if near != 0 and q_hi > 0:
        m = 2 * near * near / q_hi
        ends |= {min(max(math.floor(m), n_lo), n_hi), min(max(math.ceil(m), n_lo), n_hi)}
    hi = max(var(n, q_hi, near) for n in ends)
    lo = min(var(n, q_lo, far) for n in (n_lo, n_hi))
    return min(max(lo, 0.0), top), min(max(hi, 0.0), top)


def test_the_box_over_vectors_is_the_scalar_box():
    rng = np.random.default_rng(4)
    w, e = 250.0, 250.0 ** 2
    c = np.concatenate([rng.uniform(-30, 30, 300), rng.uniform(0, 5000, 300)]).round()
    s = rng.uniform(-1.5, 1.5, 600) * w * np.maximum(c, 1)
    q = rng.uniform(-0.7, 0.7, 600) * e * np.maximum(c, 1)
    for h_c, h_s, h_q in ((3, 400.0, 9e4), (40, 5e3, 2e6), (0, 0.0, 0.0)):
        lo, hi = moments.variance_box_columns(c, h_c, s, h_s, q, h_q, w, e)
        for i in range(c.size):
            want = _box_reference(float(c[i]), h_c, float(s[i]), h_s, float(q[i]), h_q, w, e)
            assert (lo[i], hi[i]) == pytest.approx(want, rel=1e-13, abs=1e-9)
            assert moments.variance_box(float(c[i]), h_c, float(s[i]), h_s, float(q[i]), h_q, w, e) == (lo[i], hi[i])


@pytest.mark.parametrize("measure", ["zcdp", "pure_dp"])
def test_variance_figures_equal_the_estimator_on_every_triple_of_nodes(measure):
    plan = _plan(measure)
    stat, comps = plan.spec.statistics[0], plan.stat_components[0]
    by = {c.kind: c for c in comps}
    pc, ps, pq = (plan.plan_of(by[k]) for k in ("rows", "nsum", "nsumsq"))
    w, floor = float(stat.clamp.half_width), 1.0
    rng = np.random.default_rng(5)
    c = np.concatenate([rng.integers(-10, 30, 40), rng.integers(0, 3000, 40)]).astype(np.float64)
    s = rng.uniform(-1.2, 1.2, 80) * w * np.maximum(c, 1)
    q = rng.uniform(-0.8, 0.8, 80) * w * w * np.maximum(c, 1)
    got_e, got_r = moments.spread_error_columns(c, s, q, w, floor, pc, ps, pq)
    top = w * w
    laws = [law_nodes(p, moments._SPREAD_NODES) for p in (pc, ps, pq)]
    for i in range(c.size):
        n = max(c[i], floor)
        m1 = min(max(s[i] / n, -w), w)
        m2 = min(max(q[i] / n + top / 2, 0.0), top)
        s_hat, q_hat = m1 * n, (m2 - top / 2) * n
        truth = float(moments._variance(n, s_hat, q_hat, w, floor))

        def estimate(e_c, e_s, e_q, n=n, s_hat=s_hat, q_hat=q_hat):
            return moments._variance(n + e_c, s_hat + e_s, q_hat + e_q, w, floor)

        want_e, want_r = plugin_error(estimate, truth, laws)
        assert got_e[i] == pytest.approx(want_e, rel=1e-10, abs=1e-12)
        assert got_r[i] == pytest.approx(want_r, rel=1e-10, abs=1e-12)
    assert moments.spread_error(float(c[0]), float(s[0]), float(q[0]), w, floor, pc, ps, pq) == (got_e[0], got_r[0])


def test_a_wrong_clamp_of_the_line_would_be_caught(monkeypatch):
    """The comparison above can fail: the error above the upper clamp off by 0.1 W^2 moves the figure."""
    plan = _plan("zcdp")
    stat, comps = plan.spec.statistics[0], plan.stat_components[0]
    by = {c.kind: c for c in comps}
    pc, ps, pq = (plan.plan_of(by[k]) for k in ("rows", "nsum", "nsumsq"))
    w = float(stat.clamp.half_width)
    c, s, q = np.array([4.0]), np.array([0.9 * w * 4]), np.array([0.45 * w * w * 4])
    real = moments.clamped_line_error
    right = moments.spread_error_columns(c, s, q, w, 1.0, pc, ps, pq)

    def wrong(prefix, b, d, y_lo, y_hi, y_0, c_lo, c_hi):
        return real(prefix, b, d, y_lo, y_hi, y_0, c_lo, c_hi + 0.1 * w * w)

    monkeypatch.setattr(moments, "clamped_line_error", wrong)
    assert moments.spread_error_columns(c, s, q, w, 1.0, pc, ps, pq)[0][0] != pytest.approx(right[0][0], rel=1e-6)
