"""``dp-spark chart``'s data (dp_spark.evaluation.chart_data: pure) and its two drawings (PNG by
matplotlib, interactive HTML by plotly), from published rows only."""

from __future__ import annotations

import math
import os
import sys

import pytest

os.environ.setdefault("DP_SPARK_TEST_MODE", "1")

from dp_spark.evaluation import chart_data, charts  # noqa: E402
from dp_spark.evaluation.chart_data import series_chart_data, zoom_range  # noqa: E402
from dp_spark.evaluation.utility import discrete_gaussian_difference_halfwidth, single_noise_cell  # noqa: E402
from dp_spark.mechanisms import accuracy  # noqa: E402

SIGMA = 10.0


def _rows(values, *, band=True, release="r1", statistic="dau", sigma=SIGMA, key0=1):
    h = accuracy.noise_halfwidth("discrete_gaussian", sigma, 0.05)
    hb = accuracy.noise_halfwidth("discrete_gaussian", sigma, 0.05 / len(values))
    sd = accuracy.noise_stddev("discrete_gaussian", sigma)
    return [{"statistic": statistic, "key": f"2026-11-{key0 + i:02d}", "value": float(v), "ci_low": v - h,
             "ci_high": v + h, "band_low": v - hb if band else None, "band_high": v + hb if band else None,
             "confidence": 0.95, "mechanism": "discrete_gaussian", "noise_scale": sigma, "noise_stddev": sd,
             "grid": 1.0, "release_id": release, "suppressed": False, "charge_rho": 0.1}
            for i, v in enumerate(values)]


def test_a_jump_is_marked_and_noise_is_not():
    values = [1000, 1003, 998, 1001, 1200, 1198, 1202, 1199]  # one jump of ~200, sd of a change ~14
    (c,) = series_chart_data(_rows(values))
    assert c.change_method == "exact" and c.simultaneous and c.releases == 1
    assert [ch.key for ch in c.significant] == ["2026-11-05"]
    assert c.significant[0].change > 0 and c.significant[0].low > 0
    # the family-wise interval of a change is wider than its pointwise one
    from dp_spark.evaluation.utility import trend_differences

    point = trend_differences(_rows(values), statistic="dau")
    fam = trend_differences(_rows(values), statistic="dau", simultaneous=True)
    assert all((f["ci_high"] - f["ci_low"]) > (p["ci_high"] - p["ci_low"]) for f, p in zip(fam, point))


def test_a_change_pointwise_significant_but_not_family_wise_is_not_marked():
    h_point = discrete_gaussian_difference_halfwidth(SIGMA, SIGMA, 0.05)
    h_fam = discrete_gaussian_difference_halfwidth(SIGMA, SIGMA, 0.05 / 29)
    assert h_fam > h_point
    step = (h_point + h_fam) / 2  # beyond the pointwise interval, inside the family-wise one
    values = [1000.0] * 15 + [1000.0 + step] * 15
    (c,) = series_chart_data(_rows(values))
    assert c.significant == ()
    values = [1000.0] * 15 + [1000.0 + h_fam + 2] * 15
    (c,) = series_chart_data(_rows(values))
    assert [ch.key for ch in c.significant] == ["2026-11-16"]


def test_the_gaussian_difference_law_is_the_convolution():
    import numpy as np

    for sa, sb in ((0.7, 0.7), (3.0, 5.0), (20.0, 20.0)):
        ka, kb = int(12 * sa) + 5, int(12 * sb) + 5
        pa = accuracy.discrete_gaussian_pmf(sa, np.arange(-ka, ka + 1))
        pb = accuracy.discrete_gaussian_pmf(sb, np.arange(-kb, kb + 1))
        d = np.convolve(pa, pb)
        k = np.arange(-(ka + kb), ka + kb + 1)
        for alpha in (0.05, 1e-3):
            h = discrete_gaussian_difference_halfwidth(sa, sb, alpha)
            assert float(d[np.abs(k) > h].sum()) <= alpha
            assert float(d[np.abs(k) > h - 2].sum()) > alpha  # exact or one grid step above


def test_other_kinds_use_the_bands_within_one_release_and_say_when_they_cannot():
    rows = _rows([50, 51, 49, 150, 149])  # bands of +-26: only the jump of 101 separates them
    for r in rows:  # a mean: its noise_stddev is not one noise's
        r["noise_stddev"] = 0.37
    assert not any(single_noise_cell(r) for r in rows)
    (c,) = series_chart_data(rows)
    assert c.change_method == "bands" and [ch.key for ch in c.significant] == ["2026-11-04"]
    (c,) = series_chart_data([{**r, "band_low": None, "band_high": None} for r in rows])
    assert c.change_method == "none" and c.changes == () and "no simultaneous band" in c.notes[0]
    two = rows[:3] + [{**r, "release_id": "r2"} for r in rows[3:]]
    (c,) = series_chart_data(two)
    assert c.change_method == "none" and c.releases == 2
    assert any("each release's band covers its own cells" in n for n in c.notes)


def test_wide_intervals_are_flagged_and_suppressed_cells_left_out():
    rows = _rows([1000, 5, 1000])  # half-width ~20 >= 5: the middle value says nothing
    rows.append({**rows[0], "key": "2026-11-09", "value": math.nan, "ci_low": math.nan, "ci_high": math.nan,
                 "suppressed": True})
    (c,) = series_chart_data(rows)
    assert [p.key for p in c.wide] == ["2026-11-02"] and c.suppressed == 1 and len(c.points) == 3
    assert chart_data.wider_than_value(1.0, 0.0, 2.0) and not chart_data.wider_than_value(1.0, 0.5, 1.5)


def test_the_axis_is_zoomed_to_the_data_not_from_zero():
    (c,) = series_chart_data(_rows([1000, 1010, 1020]))
    lo, hi = c.y_range()
    assert 900 < lo < 1000 and 1020 < hi < 1120
    assert zoom_range([1, 2], [3, 4]) == (pytest.approx(1 - 0.12 * 3), pytest.approx(4 + 0.12 * 3))
    assert zoom_range([0.1], [10]) == (0.0, pytest.approx(10 + 0.12 * 9.9))  # never below 0 for data >= 0
    assert zoom_range([-5], [5]) == (pytest.approx(-6.2), pytest.approx(6.2))
    assert zoom_range([math.nan], [math.nan]) is None


def test_chart_data_imports_no_plotting_and_no_spark():
    import subprocess

    code = ("import sys, dp_spark.evaluation.chart_data, dp_spark.evaluation.utility; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('matplotlib', 'plotly', 'pyspark')]; "
            "print(bad); raise SystemExit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_png_and_html_are_written_with_the_series(tmp_path):
    rows = _rows([1000, 1003, 998, 1200, 1199]) + _rows([10, 11, 12, 30, 29], statistic="orders", sigma=1.0)
    png = charts.series_chart(rows, tmp_path / "c.png", title="fam")
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    html = open(charts.series_chart(rows, tmp_path / "c.html", title="fam")).read()
    assert html.lstrip().lower().startswith(("<!doctype html>", "<html")) and "</html>" in html and "plotly" in html
    data = html[html.rindex("Plotly.newPlot("):]  # the figure's data, after the inlined plotly.js
    for key in ("2026-11-01", "2026-11-05"):
        assert key in data
    # the published series is in the page: the values, and the statistics' names
    assert "1003.0" in data and "1199.0" in data and "29.0" in data and "dau" in data and "orders" in data
    assert "all points of the release together" in html  # the band's legend
    fig = charts.build_series_figure(series_chart_data(rows), rows)
    assert len(fig.axes) == 2
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any("band" in t for t in labels) and any("significant" in t for t in labels)
    assert fig.axes[0].get_ylim()[0] > 0


@pytest.mark.parametrize("measure", ["zcdp", "pure_dp"])
def test_a_series_without_stored_bands_gets_the_band_its_release_would_have_stored(measure):
    """A single-noise series (counts, distinct counts, a sum) published without
    ``simultaneous``: the chart computes each point's Sidak band from the public noise
    parameters. It holds the band the same release stores with ``simultaneous: true`` (the
    same draws) and equals it up to a grid step, except where that band is cut at 0 (a count's
    kind, not in the row)."""

    from dp_spark.config import release_spec_from_dict
    from dp_spark.mechanisms.samplers import SeededNoiseSource
    from dp_spark.statistics.plan import plan_query

    def plan(confidence):
        budget = {"id": "b", "measure": measure, **({"rho": 0.02} if measure == "zcdp" else {"epsilon": 0.2})}
        return plan_query(release_spec_from_dict({
            "name": "s", "dataset": "x", "privacy_unit": {"kind": "user", "column": "user_id"},
            "group_by": {"column": "day", "public_keys": {"dates": {"start": "2026-11-01", "end": "2026-11-30"}}},
            "bounds": {"max_rows_per_unit": 3, "max_partitions_per_unit": 3}, "confidence": confidence,
            "statistics": [{"name": "rows", "kind": "count"}, {"name": "units", "kind": "distinct_units"},
                           {"name": "total", "kind": "sum", "column": "v", "lower": -50, "upper": 50}],
            "budget": budget}, "s.yaml"))

    partials = {i: {"dp_rows": 20 * i, "dp_units": 9 * i} for i in range(30)}
    plain, banded = plan(0.95), plan({"level": 0.95, "simultaneous": True})
    rows = [{**c, "confidence": 0.95, "release_id": f"day{i % 30}", "suppressed": False}
            for i, c in enumerate(plain.noise(partials, SeededNoiseSource(5)))]
    stored = {(c["statistic"], c["key"]): c for c in banded.noise(partials, SeededNoiseSource(5))}
    charts = series_chart_data(rows)
    assert [c.statistic for c in charts] == ["rows", "total", "units"]
    for chart in charts:
        assert chart.simultaneous and chart.band_rule == "Sidak, computed" and chart.releases == 1
        for p in chart.points:
            s = stored[(chart.statistic, p.key)]
            grid = float(s["grid"])
            assert p.band_low <= s["band_low"] + 1e-9 and p.band_high >= s["band_high"] - 1e-9  # holds it
            assert p.band_low <= p.ci_low and p.band_high >= p.ci_high
            assert p.band_high - s["band_high"] <= 2 * grid + 1e-9 * abs(s["band_high"])
            if s["band_low"] > 0 or chart.statistic == "total":
                assert s["band_low"] - p.band_low <= grid + 1e-9 * abs(s["band_low"])


def test_a_computed_band_is_wider_than_the_pointwise_interval_and_covers_the_chart():
    """Family-wise: over 2,000 simulated 40-point single-noise series, the computed band holds
    every truth together at least 95% of the time; the pointwise interval used as a band does
    not (the check can fail)."""
    import numpy as np

    rng = np.random.default_rng(11)
    sigma, m, n = SIGMA, 40, 2000
    k = 200
    pmf = accuracy.discrete_gaussian_pmf(sigma, np.arange(-k, k + 1))
    noise = rng.choice(np.arange(-k, k + 1), size=(n, m), p=pmf / pmf.sum())
    truth = np.full(m, 500.0)
    template = _rows(list(truth), band=False)
    (c,) = series_chart_data(template)
    half_band = c.points[0].band_high - c.points[0].value
    half_point = c.points[0].ci_high - c.points[0].value
    assert c.band_rule == "Sidak, computed" and half_band > half_point
    assert c.legend()["band"] == "95% band: all points of the chart together"
    covered_band = np.mean(np.all(np.abs(noise) <= half_band, axis=1))
    covered_point = np.mean(np.all(np.abs(noise) <= half_point, axis=1))
    assert covered_band >= 0.95 - 2 * math.sqrt(0.95 * 0.05 / n) and covered_point < 0.5
