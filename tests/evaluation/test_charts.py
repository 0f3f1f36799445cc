"""Charts: PNG files exist, are non-empty PNGs, and hold the expected series and bars."""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path

import pytest
from matplotlib.collections import PolyCollection
from matplotlib.patches import Rectangle

from dp_spark.evaluation import charts

PNG = b"\x89PNG\r\n\x1a\n"


def release_rows(statistic, keys, *, value=100.0, half=10.0, rho=0.25):
    return [
        {"statistic": statistic, "key": k, "value": value + i, "ci_low": value + i - half, "ci_high": value + i + half,
         "confidence": 0.95, "charge_rho": rho, "charge_epsilon": None, "statement_epsilon": 3.1,
         "statement_delta": 1e-7, "privacy_unit": "user", "neighbouring": "add_remove_unit", "mode": "official",
         "mechanism": "discrete_gaussian", "noise_stddev": half / 1.96}
        for i, k in enumerate(keys)
    ]


DAYS = [(date(2026, 11, 1) + timedelta(days=i)).isoformat() for i in range(30)]
REGIONS = [f"region_{i:02d}" for i in range(1, 21)]


def test_dau_trend_figure_has_one_line_and_one_band(tmp_path):
    rows = release_rows("distinct_units", DAYS) + release_rows("count", DAYS)  # other statistics ignored
    cap = charts.release_caption(rows, statistic="distinct_units")
    assert "rho = 0.25" in cap and "epsilon = 3.1" in cap and "2026-11-01 .. 2026-11-30" in cap and "95%" in cap
    fig = charts.build_dau_figure(rows, cap)
    ax = fig.axes[0]
    assert len(ax.get_lines()) == 1
    (line,) = ax.get_lines()
    assert len(line.get_xdata()) == 30
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 1
    assert ax.get_title() and "users" in ax.get_ylabel() and "date" in ax.get_xlabel()
    path = charts.dau_trend_chart(rows, tmp_path / "sub" / "dau.png", cap)
    data = Path(path).read_bytes()
    assert data[:8] == PNG and len(data) > 5000


def test_aov_figure_has_one_bar_per_region_with_error_bars(tmp_path):
    rows = release_rows("mean", REGIONS, value=40.0, half=3.0) + release_rows("count", REGIONS)
    fig = charts.build_aov_figure(rows, "caption")
    ax = fig.axes[0]
    bars = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert len(bars) == 20
    assert [t.get_text() for t in ax.get_xticklabels()] == REGIONS
    from matplotlib.container import BarContainer

    (bar_c,) = [c for c in ax.containers if isinstance(c, BarContainer)]
    assert len(bar_c) == 20 and bar_c.errorbar is not None
    # the error bars span the intervals
    segs = bar_c.errorbar.lines[2][0].get_segments()
    assert len(segs) == 20
    lo, hi = sorted(segs[0][:, 1])
    assert (lo, hi) == pytest.approx((37.0, 43.0))
    assert "order value" in ax.get_ylabel()
    path = charts.aov_chart(rows, tmp_path / "aov.png", charts.release_caption(rows, statistic="mean"))
    assert Path(path).read_bytes()[:8] == PNG and Path(path).stat().st_size > 5000


def test_charts_refuse_rows_without_the_statistic(tmp_path):
    with pytest.raises(ValueError):
        charts.build_dau_figure(release_rows("mean", REGIONS))
    with pytest.raises(ValueError):
        charts.aov_chart(release_rows("distinct_units", DAYS), tmp_path / "x.png")


def test_caption_names_pure_dp_and_exploration():
    rows = release_rows("count", ["a"])
    rows[0].update(charge_epsilon=0.5, charge_rho=None, mode="exploration")
    cap = charts.release_caption(rows)
    assert "epsilon = 0.5" in cap and "not publishable" in cap and "window: a" in cap


def test_the_process_backend_is_not_changed():
    import matplotlib

    before = matplotlib.get_backend()
    charts.build_dau_figure(release_rows("distinct_units", DAYS))
    assert matplotlib.get_backend() == before
