"""The main job over Spark Connect (``.ci/connect.sh``: a local Spark Connect server on
loopback with Delta): the engine runs unchanged on a remote session, noise is drawn in the
client process, and nothing on the hot path needs an RDD, a SparkContext or the JVM.

The client runs in a subprocess (a classic session lives in this pytest process; pyspark
switches a whole process to Connect mode once a remote session is built). It traces every
access to the classic-only attributes of the Connect session and DataFrames and reports
where in dp_spark they come from.
"""

from __future__ import annotations

import json
import sys

from pyspark.sql import functions as F

from dp_spark.config import load_env
from dp_spark.engine import read_or_create_salt, release_id_for
from dp_spark.ledger import open_ledger
from dp_spark.delta.release_table import pin_snapshot
from dp_spark.schedule import day_spec

from .conftest import BUDGET, PRINCIPAL, ROOT, START, child_env, env_spec, run_bounded, spec_path

CLIENT_TIMEOUT = 600

# Guarded fallbacks still in the code: each catches the Connect error and carries on (the
# principal from SQL current_user()). Listed in docs/deploy.md; remove an entry once fixed.
ALLOWED_CLASSIC_ACCESS = {
    ("dp_spark/governance/access.py", "resolve_principal_with_source", "sparkContext"),
}

CLIENT = r'''
"""Spark Connect client: the main job, a daily refresh, a rerun; traces classic-only API use."""
import json, os, sys, traceback
from datetime import date

root, url, env_file, spec_file, day, out = sys.argv[1:]
sys.path.insert(0, root)
from dp_spark.spark import get_or_create_session

spark = get_or_create_session("dp_spark-connect-test", master=url)  # an sc:// master: Connect
from pyspark.sql.connect.dataframe import DataFrame as ConnectDataFrame
from pyspark.sql.connect.session import SparkSession as ConnectSession

assert isinstance(spark, ConnectSession), type(spark)
CLASSIC_ONLY = {"sparkContext", "_sc", "_jsc", "_jvm", "_jsparkSession", "_jdf", "rdd", "sql_ctx", "_jconf"}
touches = []

def tracing(cls):
    real = cls.__getattribute__
    def __getattribute__(self, name):
        if name in CLASSIC_ONLY:
            for fr in reversed(traceback.extract_stack()[:-1]):
                f = fr.filename.replace(os.sep, "/")
                if "/dp_spark/" in f:
                    touches.append([f[f.rindex("/dp_spark/") + 1:], fr.name, name])
                    break
        return real(self, name)
    cls.__getattribute__ = __getattribute__

tracing(ConnectSession)
tracing(ConnectDataFrame)

from dp_spark.config import load_env, load_release_spec
from dp_spark.engine import Engine
from dp_spark.schedule import daily_refresh
from pyspark.sql import functions as F

from dp_spark.statistics.plan import QueryPlan
draws = {"noise": 0}
real_noise = QueryPlan.noise_columns
def counting_noise(*a, **k):  # noise is drawn here, in the client (driver) process
    draws["noise"] += 1
    return real_noise(*a, **k)
QueryPlan.noise_columns = counting_noise

env, spec = load_env(env_file), load_release_spec(spec_file)
first = Engine(env, spark=spark, principal=os.environ["DP_SPARK_PRINCIPAL"]).publish(spec)
again = Engine(env, spark=spark, principal=os.environ["DP_SPARK_PRINCIPAL"]).publish(spec)
eng = Engine(env, spark=spark, principal=os.environ["DP_SPARK_PRINCIPAL"])
d1 = daily_refresh(eng, spec, date.fromisoformat(day))
d2 = daily_refresh(eng, spec, date.fromisoformat(day))
read_back = (spark.read.format("delta").load(first.table_path)
             .where(F.col("release_id") == first.release_id).count())
result = {
    "session": type(spark).__module__,
    "first": [first.status, first.release_id, str(first.charge), len(first.rows)],
    "again": [again.status, again.release_id, str(again.charge), len(again.rows)],
    "day": [d1.status, d1.release_id, str(d1.charge), [c["key"] for c in d1.rows]],
    "day_again": [d2.status, d2.release_id, str(d2.charge)],
    "read_back": read_back,
    "noise_calls": draws["noise"],
    "touches": sorted({tuple(t) for t in touches}),
}
with open(out, "w") as f:
    json.dump(result, f)
spark.stop()
'''


def test_main_job_over_spark_connect(connect_url, spark, deploy_env, tmp_path):
    url = connect_url
    env = load_env(deploy_env)
    spec = env_spec(deploy_env, "dau_daily")
    read_or_create_salt(env.salt_file)
    snap = pin_snapshot(spark, env.dataset_location(spec.dataset))
    expected = release_id_for(spec, snap.table_id, snap.version, "official")
    day = START.replace(day=3)
    expected_day = release_id_for(day_spec(spec, day), snap.table_id, snap.version, "official")

    client = tmp_path / "connect_client.py"
    client.write_text(CLIENT)
    out = tmp_path / "connect_result.json"
    run = run_bounded([sys.executable, str(client), str(ROOT), url, str(deploy_env),
                       str(spec_path(deploy_env, "dau_daily")), day.isoformat(), str(out)],
                      timeout=CLIENT_TIMEOUT, env=child_env(), cwd=tmp_path)
    assert run.returncode == 0, run.explain()
    res = json.loads(out.read_text())

    assert res["session"].startswith("pyspark.sql.connect")
    assert res["first"] == ["published", expected, "zcdp(rho=0.25)", 30]
    assert res["again"] == ["cache_hit", expected, "None", 30]  # rerun: no charge, same cells
    assert res["day"] == ["published", expected_day, "zcdp(rho=0.25)", [day.isoformat()]]
    assert res["day_again"] == ["cache_hit", expected_day, "None"]
    assert res["read_back"] == 30
    assert res["noise_calls"] == 2  # two new releases, noise drawn in the client process
    unexpected = [t for t in map(tuple, res["touches"]) if t not in ALLOWED_CLASSIC_ACCESS]
    assert not unexpected, f"classic-only Spark API used on the Connect path: {unexpected}"

    # the Delta output and the ledger, read back by this (classic, local) process
    t = spark.read.format("delta").load(f"{env.output_root}/dau_daily")
    assert t.where(F.col("release_id") == expected).count() == 30
    assert t.where(F.col("release_id") == expected_day).select("key").collect()[0]["key"] == day.isoformat()
    with open_ledger(env.ledger_url) as ledger:
        entries = ledger.entries(BUDGET)
        assert sorted((e.release_id, e.state) for e in entries) == sorted(
            [(expected, "committed"), (expected_day, "committed")])
        assert {e.principal for e in entries} == {PRINCIPAL}
    # the Delta mirror of the ledger was refreshed over Connect too
    assert spark.read.format("delta").load(env.ledger_mirror).where(F.col("state") == "committed").count() == 2
