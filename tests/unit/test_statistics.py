"""Multi-statistic release specs, plans and post-processing (no Spark)."""

from __future__ import annotations

import copy
import json
import math
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from dp_spark.accountant import Accountant
from dp_spark.core.budget import PureDP, ZCDP
from dp_spark.config import load_release_spec, release_spec_from_dict
from dp_spark.errors import ConfigError, DpSparkError
from dp_spark.statistics.components import Component
from dp_spark.statistics.plan import plan_query
from dp_spark.statistics.quantile import quantile_from_histogram

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "conf/releases/orders_by_day_region.yaml"


def base(where: bool = True) -> dict:
    d = yaml.safe_load(SHIPPED.read_text())
    if not where:
        d.pop("where")
    return d


def spec_of(d: dict):
    return release_spec_from_dict(d, "test.yaml")


class ZeroSource:
    def discrete_laplace(self, scale, n):
        return [0] * n

    def discrete_gaussian(self, sigma, n):
        return [0] * n


def test_shipped_example_parses_to_60_tuples_and_6_statistics():
    s = load_release_spec(SHIPPED)
    assert s.cells == 60 and len(s.statistics) == 6 and s.metric is None
    assert s.key_columns == ("day", "region")
    assert s.keys[0] == '["2026-11-01","region_01"]'
    assert s.columns == ("user_id", "day", "region", "order_value")
    assert s.canonical()["form"] == "statistics"


def test_single_metric_specs_keep_their_canonical_shape():
    for f in ("dau_daily.yaml", "aov_by_region.yaml"):
        s = load_release_spec(ROOT / "conf/releases" / f)
        c = s.canonical()
        assert "form" not in c and "statistics" not in c and c["metric"] == s.metric
        assert s.where is None and "where" not in c
    # ... and run as their rewrite into the statistics form, under the names they published
    dau = load_release_spec(ROOT / "conf/releases/dau_daily.yaml")
    assert [(x.name, x.kind) for x in dau.statistics] == [("distinct_units", "distinct_units")]
    assert dau.key_sets == (dau.group_by,) and dau.keys == dau.group_by.values
    aov = load_release_spec(ROOT / "conf/releases/aov_by_region.yaml")
    assert [(x.name, x.kind) for x in aov.statistics] == [("count", "count"), ("mean", "mean")]
    mean = aov.statistics[1]
    assert (mean.clamp.lower, mean.clamp.upper) == (aov.value.lower, aov.value.upper)
    assert (mean.option("assumed_group_size"), mean.option("min_count"), mean.option("assumed_mean")) == (
        aov.mean.assumed_group_size, aov.mean.min_count, aov.mean.assumed_mean)


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d["statistics"].append({"name": "x", "kind": "median_absolute"}), "statistics[6].kind"),
    (lambda d: d["statistics"][5].update(q=1.0), "statistics[5].q"),
    (lambda d: d["statistics"][5].update(q=0), "statistics[5].q"),
    (lambda d: d.update(where="status = 'paid'"), "where"),
    (lambda d: (d["statistics"].__setitem__(slice(None), d["statistics"][:2])), "where"),
    (lambda d: d.update(where="order_value > (SELECT max(order_value) FROM t)"), "where"),
    (lambda d: d.update(where="sum(order_value) > 3"), "where"),
    (lambda d: d.update(where="rand() < 0.5"), "where"),
    (lambda d: d.update(where="row_number() OVER (ORDER BY day) < 3"), "where"),
    (lambda d: d.update(where="(order_value > 3"), "where"),
    (lambda d: d["group_by"].append(copy.deepcopy(d["group_by"][1])), "group_by"),
    (lambda d: d.update(max_cells=359), "group_by.public_keys"),
    (lambda d: d["statistics"].append({"name": "p", "kind": "distinct", "column": "product_id"}), "statistics[6].kind"),
    (lambda d: d["statistics"][0].update(weight=2), "statistics"),
    (lambda d: d["statistics"].append({"name": "users", "kind": "count"}), "statistics"),
    (lambda d: d["statistics"][2].update(lower=600), "statistics[2]"),
    (lambda d: d["statistics"][2].pop("column"), "statistics[2].column"),
    (lambda d: d.update(metric="count"), "metric"),
    (lambda d: d["statistics"][1].update(column="order_value"), "statistics[1].column"),
])
def test_bad_specs_are_refused_before_any_data(mutate, field):
    d = base()
    mutate(d)
    with pytest.raises(DpSparkError) as exc:
        spec_of(d)
    assert f"'{field}'" in str(exc.value), str(exc.value)


def test_where_may_name_declared_columns_and_row_wise_functions():
    d = base()
    d["columns"] = ["user_id", "day", "region", "order_value", "status"]
    d["where"] = "status IN ('paid', 'shipped') AND lower(region) <> 'test' AND `order_value` BETWEEN 0 AND 1e6"
    assert spec_of(d).where == d["where"]


def test_errors_never_echo_the_where_expression():
    d = base()
    d["where"] = "secret_col = 'alice@example.com'"
    with pytest.raises(ConfigError) as exc:
        spec_of(d)
    assert "alice@example.com" not in str(exc.value)


def test_components_are_shared_and_the_split_is_exact():
    s = load_release_spec(SHIPPED)
    p = plan_query(s)
    kinds = [c.kind for c in p.components]
    # count, sum, mean and stddev of one column share one row count and one normalised sum
    assert kinds == ["units", "rows", "nsum", "nsumsq", "hist"]
    assert sum(p.fractions) == 1 and all(f > 0 for f in p.fractions)
    cost = Accountant("zcdp").compose([x.event for x in p.statistics])
    assert cost.fits_in(s.charge)
    assert len(p.event.leaves()) == 5
    # each component prices all 60 cells (hist: 60 x 64 entries)
    assert [x.event.cells for x in p.statistics] == [60, 60, 60, 60, 60 * 64]


def test_a_lone_sum_uses_one_clamped_sum_and_pure_dp_works():
    d = base()
    d["statistics"] = [{"name": "revenue", "kind": "sum", "column": "order_value", "lower": 0, "upper": 500}]
    d["budget"] = {"id": "demo_events_user_pure", "measure": "pure_dp", "epsilon": 1}
    p = plan_query(spec_of(d))
    assert [c.kind for c in p.components] == ["sum"]
    assert p.statistics[0].mechanism == "discrete_laplace"
    d["statistics"][0].update(lower=-500)  # centred: the normalised sum is the sum
    assert [c.kind for c in plan_query(spec_of(d)).components] == ["nsum"]


def test_weights_give_each_statistic_its_share():
    d = base(where=False)
    d["statistics"] = [{"name": "users", "kind": "distinct_units", "weight": 3},
                       {"name": "orders", "kind": "count", "weight": 1}]
    p = plan_query(spec_of(d))
    assert p.fractions == (Fraction(3, 4), Fraction(1, 4))


def test_default_split_follows_the_error_model():
    # two counts with equal sensitivity and equal error weight: equal shares
    d = base(where=False)
    d["bounds"] = {"max_rows_per_unit": 1, "max_partitions_per_unit": 1}
    d["statistics"] = [{"name": "users", "kind": "distinct_units"}, {"name": "orders", "kind": "count"}]
    assert plan_query(spec_of(d)).fractions == (Fraction(1, 2), Fraction(1, 2))


def test_component_sensitivities_follow_the_enforced_bounds():
    s = load_release_spec(SHIPPED)
    b, rel = s.bounds, s.neighbouring  # K=10, L0=3, Linf=5
    clamp = s.statistics[2].clamp
    rows = Component("rows").plan(b, rel, ZCDP(1), 60)
    assert rows.sensitivity_grid.l1 == 10 and rows.sensitivity_grid.l2_squared == 75  # min(K^2, L0 Linf^2)
    units = Component("units").plan(b, rel, ZCDP(1), 60)
    assert units.sensitivity_grid.l1 == 3 and units.sensitivity_grid.l2_squared == 3
    hist = Component("hist", clamp, bins=64).plan(b, rel, ZCDP(1), 60)
    assert hist.sensitivity_grid == rows.sensitivity_grid
    sq = Component("nsumsq", clamp)
    k2, bound = sq.square_grid
    # per row |x^2 - W^2/2| <= W^2/2 = 31250; on its grid, bound S; L1 = min(K, L0 Linf) S
    assert bound * Fraction(2) ** k2 >= 31250 and (bound - 1) * Fraction(2) ** k2 < 31250
    assert sq.plan(b, rel, ZCDP(1), 60).sensitivity_grid.l1 == 10 * bound
    nsum = Component("nsum", clamp).plan(b, rel, ZCDP(1), 60)
    assert nsum.sensitivity == rows.sensitivity.scaled(250)  # W = 250 per row


def _truth_partials(plan, values_by_cell):
    """Exact partials of each component from python values (one row per value, one unit each)."""
    from dp_spark.mechanisms.release import value_to_grid
    from dp_spark.core.units import ContributionBounds

    out = {}
    for i, vals in values_by_cell.items():
        d = {"dp_rows": len(vals), "dp_units": len(vals)}
        for c in plan.components:
            if c.clamp is None:
                continue
            b = ContributionBounds(max_rows_per_unit=1, lower=c.clamp.lower, upper=c.clamp.upper)
            fixed = [value_to_grid(v, b, c.clamp.grid_exponent) for v in vals]
            from dp_spark.statistics.components import _tag

            t = _tag(c.clamp)
            d[f"dp_s_{t}_lo"] = sum(fixed)  # exact as one part
            if c.kind == "nsumsq":
                k2, bound = c.square_grid
                unit = Fraction(2) ** c.clamp.grid_exponent
                ys = [min(max(round(((f * unit - c.clamp.midpoint) ** 2 - c.clamp.half_width ** 2 / 2)
                                    / Fraction(2) ** k2), -bound), bound) for f in fixed]
                d[f"dp_sq_{t}_lo"] = sum(ys)
            if c.kind == "hist":
                tb = _tag(c.clamp, str(c.bins))
                for j in range(c.bins):
                    d[f"dp_h_{tb}_{j}"] = 0
                for v in vals:
                    j = min(int((v - float(c.clamp.lower)) / float(c.clamp.upper - c.clamp.lower) * c.bins), c.bins - 1)
                    d[f"dp_h_{tb}_{j}"] += 1
        out[i] = d
    return out


def test_post_processing_without_noise_gives_the_exact_statistics():
    d = base()
    d["group_by"] = [{"column": "region", "public_keys": {"values": ["a", "b"]}}]
    d["bounds"] = {"max_rows_per_unit": 1}
    d["statistics"] = [dict(s, **({"bins": 100} if s["kind"] == "quantile" else {})) for s in d["statistics"]]
    s = spec_of(d)
    p = plan_query(s)
    vals = [10.0, 20.0, 30.0, 40.0, 250.0, 410.0, 60.0]
    cells = p.noise(_truth_partials(p, {0: vals}), ZeroSource())
    got = {(c["statistic"], c["key"]): c for c in cells}
    assert len(cells) == 2 * 6
    assert got[("orders", "a")]["value"] == 7 and got[("users", "a")]["value"] == 7
    assert got[("revenue", "a")]["value"] == pytest.approx(sum(vals))
    assert got[("aov", "a")]["value"] == pytest.approx(sum(vals) / 7)
    sd = math.sqrt(sum((v - sum(vals) / 7) ** 2 for v in vals) / 7)
    assert got[("order_sd", "a")]["value"] == pytest.approx(sd, rel=1e-6)
    assert got[("median_order", "a")]["value"] == pytest.approx(40.0, abs=5.0)  # bins of width 5
    assert got[("orders", "b")]["value"] == 0 and got[("orders", "b")]["keys"] == {"region": "b"}
    for c in cells:
        assert c["ci_low"] <= c["value"] <= c["ci_high"], c


def test_quantile_estimate_inverts_the_cdf():
    assert quantile_from_histogram([0, 10, 10, 0], 0.5, 0.0, 4.0) == pytest.approx(2.0)
    assert quantile_from_histogram([0, 0, 0, 0], 0.5, 0.0, 4.0) == 2.0  # nothing: the midpoint
    assert quantile_from_histogram([5, 0, 0, 5], 0.25, 0.0, 4.0) == pytest.approx(0.5)


def test_the_privacy_core_imports_without_pyspark():
    import subprocess
    import sys

    code = ("import sys; sys.modules['pyspark'] = None\n"
            "import dp_spark.statistics.plan, dp_spark.statistics.counts, dp_spark.statistics.moments, "
            "dp_spark.statistics.quantile, dp_spark.config\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_too_many_noisy_entries_are_refused_before_any_data():
    d = base()
    d["max_cells"] = 1_000_000
    d["group_by"][1]["public_keys"]["values"] = [f"r{i}" for i in range(10_000)]  # 30 x 10,000 tuples
    d["statistics"] = [{"name": "m", "kind": "quantile", "q": 0.5, "column": "order_value", "lower": 0,
                        "upper": 500, "bins": 100}]
    with pytest.raises(ConfigError, match="noisy entries"):
        plan_query(spec_of(d))
