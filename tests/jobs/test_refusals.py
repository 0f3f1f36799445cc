"""A refusal at any stage leaves nothing behind, and ``validate`` refuses what ``publish`` refuses
with the same message.

One test per refusal kind, through ``dp-spark publish`` (and the engine where the kind is met
there): a spec error, an access refusal, an exhausted budget, a column missing from the input,
too many cells. Each asserts that the env's output root gains no file or folder (no release
table named like the release), and that nothing else of the warehouse appears but the
ledger's own file (whose audit rows record an audited refusal): no salt, no statement, no
mirror.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from dp_spark.cli import publish_main, validate_main
from dp_spark.config import load_env
from dp_spark.engine import Engine
from dp_spark.errors import BudgetExceededError, PermissionDeniedError, SchemaError

from .conftest import ROOT, register, write_env

AOV = ROOT / "conf/releases/aov_by_region.yaml"
DAU = ROOT / "conf/releases/dau_daily.yaml"
ORDERS = ROOT / "conf/releases/orders_by_day_region.yaml"


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in Path(root).rglob("*")} if Path(root).exists() else set()


def not_ledger(root: Path) -> set[str]:
    """Everything under the warehouse but the SQLite ledger's own files."""
    return {f for f in files(root) if not f.startswith("ledger.db")}


def _snapshot(env_file):
    env = load_env(env_file)
    return env, Path(env.output_root), Path(env.warehouse)


def _capped(tmp_path: Path, cap_rho: float) -> Path:
    src = yaml.safe_load((ROOT / "conf/policies/budgets.yaml").read_text())
    src["budgets"]["demo_events_user"]["cap"] = {"rho": cap_rho}
    src["budgets"]["demo_events_user"]["max_per_release"] = {"rho": cap_rho}
    p = tmp_path / "capped.yaml"
    p.write_text(yaml.safe_dump(src))
    return p


def _spec_file(env_file, name: str, data: dict) -> str:
    path = Path(env_file).parents[1] / "releases" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def _publish(env_file, spec: str, capsys) -> tuple[int, str, str]:
    rc = publish_main(["--env", str(env_file), "--conf", spec, "--quiet"])
    out, err = capsys.readouterr()
    return rc, out, err


def _validate(env_file, spec: str, capsys, *extra: str) -> tuple[int, str, str]:
    rc = validate_main(["--env", str(env_file), "--conf", spec, *extra])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(autouse=True)
def _publisher(monkeypatch):
    monkeypatch.setenv("DP_SPARK_PRINCIPAL", "publisher_bob")


def test_a_spec_error_leaves_nothing(spark, warehouse, capsys):
    d = yaml.safe_load(AOV.read_text())
    d.update(name="aov_typo", family="aov_typo")
    d["bounds"] = {"max_rows_per_unt": 10, "max_partitions_per_unit": 1}
    spec = _spec_file(warehouse, "aov_typo", d)
    env, out_root, wh = _snapshot(warehouse)
    before, before_wh = files(out_root), files(wh)
    rc, out, err = _publish(warehouse, spec, capsys)
    assert rc == 2 and "did you mean 'max_rows_per_unit'?" in err
    assert files(out_root) == before and files(wh) == before_wh
    vrc, _, verr = _validate(warehouse, spec, capsys)
    assert vrc == 2 and verr == err  # validate refuses it with publish's message


def test_too_many_cells_leaves_nothing(spark, warehouse, capsys):
    d = yaml.safe_load(ORDERS.read_text())
    d.update(name="orders_wide", family="orders_wide", max_cells=100)
    spec = _spec_file(warehouse, "orders_wide", d)
    env, out_root, wh = _snapshot(warehouse)
    before, before_wh = files(out_root), files(wh)
    rc, out, err = _publish(warehouse, spec, capsys)
    assert rc == 2 and "exceed max_cells=100" in err
    assert files(out_root) == before and files(wh) == before_wh
    vrc, _, verr = _validate(warehouse, spec, capsys)
    assert vrc == 2 and verr == err


def test_an_access_refusal_leaves_nothing_but_its_audit_row(spark, warehouse, capsys, monkeypatch):
    spec = str(register(warehouse, "dau_daily").source)
    env, out_root, wh = _snapshot(warehouse)
    before, before_wh = files(out_root), not_ledger(wh)
    monkeypatch.setenv("DP_SPARK_PRINCIPAL", "analyst_alice")  # an analyst may not publish officially
    rc, out, err = _publish(warehouse, spec, capsys)
    assert rc == 2 and "may not publish:official" in err
    assert files(out_root) == before and not_ledger(wh) == before_wh
    eng = Engine(env, spark=spark, principal="analyst_alice")
    with pytest.raises(PermissionDeniedError):
        eng.publish(register(warehouse, "dau_daily"))
    assert files(out_root) == before and not_ledger(wh) == before_wh
    assert {a.decision for a in eng.ledger.audit_rows()} == {"refused_permission"}
    vrc, _, verr = _validate(warehouse, spec, capsys, "--principal", "analyst_alice")
    assert vrc == 2 and "may not publish:official" in verr


def test_a_column_missing_from_the_input_leaves_nothing(spark, warehouse, capsys):
    d = yaml.safe_load(AOV.read_text())
    d.update(name="aov_basket", family="aov_basket")
    d["value"] = dict(d["value"], column="order_valu")
    spec = _spec_file(warehouse, "aov_basket", d)
    env, out_root, wh = _snapshot(warehouse)
    before, before_wh = files(out_root), files(wh)
    rc, out, err = _publish(warehouse, spec, capsys)
    assert rc == 2
    assert "field 'value.column': column 'order_valu' is not in the input (did you mean 'order_value'?)" in err
    columns = spark.read.format("delta").load(env.datasets["demo_events"]).columns
    assert "the input's columns: " + ", ".join(columns) in err  # names only
    assert files(out_root) == before and files(wh) == before_wh
    # validate --with-data finds it, with the same message, before Spark reads a row
    vrc, vout, verr = _validate(warehouse, spec, capsys, "--with-data")
    assert vrc == 2 and "ok (" not in vout
    assert verr.split("dp-spark: error: ", 1)[1].strip() in err  # publish's message, word for word
    assert "field 'value.column': column 'order_valu' is not in the input" in verr
    # without --with-data validate says the columns were not checked
    vrc, vout, _ = _validate(warehouse, spec, capsys)
    assert vrc == 0 and "input columns: not checked" in vout
    # the engine refuses it the same way, before anything is created
    with pytest.raises(SchemaError, match="order_valu"):
        Engine(env, spark=spark, principal="publisher_bob").publish(register(warehouse, "aov_basket"))
    assert files(out_root) == before and files(wh) == before_wh


def test_a_where_column_missing_from_the_input_names_the_where(spark, warehouse, capsys):
    d = yaml.safe_load(ORDERS.read_text())
    d.update(name="orders_coupon", family="orders_coupon", where="coupon IS NULL",
             columns=["user_id", "day", "region", "order_value", "coupon"])
    spec = _spec_file(warehouse, "orders_coupon", d)
    env, out_root, wh = _snapshot(warehouse)
    before = files(wh)
    rc, out, err = _publish(warehouse, spec, capsys)
    assert rc == 2 and "field 'where': column 'coupon' is not in the input" in err
    vrc, _, verr = _validate(warehouse, spec, capsys, "--with-data")
    assert vrc == 2 and "field 'where': column 'coupon' is not in the input" in verr
    assert files(wh) == before


def test_an_exhausted_budget_leaves_no_table_salt_or_statement(spark, tmp_path, demo_input, capsys):
    env_file = write_env(tmp_path, policies=_capped(tmp_path, 0.3))
    shutil.copytree(demo_input, tmp_path / "wh" / "input" / "demo_events")
    dau = str(register(env_file, "dau_daily").source)
    aov = str(register(env_file, "aov_by_region").source)
    rc, out, err = _publish(env_file, dau, capsys)
    assert rc == 0, err
    env, out_root, wh = _snapshot(env_file)
    Engine(env, spark=spark, principal="publisher_bob").close()
    before, before_wh = files(out_root), not_ledger(wh)
    salt = env.salt_file.read_text()
    # validate refuses it first, with the message publish gives
    vrc, _, verr = _validate(env_file, aov, capsys, "--principal", "publisher_bob")
    assert vrc == 2 and "does not fit the remaining" in verr
    rc, out, err = _publish(env_file, aov, capsys)
    assert rc == 1 and "== aov_by_region: failed" in out
    message = verr.split(": error: ", 1)[1].strip()
    assert message in err, (message, err)
    assert not (out_root / "aov_by_region").exists()  # no empty table named like the release
    assert files(out_root) == before and not_ledger(wh) == before_wh
    assert env.salt_file.read_text() == salt
    # through the engine too
    eng = Engine(env, spark=spark, principal="publisher_bob")
    with pytest.raises(BudgetExceededError, match="does not fit the remaining"):
        eng.publish(register(env_file, "aov_by_region"))
    eng.close()
    assert files(out_root) == before and not_ledger(wh) == before_wh


def test_rollback_of_an_unknown_family_names_a_close_one(spark, warehouse, capsys, monkeypatch):
    from dp_spark.cli import rollback_main

    rc, out, err = _publish(warehouse, str(register(warehouse, "dau_daily").source), capsys)
    assert rc == 0, err
    monkeypatch.setenv("DP_SPARK_PRINCIPAL", "admin_carol")
    rc = rollback_main(["--env", str(warehouse), "--family", "dau_dialy", "--reason", "typo"])
    _, err = capsys.readouterr()
    assert rc == 2 and "no release of family 'dau_dialy'" in err and "(did you mean 'dau_daily'?)" in err
    assert "its families: dau_daily" in err
