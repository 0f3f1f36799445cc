"""A family keyed by day, published a day at a time, reads as a series: ``series_view`` and
the ``<family>_current`` Delta table hold exactly one row per key and statistic, a day
re-published later with its newer value, a withdrawn re-publication falling back."""

from __future__ import annotations

from datetime import date, timedelta

import pytest

from dp_spark.governance.versions import (published_view, record_publication, rollback, series_current_path,
                                          series_view, write_series_current)
from dp_spark.ledger import open_ledger

pytestmark = pytest.mark.spark

FAMILY = "dau_series"
DAYS = [(date(2026, 11, 1) + timedelta(days=i)).isoformat() for i in range(30)]


def _publish(spark, path, ledger, release_id, day, value):
    rows = [(release_id, FAMILY, "official", stat, day, value + j) for j, stat in enumerate(("dau", "wau"))]
    spark.createDataFrame(rows, "release_id string, release_family string, mode string, statistic string, "
                                "key string, value double").write.format("delta").mode("append").save(path)
    record_publication(ledger, FAMILY, release_id, "scheduler")


def test_thirty_days_and_one_republication_read_as_thirty_rows_per_statistic(spark, tmp_path):
    path = str(tmp_path / "releases" / FAMILY)
    with open_ledger(f"sqlite:{tmp_path}/ledger.db") as ledger:
        for i, day in enumerate(DAYS):
            _publish(spark, path, ledger, f"r-{day}", day, 100.0 + i)
        _publish(spark, path, ledger, "r-again", DAYS[4], 999.0)  # day 5 re-published (new input)
        # the one-current-version view serves the last release only: one day
        assert published_view(spark, path, ledger, FAMILY).count() == 2
        got = {(r["key"], r["statistic"]): r["value"] for r in series_view(spark, path, ledger, FAMILY).collect()}
        assert len(got) == 60 and {k for k, _ in got} == set(DAYS)
        assert got[(DAYS[4], "dau")] == 999.0 and got[(DAYS[3], "dau")] == 103.0
        out = series_current_path(str(tmp_path / "releases"), FAMILY)
        assert write_series_current(spark, path, ledger, FAMILY, out) == 60
        table = spark.read.format("delta").load(out)
        assert table.groupBy("statistic").count().collect() and \
            {r["statistic"]: r["count"] for r in table.groupBy("statistic").count().collect()} == {"dau": 30, "wau": 30}
        # the re-publication withdrawn: day 5 falls back to its first value
        rollback(ledger, FAMILY, "admin", "wrong input")
        back = {(r["key"], r["statistic"]): r["value"] for r in series_view(spark, path, ledger, FAMILY).collect()}
        assert len(back) == 60 and back[(DAYS[4], "dau")] == 104.0
