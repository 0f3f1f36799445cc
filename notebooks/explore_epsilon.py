# Databricks notebook source
# MAGIC %md
# MAGIC # Choosing epsilon (or rho) together: the privacy/utility trade-off, before any release
# MAGIC
# MAGIC There is no "correct epsilon" without a query, a data distribution and a threat model. This
# MAGIC notebook shows, for pre-registered releases, what error each budget buys for groups of
# MAGIC different sizes, and the smallest budget that meets a stated error target. It reads **no
# MAGIC data** (group sizes are public assumptions) and charges nothing: run it as often as you like.
# MAGIC
# MAGIC **Widgets** (on Databricks; outside it the environment variable, else the default):
# MAGIC
# MAGIC | widget | meaning | default | outside Databricks |
# MAGIC |---|---|---|---|
# MAGIC | `env` | environment file (its budget policies give each budget's delta) | `conf/envs/databricks.yaml` on Databricks, else `conf/envs/local.yaml` | `$DP_SPARK_ENV` |
# MAGIC | `spec` | release spec files, comma-separated | `dau_daily.yaml`, `aov_by_region.yaml` | `$DP_SPARK_SPEC` |
# MAGIC | `date` | the run date (resolves `today`/`yesterday` in a spec's dates) | empty: today | `$DP_SPARK_DATE` |
# MAGIC | `group_sizes` | assumed rows per group | `50,500,5000` | `$DP_SPARK_GROUP_SIZES` |
# MAGIC | `budgets` | rho (zCDP spec) or epsilon (pure-DP spec) to try | `0.1,0.25,0.5,1,2` | `$DP_SPARK_BUDGETS` |
# MAGIC | `target` | relative half-width of the interval to reach | `0.05` (+-5%) | `$DP_SPARK_TARGET` |
# MAGIC
# MAGIC The same as a command: `dp-spark explore --conf conf/releases/aov_by_region.yaml
# MAGIC --group-sizes 50,500,5000 --budgets 0.1,0.25,0.5,1,2 --target 0.05`, or `dp-spark plan` for
# MAGIC one group size. Charts are shown inline on Databricks and written under
# MAGIC `<warehouse>/explorer/` when the warehouse is a file path.

# COMMAND ----------

# MAGIC %md
# MAGIC ## Install (Databricks only)
# MAGIC The next cell installs the package from this repository (its parent folder). It is a `%pip`
# MAGIC magic: it runs only on Databricks; as a plain script it is a comment, and the notebook
# MAGIC tests skip it by name and report it. Locally, `make setup` installed everything.

# COMMAND ----------

# MAGIC %pip install --quiet ..

# COMMAND ----------

if "dbutils" in globals():  # Databricks: restart Python so that what %pip installed is what is imported
    dbutils.library.restartPython()  # noqa: F821 - provided by Databricks

# COMMAND ----------

import os
import sys
from pathlib import Path

try:
    ROOT = Path(__file__).resolve().parent.parent
except NameError:  # Databricks Git folders: the working directory is the notebook's folder
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
GROUP_SIZES = [int(x) for x in nb.values(nb.widget("group_sizes", "50,500,5000", "Assumed group sizes",
                                                    env_var="DP_SPARK_GROUP_SIZES"))]
BUDGETS = [float(x) for x in nb.values(nb.widget("budgets", "0.1,0.25,0.5,1,2", "Budgets to try (rho or epsilon)",
                                                  env_var="DP_SPARK_BUDGETS"))]
TARGET = float(nb.widget("target", "0.05", "Target relative half-width", env_var="DP_SPARK_TARGET"))

from datetime import date  # noqa: E402

from dp_spark.config import load_env, load_release_spec  # noqa: E402
from dp_spark.evaluation import explorer  # noqa: E402
from dp_spark.evaluation.charts import build_explorer_figure  # noqa: E402
from dp_spark.ledger.policy import load_policies  # noqa: E402

env = load_env(ENV_FILE)
policies = load_policies(env.policies)
run_date = date.fromisoformat(RUN_DATE) if RUN_DATE else None
OUT = nb.output_dir(env, "explorer")  # None: the warehouse is an object store, charts are only displayed
# The explorer needs no Spark; the ambient session (Databricks) is left alone.
spark = globals().get("spark")
print(f"environment: {env.name} ({ENV_FILE}); group sizes {GROUP_SIZES}; budgets {BUDGETS}; "
      f"target +-{TARGET:.0%}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Error against budget, per group size
# MAGIC For daily active users (a distinct-user count per day; each user may appear on all 30 days,
# MAGIC so the L2 sensitivity of the whole trend is sqrt(30) and each day's noise is that of the whole
# MAGIC window's budget) and the average order value (a noisy sum over a noisy count). The chart
# MAGIC shows rho with the epsilon of the (epsilon, delta) statement at the budget's delta above it,
# MAGIC marks the spec's configured charge, and notes a group size too small for the interval to
# MAGIC say anything. An interval that reaches the statistic's range (a mean held to [0, 500], a
# MAGIC count at 0) is cut there, as the engine publishes it: the table shows the interval itself
# MAGIC (`ci_low`, `ci_high`, `clipped`) and the chart draws such points hollow. A multi-statistic
# MAGIC spec gets its plan and one panel per statistic (a spread, whose assumed true value is 0, in
# MAGIC absolute error).

# COMMAND ----------

import pandas as pd  # noqa: E402

from dp_spark.errors import DpSparkError  # noqa: E402

results = {}
for path in SPECS:
    spec = load_release_spec(path, run_date=run_date)
    policy = policies.get(spec.budget_id)
    multi = getattr(spec, "metric", None) is None  # a multi-statistic spec: every statistic, one panel each
    if multi:  # its plan first, as dp-spark plan prints it
        from dp_spark.api import plan_table

        plan = pd.DataFrame(plan_table(spec, budget_policy=policy))
        nb.show(plan[["statistic", "kind", "mechanism", "share_of_charge", "group_size", "expected_abs_error",
                      "interval_half_width", "epsilon", "delta"]],
                f"== {spec.name}: plan per statistic (multi-statistic spec, as dp-spark plan prints it)")
    stats = [s.name for s in spec.statistics] if multi else [explorer.headline_statistic(spec)]
    measure = spec.charge.MEASURE
    budget_name = "epsilon" if measure == "pure_dp" else "rho"
    configured = float(spec.charge.epsilon if measure == "pure_dp" else spec.charge.rho)
    delta = None if policy is None or policy.statement_delta is None else float(policy.statement_delta)
    rows = explorer.explore(spec, GROUP_SIZES, BUDGETS)
    table = pd.DataFrame([r for r in rows if r["statistic"] in stats])
    nb.show(table[["statistic", "budget", "group_size", "noise_stddev", "expected_abs_error", "ci_low", "ci_high",
                   "clipped", "rel_halfwidth"]],
            f"== {spec.name} ({', '.join(stats)}, {measure}; configured {budget_name} = {configured:g}; "
            "clipped: the interval reaches the statistic's range)")
    smallest = {}
    for stat in stats:
        for n in GROUP_SIZES:
            try:
                b = explorer.smallest_budget(spec, n, TARGET, statistic=stat)
            except DpSparkError as exc:  # e.g. a spread whose assumed true value is 0: no relative target
                print(f"   {stat}: no smallest {budget_name} for groups of {n:,} ({exc})")
                continue
            smallest[(stat, n) if multi else n] = float(b.epsilon if budget_name == "epsilon" else b.rho)
            print(f"   {stat}: smallest {budget_name} for +-{TARGET:.0%} with groups of {n:,}: "
                  f"{smallest[(stat, n) if multi else n]:.4g}")
    fig = build_explorer_figure(
        rows, f"{spec.name}: assumed public group sizes {GROUP_SIZES}; {measure}; "
        f"{float(spec.confidence):.0%} interval; no data read", statistic=stats if multi else stats[0],
        target=TARGET, error_column="rel_halfwidth", configured=configured, delta=delta)
    nb.figure(fig, None if OUT is None else OUT / f"{spec.name}_explorer.png", spec.name)
    results[spec.name] = (rows, smallest)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Reading the chart
# MAGIC * The absolute error of a count does not depend on the group: the relative error does. A
# MAGIC   budget that is plenty for 5,000 users per day is useless for a segment of 50.
# MAGIC * Asking for a tiny epsilon "to be safe" makes small groups pure noise; asking for a large one
# MAGIC   weakens the guarantee for everybody. The smallest budget meeting the target for the
# MAGIC   *smallest group you must publish* is where the discussion should start.
# MAGIC * The mean's interval also depends on the count's noise (its denominator), which is why the
# MAGIC   engine splits the budget between the sum and the count.
# MAGIC * Above 100% (shaded) the interval is wider than the value itself: such a group cannot be
# MAGIC   published usefully at that budget; merge it into a coarser group or publish a count only.

# COMMAND ----------

summary = pd.DataFrame(
    [{"release": name, "statistic": key[0] if isinstance(key, tuple) else "(headline)",
      "group_size": key[1] if isinstance(key, tuple) else key, "smallest_budget": b}
     for name, (_, sm) in results.items() for key, b in sm.items()])
nb.show(summary, "smallest budget meeting the target, per release and group size")
