"""Cold-path import cost (issue 15): importing the engine or the CLI loads no SciPy.

SciPy is only needed for some accuracy figures (discrete Gaussian tails beyond sigma 4096, mean
accuracy) and the analytic Gaussian, so dp_spark.mechanisms.accuracy / calibration / mean import it
at first use. Each check runs in a fresh interpreter (this test process may already hold SciPy).
No timing assertions: the check is which modules are loaded, which does not depend on machine load.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> str:
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=str(ROOT), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout.strip()


@pytest.mark.parametrize("module", ["dp_spark.engine", "dp_spark.cli"])
def test_import_does_not_load_scipy(module):
    assert _run(f"import sys, {module}; print('scipy' in sys.modules)") == "False"


def test_scipy_loaded_at_first_use():
    # The lazy import still happens when a figure needs it: the Gaussian tail beyond the direct
    # range uses special.erfc, the analytic Gaussian uses special.ndtr / log_ndtr.
    code = (
        "import sys\n"
        "from dp_spark.mechanisms import accuracy, calibration\n"
        "assert 'scipy' not in sys.modules\n"
        "t = accuracy.discrete_gaussian_tail(10000.0, 5000)\n"
        "assert 'scipy' in sys.modules\n"
        "print(t > 0, calibration.analytic_gaussian_delta(1.0, 1.0) > 0)\n"
    )
    assert _run(code) == "True True"


def test_the_cli_loads_no_spark_no_engine_no_chart_library():
    """`dp-spark --help` and the Spark-free commands (plan, validate, budget) import neither
    pyspark, the engine nor matplotlib: the CLI imports those where a command needs them. (pydantic
    is loaded: the release spec is a pydantic model, and every command reads a spec or an env.)"""
    code = ("import sys, dp_spark.cli\n"
            "print(sorted(m for m in ('pyspark', 'dp_spark.engine', 'matplotlib') if m in sys.modules))")
    assert _run(code) == "[]"


def test_nothing_in_the_package_imports_the_cli():
    """Imports point down: the CLI (dp_spark/cli/) imports the engine, the ledger, the schedule;
    no other module of dp_spark imports the CLI, at module or function level."""
    import ast

    offenders = []
    for path in sorted((ROOT / "dp_spark").rglob("*.py")):
        if (ROOT / "dp_spark" / "cli") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if isinstance(node, ast.ImportFrom) and node.module == "dp_spark":
                names = [f"dp_spark.{a.name}" for a in node.names]
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names
                          if n == "dp_spark.cli" or n.startswith("dp_spark.cli.") or n.startswith("dp_spark.ledger.cli")]
    assert offenders == []
