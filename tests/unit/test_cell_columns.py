"""The release's cells as columns (dp_spark.statistics.cells): the Arrow table of a release
write and the rows a publish returns are the same whether the cells come as columns (the
noise step's) or as one dict per row (the reference: ``{**common, **cell}`` per cell, what the
engine built before), and the keys are encoded as ``canonical_key`` encodes them."""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pytest

from dp_spark.config import release_spec_from_dict
from dp_spark.delta.release_table import RELEASE_SCHEMA, cells_arrow_table, release_arrow_schema
from dp_spark.mechanisms.samplers import SeededNoiseSource
from dp_spark.statistics.cells import CellBlock, CellColumns, Const, canonical_keys
from dp_spark.statistics.plan import PartialColumns, canonical_key, plan_query

STATS = [{"name": "rows", "kind": "count"}, {"name": "units", "kind": "distinct_units"},
         {"name": "total", "kind": "sum", "column": "v", "lower": -10, "upper": 100},
         {"name": "avg", "kind": "mean", "column": "v", "lower": -10, "upper": 100}]
#: values a JSON encoder escapes: quotes, backslashes, control and non-ASCII characters
ODD = ["a", 'q"uote', "back\\slash", "tab\there", "é-ü", "雪", "comma,[x]"]


@pytest.fixture(autouse=True)
def _test_mode(monkeypatch):
    monkeypatch.setenv("DP_SPARK_TEST_MODE", "1")


def _plan(key_sets, simultaneous=False):
    spec = {"name": "cols", "dataset": "x", "privacy_unit": {"kind": "user", "column": "user_id"},
            **({"group_by": key_sets} if key_sets else {}), "bounds": {"max_rows_per_unit": 3, "max_partitions_per_unit": 2 if key_sets else 1},
            "statistics": STATS, "budget": {"id": "b", "measure": "zcdp", "rho": 0.5}, "max_cells": 10_000}
    if simultaneous:
        spec["confidence"] = {"level": 0.9, "simultaneous": True}
    return plan_query(release_spec_from_dict(spec, "cols.yaml"))


KEY_SETS = {
    "none": [],
    "one": [{"column": "region", "public_keys": {"values": ODD}}],
    "two": [{"column": "region", "public_keys": {"values": ODD}},
            {"column": "day", "public_keys": {"dates": {"start": "2026-11-01", "end": "2026-11-03"}}}],
    "three": [{"column": "region", "public_keys": {"values": ODD[:3]}},
              {"column": "day", "public_keys": {"dates": {"start": "2026-11-01", "end": "2026-11-02"}}},
              {"column": "shop", "public_keys": {"values": ODD[3:]}}],
}

COMMON = {"release_id": "r" * 64, "release_family": "fam", "release_name": "cols", "spec_version": "v1",
          "mode": "official", "key_column": "region", "confidence": 0.95, "charge_json": '{"charge": 1}',
          "charge_epsilon": None, "charge_rho": 0.5, "charge_delta": None, "statement_epsilon": 3.1,
          "statement_delta": 1e-7, "budget_id": "b", "bounds_json": "{}", "privacy_unit": "user",
          "unit_column": "user_id", "neighbouring": "add_remove", "parallel_composition": False,
          "suppressed": False, "input_table_id": "t", "input_version": 7, "code_version": "c",
          "created_at": datetime(2026, 12, 7, 10, 30, 5, 123456)}


def _partials(plan):
    n = plan.spec.cells
    rng = np.random.default_rng(3)
    names = ["dp_rows", "dp_units"] + [p for c in plan.components for p in _partial_names(c)]
    return PartialColumns(np.arange(n, dtype=np.int64)[::2],
                          {k: rng.integers(0, 5, len(range(0, n, 2))) for k in dict.fromkeys(names)})


def _partial_names(comp):
    seen = []

    class Probe(dict):
        def get(self, k, d=None):
            seen.append(k)
            return 0
    try:
        comp.true_values(Probe())
    except Exception:
        pass
    return seen


@pytest.mark.parametrize("shape", sorted(KEY_SETS))
def test_canonical_keys_are_canonical_key_per_tuple(shape):
    plan = _plan(KEY_SETS[shape])
    from dp_spark.statistics.plan import key_tuples

    tuples = key_tuples(plan.spec.key_sets)
    cols = [list(c) for c in zip(*tuples)] if plan.spec.key_sets else []
    assert canonical_keys(cols, len(tuples)) == [canonical_key(plan.spec.key_sets, t) for t in tuples]


@pytest.mark.parametrize("shape", sorted(KEY_SETS))
@pytest.mark.parametrize("simultaneous", [False, True])
def test_the_write_and_the_result_from_columns_equal_the_per_row_reference(shape, simultaneous):
    plan = _plan(KEY_SETS[shape], simultaneous)
    cols = plan.noise_columns(_partials(plan), SeededNoiseSource(11))
    cells = plan.noise(_partials(plan), SeededNoiseSource(11))  # the same draws, as dicts
    assert cols.dicts() == cells
    reference = [{**COMMON, **c} for c in cells]
    rows = cols.with_common(COMMON)
    assert len(rows) == len(reference) == plan.spec.cells * len(STATS)
    assert cells_arrow_table(rows).equals(cells_arrow_table(reference))
    names = [f.name for f in RELEASE_SCHEMA.fields]
    assert rows.dicts(names) == [{f: r.get(f) for f in names} for r in reference]
    assert rows.distinct("release_id") == {COMMON["release_id"]}
    if simultaneous:  # the bands are columns of the table
        assert cells_arrow_table(rows).column("band_low").null_count == 0


def test_the_reference_can_tell_a_wrong_column():
    """The comparison above fails on a wrong key map, a wrong instant or a wrong value."""
    plan = _plan(KEY_SETS["two"])
    cols = plan.noise_columns(_partials(plan), SeededNoiseSource(5))
    reference = [{**COMMON, **c} for c in cols.dicts()]
    good = cells_arrow_table(cols.with_common(COMMON))
    assert good.equals(cells_arrow_table(reference))
    swapped = [dict(r, keys=dict(reversed(list(r["keys"].items())))) for r in reference]
    assert not good.equals(cells_arrow_table(swapped))
    utc_naive = [dict(r, created_at=datetime(2026, 12, 7, 10, 30, 5, 123457)) for r in reference]
    assert not good.equals(cells_arrow_table(utc_naive))
    moved = [dict(r, value=r["value"] + (1.0 if i == 7 else 0.0)) for i, r in enumerate(reference)]
    assert not good.equals(cells_arrow_table(moved))


def test_created_at_is_the_local_instant_as_spark_makes_it():
    t = COMMON["created_at"]
    table = cells_arrow_table(CellColumns((CellBlock(2, {"statistic": Const("s"), "key": ["a", "b"],
                                                          "value": np.zeros(2)}, {"k": ["a", "b"]}),))
                              .with_common(COMMON))
    got = table.column("created_at").to_pylist()
    assert [x.timestamp() for x in got] == [t.timestamp()] * 2  # the naive time is local time
    assert table.column("keys").to_pylist() == [[("k", "a")], [("k", "b")]]


def test_absent_nullable_fields_are_null_and_an_empty_release_has_no_batch():
    block = CellBlock(3, {"statistic": Const("s"), "key": ["a", "b", "c"], "value": np.arange(3.0)}, {})
    table = CellColumns((block,)).with_common(COMMON).arrow_table(release_arrow_schema())
    assert table.num_rows == 3 and table.column("band_low").null_count == 3
    assert table.column("keys").to_pylist() == [[], [], []]
    empty = CellColumns((CellBlock(0, {"statistic": Const("s"), "key": []}, {"k": []}),))
    assert not empty and len(empty) == 0 and list(empty.record_batches(release_arrow_schema())) == []
    assert empty.dicts() == []
