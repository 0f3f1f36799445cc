"""Issue 13 (Trust), items 5 and 7.

5. ``dp-spark publish --conf A --conf B --conf C``: every spec is validated before the first
   charge; a spec failing at publish time does not hide or stop the others.
7. A release refused while being validated creates nothing: no release table, no salt file,
   no ledger file or row.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from pyspark.sql import functions as F

from dp_spark.core.budget import ZCDP
from dp_spark.config import load_env
from dp_spark.engine import Engine
from dp_spark.errors import ConfigError, SchemaError
from dp_spark.ledger import ReleaseLimitExceededError

from .conftest import ROOT, register, write_env

AOV = ROOT / "conf/releases/aov_by_region.yaml"
DAU = ROOT / "conf/releases/dau_daily.yaml"
ORDERS = ROOT / "conf/releases/orders_by_day_region.yaml"


def engine(spark, env_file, **kw):
    kw.setdefault("principal", "publisher_bob")
    return Engine(load_env(env_file), spark=spark, **kw)


def files(root: Path) -> set[str]:
    """Every file and folder under ``root`` (relative names)."""
    return {str(p.relative_to(root)) for p in Path(root).rglob("*")}


def _policies(tmp_path: Path, cap_rho: float) -> Path:
    src = yaml.safe_load((ROOT / "conf/policies/budgets.yaml").read_text())
    src["budgets"]["demo_events_user"]["cap"] = {"rho": cap_rho}
    src["budgets"]["demo_events_user"]["max_per_release"] = {"rho": cap_rho}
    p = tmp_path / "capped.yaml"
    p.write_text(yaml.safe_dump(src))
    return p


def _with_string_column(spark, env_file) -> None:
    """Give the env's input a string column ``coupon`` (metadata only: a new input version)."""
    path = load_env(env_file).datasets["demo_events"]
    spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS (coupon STRING)")


def _refusals(env_file):
    """(label, spec, expected error) for each refusal kind, single-metric and multi-statistic."""
    aov = yaml.safe_load(AOV.read_text())
    orders = yaml.safe_load(ORDERS.read_text())
    out = []
    d = dict(aov, name="aov_missing", family="aov_missing", value=dict(aov["value"], column="basket_value"))
    out.append(("missing column", register(env_file, "aov_missing", d), SchemaError))
    d = dict(aov, name="aov_string", family="aov_string", value=dict(aov["value"], column="coupon"))
    out.append(("string value column", register(env_file, "aov_string", d), SchemaError))
    d = yaml.safe_load(DAU.read_text())
    d.update(name="dau_greedy", family="dau_greedy")
    d["budget"] = dict(d["budget"], rho=1.5)  # the policy's max_per_release is rho 1.0
    out.append(("over the per-release maximum", register(env_file, "dau_greedy", d), ReleaseLimitExceededError))
    stats = [dict(s, column="basket_value") if "column" in s else s for s in orders["statistics"]]
    d = dict(orders, name="orders_missing", family="orders_missing", statistics=stats, where="region <> 'test'")
    out.append(("multi-statistic missing column", register(env_file, "orders_missing", d), SchemaError))
    stats = [dict(s, column="coupon") if "column" in s else s for s in orders["statistics"]]
    d = dict(orders, name="orders_string", family="orders_string", statistics=stats,
             where="region <> 'test'")
    out.append(("multi-statistic string value column", register(env_file, "orders_string", d), SchemaError))
    d = dict(orders, name="orders_greedy", family="orders_greedy",
             budget={"id": "demo_events_user", "measure": "zcdp", "rho": 1.25})
    out.append(("multi-statistic over the per-release maximum", register(env_file, "orders_greedy", d),
                ReleaseLimitExceededError))
    return out


# --------------------------------------------------------------------------------------
# item 7: a refusal leaves the warehouse exactly as it was
# --------------------------------------------------------------------------------------
def test_refusals_on_a_fresh_warehouse_create_nothing(spark, warehouse):
    _with_string_column(spark, warehouse)
    env = load_env(warehouse)
    wh = Path(env.warehouse)
    before = files(wh)
    assert not env.salt_file.exists() and not (wh / "ledger.db").exists()
    for label, spec, error in _refusals(warehouse):
        eng = engine(spark, warehouse)
        with pytest.raises(error):
            eng.publish(spec)
        assert files(wh) == before, label  # no release table, no salt, no ledger file
        assert eng._ledger is None, label  # the ledger was never opened


def test_refusals_on_a_used_warehouse_add_no_table_salt_or_ledger_row(spark, warehouse):
    _with_string_column(spark, warehouse)
    env = load_env(warehouse)
    wh = Path(env.warehouse)
    first = engine(spark, warehouse)
    first.publish(register(warehouse, "dau_daily"))
    first.close()  # its ledger mirror, refreshed in the background, is written too
    salt = env.salt_file.read_text()
    before = files(wh)
    entries, audit = first.ledger.entries(), first.ledger.audit_rows()
    budgets = first.ledger.budget_ids()
    for label, spec, error in _refusals(warehouse):
        eng = engine(spark, warehouse)
        with pytest.raises(error):
            eng.publish(spec)
        assert files(wh) == before, label
        assert eng.ledger.entries() == entries and eng.ledger.audit_rows() == audit, label
        assert eng.ledger.budget_ids() == budgets, label
    assert env.salt_file.read_text() == salt


def test_a_valid_release_after_a_refusal_creates_salt_table_and_ledger(spark, warehouse):
    env = load_env(warehouse)
    eng = engine(spark, warehouse)
    greedy = [s for label, s, _ in _refusals(warehouse) if label == "over the per-release maximum"][0]
    with pytest.raises(ReleaseLimitExceededError):
        eng.publish(greedy)
    # validated with a provisional salt, published with the real one: a rerun is a cache hit
    for spec in (register(warehouse, "dau_daily"), register(warehouse, "orders_by_day_region")):
        r = eng.publish(spec)
        assert r.status == "published"
        again = engine(spark, warehouse).publish(spec)
        assert again.status == "cache_hit" and again.release_id == r.release_id
    assert env.salt_file.exists() and Path(env.ledger_url[len("sqlite:"):]).exists()
    assert [e.release_family for e in eng.ledger.entries()] == ["dau_daily", "orders_by_day_region"]


# --------------------------------------------------------------------------------------
# item 5: the CLI validates all specs first, then reports every spec's outcome
# --------------------------------------------------------------------------------------
def _three_specs(env_file):
    """A = dau_daily (rho 0.25), B = aov_by_region (0.25), C = aov_all_regions (0.05)."""
    coarse = yaml.safe_load(AOV.read_text())
    coarse.update(name="aov_all_regions", family="aov_all_regions", group_by=None)
    coarse["bounds"] = {"max_rows_per_unit": 10, "max_partitions_per_unit": 1}
    coarse["budget"] = {"id": "demo_events_user", "measure": "zcdp", "rho": 0.05}
    register(env_file, "aov_all_regions", coarse)
    rel = Path(env_file).parents[1] / "releases"
    return [str(rel / f"{n}.yaml") for n in ("dau_daily", "aov_by_region", "aov_all_regions")]


def test_cli_a_spec_failing_at_publish_time_hides_and_stops_nothing(spark, tmp_path, demo_input, capsys,
                                                                       monkeypatch):
    from dp_spark.cli import publish_main

    monkeypatch.setenv("DP_SPARK_PRINCIPAL", "publisher_bob")
    env_file = write_env(tmp_path, policies=_policies(tmp_path, 0.3))
    shutil.copytree(demo_input, tmp_path / "wh" / "input" / "demo_events")
    a, b, c = _three_specs(env_file)
    # A charges 0.25 of 0.3; B (0.25) no longer fits when it is published; C (0.05) does
    rc = publish_main(["--env", str(env_file), "--conf", a, "--conf", b, "--conf", c, "--quiet"])
    assert rc == 1
    out, err = capsys.readouterr()
    assert "== dau_daily: published" in out and "== aov_all_regions: published" in out
    assert "== aov_by_region: failed" in out and "does not fit the remaining" in out
    assert out.index("dau_daily") < out.index("aov_by_region") < out.index("aov_all_regions")
    failed = out[out.index("== aov_by_region"):out.index("== aov_all_regions")]
    assert "mean" not in failed and "[" not in failed.split("error:")[0]  # no cells of B are shown
    assert "aov_by_region" in err and "1 of 3 specs failed" in err
    env = load_env(env_file)
    eng = engine(spark, env_file)
    assert [e.release_family for e in eng.ledger.entries()] == ["dau_daily", "aov_all_regions"]
    assert eng.ledger.status("demo_events_user").spent == ZCDP("0.3")
    decisions = [a.decision for a in eng.ledger.audit_rows()]
    assert decisions == ["published", "refused_budget", "published"]
    # finish() ran for what succeeded: both are versioned and have a statement
    published = spark.read.format("delta").load(f"{env.output_root}/_published")
    assert sorted(r["family"] for r in published.where(F.col("state") == "current").collect()) == \
        ["aov_all_regions", "dau_daily"]
    statements = Path(env.warehouse) / "statements"
    assert (statements / "dau_daily.md").exists() and (statements / "aov_all_regions.md").exists()
    # rerun: A and C are cache hits, B still fails
    rc = publish_main(["--env", str(env_file), "--conf", a, "--conf", b, "--conf", c, "--quiet"])
    out, _ = capsys.readouterr()
    assert rc == 1 and out.count(": cache_hit") == 2 and "== aov_by_region: failed" in out


@pytest.mark.parametrize("bad", ["unknown_budget", "bad_field", "missing_column"])
def test_cli_a_spec_invalid_up_front_charges_nothing(spark, warehouse, capsys, monkeypatch, bad):
    from dp_spark.cli import publish_main

    monkeypatch.setenv("DP_SPARK_PRINCIPAL", "publisher_bob")
    a, _, c = _three_specs(warehouse)
    d = yaml.safe_load(AOV.read_text())
    d.update(name="aov_bad", family="aov_bad")
    if bad == "unknown_budget":
        d["budget"] = dict(d["budget"], id="no_such_budget")
    elif bad == "bad_field":
        d["bounds"] = dict(d["bounds"], max_rows_per_unit="ten")
    else:
        d["value"] = dict(d["value"], column="basket_value")
    b = Path(warehouse).parents[1] / "releases" / "aov_bad.yaml"
    b.write_text(yaml.safe_dump(d, sort_keys=False))
    wh = Path(load_env(warehouse).warehouse)
    before = files(wh)
    rc = publish_main(["--env", str(warehouse), "--conf", a, "--conf", str(b), "--conf", c, "--quiet"])
    assert rc == 2
    out, err = capsys.readouterr()
    assert "published" not in out and "dp-spark: error" in err
    assert "nothing was published" in err or bad == "bad_field"
    assert files(wh) == before  # nothing charged, no table, no salt, no ledger


def test_engine_validate_then_publish_uses_the_validated_snapshot(spark, warehouse):
    eng = engine(spark, warehouse)
    spec = register(warehouse, "dau_daily")
    v = eng.validate(spec)
    path = load_env(warehouse).datasets["demo_events"]
    spark.read.format("delta").load(path).limit(5).write.format("delta").mode("append").save(path)
    r = eng.publish(spec, validated=v)
    assert r.release_id == v.release_id and {row["input_version"] for row in r.rows} == {v.snapshot.version}
    with pytest.raises(ConfigError, match="another spec"):
        eng.publish(register(warehouse, "aov_by_region"), validated=v)
