"""Release spec validation on pydantic v2 (dp_spark/spec/release.py): all errors of a file at
once with their field paths and no values, the JSON Schema (``dp-spark schema``, shipped as
conf/release-spec.schema.json), and docs/config.md checked against the models."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml

from dp_spark import cli
from dp_spark.config import load_release_spec, release_spec_from_dict
from dp_spark.errors import ConfigError
from dp_spark.spec.release import release_spec_errors
from dp_spark.spec.schema import (docs_with_table, field_paths, release_spec_json_schema,
                                  release_spec_json_schema_text)
from tests.shipped_specs import shipped_spec_paths

ROOT = Path(__file__).resolve().parents[2]
SPECS = shipped_spec_paths()  # the shipped specs only: a user's own spec in conf/releases is theirs
SCHEMA_FILE = ROOT / "conf" / "release-spec.schema.json"
MULTI = ROOT / "conf" / "releases" / "orders_by_day_region.yaml"
SINGLE = ROOT / "conf" / "releases" / "aov_by_region.yaml"
SECRET = "Zq9 planted-value 7731"  # must never appear in an error message (and is no identifier)


def _spec(path: Path) -> dict:
    return copy.deepcopy(yaml.safe_load(path.read_text()))


def _error(data: dict) -> str:
    with pytest.raises(ConfigError) as exc:
        release_spec_from_dict(data, source="t.yaml")
    return str(exc.value)


# -- every shipped spec --------------------------------------------------------------------------
@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_every_shipped_spec_validates_and_points_at_the_schema(path):
    assert release_spec_errors(yaml.safe_load(path.read_text())) == []
    load_release_spec(path)  # the models and then the parser
    first = path.read_text().splitlines()[0]
    assert first == "# yaml-language-server: $schema=../release-spec.schema.json"
    assert (path.parent / "../release-spec.schema.json").resolve() == SCHEMA_FILE


# -- all errors at once, with paths ---------------------------------------------------------------
def test_a_spec_with_three_mistakes_reports_three_paths_at_once():
    d = _spec(MULTI)
    d["statistics"][2]["upper"] = "not a number"
    d["group_by"][0]["public_keys"] = {"values": ["a"], "dates": {"start": "2026-11-01", "end": "today"}}
    d["bounds"]["max_rows_per_unit"] = 0
    msg = _error(d)
    assert "3 errors" in msg
    for path in ("statistics[2].upper", "group_by[0].public_keys", "bounds.max_rows_per_unit"):
        assert f"field '{path}'" in msg, msg
    assert msg.startswith("t.yaml: ")


def test_errors_of_both_forms_name_their_fields():
    d = _spec(SINGLE)
    del d["privacy_unit"]["kind"]
    d["mean"]["min_count"] = 0
    d["on_exhausted"] = {"policy": "degrade"}
    d["confidence"] = 2
    d["typo_field"] = 1
    msg = _error(d)
    for path in ("privacy_unit.kind", "mean.min_count", "on_exhausted.fallback", "confidence", "typo_field"):
        assert f"field '{path}'" in msg, msg
    assert "5 errors" in msg

    d = _spec(MULTI)
    d["statistics"][0]["kind"] = "median"
    d["statistics"][5]["q"] = 1.5
    d["statistics"][1].pop("name")
    d["group_by"][1] = {"column": "region", "private_keys": {"max_keys": 0, "share": 1}}
    d["budget"] = {"id": "b", "measure": "zcdp", "epsilon": 1}
    msg = _error(d)
    for path in ("statistics[0].kind", "statistics[5].q", "statistics[1].name", "group_by[1].private_keys.max_keys",
                 "group_by[1].private_keys.share", "budget.delta"):
        assert f"field '{path}'" in msg, msg


def test_one_error_keeps_the_parsers_format_and_wrong_form_fields_say_why():
    d = _spec(MULTI)
    d["metric"] = "count"
    assert _error(d) == ("t.yaml: field 'metric': a release with 'statistics' declares its value columns per "
                         "statistic: drop 'metric', 'value' and 'mean'")
    d = _spec(SINGLE)
    d["group_by"]["private_keys"] = {"max_keys": 5}
    assert "give exactly one of 'public_keys'" in _error(d)  # both kinds of keys on one column
    del d["group_by"]["public_keys"]
    assert "field 'budget.delta'" in _error(d)  # the old form finds keys privately too: it spends delta
    d = _spec(MULTI)
    d["statistics"][0] = {"name": "x", "kind": "distinct", "column": "region"}
    assert "statistics[0].kind" in _error(d) and "distinct_units" in _error(d)
    d = _spec(MULTI)
    d["group_by"][1] = {"column": "region"}
    assert "give exactly one of 'public_keys'" in _error(d)


# -- never a value ---------------------------------------------------------------------------------
@pytest.mark.parametrize("where", [
    ("name",), ("dataset",), ("privacy_unit", "kind"), ("privacy_unit", "column"), ("neighbouring",),
    ("bounds", "max_rows_per_unit"), ("budget", "rho"), ("budget", "measure"), ("budget", "delta"),
    ("statistics", 2, "upper"), ("statistics", 1, "kind"), ("statistics", 5, "q"), ("statistics", 0, "weight"),
    ("group_by", 0, "public_keys", "dates", "end"), ("group_by", 1, "public_keys", "values", 0),
    ("confidence",), ("max_cells",), ("on_exhausted",), ("columns",), ("where",),
])
def test_no_value_of_the_spec_appears_in_a_message(where):
    d = _spec(MULTI)
    node = d
    for k in where[:-1]:
        node = node[k]
    node[where[-1]] = SECRET
    if where[-1] == 0:  # a key: any string is one
        node[0] = {"k": SECRET}
    if where == ("where",):
        node["where"] = 12345.678  # not a string
    errors = release_spec_errors(d)
    assert errors, where
    text = repr(errors)
    assert SECRET not in text and "input_value" not in text and "12345" not in text
    assert "https://errors.pydantic.dev" not in text


def test_unknown_keys_and_lists_of_values_are_not_echoed():
    d = _spec(MULTI)
    d["group_by"][1]["public_keys"]["values"] = [SECRET, {"x": SECRET}, True]
    d["budget"]["epsilon"] = [SECRET]
    d["description"] = {"nested": SECRET}  # free text: accepted, as by the parser
    text = repr(release_spec_errors(d))
    assert SECRET not in text
    assert "group_by[1].public_keys.values[1]" in text and "group_by[1].public_keys.values[2]" in text


# -- the models never refuse what the parser accepts -----------------------------------------------
@pytest.mark.parametrize("change", [
    {"description": 2026}, {"columns": None}, {"where": None}, {"min_group_size": None}, {"metric": None},
    {"group_by": {"column": "region", "public_keys": {"values": ["region_01"]}}},  # one mapping
    {"confidence": "0.9"}, {"budget": {"id": "demo_events_user", "measure": "zcdp", "rho": "1/4"}},
    {"budget": {"id": "demo_events_user", "measure": "zcdp", "epsilon": 1, "delta": "1e-7"}},
    {"on_exhausted": "return_existing"}, {"on_exhausted": {"policy": "degrade", "fallback": "x.yaml"}},
    {"bounds": {"max_rows_per_unit": 10, "max_partitions_per_unit": 3, "max_rows_per_partition": None}},
])
def test_lax_where_the_parser_is_lax(change):
    d = _spec(MULTI)
    d.update(change)
    if change.get("metric", 1) is None:
        d["metric"] = None
    assert release_spec_errors(d) == [], change


def test_single_metric_shorthands_are_accepted():
    d = _spec(SINGLE)
    d["metric"] = "count"
    for k in ("value", "mean"):
        d.pop(k)
    d["min_group_size"] = 20
    d["statistics"] = None
    d["where"] = None
    assert release_spec_errors(d) == []
    release_spec_from_dict(d, "t.yaml")
    d["group_by"]["public_keys"] = {"dates": {"start": "2026-11-01", "through": "yesterday"}}
    assert release_spec_errors(d) == []


# -- the JSON Schema ------------------------------------------------------------------------------
def test_the_shipped_schema_is_the_generated_one():
    assert SCHEMA_FILE.read_text() == release_spec_json_schema_text(), (
        "conf/release-spec.schema.json is stale: run `.venv/bin/dp-spark schema --out conf/release-spec.schema.json`")


def test_dp_spark_schema_prints_it(capsys, tmp_path):
    assert cli.main(["schema"]) == 0
    out = capsys.readouterr().out
    schema = json.loads(out)
    assert schema == release_spec_json_schema()
    assert schema["$schema"].startswith("https://json-schema.org/")
    forms = {d["title"] for d in schema["$defs"].values() if "title" in d}
    assert {"single-metric release spec", "multi-statistic release spec"} <= forms
    budget = schema["$defs"]["BudgetModel"]["properties"]
    assert {"id", "measure", "epsilon", "rho", "delta"} <= set(budget)
    entry = schema["$defs"]["GroupByEntryModel"]["properties"]
    assert {"column", "public_keys", "private_keys"} <= set(entry)
    assert "input_value" not in out
    assert cli.main(["schema", "--out", str(tmp_path / "s.json")]) == 0
    assert (tmp_path / "s.json").read_text() == out
    assert "schema" in cli.COMMANDS


def _jsonable(node):
    if isinstance(node, dict):
        return {k: _jsonable(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_jsonable(v) for v in node]
    return node.isoformat() if hasattr(node, "isoformat") else node


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_the_shipped_specs_validate_against_the_json_schema(path):
    import jsonschema  # a test dependency (setup.cfg [test]): never skipped
    jsonschema.validate(_jsonable(yaml.safe_load(path.read_text())), json.loads(SCHEMA_FILE.read_text()))


# -- docs/config.md checked against the models -----------------------------------------------------
def _doc_rows() -> list[tuple[list[str], str]]:
    """(documented field paths, row text) of every field table of the release spec sections."""
    text = (ROOT / "docs" / "config.md").read_text()
    section = text[text.index("## Release spec"):text.index("## Environment")]
    rows = []
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cells = re.split(r"(?<!\\)\|", line)[1:-1]
        names = re.findall(r"`([^`]+)`", cells[0])
        first = names[0]
        parent = first.rsplit(".", 1)[0] + "." if "." in first else ""
        paths = [first] + [n if ("." in n or "[" in n) else parent + n for n in names[1:]]
        rows.append((paths, line))
    return rows


def _norm(path: str) -> str:
    return path.replace("[]", "")


def test_every_documented_field_exists_in_the_models():
    accepted = {_norm(p) for p in field_paths()}
    documented = [p for paths, _ in _doc_rows() for p in paths]
    assert len(documented) > 20
    missing = [p for p in documented if _norm(p) not in accepted]
    assert not missing, f"docs/config.md documents fields the models do not accept: {missing}"


def test_every_accepted_field_is_documented():
    rows = _doc_rows()
    by_path: dict[str, str] = {}
    for paths, line in rows:
        for p in paths:
            by_path[_norm(p)] = by_path.get(_norm(p), "") + "\n" + line
    undocumented = []
    for path in sorted(field_paths()):
        parts = _norm(path).split(".")
        # the row of the field itself, else of its closest documented ancestor, which must name it
        for n in range(len(parts), 0, -1):
            row = by_path.get(".".join(parts[:n]))
            if row is not None:
                break
        if row is None or (n < len(parts) and not re.search(rf"\b{re.escape(parts[-1])}\b", row)):
            undocumented.append(path)
    assert not undocumented, f"fields the models accept but docs/config.md does not document: {undocumented}"


def test_the_docs_field_table_is_the_generated_one():
    text = (ROOT / "docs" / "config.md").read_text()
    assert text == docs_with_table(text), (
        "docs/config.md's field table is stale: run `python -m dp_spark.spec.schema --docs docs/config.md`")


def test_cross_field_rules_are_reported_together_with_their_paths():
    d = _spec(MULTI)
    d["budget"]["delta"] = "1e-8"  # no private keys: spends no delta
    d["statistics"][1]["name"] = d["statistics"][0]["name"]
    d["columns"] = ["user_id"]
    d["max_cells"] = 2
    msg = _error(d)
    assert "5 errors" in msg, msg  # the where then reads a column outside 'columns' too
    for path in ("budget.delta", "statistics", "columns", "group_by.public_keys", "where"):
        assert f"field '{path}'" in msg, msg


def test_a_kind_declares_its_fields_once():
    """The statistics[] entries are built from the kind registry: each kind's options model
    is the one place its fields live (schema, validation and docs follow)."""
    from dp_spark.spec.release import statistic_models
    from dp_spark.statistics.base import kinds

    by_kind = {m.model_fields["kind"].annotation.__args__[0]: m for m in statistic_models()}
    for name, kind in kinds().items():
        if kind.options is None:
            assert name not in by_kind and kind.refusal
            continue
        assert set(kind.options.model_fields) <= set(by_kind[name].model_fields)
    schema = release_spec_json_schema()
    assert {"q", "bins"} <= set(schema["$defs"]["QuantileStatistic"]["properties"])
    assert "q" not in schema["$defs"]["MeanStatistic"]["properties"]


def test_bounds_the_grid_cannot_hold_name_their_field():
    from dp_spark.errors import InvalidBoundsError

    d = _spec(MULTI)
    d["statistics"][2]["upper"] = 1e300
    with pytest.raises(InvalidBoundsError, match=r"^t\.yaml: field 'statistics\[2\]': not representable"):
        release_spec_from_dict(d, source="t.yaml")
    d = _spec(SINGLE)
    d["value"] = {"column": "order_value", "lower": -1e300, "upper": 1e300}
    d.pop("mean")
    with pytest.raises(InvalidBoundsError, match=r"^t\.yaml: field 'value': not representable"):
        release_spec_from_dict(d, source="t.yaml")
