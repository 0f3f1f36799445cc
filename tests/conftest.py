"""Shared pytest setup: the `slow` marker, Spark environment defaults, one Spark session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

_REPO_ROOT = Path(__file__).resolve().parent.parent
if str(_REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(_REPO_ROOT))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: statistical or long-running test (still run in CI)")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


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
