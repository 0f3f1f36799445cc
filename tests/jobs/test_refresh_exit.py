"""``dp-spark refresh`` exits non-zero whenever it prints an error: a stale day is a warning
(exit 0) without --strict, an error with exit 3 under --strict (docs/cli.md, "Exit codes")."""

from __future__ import annotations

from dp_spark.cli import refresh_main
from dp_spark.cli.base import EXIT_CODES
from dp_spark.config import load_env


def test_a_stale_day_is_a_warning_or_with_strict_an_error_and_exit_3(spark, warehouse, capsys, monkeypatch):
    monkeypatch.setenv("DP_SPARK_PRINCIPAL", "publisher_bob")
    spec = str(warehouse.parents[1] / "releases" / "dau_daily.yaml")
    argv = ["--env", str(warehouse), "--conf", spec, "--date", "2026-11-02", "--quiet"]
    assert refresh_main(argv) == 0
    capsys.readouterr()
    path = load_env(warehouse).datasets["demo_events"]  # late rows of the day: its input rows changed
    late = spark.read.format("delta").load(path).where("day = DATE'2026-11-02'").limit(3)
    late.write.format("delta").mode("append").save(path)

    rc = refresh_main(argv)
    out, err = capsys.readouterr()
    assert rc == 0 and "input_changed" in out
    assert "dp-spark: warning: 1 day(s) were published on an older input snapshot" in err
    assert "error" not in err

    rc = refresh_main([*argv, "--strict"])
    out, err = capsys.readouterr()
    assert rc == 3 and 3 in EXIT_CODES
    assert "dp-spark: error: 1 day(s) were published on an older input snapshot" in err
