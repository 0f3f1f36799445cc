"""Fixtures for end-to-end engine tests: a throwaway warehouse with small demo data."""

from __future__ import annotations

import os
import shutil
import sys
from datetime import date
from pathlib import Path

import pytest
import yaml

from tests.shipped_specs import shipped_spec_paths

ROOT = Path(__file__).resolve().parents[2]


ACCESS = {
    "version": 1,
    "releases_dir": None,  # set per env: <base>/conf/releases
    "principals": {
        "publisher_bob": {"roles": ["publisher"]},
        "analyst_alice": {"roles": ["analyst"], "exploration_budgets": ["demo_events_user"]},
        "admin_carol": {"roles": ["admin"]},
    },
}


def write_env(base: Path, *, policies: Path | None = None, lease_seconds: int = 2, extra_datasets=None) -> Path:
    """A throwaway project tree: conf/envs/test.yaml, conf/policies (budgets + access) and
    conf/releases with copies of the shipped specs (the pre-registered queries)."""
    (base / "conf" / "envs").mkdir(parents=True, exist_ok=True)
    (base / "conf" / "policies").mkdir(parents=True, exist_ok=True)
    rel = base / "conf" / "releases"
    rel.mkdir(parents=True, exist_ok=True)
    for f in shipped_spec_paths():
        if not (rel / f.name).exists():
            shutil.copy(f, rel / f.name)
    pol = base / "conf" / "policies" / "budgets.yaml"
    shutil.copy(policies or ROOT / "conf/policies/budgets.yaml", pol)
    access = dict(ACCESS, releases_dir=str(rel))
    (base / "conf" / "policies" / "access.yaml").write_text(yaml.safe_dump(access))
    datasets = {"demo_events": "{warehouse}/input/demo_events"}
    datasets.update(extra_datasets or {})
    env = {
        "name": "test",
        "spark": {"master": "local[2]"},
        "warehouse": "wh",
        "datasets": datasets,
        "policies": str(pol),
        "lease_seconds": lease_seconds,
    }
    p = base / "conf" / "envs" / "test.yaml"
    p.write_text(yaml.safe_dump(env))
    return p


def register(env_file: Path, name: str, data: dict | None = None):
    """Load (after writing, when ``data`` is given) a pre-registered spec of this env."""
    from dp_spark.config import load_release_spec

    path = Path(env_file).parents[1] / "releases" / f"{name}.yaml"
    if data is not None:
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_release_spec(path)


@pytest.fixture(scope="session")
def demo_input(spark, tmp_path_factory) -> Path:
    """Small demo events (2,000 users, 30 days) written once as Delta; tests copy it."""
    from dp_spark.demo_data import generate_events

    path = tmp_path_factory.mktemp("demo_input") / "demo_events"
    df = generate_events(spark, n_users=2000, days=30, start_date=date(2026, 11, 1), seed=11,
                         heavy_users=2, heavy_rows=20000)
    df.write.format("delta").mode("overwrite").save(str(path))
    return path


def make_warehouse(base: Path, demo_input: Path, **kw) -> Path:
    """A fresh env under ``base`` (write_env) whose demo_events dataset is a private copy of
    ``demo_input``; returns its env file."""
    env_file = write_env(base, **kw)
    target = base / "wh" / "input" / "demo_events"
    target.parent.mkdir(parents=True)
    shutil.copytree(demo_input, target)
    return env_file


@pytest.fixture
def warehouse(tmp_path, demo_input):
    """A fresh env whose demo_events dataset is a private copy of the demo input."""
    return make_warehouse(tmp_path, demo_input)


def require_service(var: str, what: str) -> str:
    """The value of ``$var`` (a service started outside pytest by .ci/cluster.sh or
    .ci/connect.sh); skip when unset, but FAIL under CI=true: CI must not go green without it."""
    value = os.environ.get(var)
    if value:
        return value
    msg = f"{what} not available: ${var} is unset (start it with .ci/{'cluster' if 'MASTER' in var else 'connect'}.sh)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(msg + " -- CI must run this test", pytrace=False)
    pytest.skip(msg)


@pytest.fixture(scope="session")
def connect_url() -> str:
    """$DP_SPARK_TEST_CONNECT: the one Spark Connect server of the test session (.ci/connect.sh,
    started by .ci/test.sh), shared by every Connect test."""
    return require_service("DP_SPARK_TEST_CONNECT", "a Spark Connect server")


#: the backends the at-most-once tests run on: a local session (a JVM in the driver process)
#: and Spark Connect (the driver process is a client; the JVM is the server's)
BACKENDS = ("local", "connect")


@pytest.fixture(params=BACKENDS)
def backend(request) -> str | None:
    """None for a local session; the Connect URL (its test skipped / failed as connect_url says)."""
    return request.getfixturevalue("connect_url") if request.param == "connect" else None


def child_env() -> dict[str, str]:
    """The environment of a driver run in its own process (its own JVM, a local session, never
    this process's gateway or a Connect server), as publisher_bob, importing this checkout."""
    env = dict(os.environ)
    env.update({"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                "SPARK_LOCAL_IP": "127.0.0.1", "DP_SPARK_TEST_MODE": "1", "DP_SPARK_PRINCIPAL": "publisher_bob",
                "PYTHONPATH": os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])})
    for k in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET"):
        env.pop(k, None)
    return env
