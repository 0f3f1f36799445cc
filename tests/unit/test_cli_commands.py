"""The one `dp-spark` CLI: every command's help, --version, exit codes, errors, --env resolved
against the env file's project root from any folder, a missing ledger, a closed pipe.

No Spark session is started here: every command tested either reads no data (plan, validate,
explore, budget) or is refused before Spark starts (publish, refresh, backfill, rollback with
a bad env, spec or ledger). The publishing paths are covered with Spark in tests/jobs and
tests/deploy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dp_spark import cli
from dp_spark.core.budget import ZCDP
from dp_spark.ledger import open_ledger
from dp_spark.cli.budget import BUDGET_SUBCOMMANDS
from dp_spark.ledger.policy import load_policies

ROOT = Path(__file__).resolve().parents[2]
AOV = ROOT / "conf/releases/aov_by_region.yaml"
DAU = ROOT / "conf/releases/dau_daily.yaml"
MULTI = ROOT / "conf/releases/orders_by_day_region.yaml"


def make_project(root: Path, name: str = "local") -> Path:
    """A project folder with its own env (relative paths only), policies and access file."""
    (root / "conf" / "envs").mkdir(parents=True)
    shutil.copytree(ROOT / "conf" / "policies", root / "conf" / "policies")
    env = root / "conf" / "envs" / "t.yaml"
    env.write_text(yaml.safe_dump({
        "name": name, "warehouse": "wh", "datasets": {"demo_events": "{warehouse}/input/demo_events"},
        "policies": "conf/policies/budgets.yaml", "ledger_url": "sqlite:{warehouse}/ledger.db"}))
    return env


def spend(project: Path, releases: int = 2, charge: str = "0.25") -> None:
    """A ledger at the project's wh/ledger.db with ``releases`` reservations on demo_events_user."""
    (project / "wh").mkdir(exist_ok=True)
    policy = load_policies(project / "conf/policies/budgets.yaml")["demo_events_user"]
    with open_ledger(f"sqlite:{project / 'wh' / 'ledger.db'}") as led:
        led.register_budget(policy)
        for i in range(releases):
            led.reserve(policy.budget_id, f"rel-{i:05d}", ZCDP(charge), "{}", principal="alice", code_version="v1",
                        release_family="dau_daily", owner_token="o")


def run_cli(*argv: str, cwd: Path, extra_env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("DP_SPARK_ENV", "DP_SPARK_LEDGER_URL")}
    environ["PYTHONPATH"] = str(ROOT) + os.pathsep + environ.get("PYTHONPATH", "")
    environ.update(extra_env or {})
    return subprocess.run([sys.executable, "-m", "dp_spark.cli", *argv], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(autouse=True)
def _no_ambient_env(monkeypatch):
    monkeypatch.delenv("DP_SPARK_ENV", raising=False)
    monkeypatch.delenv("DP_SPARK_LEDGER_URL", raising=False)


def _exit(argv, capsys) -> tuple[int, str, str]:
    """Run ``dp-spark argv`` in process: (exit status, stdout, stderr), the usage/help exits included."""
    try:
        rc = cli.main(list(argv))
    except SystemExit as exc:
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


# -- help and version ------------------------------------------------------------------------
EXPECTED = ["publish", "plan", "validate", "explore", "refresh", "backfill", "budget", "rollback", "show", "generate-demo"]


def test_top_level_help_lists_every_command_with_its_one_line_description(capsys):
    assert list(cli.COMMANDS)[:len(EXPECTED)] == EXPECTED
    rc, out, _ = _exit(["--help"], capsys)
    assert rc == 0 and out.startswith("usage: dp-spark")
    lines = out.splitlines()
    for name, text in cli.COMMANDS.items():
        assert text and "\n" not in text
        at = next(i for i, line in enumerate(lines) if line.strip().split()[:1] == [name])
        # the description on the command's line, or (a long name) on the next one
        assert text in lines[at] or text in lines[at + 1], name
    for sub, text in BUDGET_SUBCOMMANDS.items():
        assert f"  {sub:<16}{text}" in out
    assert "--env" in out and "DP_SPARK_ENV" in out and "exit codes" in out


@pytest.mark.parametrize("name", EXPECTED)
def test_every_command_has_help_with_its_description_and_env(name, capsys):
    rc, out, err = _exit([name, "--help"], capsys)
    assert rc == 0, err
    assert out.startswith(f"usage: dp-spark {name}")
    assert "--env ENV" in out  # the same option everywhere
    description = " ".join(out.split("\n\n")[1].split())
    assert len(description) > 20


@pytest.mark.parametrize("sub", list(BUDGET_SUBCOMMANDS))
def test_every_budget_subcommand_has_help_and_env(sub, capsys):
    rc, out, _ = _exit(["budget", sub, "--help"], capsys)
    assert rc == 0 and out.startswith(f"usage: dp-spark budget {sub}") and "--env ENV" in out


def test_version(capsys):
    from dp_spark import __version__

    rc, out, _ = _exit(["--version"], capsys)
    assert rc == 0 and out.strip() == f"dp-spark {__version__}"


def test_the_job_scripts_parse_like_their_commands(capsys):
    from jobs import explore_epsilon

    with pytest.raises(SystemExit) as exc:
        explore_epsilon.main(["--help"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("usage: dp-spark explore")
    assert cli.parse_args("refresh", ["--conf", "x", "--from", "2026-11-01", "--to", "2026-11-02"]
                          )["start"].isoformat() == "2026-11-01"
    assert cli.parse_args("publish", ["--conf", "x"])["env"] is None  # resolved when run


# -- usage errors: exit 2 ------------------------------------------------------------------
def test_unknown_command_missing_command_and_bad_arguments_exit_2(capsys):
    rc, _, err = _exit(["bogus"], capsys)
    assert rc == 2 and "invalid choice: 'bogus'" in err and "Traceback" not in err
    rc, _, err = _exit([], capsys)
    assert rc == 2 and "usage: dp-spark" in err
    rc, _, err = _exit(["plan"], capsys)  # --conf is required
    assert rc == 2 and "--conf" in err
    rc, _, err = _exit(["budget"], capsys)
    assert rc == 2 and "SUBCOMMAND" in err
    rc, _, err = _exit(["backfill", "--conf", str(DAU), "--from", "2026-11-02"], capsys)
    assert rc == 2 and "--to" in err
    rc, _, err = _exit(["refresh", "--conf", str(DAU), "--from", "2026-11-02"], capsys)
    assert rc == 2 and "--from needs --to" in err
    rc, _, err = _exit(["explore", "--conf", str(AOV), "--group-sizes", "x"], capsys)
    assert rc == 2 and "comma-separated" in err


# -- configuration errors: exit 2, message names the file, no command-name prefix -----------
@pytest.mark.parametrize("argv", [
    ["plan", "--conf", str(MULTI)], ["validate", "--conf", str(MULTI)], ["publish", "--conf", str(DAU)],
    ["refresh", "--conf", str(DAU), "--date", "2026-11-02"], ["backfill", "--conf", str(DAU), "--from", "2026-11-01",
                                                              "--to", "2026-11-02"],
    ["budget", "status"], ["budget", "history", "--budget", "demo_events_user"], ["budget", "verify"],
    ["rollback", "--family", "dau_daily", "--reason", "r"], ["show", "--family", "dau_daily"], ["generate-demo"],
    ["explore", "--conf", str(AOV)],  # only for its default --out (the env's warehouse)
])
def test_a_missing_env_file_is_a_config_error_naming_it(argv, tmp_path, capsys):
    missing = tmp_path / "conf" / "envs" / "nope.yaml"
    rc, out, err = _exit([*argv, "--env", str(missing)], capsys)
    assert rc == 2, err
    assert err.startswith("dp-spark: error: ") and str(missing) in err and "Traceback" not in err


def test_an_invalid_env_file_is_a_config_error(tmp_path, capsys):
    env = make_project(tmp_path)
    env.write_text("name: [unclosed\n")
    rc, _, err = _exit(["budget", "status", "--env", str(env)], capsys)
    assert rc == 2 and err.startswith("dp-spark: error: ") and "invalid YAML" in err


def test_no_env_anywhere_is_a_config_error(monkeypatch, tmp_path, capsys):
    from dp_spark import env_file

    monkeypatch.setattr(env_file, "DEFAULT_ENV", str(tmp_path / "absent.yaml"))
    rc, _, err = _exit(["validate", "--conf", str(MULTI)], capsys)
    assert rc == 2 and "no env file: pass --env FILE or set $DP_SPARK_ENV" in err


def test_env_resolution_order(monkeypatch, tmp_path):
    assert cli.DEFAULT_ENV == str(ROOT / "conf/envs/local.yaml")  # the project the package runs from
    assert cli.resolve_env(None, {}) == cli.DEFAULT_ENV
    assert cli.resolve_env(None, {"DP_SPARK_ENV": "/x/e.yaml"}) == "/x/e.yaml"
    assert cli.resolve_env("given.yaml", {"DP_SPARK_ENV": "/x/e.yaml"}) == "given.yaml"


def test_refresh_errors_carry_no_internal_command_name(tmp_path, capsys):
    env = make_project(tmp_path)
    rc, _, err = _exit(["refresh", "--env", str(env), "--conf", str(DAU), "--date", "2031-01-01"], capsys)
    assert rc == 2 and err.startswith("dp-spark: error: ") and "outside the declared dates" in err
    assert "daily_refresh" not in err
    rc, _, err = _exit(["backfill", "--env", str(env), "--conf", str(DAU), "--from", "2026-11-03",
                        "--to", "2026-11-01"], capsys)
    assert rc == 2 and "is before --from" in err and "daily_refresh" not in err


def test_an_invalid_spec_is_refused_before_spark_with_exit_2(tmp_path, capsys):
    env = make_project(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\n")
    for argv in (["publish"], ["validate"], ["plan"]):
        rc, out, err = _exit([*argv, "--env", str(env), "--conf", str(bad)], capsys)
        assert rc == 2 and "dp-spark: error: " in err and str(bad) in err, argv
    assert not (tmp_path / "wh").exists()  # nothing created


# -- the ledger ----------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [["budget", "status"], ["budget", "history", "--budget", "demo_events_user"],
                                  ["budget", "verify"], ["rollback", "--family", "dau_daily", "--reason", "r"]])
def test_a_missing_ledger_is_an_error_naming_its_path(argv, tmp_path, capsys):
    env = make_project(tmp_path)
    rc, out, err = _exit([*argv, "--env", str(env)], capsys)
    assert rc == 2 and out == ""
    assert f"dp-spark: error: no ledger at {tmp_path / 'wh' / 'ledger.db'}" in err
    assert "No budgets" not in out + err and "no budgets" not in out + err
    assert not (tmp_path / "wh").exists()  # and it is not created


def test_budget_status_history_verify_read_the_env_ledger(tmp_path, capsys):
    env = make_project(tmp_path)
    spend(tmp_path)
    rc, out, err = _exit(["budget", "status", "--env", str(env), "--budget", "demo_events_user"], capsys)
    assert rc == 0, err
    assert "budget demo_events_user" in out and "rel-00001" in out
    rc, out, _ = _exit(["budget", "history", "--env", str(env), "--budget", "demo_events_user"], capsys)
    assert rc == 0 and "2 releases" in out
    rc, out, _ = _exit(["budget", "verify", "--env", str(env)], capsys)
    assert rc == 0 and "ledger verified" in out
    rc, _, err = _exit(["budget", "history", "--env", str(env), "--budget", "nope"], capsys)
    assert rc == 1 and err.startswith("dp-spark: error: ") and "unknown budget 'nope'" in err
    # a typo: the close name and every budget there is
    for sub in ("status", "history"):
        rc, _, err = _exit(["budget", sub, "--env", str(env), "--budget", "demo_event_user"], capsys)
        assert rc == 1 and "unknown budget 'demo_event_user' (did you mean 'demo_events_user'?)" in err, err
        assert "the budgets are demo_events_user, demo_events_user_pure" in err


def test_budget_amounts_are_decimals_not_fractions(tmp_path, capsys):
    env = make_project(tmp_path)
    spend(tmp_path, releases=3, charge="1/3")
    rc, out, err = _exit(["budget", "status", "--env", str(env), "--budget", "demo_events_user"], capsys)
    assert rc == 0, err
    assert "rho=0.333333" in out and "1/3" not in out and "exactly" not in out
    rc, out, err = _exit(["budget", "status", "--env", str(env), "--budget", "demo_events_user", "--json"], capsys)
    assert rc == 0 and '"1/3"' in out  # the exact fraction stays in the JSON for machines


def test_env_from_another_folder_resolves_against_the_env_files_root(tmp_path):
    project = tmp_path / "project"
    env = make_project(project)
    spend(project)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "warehouse").mkdir(parents=True)  # a decoy where a cwd-relative default would look
    relative_env = os.path.relpath(env, elsewhere)  # ../project/conf/envs/t.yaml
    proc = run_cli("budget", "status", "--env", relative_env, cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr
    assert "budget demo_events_user" in proc.stdout and "rel-00000" in proc.stdout
    # the same through $DP_SPARK_ENV
    proc = run_cli("budget", "history", "--budget", "demo_events_user", cwd=elsewhere,
                   extra_env={"DP_SPARK_ENV": str(env)})
    assert proc.returncode == 0 and "2 releases" in proc.stdout, proc.stderr
    # plan reads the same ledger for the budget left
    proc = run_cli("plan", "--env", relative_env, "--conf", str(AOV), "--group-size", "500", cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr
    assert "remaining now" in proc.stdout and "no ledger yet" not in proc.stdout
    # explore writes to the env's warehouse by default, never to the current folder
    proc = run_cli("explore", "--env", relative_env, "--conf", str(AOV), "--budgets", "0.5,1", cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr
    assert (project / "wh" / "explorer" / "aov_by_region_explorer.csv").is_file()
    assert list(elsewhere.iterdir()) == [elsewhere / "warehouse"] and not any((elsewhere / "warehouse").iterdir())


def test_explore_is_the_epsilon_explorer(tmp_path, capsys):
    rc, out, err = _exit(["explore", "--conf", str(AOV), "--group-sizes", "50,500", "--budgets", "0.25,1",
                          "--out", str(tmp_path)], capsys)
    assert rc == 0, err
    assert "smallest rho" in out and (tmp_path / "aov_by_region_explorer.csv").is_file()
    rc, out, _ = _exit(["explore", "--conf", str(MULTI), "--group-sizes", "500", "--out", str(tmp_path)], capsys)
    assert rc == 0 and "aov" in out  # a multi-statistic spec: its plan per statistic


# -- a closed pipe ----------------------------------------------------------------------------
@pytest.mark.parametrize("module,argv", [
    ("dp_spark.cli", ["budget", "history", "--budget", "demo_events_user"]),
    ("dp_spark.cli", ["budget", "status"]),
    ("dp_spark.cli", ["budget", "--env", "{env}", "history", "--budget", "demo_events_user"]),
])
def test_a_closed_pipe_ends_quietly(module, argv, tmp_path):
    env = make_project(tmp_path)
    spend(tmp_path, releases=1500, charge="0.001")  # far more output than a pipe buffer holds
    environ = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    environ.pop("DP_SPARK_LEDGER_URL", None)
    cmd = " ".join([sys.executable, "-m", module, *(a.format(env=env) for a in argv), "--env", str(env)])
    proc = subprocess.run(["bash", "-c", f"set -o pipefail; {cmd} 2>{tmp_path / 'err'} | head -1; "
                                         "echo \"status=${PIPESTATUS[0]}\""],
                          cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=120)
    err = (tmp_path / "err").read_text()
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err, err
    first, status = proc.stdout.splitlines()[0], proc.stdout.splitlines()[-1]
    assert first.startswith("budget demo_events_user")
    assert status in ("status=141", "status=0")  # 141: the reader left first (as with SIGPIPE)


# -- the docs -------------------------------------------------------------------------------
def test_docs_cli_describes_every_command_and_the_exit_codes():
    text = (ROOT / "docs" / "cli.md").read_text()
    for name in cli.COMMANDS:
        assert f"dp-spark {name}" in text, name
    for sub in BUDGET_SUBCOMMANDS:
        assert f"budget {sub}" in text, sub
    assert "DP_SPARK_ENV" in text and "## Exit codes" in text and "141" in text
    assert "click" in text  # why click


# -- validate: what publish would refuse, before Spark ---------------------------------------
def _registered_project(tmp_path: Path) -> tuple[Path, Path]:
    """A project whose conf/releases holds the AOV spec (pre-registered there)."""
    env = make_project(tmp_path)
    (tmp_path / "conf" / "releases").mkdir()
    spec = tmp_path / "conf" / "releases" / AOV.name
    shutil.copy(AOV, spec)
    return env, spec


def test_validate_checks_the_access_policy_for_the_principal(tmp_path, monkeypatch, capsys):
    env, spec = _registered_project(tmp_path)
    rc, out, err = _exit(["validate", "--env", str(env), "--conf", str(spec), "--principal", "publisher_bob"], capsys)
    assert rc == 0, err
    assert ": ok (aov_by_region" in out and "access: publisher_bob (--principal) may publish it (official)" in out
    assert "no ledger yet" in out and "input columns: not checked (--with-data" in out
    # an analyst may not publish officially; an unlisted principal gets nothing (default deny)
    rc, out, err = _exit(["validate", "--env", str(env), "--conf", str(spec), "--principal", "analyst_alice"], capsys)
    assert rc == 2 and "ok (" not in out
    assert err.startswith(f"dp-spark: error: {spec}: ") and "may not publish:official" in err
    rc, _, err = _exit(["validate", "--env", str(env), "--conf", str(spec), "--principal", "mallory"], capsys)
    assert rc == 2 and "not listed in the access policy" in err
    rc, out, err = _exit(["validate", "--env", str(env), "--conf", str(spec), "--principal", "analyst_alice",
                          "--mode", "exploration"], capsys)
    assert rc == 0 and "analyst_alice (--principal) may publish it (exploration)" in out, err
    # without --principal: the one a job here runs as ($DP_SPARK_PRINCIPAL on a test or local env)
    monkeypatch.setenv("DP_SPARK_PRINCIPAL", "analyst_alice")
    rc, _, err = _exit(["validate", "--env", str(env), "--conf", str(spec)], capsys)
    assert rc == 2 and "principal 'analyst_alice'" in err
    # a spec outside the registered folder is refused for an official release
    rc, _, err = _exit(["validate", "--env", str(env), "--conf", str(AOV), "--principal", "publisher_bob"], capsys)
    assert rc == 2 and "not pre-registered" in err
    assert not (tmp_path / "wh").exists()  # nothing created, no refusal audited


def test_validate_refuses_a_charge_that_does_not_fit_the_remaining_budget(tmp_path, capsys):
    env, spec = _registered_project(tmp_path)
    spend(tmp_path, releases=7)  # 7 x rho 0.25 of the monthly cap 2: 0.25 left, the AOV's charge fits
    argv = ["validate", "--env", str(env), "--conf", str(spec), "--principal", "publisher_bob"]
    rc, out, err = _exit(argv, capsys)
    assert rc == 0, err
    assert "remaining now zcdp(rho=0.25," in out and "after this release: zcdp(rho=0," in out
    spend_more = open_ledger(f"sqlite:{tmp_path / 'wh' / 'ledger.db'}")
    with spend_more as led:
        led.reserve("demo_events_user", "rel-extra", ZCDP("0.001"), "{}", principal="alice", code_version="v1",
                    release_family="dau_daily", owner_token="o")
    rc, out, err = _exit(argv, capsys)
    assert rc == 2 and "ok (" not in out
    assert f"dp-spark: error: {spec}: the charge" in err and "does not fit the remaining" in err
    rc, out, _ = _exit(["plan", "--env", str(env), "--conf", str(spec)], capsys)  # plan says the same
    assert rc == 0 and "REFUSED (does not fit)" in out
    with open_ledger(f"sqlite:{tmp_path / 'wh' / 'ledger.db'}") as led:
        assert len(led.audit_rows()) == 0  # validate wrote nothing


def test_validate_says_when_the_ledger_cannot_be_read_from_here(tmp_path, monkeypatch, capsys):
    """A ledger this machine cannot open (a deployment's PostgreSQL) is said, not a refusal;
    the charge is still checked against the whole cap."""
    env, spec = _registered_project(tmp_path)
    doc = yaml.safe_load(env.read_text())
    doc["ledger_url"] = "postgresql://dp_spark@127.0.0.1:1/dp_spark"  # nothing listens on port 1
    env.write_text(yaml.safe_dump(doc))
    for var in ("DP_SPARK_LEDGER_KEY", "DP_SPARK_LEDGER_KEY_FILE"):
        monkeypatch.delenv(var, raising=False)
    rc, out, err = _exit(["validate", "--env", str(env), "--conf", str(spec), "--principal", "publisher_bob"], capsys)
    assert rc == 0, err
    assert "not checked against the ledger, which cannot be read from here" in out and "fits the cap" in out
