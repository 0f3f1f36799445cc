"""Shared pytest setup: the markers, Spark environment defaults, one Spark session.

Markers are given from what a test needs, not by hand (``pytest_collection_modifyitems``):

* ``spark``: the test (or a fixture it uses, transitively) needs the ``spark`` session, or it
  lives in ``tests/spark/``;
* ``pg``: it runs against a PostgreSQL server (the ``postgres`` half of ``ledger_factory``,
  ``pg_dsn`` / ``pg_admin``, or a throwaway server of its own);
* ``jvm``: it starts a JVM in another process (a job, a notebook, a cluster, Spark Connect,
  the tutorial's commands): every test under ``tests/jobs/`` and ``tests/deploy/``, and the
  files in :data:`JVM_FILES`.

``make test-fast`` runs ``-m "not spark and not pg and not jvm and not slow"`` with no JVM on
the path (a test that starts one without its marker fails there instead of being slow);
``make test`` runs every test, whatever its markers.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

_REPO_ROOT = Path(__file__).resolve().parent.parent
if str(_REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(_REPO_ROOT))


#: test files that start a JVM in a subprocess (relative to tests/), besides tests/jobs and
#: tests/deploy; test-fast's missing JVM makes a forgotten one fail, not pass slowly
JVM_FILES = frozenset({"docs/test_tutorial.py", "evaluation/test_notebooks.py", "unit/test_cli_spark.py"})
JVM_DIRS = ("jobs", "deploy")
PG_FILES = frozenset({"ledger/test_durability.py"})
PG_FIXTURES = frozenset({"pg_dsn", "pg_admin"})


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: statistical or long-running test (still run in CI)")
    config.addinivalue_line("markers", "pg: needs a PostgreSQL server (given from its fixtures)")
    config.addinivalue_line("markers", "jvm: starts a JVM in another process (given from its directory)")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give each test the markers of what it needs (module docstring)."""
    tests_dir = Path(__file__).resolve().parent
    for item in items:
        try:
            rel = Path(str(item.fspath)).resolve().relative_to(tests_dir).as_posix()
        except ValueError:
            continue
        fixtures = set(getattr(item, "fixturenames", ()))
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "spark" in fixtures or rel.startswith("spark/"):
            item.add_marker(pytest.mark.spark)
        if fixtures & PG_FIXTURES or params.get("ledger_factory") == "postgres" or rel in PG_FILES:
            item.add_marker(pytest.mark.pg)
        if rel in JVM_FILES or rel.split("/", 1)[0] in JVM_DIRS:
            item.add_marker(pytest.mark.jvm)


@pytest.fixture(scope="session")
def spark():
    """One local[2] SparkSession with Delta for the whole test session."""
    from dp_spark.spark import get_or_create_session

    session = get_or_create_session("dp_spark-tests", master="local[2]")
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _engines_drained():
    """After each test, wait for the ledger mirror refreshes its engines started in the
    background (``Engine.close``), so that no test's Spark work runs into the next test."""
    yield
    engine_mod = sys.modules.get("dp_spark.engine")
    if engine_mod is not None:
        for engine in list(engine_mod._LIVE):
            engine.close(timeout=120)
