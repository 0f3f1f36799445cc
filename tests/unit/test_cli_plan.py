"""dp-spark plan / validate / --help / --version: no data read, the engine's own numbers."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from dp_spark import cli
from dp_spark.api import plan_table
from dp_spark.config import load_release_spec
from dp_spark.statistics.components import _tag
from dp_spark.statistics.plan import plan_query

from tests.unit.test_statistics import ZeroSource

ROOT = Path(__file__).resolve().parents[2]
MULTI = ROOT / "conf/releases/orders_by_day_region.yaml"


def test_plan_states_exactly_what_the_engine_publishes_for_a_cell_of_that_size():
    """The engine's noise step on partials equal to the plan's assumed inputs (n rows at the
    midpoint, spread W/2, uniform bins), with zero noise, publishes the plan's figures."""
    spec = load_release_spec(MULTI)
    qp = plan_query(spec)
    n = 640  # 10 rows in each of the 64 bins
    parts = {"dp_rows": n, "dp_units": n}
    for c in qp.components:
        if c.kind == "nsum":  # every value at the midpoint: sum = n * mid
            mid = (c.clamp.lower + c.clamp.upper) / 2 / Fraction(2) ** c.clamp.grid_exponent
            parts[f"dp_s_{_tag(c.clamp)}_lo"] = int(n * mid)
        if c.kind == "nsumsq":
            k2, _ = c.square_grid
            parts[f"dp_sq_{_tag(c.clamp)}_lo"] = int(-n * c.clamp.half_width ** 2 / 4 / Fraction(2) ** k2)
        if c.kind == "hist":
            for j in range(c.bins):
                parts[f"dp_h_{_tag(c.clamp, str(c.bins))}_{j}"] = n // c.bins
    cells = {c["statistic"]: c for c in qp.noise({0: parts}, ZeroSource()) if c["keys"] == {"day": "2026-11-01", "region": "region_01"}}
    for row in plan_table(spec, group_size=n):
        c = cells[row["statistic"]]
        assert row["expected_abs_error"] == pytest.approx(c["expected_abs_error"], rel=1e-12), row["statistic"]
        assert row["interval_half_width"] == pytest.approx((c["ci_high"] - c["ci_low"]) / 2, rel=1e-12), row["statistic"]


def test_plan_command_prints_every_statistic_and_the_charge_in_epsilon(capsys, tmp_path):
    env = tmp_path / "conf" / "envs" / "e.yaml"
    env.parent.mkdir(parents=True)
    env.write_text(f"name: e\nwarehouse: {tmp_path}/wh\ndatasets: {{demo_events: x/y}}\n"
                   f"policies: {ROOT}/conf/policies/budgets.yaml\n")
    rc = cli.main(["plan", "--env", str(env), "--conf", str(MULTI), "--conf",
                   str(ROOT / "conf/releases/aov_by_region.yaml"), "--group-size", "500"])
    out = capsys.readouterr().out
    assert rc == 0
    for name in ("users", "orders", "revenue", "aov", "order_sd", "median_order", "mean"):
        assert f"   {name} " in out
    assert "epsilon" in out and "delta 1e-07" in out
    assert "no ledger yet" in out and not (tmp_path / "wh").exists()  # nothing created


def test_validate_help_and_version(capsys):
    assert cli.main(["validate", "--conf", str(MULTI)]) == 0
    assert "ok (orders_by_day_region" in capsys.readouterr().out
    assert cli.main(["validate", "--conf", str(ROOT / "conf/releases/nope.yaml")]) == 2
    with pytest.raises(SystemExit) as exc:  # argparse exits 0 after --help / --version
        cli.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for cmd in cli.COMMANDS:
        assert f"  {cmd}" in out
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("dp-spark ")


def test_plan_rows_show_each_statistics_own_share_and_epsilon_beside_the_releases():
    """A statistic's row carries its own share of the charge and the statement of that share,
    not the whole release's epsilon (which is in release_epsilon); the shares of statistics
    without shared components add up to the charge."""
    from dp_spark.accountant import Accountant
    from dp_spark.config import release_spec_from_dict
    from dp_spark.core.budget import ZCDP

    d = {"name": "t", "dataset": "d", "privacy_unit": {"kind": "user", "column": "u"},
         "group_by": [{"column": "r", "public_keys": {"values": ["a", "b"]}}],
         "bounds": {"max_rows_per_unit": 2, "max_partitions_per_unit": 1},
         "statistics": [{"name": "n", "kind": "count"}, {"name": "users", "kind": "distinct_units"}],
         "budget": {"id": "b", "measure": "zcdp", "rho": 0.5}}
    spec = release_spec_from_dict(d, "t.yaml")
    policy = type("P", (), {"statement_delta": Fraction(1, 10**7)})()
    rows = plan_table(spec, budget_policy=policy)
    assert [r["statistic"] for r in rows] == ["n", "users"]
    shares = [Fraction(r["share"]) for r in rows]
    assert sum(shares) == 1 and all(0 < s < 1 for s in shares)
    acc = Accountant("zcdp", statement_delta=Fraction(1, 10**7))
    whole = acc.statement(spec.charge)["epsilon"]
    for r, s in zip(rows, shares):
        assert r["release_epsilon"] == pytest.approx(whole)
        assert r["epsilon"] == pytest.approx(acc.statement(ZCDP(rho=Fraction(1, 2) * s))["epsilon"])
        assert r["epsilon"] < whole
