"""Readable, honest output: decimals and percentages (no fraction) in what people read, the same
cell count (every published statistic named) in validate, plan and explore, and Spark's and
py4j's logs at ERROR unless --verbose."""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

import pytest

from dp_spark import cli
from dp_spark.env_file import JVM_LOG_LEVEL_ENV

from .test_cli_commands import AOV, MULTI, make_project

ROOT = Path(__file__).resolve().parents[2]
FRACTION = re.compile(r"(?<![\w/.\[])\d+/\d+(?![\w/])")  # 15351/1000000, not a path or a date


@pytest.fixture(autouse=True)
def _no_ambient_env(monkeypatch):
    monkeypatch.delenv("DP_SPARK_ENV", raising=False)
    monkeypatch.delenv(JVM_LOG_LEVEL_ENV, raising=False)


def _run(argv, capsys) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _project(tmp_path):
    env = make_project(tmp_path)
    (tmp_path / "conf" / "releases").mkdir()
    for f in (AOV, MULTI):
        shutil.copy(f, tmp_path / "conf" / "releases" / f.name)
    return env, tmp_path / "conf" / "releases"


def test_plan_prints_decimals_and_each_statistics_own_share(tmp_path, capsys):
    env, rel = _project(tmp_path)
    rc, out, err = _run(["plan", "--env", str(env), "--conf", str(rel / MULTI.name)], capsys)
    assert rc == 0, err
    assert not FRACTION.findall(out), FRACTION.findall(out)
    rows = {line.split()[0]: line for line in out.splitlines() if "rows/cell" in line}
    # each statistic's share is that of its own components, not the release's whole charge
    assert re.search(r"users .* (\d+(\.\d+)?)% of the charge", rows["users"])
    shares = {name: float(re.search(r"(\d+(?:\.\d+)?)% of the charge", line).group(1)) for name, line in rows.items()}
    assert shares["users"] < shares["orders"] < shares["revenue"] < 100
    assert shares["revenue"] == shares["aov"]  # the same components: rows and the clamped sum


def test_validate_plan_and_explore_count_the_same_cells_naming_the_means_count(tmp_path, capsys):
    env, rel = _project(tmp_path)
    spec = str(rel / AOV.name)
    want = "40 cells (20 keys x 2 statistics: count, mean)"
    rc, out, err = _run(["validate", "--env", str(env), "--conf", spec, "--principal", "publisher_bob"], capsys)
    assert rc == 0 and want in out, err
    rc, out, _ = _run(["plan", "--env", str(env), "--conf", spec], capsys)
    assert rc == 0 and want in out
    rc, out, _ = _run(["explore", "--env", str(env), "--conf", spec, "--out", str(tmp_path / "x")], capsys)
    assert rc == 0 and want in out


def test_spark_and_py4j_logs_are_at_error_unless_verbose(tmp_path, capsys, monkeypatch):
    env, rel = _project(tmp_path)
    spec = str(rel / AOV.name)
    py4j = logging.getLogger("py4j")
    monkeypatch.setattr(py4j, "level", logging.NOTSET)
    rc, _, _ = _run(["validate", "--env", str(env), "--conf", spec, "--principal", "publisher_bob"], capsys)
    assert rc == 0
    import os

    assert os.environ.get(JVM_LOG_LEVEL_ENV) == "error" and py4j.level == logging.ERROR
    from dp_spark.spark import log4j2_file  # the file a JVM started now would read

    assert "rootLogger.level = error" in Path(log4j2_file()).read_text()
    rc, _, _ = _run(["validate", "--env", str(env), "--conf", spec, "--principal", "publisher_bob", "--verbose"],
                    capsys)
    assert rc == 0 and JVM_LOG_LEVEL_ENV not in os.environ and py4j.level == logging.NOTSET
    assert "rootLogger.level = warn" in Path(log4j2_file()).read_text()
