"""Honest intervals (issue 25 item 3), fast checks against independent exact computations:
the quantile's bin-edge thresholds, the sum sharing the count, the variance's box, the
discretised noise laws behind the plug-in error figures, and the coverage table's own code
on a tiny run (the full table is tests/statistical/test_coverage_table.py)."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from dp_spark.mechanisms import accuracy
from dp_spark.evaluation import coverage
from dp_spark.statistics.moments import shared_sum_accuracy, variance_box
from dp_spark.statistics.noise import law_nodes
from tests.unit.reference_errors import plugin_error

ROOT = Path(__file__).resolve().parents[2]
LAPLACE, GAUSSIAN = "discrete_laplace", "discrete_gaussian"


def _pmf(mechanism, scale, k):
    x = np.arange(-k, k + 1)
    f = accuracy.discrete_laplace_pmf if mechanism == LAPLACE else accuracy.discrete_gaussian_pmf
    return x, np.asarray(f(scale, x), dtype=float)


def _law(mechanism, scale, weights):
    """(values, probabilities) of sum_i w_i X_i for integer weights, by direct convolution of
    the dilated pmfs (support +-60: the tail beyond is below 1e-8 here)."""
    x, p = _pmf(mechanism, scale, 60)
    values, probs = np.array([0]), np.array([1.0])
    for w in weights:
        dil = np.zeros(120 * abs(w) + 1)
        dil[::abs(w)] = p if w > 0 else p[::-1]
        probs = np.convolve(probs, dil)
        values = np.arange(len(probs)) + values[0] - 60 * abs(w)
    return values, probs


@pytest.mark.parametrize("mechanism,scale", [(LAPLACE, Fraction(1)), (GAUSSIAN, Fraction(3, 2))])
@pytest.mark.parametrize("q", [0.5, 0.75])
def test_edge_thresholds_are_the_exact_one_sided_tails(mechanism, scale, q):
    bins, beta = 4, 0.01
    hs = accuracy.edge_halfwidths(mechanism, scale, bins, q, beta)
    assert len(hs) == bins - 1
    for j, h in enumerate(hs, start=1):
        v, p = _law(mechanism, scale, [round(4 * (1 - q))] * j + [-round(4 * q)] * (bins - j))
        v = v / 4  # N_j = (1 - q) A - q C on the lattice of quarters
        assert p[v > h].sum() <= beta + 1e-12
        # the smallest such threshold: at the next value of N_j down the tail is too big
        assert p[v >= v[v <= h].max()].sum() > beta


def test_edge_thresholds_fall_back_to_a_wider_proven_chernoff_bound(monkeypatch):
    exact = accuracy.edge_halfwidths(LAPLACE, Fraction(2), 16, 0.5, 0.001)
    monkeypatch.setattr(accuracy, "_EDGE_WORK", 1)
    accuracy._edge_halfwidths.cache_clear()
    try:
        bound = accuracy.edge_halfwidths(LAPLACE, Fraction(2), 16, 0.5, 0.001)
        gauss = accuracy.edge_halfwidths(GAUSSIAN, Fraction(2), 16, 0.5, 0.001)
    finally:
        accuracy._edge_halfwidths.cache_clear()
    assert all(e <= b <= 1.4 * e for e, b in zip(exact, bound))
    # the Gaussian's: sqrt(2 V ln(1/beta)) exactly
    v = 4 * (1 * 0.25 + 15 * 0.25)
    assert gauss[0] == pytest.approx(math.sqrt(2 * v * math.log(1000)))


def test_quantile_union_bound_beats_per_edge_levels():
    """With B - 1 edges at alpha / (B - 1) each, the thresholds exceed the per-edge (1 - alpha)
    half-width that missed the truth 74% of the time at a nominal 0.5 in a cell of 10."""
    from dp_spark.statistics.quantile import edge_thresholds

    class Plan:
        mechanism, scale, grid_exponent, grid_unit = GAUSSIAN, Fraction(2), 0, Fraction(1)

    h = edge_thresholds(Plan, 64, Fraction(1, 2), 0.5)
    assert h[0] == h[-1] == math.inf and len(h) == 65
    sd = accuracy.noise_stddev(GAUSSIAN, 2) * math.sqrt(32 * 0.25 + 32 * 0.25)
    old = sd * 0.6745  # the per-edge two-sided 0.5 half-width at the middle edge
    assert h[32] > 3 * old


@pytest.mark.parametrize("mechanism", [LAPLACE, GAUSSIAN])
def test_shared_sum_half_width_is_the_exact_quantile(mechanism):
    """nsum~ + mid C~ with integer noises: P(|X_S + mid X_C| <= h) >= 1 - alpha, tight, while the
    root-sum-square of the two half-widths under-covers under pure DP at 0.5."""
    s_scale, c_scale, mid = Fraction(3), Fraction(2), Fraction(5)
    xs, ps = _pmf(mechanism, s_scale, 60)
    xc, pc = _pmf(mechanism, c_scale, 60)
    z = {}
    for (a, pa), (b, pb) in itertools.product(zip(xs, ps), zip(xc, pc)):
        z[a + 5 * b] = z.get(a + 5 * b, 0.0) + pa * pb

    def cover(h):
        return sum(p for v, p in z.items() if abs(v) <= h + 1e-9)

    for alpha in (0.5, 0.2, 0.05, 0.01):
        h, sd, e_abs = shared_sum_accuracy(mechanism, s_scale, Fraction(1), c_scale, mid, alpha)
        assert cover(h) >= 1 - alpha - 1e-9
        assert cover(h * (1 - 1e-6) - 1e-9) < 1 - alpha  # tight (the bisection's tolerance aside)
        assert sd == pytest.approx(math.sqrt(sum(p * v * v for v, p in z.items())), rel=1e-6)
        if mechanism == LAPLACE:
            assert e_abs == pytest.approx(sum(p * abs(v) for v, p in z.items()), rel=1e-6)
    if mechanism == LAPLACE:
        rss = math.hypot(accuracy.noise_halfwidth(mechanism, s_scale, 0.5), 5 * accuracy.noise_halfwidth(mechanism, c_scale, 0.5))
        assert cover(rss) < 0.5


def test_variance_box_holds_every_consistent_truth():
    """Brute force: every (n, S, Q) in the box (n integer, |S| <= n W, |Q| <= n E) has its
    variance inside the interval, and the interval's ends are attained without the clips."""
    rng = np.random.default_rng(3)
    w, e = 10.0, 60.0
    for _ in range(150):
        c, h_c = rng.uniform(-3, 40), int(rng.integers(0, 6))
        s, h_s = rng.uniform(-200, 200), rng.uniform(0, 60)
        q, h_q = rng.uniform(-800, 800), rng.uniform(0, 300)
        lo, hi = variance_box(c, h_c, s, h_s, q, h_q, w, e)
        assert 0 <= lo <= hi <= w * w
        n = np.arange(max(math.ceil(c - h_c), 1), math.floor(c + h_c) + 1)[:, None, None]
        ss = np.linspace(s - h_s, s + h_s, 41)[None, :, None]
        qq = np.linspace(q - h_q, q + h_q, 41)[None, None, :]
        ok = (np.abs(ss) <= n * w) & (np.abs(qq) <= n * e)
        seen = np.clip(qq / n + w * w / 2 - (ss / n) ** 2, 0.0, w * w)[ok] if n.size else np.zeros(0)
        if seen.size:
            assert lo <= seen.min() + 1e-9 and seen.max() <= hi + 1e-9
        else:
            assert (lo, hi) == (0.0, w * w)


@pytest.mark.parametrize("mechanism,scale,exponent", [(LAPLACE, Fraction(2), 0), (LAPLACE, Fraction(10**8), -20),
                                                      (GAUSSIAN, Fraction(3, 2), 0), (GAUSSIAN, Fraction(900), 0),
                                                      (GAUSSIAN, Fraction(10**8), -20)])
def test_law_nodes_keep_the_mean_absolute_noise(mechanism, scale, exponent):
    class Plan:
        pass

    Plan.mechanism, Plan.scale, Plan.grid_exponent = mechanism, scale, exponent
    x, p = law_nodes(Plan, 40)
    unit = 2.0 ** exponent
    xs, ps = _pmf(mechanism, scale, min(accuracy.noise_halfwidth(mechanism, scale, 1e-12), 10**6)) \
        if scale < 10**4 else (None, None)
    if xs is not None:
        exact_abs = float(np.dot(ps, np.abs(xs))) / ps.sum() * unit
    else:
        t = float(scale)
        exact_abs = (t if mechanism == LAPLACE else t * math.sqrt(2 / math.pi)) * unit
    assert abs(p.sum() - 1) < 1e-12 and len(x) <= 41
    assert float(np.dot(p, np.abs(x))) == pytest.approx(exact_abs, rel=1e-6)
    sd = accuracy.noise_stddev(mechanism, scale) * unit
    assert math.sqrt(float(np.dot(p, x * x))) == pytest.approx(sd, rel=0.03)


def test_plugin_error_of_a_clamped_estimate_stays_in_its_range():
    class Plan:
        mechanism, scale, grid_exponent = LAPLACE, Fraction(400), 0

    laws = [law_nodes(Plan)]
    e_abs, rms = plugin_error(lambda e: np.clip(20 + e, 0, 100), 20.0, laws)
    assert e_abs <= 80 and rms <= 80
    e_abs, rms = plugin_error(lambda e: 20 + e, 20.0, laws)  # linear: the noise's own figures
    assert e_abs == pytest.approx(400, rel=1e-3)


def test_a_small_mean_cell_reports_an_error_inside_its_range():
    """The audit's AOV cell: a value held to [0, 500] reported an expected error of 1,708."""
    from dp_spark.config import load_release_spec
    from dp_spark.statistics.base import kind_of
    from dp_spark.statistics.plan import plan_query

    spec = load_release_spec(ROOT / "conf/releases/aov_by_region.yaml")
    plan = plan_query(spec)
    stat = next(s for s in spec.statistics if s.kind == "mean")
    comps = plan.stat_components[spec.statistics.index(stat)]
    plans = {c: plan.plan_of(c) for c in comps}
    for count, nsum in ((Fraction(3), Fraction(-700)), (Fraction(0), Fraction(900)), (Fraction(-25), Fraction(0))):
        noisy = {c: (count if c.kind == "rows" else nsum) for c in comps}
        out = kind_of("mean").finish(stat, noisy, plans, Fraction(1, 20))
        assert 0 < out["expected_abs_error"] <= 500 and 0 < out["noise_stddev"] <= 500, out


def test_the_coverage_table_code_on_a_tiny_run(monkeypatch):
    monkeypatch.setenv("DP_SPARK_TEST_MODE", "1")
    entries = coverage.simulate("zcdp", reps=40, sizes=(50,), levels=("0.9",))
    assert {e.kind for e in entries} == set(coverage.KINDS)
    for e in entries:
        assert 0 <= e.coverage["0.9"] <= 1 and e.measured_abs > 0 and e.reported_abs > 0
        assert e.kind in coverage.EXACT or e.upper_band["0.9"] == 1
    assert "| count | zcdp | 50 |" in coverage.table(entries)
    # the same releases with half-widths x0.2: the coverage check fails
    assert any("coverage" in line for line in coverage.check(coverage.shrunk(entries, 0.2)))


class _Plan:
    def __init__(self, mechanism, scale, grid_exponent=0):
        self.mechanism, self.scale, self.grid_exponent = mechanism, Fraction(scale), grid_exponent


@pytest.mark.parametrize("mechanism", [LAPLACE, GAUSSIAN])
def test_stddev_error_is_the_feasible_truths_expectation(mechanism):
    """The standard deviation's figures against an independent Monte Carlo of their
    definition: truths (n, S, Q) = published - noise (exact discrete draws), kept where they
    can exist, the released value's mean |distance| and rms distance from their standard
    deviations."""
    from dp_spark.statistics.moments import _variance, stddev_error

    w, top = 50.0, 2500.0
    pc, ps, pq = _Plan(mechanism, 2), _Plan(mechanism, 40), _Plan(mechanism, 1500)
    rng = np.random.default_rng(5)
    draw = {LAPLACE: lambda t, k: rng.geometric(1 - math.exp(-1 / t), k) - rng.geometric(1 - math.exp(-1 / t), k),
            GAUSSIAN: None}[mechanism]
    for c, s, q in ((12.0, -230.0, -9000.0), (15.0, -100.0, -18000.0), (400.0, -8000.0, -300000.0)):
        value = math.sqrt(float(_variance(c, s, q, w, 1.0)))
        got_abs, got_rms = stddev_error(c, s, q, w, 1.0, pc, ps, pq)
        k = 400_000
        if draw is None:  # discrete Gaussian by its exact pmf
            noise = [rng.choice(x, k, p=p / p.sum()) for x, p in
                     (_pmf(GAUSSIAN, float(p.scale), int(12 * float(p.scale)) + 2) for p in (pc, ps, pq))]
        else:
            noise = [draw(float(p.scale), k) for p in (pc, ps, pq)]
        n, big_s, big_q = c - noise[0], s - noise[1], q - noise[2]
        ok = n >= 1
        n, big_s, big_q = n[ok], big_s[ok], big_q[ok]
        m2 = big_q / n + top / 2
        var = m2 - (big_s / n) ** 2
        keep = (np.abs(big_s) <= n * w) & (m2 <= top) & (var >= 0)
        err = value - np.sqrt(var[keep])
        assert got_abs == pytest.approx(float(np.mean(np.abs(err))), rel=0.04)
        assert got_rms == pytest.approx(math.sqrt(float(np.mean(err * err))), rel=0.04)
        assert 0 < got_abs <= w and 0 < got_rms <= w


def test_stddev_error_stays_in_its_range_when_no_truth_fits():
    from dp_spark.statistics.moments import stddev_error

    p = _Plan(LAPLACE, 1)
    e_abs, rms = stddev_error(-50.0, 0.0, 0.0, 50.0, 1.0, p, p, p)  # a count no truth >= 1 explains
    assert 0 < e_abs <= 50 and 0 < rms <= 50
