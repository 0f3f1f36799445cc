"""The vectorised noise step (QueryPlan.noise over numpy vectors) publishes exactly what the
per-cell post-processing publishes: same draws in the same order, equal floats for every cell
of count, distinct_units, sum and mean (the mean's own cases: tests/unit/test_mean_columns.py;
the variance and standard deviation: tests/unit/test_spread_columns.py), and the per-cell path
for values beyond 2^53 grid units."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from dp_spark.config import release_spec_from_dict
from dp_spark.mechanisms.samplers import RecordingNoiseSource, SeededNoiseSource
from dp_spark.statistics.base import kind_of
from dp_spark.statistics.noise import interval_columns, shared_sum_columns
from dp_spark.statistics.plan import plan_query

STATS = [{"name": "rows", "kind": "count"}, {"name": "units", "kind": "distinct_units"},
         {"name": "total", "kind": "sum", "column": "v", "lower": -10, "upper": 100},
         {"name": "centred", "kind": "sum", "column": "v", "lower": -50, "upper": 50},
         {"name": "avg", "kind": "mean", "column": "v", "lower": -10, "upper": 100}]


#: a sum sharing the row count with a bound snapped to the grid (0.3 -> 157287 / 2^19): a
#: midpoint with a long binary expansion
SNAPPED = {"name": "tenth", "kind": "sum", "column": "v", "lower": 0, "upper": 0.3}


@pytest.fixture(autouse=True)
def _test_mode(monkeypatch):
    monkeypatch.setenv("DP_SPARK_TEST_MODE", "1")


def _plan(measure="zcdp", stats=STATS):
    budget = {"id": "b", "measure": measure, **({"rho": 0.5} if measure == "zcdp" else {"epsilon": 1})}
    return plan_query(release_spec_from_dict({
        "name": "vec", "dataset": "x", "privacy_unit": {"kind": "user", "column": "user_id"},
        "group_by": [{"column": "region", "public_keys": {"values": ["a", "b", "c", "d"]}},
                     {"column": "day", "public_keys": {"dates": {"start": "2026-11-01", "end": "2026-11-05"}}}],
        "bounds": {"max_rows_per_unit": 3, "max_partitions_per_unit": 2}, "statistics": stats,
        "budget": budget, "max_cells": 1000}, "vec.yaml"))


def _per_cell(plan, partials, seed):
    """The reference: the per-cell finish of every kind on exact Fractions, from the same draws."""
    src = SeededNoiseSource(seed)
    from dp_spark.statistics.plan import canonical_key, key_tuples
    from dp_spark.mechanisms.release import add_noise

    tuples = key_tuples(plan.spec.key_sets)
    noisy = {}
    for comp, p in zip(plan.components, plan.statistics):
        true = [v for i in range(len(tuples)) for v in comp.true_values(partials.get(i, {}))]
        noisy[comp] = [Fraction(v) * p.grid_unit for v in add_noise(p, true, src)]
    cells = []
    for stat, comps in zip(plan.spec.statistics, plan.stat_components):
        plans = {c: plan.plan_of(c) for c in comps}
        for i, t in enumerate(tuples):
            mine = {c: noisy[c][i] for c in comps}
            cells.append({"statistic": stat.name, "key": canonical_key(plan.spec.key_sets, t),
                          **kind_of(stat.kind).finish(stat, mine, plans, 1 - plan.spec.confidence)})
    return cells


@pytest.mark.parametrize("measure", ["zcdp", "pure_dp"])
@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("stats", ["shipped", "snapped_midpoint"])
def test_vectorised_cells_equal_the_per_cell_finish(measure, seed, stats):
    stats = STATS if stats == "shipped" else STATS + [SNAPPED]
    plan = _plan(measure, stats)
    rng = np.random.default_rng(seed)  # test data only, never noise
    partials = {}
    for i in range(20):
        if rng.random() < 0.8:
            rows = int(rng.integers(0, 30))
            partials[i] = {"dp_rows": rows, "dp_units": int(rng.integers(0, rows + 1))}
            for comp in plan.components:
                if comp.clamp is not None:
                    partials[i][f"{comp.sum_alias}_lo"] = int(rng.integers(0, 2**21))
                    partials[i][f"{comp.sum_alias}_mid"] = int(rng.integers(0, 50))
                    partials[i][f"{comp.sum_alias}_hi"] = int(rng.integers(-2, 2))
    got = plan.noise(partials, SeededNoiseSource(seed))
    want = _per_cell(plan, partials, seed)
    assert len(got) == len(want) == 20 * len(stats)
    for g, w in zip(got, want):
        g = {k: v for k, v in g.items() if k != "keys"}
        assert g == w  # bit-for-bit equal floats, same fields
        assert all(type(v) is not np.float64 for v in g.values())


def test_one_source_call_per_component_in_order():
    plan = _plan()
    src = RecordingNoiseSource(SeededNoiseSource(3))
    plan.noise({}, src)
    assert [c.n for c in src.calls] == [p.cells for p in plan.statistics]
    assert [c.scale for c in src.calls] == [p.scale for p in plan.statistics]


def test_values_beyond_2_53_take_the_exact_per_cell_path():
    plan = _plan(stats=STATS[:1])
    p = plan.statistics[0]
    big = np.array([2**53 + 1, 5], dtype=np.int64)
    assert interval_columns(big, p, Fraction(1, 20), at_least_zero=True) is None
    assert interval_columns(big.astype(object), p, Fraction(1, 20), at_least_zero=True) is None
    cols = interval_columns(np.array([-3, 7]), p, Fraction(1, 20), at_least_zero=True)
    assert cols["value"].tolist() == [0.0, 7.0] and cols["ci_low"][0] == 0.0
    # a huge true count: the noisy values are exact Python ints, the cells equal the Fractions'
    partials = {0: {"dp_rows": 2**62 + 3}}
    cells = plan.noise(partials, SeededNoiseSource(4))
    want = _per_cell(plan, partials, 4)
    assert [c["value"] for c in cells] == [c["value"] for c in want]
    assert cells[0]["value"] > 2**61


def test_partial_columns_are_the_partials_mapping():
    from dp_spark.statistics.plan import PartialColumns, true_vector

    plan = _plan(stats=STATS[:3])
    as_dict = {2: {"dp_rows": 5, "dp_units": 3}, 7: {"dp_rows": 1, "dp_units": 1}, 19: {"dp_rows": 4, "dp_units": 0}}
    for comp in plan.components:
        if comp.clamp is not None:
            for i, d in as_dict.items():
                d.update({f"{comp.sum_alias}_lo": 3 * i, f"{comp.sum_alias}_mid": i, f"{comp.sum_alias}_hi": 0})
    names = sorted(as_dict[2])
    cols = PartialColumns(np.array([2, 7, 19]), {k: np.array([as_dict[i][k] for i in (2, 7, 19)]) for k in names})
    assert cols == as_dict and dict(cols) == as_dict and len(cols) == 3 and 3 not in cols
    for comp in plan.components:
        assert true_vector(comp, cols, 20).tolist() == true_vector(comp, as_dict, 20).tolist()
    assert plan.noise(cols, SeededNoiseSource(9)) == plan.noise(as_dict, SeededNoiseSource(9))
    with pytest.raises(Exception, match="sorted, distinct"):
        PartialColumns(np.array([3, 3]), {"dp_rows": np.array([1, 2])})


def test_a_sum_sharing_the_row_count_is_vectorised_at_any_size_and_falls_back_off_the_dyadics():
    """The shared-count sum (value = noisy normalised sum + midpoint x noisy count) takes the
    vector path (one int64 numerator per cell over a common power of two); a midpoint or
    half-width that is no dyadic rational (a spec's bounds are snapped to the grid, so only a
    direct call has one) returns None: the exact per-cell path. Noisy sums of any size are
    exact (Python integers), equal to the per-cell Fractions' floats."""
    plan = _plan("zcdp", STATS + [SNAPPED])
    alpha = Fraction(1, 20)
    for name in ("total", "tenth"):
        i = [s.name for s in plan.spec.statistics].index(name)
        stat, comps = plan.spec.statistics[i], plan.stat_components[i]
        assert sorted(c.kind for c in comps) == ["nsum", "rows"]
        plans = {c: plan.plan_of(c) for c in comps}
        grids = {c: np.array([-3, 0, 41], dtype=np.int64) for c in comps}
        assert kind_of("sum").finish_columns(stat, grids, plans, alpha) is not None
        # any size: exact integers, whatever the magnitude of the noisy sums
        huge = {c: np.array([2**62, -(2**62), 1], dtype=np.int64) for c in comps}
        by = {c.kind: c for c in comps}
        cols = kind_of("sum").finish_columns(stat, huge, plans, alpha)
        for j in range(3):
            want = kind_of("sum").finish(stat, {c: Fraction(int(huge[c][j])) * plans[c].grid_unit for c in comps},
                                         plans, alpha)
            assert [cols[f][j] for f in ("value", "ci_low", "ci_high")] == [want[f] for f in ("value", "ci_low", "ci_high")]
        args = (grids[by["nsum"]], grids[by["rows"]], plans[by["nsum"]], plans[by["rows"]])
        assert shared_sum_columns(*args, Fraction(1, 3), Fraction(1, 2), sd=1.0, expected=1.0) is None
        assert shared_sum_columns(*args, Fraction(1, 2), Fraction(1, 3), sd=1.0, expected=1.0) is None
        assert shared_sum_columns(*args, Fraction(1, 2), Fraction(1, 2), sd=1.0, expected=1.0) is not None


def test_true_columns_equal_the_per_cell_true_values_for_every_kind_and_window():
    """``Component.true_column`` (every cell at once, from the partial columns) gives exactly
    ``true_values`` per cell (from the partials' dicts) for every kind, windowed or not, with
    sum parts whose exact total passes 2^63."""
    stats = STATS + [{"name": "var", "kind": "variance", "column": "v", "lower": -10, "upper": 100},
                     {"name": "med", "kind": "quantile", "column": "v", "lower": 0, "upper": 100, "q": 0.5},
                     {"name": "units2", "kind": "distinct_units", "window": {"days": 2}},
                     {"name": "rows2", "kind": "count", "window": {"days": 2}}]
    kinds = set()
    for plan in (_plan("zcdp", stats), _plan("zcdp", [STATS[2]])):  # the second: a sum without a count
        kinds |= _true_columns_equal(plan)
    assert {"rows", "units", "sum", "nsum", "nsumsq", "hist"} <= {k for k, _ in kinds} and (("units", 2) in kinds)


def _true_columns_equal(plan) -> set:
    from dp_spark.statistics.components import window_suffix
    from dp_spark.statistics.plan import PartialColumns, true_vector

    rng = np.random.default_rng(7)  # test data only
    names = set()
    for comp in plan.components:
        sfx = window_suffix(comp.window)
        names |= {"dp_rows" + sfx, "dp_units" + sfx}
        for alias in {a for a in (getattr(comp, "sum_alias", None) if comp.clamp is not None else None,
                                  comp.square_alias if comp.kind == "nsumsq" else None) if a}:
            names |= {f"{alias}_{part}{sfx}" for part in ("lo", "mid", "hi")}
        if comp.kind == "hist":
            names |= {comp.bin_column(j) + sfx for j in range(comp.bins)}
    n = plan.spec.cells
    present = sorted(rng.choice(n, size=n // 2, replace=False).tolist())
    as_dict = {i: {k: int(rng.integers(-(2**20), 2**20)) for k in sorted(names)} for i in present}
    as_dict[present[0]].update({k: 2**40 for k in names if k.endswith("_hi") or "_hi@" in k})
    cols = PartialColumns(np.array(present), {k: np.array([as_dict[i][k] for i in present]) for k in sorted(names)})
    kinds = set()
    for comp in plan.components:
        kinds.add((comp.kind, comp.window))
        got, want = true_vector(comp, cols, n), true_vector(comp, as_dict, n)
        assert got.tolist() == want.tolist(), comp.kind
    return kinds
