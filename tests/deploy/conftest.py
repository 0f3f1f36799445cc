"""Fixtures for the deployment tests: throwaway envs, bounded subprocesses, service gates.

The services (a standalone cluster, a Spark Connect server) are started outside pytest by
``.ci/cluster.sh`` and ``.ci/connect.sh``, which export ``DP_SPARK_TEST_MASTER`` and
``DP_SPARK_TEST_CONNECT``. A test whose service is not there is skipped on a developer's
machine and FAILS in CI (``CI=true``): CI must not go green without running it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Optional, Sequence

import pytest

from tests.jobs.conftest import (  # noqa: F401  (connect_url: the session's one Connect server)
    connect_url,
    require_service,
    write_env,  # the e2e tests' throwaway project tree
)

ROOT = Path(__file__).resolve().parents[2]
PRINCIPAL = "publisher_bob"  # a publisher in the throwaway access policy of write_env
BUDGET = "demo_events_user"
START = date(2026, 11, 1)  # the demo data and conf/releases/dau_daily.yaml cover Nov 2026


@pytest.fixture
def standalone_master() -> str:
    """$DP_SPARK_TEST_MASTER (.ci/cluster.sh), checked before any other fixture is built."""
    return require_service("DP_SPARK_TEST_MASTER", "a Spark standalone cluster")


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def delta_jars() -> str:
    from dp_spark.spark import delta_jar_paths

    return ",".join(delta_jar_paths())


def env_spec(env_file: Path, name: str):
    """The pre-registered spec ``name`` of a throwaway env (its conf/releases copy if any)."""
    from dp_spark.config import load_release_spec

    local = Path(env_file).parents[1] / "releases" / f"{name}.yaml"
    return load_release_spec(local if local.is_file() else ROOT / "conf" / "releases" / f"{name}.yaml")


def spec_path(env_file: Path, name: str) -> Path:
    local = Path(env_file).parents[1] / "releases" / f"{name}.yaml"
    return local if local.is_file() else ROOT / "conf" / "releases" / f"{name}.yaml"


def child_env(**extra: str) -> dict[str, str]:
    """Environment of a child job: loopback, the venv's Python, the publisher principal."""
    env = dict(os.environ)
    env.update({
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "DP_SPARK_PRINCIPAL": PRINCIPAL,
        "PYTHONPATH": os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p]),
    })
    for k in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET"):
        env.pop(k, None)
    env.update(extra)
    return env


@dataclass
class Run:
    cmd: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def explain(self, tail: int = 60) -> str:
        err = "\n".join(l for l in self.stderr.splitlines() if not l.lstrip().startswith("at "))
        return (f"command: {' '.join(self.cmd)}\nexit {self.returncode} after {self.seconds:.0f}s\n"
                f"--- stdout ---\n{self.stdout[-4000:]}\n--- stderr (tail) ---\n"
                + "\n".join(err.splitlines()[-tail:]))


def run_bounded(cmd: Sequence[str], *, timeout: float, env: Optional[dict] = None,
                cwd: Optional[Path] = None) -> Run:
    """Run ``cmd`` in its own process group; on timeout the whole group is killed."""
    t0 = time.monotonic()
    proc = subprocess.Popen(list(map(str, cmd)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=str(cwd or ROOT), start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate(timeout=30)
        pytest.fail(f"timed out after {timeout:.0f}s: {' '.join(map(str, cmd))}\n{(err or '')[-3000:]}",
                    pytrace=False)
    finally:
        if proc.poll() is None:
            _kill_group(proc)
    # the job's children (a spark-submit driver's Python) share its group: leave none behind
    _kill_group(proc, quiet=True)
    return Run(list(map(str, cmd)), proc.returncode, out or "", err or "", time.monotonic() - t0)


def _kill_group(proc: subprocess.Popen, quiet: bool = False) -> None:
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = proc.pid  # the leader is gone; its group id is its pid
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        except PermissionError:
            return
        for _ in range(50):
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


@pytest.fixture(scope="session")
def deploy_input(spark, tmp_path_factory) -> Path:
    """Small demo events (400 users, 30 days of Nov 2026) written once as Delta; tests copy it."""
    from dp_spark.demo_data import generate_events

    path = tmp_path_factory.mktemp("deploy_input") / "demo_events"
    df = generate_events(spark, n_users=400, days=30, start_date=START, seed=23, heavy_users=1, heavy_rows=500)
    df.write.format("delta").mode("overwrite").save(str(path))
    return path


def make_env(base: Path, deploy_input: Path, *, policies: Optional[Path] = None) -> Path:
    env_file = write_env(base, policies=policies) if policies is not None else write_env(base)
    target = base / "wh" / "input" / "demo_events"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(deploy_input, target)
    return env_file


@pytest.fixture
def deploy_env(tmp_path, deploy_input) -> Path:
    """A fresh env (own warehouse, SQLite ledger, salt) whose input is a copy of the demo data."""
    return make_env(tmp_path, deploy_input)


def local_engine(spark, env_file: Path, **kw):
    from dp_spark.config import load_env
    from dp_spark.engine import Engine

    kw.setdefault("principal", PRINCIPAL)
    return Engine(load_env(env_file), spark=spark, **kw)
