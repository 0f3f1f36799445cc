"""The API reference (docs/build_api.py, pdoc) builds, and documents every public module.

A public module without a module docstring fails; so does one without its page."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("build_api", ROOT / "docs" / "build_api.py")
build_api = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build_api)


def test_the_public_modules_are_found():
    mods = build_api.public_modules()
    assert "dp_spark" in mods and "dp_spark.api" in mods and "dp_spark.evaluation.charts" in mods
    assert not [m for m in mods if any(p.startswith("_") for p in m.split("."))]
    assert len(mods) >= 40


def test_every_public_module_has_a_docstring():
    assert build_api.undocumented() == []


def test_a_module_without_a_docstring_is_reported(tmp_path):
    pkg = tmp_path / "dp_spark"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""The package."""\n')
    (pkg / "sub" / "__init__.py").write_text("")                       # no docstring
    (pkg / "sub" / "good.py").write_text('"""Documented."""\nX = 1\n')
    (pkg / "bad.py").write_text("# a comment is not a docstring\nX = 1\n")
    (pkg / "_private.py").write_text("X = 1\n")                        # private: not checked
    assert build_api.undocumented(tmp_path) == ["dp_spark.bad", "dp_spark.sub"]


@pytest.mark.skipif(importlib.util.find_spec("pdoc") is None and not os.environ.get("CI"),
                    reason="pdoc is in the test extra (never skipped in CI)")
def test_the_reference_builds_with_a_page_per_public_module(tmp_path):
    out = tmp_path / "api"
    proc = subprocess.run([sys.executable, str(ROOT / "docs" / "build_api.py"), str(out)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "index.html").is_file()
    for mod in build_api.public_modules():
        parts = mod.split(".")
        page = out.joinpath(*parts[:-1], parts[-1] + ".html")
        assert page.is_file(), f"no page for {mod}"
    api = (out / "dp_spark" / "api.html").read_text()
    assert "ReleaseBuilder" in api and "plan_table" in api and "A Python API for notebooks" in api
    charts = (out / "dp_spark" / "evaluation" / "charts.html").read_text()
    assert "build_explorer_figure" in charts and "epsilon_at_delta" in charts
