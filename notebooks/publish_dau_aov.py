# Databricks notebook source
# MAGIC %md
# MAGIC # Publish daily active users and average order value per region, with differential privacy
# MAGIC
# MAGIC This notebook publishes the two pre-registered releases of the demo data through the engine:
# MAGIC
# MAGIC * `conf/releases/dau_daily.yaml`: distinct users per day over a 30-day window;
# MAGIC * `conf/releases/aov_by_region.yaml`: the mean order value per region.
# MAGIC
# MAGIC Each release is charged once to the budget `demo_events_user` in the ledger; running the
# MAGIC notebook again returns the stored releases (a cache hit: no new noise, no new charge).
# MAGIC Every path comes from the environment file (`conf/envs/local.yaml` by default, or the file
# MAGIC named by the `DP_SPARK_ENV` environment variable). It runs in Databricks (with the ambient
# MAGIC `spark`) and as a plain script: `python notebooks/publish_dau_aov.py`.

# COMMAND ----------

import os
import sys
from pathlib import Path

try:  # a plain script: the repo is the notebook's parent folder
    ROOT = Path(__file__).resolve().parent.parent
except NameError:  # Databricks: the working directory is the notebook's folder (Repos)
    ROOT = Path(os.getcwd()).resolve().parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ENV_FILE = os.environ.get("DP_SPARK_ENV", str(ROOT / "conf" / "envs" / "local.yaml"))

from dp_spark.config import load_env, load_release_spec  # noqa: E402
from dp_spark.spark import get_or_create_session  # noqa: E402

env = load_env(ENV_FILE)
spark = globals().get("spark") or get_or_create_session(
    "dp_spark.notebook.publish", master=env.master, extra_conf=dict(env.spark_conf))
print(f"environment: {env.name} ({ENV_FILE})")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Demo data
# MAGIC Synthetic events (`dp_spark.demo_data.generate_events`), written once as a Delta table at the
# MAGIC location the environment declares for the `demo_events` dataset.

# COMMAND ----------

from datetime import date  # noqa: E402

from dp_spark.release.writer import table_exists  # noqa: E402

demo = dict(env.demo)
dataset = demo.get("dataset", "demo_events")
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

from dp_spark.engine import Engine  # noqa: E402

dau_spec = load_release_spec(ROOT / "conf" / "releases" / "dau_daily.yaml")
aov_spec = load_release_spec(ROOT / "conf" / "releases" / "aov_by_region.yaml")
engine = Engine(env, spark=spark)
dau = engine.publish(dau_spec)
aov = engine.publish(aov_spec)
for r in (dau, aov):
    print(f"{r.family}: {r.status}, release {r.release_id[:12]}, table {r.table_path}, "
          f"charged {r.charge if r.charge is not None else 'nothing (stored release)'}; "
          f"remaining in {r.budget_id}: {r.budget_remaining}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## The published values, with their accuracy
# MAGIC `ci_low`/`ci_high` is the interval at the release's confidence; `expected_abs_error` the
# MAGIC expected size of the noise. They cover the noise only: the bias from clipping and truncation
# MAGIC is measured in exploration (see `notebooks/explore_epsilon.py` and docs/accuracy.md).

# COMMAND ----------

import pandas as pd  # noqa: E402

from dp_spark.evaluation.utility import trend_differences  # noqa: E402

cols = ["statistic", "key", "value", "ci_low", "ci_high", "expected_abs_error"]
dau_rows = sorted((r for r in dau.rows if r["statistic"] == "distinct_units"), key=lambda r: r["key"])
aov_rows = sorted((r for r in aov.rows if r["statistic"] == "mean"), key=lambda r: r["key"])
print(pd.DataFrame(dau_rows)[cols].head(10).to_string(index=False))
print(pd.DataFrame(aov_rows)[cols].to_string(index=False))
changes = trend_differences(dau.rows)
print("day-over-day change of DAU (last 5 days):")
print(pd.DataFrame(changes)[["key", "value", "ci_low", "ci_high"]].tail(5).to_string(index=False))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Charts
# MAGIC Written beside the release tables (under `<output_root>/charts/` for a local warehouse, else
# MAGIC under `<warehouse>/charts/`), with the charge and the window in the caption.

# COMMAND ----------

from dp_spark.evaluation.charts import aov_chart, dau_trend_chart, release_caption  # noqa: E402


def chart_dir(table_path: str) -> Path:
    if "://" not in table_path:
        return Path(table_path).parent / "charts"
    return Path(env.warehouse) / "charts"


dau_png = dau_trend_chart(dau.rows, chart_dir(dau.table_path) / f"{dau.family}.png",
                          release_caption(dau.rows, statistic="distinct_units"))
aov_png = aov_chart(aov.rows, chart_dir(aov.table_path) / f"{aov.family}.png",
                    release_caption(aov.rows, statistic="mean"))
print(f"wrote {dau_png}")
print(f"wrote {aov_png}")
