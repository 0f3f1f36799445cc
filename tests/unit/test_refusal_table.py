"""docs/cli.md's table of refusals is the one dp_spark.cli.refusals generates from the checks,
and its messages give the fix: a close name, the declared budgets, the input's columns."""

from __future__ import annotations

from pathlib import Path

from dp_spark.cli.refusals import docs_with_table, refusal_rows

ROOT = Path(__file__).resolve().parents[2]


def test_the_docs_refusal_table_is_the_generated_one():
    text = (ROOT / "docs" / "cli.md").read_text()
    assert text == docs_with_table(text), (
        "docs/cli.md's refusal table is stale: run `python -m dp_spark.cli.refusals --docs docs/cli.md`")


def test_each_refusal_says_the_fix():
    by_kind = {name: message for name, _, _, message in refusal_rows()}
    assert "did you mean 'confidence'?" in by_kind["unknown field (a typo)"]
    assert "did you mean 'count'?" in by_kind["unknown statistic kind"]
    unknown_budget = by_kind["unknown budget id"]
    assert "did you mean 'demo_events_user'?" in unknown_budget
    assert "declared budgets: demo_events_user, demo_events_user_pure" in unknown_budget
    where = by_kind["`where` reads a column not listed in `columns`"]
    assert "did you mean 'region'?" in where and "exist in the input and are listed in 'columns'" in where
    missing = by_kind["a column the spec reads is not in the input"]
    assert "field 'statistics[1].column'" in missing and "did you mean 'order_value'?" in missing
    assert "the input's columns: event_id, user_id, event_time, day, region, order_value" in missing
    assert "field 'where': column 'coupon'" in by_kind["a `where` column is not in the input"]
