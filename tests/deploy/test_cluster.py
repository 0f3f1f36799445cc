"""The publish job on a real Spark standalone cluster (``.ci/cluster.sh``: a master and one
worker on loopback, from the installed pyspark distribution), submitted with spark-submit.

The comparison with local mode: a second run of the same release on the same input would be a
cache hit by design (same release id), so the cluster run goes to a fresh ledger and is
compared with what the local engine *plans* for the same spec and input: the same release id
(``release_id_for``), the same charge, one committed ledger entry -- and the same exact
partials: a probe job submitted to the cluster computes ``build_partials`` +
``collect_query_partials`` with the same salt file, and they must equal the local-mode partials
(bounding by keyed priorities does not depend on the partition layout). The noisy cells read
back must be consistent with those partials.
"""

from __future__ import annotations

import json
import math
import sys
import urllib.request
import uuid
from pathlib import Path

from pyspark.sql import functions as F

from dp_spark.backends.spark import build_query_partials, collect_query_partials
from dp_spark.core.budget import ZCDP
from dp_spark.config import load_env
from dp_spark.engine import plan_for, read_or_create_salt, release_id_for
from dp_spark.ledger import open_ledger
from dp_spark.delta.release_table import pin_snapshot

from .conftest import BUDGET, ROOT, child_env, delta_jars, env_spec, run_bounded, spark_home, spec_path

SUBMIT_TIMEOUT = 600  # seconds, per spark-submit (one executor core on a shared 2-core machine)

PROBE = r'''
"""Cluster probe: the exact partials of a spec at a pinned input version (test data only)."""
import json, sys
sys.path.insert(0, sys.argv[1])
from dp_spark.backends.spark import build_query_partials, collect_query_partials
from dp_spark.config import load_env, load_release_spec
from dp_spark.engine import plan_for, read_or_create_salt
from dp_spark.delta.release_table import Snapshot
from dp_spark.spark import get_or_create_session

_, root, env_file, spec_file, table_id, version, out = sys.argv
env, spec = load_env(env_file), load_release_spec(spec_file)
spark = get_or_create_session("dp_spark-cluster-probe")
snap = Snapshot(location=env.dataset_location(spec.dataset), table_id=table_id, version=int(version))
plan = plan_for(spec)
got = collect_query_partials(build_query_partials(snap.reader(spark), plan, read_or_create_salt(env.salt_file)), plan)
parts = {k: {"units": got.get(i, {}).get("dp_units", 0)} for i, k in enumerate(spec.keys)}
master = spark.conf.get("spark.master")
with open(out, "w") as f:
    json.dump({"master": master, "partials": parts}, f)
spark.stop()
'''


def submit(master: str, app: str, script: Path, args: list[str]):
    cmd = [
        str(spark_home() / "bin" / "spark-submit"),
        "--master", master,
        "--deploy-mode", "client",
        "--name", app,
        "--jars", delta_jars(),
        "--conf", f"spark.pyspark.python={sys.executable}",
        "--conf", f"spark.pyspark.driver.python={sys.executable}",
        "--conf", "spark.executor.memory=768m",
        "--conf", "spark.cores.max=1",
        "--conf", "spark.sql.shuffle.partitions=4",
        "--conf", "spark.databricks.delta.snapshotPartitions=2",
        "--conf", "spark.driver.host=127.0.0.1",
        "--conf", "spark.driver.bindAddress=127.0.0.1",
        "--conf", "spark.ui.enabled=false",
        "--conf", "spark.log.level=WARN",
        str(script), *args,
    ]
    return run_bounded(cmd, timeout=SUBMIT_TIMEOUT, env=child_env())


def _apps(ui: str) -> list[dict]:
    with urllib.request.urlopen(f"{ui.rstrip('/')}/json/", timeout=10) as r:
        d = json.load(r)
    return list(d.get("completedapps", [])) + list(d.get("activeapps", []))


def test_publish_job_on_standalone_cluster_matches_local_plan(standalone_master, spark, deploy_env, tmp_path):
    master = standalone_master
    env = load_env(deploy_env)
    spec = env_spec(deploy_env, "dau_daily")
    conf = spec_path(deploy_env, "dau_daily")
    salt = read_or_create_salt(env.salt_file)  # the cluster job reads the same salt file

    # what the local engine plans for this spec and input (no data values leave this test)
    snap = pin_snapshot(spark, env.dataset_location(spec.dataset))
    expected_id = release_id_for(spec, snap.table_id, snap.version, "official")
    plan = plan_for(spec)
    got_local = collect_query_partials(build_query_partials(snap.reader(spark), plan, salt), plan)
    local = {k: {"units": got_local.get(i, {}).get("dp_units", 0)} for i, k in enumerate(spec.keys)}

    app = f"dp_spark-cluster-test-{uuid.uuid4().hex[:8]}"
    run = submit(master, app, ROOT / "jobs" / "publish_release.py", ["--env", str(deploy_env), "--conf", str(conf)])
    assert run.returncode == 0, run.explain()
    assert "dau_daily: published (30 cells (30 keys x 1 statistic: distinct_units))" in run.stdout, run.explain()
    assert expected_id in run.stdout
    log = run.stdout + run.stderr
    for stage in ("bounding+aggregation", "noise", "write"):  # progress: a log line per stage
        assert f"stage {stage}" in log and f"stage {stage} done" in log, run.explain()

    ui = __import__("os").environ.get("DP_SPARK_TEST_MASTER_UI")
    if ui:  # it really ran as an application of the standalone master
        apps = [a for a in _apps(ui) if a.get("name") in (app, "dp_spark")]
        assert apps and apps[-1]["cores"] >= 1, apps

    # the Delta output, read back by the local session
    rows = (spark.read.format("delta").load(f"{env.output_root}/dau_daily")
            .where(F.col("release_id") == expected_id).collect())
    assert sorted(r["key"] for r in rows) == list(spec.keys)
    for r in rows:
        assert r["statistic"] == "distinct_units" and r["charge_rho"] == 0.25
        assert r["input_table_id"] == snap.table_id and r["input_version"] == snap.version
        assert r["privacy_unit"] == "user" and r["mechanism"] == "discrete_gaussian"
        assert float(r["value"]).is_integer() and r["ci_low"] <= r["value"] <= r["ci_high"]

    # the ledger the cluster job wrote: one committed entry, the planned id and charge
    with open_ledger(env.ledger_url) as ledger:
        entries = ledger.entries(BUDGET)
        assert [(e.release_id, e.state, e.charge) for e in entries] == [(expected_id, "committed", spec.charge)]
        assert spec.charge == ZCDP("0.25") and ledger.status(BUDGET).spent == spec.charge

    # the same exact partials on the cluster (probe job, same salt file, same pinned version)
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    out = tmp_path / "cluster_partials.json"
    prun = submit(master, app + "-probe", probe,
                  [str(ROOT), str(deploy_env), str(conf), snap.table_id, str(snap.version), str(out)])
    assert prun.returncode == 0, prun.explain()
    got = json.loads(out.read_text())
    assert got["master"] == master
    assert got["partials"] == local

    # the released cells are noisy versions of those partials (sd = sqrt(30 / (2 * 0.25)))
    sd = math.sqrt(30 / 0.5)
    by_key = {r["key"]: r for r in rows}
    assert all(abs(by_key[k]["value"] - max(local[k]["units"], 0)) <= 6 * sd + 1 for k in spec.keys)
    inside = sum(by_key[k]["ci_low"] - 1 <= local[k]["units"] <= by_key[k]["ci_high"] + 1 for k in spec.keys)
    assert inside >= 24  # 95% intervals
