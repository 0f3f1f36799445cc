# Databricks notebook source
# MAGIC %md
# MAGIC # Choosing epsilon (or rho) together: the privacy/utility trade-off, before any release
# MAGIC
# MAGIC There is no "correct epsilon" without a query, a data distribution and a threat model. This
# MAGIC notebook shows, for the pre-registered releases, what error each budget buys for groups of
# MAGIC different sizes, and the smallest budget that meets a stated error target. It reads **no
# MAGIC data** (group sizes are public assumptions) and charges nothing: run it as often as you like.
# MAGIC
# MAGIC The same as a command: `python jobs/explore_epsilon.py --conf conf/releases/aov_by_region.yaml
# MAGIC --group-sizes 50,500,5000 --budgets 0.1,0.25,0.5,1,2 --target 0.05 --out explorer/`.
# MAGIC Paths come from the environment file (`conf/envs/local.yaml` or `$DP_SPARK_ENV`).

# COMMAND ----------

import os
import sys
from pathlib import Path

try:
    ROOT = Path(__file__).resolve().parent.parent
except NameError:  # Databricks Repos: the working directory is the notebook's folder
    ROOT = Path(os.getcwd()).resolve().parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ENV_FILE = os.environ.get("DP_SPARK_ENV", str(ROOT / "conf" / "envs" / "local.yaml"))

from dp_spark.config import load_env, load_release_spec  # noqa: E402
from dp_spark.evaluation import explorer  # noqa: E402
from dp_spark.evaluation.charts import explorer_chart  # noqa: E402

env = load_env(ENV_FILE)
OUT = Path(env.warehouse) / "explorer"
# The explorer needs no Spark; the ambient session (Databricks) is left alone.
spark = globals().get("spark")

GROUP_SIZES = [50, 500, 5000]
BUDGETS = [0.1, 0.25, 0.5, 1, 2]
TARGET = 0.05  # +-5% of the true value, at the spec's confidence

# COMMAND ----------

# MAGIC %md
# MAGIC ## Daily active users
# MAGIC A distinct-user count per day; each user may appear on all 30 days, so the L2 sensitivity of
# MAGIC the whole trend is sqrt(30) and each day's noise is that of the whole window's budget.

# COMMAND ----------

import pandas as pd  # noqa: E402

results = {}
for name, mean in (("dau_daily", None), ("aov_by_region", 40.0)):
    spec = load_release_spec(ROOT / "conf" / "releases" / f"{name}.yaml")
    rows = explorer.explore(spec, GROUP_SIZES, BUDGETS, assumed_mean=mean)
    stat = explorer.headline_statistic(spec)
    budget_name = "epsilon" if spec.charge.MEASURE == "pure_dp" else "rho"
    print(f"== {spec.name} ({stat}, {spec.charge.MEASURE}; configured {spec.charge})")
    print(explorer.format_table(rows, statistic=stat))
    smallest = {}
    for n in GROUP_SIZES:
        b = explorer.smallest_budget(spec, n, TARGET, assumed_mean=mean)
        smallest[n] = float(b.epsilon if budget_name == "epsilon" else b.rho)
        print(f"   smallest {budget_name} for +-{TARGET:.0%} with groups of {n:,}: {smallest[n]:.4g}")
    png = explorer_chart(
        rows, OUT / f"{spec.name}_explorer.png",
        f"{spec.name}: assumed public group sizes {GROUP_SIZES}, "
        + (f"assumed mean {mean}; " if mean is not None else "")
        + f"{spec.charge.MEASURE}; {float(spec.confidence):.0%} interval; no data read",
        statistic=stat, target=TARGET, error_column="rel_halfwidth")
    print(f"   chart: {png}")
    results[name] = (rows, smallest)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Reading the table
# MAGIC * The absolute error of a count does not depend on the group: the relative error does. A
# MAGIC   budget that is plenty for 5,000 users per day is useless for a segment of 50.
# MAGIC * Asking for a tiny epsilon "to be safe" makes small groups pure noise; asking for a large one
# MAGIC   weakens the guarantee for everybody. The smallest budget meeting the target for the
# MAGIC   *smallest group you must publish* is where the discussion should start.
# MAGIC * The mean's interval also depends on the count's noise (its denominator), which is why the
# MAGIC   engine splits the budget between the sum and the count.

# COMMAND ----------

summary = pd.DataFrame(
    [{"release": name, "group_size": n, "smallest_budget": b} for name, (_, sm) in results.items()
     for n, b in sm.items()])
print(summary.to_string(index=False))
