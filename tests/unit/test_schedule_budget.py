"""A schedule's cost per budget window, against the cap: ``dp-spark plan / validate --schedule``,
and the shipped Databricks bundle's jobs (databricks.yml) against the shipped policies, run
for 365 nights with a fixed clock and a nightly append."""

from __future__ import annotations

import calendar
import re
from datetime import date, datetime, timedelta, timezone
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from dp_spark import cli
from dp_spark.config import load_release_spec
from dp_spark.core.budget import ZCDP
from dp_spark.engine import release_id_for
from dp_spark.errors import BudgetExceededError
from dp_spark.ledger import open_ledger
from dp_spark.ledger.policy import WindowPolicy, load_policies
from dp_spark.schedule import day_spec, runs_per_window, schedule_cost

ROOT = Path(__file__).resolve().parents[2]
POLICIES = load_policies(ROOT / "conf/policies/budgets.yaml")
DAU = ROOT / "conf/releases/dau_rolling.yaml"
AOV = ROOT / "conf/releases/aov_by_region.yaml"


def _bundle_jobs() -> list[tuple[Path, str]]:
    """(spec path, schedule) of every scheduled job of databricks.yml: its quartz cron read as
    daily ('* * ?': every day) or weekly (one day of the week), its spec from the bundle's
    variables."""
    bundle = yaml.safe_load((ROOT / "databricks.yml").read_text())
    variables = {k: v.get("default") for k, v in bundle["variables"].items()}
    out = []
    for job in bundle["resources"]["jobs"].values():
        cron = (job.get("schedule") or {}).get("quartz_cron_expression")
        if cron is None:
            continue  # the backfill job runs by hand
        sec, minute, hour, dom, month, dow = cron.split()
        schedule = "daily" if (dom, month, dow) == ("*", "*", "?") else "weekly" if dom == "?" and \
            re.fullmatch(r"[A-Z]{3}", dow) else None
        assert schedule is not None, f"unread cron {cron}"
        for task in job["tasks"]:
            params = (task.get("spark_python_task") or task.get("python_wheel_task") or {}).get("parameters", [])
            for i, p in enumerate(params):
                if p == "--conf":
                    var = re.fullmatch(r"\$\{var\.(\w+)\}", params[i + 1]).group(1)
                    rel = variables[var].replace("${workspace.file_path}/", "")
                    out.append((ROOT / rel, schedule))
    return out


def test_runs_per_window():
    monthly, daily = WindowPolicy("monthly"), WindowPolicy("daily")
    rolling = WindowPolicy("rolling", 30)
    assert [runs_per_window(s, monthly) for s in ("daily", "weekly", "monthly")] == [31, 5, 1]
    assert [runs_per_window(s, daily) for s in ("daily", "weekly", "monthly")] == [1, 1, 1]
    assert [runs_per_window(s, rolling) for s in ("daily", "weekly", "monthly")] == [31, 5, 2]
    assert runs_per_window("daily", WindowPolicy("none")) is None


def test_the_shipped_bundle_fits_its_budget():
    jobs = _bundle_jobs()
    assert sorted((p.name, s) for p, s in jobs) == [("aov_by_region.yaml", "weekly"), ("dau_rolling.yaml", "daily")]
    (cost,) = schedule_cost([(load_release_spec(p), s) for p, s in jobs], POLICIES)
    assert cost.fits and cost.total == ZCDP(Fraction(31 * 2, 100) + 5 * Fraction(1, 4))
    # the same two jobs nightly do not fit: what the shipped bundle avoids
    (nightly,) = schedule_cost([(load_release_spec(p), "daily") for p, _ in jobs], POLICIES)
    assert not nightly.fits and nightly.total == ZCDP(Fraction(31 * 2, 100) + 31 * Fraction(1, 4))


def _env(tmp_path: Path) -> Path:
    env = tmp_path / "conf" / "envs" / "e.yaml"
    env.parent.mkdir(parents=True)
    env.write_text(f"name: e\nwarehouse: {tmp_path}/wh\ndatasets: {{demo_events: x/y}}\n"
                   f"policies: {ROOT}/conf/policies/budgets.yaml\n")
    return env


@pytest.mark.parametrize("command", ["plan", "validate"])
def test_plan_and_validate_refuse_a_schedule_that_does_not_fit(command, tmp_path, capsys, monkeypatch):
    env = _env(tmp_path)
    monkeypatch.setenv("DP_SPARK_PRINCIPAL", "publisher_bob")  # validate checks the access policy
    rc = cli.main([command, "--env", str(env), "--conf", str(DAU), "--conf", str(AOV), "--schedule", "daily"])
    out, err = capsys.readouterr()
    assert rc == 2 and "31 runs x zcdp(rho=0.25) = zcdp(rho=7.75)" in out
    assert "zcdp(rho=8.37) per monthly window, more than its cap" in err
    rc = cli.main([command, "--env", str(env), "--conf", str(AOV), "--schedule", "weekly"])
    out, _ = capsys.readouterr()
    assert rc == 0 and "per window at most zcdp(rho=1.25): fits the cap" in out
    rc = cli.main([command, "--env", str(env), "--conf", str(DAU), "--schedule", "daily"])
    out, _ = capsys.readouterr()
    assert rc == 0 and "31 new days (each day charged once) x zcdp(rho=0.02)" in out


@pytest.mark.parametrize("aov_nightly", [False, True])
def test_365_nights_of_the_shipped_bundle_fit_with_exact_totals(tmp_path, aov_nightly):
    """Each night at 02:30 UTC the daily job refreshes yesterday; each Monday at 03:00 the
    weekly job publishes the AOV. The input gets a nightly append (a new table version), so the
    weekly AOV is a new release each time; a day is one release whatever the version. Each
    run is charged to the shipped policy's ledger with the clock of the run: no refusal, and
    each month's total is exactly its days x 0.02 + its Mondays x 0.25. The same jobs with the
    AOV run nightly are refused by the ledger in the first month (the simulation can fail)."""
    if aov_nightly:
        with pytest.raises(BudgetExceededError):
            _simulate(tmp_path, aov_days=range(7))
        return
    _simulate(tmp_path, aov_days=(0,))


def _simulate(tmp_path: Path, aov_days) -> None:
    ledger = open_ledger(f"sqlite:{tmp_path}/ledger.db")
    ledger.register_budget(POLICIES["demo_events_user"])
    first = date(2027, 1, 1)
    expected: dict = {}
    charged: dict = {}
    table_id = "demo-table-id"
    for night in range(365):
        today = first + timedelta(days=night)
        version = night + 1  # the nightly append
        runs = [(datetime(today.year, today.month, today.day, 2, 30, tzinfo=timezone.utc),
                 day_spec(load_release_spec(DAU, run_date=today), today - timedelta(days=1)))]
        if today.weekday() in aov_days:
            runs.append((datetime(today.year, today.month, today.day, 3, 0, tzinfo=timezone.utc),
                         load_release_spec(AOV, run_date=today)))
        for now, spec in runs:
            # the daily refresh's release of a day: its id is the day spec on this night's
            # snapshot; a rerun the same night is a cache hit (found in the ledger)
            rid = release_id_for(spec, table_id, version, "official")
            for attempt in range(2):  # the job retried once: no second charge
                if ledger.find(rid) is None:
                    r = ledger.reserve(spec.budget_id, rid, spec.charge, "{}", principal="scheduler",
                                       code_version="t", release_family=spec.family, owner_token=rid, now=now)
                    ledger.commit(rid, r.entry.owner_token, now=now)
                    month = (now.year, now.month)
                    charged[month] = charged.get(month, 0) + spec.charge.rho
        month = (today.year, today.month)
        expected[month] = expected.get(month, 0) + Fraction(2, 100) + (Fraction(1, 4) if today.weekday() == 0 else 0)
        if today.day == calendar.monthrange(today.year, today.month)[1]:
            st = ledger.status("demo_events_user", now=datetime(today.year, today.month, today.day, 23,
                                                                tzinfo=timezone.utc))
            assert st.spent.rho == expected[month] == charged[month]
            assert st.spent.fits_in(POLICIES["demo_events_user"].cap)
    assert len(ledger.entries("demo_events_user")) == 365 + sum(
        1 for i in range(365) if (first + timedelta(days=i)).weekday() == 0)
    assert sum(charged.values()) == Fraction(365 * 2, 100) + 52 * Fraction(1, 4)
    assert max(expected.values()) == Fraction(31 * 2, 100) + 5 * Fraction(1, 4)  # a month with 5 Mondays
