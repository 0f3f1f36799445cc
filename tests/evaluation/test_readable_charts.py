"""Charts a reader can read (issue 32, item 7): the DAU trend zoomed to its data with the band
visible, "keys" (not "window") for keys that are not dates, the explorer's intervals cut to the
statistic's range and shown as intervals, and a panel per statistic of a multi-statistic spec."""

from __future__ import annotations

import math
from datetime import date, timedelta
from pathlib import Path

import pytest
from matplotlib.collections import PolyCollection

from dp_spark.config import load_release_spec
from dp_spark.evaluation import charts, explorer
from tests.shipped_specs import shipped_spec_paths

ROOT = Path(__file__).resolve().parents[2]
DAYS = [(date(2026, 11, 1) + timedelta(days=i)).isoformat() for i in range(30)]
REGIONS = [f"region_{i:02d}" for i in range(1, 21)]


def cells(statistic, keys, values, half):
    return [{"statistic": statistic, "key": k, "value": v, "ci_low": v - half, "ci_high": v + half,
             "confidence": 0.95, "charge_rho": 0.02, "statement_epsilon": 1.4, "statement_delta": 1e-7,
             "privacy_unit": "user", "neighbouring": "add_remove_unit", "mode": "official"}
            for k, v in zip(keys, values)]


# -- the DAU trend ---------------------------------------------------------------------------
def test_the_dau_axis_is_zoomed_to_the_data_and_the_band_is_visible():
    values = [8000 + (150 if i % 7 == 5 else -120 if i % 7 == 6 else 0) + i for i in range(30)]
    rows = cells("distinct_units", DAYS, values, 12.0)
    fig = charts.build_dau_figure(rows, charts.release_caption(rows, statistic="distinct_units"))
    ax = fig.axes[0]
    bottom, top = ax.get_ylim()
    lo, hi = min(values) - 12, max(values) + 12
    assert bottom <= lo and top >= hi  # every value and interval is on the chart
    assert top - bottom <= 1.5 * (hi - lo)  # ... and fills it: not 0 to 8,000
    # the band is drawn and, at 24 users wide, is a visible share of the axis (was 0.3%)
    (band,) = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert 24 / (top - bottom) > 0.05
    # the axis does not start at 0, and the chart says so
    assert any("y axis starts at" in t.get_text() and "not 0" in t.get_text() for t in ax.texts)


def test_a_trend_near_zero_keeps_zero_and_never_goes_below():
    rows = cells("distinct_units", DAYS, [3 + (i % 3) for i in range(30)], 6.0)
    for r in rows:
        r["ci_low"] = max(r["ci_low"], 0.0)  # a count's interval is cut at 0
    ax = charts.build_dau_figure(rows).axes[0]
    assert ax.get_ylim()[0] == 0.0 and not [t for t in ax.texts if "starts at" in t.get_text()]


# -- captions: a window of dates, keys otherwise -------------------------------------------------
def test_captions_say_window_for_dates_and_keys_for_regions():
    dau = charts.release_caption(cells("distinct_units", DAYS, [1.0] * 30, 1.0))
    assert "window: 2026-11-01 .. 2026-11-30 (30 days)" in dau
    aov = charts.release_caption(cells("mean", REGIONS, [40.0] * 20, 3.0), statistic="mean")
    assert "keys: region_01 .. region_20 (20 keys)" in aov and "window" not in aov
    assert charts.key_range(["2026-11-03"]) == "window: 2026-11-03"
    assert charts.key_range(['["2026-11-03","region_04"]', '["2026-11-04","region_04"]']).startswith("keys: ")


# -- the explorer: intervals cut to the statistic's range -------------------------------------
@pytest.mark.parametrize("path", shipped_spec_paths(), ids=lambda p: p.name)
def test_every_explorer_interval_is_within_the_statistics_range(path):
    spec = load_release_spec(path)
    rows = explorer.explore(spec, [5, 50, 5000], [0.01, 0.25, 2])
    by_name = {s.name: s for s in spec.statistics}
    for r in rows:
        lo, hi = explorer.value_range(by_name[r["statistic"]])
        assert lo <= r["ci_low"] <= r["ci_high"] <= hi, r
        assert r["halfwidth"] >= 0 and r["clipped"] == ((math.isfinite(lo) and r["ci_low"] <= lo)
                                                        or (math.isfinite(hi) and r["ci_high"] >= hi)), r


def test_the_aov_table_shows_the_cut_interval_not_a_symmetric_plus_minus():
    spec = load_release_spec(ROOT / "conf/releases/aov_by_region.yaml")
    rows = [r for r in explorer.explore(spec, [50, 5000], [0.1]) if r["statistic"] == "mean"]
    small, large = rows
    assert (small["ci_low"], small["ci_high"], small["clipped"]) == (0.0, 500.0, True)  # the whole clamp range
    assert small["halfwidth"] == pytest.approx(455.0)  # its farther end from the assumed 45
    assert not large["clipped"] and 0 < large["ci_low"] < 45 < large["ci_high"] < 500
    text = explorer.format_table(rows)
    assert "[0, 500]*" in text and "95% interval" in text.splitlines()[0]
    assert "+-" not in text.splitlines()[0] and text.splitlines()[-1].startswith("* the interval reaches")
    # the chart's note says "up to" for an interval cut at the range, never "+-"
    ax = charts.build_explorer_figure(explorer.explore(spec, [50, 500], [0.1, 0.25]), statistic="mean",
                                      error_column="rel_halfwidth", configured=0.25).axes[0]
    (note,) = [t for t in ax.texts if "group size 50:" in t.get_text()]
    assert "up to" in note.get_text() and "+-" not in note.get_text()
    hollow = [ln for ln in ax.get_lines() if ln.get_markerfacecolor() == "white" and ln.get_xdata().size]
    assert hollow  # clipped points are drawn hollow


def test_an_interval_beyond_the_range_is_cut_by_the_explorer_itself():
    spec = load_release_spec(ROOT / "conf/releases/aov_by_region.yaml")
    mean = next(s for s in spec.statistics if s.kind == "mean")
    assert explorer._within_range(mean, -410.0, 955.0) == (0.0, 500.0, True)
    assert explorer._within_range(mean, 41.0, 49.0) == (41.0, 49.0, False)


# -- a multi-statistic spec: one panel per statistic ----------------------------------------------
def test_a_multi_statistic_spec_gets_a_panel_per_statistic():
    spec = load_release_spec(ROOT / "conf/releases/orders_by_day_region.yaml")
    names = [s.name for s in spec.statistics]
    rows = explorer.explore(spec, [50, 500, 5000], [0.1, 0.5, 2])
    fig = charts.build_explorer_figure(rows, "cap", statistic=names, target=0.05, error_column="rel_halfwidth",
                                       configured=0.5, delta=1e-7)
    assert [a.get_title() for a in fig.axes] == [f"{s.name} ({s.kind})" for s in spec.statistics]
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels[:3] == ["group size 50", "group size 500", "group size 5,000"] and "target 5.0%" in labels
    # the same group size has the same colour in every panel
    for n in ("50", "500", "5,000"):
        colours = {ln.get_color() for a in fig.axes for ln in a.get_lines() if ln.get_label() == f"group size {n}"}
        assert len(colours) == 1, (n, colours)
    # the spread (assumed true value 0: relative error infinite) is drawn in absolute error
    sd = fig.axes[names.index("order_sd")]
    assert "%" not in sd.get_ylabel() and any("absolute error" in t.get_text() for t in sd.texts)
    assert all(len([ln for ln in a.get_lines() if ln.get_label().startswith("group size")]) == 3 for a in fig.axes)
    # one statistic by name is the single chart, as before
    single = charts.build_explorer_figure(rows, statistic="aov", error_column="rel_halfwidth")
    assert len(single.axes) == 1 and not single.legends and single.axes[0].get_legend() is not None
    with pytest.raises(ValueError, match="no explorer rows for statistic 'nope'"):
        charts.build_explorer_figure(rows, statistic=["aov", "nope"])


def test_smallest_budget_for_any_statistic_of_a_multi_statistic_spec():
    spec = load_release_spec(ROOT / "conf/releases/orders_by_day_region.yaml")
    b = explorer.smallest_budget(spec, 500, 0.05, statistic="aov")
    at = [r for r in explorer.explore(spec, [500], [b.rho]) if r["statistic"] == "aov"]
    assert at[0]["rel_halfwidth"] <= 0.05
    from dp_spark.errors import ConfigError

    with pytest.raises(ConfigError, match="no statistic 'nope'"):
        explorer.smallest_budget(spec, 500, 0.05, statistic="nope")
