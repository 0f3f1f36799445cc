"""The privacy core imports no pyspark (it runs on any driver, Spark Connect included)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "dp_spark"

# The core modules (DESIGN: "nothing above imports pyspark"). Each is imported if its file
# exists, so the test follows the tree as it grows; the first five must exist.
REQUIRED = ["dp_spark", "dp_spark.core.budget", "dp_spark.core.units", "dp_spark.core.events", "dp_spark.accountant"]
OPTIONAL = ["dp_spark.config", "dp_spark.errors"]


def _core_modules() -> list[str]:
    mods = list(REQUIRED)
    for name in OPTIONAL:
        if (PKG / (name.split(".", 1)[1] + ".py")).exists():
            mods.append(name)
    for sub in ("mechanisms", "spec"):
        for f in sorted((PKG / sub).glob("*.py")):
            mods.append(f"dp_spark.{sub}" if f.stem == "__init__" else f"dp_spark.{sub}.{f.stem}")
    return mods


def test_core_imports_without_pyspark():
    mods = _core_modules()
    assert "dp_spark.mechanisms.release" in mods and "dp_spark.mechanisms.mean" in mods
    assert "dp_spark.spec.release" in mods and "dp_spark.spec.schema" in mods
    code = (
        "import importlib, sys\n"
        f"for m in {mods!r}:\n"
        "    importlib.import_module(m)\n"
        "bad = sorted(m for m in sys.modules if m == 'pyspark' or m.startswith('pyspark.'))\n"
        # the spec layer does not reach pyspark through the secrets reader either
        "bad += [m for m in ('dp_spark.secrets',) if m in sys.modules]\n"
        "print('LOADED', bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=str(PKG.parent), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
