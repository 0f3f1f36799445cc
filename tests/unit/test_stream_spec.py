"""The ``stream: {horizon_days, start}`` field of a statistics spec: its rules, its canonical
form (specs without it keep their release ids: tests/unit/test_golden_release_ids.py), and
the tree plan it gets (one charge for the horizon, the error at day 1, 30 and 365)."""

from __future__ import annotations

import copy
from datetime import date
from fractions import Fraction

import pytest

from dp_spark.config import release_spec_from_dict
from dp_spark.errors import ConfigError
from dp_spark.spec.release import release_spec_errors

BASE = {
    "name": "revenue_stream", "dataset": "demo_events",
    "privacy_unit": {"kind": "user", "column": "user_id"},
    "statistics": [{"name": "orders", "kind": "count"},
                   {"name": "revenue", "kind": "sum", "column": "order_value", "lower": 0, "upper": 500}],
    "group_by": {"column": "day", "public_keys": {"dates": {"start": "2026-11-01", "end": "yesterday"}}},
    "bounds": {"max_rows_per_unit": 10, "max_partitions_per_unit": 3, "max_rows_per_partition": 4},
    "budget": {"id": "demo_events_user", "measure": "zcdp", "rho": "0.25"},
    "stream": {"horizon_days": 365, "start": "2026-11-01"},
}
RUN = date(2026, 11, 11)


def _spec(**over):
    d = copy.deepcopy(BASE)
    d.update(over)
    return d


def test_a_stream_spec_is_read():
    spec = release_spec_from_dict(_spec(), run_date=RUN)
    assert spec.stream.horizon_days == 365 and spec.stream.start == "2026-11-01"
    assert spec.canonical()["stream"] == {"horizon_days": 365, "start": "2026-11-01"}
    without = release_spec_from_dict({k: v for k, v in _spec().items() if k != "stream"}, run_date=RUN)
    assert "stream" not in without.canonical() and without.version() != spec.version()


@pytest.mark.parametrize("over,path", [
    ({"stream": {"horizon_days": 365, "start": "2026-11-02"}}, "stream.start"),
    ({"stream": {"horizon_days": 5, "start": "2026-11-01"}}, "stream.horizon_days"),
    ({"stream": {"horizon_days": 0, "start": "2026-11-01"}}, "stream.horizon_days"),
    ({"statistics": [{"name": "aov", "kind": "mean", "column": "order_value", "lower": 0, "upper": 500}]},
     "statistics"),
    ({"statistics": [{"name": "orders", "kind": "count", "window": {"days": 7}}]}, "statistics"),
    ({"group_by": {"column": "region", "public_keys": {"values": ["a", "b"]}}}, "stream"),
    ({"min_group_size": 5}, "min_group_size"),
])
def test_stream_rules(over, path):
    errors = release_spec_errors(_spec(**over), run_date=RUN)
    assert any(p == path for p, _ in errors), errors
    with pytest.raises(ConfigError):
        release_spec_from_dict(_spec(**over), run_date=RUN)


def test_a_stream_takes_a_simultaneous_band_and_keeps_its_id_without_one():
    from dp_spark.statistics.stream import plan_stream, stream_id_for

    plain = release_spec_from_dict(_spec(), run_date=RUN)
    explicit = release_spec_from_dict(_spec(confidence={"level": 0.95, "simultaneous": False}), run_date=RUN)
    banded = release_spec_from_dict(_spec(confidence={"level": 0.95, "simultaneous": True}), run_date=RUN)
    assert banded.simultaneous and not plain.simultaneous
    # absent or false: the same canonical form, version and stream id; true: a new stream
    assert explicit.canonical() == plain.canonical() and "simultaneous" not in plain.canonical()
    assert stream_id_for(explicit, "official") == stream_id_for(plain, "official")
    assert banded.version() != plain.version()
    assert stream_id_for(banded, "official") != stream_id_for(plain, "official")
    # m: every point of the horizon (365 days x the statistics), not the 10 days declared so far
    plan = plan_stream(banded)
    assert plan.days == 10 and plan.band_points == 365 * len(banded.statistics)


def test_the_statement_states_a_stream_band_as_bonferroni_over_the_horizon():
    from dp_spark.governance.statement import intervals_paragraph

    banded = release_spec_from_dict(_spec(confidence={"level": 0.95, "simultaneous": True}), run_date=RUN)
    query = {"name": banded.name, "confidence": str(banded.confidence), "simultaneous_bands": True,
             "statistics": [s.canonical() for s in banded.statistics],
             "stream": {"horizon_days": banded.stream.horizon_days, "start": banded.stream.start}}
    text = "\n".join(intervals_paragraph([query]))
    assert "all 730 points of its horizon" in text and "0.05/730 (Bonferroni" in text and "Sidak" not in text


def test_the_single_metric_form_takes_no_stream():
    d = {k: v for k, v in _spec().items() if k != "statistics"}
    d.update(metric="count")
    assert release_spec_errors(d, run_date=RUN)


def test_the_stream_plan_is_one_charge_for_the_horizon():
    from dp_spark.accountant import Accountant
    from dp_spark.mechanisms import tree
    from dp_spark.statistics.stream import plan_stream

    spec = release_spec_from_dict(_spec(), run_date=RUN)
    plan = plan_stream(spec)
    assert plan.days == 10 and plan.horizon == 365
    cost = Accountant("zcdp").cost(plan.event)
    assert cost.fits_in(spec.charge) and cost.rho >= spec.charge.rho * Fraction(999999, 1000000)
    rows, money = plan.parts
    # derived from the bounds: L0 = 3 days, Linf = 4 rows per day (times 500 on the sum's grid)
    assert rows.contribution == tree.StreamContribution(max_days=3, per_day=4)
    assert money.contribution.max_days == 3
    assert money.contribution.per_day == 4 * 500 * 2 ** -money.component.grid_exponent
    assert rows.calibration.sensitivity == tree.node_sensitivity(365, rows.contribution)
    prof = plan.error_profile()
    assert [(p["statistic"], p["day"]) for p in prof] == [("orders", 1), ("orders", 30), ("orders", 365),
                                                          ("revenue", 1), ("revenue", 30), ("revenue", 365)]
    assert prof[0]["stddev"] < prof[1]["stddev"] < prof[2]["stddev"]


def test_every_day_of_a_stream_is_the_same_stream_with_the_same_trees():
    from dp_spark.schedule import day_spec
    from dp_spark.statistics.stream import plan_stream, stream_id_for

    spec = release_spec_from_dict(_spec(), run_date=RUN)
    later = release_spec_from_dict(_spec(), run_date=date(2027, 3, 1))  # more dates declared
    days = [day_spec(s, d) for s in (spec, later) for d in (date(2026, 11, 1), date(2026, 11, 2), date(2026, 11, 10))]
    assert len({stream_id_for(d, "official") for d in days}) == 1
    assert len({stream_id_for(d, "exploration") for d in days[:1]} | {stream_id_for(days[0], "official")}) == 2
    assert len({plan_stream(d).event for d in days}) == 1  # same scales, same charge, whatever the day
    assert [d.keys[-1] for d in days[:3]] == ["2026-11-01", "2026-11-02", "2026-11-10"]
    assert len(days[2].keys) == 10 and days[0].bounds.max_partitions_per_unit == 3


def test_distinct_units_ever_seen_move_one_per_level():
    from dp_spark.mechanisms import tree
    from dp_spark.statistics.stream import plan_stream

    spec = release_spec_from_dict(_spec(statistics=[{"name": "buyers", "kind": "distinct_units"}]), run_date=RUN)
    (part,) = plan_stream(spec).parts
    assert part.component.kind == "units" and part.contribution == tree.distinct_units_contribution()
    assert part.calibration.sensitivity == tree.NodeSensitivity(l1=9, l2_squared=9)  # 9 levels for 365 days
