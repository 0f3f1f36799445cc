"""The columns a spec reads, checked against an input's column names (no Spark: the names are
given), did-you-mean, and the cell counts and numbers printed for people."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import pytest

from dp_spark import precheck
from dp_spark.config import load_release_spec
from dp_spark.errors import SchemaError
from dp_spark.report import cells_text, decimal, percent
from dp_spark.spec.errors import did_you_mean
from tests.shipped_specs import shipped_spec_paths

ROOT = Path(__file__).resolve().parents[2]
INPUT = ["event_id", "user_id", "event_time", "day", "region", "order_value"]


def spec(name: str):
    return load_release_spec(ROOT / "conf" / "releases" / f"{name}.yaml")


def test_columns_read_name_the_field_that_reads_each_column():
    assert precheck.columns_read(spec("aov_by_region")) == [
        ("privacy_unit.column", "user_id"), ("group_by.column", "region"), ("value.column", "order_value")]
    assert precheck.columns_read(spec("orders_by_day_region")) == [
        ("privacy_unit.column", "user_id"), ("group_by[0].column", "day"), ("group_by[1].column", "region"),
        ("statistics[2].column", "order_value")]


def test_every_shipped_spec_reads_only_columns_of_the_demo_input():
    for path in shipped_spec_paths():
        precheck.check_input_columns(load_release_spec(path), INPUT)


def test_a_missing_column_is_named_with_its_field_a_close_name_and_the_input_columns():
    have = ["user_id", "Region", "order_val", "day"]
    with pytest.raises(SchemaError) as exc:
        precheck.check_input_columns(spec("aov_by_region"), have)
    text = str(exc.value)
    assert "field 'group_by.column': column 'region' is not in the input (did you mean 'Region'? names are " \
           "case-sensitive)" in text
    assert "field 'value.column': column 'order_value' is not in the input (did you mean 'order_val'?)" in text
    assert text.endswith("the input's columns: user_id, Region, order_val, day")
    assert "user_id' is not" not in text


def test_a_unit_may_be_a_field_of_a_struct_column():
    s = spec("dau_daily")
    buyer = SimpleNamespace(fields=[SimpleNamespace(name="id", dataType=SimpleNamespace(fields=None))])
    schema = SimpleNamespace(fields=[SimpleNamespace(name="buyer", dataType=buyer),
                                     SimpleNamespace(name="day", dataType=None)])
    top, nested = precheck.schema_names(schema)
    assert top == ["buyer", "day"] and nested == ["buyer.id"]
    with pytest.raises(SchemaError, match="privacy_unit.column"):
        precheck.check_input_columns(s, top, nested)


def test_did_you_mean():
    assert did_you_mean("demo_events_usr", ["demo_events_user", "other"]) == " (did you mean 'demo_events_user'?)"
    assert did_you_mean("zzz", ["demo_events_user"]) == ""
    assert did_you_mean("count", ["count"]) == ""
    assert did_you_mean(None, ["count"]) == ""


def test_cells_are_counted_and_named_as_published():
    assert cells_text(spec("aov_by_region")) == "40 cells (20 keys x 2 statistics: count, mean)"
    assert cells_text(spec("dau_daily")) == "30 cells (30 keys x 1 statistic: distinct_units)"
    assert cells_text(spec("orders_by_found_region")).startswith("at most 6,000 cells (at most 1,500 keys x 4")


def test_numbers_for_people_are_decimals_and_percentages():
    assert decimal("8/5") == "1.6" and decimal(Fraction(1, 3)) == "0.3333"
    assert percent("149221/500000") == "29.8%" and percent(Fraction(1, 4)) == "25%"
