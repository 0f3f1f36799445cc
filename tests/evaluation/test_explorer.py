"""The epsilon explorer: errors from the engine's own plan, smallest budget, the CLI."""

from __future__ import annotations

import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from dp_spark.core.budget import PureDP, ZCDP
from dp_spark.config import load_release_spec, release_spec_from_dict
from dp_spark.evaluation import explorer

ROOT = Path(__file__).resolve().parents[2]
DAU = ROOT / "conf/releases/dau_daily.yaml"
AOV = ROOT / "conf/releases/aov_by_region.yaml"


def make_spec(metric, measure, budget, *, k=1, value=(0, 500)):
    d = {
        "name": f"x_{metric}", "dataset": "demo_events",
        "privacy_unit": {"kind": "user", "column": "user_id"}, "metric": metric,
        "group_by": {"column": "region", "public_keys": {"values": ["a", "b", "c"]}},
        "bounds": {"max_rows_per_unit": k, "max_partitions_per_unit": 1},
        "budget": {"id": "b", "measure": measure, ("epsilon" if measure == "pure_dp" else "rho"): budget},
    }
    if metric in ("sum", "mean"):
        d["value"] = {"column": "order_value", "lower": value[0], "upper": value[1]}
    if metric == "mean":
        d["mean"] = {"assumed_group_size": 300, "min_count": 20}
    return release_spec_from_dict(d)


def test_explore_rows_follow_the_engine_plan():
    from dp_spark.engine import plan_for

    spec = load_release_spec(DAU)
    rows = explorer.explore(spec, [50, 500, 5000], [0.1, 0.25, 1])
    assert len(rows) == 9 and {r["statistic"] for r in rows} == {"distinct_units"}
    assert all(r["measure"] == "zcdp" for r in rows)
    # at the spec's own budget the explorer's stddev is the release table's noise_stddev
    p = plan_for(spec).statistics[0]
    at = [r for r in rows if r["budget"] == 0.25]
    assert all(r["noise_stddev"] == pytest.approx(p.stddev_grid) for r in at)
    assert all(r["halfwidth"] == p.halfwidth_grid(Fraction(1, 20)) for r in at)
    # more budget -> less error; bigger group -> smaller relative error, same absolute error
    for n in (50, 500, 5000):
        errs = [r["expected_abs_error"] for r in sorted(rows, key=lambda r: r["budget"]) if r["group_size"] == n]
        assert errs == sorted(errs, reverse=True)
    for b in (0.1, 0.25, 1):
        rel = [r["expected_rel_error"] for r in rows if r["budget"] == b]
        assert rel == sorted(rel, reverse=True)
        assert len({round(r["expected_abs_error"], 9) for r in rows if r["budget"] == b}) == 1


def test_explore_mean_reports_count_and_mean():
    spec = load_release_spec(AOV)
    rows = explorer.explore(spec, [30, 3000], [0.25], assumed_mean=60)
    assert [r["statistic"] for r in rows] == ["count", "mean", "count", "mean"]
    small, large = rows[1], rows[3]
    assert small["true_value"] == 60 and small["expected_rel_error"] > 10 * large["expected_rel_error"]
    assert 0 < large["halfwidth"] < small["halfwidth"]
    assert rows[0]["mean_split"] is not None


def test_explore_rejects_bad_input():
    from dp_spark.errors import ConfigError

    spec = load_release_spec(DAU)
    with pytest.raises(ConfigError):
        explorer.explore(spec, [0], [0.1])
    with pytest.raises(Exception):
        explorer.explore(spec, [10], [-1])


CASES = [
    ("count", "pure_dp", 1, {"k": 5}, None),
    ("count", "zcdp", Fraction(1, 4), {"k": 5}, None),
    ("distinct_units", "zcdp", Fraction(1, 4), {}, None),
    ("sum", "pure_dp", 1, {"k": 3}, 80),
    ("sum", "zcdp", Fraction(1, 4), {"k": 3}, 80),
    ("mean", "pure_dp", 1, {"k": 3}, 80),
    ("mean", "zcdp", Fraction(1, 4), {"k": 3}, 80),
]


@pytest.mark.parametrize("metric,measure,budget,kw,assumed_mean", CASES)
def test_smallest_budget_meets_the_target_and_ninety_percent_does_not(metric, measure, budget, kw, assumed_mean):
    spec = make_spec(metric, measure, budget, **kw)
    n, target = 400, 0.05
    b = explorer.smallest_budget(spec, n, target, 0.95, assumed_mean=assumed_mean)
    assert isinstance(b, PureDP if measure == "pure_dp" else ZCDP)
    value = b.epsilon if measure == "pure_dp" else b.rho
    stat = explorer.headline_statistic(spec)

    def rel(v):
        rows = explorer.explore(spec, [n], [v], assumed_mean=assumed_mean, confidence=0.95)
        return next(r["rel_halfwidth"] for r in rows if r["statistic"] == stat)

    assert rel(value) <= target
    assert rel(value * Fraction(9, 10)) > target
    # and it is tight: 0.1% less no longer meets it
    assert rel(value * Fraction(999, 1000)) > target


def test_smallest_budget_uses_the_calibration_inverse_for_counts():
    from dp_spark.mechanisms.calibration import min_epsilon_for_error
    from dp_spark.core.units import Aggregate, sensitivity

    spec = make_spec("count", "pure_dp", 1, k=5)
    b = explorer.smallest_budget(spec, 1000, 0.02, 0.95)
    l1 = sensitivity(Aggregate.ROW_COUNT, spec.bounds, spec.neighbouring).l1
    inv = min_epsilon_for_error(20, 0.95, l1)
    assert abs(b.epsilon - inv) <= inv * Fraction(1, 10**5)


def test_smallest_budget_of_a_zero_target_is_refused():
    from dp_spark.errors import ConfigError

    with pytest.raises(ConfigError):
        explorer.smallest_budget(load_release_spec(DAU), 100, 0)


def test_format_table_and_chart(tmp_path):
    from dp_spark.evaluation.charts import build_explorer_figure, explorer_chart

    spec = load_release_spec(AOV)
    rows = explorer.explore(spec, [50, 500, 5000], [0.1, 0.5, 2])
    text = explorer.format_table(rows, statistic="mean")
    table = [ln for ln in text.splitlines() if not ln.startswith("* ")]  # the footnote of cut intervals aside
    assert len(table) == 2 + 9 and "rho" in text.splitlines()[0]
    fig = build_explorer_figure(rows, "caption", target=0.05)
    ax = fig.axes[0]
    labels = [l.get_label() for l in ax.get_lines() if not l.get_label().startswith("_")]
    # one line per group size, the key to the hollow points (intervals cut at [0, 500]) and the
    # target (unlabelled guides, e.g. the 100% line, aside)
    assert labels == ["group size 50", "group size 500", "group size 5,000",
                      "hollow: interval cut at the statistic's range", "target 5.0%"]
    assert ax.get_xscale() == "log" and "rho" in ax.get_xlabel()
    path = explorer_chart(rows, tmp_path / "e.png", "caption", target=0.05)
    assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_explore_epsilon_job(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "jobs/explore_epsilon.py"), "--conf", str(AOV), "--group-sizes", "50,500,5000",
         "--budgets", "0.1,0.25,0.5,1,2", "--target", "0.05", "--out", str(out)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "smallest rho" in proc.stdout and "group" in proc.stdout
    pngs = list(out.glob("*.png"))
    assert len(pngs) == 1 and pngs[0].stat().st_size > 1000
    assert (out / "aov_by_region_explorer.csv").exists()
    assert "pyspark" not in proc.stderr  # reads no data, starts no Spark


def test_explore_epsilon_job_rejects_bad_arguments(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "jobs/explore_epsilon.py"), "--conf", str(DAU), "--group-sizes", "x",
         "--budgets", "1", "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2


# --------------------------------------------------------------------------------------
# the explorer predicts exactly what the engine publishes
# --------------------------------------------------------------------------------------


def _engine_cells(spec, n, mean):
    """The engine's cells (QueryPlan.noise) at zero noise for cells of n rows valued ``mean``."""
    from dp_spark.engine import plan_for
    from dp_spark.evaluation.utility import cell_partials
    from dp_spark.mechanisms.release import value_to_grid
    from dp_spark.mechanisms.samplers import NoiseSource

    src = type("Zero", (NoiseSource,), {"name": "zero", "discrete_laplace": lambda self, s, k: [0] * k,
                                        "discrete_gaussian": lambda self, s, k: [0] * k})()
    fixed = n * value_to_grid(mean, spec.bounds, spec.value.grid_exponent) if spec.value is not None else 0
    partials = {key: {"rows": n, "units": n, "sum_fixed": fixed} for key in spec.keys}
    plan = plan_for(spec)
    return {c["statistic"]: c for c in plan.noise(cell_partials(spec, plan, partials), src)
            if c["key"] == spec.keys[0]}


PREDICT = [
    ("count", "pure_dp", 1, {"k": 5}),
    ("count", "zcdp", Fraction(1, 4), {"k": 5}),
    ("distinct_units", "pure_dp", Fraction(1, 2), {}),
    ("distinct_units", "zcdp", Fraction(1, 4), {}),
    ("sum", "pure_dp", 1, {"k": 3}),
    ("sum", "zcdp", Fraction(1, 4), {"k": 3}),
    ("mean", "pure_dp", 1, {"k": 3}),
    ("mean", "zcdp", Fraction(1, 4), {"k": 3}),
]


@pytest.mark.parametrize("metric,measure,budget,kw", PREDICT)
@pytest.mark.parametrize("n", [40, 300, 5000])
def test_explorer_predicts_what_the_engine_publishes(metric, measure, budget, kw, n):
    spec = make_spec(metric, measure, budget, **kw)
    mean = Fraction(80)
    rows = explorer.explore(spec, [n], [budget], assumed_mean=mean)
    cells = _engine_cells(spec, n, mean)
    assert {r["statistic"] for r in rows} == set(cells)
    for r in rows:
        c = cells[r["statistic"]]
        half = max(c["ci_high"] - c["value"], c["value"] - c["ci_low"])
        assert r["halfwidth"] == pytest.approx(half, rel=1e-12, abs=1e-12), r["statistic"]
        assert r["expected_abs_error"] == pytest.approx(c["expected_abs_error"], rel=1e-12), r["statistic"]
        assert r["noise_stddev"] == pytest.approx(c["noise_stddev"], rel=1e-12), r["statistic"]


def test_explorer_uses_the_specs_assumed_mean_and_matches_the_aov_release():
    spec = load_release_spec(AOV)  # assumed_mean: 45, zCDP rho 0.25
    rows = explorer.explore(spec, [900], [Fraction(1, 4)])
    mean_row = next(r for r in rows if r["statistic"] == "mean")
    assert mean_row["assumed_mean"] == 45 and mean_row["true_value"] == 45
    c = _engine_cells(spec, 900, Fraction(45))["mean"]
    assert mean_row["halfwidth"] == pytest.approx(max(c["ci_high"] - c["value"], c["value"] - c["ci_low"]), rel=1e-12)
    assert mean_row["expected_abs_error"] == pytest.approx(c["expected_abs_error"], rel=1e-12)
    # an explicit assumption still wins over the spec's
    other = next(r for r in explorer.explore(spec, [900], [Fraction(1, 4)], assumed_mean=250)
                 if r["statistic"] == "mean")
    assert other["true_value"] == 250 and other["halfwidth"] < mean_row["halfwidth"]
