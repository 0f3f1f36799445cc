"""Packaging for Databricks: the wheel holds dp_spark and its console entry point, and
databricks.yml's tasks name entry points, files and flags that the code accepts."""

from __future__ import annotations

import configparser
import contextlib
import email.parser
import io
import os
import re
import shutil
import sys
import zipfile
from datetime import date
from pathlib import Path

import pytest
import yaml

from .conftest import ROOT, run_bounded

BUNDLE = ROOT / "databricks.yml"
SAMPLE = {  # values for Databricks' dynamic references, to parse the parameters as a run would
    "job.start_time.iso_date": "2026-11-30",
    "job.trigger.time.iso_date": "2026-11-30",
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Build the wheel from a copy of the package sources (the work tree stays clean)."""
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    src.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md", "MANIFEST.in", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "dp_spark", src / "dp_spark", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    run = run_bounded([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(base / "dist"), str(src)],
                      timeout=600, env=env, cwd=base)
    assert run.returncode == 0, run.explain()
    wheels = list((base / "dist").glob("dp_spark-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def console_scripts(whl: Path) -> dict[str, str]:
    with zipfile.ZipFile(whl) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))
        cp = configparser.ConfigParser()
        cp.read_string(z.read(name).decode())
    return dict(cp["console_scripts"]) if cp.has_section("console_scripts") else {}


def test_wheel_contains_the_package_and_the_console_script(wheel, tmp_path):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    for module in ("__init__", "cli/__init__", "cli/app", "cli/budget", "engine", "commands", "schedule", "spark",
                   "config"):
        assert f"dp_spark/{module}.py" in names
    assert not any(n.startswith("tests/") for n in names)
    assert console_scripts(wheel).get("dp-spark") == "dp_spark.cli:main"

    # installed from the wheel alone (not the work tree), the console script runs
    target = tmp_path / "site"
    run = run_bounded([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                      timeout=300, env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1"), cwd=tmp_path)
    assert run.returncode == 0, run.explain()
    env = dict(os.environ, PYTHONPATH=str(target))
    where = run_bounded([sys.executable, "-c", "import dp_spark.schedule, dp_spark; print(dp_spark.__file__)"],
                        timeout=120, env=env, cwd=tmp_path)
    assert where.returncode == 0 and where.stdout.strip().startswith(str(target)), where.explain()
    script = target / "bin" / "dp-spark"
    assert script.is_file()
    helped = run_bounded([sys.executable, str(script), "publish", "--help"], timeout=120, env=env, cwd=tmp_path)
    assert helped.returncode == 0 and "--conf" in helped.stdout and "--env" in helped.stdout, helped.explain()


def test_wheel_requires_spark_and_delta_only_through_the_spark_extra(wheel):
    """A Databricks Runtime ships Spark and Delta: installing the wheel must not pull them."""
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(z.read(name).decode())
    requires = meta.get_all("Requires-Dist") or []
    for pkg in ("pyspark", "delta-spark"):
        lines = [r for r in requires if re.match(rf"(?i){pkg}\b", r)]
        assert lines and all('extra == "spark"' in r for r in lines), (pkg, lines)


# -- databricks.yml -----------------------------------------------------------------------------
def _bundle() -> dict:
    return yaml.safe_load(BUNDLE.read_text())


def _resolve(value: str, variables: dict, job_params: dict) -> str:
    """Substitute ${workspace.file_path} (the repo root), ${var.X} (defaults) and
    {{job.parameters.X}} / {{job.start_time.iso_date}} (sample values)."""
    for _ in range(5):
        value = value.replace("${workspace.file_path}", str(ROOT))
        value = re.sub(r"\$\{var\.([A-Za-z0-9_]+)\}", lambda m: str(variables[m.group(1)]["default"]), value)
        value = re.sub(r"\{\{\s*job\.parameters\.([A-Za-z0-9_]+)\s*\}\}", lambda m: str(job_params[m.group(1)]), value)
        value = re.sub(r"\{\{\s*([a-z_.]+)\s*\}\}", lambda m: SAMPLE.get(m.group(1), m.group(0)), value)
    assert "${" not in value and "{{" not in value, f"unresolved reference in {value!r}"
    return value


def _parse(command: str, argv: list[str]):
    from types import SimpleNamespace

    from dp_spark import cli

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            return SimpleNamespace(**cli.parse_args(command, argv))
        except SystemExit:
            pytest.fail(f"dp-spark {command} rejects {argv}: {err.getvalue().strip()}", pytrace=False)


def _parsers():
    # the commands the bundle runs: `dp-spark publish` and `dp-spark refresh` (also behind
    # jobs/publish_release.py and jobs/daily_refresh.py)
    return {"publish": "publish", "refresh": "refresh"}


JOB_FILES = {"jobs/publish_release.py": "publish", "jobs/daily_refresh.py": "refresh"}


def _tasks():
    bundle = _bundle()
    variables = bundle.get("variables", {})
    for job_key, job in bundle["resources"]["jobs"].items():
        params = {p["name"]: p["default"] for p in job.get("parameters", [])}
        for task in job["tasks"]:
            yield job_key, job, task, (lambda v, _p=params: _resolve(str(v), variables, _p))


def test_bundle_has_a_daily_utc_schedule_and_the_backfill_job():
    jobs = _bundle()["resources"]["jobs"]
    scheduled = [j for j in jobs.values() if "schedule" in j]
    assert scheduled, "no scheduled job"
    daily = 0
    for job in scheduled:
        s = job["schedule"]
        assert s["timezone_id"] == "UTC"
        fields = s["quartz_cron_expression"].split()
        assert len(fields) in (6, 7) and fields[3] in ("*", "?"), "daily or weekly"
        daily += fields[5] in ("*", "?")  # else weekly, on the named days (the AOV: its budget)
    assert daily, "no daily job (the DAU refresh)"
    kinds = {k for j in jobs.values() for t in j["tasks"] for k in t if k.endswith("_task")}
    assert "python_wheel_task" in kinds
    backfills = [j for j in jobs.values() for t in j["tasks"]
                 if "--from" in (t.get("spark_python_task") or t.get("python_wheel_task") or {}).get("parameters", [])]
    assert backfills and all("schedule" not in j for j in backfills)


def test_bundle_tasks_match_the_code(wheel):
    from dp_spark.config import load_env, load_release_spec
    from dp_spark.schedule import day_spec

    bundle = _bundle()
    artifacts = bundle.get("artifacts", {})
    assert any(a.get("type") == "whl" and "wheel" in a.get("build", "") for a in artifacts.values())
    scripts = console_scripts(wheel)
    parsers = _parsers()
    checked = 0
    for job_key, job, task, resolve in _tasks():
        where = f"{job_key}.{task['task_key']}"
        if "python_wheel_task" in task:
            t = task["python_wheel_task"]
            assert t["package_name"] == "dp_spark", where
            assert t["entry_point"] in scripts, f"{where}: no console script {t['entry_point']!r} in the wheel"
            argv = [resolve(a) for a in t["parameters"]]
            sub, rest = argv[0], argv[1:]
            assert sub in parsers, f"{where}: dp-spark has no subcommand {sub!r} (known: {sorted(parsers)})"
        elif "spark_python_task" in task:
            t = task["spark_python_task"]
            rel = t["python_file"].removeprefix("./")
            assert (ROOT / rel).is_file(), f"{where}: {rel} does not exist"
            assert rel in JOB_FILES, f"{where}: {rel} is not a known job entry point"
            sub, rest = JOB_FILES[rel], [resolve(a) for a in t["parameters"]]
        else:
            pytest.fail(f"{where}: unexpected task kind {sorted(task)}")
        assert any(lib.get("whl", "").startswith("./dist/") for lib in task.get("libraries", [])), where
        args = _parse(parsers[sub], rest)
        # the specs it names exist in the repo and load, validated as on the cluster
        for conf in args.conf:
            spec = load_release_spec(conf)
            if sub == "refresh":  # a day-keyed spec: its first declared day restricts cleanly
                day_spec(spec, date.fromisoformat(spec.keys[0]))
        env_file = Path(args.env)
        assert env_file.is_file(), f"{where}: env file {env_file} is not in the repo"
        load_env(env_file)
        checked += 1
    assert checked >= 3


def test_every_cli_subcommand_used_by_the_bundle_is_dispatched():
    """`dp-spark <sub> --help` must be accepted by dp_spark.cli.main for each wheel task."""
    from dp_spark import cli

    for job_key, job, task, resolve in _tasks():
        if "python_wheel_task" not in task:
            continue
        sub = task["python_wheel_task"]["parameters"][0]
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            with pytest.raises(SystemExit) as exc:
                cli.main([sub, "--help"])
        assert exc.value.code == 0 and "usage" in out.getvalue().lower(), f"{job_key}: dp-spark {sub}"
