"""One table of exit codes: docs/cli.md's is generated from dp_spark.cli.base.EXIT_CODES, every
status a command returns is in it, the commands' help lists no other, docs/deploy.md points at it."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

from dp_spark.cli.base import EXIT_CODES, docs_with_exit_codes

app = importlib.import_module("dp_spark.cli.app")  # the module (dp_spark.cli.app is also the group's name)

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "dp_spark" / "cli"


def test_docs_cli_exit_table_is_the_generated_one():
    text = (ROOT / "docs" / "cli.md").read_text()
    assert text == docs_with_exit_codes(text), (
        "docs/cli.md's exit-code table differs from dp_spark.cli.base.EXIT_CODES: regenerate it with "
        "docs_with_exit_codes")


def _literal_statuses(path: Path) -> set[int]:
    """Every integer a function of ``path`` returns or raises SystemExit with."""
    out: set[int] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        value = None
        if isinstance(node, ast.Return):
            value = node.value
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "SystemExit" and node.args:
            value = node.args[0]
        if isinstance(value, ast.Constant) and isinstance(value.value, int) and not isinstance(value.value, bool):
            out.add(value.value)
        if isinstance(value, ast.IfExp):
            out |= {v.value for v in (value.body, value.orelse) if isinstance(v, ast.Constant)
                    and isinstance(v.value, int)}
    return out


def test_every_status_a_command_returns_is_in_the_table():
    returned = set().union(*(_literal_statuses(p) for p in CLI.glob("*.py")))
    assert returned, "no exit status found: the scan is broken"
    assert returned <= set(EXIT_CODES), sorted(returned - set(EXIT_CODES))


def test_the_help_lists_the_same_codes():
    epilogs = {"dp-spark": app.app.epilog, "publish": app.PUBLISH_EPILOG, "refresh": app.REFRESH_EPILOG}
    for name, text in epilogs.items():
        listed = {int(m) for m in re.findall(r"^\s+(\d+)\s", text, re.M)}
        listed |= {int(m) for m in re.findall(r"(?:exit codes: |; )(\d+) ", text)}
        assert listed and listed <= set(EXIT_CODES), (name, listed)
    top = app.app.epilog
    for code in EXIT_CODES:
        if code != 141:
            assert re.search(rf"\b{code}\b", top), code


def test_docs_deploy_points_at_the_table_and_does_not_contradict_it():
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    assert 'docs/cli.md, "Exit codes"' in deploy
    assert "or 2 when a day failed" not in deploy
    # a failed day is 1 everywhere
    assert "1 when a day failed" in deploy and "refresh/backfill day failed" in EXIT_CODES[1]
