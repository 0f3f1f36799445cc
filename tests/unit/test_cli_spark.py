"""`dp-spark publish`, `refresh`, `budget status` run from another folder with `--env`: every
path (input, release tables, ledger, statements) comes from the env file's project root, none
from the current directory. Reuses the session's SparkSession (tests/conftest.py)."""

from __future__ import annotations

import os
from datetime import date
from pathlib import Path

import pytest

from tests.jobs.conftest import write_env
from tests.unit.test_cli_commands import _exit as _main


@pytest.mark.slow
def test_publish_refresh_and_budget_from_another_folder(spark, tmp_path, monkeypatch, capsys):
    from dp_spark.demo_data import generate_events

    project = tmp_path / "project"
    env_file = write_env(project)  # warehouse: wh (relative to the project root)
    generate_events(spark, n_users=300, days=30, start_date=date(2026, 11, 1), seed=3).write.format("delta") \
        .mode("overwrite").save(str(project / "wh" / "input" / "demo_events"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.delenv("DP_SPARK_ENV", raising=False)
    monkeypatch.delenv("DP_SPARK_LEDGER_URL", raising=False)
    monkeypatch.setenv("DP_SPARK_PRINCIPAL", "publisher_bob")
    env = os.path.relpath(env_file, elsewhere)  # ../project/conf/envs/test.yaml
    dau = project / "conf" / "releases" / "dau_daily.yaml"

    rc, _, err = _main(["budget", "status", "--env", env], capsys)  # nothing published yet
    assert rc == 2 and f"no ledger at {project / 'wh' / 'ledger.db'}" in err

    rc, out, err = _main(["publish", "--env", env, "--conf", str(dau), "--quiet"], capsys)
    assert rc == 0, err
    assert "dau_daily: published" in out
    assert (project / "wh" / "ledger.db").is_file() and (project / "wh" / "releases").is_dir()

    rc, out, err = _main(["refresh", "--env", env, "--conf", str(dau), "--date", "2026-11-07", "--quiet"], capsys)
    assert rc == 0, err
    assert out.startswith("2026-11-07  published") and "1 served (1 charged)" in out
    rc, out, err = _main(["backfill", "--env", env, "--conf", str(dau), "--from", "2026-11-07", "--to", "2026-11-07",
                          "--quiet"], capsys)
    assert rc == 0 and "cache_hit" in out and "0 charged" in out, err

    rc, out, err = _main(["budget", "status", "--env", env, "--budget", "demo_events_user"], capsys)
    assert rc == 0, err
    assert "dau_daily" in out and "2 releases in this window" in out
    assert list(elsewhere.iterdir()) == []  # nothing written where the commands ran
