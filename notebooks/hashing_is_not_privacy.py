# Databricks notebook source
# MAGIC %md
# MAGIC # Why hashing user IDs is not privacy
# MAGIC
# MAGIC A common belief: "we dropped the names and hashed the user IDs, so the table is anonymous".
# MAGIC It is not. A hash is a **stable, linkable identifier**: the same person gets the same hash in
# MAGIC every table, and the other columns (zip code, age, gender...) still single people out. This
# MAGIC notebook runs a linkage attack on small **synthetic** data, then shows what a
# MAGIC differentially private release of the same information looks like, and why the attack has
# MAGIC nothing to hold on to.
# MAGIC
# MAGIC Runs in Databricks (ambient `spark`, tables with `display()`, the chart inline) and as a
# MAGIC plain script with local Spark: `python notebooks/hashing_is_not_privacy.py` (tables printed,
# MAGIC the chart written under `<warehouse>/charts/`). The `env` widget names the environment file
# MAGIC (default: `conf/envs/databricks.yaml` on Databricks, else `conf/envs/local.yaml`; outside
# MAGIC Databricks `$DP_SPARK_ENV`). Nothing is written to the repository folder.

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

import hashlib
import math
import os
import sys
from pathlib import Path

try:
    ROOT = Path(__file__).resolve().parent.parent
except NameError:  # Databricks Repos: the working directory is the notebook's folder
    ROOT = Path(os.getcwd()).resolve().parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dp_spark.notebook import Notebook  # noqa: E402

nb = Notebook(globals(), root=ROOT)
ENV_FILE = nb.path(nb.widget("env", nb.default_env(), "Environment file", env_var="DP_SPARK_ENV"))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from dp_spark.config import load_env  # noqa: E402
from dp_spark.spark import get_or_create_session  # noqa: E402

env = load_env(ENV_FILE)
spark = globals().get("spark") or get_or_create_session(
    "dp_spark.notebook.hashing", master=env.master, extra_conf=dict(env.spark_conf))

# COMMAND ----------

# MAGIC %md
# MAGIC ## A synthetic population
# MAGIC 2,000 people with a name, a zip code, an age and a gender, and their orders. (Test-data
# MAGIC randomness from a seeded numpy generator; it is *not* used for any DP noise.)

# COMMAND ----------

rng = np.random.default_rng(2024)  # synthetic data only
N = 2000
ZIPS = [f"{z:05d}" for z in rng.choice(np.arange(10000, 99999), size=40, replace=False)]
people = pd.DataFrame({
    "user_id": [f"u{i:06d}" for i in range(N)],
    "name": [f"Person {i}" for i in range(N)],
    "zip": rng.choice(ZIPS, size=N),
    "age": rng.integers(18, 80, size=N),
    "gender": rng.choice(["F", "M"], size=N),
})
orders = people.loc[people.index.repeat(rng.integers(1, 8, size=N)), ["user_id", "zip"]].reset_index(drop=True)
orders["order_value"] = np.round(rng.lognormal(3.6, 0.5, size=len(orders)), 2)
print(f"{len(people):,} people, {len(orders):,} orders")

# COMMAND ----------

# MAGIC %md
# MAGIC ## The "anonymised" export: names dropped, user IDs hashed
# MAGIC Per user: `sha256(user_id)`, zip, age, gender and total spend.

# COMMAND ----------


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


spend = orders.groupby("user_id", as_index=False)["order_value"].sum().rename(columns={"order_value": "total_spend"})
export = people.merge(spend, on="user_id")
export["user_hash"] = export["user_id"].map(sha256)
export = export[["user_hash", "zip", "age", "gender", "total_spend"]]
nb.show(export.head(), "the hashed export (first rows)")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Attack 1: linkage on quasi-identifiers
# MAGIC The attacker holds an auxiliary table with names (a voter roll, a social profile, a leaked
# MAGIC customer list) and the same zip, age and gender for 500 of the people. Joining on the
# MAGIC quasi-identifiers re-identifies everybody whose combination is unique in the export.

# COMMAND ----------

aux = people.sample(n=500, random_state=7)[["name", "zip", "age", "gender"]]
qi = ["zip", "age", "gender"]
counts = export.groupby(qi).size().rename("matches").reset_index()
linked = aux.merge(counts, on=qi).merge(export, on=qi)
unique = linked[linked["matches"] == 1]
truth = people.set_index("name")["user_id"].map(sha256)
correct = (unique["user_hash"].to_numpy() == truth.loc[unique["name"]].to_numpy()).sum()
reid_rate = correct / len(aux)
print(f"re-identified {correct} of {len(aux)} people in the auxiliary table ({reid_rate:.0%}), "
      f"with their total spend; {export.groupby(qi).ngroups / len(export):.0%} of the export rows "
      "have a unique (zip, age, gender)")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Attack 2: the hash itself
# MAGIC User IDs come from a small, guessable space (`u000000` ... `u999999`). Hashing every
# MAGIC candidate reverses the hash outright, and the same hash links the person across every table
# MAGIC and every month that uses it. Salting with a secret only stops the reversal, not the linking.

# COMMAND ----------

candidates = {sha256(f"u{i:06d}"): f"u{i:06d}" for i in range(100_000)}  # a fraction of a second
reversed_ids = export["user_hash"].map(candidates)
print(f"reversed {reversed_ids.notna().mean():.0%} of the hashed ids by enumerating 100,000 candidates")
next_month = export.assign(total_spend=export["total_spend"] * 1.1)  # another export, same hashes
print(f"linked across two exports by the hash alone: {export['user_hash'].isin(next_month['user_hash']).mean():.0%}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## The differentially private release of the same information
# MAGIC Instead of per-user rows, the engine releases **aggregates per public key** (here: users
# MAGIC and orders per zip code), with each user's contribution bounded and calibrated noise added.
# MAGIC The output has one row per declared zip and no identifier column: there is nothing to join
# MAGIC a name to. (On real data publish through `Engine.publish`, which also charges the budget
# MAGIC ledger; here the engine's own bounding and noise run on synthetic data only.)

# COMMAND ----------

from dp_spark.config import release_spec_from_dict  # noqa: E402
from dp_spark.backends.spark import build_query_partials, collect_query_partials  # noqa: E402
from dp_spark.engine import plan_for  # noqa: E402
from dp_spark.mechanisms.samplers import default_source  # noqa: E402

EPSILON = 1.0
spec = release_spec_from_dict({
    "name": "orders_per_zip", "dataset": "synthetic_orders",
    "privacy_unit": {"kind": "user", "column": "user_id"}, "metric": "distinct_units",
    "group_by": {"column": "zip", "public_keys": {"values": sorted(ZIPS)}},
    "bounds": {"max_rows_per_unit": 1, "max_partitions_per_unit": 1},
    "budget": {"id": "synthetic", "measure": "pure_dp", "epsilon": EPSILON},
}, source="hashing_is_not_privacy")
orders_df = spark.createDataFrame(orders[["user_id", "zip"]])
plan = plan_for(spec)
partials = collect_query_partials(build_query_partials(orders_df, plan, salt="synthetic-demo-salt"), plan)
released = pd.DataFrame(plan.noise(partials, default_source())).drop(columns=["keys"])
nb.show(released[["key", "value", "ci_low", "ci_high", "mechanism"]].head(8), "the DP release (first rows)")
print(f"columns of the release: {sorted(released.columns)}")
assert "user_hash" not in released.columns and "user_id" not in released.columns
print(f"rows: {len(released)} (one per public zip), for {len(people):,} people: no per-user row to link")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Membership inference against the DP count
# MAGIC The strongest attacker knows **everybody else's data** and asks: is Alice in the data? They
# MAGIC compare the DP count on D (with Alice) and on D' (Alice removed). With epsilon = 1, for every
# MAGIC output the two probabilities differ by a factor of at most e^1 ~ 2.7, so the two output
# MAGIC distributions overlap heavily and no test can tell D from D' much better than a coin flip:
# MAGIC its accuracy is at most e^eps / (1 + e^eps) ~ 73.1%, whatever the attacker does.
# MAGIC
# MAGIC The attacker's test is "the output is at least t: Alice is in". They **choose t on one set
# MAGIC of releases and are measured on fresh ones**: choosing the best of 21 thresholds on the same
# MAGIC draws it is scored on flatters it (the sampling luck of those draws is counted as skill), and
# MAGIC a measured accuracy is a sample: it comes with its 95% interval. For the discrete Laplace the
# MAGIC bound is tight: the best threshold's exact accuracy *is* e^eps / (1 + e^eps), so the measured
# MAGIC accuracy sits on the bound, within its interval (a 95% interval misses the true value in 1 run
# MAGIC of 40), never meaningfully above it.

# COMMAND ----------

alice_zip = people.loc[0, "zip"]
true_d = int(partials.get(spec.keys.index(alice_zip), {}).get("dp_units", 0))
true_d_prime = true_d - 1  # Alice (one user, all her orders) removed
p0 = plan.statistics[0]
src = default_source()
TRAIN, HELD_OUT = 2000, 20000  # releases on D and on D' to choose the threshold on / to score it on


def releases(true_count: int, n: int) -> np.ndarray:
    """n independent DP releases of the count (the engine's noise: the plan's scale)."""
    return np.array(src.discrete_laplace(p0.scale, n)) + true_count


def accuracy(t: int, on_d: np.ndarray, on_d_prime: np.ndarray) -> float:
    """Accuracy of "output >= t means Alice is in", D and D' equally likely."""
    return ((on_d >= t).mean() + (on_d_prime < t).mean()) / 2


train_d, train_dp = releases(true_d, TRAIN), releases(true_d_prime, TRAIN)
test_d, test_dp = releases(true_d, HELD_OUT), releases(true_d_prime, HELD_OUT)
thresholds = range(true_d - 10, true_d + 11)
chosen = max(thresholds, key=lambda t: accuracy(t, train_d, train_dp))  # chosen on the training draws only
best = accuracy(chosen, test_d, test_dp)  # scored on held-out draws: an unbiased estimate
# its 95% interval (Wilson, over the 2 x HELD_OUT independent guesses)
n_guesses, z = 2 * HELD_OUT, 1.959964
centre = (best + z * z / (2 * n_guesses)) / (1 + z * z / n_guesses)
half = z * math.sqrt(best * (1 - best) / n_guesses + z * z / (4 * n_guesses ** 2)) / (1 + z * z / n_guesses)
ci_low, ci_high = centre - half, centre + half
# the threshold's exact accuracy, from the noise's law: (1 + P(noise = t - true_d)) / 2
q = math.exp(-1 / float(p0.scale))
exact = (1 + (1 - q) / (1 + q) * q ** abs(chosen - true_d)) / 2
bound = math.exp(EPSILON) / (1 + math.exp(EPSILON))
lo = min(test_d.min(), test_dp.min())
span = int(max(test_d.max(), test_dp.max()) - lo) + 1
overlap = np.minimum(np.bincount(test_d - lo, minlength=span), np.bincount(test_dp - lo, minlength=span)).sum() / HELD_OUT
print(f"true counts: D = {true_d}, D' = {true_d_prime}; noise scale {float(p0.scale):g} per count")
print(f"overlap of the two output histograms: {overlap:.0%}")
print(f"threshold chosen on {TRAIN:,} + {TRAIN:,} releases: output >= {chosen} means 'Alice is in'")
print(f"best threshold attack accuracy on {HELD_OUT:,} + {HELD_OUT:,} held-out releases: {best:.1%} "
      f"(95% interval {ci_low:.1%} to {ci_high:.1%}; exactly {exact:.1%} for this threshold)")
print(f"DP bound at epsilon={EPSILON}: {bound:.1%} for any test; coin flip: 50%")
print(f"hashed export: {reid_rate:.0%} of the auxiliary people re-identified, with their spend")

# COMMAND ----------

# MAGIC %md
# MAGIC ## What to take away
# MAGIC * A hashed ID is still an identifier: it links, and it can be reversed when IDs are guessable.
# MAGIC * Removing names does not remove the quasi-identifiers that single people out.
# MAGIC * Differential privacy is a property of the **release mechanism**: bounded contributions and
# MAGIC   calibrated noise make every output almost as likely with or without any one user. It says
# MAGIC   nothing about who may read the raw table: access control still applies.

# COMMAND ----------

try:
    import matplotlib  # noqa: F401
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    bins = np.arange(min(test_d.min(), test_dp.min()), max(test_d.max(), test_dp.max()) + 2) - 0.5
    ax.hist(test_d, bins=bins, alpha=0.5, label="DP count on D (with Alice)")
    ax.hist(test_dp, bins=bins, alpha=0.5, label="DP count on D' (without Alice)")
    ax.axvline(chosen - 0.5, color="black", linestyle="--", linewidth=1,
               label=f"attack: >= {chosen} means in ({best:.1%}, 95% interval {ci_low:.1%}-{ci_high:.1%}; "
                     f"bound {bound:.1%})")
    ax.set_title(f"Membership inference: the outputs overlap (epsilon = {EPSILON})")
    ax.set_xlabel("released count of users in Alice's zip code")
    ax.set_ylabel(f"frequency over {HELD_OUT:,} held-out releases")
    ax.set_xlim(true_d - 9, true_d + 8)  # the tails beyond hold a few releases in 10,000
    ax.set_ylim(top=ax.get_ylim()[1] * 1.3)  # room for the legend above the bars
    ax.legend(loc="upper left", fontsize=8)
    charts = nb.output_dir(env, "charts")  # None: an object-store warehouse, the chart is only displayed
    nb.figure(fig, None if charts is None else charts / "membership_overlap.png", "membership overlap")
except ImportError:  # pragma: no cover - matplotlib is a dependency
    pass
