"""docs/tutorial.md works as written: its fenced code blocks (bash and python) run in order,
in a copy of the repository, and each must succeed.

The copy holds the repository's files (tracked and not ignored), with ``.venv`` and ``.jars``
linked to this checkout's (what ``make setup`` made), so the tutorial's relative paths
(``.venv/bin/dp-spark``, ``conf/envs/local.yaml``, ``warehouse/``) land in the copy: its own
warehouse and ledger, thrown away after. The copy's ``conf/envs/local.yaml`` asks for less
memory and small demo data (2,000 users); nothing else differs from what a reader runs.

* ``bash`` blocks run with ``bash -e -o pipefail``, from the copy's root;
* ``python`` blocks run as scripts with this interpreter, from the copy's root (each block
  is self-contained);
* a block whose fence reads ```` ```bash skip-test ```` is not run: only the set-up of a fresh
  machine (``git clone``, ``cd``, ``make setup``) may be, and the test says which it skipped.

The reader is not in test mode: ``DP_SPARK_TEST_MODE`` and ``DP_SPARK_PRINCIPAL`` are removed
from the blocks' environment (official mode, the OS user as on the ``local`` env).

The tutorial leaves the reader's own spec in ``conf/releases/`` (its pre-registration): after the
blocks, the suite's checks of the shipped specs (:data:`SPEC_CHECKS`) run in the same copy and
must pass, so ``make test`` stays green after the tutorial. They iterate the manifest
``tests/shipped_specs.py``, never the folder; a guard below keeps every other test off the
folder too.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorial.md"
FAMILY = "tutorial_orders_by_region"
FENCE = re.compile(r"^```([A-Za-z0-9_-]*)([^\n]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
SKIP_MARK = "skip-test"
# the only commands a skipped block may hold: setting up a fresh machine
SKIPPABLE = ("git clone ", "cd ", "make setup")
MAX_SKIPPED = 1
TIMEOUT = 900
#: the suite's checks of every shipped spec: run again in the copy, after the tutorial
SPEC_CHECKS = (
    "tests/unit/test_spec_model.py::test_every_shipped_spec_validates_and_points_at_the_schema",
    "tests/unit/test_golden_release_ids.py",
    "tests/unit/test_one_path.py::test_plan_and_explorer_on_every_shipped_spec",
    "tests/docs/test_tutorial.py::test_no_test_reads_the_releases_folder_itself",
)
# a test that lists the repository's conf/releases folder (instead of tests/shipped_specs.py)
_LISTS_RELEASES = re.compile(r"ROOT\b.*releases.*\.(?:r?glob|iterdir)\(|listdir\(.*ROOT.*releases")


def blocks(text: str) -> list[tuple[str, bool, str]]:
    """(language, skipped, code) of every fenced block, in order."""
    out = []
    for m in FENCE.finditer(text):
        lang, info, code = m.group(1), m.group(2).split(), m.group(3)
        out.append((lang, SKIP_MARK in info, code))
    return out


def test_the_tutorial_blocks_are_bash_or_python_and_few_are_skipped():
    bs = blocks(TUTORIAL.read_text())
    assert len(bs) >= 10
    assert {lang for lang, _, _ in bs} == {"bash", "python"}, "every block is bash or python, named"
    skipped = [code for _, skip, code in bs if skip]
    assert 1 <= len(skipped) <= MAX_SKIPPED
    for code in skipped:
        for line in code.splitlines():
            cmd = line.split("#")[0].strip()
            assert not cmd or cmd.startswith(SKIPPABLE), f"a skipped block may only set up the machine: {line!r}"
    # a fence's info string is the language, or the language and the marker: no other spelling
    infos = {m.group(2).strip() for m in FENCE.finditer(TUTORIAL.read_text())}
    assert infos <= {"", SKIP_MARK}, infos
    assert TUTORIAL.read_text().count(SKIP_MARK) == len(skipped)


def test_the_commands_the_tutorial_uses_exist():
    text = TUTORIAL.read_text()
    for cmd in ("generate-demo", "validate", "plan", "publish", "budget status", "budget history"):
        assert f"dp-spark {cmd}" in text
    help_text = subprocess.run([str(Path(sys.executable).parent / "dp-spark"), "--help"], capture_output=True,
                               text=True, timeout=120).stdout
    for cmd in ("publish", "plan", "validate", "budget", "generate-demo"):
        assert re.search(rf"^\s+{re.escape(cmd)}\s", help_text, re.MULTILINE), f"dp-spark {cmd} is gone"


def test_no_test_reads_the_releases_folder_itself():
    """Only the manifest names the shipped specs: a user's own spec in conf/releases/ (the
    tutorial's) is never picked up by a test that lists the folder."""
    offenders = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for no, line in enumerate(path.read_text().splitlines(), 1):
            if _LISTS_RELEASES.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{no}: {line.strip()}")
    assert not offenders, "list the shipped specs with tests.shipped_specs.shipped_spec_paths():\n" + \
        "\n".join(offenders)
    listing = ".glob"
    sample = f"for p in (ROOT / 'conf' / 'releases'){listing}('*.yaml'):"
    assert _LISTS_RELEASES.search(sample)  # the guard bites


def test_the_manifest_names_the_shipped_specs():
    from tests.shipped_specs import SHIPPED_SPECS, shipped_spec_paths

    paths = shipped_spec_paths()
    assert len(paths) == len(set(SHIPPED_SPECS)) >= 5 and all(p.is_file() for p in paths)
    tracked = subprocess.run(["git", "ls-files", "conf/releases"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    if tracked:  # a git checkout: every shipped spec is tracked (a user's may be too)
        assert {f"conf/releases/{n}" for n in SHIPPED_SPECS} <= set(tracked)


def copy_repo(dest: Path) -> Path:
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.splitlines()
    for rel in files:
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    for linked in (".venv", ".jars"):
        if (ROOT / linked).exists():
            (dest / linked).symlink_to(ROOT / linked)
    env_file = dest / "conf" / "envs" / "local.yaml"
    env = yaml.safe_load(env_file.read_text())
    env["spark"] = {"master": "local[2]", "conf": {"spark.driver.memory": "1g", "spark.sql.shuffle.partitions": "2"}}
    env["demo"] = {**env.get("demo", {}), "users": 2000, "heavy_users": 2, "heavy_rows": 2000}
    env_file.write_text(yaml.safe_dump(env, sort_keys=False))
    return dest


@pytest.mark.slow
def test_the_tutorial_runs_as_written(tmp_path, capsys):
    repo = copy_repo(tmp_path / "dp_spark")
    in_checkout = ROOT / "warehouse" / "statements" / f"{FAMILY}.md"
    existed = in_checkout.exists()
    environ = {k: v for k, v in os.environ.items() if k not in ("DP_SPARK_TEST_MODE", "DP_SPARK_PRINCIPAL",
                                                                   "DP_SPARK_ENV", "PYTEST_CURRENT_TEST")}
    environ.update({"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                    "SPARK_LOCAL_IP": environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
                    "PATH": f"{Path(sys.executable).parent}:{environ.get('PATH', '')}"})
    ran, skipped, outputs = 0, [], []
    for i, (lang, skip, code) in enumerate(blocks(TUTORIAL.read_text())):
        if skip:
            skipped.append(code.splitlines()[0])
            print(f"[tutorial block {i}] SKIPPED ({SKIP_MARK}): {code.splitlines()[0]}")
            continue
        if lang == "bash":
            cmd = ["bash", "-e", "-o", "pipefail", "-c", code]
        else:
            script = repo / f".tutorial_block_{i}.py"
            script.write_text(code)
            cmd = [sys.executable, str(script)]
        proc = subprocess.run(cmd, cwd=repo, env=environ, capture_output=True, text=True, timeout=TIMEOUT)
        outputs.append(proc.stdout)
        assert proc.returncode == 0, (f"tutorial block {i} ({lang}) failed with exit {proc.returncode}:\n{code}\n"
                                      f"--- stdout:\n{proc.stdout[-4000:]}\n--- stderr:\n{proc.stderr[-4000:]}")
        ran += 1
    assert ran >= 10 and len(skipped) == 1 and skipped[0].startswith("git clone")
    out = "\n".join(outputs)
    # what the tutorial says the reader sees
    assert "demo_events_user" in out and "rho" in out and "epsilon" in out
    statement = repo / "warehouse" / "statements" / f"{FAMILY}.md"
    assert statement.is_file() and "user" in statement.read_text()
    assert (repo / "warehouse" / "releases" / FAMILY).is_dir()
    assert (repo / "warehouse" / "ledger.db").is_file()
    assert in_checkout.exists() == existed  # the copy's warehouse, never the checkout's
    # the reader's spec is in conf/releases/, headed like the shipped ones (the editor's schema)
    own = repo / "conf" / "releases" / f"{FAMILY}.yaml"
    assert own.read_text().splitlines()[0] == "# yaml-language-server: $schema=../release-spec.schema.json"
    # ... and the suite's checks of the shipped specs still pass beside it (make test stays green)
    checks = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SPEC_CHECKS],
                            cwd=repo, env={**environ, "DP_SPARK_TEST_MODE": "1"}, capture_output=True, text=True,
                            timeout=TIMEOUT)
    assert checks.returncode == 0, f"the spec checks fail after the tutorial:\n{checks.stdout[-4000:]}"
    assert " passed" in checks.stdout and "failed" not in checks.stdout
