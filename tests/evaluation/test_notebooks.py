"""The notebooks run, against a throwaway env file, on both of their paths.

* as plain scripts in a subprocess (their own local Spark): publish_dau_aov, explore_epsilon;
* as in Databricks, with an ambient ``spark`` in their globals (the test session):
  hashing_is_not_privacy.

Each notebook reads its paths from ``DP_SPARK_ENV``; the env here points every path into
``tmp_path`` and asks for small demo data (2,000 users). Slow: the subprocess ones start a JVM.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
TIMEOUT = 600
PRINCIPAL = "publisher_notebook_test"


def write_env(base: Path) -> Path:
    """The structure of conf/envs/local.yaml, every path inside ``base``."""
    local = yaml.safe_load((ROOT / "conf/envs/local.yaml").read_text())
    # governance: default deny; this env's publisher is named by $DP_SPARK_PRINCIPAL (run_notebook)
    pol = base / "conf" / "policies"
    pol.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "conf/policies/budgets.yaml", pol / "budgets.yaml")
    (pol / "access.yaml").write_text(yaml.safe_dump({
        "version": 1, "releases_dir": str(ROOT / "conf/releases"),
        "principals": {PRINCIPAL: {"roles": ["publisher"]}},
    }))
    env = dict(local)
    env.update({
        "name": "notebook-test",
        "spark": {"master": "local[2]", "conf": {"spark.driver.memory": "1g", "spark.sql.shuffle.partitions": "2"}},
        "warehouse": str(base / "wh"),
        "datasets": {"demo_events": "{warehouse}/input/demo_events"},
        "policies": str(pol / "budgets.yaml"),
        "lease_seconds": 5,
    })
    env["demo"] = {**local.get("demo", {}), "users": 2000, "heavy_users": 2, "heavy_rows": 2000}
    p = base / "conf" / "envs" / "test.yaml"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(yaml.safe_dump(env, sort_keys=False))
    return p


def run_notebook(name: str, env_file: Path, cwd: Path) -> subprocess.CompletedProcess:
    environ = {**os.environ, "DP_SPARK_ENV": str(env_file), "DP_SPARK_PRINCIPAL": PRINCIPAL,
               "PYSPARK_PYTHON": sys.executable,
               "PYSPARK_DRIVER_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    return subprocess.run([sys.executable, str(NOTEBOOKS / name)], capture_output=True, text=True,
                          timeout=TIMEOUT, env=environ, cwd=cwd)


@pytest.mark.parametrize("name", ["publish_dau_aov.py", "explore_epsilon.py", "hashing_is_not_privacy.py"])
def test_notebooks_are_in_databricks_source_format(name):
    text = (NOTEBOOKS / name).read_text()
    assert text.splitlines()[0] == "# Databricks notebook source"
    assert text.count("\n# COMMAND ----------\n") >= 3
    assert 'globals().get("spark")' in text  # the ambient session is reused when there is one
    assert "DP_SPARK_ENV" in text
    compile(text, name, "exec")


@pytest.mark.slow
def test_explore_epsilon_notebook_runs(tmp_path):
    env_file = write_env(tmp_path)
    proc = run_notebook("explore_epsilon.py", env_file, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "smallest rho" in proc.stdout
    pngs = sorted((tmp_path / "wh" / "explorer").glob("*.png"))
    assert [p.name for p in pngs] == ["aov_by_region_explorer.png", "dau_daily_explorer.png"]
    assert all(p.stat().st_size > 1000 for p in pngs)


@pytest.mark.slow
def test_hashing_is_not_privacy_notebook_runs_with_the_ambient_session(spark, tmp_path, monkeypatch, capsys):
    """The Databricks path: the notebook finds a ``spark`` in its globals and reuses it (here the
    test session, which also saves a JVM start); the plain-script path is covered by the others."""
    import runpy

    env_file = write_env(tmp_path)
    monkeypatch.setenv("DP_SPARK_ENV", str(env_file))
    monkeypatch.chdir(tmp_path)
    ns = runpy.run_path(str(NOTEBOOKS / "hashing_is_not_privacy.py"), init_globals={"spark": spark},
                        run_name="__main__")
    assert ns["spark"] is spark  # the ambient session was used, not a new one
    out = capsys.readouterr().out
    assert "re-identified" in out and "best threshold attack accuracy" in out
    assert ns["reid_rate"] > 0.5  # most of the auxiliary people are re-identified via the hashed export
    assert len(ns["released"]) == len(ns["ZIPS"]) and "user_hash" not in ns["released"].columns
    assert ns["best"] <= ns["bound"] + 0.05  # the membership attack stays within the DP bound
    assert (tmp_path / "wh" / "charts" / "membership_overlap.png").stat().st_size > 1000


@pytest.mark.slow
def test_publish_dau_aov_notebook_runs(tmp_path):
    env_file = write_env(tmp_path)
    proc = run_notebook("publish_dau_aov.py", env_file, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "generated the demo data" in proc.stdout
    assert "dau_daily: published" in proc.stdout and "aov_by_region: published" in proc.stdout
    charts = tmp_path / "wh" / "releases" / "charts"
    for name in ("dau_daily.png", "aov_by_region.png"):
        data = (charts / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
