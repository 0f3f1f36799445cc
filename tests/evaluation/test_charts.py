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
    assert "epsilon = 0.5" in cap and "not publishable" in cap and "key: a" in cap  # not a date: no window


def test_the_process_backend_is_not_changed():
    import matplotlib

    before = matplotlib.get_backend()
    charts.build_dau_figure(release_rows("distinct_units", DAYS))
    assert matplotlib.get_backend() == before


# --------------------------------------------------------------------------------------
# The explorer chart: epsilon beside rho, the configured charge, readable ticks, the note
# --------------------------------------------------------------------------------------
def aov_explorer_rows():
    from dp_spark.config import load_release_spec
    from dp_spark.evaluation import explorer

    spec = load_release_spec(Path(__file__).resolve().parents[2] / "conf/releases/aov_by_region.yaml")
    return explorer.explore(spec, [50, 500, 5000], [0.1, 0.25, 0.5, 1, 2], assumed_mean=40.0)


def test_explorer_figure_has_epsilon_beside_rho_the_configured_charge_and_readable_ticks(tmp_path):
    from matplotlib.ticker import FixedLocator

    rows = aov_explorer_rows()
    fig = charts.build_explorer_figure(rows, "cap", statistic="mean", target=0.05, error_column="rel_halfwidth",
                                       configured=0.25, delta=1e-7)
    ax = fig.axes[0]
    assert ax.get_xlabel().startswith("rho")
    fig.canvas.draw()
    # readable ticks: a labelled tick at each explored budget, not two decades
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert labels == ["0.1", "0.25", "0.5", "1", "2"]
    ylabels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert len(ylabels) > 2 and all(lbl.endswith("%") for lbl in ylabels)
    # epsilon at the budget's delta on a second axis above, at the same places
    (sec,) = ax.child_axes
    assert "epsilon" in sec.get_xlabel() and "1e-07" in sec.get_xlabel()
    assert isinstance(sec.xaxis.get_major_locator(), FixedLocator)
    eps_labels = [t.get_text() for t in sec.get_xticklabels() if t.get_text()]
    assert len(eps_labels) == 5
    eps = [charts.epsilon_at_delta(r, 1e-7) for r in (0.1, 0.25, 0.5, 1, 2)]
    assert eps_labels == [f"{e:.3g}" for e in eps]
    assert eps == sorted(eps) and 3.5 < eps[1] < 4.2  # rho 0.25 at delta 1e-7: epsilon ~3.86
    # the secondary axis puts each epsilon over its rho
    fwd = sec._functions[0]
    assert float(fwd(0.25)) == pytest.approx(eps[1], rel=1e-3)
    # the configured charge: a vertical line at 0.25, named in rho and epsilon
    vlines = [ln for ln in ax.get_lines() if list(ln.get_xdata()) == [0.25, 0.25]]
    assert len(vlines) == 1 and "rho = 0.25" in vlines[0].get_label() and "epsilon = 3.86" in vlines[0].get_label()
    diamonds = [ln for ln in ax.get_lines() if ln.get_marker() == "D"]
    assert len(diamonds) == 3  # each group size's error at the configured charge
    # the smallest group cannot be read at this budget: a note says so, pointing at its line
    notes = [a for a in ax.texts if "group size 50:" in a.get_text()]
    assert len(notes) == 1 and "says nothing" in notes[0].get_text() and "configured rho 0.25" in notes[0].get_text()
    assert not [a for a in ax.texts if "group size 500:" in a.get_text() or "group size 5,000:" in a.get_text()]
    path = charts.explorer_chart(rows, tmp_path / "ex.png", "cap", statistic="mean", error_column="rel_halfwidth",
                                 configured=0.25, delta=1e-7)
    assert Path(path).read_bytes()[:8] == PNG


def test_explorer_figure_without_configured_or_delta_and_without_useless_groups():
    rows = [r for r in aov_explorer_rows() if r["group_size"] == 5000]
    fig = charts.build_explorer_figure(rows, statistic="mean", error_column="rel_halfwidth")
    ax = fig.axes[0]
    assert not ax.child_axes  # no delta: no epsilon axis
    assert not [t for t in ax.texts if "says nothing" in t.get_text()]
    assert not [ln for ln in ax.get_lines() if ln.get_marker() == "D"]


def test_explorer_pure_dp_axis_is_epsilon_and_many_budgets_get_1_2_5_ticks():
    rows = [{"release": "r", "measure": "pure_dp", "statistic": "count", "budget": b, "group_size": 100,
             "rel_halfwidth": 3.0 / b, "expected_rel_error": 1.0 / b}
            for b in (0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.2, 0.3, 0.5, 1, 2, 3)]
    fig = charts.build_explorer_figure(rows, error_column="rel_halfwidth", configured=1, delta=1e-7)
    ax = fig.axes[0]
    fig.canvas.draw()
    assert ax.get_xlabel().startswith("epsilon") and not ax.child_axes  # delta unused for pure DP
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert labels == ["0.01", "0.02", "0.05", "0.1", "0.2", "0.5", "1", "2"]
    (note,) = [t for t in ax.texts if "group size 100:" in t.get_text()]
    assert "says nothing" in note.get_text() and "+-300%" in note.get_text() and "configured epsilon 1" in note.get_text()


def test_aov_figure_marks_a_group_whose_interval_is_wider_than_its_value():
    rows = release_rows("mean", REGIONS, value=40.0, half=3.0)
    rows[0].update(ci_low=0.0, ci_high=95.0)  # half-width 47.5 >= 40: the interval says nothing
    fig = charts.build_aov_figure(rows, "caption")
    ax = fig.axes[0]
    assert ax.patches[0].get_hatch() == "//" and not ax.patches[1].get_hatch()
    (note,) = [t for t in ax.texts if "says nothing" in t.get_text()]
    assert "region_01" in note.get_text() and "region_02" not in note.get_text()
    clean = charts.build_aov_figure(release_rows("mean", REGIONS, value=40.0, half=3.0))
    assert not [t for t in clean.axes[0].texts if "says nothing" in t.get_text()]
