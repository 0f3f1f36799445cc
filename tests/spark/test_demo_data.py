"""Spark tests of dp_spark.demo_data, jobs/generate_demo_data.py and dp_spark.spark."""

from __future__ import annotations

import importlib.util
from datetime import date
from pathlib import Path

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from dp_spark.demo_data import EVENT_SCHEMA, generate_events
from dp_spark.errors import ConfigError
from dp_spark.spark import delta_jar_paths, get_or_create_session, jars_dir

REPO = Path(__file__).resolve().parents[2]
SMALL = dict(n_users=2000, days=14, regions=20, seed=7, heavy_users=2, heavy_rows=10_000)


@pytest.fixture(scope="module")
def events(spark):
    df = generate_events(spark, **SMALL).cache()
    yield df
    df.unpersist()


def test_schema(events):
    assert [(f.name, f.dataType) for f in events.schema] == [(f.name, f.dataType) for f in EVENT_SCHEMA]
    assert events.columns == ["event_id", "user_id", "event_time", "day", "region", "order_value"]


def test_deterministic_from_seed_and_independent_of_partitioning(spark, events):
    small = dict(SMALL, n_users=100, heavy_rows=200)
    a = generate_events(spark, **small, partitions=1)
    b = generate_events(spark, **small, partitions=5)
    assert_df_equality(a, b, ignore_row_order=True, allow_nan_equality=True)
    c = generate_events(spark, **dict(small, seed=8))
    assert a.select("user_id", "day", "region").exceptAll(c.select("user_id", "day", "region")).count() > 0


def test_event_ids_unique_and_days_in_range(events):
    assert events.select("event_id").distinct().count() == events.count()
    r = events.agg(F.min("day"), F.max("day")).first()
    assert r[0] >= date(2026, 11, 1) and r[1] <= date(2026, 11, 14)
    # day is the UTC date of event_time
    assert events.where(F.to_date(F.col("event_time")) != F.col("day")).count() == 0


def test_zipf_skewed_activity_with_heavy_users(events):
    per_user = events.where(F.col("user_id").isNotNull()).groupBy("user_id").count()
    top = [r["count"] for r in per_user.orderBy(F.desc("count")).limit(3).collect()]
    assert top[0] == top[1] == 10_000 and top[2] < 10_000
    stats = per_user.agg(F.expr("percentile(count, 0.5)").alias("median"), F.avg("count").alias("mean")).first()
    assert stats["median"] < 12 and stats["mean"] > 15  # heavy tail: mean well above the median
    assert per_user.count() > 1900  # almost every user has at least one row


def test_regions_are_skewed_and_about_ten_percent_elsewhere(events):
    by_region = {r["region"]: r["count"] for r in events.groupBy("region").count().collect()}
    assert set(by_region) == {f"region_{i:02d}" for i in range(1, 21)}
    assert by_region["region_01"] > 10 * min(by_region.values())
    ordinary = events.where(F.col("user_id").isNotNull()).groupBy("user_id", "region").count()
    per_user = ordinary.groupBy("user_id").agg(F.sum("count").alias("n"), F.max("count").alias("home"))
    share = per_user.where("n >= 20").agg((F.sum(F.col("n") - F.col("home")) / F.sum("n"))).first()[0]
    assert 0.07 < share < 0.12  # 10% away, minus those landing in the home region again


def test_special_values_present(events):
    v = F.col("order_value")
    r = events.agg(
        F.sum(v.isNull().cast("int")).alias("null"),
        F.sum(F.isnan(v).cast("int")).alias("nan"),
        F.sum((v < 0).cast("int")).alias("neg"),
        F.sum((v == 1e9).cast("int")).alias("absurd"),
        F.sum(F.col("user_id").isNull().cast("int")).alias("null_user"),
        F.expr("percentile(order_value, 0.5)").alias("median"),
        F.count("*").alias("n"),
    ).first()
    assert r["null"] > 0 and r["nan"] > 0 and r["neg"] > 0 and r["absurd"] > 0 and r["null_user"] > 0
    assert r["null"] + r["nan"] + r["neg"] + r["absurd"] < 0.01 * r["n"]
    assert 35 < r["median"] < 45


def test_mean_rows_per_user_sets_the_activity_level(spark):
    def mean_rows(m):
        df = generate_events(spark, n_users=20_000, heavy_users=0, seed=5, mean_rows_per_user=m)
        return df.count() / 20_000

    # the Lomax tail (alpha 1.5) is capped at 5,000 rows, so the mean sits a little below
    ten, twenty = mean_rows(10), mean_rows(20)
    assert 8 < ten < 11 and 17 < twenty < 21
    with pytest.raises(ConfigError, match="mean_rows_per_user"):
        generate_events(spark, mean_rows_per_user=1)


def test_generate_events_validates_arguments(spark):
    with pytest.raises(ConfigError, match="n_users"):
        generate_events(spark, n_users=0)
    with pytest.raises(ConfigError, match="heavy_users"):
        generate_events(spark, n_users=2, heavy_users=3)
    with pytest.raises(ConfigError, match="days"):
        generate_events(spark, days=True)


def _load_job():
    spec = importlib.util.spec_from_file_location("generate_demo_data", REPO / "jobs" / "generate_demo_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_job_writes_a_delta_table(spark, tmp_path, capsys):
    out = str(tmp_path / "events")
    job = _load_job()
    args = ["--out", out, "--users", "100", "--rows-scale", "2", "--heavy-users", "1", "--heavy-rows", "300",
            "--days", "7"]
    assert job.main(args) == 0
    printed = capsys.readouterr().out
    table = spark.read.format("delta").load(out)
    assert f"rows={table.count()}" in printed and out in printed
    assert table.select("user_id").distinct().count() >= 190  # --rows-scale 2 doubles --users
    assert [(f.name, f.dataType) for f in table.schema] == [(f.name, f.dataType) for f in EVENT_SCHEMA]


# --------------------------------------------------------------------------- dp_spark.spark


def test_session_has_delta_and_utc(spark):
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert "DeltaSparkSessionExtension" in spark.conf.get("spark.sql.extensions")
    assert spark.conf.get("spark.sql.shuffle.partitions") == "4"


def test_column_expressions_do_not_record_their_call_site(spark):
    """pyspark's DataFrame debugging is off in the sessions the engine makes: a column
    expression is one or two py4j round trips, not a dozen (the call site recorded in the JVM
    before and after each F.col, F.lit or cast)."""
    import py4j.clientserver as cs
    from pyspark.sql import functions as F

    assert spark.conf.get("spark.python.sql.dataFrameDebugging.enabled") == "false"
    sent = []
    real = cs.ClientServerConnection.send_command

    def counting(self, command):
        sent.append(command)
        return real(self, command)

    F.col("x").cast("bigint")  # warm: the JVM classes resolved once
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cs.ClientServerConnection, "send_command", counting)
        F.col("x").cast("bigint") + F.lit(1)
    assert not [c for c in sent if "PySparkCurrentOrigin" in c] and len(sent) <= 12, sent


def test_active_session_is_returned_untouched(spark):
    before = spark.conf.get("spark.sql.shuffle.partitions")
    again = get_or_create_session("another-name", master="local[1]", extra_conf={"spark.sql.shuffle.partitions": "9"})
    assert again is spark
    assert spark.conf.get("spark.sql.shuffle.partitions") == before


def test_delta_jar_paths(monkeypatch, tmp_path):
    monkeypatch.delenv("DP_SPARK_JARS_DIR", raising=False)
    assert jars_dir() == REPO / ".jars"
    jars = delta_jar_paths()
    assert any(Path(j).name.startswith("delta-spark") for j in jars)
    assert all(Path(j).is_absolute() and j.endswith(".jar") for j in jars)

    monkeypatch.setenv("DP_SPARK_JARS_DIR", str(tmp_path))
    (tmp_path / "other.jar").write_bytes(b"")
    with pytest.raises(ConfigError, match="make jars"):
        delta_jar_paths()
    monkeypatch.setenv("DP_SPARK_JARS_DIR", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="make jars"):
        delta_jar_paths()
