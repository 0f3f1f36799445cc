"""Fixtures for end-to-end engine tests: a throwaway warehouse with small demo data."""

from __future__ import annotations

import shutil
from datetime import date
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def write_env(base: Path, *, policies: Path | None = None, lease_seconds: int = 2, extra_datasets=None) -> Path:
    (base / "conf" / "envs").mkdir(parents=True, exist_ok=True)
    pol = policies or ROOT / "conf/policies/budgets.yaml"
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


@pytest.fixture(scope="session")
def demo_input(spark, tmp_path_factory) -> Path:
    """Small demo events (2,000 users, 30 days) written once as Delta; tests copy it."""
    from dp_spark.demo_data import generate_events

    path = tmp_path_factory.mktemp("demo_input") / "demo_events"
    df = generate_events(spark, n_users=2000, days=30, start_date=date(2026, 11, 1), seed=11,
                         heavy_users=2, heavy_rows=20000)
    df.write.format("delta").mode("overwrite").save(str(path))
    return path


@pytest.fixture
def warehouse(tmp_path, demo_input):
    """A fresh env whose demo_events dataset is a private copy of the demo input."""
    env_file = write_env(tmp_path)
    target = tmp_path / "wh" / "input" / "demo_events"
    target.parent.mkdir(parents=True)
    shutil.copytree(demo_input, target)
    return env_file
