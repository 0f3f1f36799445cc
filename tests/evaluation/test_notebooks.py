"""The notebooks run, against a throwaway env file, on both of their paths.

* as plain scripts in a subprocess (their own local Spark, no widgets: environment variables
  and defaults; tables printed, charts written as PNG under the env's warehouse):
  publish_dau_aov, explore_epsilon;
* as on Databricks, cell by cell (``# COMMAND ----------``) in one namespace holding a fake
  ``dbutils`` (widgets with a job's parameters, ``library.restartPython``), a ``display``
  that records what it is given, and for the Spark notebooks the ambient ``spark`` (the test
  session): every notebook. Markdown cells are skipped; ``%pip`` cells are skipped *by name*
  and printed as skipped (they run only on Databricks), and the test asserts that the
  install cell is the only cell skipped that is not markdown.

Each notebook reads its paths from the env; the env here points every path into ``tmp_path``
and asks for small demo data (2,000 users). Nothing may be written under the repository.
Slow: the subprocess ones start a JVM.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
TIMEOUT = 600
PRINCIPAL = "publisher_notebook_test"


def write_env(base: Path) -> Path:
    """The structure of conf/envs/local.yaml, every path inside ``base``."""
    local = yaml.safe_load((ROOT / "conf/envs/local.yaml").read_text())
    # governance: default deny; this env's publisher is named by $DP_SPARK_PRINCIPAL (run_notebook)
    pol = base / "conf" / "policies"
    pol.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "conf/policies/budgets.yaml", pol / "budgets.yaml")
    (pol / "access.yaml").write_text(yaml.safe_dump({
        "version": 1, "releases_dir": str(ROOT / "conf/releases"),
        "principals": {PRINCIPAL: {"roles": ["publisher"]}},
    }))
    env = dict(local)
    env.update({
        "name": "notebook-test",
        "spark": {"master": "local[2]", "conf": {"spark.driver.memory": "1g", "spark.sql.shuffle.partitions": "2"}},
        "warehouse": str(base / "wh"),
        "datasets": {"demo_events": "{warehouse}/input/demo_events"},
        "policies": str(pol / "budgets.yaml"),
        "lease_seconds": 5,
    })
    env["demo"] = {**local.get("demo", {}), "users": 2000, "heavy_users": 2, "heavy_rows": 2000}
    p = base / "conf" / "envs" / "test.yaml"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(yaml.safe_dump(env, sort_keys=False))
    return p


def run_notebook(name: str, env_file: Path, cwd: Path) -> subprocess.CompletedProcess:
    environ = {**os.environ, "DP_SPARK_ENV": str(env_file), "DP_SPARK_PRINCIPAL": PRINCIPAL,
               "PYSPARK_PYTHON": sys.executable,
               "PYSPARK_DRIVER_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    return subprocess.run([sys.executable, str(NOTEBOOKS / name)], capture_output=True, text=True,
                          timeout=TIMEOUT, env=environ, cwd=cwd)


ALL = ["publish_dau_aov.py", "explore_epsilon.py", "hashing_is_not_privacy.py"]
SEP = "\n# COMMAND ----------\n"
PIP_CELL = "%pip install --quiet .."


def cells(name: str) -> list[str]:
    text = (NOTEBOOKS / name).read_text()
    head, _, body = text.partition("\n")
    assert head == "# Databricks notebook source"
    return [c.strip("\n") for c in body.split(SEP)]


def magic(cell: str) -> str | None:
    """The magic of a cell whose lines are all ``# MAGIC`` lines (``%md``, ``%pip``...), else None."""
    lines = [ln for ln in cell.splitlines() if ln.strip()]
    if lines and all(ln.startswith("# MAGIC") for ln in lines):
        return lines[0][len("# MAGIC"):].strip().split(" ")[0]
    return None


class FakeWidgets:
    """dbutils.widgets: values a job passes as parameters; created widgets keep their default."""

    def __init__(self, params: dict[str, str]):
        self.params, self.created = dict(params), {}

    def _make(self, kind, name, default, *args):
        self.created[name] = (kind, default, args)

    def text(self, name, default, label=None):
        self._make("text", name, default, label)

    def dropdown(self, name, default, choices, label=None):
        assert default in choices
        self._make("dropdown", name, default, choices, label)

    def get(self, name):
        if name in self.params:
            return self.params[name]
        if name in self.created:
            return self.created[name][1]
        raise ValueError(f"InputWidgetNotDefined: {name}")  # as Databricks does


class FakeDbutils:
    def __init__(self, params):
        self.widgets = FakeWidgets(params)
        self.restarts = 0
        outer = self

        class Library:
            def restartPython(self):  # noqa: N802 - Databricks' name
                outer.restarts += 1

        self.library = Library()


def run_as_databricks(name: str, params: dict[str, str], **ambient) -> tuple[dict, FakeDbutils, list, list]:
    """Run a notebook's cells in order, as Databricks does, with a fake dbutils and display.
    Returns (namespace, dbutils, displayed objects, skipped cells)."""
    dbutils, displayed, skipped = FakeDbutils(params), [], []
    ns = {"__name__": "__main__", "dbutils": dbutils, "display": displayed.append, **ambient}
    for i, cell in enumerate(cells(name)):
        kind = magic(cell)
        if kind == "%md":
            continue
        if kind is not None:  # %pip and any other magic: Databricks only; skipped by name, visibly
            first = cell.splitlines()[0][len("# MAGIC"):].strip()
            print(f"[{name} cell {i}] SKIPPED (runs on Databricks only): {first}")
            skipped.append(first)
            continue
        exec(compile(cell, f"{name}[cell {i}]", "exec"), ns)  # noqa: S102 - our own notebook
    return ns, dbutils, displayed, skipped


def repo_outputs(since: float) -> list[str]:
    """Charts, Delta logs, ledgers and statements written under the repository since ``since``
    (a notebook's outputs go to the env's warehouse, never the repository folder)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in (".git", ".venv", ".jars", "__pycache__", ".pytest_cache")]
        for f in filenames:
            p = Path(dirpath) / f
            if (p.suffix in (".png", ".db", ".md", ".json") or "_delta_log" in p.parts) and \
                    p.stat().st_mtime >= since and p.suffix != ".py":
                if p.suffix in (".md", ".json") and "statements" not in p.parts:
                    continue  # docs and configs are edited by people; statements are outputs
                found.append(str(p.relative_to(ROOT)))
    return found


@pytest.mark.parametrize("name", ALL)
def test_notebooks_are_in_databricks_source_format(name):
    text = (NOTEBOOKS / name).read_text()
    assert text.splitlines()[0] == "# Databricks notebook source"
    assert text.count(SEP) >= 3
    assert 'globals().get("spark")' in text  # the ambient session is reused when there is one
    assert "DP_SPARK_ENV" in text
    compile(text, name, "exec")


@pytest.mark.parametrize("name", ALL)
def test_notebooks_have_widgets_display_and_a_pip_cell_that_runs_only_on_databricks(name):
    cs = cells(name)
    kinds = [magic(c) for c in cs]
    # one %pip cell, the repo's package, documented by the markdown cell just before it
    pip = [i for i, k in enumerate(kinds) if k == "%pip"]
    assert len(pip) == 1 and cs[pip[0]] == f"# MAGIC {PIP_CELL}"
    assert kinds[pip[0] - 1] == "%md" and "Databricks only" in cs[pip[0] - 1]
    # then a restart guarded by dbutils, before any import of the package
    assert cs[pip[0] + 1].startswith('if "dbutils" in globals():') and "restartPython()" in cs[pip[0] + 1]
    assert not any("dp_spark" in c for c in cs[:pip[0]] if magic(c) is None)
    assert [k for k in kinds if k is not None and k != "%md"] == ["%pip"]  # no other magic
    text = (NOTEBOOKS / name).read_text()
    assert 'nb.widget("env"' in text and "Notebook(globals()" in text
    assert "nb.show(" in text and "nb.figure(" in text
    assert "to_string(" not in text and ".savefig(" not in text  # through nb.show / nb.figure


@pytest.mark.parametrize("name", ["publish_dau_aov.py", "explore_epsilon.py"])
def test_notebooks_have_spec_and_date_widgets(name):
    text = (NOTEBOOKS / name).read_text()
    assert 'nb.widget(\n    "spec"' in text or 'nb.widget("spec"' in text
    assert 'nb.widget("date"' in text and "run_date=run_date" in text


@pytest.mark.slow
def test_explore_epsilon_notebook_runs(tmp_path):
    env_file = write_env(tmp_path)
    proc = run_notebook("explore_epsilon.py", env_file, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "smallest rho" in proc.stdout
    pngs = sorted((tmp_path / "wh" / "explorer").glob("*.png"))
    assert [p.name for p in pngs] == ["aov_by_region_explorer.png", "dau_daily_explorer.png"]
    assert all(p.stat().st_size > 1000 for p in pngs)


@pytest.mark.slow
def test_hashing_is_not_privacy_notebook_runs_with_the_ambient_session(spark, tmp_path, monkeypatch, capsys):
    """The Databricks path: the notebook finds ``spark``, ``dbutils`` and ``display`` in its
    globals and uses them (the session here is the test session, which also saves a JVM start)."""
    import pandas as pd
    from matplotlib.figure import Figure

    import numpy as np

    from dp_spark.mechanisms import samplers

    env_file = write_env(tmp_path)
    monkeypatch.delenv("DP_SPARK_ENV", raising=False)
    monkeypatch.chdir(NOTEBOOKS)
    # The notebook's 95% interval misses the true accuracy in 1 run of 40 by design (the best
    # threshold's accuracy IS the bound for the discrete Laplace): the test draws from the
    # seeded exact sampler (test mode only) so that what it checks is reproducible.
    monkeypatch.setattr(samplers, "default_source", lambda: samplers.SeededNoiseSource(32))
    ns, dbutils, displayed, skipped = run_as_databricks("hashing_is_not_privacy.py", {"env": str(env_file)},
                                                       spark=spark)
    assert ns["spark"] is spark  # the ambient session was used, not a new one
    assert skipped == [PIP_CELL] and dbutils.restarts == 1 and set(dbutils.widgets.created) == {"env"}
    out = capsys.readouterr().out
    assert "re-identified" in out and "best threshold attack accuracy" in out
    assert ns["reid_rate"] > 0.5  # most of the auxiliary people are re-identified via the hashed export
    assert len(ns["released"]) == len(ns["ZIPS"]) and "user_hash" not in ns["released"].columns
    # The membership attack makes an honest point: the threshold is chosen on the training
    # releases alone, scored on separate, held-out ones, and shown with its interval beside the bound.
    train_d, train_dp, test_d, test_dp = (ns[k] for k in ("train_d", "train_dp", "test_d", "test_dp"))
    assert len(train_d) == len(train_dp) == ns["TRAIN"] and len(test_d) == len(test_dp) == ns["HELD_OUT"]
    acc = ns["accuracy"]
    assert ns["chosen"] == max(ns["thresholds"], key=lambda t: acc(t, train_d, train_dp))
    assert ns["best"] == acc(ns["chosen"], test_d, test_dp)
    # the reported accuracy's interval holds it and reaches a value at or below the bound
    assert ns["ci_low"] <= ns["best"] <= ns["ci_high"] and ns["ci_high"] - ns["ci_low"] < 0.02
    assert ns["ci_low"] <= ns["bound"]
    assert ns["exact"] <= ns["bound"] + 1e-12  # no threshold beats the bound, exactly
    assert ns["bound"] == pytest.approx(np.exp(1) / (1 + np.exp(1)))
    line = next(ln for ln in out.splitlines() if ln.startswith("best threshold attack accuracy"))
    assert "held-out" in line and "95% interval" in line
    assert f"DP bound at epsilon=1.0: {ns['bound']:.1%}" in out
    assert sum(isinstance(d, pd.DataFrame) for d in displayed) == 2
    assert sum(isinstance(d, Figure) for d in displayed) == 1
    assert (tmp_path / "wh" / "charts" / "membership_overlap.png").stat().st_size > 1000


@pytest.mark.slow
def test_publish_dau_aov_notebook_runs(tmp_path):
    start = time.time()
    env_file = write_env(tmp_path)
    proc = run_notebook("publish_dau_aov.py", env_file, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "generated the demo data" in proc.stdout
    assert "dau_daily: published" in proc.stdout and "aov_by_region: published" in proc.stdout
    assert "published cells" in proc.stdout and "ci_low" in proc.stdout  # printed, not displayed
    charts = tmp_path / "wh" / "charts"
    for name in ("dau_daily.png", "aov_by_region.png"):
        data = (charts / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert repo_outputs(start) == []  # nothing written to the repository


@pytest.mark.slow
def test_publish_dau_aov_notebook_on_databricks(spark, tmp_path, monkeypatch, capsys):
    """The Databricks path: widgets (given as a job's parameters), the ambient session,
    display() of the published cells and of the charts, the %pip cell skipped by name."""
    import pandas as pd
    from matplotlib.figure import Figure

    start = time.time()
    env_file = write_env(tmp_path)
    monkeypatch.setenv("DP_SPARK_PRINCIPAL", PRINCIPAL)
    monkeypatch.delenv("DP_SPARK_ENV", raising=False)
    monkeypatch.chdir(NOTEBOOKS)  # Databricks runs a notebook in its folder
    ns, dbutils, displayed, skipped = run_as_databricks(
        "publish_dau_aov.py", {"env": str(env_file), "date": "2026-11-30"}, spark=spark)
    out = capsys.readouterr().out
    assert skipped == [PIP_CELL] and f"SKIPPED (runs on Databricks only): {PIP_CELL}" in out
    assert dbutils.restarts == 1
    w = dbutils.widgets.created
    assert set(w) == {"env", "spec", "date"} and all(kind == "text" for kind, *_ in w.values())
    assert w["spec"][1] == "conf/releases/dau_daily.yaml,conf/releases/aov_by_region.yaml"
    assert ns["spark"] is spark and ns["ENV_FILE"] == env_file and str(ns["run_date"]) == "2026-11-30"
    tables = [d for d in displayed if isinstance(d, pd.DataFrame)]
    figures = [d for d in displayed if isinstance(d, Figure)]
    assert len(figures) == 2  # the DAU trend and the AOV bars, inline
    published = [d for d in tables if "ci_low" in d.columns and "statistic" in d.columns]
    assert {frozenset(d["statistic"]) for d in published} >= {frozenset({"distinct_units"})}
    assert any("mean" in set(d["statistic"]) for d in published)
    assert "to_string" not in out and "published cells" in out
    for r in ns["results"]:
        assert str(tmp_path) in r.table_path
    assert sorted(Path(p).name for p in ns["charts_written"]) == ["aov_by_region.png", "dau_daily.png"]
    assert all(str(p).startswith(str(tmp_path / "wh" / "charts")) for p in ns["charts_written"])
    assert repo_outputs(start) == []


def test_explore_epsilon_notebook_on_databricks(tmp_path, monkeypatch, capsys):
    """No Spark needed: widgets, display of tables and figures (epsilon beside rho, the
    configured charge), a multi-statistic spec shown as its plan and a panel per statistic."""
    import pandas as pd
    from matplotlib.figure import Figure

    env_file = write_env(tmp_path)
    monkeypatch.delenv("DP_SPARK_ENV", raising=False)
    monkeypatch.chdir(NOTEBOOKS)
    ns, dbutils, displayed, skipped = run_as_databricks("explore_epsilon.py", {
        "env": str(env_file),
        "spec": "conf/releases/aov_by_region.yaml, conf/releases/orders_by_day_region.yaml",
        "budgets": "0.1,0.25,1", "group_sizes": "50,5000"})
    assert skipped == [PIP_CELL] and "SKIPPED" in capsys.readouterr().out
    assert set(dbutils.widgets.created) == {"env", "spec", "date", "group_sizes", "budgets", "target"}
    figures = [d for d in displayed if isinstance(d, Figure)]
    assert len(figures) == 2  # the AOV explorer, and the multi-statistic spec's: one panel per statistic
    panels = [a.get_title() for a in figures[1].axes]
    assert panels == ["users (distinct_units)", "orders (count)", "revenue (sum)", "aov (mean)",
                      "order_sd (stddev)", "median_order (quantile)"]
    (legend,) = figures[1].legends  # one legend for the panels, headed by the figure's title
    assert "orders_by_day_region" in legend.get_title().get_text()
    ax = figures[0].axes[0]
    assert ax.child_axes and "epsilon" in ax.child_axes[0].get_xlabel()  # epsilon at the budget's delta
    assert any("configured charge: rho = 0.25" in ln.get_label() for ln in ax.get_lines())
    assert any("says nothing" in t.get_text() for t in ax.texts)  # groups of 50 cannot be read
    plans = [d for d in displayed if isinstance(d, pd.DataFrame) and "interval_half_width" in d.columns]
    assert len(plans) == 1 and set(plans[0]["statistic"]) >= {"aov", "median_order"}
    assert list(ns["results"]) == ["aov_by_region", "orders_by_day_region"]
    # the interval is shown as published, cut to the clamp range: never value +- beyond [0, 500]
    tables = [d for d in displayed if isinstance(d, pd.DataFrame) and "clipped" in d.columns]
    aov = tables[0]
    assert (aov["ci_low"] >= 0).all() and (aov["ci_high"] <= 500).all() and aov["clipped"].any()
    for name in ("aov_by_region", "orders_by_day_region"):
        assert (tmp_path / "wh" / "explorer" / f"{name}_explorer.png").stat().st_size > 1000


def test_notebook_outputs_never_go_to_the_repo_on_databricks(tmp_path):
    from dp_spark.config import load_env
    from dp_spark.errors import ConfigError
    from dp_spark.notebook import Notebook

    env = load_env(write_env(tmp_path))
    nb = Notebook({"dbutils": FakeDbutils({}), "display": print}, root=ROOT)
    assert nb.output_dir(env, "charts") == tmp_path / "wh" / "charts"
    inside = load_env(ROOT / "conf/envs/local.yaml")  # warehouse/ under the repo
    with pytest.raises(ConfigError, match="inside the repository"):
        nb.output_dir(inside, "charts")
    assert Notebook({}, root=ROOT).output_dir(inside, "charts") == ROOT / "warehouse" / "charts"  # local: allowed

    class Remote:
        warehouse = "s3://bucket/wh"

    assert nb.output_dir(Remote(), "charts") is None  # an object store: charts only displayed
    Remote.warehouse = "dbfs:/mnt/wh"
    assert nb.output_dir(Remote(), "charts") == Path("/dbfs/mnt/wh/charts")


def test_notebook_widgets_locally_read_the_environment(monkeypatch):
    from dp_spark.notebook import Notebook

    nb = Notebook({}, root=ROOT)
    assert not nb.on_databricks and nb.default_env() == "conf/envs/local.yaml"
    monkeypatch.setenv("DP_SPARK_SPEC", "a.yaml, b.yaml")
    assert nb.values(nb.widget("spec", "x.yaml", env_var="DP_SPARK_SPEC")) == ["a.yaml", "b.yaml"]
    assert nb.widget("date", "", env_var="DP_SPARK_DATE_UNSET") == ""
    assert nb.path("conf/x.yaml") == ROOT / "conf/x.yaml" and nb.path("/abs/x.yaml") == Path("/abs/x.yaml")
