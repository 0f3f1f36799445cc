"""Fixtures of the Spark tests (the session itself is tests/conftest.py's)."""

from __future__ import annotations

import pytest


@pytest.fixture
def ansi(spark):
    """Set spark.sql.ansi.enabled for one test and restore it afterwards."""
    previous = spark.conf.get("spark.sql.ansi.enabled")

    def set_ansi(enabled: bool) -> None:
        spark.conf.set("spark.sql.ansi.enabled", "true" if enabled else "false")

    yield set_ansi
    spark.conf.set("spark.sql.ansi.enabled", previous)
