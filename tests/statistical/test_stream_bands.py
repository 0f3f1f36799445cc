"""Family-wise coverage of a stream's simultaneous band (``stream`` with
``confidence: {level: 0.95, simultaneous: true}``), over 2,000 seeded 60-point streams
(horizon 60 days, users ever seen) drawn as the engine draws them: each node of the tree gets
ONE noise of the exact seeded sampler (:func:`tree.draw_node_noise`) and the points are the
stream plan's own cells (:meth:`StreamPlan.cells`: the sums of the stored noisy nodes, their
intervals and bands). No Spark.

The points share node noises, so the band is Bonferroni (each point's own exact law at miss
probability 0.05 / 60: :func:`tree.band_halfwidth`), proven for any dependence; the check:

* the share of streams whose 60 points are ALL inside their bands is >= 0.95 within 3
  standard errors (0.0146). Measured: 0.9760 (discrete Laplace, pure DP epsilon 1, seed 71)
  and 0.9770 (discrete Gaussian, zCDP rho 0.5, seed 72): 2.6 and 2.7 points above the level,
  the union bound's price for points that share noises (plus the lattice's excess per point);
* the same check FAILS for the pointwise intervals used as the band (measured 0.2680 and
  0.3100: above 0.95^60 = 4.6%, the points being positively dependent, but far below 0.95):
  the check can fail.

About 12 s for both measures on an idle 2-core machine.
"""

from __future__ import annotations

import math
import time
from datetime import date, timedelta

import pytest

from dp_spark.config import release_spec_from_dict
from dp_spark.mechanisms import tree
from dp_spark.mechanisms.samplers import SeededNoiseSource
from dp_spark.statistics.stream import plan_stream

REPS, HORIZON, LEVEL = 2000, 60, 0.95
TOL = 3 * math.sqrt(LEVEL * (1 - LEVEL) / REPS)  # 0.0146
START = date(2026, 9, 1)
NEW_USERS = 500  # users first seen each day: the running total is far from 0 (no clamp at 0)


@pytest.fixture(autouse=True)
def _test_mode(monkeypatch):
    monkeypatch.setenv("DP_SPARK_TEST_MODE", "1")


def _plan(measure: str):
    budget = {"id": "b", "measure": measure, **({"rho": "0.5"} if measure == "zcdp" else {"epsilon": "1"})}
    return plan_stream(release_spec_from_dict({
        "name": "seen", "dataset": "x", "privacy_unit": {"kind": "user", "column": "user_id"},
        "group_by": [{"column": "day", "public_keys": {"dates": {
            "start": START.isoformat(), "end": (START + timedelta(days=HORIZON - 1)).isoformat()}}}],
        "stream": {"horizon_days": HORIZON, "start": START.isoformat()},
        "bounds": {"max_rows_per_unit": 60, "max_partitions_per_unit": 60},
        "statistics": [{"name": "seen", "kind": "distinct_units"}],
        "budget": budget, "confidence": {"level": LEVEL, "simultaneous": True}, "max_cells": 100}, "s.yaml"))


def _covered(cells, truth, lo: str, hi: str) -> bool:
    return all(c[lo] <= s <= c[hi] for c, s in zip(cells, truth))


@pytest.mark.parametrize("measure, seed", [("pure_dp", 71), ("zcdp", 72)])
def test_the_band_covers_the_whole_stream_together_and_pointwise_intervals_fail(measure, seed):
    t0 = time.monotonic()
    plan = _plan(measure)
    (part,) = plan.parts
    assert plan.days == HORIZON and plan.band_points == HORIZON  # m = 60 points of the horizon
    cal = part.calibration
    true_nodes = tree.node_values([NEW_USERS] * HORIZON, HORIZON)
    truth = [NEW_USERS * t for t in range(1, HORIZON + 1)]
    src = SeededNoiseSource(seed)
    band = pointwise = 0
    for _ in range(REPS):
        noise = tree.draw_node_noise(cal, source=src)
        cells = plan.cells({part.name: {n: v + noise[n] for n, v in true_nodes.items()}})
        assert len(cells) == HORIZON
        band += _covered(cells, truth, "band_low", "band_high")
        pointwise += _covered(cells, truth, "ci_low", "ci_high")
    band_cov, point_cov = band / REPS, pointwise / REPS
    print(f"{measure}: family-wise coverage over {REPS} streams of {HORIZON} points: band {band_cov:.4f}, "
          f"pointwise intervals {point_cov:.4f} ({time.monotonic() - t0:.1f}s)")
    assert band_cov >= LEVEL - TOL, band_cov
    # the check can fail: the pointwise intervals used as a band fail it
    assert not point_cov >= LEVEL - TOL, point_cov
    # the band is the point's own interval at the Bonferroni level, and wider than the interval
    c = cells[-1]
    assert c["band_low"] < c["ci_low"] and c["ci_high"] < c["band_high"]


def test_a_chart_reads_a_stream_band_over_every_point_whichever_release_wrote_it():
    """``dp-spark chart`` on a stream's points: one band over all of them (Bonferroni), even
    when several refreshes wrote them; changes marked only where bands do not overlap. The same
    rows without the stream named in their charge_json are several releases: no band claim."""
    import json

    from dp_spark.evaluation.chart_data import series_chart_data

    plan = _plan("zcdp")
    (part,) = plan.parts
    true_nodes = tree.node_values([NEW_USERS] * HORIZON, HORIZON)
    noise = tree.draw_node_noise(part.calibration, source=SeededNoiseSource(73))
    cells = plan.cells({part.name: {n: v + noise[n] for n, v in true_nodes.items()}})
    stream = json.dumps({"stream": {"stream_id": "stream-abc"}})
    rows = [{**c, "confidence": LEVEL, "release_id": f"r{i // 20}", "charge_json": stream} for i, c in enumerate(cells)]
    (chart,) = series_chart_data(rows)
    assert (chart.releases, chart.simultaneous, chart.band_rule, chart.change_method) == (1, True, "Bonferroni", "bands")
    assert not chart.notes and len(chart.significant) > 0  # 500 new users a day: bands far apart
    (plain,) = series_chart_data([{k: v for k, v in r.items() if k != "charge_json"} for r in rows])
    assert (plain.releases, plain.change_method) == (3, "none")
