"""One release path (issue 26): every feature on every spec, whichever form it is written in.

A single-``metric`` spec is rewritten at parse time into the ``statistics`` form; these tests
check the features that used to live on one form only, on both: ``min_group_size``,
``for_keys``, ``where``, the explorer, ``dp-spark plan``, the utility evaluation, and the
mean's budget split (the better of the two former behaviours, measured here).
"""

from __future__ import annotations

import copy
import itertools
import math
from fractions import Fraction
from pathlib import Path

import pytest

from dp_spark.config import load_release_spec, release_spec_from_dict
from dp_spark.engine import plan_for, release_id_for, threshold_cells
from dp_spark.errors import ConfigError
from dp_spark.evaluation import explorer, utility
from dp_spark.mechanisms.mean import mean_split_error
from dp_spark.mechanisms.samplers import NoiseSource, SeededNoiseSource
from dp_spark.statistics.plan import _snap, plan_query
from tests.shipped_specs import shipped_spec_paths

ROOT = Path(__file__).resolve().parents[2]
REGIONS = ["north", "south", "east", "west"]


def multi(**changes) -> dict:
    d = {
        "name": "multi", "dataset": "demo_events", "privacy_unit": {"kind": "user", "column": "user_id"},
        "group_by": [{"column": "region", "public_keys": {"values": REGIONS}}],
        "bounds": {"max_rows_per_unit": 5, "max_partitions_per_unit": 1},
        "statistics": [{"name": "orders", "kind": "count"}, {"name": "users", "kind": "distinct_units"},
                       {"name": "aov", "kind": "mean", "column": "order_value", "lower": 0, "upper": 500,
                        "min_count": 5}],
        "budget": {"id": "b", "measure": "zcdp", "rho": "0.5"},
    }
    d.update(changes)
    return d


def single(metric="mean", **changes) -> dict:
    d = {
        "name": "single", "dataset": "demo_events", "privacy_unit": {"kind": "user", "column": "user_id"},
        "metric": metric, "group_by": {"column": "region", "public_keys": {"values": REGIONS}},
        "bounds": {"max_rows_per_unit": 5, "max_partitions_per_unit": 1},
        "budget": {"id": "b", "measure": "zcdp", "rho": "0.5"},
    }
    if metric in ("sum", "mean"):
        d["value"] = {"column": "order_value", "lower": 0, "upper": 500}
    d.update(changes)
    return d


ZERO = type("Zero", (NoiseSource,), {"name": "zero", "discrete_laplace": lambda self, s, k: [0] * k,
                                     "discrete_gaussian": lambda self, s, k: [0] * k})()


# --------------------------------------------------------------------------------------
# the mean's budget split: the numeric optimum, measured against the first-order split
# --------------------------------------------------------------------------------------
def _first_order_nsum_share(spec) -> Fraction:
    """What plan_query's first-order rule (module docstring of dp_spark.statistics.plan) gives
    the normalised sum of a count + mean release."""
    from dp_spark.statistics.base import kind_of

    comps = []
    coeffs: dict = {}
    for s in spec.statistics:
        cs = kind_of(s.kind).components(s, rows_shared=True)
        comps += [c for c in cs if c not in comps]
        for c, a in kind_of(s.kind).error_coefficients(s, cs).items():
            coeffs[c] = coeffs.get(c, 0.0) + a
    measure = spec.charge.MEASURE
    sens = {c: c.real_sensitivity(spec.bounds, spec.neighbouring, spec.cells, measure) for c in comps}
    raw = {c: (coeffs[c] ** 0.5) * sens[c] if measure == "zcdp" else (coeffs[c] * sens[c] ** 2) ** (1 / 3)
           for c in comps}
    fr = dict(zip(comps, _snap([raw[c] for c in comps])))
    return next(f for c, f in fr.items() if c.kind == "nsum")


def test_one_mean_takes_the_numeric_split_which_is_never_worse_than_the_first_order_split():
    """Measured at the assumed group size, by the mean's own error model (mean_split_error:
    the worst-case expected squared error of the clamped, floored estimator, count noise
    included): the numeric optimum is never worse than the first-order split (within the
    k/100 grid of its search), and much better for small groups with Linf > 1."""
    ratios = []
    for nb, measure, n, linf, assumed in itertools.product(
            ["add_remove_unit", "replace_unit"], ["pure_dp", "zcdp"], [5, 20, 100, 900], [1, 10], [None, 45]):
        d = single("mean", neighbouring=nb, bounds={"max_rows_per_unit": 10, "max_partitions_per_unit": 1,
                                                     "max_rows_per_partition": linf},
                   budget={"id": "b", "measure": measure, **({"epsilon": 1} if measure == "pure_dp" else {"rho": "0.25"})},
                   mean={"assumed_group_size": n, "min_count": 1, **({} if assumed is None else {"assumed_mean": assumed})})
        spec = release_spec_from_dict(d)
        plan = plan_for(spec)
        mech = "discrete_laplace" if measure == "pure_dp" else "discrete_gaussian"
        b = plan.spec.bounds.__class__(max_rows_per_unit=10, max_partitions_per_unit=1, max_rows_per_partition=linf,
                                       lower=spec.value.lower, upper=spec.value.upper)

        def err(f):
            return mean_split_error(f, b, spec.neighbouring, n, mech, spec.charge, 1, spec.mean.assumed_mean)

        numeric, first_order = err(plan.mean_split), err(_first_order_nsum_share(spec))
        assert numeric <= first_order * 1.005, (nb, measure, n, linf, assumed)
        ratios.append(first_order / numeric)
        # the plan spends exactly that split
        shares = {c.kind: f for c, f in zip(plan.components, plan.fractions)}
        assert shares == {"nsum": plan.mean_split, "rows": 1 - plan.mean_split}
    assert max(ratios) > 1.3  # small groups: the first-order model misses the floor and the clamp


def test_the_numeric_split_is_used_for_one_mean_only():
    legacy = release_spec_from_dict(single("mean", mean={"assumed_group_size": 50}))
    alone = release_spec_from_dict(multi(statistics=[multi()["statistics"][2]]))
    with_count = release_spec_from_dict(multi(statistics=[{"name": "n", "kind": "count"}, multi()["statistics"][2]]))
    assert all(plan_for(s).mean_split is not None for s in (legacy, alone, with_count))
    mixed = release_spec_from_dict(multi())  # a distinct count too: the first-order split over all
    weighted = release_spec_from_dict(multi(statistics=[{"name": "n", "kind": "count", "weight": 1},
                                                        dict(multi()["statistics"][2], weight=3)]))
    assert plan_for(mixed).mean_split is None and plan_for(weighted).mean_split is None
    # the charge is spent exactly
    for s in (legacy, alone, mixed):
        assert sum(plan_for(s).fractions) == 1


# --------------------------------------------------------------------------------------
# min_group_size on both forms
# --------------------------------------------------------------------------------------
def test_min_group_size_on_statistics_specs_parses_and_joins_the_canonical_form_only_when_set():
    plain = release_spec_from_dict(multi())
    rule = release_spec_from_dict(multi(min_group_size={"threshold": 20, "strategy": "merge_other"}))
    assert "min_group_size" not in plain.canonical()
    assert rule.canonical()["min_group_size"] == {"threshold": 20, "strategy": "merge_other", "other_key": "__other__"}
    assert release_id_for(plain, "t", 1, "official") != release_id_for(rule, "t", 1, "official")
    assert rule.group_size_statistic == "orders"
    users_only = release_spec_from_dict(multi(statistics=multi()["statistics"][1:], min_group_size=5))
    assert users_only.group_size_statistic == "users"


@pytest.mark.parametrize("changes, field", [
    ({"statistics": [{"name": "v", "kind": "sum", "column": "x", "lower": 0, "upper": 1}], "min_group_size": 5},
     "min_group_size"),
    ({"min_group_size": {"threshold": 5, "strategy": "merge_other"},
      "group_by": [{"column": "region", "public_keys": {"values": REGIONS}},
                   {"column": "day", "public_keys": {"values": ["a", "b"]}}]}, "min_group_size.strategy"),
    ({"min_group_size": {"threshold": 5, "strategy": "merge_other"},
      "statistics": [{"name": "n", "kind": "count"},
                     {"name": "sd", "kind": "stddev", "column": "x", "lower": 0, "upper": 1}]}, "min_group_size.strategy"),
    ({"min_group_size": {"threshold": 5, "other_key": "north"}}, "min_group_size.other_key"),
])
def test_min_group_size_refusals_on_statistics_specs(changes, field):
    with pytest.raises(ConfigError, match=f"field '{field}'"):
        release_spec_from_dict(multi(**changes))


def _cells(spec, sizes, source=None, mean=40):
    plan = plan_for(spec)
    k = next((s.clamp.grid_exponent for s in spec.statistics if s.clamp is not None), 0)
    partials = {key: {"rows": n, "units": n, "sum_fixed": n * mean * 2 ** (-k)} for key, n in zip(spec.keys, sizes)}
    components: dict = {}
    cells = utility.noise_by_key(plan, partials, source or ZERO, components=components)
    return threshold_cells(spec, cells, components)


@pytest.mark.parametrize("form", ["single", "multi"])
def test_suppress_hides_every_statistic_of_a_small_key(form):
    d = (single("mean", min_group_size=20) if form == "single" else multi(min_group_size=20))
    spec = release_spec_from_dict(d)
    out, suppressed = _cells(spec, [5, 300, 10, 900])
    assert suppressed == ["north", "east"]
    for c in out:
        hidden = c["key"] in ("north", "east")
        assert c["suppressed"] is hidden
        assert math.isnan(c["value"]) is hidden
        if hidden and c["statistic"] in ("mean", "aov"):  # data-dependent accuracy figures go too
            assert math.isnan(c["noise_stddev"]) and math.isnan(c["expected_abs_error"])


@pytest.mark.parametrize("form", ["single", "multi"])
def test_merge_other_combines_the_small_keys(form):
    d = (single("mean", min_group_size={"threshold": 20, "strategy": "merge_other", "other_key": "rest"})
         if form == "single" else multi(min_group_size={"threshold": 20, "strategy": "merge_other", "other_key": "rest"}))
    spec = release_spec_from_dict(d)
    out, suppressed = _cells(spec, [15, 300, 10, 900])
    assert suppressed == ["north", "east"]
    rest = {c["statistic"]: c for c in out if c["key"] == "rest"}
    assert set(rest) == {s.name for s in spec.statistics}
    count = rest[spec.group_size_statistic]
    assert count["value"] == 25 and not count["suppressed"] and count["keys"] == {"region": "rest"}
    mean = rest["mean" if form == "single" else "aov"]
    assert mean["value"] == pytest.approx(40) and mean["ci_low"] <= 40 <= mean["ci_high"]
    if form == "multi":
        assert rest["users"]["value"] == 25


# --------------------------------------------------------------------------------------
# for_keys, where, plan, explorer, utility on both forms
# --------------------------------------------------------------------------------------
def test_for_keys_restricts_either_form():
    legacy = release_spec_from_dict(single("count"))
    one = legacy.for_keys(("east",), name_suffix="_e")
    assert one.keys == ("east",) and one.group_by.values == ("east",) and one.cells == 1
    assert one.canonical()["group_by"]["keys"] == ["east"]
    days = multi(group_by=[{"column": "day", "public_keys": {"dates": {"start": "2026-11-01", "end": "2026-11-03"}}},
                           {"column": "region", "public_keys": {"values": REGIONS}}],
                 bounds={"max_rows_per_unit": 5, "max_partitions_per_unit": 3})
    m = release_spec_from_dict(days).for_keys(("2026-11-02",), name_suffix="_20261102")
    assert m.cells == 4 and m.bounds.max_partitions_per_unit == 3 and m.name == "multi_20261102"
    with pytest.raises(ConfigError, match="no group_by"):
        release_spec_from_dict(single("count", group_by=None)).for_keys(("x",), name_suffix="_x")


def test_where_on_the_single_metric_form():
    plain = release_spec_from_dict(single("count"))
    where = release_spec_from_dict(single("count", where="region <> 'test'"))
    assert "where" not in plain.canonical() and where.canonical()["where"] == "region <> 'test'"
    assert where.version() != plain.version()
    with pytest.raises(ConfigError, match="'where'"):
        release_spec_from_dict(single("count", where="rand() < 0.5"))


@pytest.mark.parametrize("path", shipped_spec_paths(), ids=lambda p: p.name)
def test_plan_and_explorer_on_every_shipped_spec(path):
    from dp_spark.cli import plan_rows

    spec = load_release_spec(path)
    rows = [r for r in plan_rows(spec, None, 500) if r["statistic"] != "key_selection"]
    assert [r["statistic"] for r in rows] == [s.name for s in spec.statistics]
    assert all(r["expected_abs_error"] > 0 and r["interval_half_width"] > 0 for r in rows)
    amount = spec.charge.epsilon if spec.charge.MEASURE == "pure_dp" else spec.charge.rho
    ex = explorer.explore(spec, [500, 5000], [amount, amount * 4])
    assert {r["statistic"] for r in ex} == {s.name for s in spec.statistics}
    for name in {r["statistic"] for r in ex}:  # more budget, less noise
        errs = [r["expected_abs_error"] for r in ex if r["statistic"] == name and r["group_size"] == 500]
        assert errs[1] < errs[0]


def test_explorer_predicts_what_the_engine_publishes_on_a_statistics_spec():
    spec = release_spec_from_dict(multi(statistics=multi()["statistics"] + [
        {"name": "revenue", "kind": "sum", "column": "order_value", "lower": 0, "upper": 500}]))
    n, mean = 300, Fraction(80)
    rows = {r["statistic"]: r for r in explorer.explore(spec, [n], [Fraction(1, 2)], assumed_mean=mean)}
    k = spec.statistics[2].clamp.grid_exponent
    plan = plan_for(spec)
    partials = {key: {"rows": n, "units": n, "sum_fixed": n * mean * 2 ** (-k)} for key in spec.keys}
    cells = {c["statistic"]: c for c in utility.noise_by_key(plan, partials, ZERO) if c["key"] == "north"}
    assert set(rows) == set(cells)
    for name, r in rows.items():
        c = cells[name]
        assert r["halfwidth"] == pytest.approx(max(c["ci_high"] - c["value"], c["value"] - c["ci_low"]), rel=1e-12)
        assert r["expected_abs_error"] == pytest.approx(c["expected_abs_error"], rel=1e-12)
    # a relative target is met at the smallest budget found, for the headline statistic
    b = explorer.smallest_budget(spec, 1000, 0.05)
    at = [r for r in explorer.explore(spec, [1000], [b.rho]) if r["statistic"] == "orders"]
    assert at[0]["rel_halfwidth"] <= 0.05


def test_utility_evaluation_on_a_statistics_spec(monkeypatch):
    monkeypatch.setenv("DP_SPARK_TEST_MODE", "1")
    spec = release_spec_from_dict(multi(statistics=multi()["statistics"] + [
        {"name": "revenue", "kind": "sum", "column": "order_value", "lower": 0, "upper": 500}]))
    cells = {k: [[40.0] * 3] * n for k, n in zip(REGIONS, (10, 100, 1000, 0))}
    partials, unbounded = utility.synthetic_partials(spec, cells)
    frame, summary = utility.evaluate(spec, partials, repeats=200, seed=7, unbounded=unbounded)
    assert set(frame["statistic"]) == {"orders", "users", "aov", "revenue"}
    big = frame[(frame.key == "east")].set_index("statistic")
    assert big.loc["orders", "true_bounded"] == 3000 and big.loc["users", "true_bounded"] == 1000
    assert big.loc["revenue", "true_bounded"] == 120_000 and big.loc["aov", "true_bounded"] == 40
    assert 0.85 <= summary["statistics"]["orders"]["coverage"] <= 1
    with pytest.raises(ConfigError, match="utility evaluation"):
        utility.evaluate(load_release_spec(ROOT / "conf/releases/orders_by_day_region.yaml"), {}, repeats=1)


def test_seeded_noise_of_a_rewritten_spec_is_the_one_paths():
    """The single-metric form and its rewrite written out as statistics publish the same cells
    (same components, same split, same draws), under different release ids."""
    legacy = release_spec_from_dict(single("mean", mean={"assumed_group_size": 50, "min_count": 3}))
    written = release_spec_from_dict(multi(
        group_by={"column": "region", "public_keys": {"values": REGIONS}}, name="single",
        statistics=[{"name": "count", "kind": "count", "assumed_group_size": 50},
                    {"name": "mean", "kind": "mean", "column": "order_value", "lower": 0, "upper": 500,
                     "assumed_group_size": 50, "min_count": 3}]))
    assert legacy.statistics == written.statistics
    partials = {k: {"rows": n, "units": n, "sum_fixed": n * 40 * 2 ** 20} for k, n in zip(REGIONS, (5, 50, 500, 0))}
    a = utility.noise_by_key(plan_for(legacy), copy.deepcopy(partials), SeededNoiseSource(3))
    b = utility.noise_by_key(plan_for(written), partials, SeededNoiseSource(3))
    assert a == b
    assert release_id_for(legacy, "t", 1, "official") != release_id_for(written, "t", 1, "official")
