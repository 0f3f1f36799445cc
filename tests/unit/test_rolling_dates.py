"""Rolling date keys: resolved against the job's date, never the data; a month of the shipped
daily schedule fits the shipped monthly budget policy."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from dp_spark.core.budget import ZCDP
from dp_spark.config import load_release_spec, release_spec_from_dict
from dp_spark.errors import BudgetExceededError, ConfigError
from dp_spark.ledger import open_ledger
from dp_spark.ledger.policy import load_policies
from dp_spark.schedule import day_spec

ROOT = Path(__file__).resolve().parents[2]
ROLLING = ROOT / "conf/releases/dau_rolling.yaml"


def test_end_today_resolves_against_the_run_date():
    s = load_release_spec(ROLLING, run_date=date(2027, 1, 15))
    assert s.group_by.values[0] == "2026-11-01" and s.group_by.values[-1] == "2027-01-15"
    # the day after the old fixed end (2026-11-30) and any later day: no spec edit needed
    for d in (date(2026, 12, 1), date(2027, 1, 15)):
        ds = day_spec(s, d)
        assert ds.keys == (d.isoformat(),) and ds.bounds.max_partitions_per_unit == 1
    with pytest.raises(ConfigError, match="outside the declared dates"):
        day_spec(s, date(2027, 1, 16))  # after the run date: not a public key yet


def test_through_yesterday_and_refusals():
    d = yaml.safe_load(ROLLING.read_text())
    d["group_by"]["public_keys"]["dates"] = {"start": "2026-11-01", "through": "yesterday"}
    s = release_spec_from_dict(d, "t.yaml", run_date=date(2026, 12, 2))
    assert s.group_by.values[-1] == "2026-12-01"
    for bad in ({"start": "today", "end": "today"}, {"start": "2026-11-01", "end": "tomorrow"},
                {"start": "2026-11-01", "end": "today", "through": "today"}, {"start": "2026-11-01"}):
        d["group_by"]["public_keys"]["dates"] = bad
        with pytest.raises(ConfigError):
            release_spec_from_dict(d, "t.yaml", run_date=date(2026, 12, 2))


def test_release_ids_differ_by_day_but_not_by_run_date():
    a = day_spec(load_release_spec(ROLLING, run_date=date(2026, 12, 5)), date(2026, 12, 2))
    b = day_spec(load_release_spec(ROLLING, run_date=date(2026, 12, 20)), date(2026, 12, 2))
    c = day_spec(load_release_spec(ROLLING, run_date=date(2026, 12, 20)), date(2026, 12, 3))
    assert a.version() == b.version() != c.version()


def test_a_month_of_the_daily_schedule_fits_the_shipped_monthly_policy(tmp_path):
    """31 daily refreshes (December) plus the demo's two releases, charged to the shipped
    policy with a clock on each day: no refusal, and the total charged is exact."""
    policy = load_policies(ROOT / "conf/policies/budgets.yaml")["demo_events_user"]
    ledger = open_ledger(f"sqlite:{tmp_path}/ledger.db")
    ledger.register_budget(policy)
    spec = load_release_spec(ROLLING, run_date=date(2026, 12, 31))
    demo = [load_release_spec(ROOT / f"conf/releases/{n}.yaml") for n in ("dau_daily", "aov_by_region")]
    total = None
    for i in range(31):
        day = date(2026, 12, 1) + timedelta(days=i)
        now = datetime(2026, 12, 1, 2, 30, tzinfo=timezone.utc) + timedelta(days=i)
        charges = [(day_spec(spec, day - timedelta(days=1) if i else day), "day")]
        if i == 0:
            charges += [(s, "demo") for s in demo]
        for s, tag in charges:
            rid = f"{s.name}-{tag}-{i}"
            r = ledger.reserve(s.budget_id, rid, s.charge, "{}", principal="p", code_version="t",
                               release_family=s.family, owner_token=rid, now=now)
            ledger.commit(rid, r.entry.owner_token, now=now)
            total = s.charge if total is None else total + s.charge
    assert total == ZCDP(Fraction(31 * 2, 100) + Fraction(1, 2))
    st = ledger.status("demo_events_user", now=datetime(2026, 12, 31, 23, tzinfo=timezone.utc))
    assert st.remaining == policy.cap - total  # rho and the delta cap (nothing here spends delta)
    # and the budget does refuse what does not fit: a 32nd day at the same charge would fit, a
    # release of the remaining budget plus one would not
    with pytest.raises(BudgetExceededError):
        ledger.reserve("demo_events_user", "too-much", st.remaining + ZCDP(Fraction(1, 100)), "{}",
                       principal="p", code_version="t", release_family="x", owner_token="x",
                       now=datetime(2026, 12, 31, 23, tzinfo=timezone.utc))


def test_a_multi_statistic_release_restricts_its_date_column_for_a_daily_refresh():
    from dp_spark.governance.access import _matches

    s = load_release_spec(ROOT / "conf/releases/orders_by_day_region.yaml")
    ds = day_spec(s, date(2026, 11, 3))
    assert ds.name == "orders_by_day_region_20261103" and ds.family == s.family
    assert [k.values for k in ds.key_sets] == [("2026-11-03",), ("region_01", "region_02")]
    assert ds.cells == 2 and ds.bounds.max_partitions_per_unit == 2  # L0 3 cannot exceed 2 cells
    # official mode: the day spec is recognised as a restriction of the registered spec
    assert _matches(ds, s)
    other = release_spec_from_dict(dict(yaml.safe_load((ROOT / "conf/releases/orders_by_day_region.yaml")
                                                       .read_text()), where="order_value > 1"))
    assert not _matches(ds, other)
    with pytest.raises(ConfigError, match="outside the declared dates"):
        day_spec(s, date(2026, 12, 3))
