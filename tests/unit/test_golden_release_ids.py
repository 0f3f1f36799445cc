"""Golden release ids: a rerun of a shipped or user spec must stay a cache hit that charges nothing.

``tests/unit/golden_release_ids.json`` was recorded BEFORE the single-``metric`` form was
rewritten into the ``statistics`` form (issue 26): the release id and the spec version of every
shipped spec (``tests/shipped_specs.py``: the ones in ``conf/releases/`` the project ships, and
each one's per-day restriction when it is keyed by dates) and of a generated set of old-form
specs (every metric, neighbour relation and measure, and the options: group keys by value and
by date, min_group_size, the mean's options, Linf, confidence, columns, max_cells,
on_exhausted, a per-day ``for_keys`` restriction). The test
recomputes them with :func:`dp_spark.engine.release_id_for` on a fixed fake input identity, and
the code version the file was recorded with (a new code version changes every id on purpose).

Regenerate (only when an id is meant to change, and say so in the commit)::

    python -m tests.unit.test_golden_release_ids --write
"""

from __future__ import annotations

import itertools
import json
import sys
from datetime import date
from pathlib import Path

import pytest

from dp_spark import engine as engine_mod
from tests.shipped_specs import shipped_spec_paths
from dp_spark.config import load_release_spec, release_spec_from_dict

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("golden_release_ids.json")
TABLE_ID, TABLE_VERSION = "00000000-golden-table-id", 7
RUN_DATE = date(2026, 11, 20)  # relative date keys (end: today) resolve against it
MODES = ("official", "exploration")

DAYS = {"column": "day", "public_keys": {"dates": {"start": "2026-11-01", "end": "2026-11-07"}}}
REGIONS = {"column": "region", "public_keys": {"values": ["north", "south", "east", "west"]}}
NEIGHBOURS = {
    "add_remove_unit": ({"kind": "user", "column": "user_id"}, {"max_rows_per_unit": 10, "max_partitions_per_unit": 2}),
    "replace_unit": ({"kind": "user", "column": "user_id"}, {"max_rows_per_unit": 10, "max_partitions_per_unit": 2}),
    "event": ({"kind": "event", "column": "event_id"},
              {"max_rows_per_unit": 1, "max_partitions_per_unit": 1, "max_rows_per_partition": 1}),
}
MEASURES = {
    "pure_dp": {"id": "b", "measure": "pure_dp", "epsilon": 1},
    "zcdp_rho": {"id": "b", "measure": "zcdp", "rho": "0.25"},
    "zcdp_eps_delta": {"id": "b", "measure": "zcdp", "epsilon": 2, "delta": "1e-6"},
}
VALUE = {"column": "order_value", "lower": 0, "upper": 500}
SIGNED_VALUE = {"column": "delta", "lower": -3.5, "upper": 10}


def _base(metric: str, neighbour: str, measure: str, group_by) -> dict:
    unit, bounds = NEIGHBOURS[neighbour]
    d = {"name": "golden", "dataset": "events", "privacy_unit": dict(unit), "neighbouring": neighbour,
         "metric": metric, "bounds": dict(bounds), "budget": dict(MEASURES[measure])}
    if group_by is not None:
        d["group_by"] = json.loads(json.dumps(group_by))
    else:
        d["bounds"]["max_partitions_per_unit"] = 1
    if metric in ("sum", "mean"):
        d["value"] = dict(VALUE)
    return d


def generated_specs() -> dict[str, dict]:
    """Old-form spec dicts by label: the cross product of metrics, neighbours, measures and
    group keys, then option variants on top of a few of them."""
    out: dict[str, dict] = {}
    metrics = ("count", "distinct_units", "sum", "mean")
    groups = {"global": None, "regions": REGIONS, "days": DAYS}
    for metric, nb, ms, (g, gb) in itertools.product(metrics, NEIGHBOURS, MEASURES, groups.items()):
        out[f"{metric}/{nb}/{ms}/{g}"] = _base(metric, nb, ms, gb)

    def variant(label: str, metric: str, group_by=REGIONS, neighbour="add_remove_unit", measure="zcdp_rho",
                **changes) -> None:
        d = _base(metric, neighbour, measure, group_by)
        for k, v in changes.items():
            if isinstance(v, dict) and isinstance(d.get(k), dict):
                d[k] = {**d[k], **v}
            else:
                d[k] = v
        out[label] = d

    for metric in ("count", "distinct_units", "mean"):  # a sum has no noisy count to threshold
        variant(f"{metric}/min_group_size_int", metric, min_group_size=20)
        variant(f"{metric}/min_group_size_suppress", metric, min_group_size={"threshold": 15, "strategy": "suppress"})
        variant(f"{metric}/min_group_size_merge", metric,
                min_group_size={"threshold": 15, "strategy": "merge_other", "other_key": "others"})
        variant(f"{metric}/min_group_size_days", metric, group_by=DAYS, min_group_size=5)
    for metric in metrics:
        variant(f"{metric}/linf", metric, bounds={"max_rows_per_partition": 3})
        variant(f"{metric}/l0_above_keys", metric, bounds={"max_partitions_per_unit": 9})
        variant(f"{metric}/confidence", metric, confidence=0.9)
        variant(f"{metric}/description_family", metric, description="a description", family="golden_family")
        variant(f"{metric}/columns", metric, columns=["user_id", "region", "order_value", "extra"])
        variant(f"{metric}/max_cells", metric, max_cells=50)
        variant(f"{metric}/return_existing", metric, on_exhausted="return_existing")
        variant(f"{metric}/degrade", metric, on_exhausted={"policy": "degrade", "fallback": "coarser.yaml"})
        variant(f"{metric}/integer_keys", metric, group_by={"column": "region", "public_keys": {"values": [1, 2, 3]}})
        variant(f"{metric}/dates_through", metric,
                group_by={"column": "day", "public_keys": {"dates": {"start": "2026-11-01", "through": "2026-11-03"}}})
        variant(f"{metric}/dates_relative", metric,
                group_by={"column": "day", "public_keys": {"dates": {"start": "2026-11-01", "end": "yesterday"}}})
    for metric in ("sum", "mean"):
        variant(f"{metric}/signed_value", metric, value=SIGNED_VALUE)
        variant(f"{metric}/fractional_value", metric, value={"column": "v", "lower": "0.25", "upper": "1e3"})
        variant(f"{metric}/pure_dp_signed", metric, measure="pure_dp", value=SIGNED_VALUE)
    for opts in ({"assumed_group_size": 900}, {"min_count": 20}, {"assumed_mean": 45},
                 {"assumed_group_size": 50, "min_count": 5, "assumed_mean": "12.5"}, {}):
        label = "_".join(f"{k}={v}" for k, v in opts.items()) or "empty"
        variant(f"mean/options/{label}", "mean", mean=opts)
        variant(f"mean/options/{label}/pure_dp", "mean", measure="pure_dp", mean=opts)
    return out


def _for_keys_variants(label: str, spec) -> dict[str, object]:
    """A date-keyed spec's per-day restrictions (``dp-spark refresh --date`` / ``publish --date``)."""
    out = {}
    dated = spec.date_key_set
    if dated is None:
        return out
    for day in (dated.values[0], dated.values[-1]):
        out[f"{label}@{day}"] = spec.for_keys((day,), name_suffix=f"_{day.replace('-', '')}")
    return out


def all_specs() -> dict[str, object]:
    specs: dict[str, object] = {}
    for path in shipped_spec_paths():  # the shipped specs only (tests/shipped_specs.py)
        label = f"conf/releases/{path.name}"
        specs[label] = load_release_spec(path, run_date=RUN_DATE)
        specs.update(_for_keys_variants(label, specs[label]))
    for label, d in generated_specs().items():
        specs[label] = release_spec_from_dict(d, source=f"{label}.yaml", run_date=RUN_DATE)
        specs.update(_for_keys_variants(label, specs[label]))
    return specs


def compute(code_version: str) -> dict[str, dict[str, str]]:
    saved = engine_mod.CODE_VERSION
    engine_mod.CODE_VERSION = code_version
    try:
        return {label: {"spec_version": spec.version(),
                        **{mode: engine_mod.release_id_for(spec, TABLE_ID, TABLE_VERSION, mode) for mode in MODES}}
                for label, spec in all_specs().items()}
    finally:
        engine_mod.CODE_VERSION = saved


def test_release_ids_match_the_golden_file():
    golden = json.loads(GOLDEN.read_text())
    assert (golden["table_id"], golden["table_version"], golden["run_date"]) == (
        TABLE_ID, TABLE_VERSION, RUN_DATE.isoformat())
    got = compute(golden["code_version"])
    missing = sorted(set(golden["ids"]) - set(got))
    assert not missing, f"specs of the golden file no longer generated: {missing[:5]}"
    changed = sorted(label for label in golden["ids"] if got[label] != golden["ids"][label])
    assert not changed, f"{len(changed)} release ids changed, e.g. {changed[:5]}"


def test_the_golden_set_covers_every_metric_neighbour_measure_and_shipped_spec():
    golden = json.loads(GOLDEN.read_text())["ids"]
    for metric, nb, ms in itertools.product(("count", "distinct_units", "sum", "mean"), NEIGHBOURS, MEASURES):
        assert f"{metric}/{nb}/{ms}/global" in golden
    for path in shipped_spec_paths():
        assert f"conf/releases/{path.name}" in golden
    assert any("min_group_size_merge" in k for k in golden) and any("@" in k for k in golden)
    # fields outside the canonical spec (on_exhausted, max_cells, description) share an id
    assert golden["count/return_existing"] == golden["count/add_remove_unit/zcdp_rho/regions"]
    assert golden["count/linf"] != golden["count/add_remove_unit/zcdp_rho/regions"]


def _write() -> None:
    data = {"table_id": TABLE_ID, "table_version": TABLE_VERSION, "run_date": RUN_DATE.isoformat(),
            "code_version": engine_mod.CODE_VERSION, "ids": compute(engine_mod.CODE_VERSION)}
    GOLDEN.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(data['ids'])} specs to {GOLDEN}")


if __name__ == "__main__":
    if "--write" in sys.argv[1:]:
        _write()
    else:
        pytest.main([__file__, "-q"])
