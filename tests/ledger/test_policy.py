"""Budget policy files and windows (no database, no Spark)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from dp_spark.core.budget import PureDP, ZCDP
from dp_spark.errors import ConfigError
from dp_spark.ledger.policy import BudgetPolicy, WindowPolicy, load_policies

UTC = timezone.utc
REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "conf" / "policies" / "budgets.yaml"


def test_shipped_policies():
    p = load_policies(SHIPPED)
    assert set(p) == {"demo_events_user", "demo_events_user_pure"}
    z = p["demo_events_user"]
    assert (z.budget_id, z.dataset, z.privacy_unit, z.measure) == ("demo_events_user", "demo_events", "user", "zcdp")
    assert z.cap == ZCDP(2, Fraction(1, 10**6)) and z.max_per_release == ZCDP(1)
    assert z.delta_cap == Fraction(1, 10**6)  # releases with private keys may spend delta
    assert z.statement_delta == Fraction(1, 10**7)
    assert z.window == WindowPolicy("monthly")
    e = p["demo_events_user_pure"]
    assert e.measure == "pure_dp" and e.cap == PureDP(10) and e.max_per_release == PureDP(5)
    assert e.statement_delta is None and e.window.kind == "monthly" and e.delta_cap == 0
    assert "rolling" in SHIPPED.read_text()  # the commented example


def _write(tmp_path, budgets, **top) -> Path:
    path = tmp_path / "budgets.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "budgets": budgets, **top}))
    return path


BASE = {"dataset": "ds", "privacy_unit": "user", "measure": "pure_dp", "cap": {"epsilon": 1}}


def test_window_forms_and_defaults(tmp_path):
    path = _write(tmp_path, {
        "a": BASE,
        "b": {**BASE, "window": "daily"},
        "c": {**BASE, "window": {"kind": "rolling", "days": 7}},
        "d": {**BASE, "measure": "zcdp", "cap": {"rho": "1/2"}, "statement_delta": "1e-6"},
    })
    p = load_policies(path)
    assert p["a"].window == WindowPolicy("none") and p["a"].max_per_release is None
    assert p["b"].window.kind == "daily"
    assert p["c"].window == WindowPolicy("rolling", 7)
    assert p["d"].cap == ZCDP(Fraction(1, 2)) and p["d"].statement_delta == Fraction(1, 10**6)


@pytest.mark.parametrize("budget, field", [
    ({k: v for k, v in BASE.items() if k != "dataset"}, "budgets.x.dataset"),
    ({**BASE, "cap": None}, "budgets.x.cap"),
    ({**BASE, "measure": "renyi"}, "budgets.x.measure"),
    ({**BASE, "cap": {"rho": 1}}, "budgets.x.cap"),                       # measure/cap mismatch
    ({**BASE, "cap": {"epsilon": 1, "delta": 0.1}}, "budgets.x.cap"),
    ({**BASE, "cap": {"epsilon": -1}}, "budgets.x.cap"),
    ({**BASE, "cap": {"epsilon": "lots"}}, "budgets.x.cap"),
    ({**BASE, "cap": 1}, "budgets.x.cap"),
    ({**BASE, "max_per_release": {"epsilon": 2}}, "budgets.x.max_per_release"),
    ({**BASE, "max_per_release": {"rho": 0.5}}, "budgets.x.max_per_release"),
    ({**BASE, "statement_delta": 1e-6}, "budgets.x.statement_delta"),     # pure_dp with delta
    ({**BASE, "measure": "zcdp", "cap": {"rho": 1}}, "budgets.x.statement_delta"),
    ({**BASE, "measure": "zcdp", "cap": {"rho": 1}, "statement_delta": 1.5}, "budgets.x.statement_delta"),
    ({**BASE, "window": "weekly"}, "budgets.x.window"),
    ({**BASE, "window": {"kind": "rolling"}}, "budgets.x.window"),
    ({**BASE, "window": {"kind": "rolling", "days": 0}}, "budgets.x.window"),
    ({**BASE, "window": {"kind": "daily", "days": 3}}, "budgets.x.window"),
    ({**BASE, "window": {"kind": "rolling", "days": 7, "tz": "CET"}}, "budgets.x.window.tz"),
    ({**BASE, "privacy_unit": "a user"}, "budgets.x.privacy_unit"),
    ({**BASE, "max_per_releas": {"epsilon": 1}}, "budgets.x.max_per_releas"),  # typo
    ("not a mapping", "budgets.x"),
])
def test_invalid_policy_names_file_and_field(tmp_path, budget, field):
    path = _write(tmp_path, {"x": budget})
    with pytest.raises(ConfigError) as info:
        load_policies(path)
    text = str(info.value)
    assert str(path) in text and f"'{field}'" in text


def test_invalid_documents(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_policies(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("budgets: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML at line"):
        load_policies(bad)
    with pytest.raises(ConfigError, match="'budgets'"):
        load_policies(_write(tmp_path, {}))
    with pytest.raises(ConfigError, match="'version'"):
        load_policies(_write(tmp_path, {"x": BASE}, version=2))
    with pytest.raises(ConfigError, match="'extra'"):
        load_policies(_write(tmp_path, {"x": BASE}, extra=1))
    with pytest.raises(ConfigError, match="budgets.bad id"):
        load_policies(_write(tmp_path, {"bad id": BASE}))
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="top level"):
        load_policies(bad)


def test_yaml_is_loaded_safely(tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text("budgets: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(ConfigError):
        load_policies(path)


def test_budget_policy_validates_in_post_init():
    with pytest.raises(ConfigError, match="cap is not a zcdp amount"):
        BudgetPolicy("b", "ds", "user", "zcdp", PureDP(1), statement_delta=Fraction(1, 10**6))
    with pytest.raises(ConfigError, match="statement_delta is required"):
        BudgetPolicy("b", "ds", "user", "zcdp", ZCDP(1))
    p = BudgetPolicy("b", "ds", "user", "zcdp", ZCDP(1), statement_delta=1e-6)
    assert p.statement_delta == Fraction(1, 10**6)
    with pytest.raises(ConfigError):
        BudgetPolicy("", "ds", "user", "pure_dp", PureDP(1))


# -- windows ---------------------------------------------------------------------------
def test_daily_bounds():
    w = WindowPolicy("daily")
    assert w.bounds(datetime(2026, 3, 5, 17, 30, tzinfo=UTC)) == (
        datetime(2026, 3, 5, tzinfo=UTC), datetime(2026, 3, 6, tzinfo=UTC))
    # another zone: converted to UTC first (23:30 at UTC-2 is 01:30 UTC next day)
    minus2 = timezone(timedelta(hours=-2))
    assert w.bounds(datetime(2026, 3, 5, 23, 30, tzinfo=minus2))[0] == datetime(2026, 3, 6, tzinfo=UTC)


@pytest.mark.parametrize("now, start, end", [
    (datetime(2026, 1, 31, 23, 59, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 2, 1, tzinfo=UTC)),
    (datetime(2028, 2, 29, tzinfo=UTC), datetime(2028, 2, 1, tzinfo=UTC), datetime(2028, 3, 1, tzinfo=UTC)),
    (datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)),
])
def test_monthly_bounds(now, start, end):
    assert WindowPolicy("monthly").bounds(now) == (start, end)


def test_rolling_and_none_bounds_and_membership():
    now = datetime(2026, 3, 10, 8, tzinfo=UTC)
    w = WindowPolicy("rolling", 7)
    assert w.bounds(now) == (now - timedelta(days=7), now)
    assert w.contains(now - timedelta(days=7), now)
    assert not w.contains(now - timedelta(days=7, microseconds=1), now)
    assert w.contains(now + timedelta(minutes=5), now)  # a skewed clock cannot hide spend
    none = WindowPolicy()
    assert none.bounds(now) == (None, None) and none.contains(datetime(1990, 1, 1, tzinfo=UTC), now)
    daily = WindowPolicy("daily")
    assert not daily.contains(datetime(2026, 3, 11, tzinfo=UTC), now)  # end is exclusive


def test_naive_datetimes_are_refused():
    with pytest.raises(ConfigError, match="timezone-aware"):
        WindowPolicy("daily").bounds(datetime(2026, 1, 1))
