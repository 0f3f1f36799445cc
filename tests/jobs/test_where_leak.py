"""The audit's `where` probes on neighbouring inputs, end to end (issue 25 items 1-2,
RELIABILITY 23): the outcome does not depend on the victim's row, and a failure after the
charge says nothing about the data (release id, stage, exception class only)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from dp_spark.config import load_env
from dp_spark.engine import Engine
from dp_spark.errors import ConfigError, ReleaseFailedError

from .conftest import ROOT, register, write_env

VICTIM = "victim-7731"
VICTIM_VALUE = 98765.4321

POLICIES = {"version": 1, "budgets": {"shop_user": {
    "description": "test shop", "dataset": "shop", "privacy_unit": "user", "measure": "zcdp",
    "cap": {"rho": 10.0}, "statement_delta": 1.0e-7, "window": "none", "max_per_release": {"rho": 1.0}}}}


def spec_dict(where: str, name: str = "shop_counts") -> dict:
    return {
        "name": name, "family": name, "description": "where probe", "dataset": "shop",
        "privacy_unit": {"kind": "user", "column": "user_id"}, "neighbouring": "add_remove_unit",
        "columns": ["user_id", "region", "coupon", "n", "order_value"], "where": where,
        "group_by": [{"column": "region", "public_keys": {"values": ["a", "b"]}}],
        "bounds": {"max_rows_per_unit": 2, "max_partitions_per_unit": 1, "max_rows_per_partition": 2},
        "statistics": [{"name": "users", "kind": "distinct_units"},
                       {"name": "revenue", "kind": "sum", "column": "order_value", "lower": 0, "upper": 100}],
        "budget": {"id": "shop_user", "measure": "zcdp", "rho": 0.1},
    }


def shop(base: Path, spark, *, victim: bool) -> Path:
    """A warehouse whose `shop` dataset holds 40 users, plus the victim's row when asked."""
    base.mkdir(parents=True, exist_ok=True)
    pol = base / "policies.yaml"
    pol.write_text(yaml.safe_dump(POLICIES))
    env_file = write_env(base, policies=pol, extra_datasets={"shop": "{warehouse}/input/shop"})
    rows = [(f"u{i}", "ab"[i % 2], str(5 + i % 3), i % 4 + 1, float(i % 50)) for i in range(40)]
    if victim:  # a string a cast cannot read, a zero divisor, a value that identifies the row
        rows.append((VICTIM, "a", "abc", 0, VICTIM_VALUE))
    df = spark.createDataFrame(rows, "user_id string, region string, coupon string, n int, order_value double")
    df.write.format("delta").save(str(base / "wh" / "input" / "shop"))
    return env_file


def engine(spark, env_file):
    return Engine(load_env(env_file), spark=spark, principal="publisher_bob")


@pytest.mark.parametrize("where", [
    "raise_error(concat('leak ', user_id, ' ', order_value)) IS NULL",
    "cast(coupon AS INT) = 5",
    "order_value / n > 1",
    "element_at(array(1, 2), n) = 1",
])
def test_the_audit_probes_are_refused_before_anything_is_read_or_charged(spark, tmp_path, where):
    env_file = shop(tmp_path, spark, victim=True)
    with pytest.raises(ConfigError) as exc:
        register(env_file, "shop_counts", spec_dict(where))
    assert VICTIM not in str(exc.value) and "leak" not in str(exc.value)
    assert not (tmp_path / "wh" / "ledger.db").exists()


NATURAL = "coupon = 5 OR try_divide(order_value, n) > 40 OR try_cast(coupon AS INT) = 7"


def test_natural_failing_forms_evaluate_alike_on_neighbouring_inputs(spark, tmp_path):
    """`coupon = 5` casts the string implicitly (ANSI mode raises on 'abc'), with a zero divisor
    and a try_cast beside it: both neighbours publish, the same cells, one charge each."""
    results = []
    for victim in (False, True):
        env_file = shop(tmp_path / str(victim), spark, victim=victim)
        eng = engine(spark, env_file)
        r = eng.publish(register(env_file, "shop_counts", spec_dict(NATURAL)))
        eng.close()
        results.append(r)
    assert [r.status for r in results] == ["published", "published"]
    assert [sorted((c["statistic"], c["key"]) for c in r.rows) for r in results][0] == \
        [sorted((c["statistic"], c["key"]) for c in r.rows) for r in results][1]


def test_without_total_evaluation_the_victim_decides_and_the_failure_text_is_withheld(spark, tmp_path,
                                                                                     monkeypatch):
    """The control (the test above can fail): with the where evaluated under ANSI mode, the
    victim's row makes the release fail after its charge; the error, the audit row and the
    ledger say which stage and which exception class, never the row."""
    import contextlib

    from dp_spark.backends import spark as query

    if spark.conf.get("spark.sql.ansi.enabled") != "true":
        pytest.skip("the control needs the session's default ANSI mode (on in Spark 4)")
    monkeypatch.setattr(query, "total_where", lambda spark, active=True: contextlib.nullcontext())
    env_file = shop(tmp_path, spark, victim=True)
    eng = engine(spark, env_file)
    spec = register(env_file, "shop_counts", spec_dict(NATURAL))
    with pytest.raises(ReleaseFailedError) as exc:
        eng.publish(spec)
    err = exc.value
    assert err.__cause__ is None and err.__context__ is None
    assert err.stage == "bounding+aggregation" and err.exception_class
    assert "abc" not in str(err) and VICTIM not in str(err) and "CAST" not in str(err)
    entries = eng.ledger.entries("shop_user")
    assert len(entries) == 1 and entries[0].state == "reserved"  # the charge stays spent
    audit = [a for a in eng.ledger.audit_rows() if a.decision == "failed"]
    assert len(audit) == 1 and "abc" not in audit[0].detail and err.exception_class in audit[0].detail
    eng.close()


DRIVER = textwrap.dedent("""
    import sys
    from pyspark.sql import functions as F, types as T
    from dp_spark.config import load_env, load_release_spec
    from dp_spark.engine import Engine
    from dp_spark.spark import get_or_create_session
    from dp_spark.backends import spark as query

    env_file, spec_file, victim = sys.argv[1:4]
    spark = get_or_create_session("leak-probe", master="local[2]")

    @F.udf(T.BooleanType())
    def probe(user_id, value):
        if user_id == victim:
            raise ValueError(f"leak {user_id} {value}")
        return True

    real = query.drop_null_units
    def injected(df, *, unit_col):  # a failing UDF on the data path, after the charge
        return real(df, unit_col=unit_col).where(probe(F.col("user_id"), F.col("order_value")))
    query.drop_null_units = injected

    env = load_env(env_file)
    eng = Engine(env, spark=spark, principal="publisher_bob")
    try:
        eng.publish(load_release_spec(spec_file))
        print("PUBLISHED")
    except Exception as exc:
        print("FAILED", type(exc).__name__, exc)
    eng.close()
    for path in (env.ledger_mirror, env.audit_mirror):
        try:
            for row in spark.read.format("delta").load(path).collect():
                print("MIRROR", row)
        except Exception as exc:
            print("NO MIRROR", type(exc).__name__)
""")


def test_a_failing_udf_after_the_charge_leaves_its_text_nowhere(spark, tmp_path):
    env_file = shop(tmp_path, spark, victim=True)
    spec_file = Path(env_file).parents[1] / "releases" / "shop_counts.yaml"
    spec_file.write_text(yaml.safe_dump(spec_dict("n >= 0"), sort_keys=False))
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(driver), str(env_file), str(spec_file), VICTIM],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    out = proc.stdout + proc.stderr
    assert "FAILED ReleaseFailedError" in proc.stdout, out[-3000:]
    assert "MIRROR" in proc.stdout  # the ledger and audit mirrors were read back
    for secret in (VICTIM, str(VICTIM_VALUE), "leak "):
        assert secret not in out, f"{secret!r} printed:\n" + "\n".join(
            line for line in out.splitlines() if secret in line)[:3000]
    # nor in any file the run left: ledger, Delta tables and their logs, Spark's files
    for f in tmp_path.rglob("*"):
        if f.is_file() and "input" not in f.parts and f.name != "driver.py":
            data = f.read_bytes()
            assert VICTIM.encode() not in data and b"leak " not in data, f
