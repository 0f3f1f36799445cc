"""The bounded pass, the kinds and the plan on the local reference backend (no Spark).

Ported from tests/spark/test_query_partials.py, where Spark was incidental to the claim: the
partials of neighbours that differ by one heavy unit move each component within its bound (L0
cells, Linf rows per cell, K rows in all, clamped values; NaN rows and null units dropped),
distinct units come from the (unit, cell) pairs cut to min(L0, K) cells. The Spark path
computes the same partials as this backend (tests/spark/test_backend_equivalence.py), so
these claims hold for it too. Then every statistic kind is noised and finished from local
partials through QueryPlan.noise."""

from __future__ import annotations

import math
import random
import statistics
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from dp_spark.backends.local import query_partials, select_private_keys, spark_xxhash64
from dp_spark.config import release_spec_from_dict
from dp_spark.errors import ConfigError, SchemaError
from dp_spark.mechanisms.samplers import RecordingNoiseSource, SeededNoiseSource
from dp_spark.statistics.plan import plan_query

REGIONS = [f"region_{i:02d}" for i in range(1, 6)]
TYPES = {"user_id": "string", "region": "string", "order_value": "double"}
L0, LINF, K = 2, 3, 5
SALT = "grey-box"


def _plan(lower, upper, *, bounds=None, statistics_=None, where=None):
    d = {"name": "partials", "dataset": "x", "privacy_unit": {"kind": "user", "column": "user_id"},
         "group_by": {"column": "region", "public_keys": {"values": REGIONS}},
         "bounds": bounds or {"max_rows_per_unit": K, "max_partitions_per_unit": L0, "max_rows_per_partition": LINF},
         "statistics": statistics_ or [
             {"name": "rows", "kind": "count"}, {"name": "units", "kind": "distinct_units"},
             {"name": "total", "kind": "sum", "column": "order_value", "lower": lower, "upper": upper}],
         "budget": {"id": "b", "measure": "pure_dp", "epsilon": 1}}
    if where:
        d["where"] = where
    return plan_query(release_spec_from_dict(d, "partials.yaml"))


PLAN = _plan(-10, 100)


def _partials(rows, plan=PLAN, **kw) -> dict[str, dict[str, int]]:
    got = query_partials(rows, plan, SALT, schema=TYPES, **kw).cells
    value = next(c for c in plan.components if c.kind in ("sum", "nsum"))
    return {key: {"rows": got.get(i, {}).get("dp_rows", 0), "units": got.get(i, {}).get("dp_units", 0),
                  "sum": value.exact_sum(got.get(i, {}))} for i, key in enumerate(plan.spec.keys)}


def _row(user, region, value):
    return {"user_id": user, "region": region, "order_value": value}


def _base():
    rng = random.Random(5)  # test data only
    rows = []
    for _ in range(4000):
        user = f"u{rng.randrange(60):03d}" if rng.random() > 0.01 else None
        region = rng.choice(REGIONS + ["region_99"])
        value = rng.choice([rng.lognormvariate(3.5, 0.6)] * 20 + [float("nan"), None, -25.0, 1e9])
        rows.append(_row(user, region, value))
    return rows


def _heavy(values, user="heavy"):
    """One extra unit with 10^4 rows over all regions (public and not)."""
    regions = REGIONS + ["region_99"]
    return [_row(user, regions[i % 6], values[i % len(values)]) for i in range(10_000)]


def _check_neighbour_bounds(d, d_prime):
    clamp = PLAN.spec.statistics[2].clamp
    max_abs = max(abs(clamp.lower), abs(clamp.upper)) / 2**clamp.grid_exponent
    changed = [k for k in REGIONS if d[k] != d_prime[k]]
    assert len(changed) <= L0, "a unit may touch at most L0 cells"
    total_rows = 0
    for k in REGIONS:
        dr = d_prime[k]["rows"] - d[k]["rows"]
        du = d_prime[k]["units"] - d[k]["units"]
        ds = d_prime[k]["sum"] - d[k]["sum"]
        assert 0 <= dr <= LINF, (k, dr)
        assert 0 <= du <= 1, (k, du)
        assert abs(ds) <= LINF * max_abs, (k, ds)
        total_rows += dr
    assert total_rows <= min(K, L0 * LINF)
    return changed, total_rows


# --------------------------------------------------------------------------- grey-box neighbours
def test_neighbour_differing_by_one_heavy_user_moves_each_partial_within_its_bound():
    base = _base()
    d = _partials(base)
    changed, total_rows = _check_neighbour_bounds(d, _partials(base + _heavy([1e9, float("inf"), 2.0**62, 55.5])))
    assert total_rows == min(K, L0 * LINF)  # the heavy unit is bounded, not dropped
    assert len(changed) == L0


@pytest.mark.parametrize("salt_user", ["heavy", "h2", "h3", "h4"])
def test_the_sum_bound_is_attained_so_clamping_is_really_applied(salt_user):
    base = _base()
    d = _partials(base)
    d_prime = _partials(base + _heavy([1e9], user=salt_user))
    changed, _ = _check_neighbour_bounds(d, d_prime)
    diffs = sorted(d_prime[k]["sum"] - d[k]["sum"] for k in changed)
    # K = 5 rows over L0 = 2 cells with Linf = 3: 2 + 3 rows, each clamped to U exactly
    clamp = PLAN.spec.statistics[2].clamp
    u = int(clamp.upper / 2**clamp.grid_exponent)
    assert diffs == [2 * u, 3 * u]


def test_neighbour_with_only_nan_and_inf_rows():
    base = _base()
    d = _partials(base)
    assert _partials(base + _heavy([float("nan")])) == d, "NaN rows are dropped on every path"
    inf_rows = _partials(base + _heavy([float("nan"), float("inf"), float("-inf")]))
    _check_neighbour_bounds(d, inf_rows)
    assert inf_rows != d


def test_null_unit_flood_does_not_change_any_partial():
    base = _base()
    assert _partials(base + _heavy([1e9], user=None)) == _partials(base)


# --------------------------------------------------------------------------- distinct units
def test_a_unit_with_20_rows_in_2_cells_is_counted_in_both_cells():
    """40 units, each with 19 rows in one region and 1 in another (K = 5, L0 = 5): the row
    statistics keep 5 rows per unit, yet every unit is counted in both regions."""
    rows = []
    for u in range(40):
        a, b = REGIONS[u % 2], REGIONS[2 + u % 3]
        rows += [_row(f"u{u}", a, 1.0 + j) for j in range(19)] + [_row(f"u{u}", b, 1.0)]
    plan = _plan(0, 10, bounds={"max_rows_per_unit": 5, "max_partitions_per_unit": 5})
    got = _partials(rows, plan)
    assert {k: got[k]["units"] for k in REGIONS} == {REGIONS[0]: 20, REGIONS[1]: 20, REGIONS[2]: 14,
                                                     REGIONS[3]: 13, REGIONS[4]: 13}
    assert sum(got[k]["rows"] for k in REGIONS) == 40 * 5  # the row statistics: K rows per unit
    assert sum(got[k]["rows"] for k in REGIONS[2:]) < 40  # most single rows were cut by K
    comp = next(c for c in plan.components if c.kind == "units")
    assert plan.plan_of(comp).sensitivity_grid.l1 == 5


def test_distinct_units_are_cut_to_min_l0_k_cells():
    rows = [_row(f"u{u}", REGIONS[j], 1.0 + j) for u in range(30) for j in range(4)]
    plan = _plan(0, 10, bounds={"max_rows_per_unit": 2, "max_partitions_per_unit": 4})
    got = _partials(rows, plan)
    assert sum(got[k]["units"] for k in REGIONS) == 60 and sum(got[k]["rows"] for k in REGIONS) == 60
    comp = next(c for c in plan.components if c.kind == "units")
    assert plan.plan_of(comp).sensitivity_grid.l1 == 2


def test_distinct_units_keep_the_l0_cut():
    rows = [_row(f"u{u}", REGIONS[j % 3], 1.0 + j) for u in range(30) for j in range(9)]
    got = _partials(rows, _plan(0, 10, bounds={"max_rows_per_unit": 2, "max_partitions_per_unit": 1}))
    assert sum(got[k]["units"] for k in REGIONS) == 30
    for k in REGIONS:  # users are counted where their kept rows are
        assert (got[k]["units"] > 0) == (got[k]["rows"] > 0)
        assert got[k]["rows"] == 2 * got[k]["units"]


def test_the_salt_decides_which_rows_within_the_same_bounds():
    rows = _base()
    a = query_partials(rows, PLAN, "salt-a", schema=TYPES).cells
    b = query_partials(rows, PLAN, "salt-b", schema=TYPES).cells
    assert a != b
    for cells in (a, b):  # 60 units, <= min(K, L0 Linf) rows each
        assert 0 < sum(p["dp_rows"] for p in cells.values()) <= 60 * min(K, L0 * LINF)


# --------------------------------------------------------------------------- where, schema
def test_where_is_a_python_predicate_and_must_match_the_spec():
    rows = _base()
    plan = _plan(-10, 100, where="order_value > 50")
    with pytest.raises(ConfigError, match="where"):
        query_partials(rows, plan, SALT, schema=TYPES)
    with pytest.raises(ConfigError, match="where"):
        query_partials(rows, PLAN, SALT, schema=TYPES, where=lambda r: True)
    none = query_partials(rows, plan, SALT, schema=TYPES, where=lambda r: False).cells
    assert none == {}
    some = _partials(rows, plan, where=lambda r: r["order_value"] is not None and r["order_value"] > 50)
    every = _partials(rows)
    assert 0 < sum(v["rows"] for v in some.values()) < sum(v["rows"] for v in every.values())


def test_schema_errors_name_the_column_never_a_value():
    with pytest.raises(SchemaError, match="order_value") as exc:
        query_partials([_row("u", REGIONS[0], "secret-text")], PLAN, SALT)
    assert "secret-text" not in str(exc.value)
    with pytest.raises(SchemaError, match="several types"):
        query_partials([_row("u", REGIONS[0], 1.0), _row(7, REGIONS[0], 1.0)], PLAN, SALT)


def test_spark_xxhash64_known_values():
    # Spark 4: SELECT xxhash64('salt', 'row', 'u1', 3L, 1.5D) and xxhash64(NULL) (the seed, 42)
    assert spark_xxhash64() == 42 and spark_xxhash64((None, "string")) == 42
    assert spark_xxhash64(("a", "string")) == spark_xxhash64(("a", "string"), (None, "long"))
    assert spark_xxhash64((0.0, "double")) == spark_xxhash64((-0.0, "double"))
    assert spark_xxhash64((1, "int")) != spark_xxhash64((1, "long"))


def test_local_backend_imports_no_pyspark():
    code = ("import sys, dp_spark.backends.local\n"
            "sys.exit(1 if any(m == 'pyspark' or m.startswith('pyspark.') for m in sys.modules) else 0)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=str(Path(__file__).resolve().parents[2]))
    assert res.returncode == 0, res.stderr


# --------------------------------------------------------------------------- every kind, noised
ALL_KINDS = [{"name": "rows", "kind": "count"}, {"name": "units", "kind": "distinct_units"},
             {"name": "total", "kind": "sum", "column": "order_value", "lower": 0, "upper": 200},
             {"name": "avg", "kind": "mean", "column": "order_value", "lower": 0, "upper": 200},
             {"name": "var", "kind": "variance", "column": "order_value", "lower": 0, "upper": 200},
             {"name": "sd", "kind": "stddev", "column": "order_value", "lower": 0, "upper": 200},
             {"name": "med", "kind": "quantile", "column": "order_value", "lower": 0, "upper": 200, "q": 0.5}]


def test_every_kind_is_finished_from_local_partials_near_the_truth():
    """One unit per row (K = 1): the bounded rows are all the rows, so each statistic's noisy
    value, at a large epsilon, is near the plain statistic of the values in its region."""
    rng = random.Random(8)  # test data only
    values = {r: [rng.uniform(20, 180) for _ in range(1000)] for r in REGIONS}
    rows = [_row(f"{r}-{i}", r, v) for r in REGIONS for i, v in enumerate(values[r])]
    d = {"name": "kinds", "dataset": "x", "privacy_unit": {"kind": "user", "column": "user_id"},
         "group_by": {"column": "region", "public_keys": {"values": REGIONS}},
         "bounds": {"max_rows_per_unit": 1}, "statistics": ALL_KINDS,
         "budget": {"id": "b", "measure": "zcdp", "rho": 1000}}
    plan = plan_query(release_spec_from_dict(d, "kinds.yaml"))
    partials = query_partials(rows, plan, SALT, schema=TYPES).cells
    cells = plan.noise(partials, SeededNoiseSource(3))
    got = {(c["statistic"], c["key"]): float(c["value"]) for c in cells}
    for r in REGIONS:
        v = values[r]
        want = {"rows": len(v), "units": len(v), "total": sum(v), "avg": statistics.fmean(v),
                "var": statistics.pvariance(v), "sd": statistics.pstdev(v), "med": statistics.median(v)}
        for name, w in want.items():
            tol = {"med": 200 / 64 + 1, "var": 0.02 * w, "sd": 0.02 * w}.get(name, 1e-3 * abs(w) + 1)
            assert math.isclose(got[(name, r)], w, abs_tol=tol), (name, r, got[(name, r)], w)


def test_private_keys_select_over_the_threshold_from_local_candidates():
    d = {"name": "priv", "dataset": "x", "privacy_unit": {"kind": "user", "column": "user_id"},
         "group_by": [{"column": "region", "private_keys": {"max_keys": 3}}],
         "bounds": {"max_rows_per_unit": 2, "max_partitions_per_unit": 1},
         "statistics": [{"name": "rows", "kind": "count"}],
         "budget": {"id": "b", "measure": "pure_dp", "epsilon": 4000, "delta": Fraction(1, 10**6)}}
    plan = plan_query(release_spec_from_dict(d, "priv.yaml"))
    sizes = {"big": 40, "mid": 20, "small": 10, "tiny": 5, "alone": 1}
    rows = [_row(f"{k}-{i}", k, 1.0) for k, n in sizes.items() for i in range(n) for _ in range(3)]
    local = query_partials(rows, plan, SALT, schema=TYPES)
    assert local.unit_counts == {(k,): n for k, n in sizes.items()}
    partials, tuples = select_private_keys(local, plan, SeededNoiseSource(1))
    assert tuples == [("big",), ("mid",), ("small",)]  # the max_keys largest; never "alone"
    assert [partials[i]["dp_rows"] for i in range(3)] == [80, 40, 20]  # K = 2 rows per unit


def test_private_keys_select_with_the_gaussian_threshold_under_zcdp():
    d = {"name": "priv", "dataset": "x", "privacy_unit": {"kind": "user", "column": "user_id"},
         "group_by": [{"column": "region", "private_keys": {"max_keys": 3, "mechanism": "gaussian"}}],
         "bounds": {"max_rows_per_unit": 2, "max_partitions_per_unit": 1},
         "statistics": [{"name": "rows", "kind": "count"}],
         "budget": {"id": "b", "measure": "zcdp", "rho": 10**6, "delta": Fraction(1, 10**6)}}
    plan = plan_query(release_spec_from_dict(d, "priv.yaml"))
    assert plan.selection.mechanism == "discrete_gaussian" and plan.selection.threshold == 2
    sizes = {"big": 40, "mid": 20, "small": 10, "tiny": 5, "alone": 1}
    rows = [_row(f"{k}-{i}", k, 1.0) for k, n in sizes.items() for i in range(n) for _ in range(3)]
    local = query_partials(rows, plan, SALT, schema=TYPES)
    recorder = RecordingNoiseSource(SeededNoiseSource(1))
    partials, tuples = select_private_keys(local, plan, recorder)
    assert tuples == [("big",), ("mid",), ("small",)]
    assert [partials[i]["dp_rows"] for i in range(3)] == [80, 40, 20]
    assert recorder.calls[0].kind == "discrete_gaussian" and recorder.calls[0].n == 5  # one draw per candidate
