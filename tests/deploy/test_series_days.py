"""A family keyed by day, refreshed a day at a time for 30 days and re-published for one day,
reads as a series everywhere: the ledger keeps the 30 days current (one superseded version:
the re-published day's old one), ``<family>_current`` (its Delta path and its catalog view)
holds exactly 30 rows per statistic with the newer value, the statement lists the days,
``dp-spark show`` prints them, and a day's rollback restores that day only."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import yaml
from pyspark.sql import functions as F

from dp_spark import commands
from dp_spark.config import load_env
from dp_spark.governance import statement_dir
from dp_spark.governance.versions import series_current_path

from .conftest import START, local_engine, spec_path

pytestmark = pytest.mark.spark

D = [START + timedelta(days=i) for i in range(30)]
FAMILY = "dau_rolling"  # conf/releases/dau_rolling.yaml: one distinct-user count per day
VIEW = f"default.{FAMILY}_current"


def _values(df) -> dict[tuple[str, str], float]:
    return {(r["key"], r["statistic"]): r["value"] for r in df.select("key", "statistic", "value").collect()}


def test_thirty_days_refreshed_one_by_one_and_one_republished_read_as_a_series(spark, deploy_env, monkeypatch):
    env_yaml = yaml.safe_load(deploy_env.read_text())
    deploy_env.write_text(yaml.safe_dump({**env_yaml, "series_schema": "default"}))
    env = load_env(deploy_env)
    spec = str(spec_path(deploy_env, FAMILY))
    current = series_current_path(env.output_root, FAMILY)
    spark.sql(f"DROP VIEW IF EXISTS {VIEW}")
    try:
        eng = local_engine(spark, deploy_env, refresh="deferred")
        # a backfill publishes days 1..29 one release a day, then the nightly refresh of day 30
        assert [r.status for r in commands.refresh(env, [spec], D[0], D[28], engine=eng)] == ["published"] * 29
        assert [r.status for r in commands.refresh(env, [spec], D[29], D[29], engine=eng)] == ["published"]
        before = _values(spark.read.format("delta").load(current))

        # one row of day 5 changes; its re-publication (asked for) replaces that day only
        path = env.datasets["demo_events"]
        ev = (spark.read.format("delta").load(path).where(F.col("day") == F.lit(D[4]))
              .orderBy("event_id").first()["event_id"])
        spark.sql(f"UPDATE delta.`{path}` SET user_id = 'u_new_user' WHERE event_id = {ev}")
        eng = local_engine(spark, deploy_env, refresh="deferred")
        rep = commands.refresh(env, [spec], D[4], D[4], republish=True, engine=eng)
        assert [r.status for r in rep] == ["republished"]
        new_rows = {r["statistic"]: r["value"] for r in rep[0].rows}

        # the ledger: 30 days current, exactly one superseded version (day 5's first)
        versions = eng.ledger.versions(FAMILY)
        live = [v for v in versions if v.state == "current"]
        assert len(versions) == 31 and sorted(v.series_key for v in live) == [d.isoformat() for d in D]
        old = [v for v in versions if v.state == "superseded"]
        assert [(v.series_key, v.release_id) for v in old] == [(D[4].isoformat(), rep[0].published_release_id)]
        assert {v.release_id for v in live if v.series_key == D[4].isoformat()} == {rep[0].release_id}
        eng.ledger.verify()

        # <family>_current: 30 rows per statistic, day 5's newer value among them
        for df in (spark.read.format("delta").load(current), spark.table(VIEW)):
            counts = {r["statistic"]: r["count"] for r in df.groupBy("statistic").count().collect()}
            assert counts and set(counts.values()) == {30}
            got = _values(df)
            assert {k for k, _ in got} == {d.isoformat() for d in D}
            for stat, value in new_rows.items():
                assert got[(D[4].isoformat(), stat)] == value
            assert all(got[k] == before[k] for k in got if k[0] != D[4].isoformat())
        # dp-spark show --family prints the series (no --series needed)
        shown = commands.show_family(env, FAMILY)
        assert len(shown) == len(before) and {(r["key"], r["statistic"]): r["value"] for r in shown} == _values(
            spark.table(VIEW))

        # the statement lists days, each with its release and state, not the superseded versions
        st = json.loads((statement_dir(env) / f"{FAMILY}.json").read_text())
        assert st["consistency"]["ok"], st["consistency"]
        days = {x["day"]: x for x in st["days"]}
        assert sorted(days) == [d.isoformat() for d in D] and {x["state"] for x in days.values()} == {"current"}
        assert days[D[4].isoformat()]["release_id"] == rep[0].release_id and days[D[4].isoformat()]["superseded"] == 1
        md = (statement_dir(env) / f"{FAMILY}.md").read_text()
        assert "30 day(s) published" in md and "## Versions" not in md
        table = md.split("## Days", 1)[1].split("\n## ", 1)[0]
        assert sum(1 for line in table.splitlines() if line.startswith("| 2026-11-")) == 30
        assert rep[0].release_id[:16] in table and rep[0].published_release_id[:16] not in table
        assert "1 replaced" in table and "superseded" not in table

        # a rollback of day 5 (admin) restores its first value, every other day untouched
        monkeypatch.setenv("DP_SPARK_PRINCIPAL", "admin_carol")
        withdrawn, restored = commands.rollback(env, FAMILY, "wrong input", day=D[4].isoformat())
        assert (withdrawn, restored) == (rep[0].release_id, rep[0].published_release_id)
        assert _values(spark.read.format("delta").load(current)) == before == _values(spark.table(VIEW))
    finally:
        spark.sql(f"DROP VIEW IF EXISTS {VIEW}")
