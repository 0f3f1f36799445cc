# Databricks notebook source
# MAGIC %md
# MAGIC # Publish daily active users and average order value per region, with differential privacy
# MAGIC
# MAGIC This notebook publishes pre-registered releases through the engine. By default the two
# MAGIC releases of the demo data:
# MAGIC
# MAGIC * `conf/releases/dau_daily.yaml`: distinct users per day over a 30-day window;
# MAGIC * `conf/releases/aov_by_region.yaml`: the mean order value per region.
# MAGIC
# MAGIC Each release is charged once to its budget (`demo_events_user`) in the ledger; running the
# MAGIC notebook again returns the stored releases (a cache hit: no new noise, no new charge).
# MAGIC
# MAGIC **Widgets** (top of the notebook on Databricks; a job passes them as parameters):
# MAGIC
# MAGIC | widget | meaning | default | outside Databricks |
# MAGIC |---|---|---|---|
# MAGIC | `env` | environment file: Spark, warehouse, ledger, policies | `conf/envs/databricks.yaml` on Databricks, else `conf/envs/local.yaml` | `$DP_SPARK_ENV` |
# MAGIC | `spec` | release spec files, comma-separated | the two above | `$DP_SPARK_SPEC` |
# MAGIC | `date` | the run date (resolves `today`/`yesterday` in a spec's dates) | empty: today (UTC) | `$DP_SPARK_DATE` |
# MAGIC
# MAGIC Every output (release tables, statements, charts) goes to the env's warehouse, never the
# MAGIC repository folder. On Databricks the published cells are shown with `display()` and the
# MAGIC charts inline; as a plain script (`python notebooks/publish_dau_aov.py`) they are printed
# MAGIC and the charts written as PNG files under `<warehouse>/charts/`.

# COMMAND ----------

# MAGIC %md
# MAGIC ## Install (Databricks only)
# MAGIC The next cell installs the package from this repository (its parent folder) into the
# MAGIC notebook's Python; the cluster's own Spark and Delta are used. It is a `%pip` magic, so it
# MAGIC runs only on Databricks: as a plain script it is a comment, and the notebook tests skip it
# MAGIC by name and report it (`tests/evaluation/test_notebooks.py`). Locally, `make setup`
# MAGIC installed everything.

# COMMAND ----------

# MAGIC %pip install --quiet ..

# COMMAND ----------

if "dbutils" in globals():  # Databricks: restart Python so that what %pip installed is what is imported
    dbutils.library.restartPython()  # noqa: F821 - provided by Databricks

# COMMAND ----------

import os
import sys
from pathlib import Path

try:  # a plain script: the repo is the notebook's parent folder
    ROOT = Path(__file__).resolve().parent.parent
except NameError:  # Databricks: the working directory is the notebook's folder (Git folders)
    ROOT = Path(os.getcwd()).resolve().parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dp_spark.notebook import Notebook  # noqa: E402

nb = Notebook(globals(), root=ROOT)
ENV_FILE = nb.path(nb.widget("env", nb.default_env(), "Environment file", env_var="DP_SPARK_ENV"))
SPECS = [nb.path(s) for s in nb.values(nb.widget(
    "spec", "conf/releases/dau_daily.yaml,conf/releases/aov_by_region.yaml", "Release specs (comma-separated)",
    env_var="DP_SPARK_SPEC"))]
RUN_DATE = nb.widget("date", "", "Run date (YYYY-MM-DD, empty: today)", env_var="DP_SPARK_DATE").strip()

from datetime import date  # noqa: E402

from dp_spark.config import load_env, load_release_spec  # noqa: E402
from dp_spark.spark import get_or_create_session  # noqa: E402

env = load_env(ENV_FILE)
run_date = date.fromisoformat(RUN_DATE) if RUN_DATE else None
spark = globals().get("spark") or get_or_create_session(
    "dp_spark.notebook.publish", master=env.master, extra_conf=dict(env.spark_conf))
CHARTS = nb.output_dir(env, "charts")  # None: the warehouse is an object store, charts are only displayed
print(f"environment: {env.name} ({ENV_FILE}); warehouse: {env.warehouse}")
print("specs: " + ", ".join(str(s) for s in SPECS) + f"; run date: {run_date or 'today'}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Demo data
# MAGIC When a spec reads the env's demo dataset and it does not exist yet, synthetic events
# MAGIC (`dp_spark.demo_data.generate_events`) are written once as a Delta table at the location
# MAGIC the environment declares for it. Real datasets are never touched.

# COMMAND ----------

from dp_spark.delta.release_table import table_exists  # noqa: E402

specs = [load_release_spec(p, run_date=run_date) for p in SPECS]
demo = dict(env.demo)
dataset = demo.get("dataset", "demo_events")
if demo and any(s.dataset == dataset for s in specs):
    location = env.dataset_location(dataset)
    if not table_exists(spark, location):
        from dp_spark.demo_data import generate_events

        start = demo.get("start_date", date(2026, 11, 1))
        start = start if isinstance(start, date) else date.fromisoformat(str(start))
        n_users = int(demo.get("users", 20000))
        events = generate_events(
            spark, n_users=n_users, days=int(demo.get("days", 30)), start_date=start,
            seed=int(demo.get("seed", 7)), heavy_users=min(int(demo.get("heavy_users", 3)), n_users),
            heavy_rows=int(demo.get("heavy_rows", 10000)),
        )
        events.write.format("delta").mode("overwrite").save(location)
        print(f"generated the demo data at {location}")
    else:
        print(f"demo data present at {location}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Publish
# MAGIC The engine validates the specs, pins the input snapshot, reserves the budget exactly once,
# MAGIC bounds each user's contribution on the executors, adds the noise on the driver and writes
# MAGIC the Delta release tables.

# COMMAND ----------

import pandas as pd  # noqa: E402

from dp_spark.engine import Engine  # noqa: E402

# leaving the block waits for the ledger's Delta mirror, refreshed in the background
with Engine(env, spark=spark) as engine:
    results = [engine.publish(s) for s in specs]
for r in results:
    print(f"{r.family}: {r.status}, release {r.release_id[:12]}, table {r.table_path}")
nb.show(pd.DataFrame([{
    "family": r.family, "status": r.status, "release": r.release_id[:12], "table": r.table_path,
    "charged": str(r.charge) if r.charge is not None else "nothing (stored release)",
    "budget": r.budget_id, "remaining": str(r.budget_remaining)} for r in results]), "releases")

# COMMAND ----------

# MAGIC %md
# MAGIC ## The published values, with their accuracy
# MAGIC `ci_low`/`ci_high` is the interval at the release's confidence; `expected_abs_error` the
# MAGIC expected size of the noise. They cover the noise only: the bias from clipping and truncation
# MAGIC is measured in exploration (see `notebooks/explore_epsilon.py` and docs/accuracy.md).

# COMMAND ----------

from dp_spark.evaluation.utility import trend_differences  # noqa: E402

COLS = ["statistic", "key", "value", "ci_low", "ci_high", "expected_abs_error"]
cells = {}
for r in results:
    df = pd.DataFrame(list(r.rows))
    df = df[[c for c in COLS if c in df.columns] + [c for c in df.columns if c not in COLS and c.startswith("key_")]]
    cells[r.family] = df.sort_values([c for c in ("statistic", "key") if c in df.columns])
    nb.show(cells[r.family], f"{r.family}: published cells")

dau = next((r for r in results if any(row["statistic"] == "distinct_units" for row in r.rows)), None)
if dau is not None:
    changes = pd.DataFrame(trend_differences(dau.rows))
    if not changes.empty:
        nb.show(changes[["key", "value", "ci_low", "ci_high"]].tail(5),
                f"{dau.family}: day-over-day change (last 5 days)")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Charts
# MAGIC Inline on Databricks; written under `<warehouse>/charts/` when the warehouse is a file
# MAGIC system path (local, `/dbfs`, `/Volumes`). The caption states the charge (rho and the
# MAGIC (epsilon, delta) statement), the window and the confidence; a group too small for its
# MAGIC interval to say anything is marked.

# COMMAND ----------

from dp_spark.evaluation.charts import build_aov_figure, build_dau_figure, release_caption  # noqa: E402

charts_written = []
for r in results:
    stats = {row["statistic"] for row in r.rows}
    if "distinct_units" in stats:
        fig = build_dau_figure(r.rows, release_caption(r.rows, statistic="distinct_units"))
    elif "mean" in stats:
        fig = build_aov_figure(r.rows, release_caption(r.rows, statistic="mean"))
    else:
        print(f"{r.family}: no chart for statistics {sorted(stats)}")
        continue
    path = nb.figure(fig, None if CHARTS is None else CHARTS / f"{r.family}.png", r.family)
    if path:
        charts_written.append(path)
