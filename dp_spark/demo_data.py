"""A synthetic, deterministic e-commerce event table for demos, tests and benchmarks.

Everything is computed by Spark from ``spark.range`` and keyed hashes (``xxhash64(seed, tag,
id)`` turned into uniforms), so the table is a pure function of the parameters, whatever the
cluster, the partitioning or the session time zone, and it scales to tens of millions of rows
without driver work. (This is *test data* randomness; noise for releases lives in
``dp_spark.mechanisms`` and never comes from here.)

Shape of the data (the traits a DP engine must survive):

* activity per user is heavy-tailed (Lomax / Pareto II, mean ~20 rows, capped at 5,000), plus
  ``heavy_users`` bots with ``heavy_rows`` rows each;
* each user has a home region drawn from a Zipf(1.2) law over the regions (``region_01`` is
  the largest, the last one is ~35x smaller), and ~10% of events happen in a uniformly drawn
  region instead;
* ``order_value`` is log-normal (median 40, sigma 0.5, rounded to cents), with a few nulls
  (0.05%), NaNs (0.05%), negative refunds (0.1%) and absurd 1e9 values (0.02%);
* 0.05% of the events of ordinary users have a null ``user_id``.

Schema::

    event_id    long       unique, not null (user index * stride + event ordinal)
    user_id     string     "u000123" (zero-padded to >= 6 digits); null on a few events
    event_time  timestamp  an instant in [start_date, start_date + days) UTC
    day         date       the UTC day of event_time (not session-time-zone dependent)
    region      string     "region_01" .. "region_<regions>"
    order_value double     see above (nullable, may be NaN)
"""

from __future__ import annotations

import calendar
import math
import random
from datetime import date

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dp_spark.errors import ConfigError

__all__ = ["EVENT_SCHEMA", "generate_events"]

#: Column names and types of :func:`generate_events` (nullability as planned with ANSI on).
EVENT_SCHEMA = T.StructType(
    [
        T.StructField("event_id", T.LongType(), False),
        T.StructField("user_id", T.StringType(), True),
        T.StructField("event_time", T.TimestampType(), False),
        T.StructField("day", T.DateType(), False),
        T.StructField("region", T.StringType(), False),
        T.StructField("order_value", T.DoubleType(), True),
    ]
)

# Activity: rows per ordinary user = 1 + floor(XM * (U^(-1/ALPHA) - 1)), capped.
_ALPHA = 1.5
_MAX_ORDINARY_ROWS = 5_000
_ESTIMATED_MEAN_ROWS = 20
_ROWS_PER_PARTITION = 1_000_000

_REGION_ZIPF = 1.2
_AWAY_SHARE = 0.10

_VALUE_MEDIAN = 40.0
_VALUE_SIGMA = 0.5
# Cumulative thresholds of special values on one uniform.
_P_NULL_VALUE = 0.0005
_P_NAN_VALUE = 0.0010
_P_NEGATIVE_VALUE = 0.0020
_P_ABSURD_VALUE = 0.0022
_ABSURD_VALUE = 1e9
_P_NULL_USER = 0.0005

_MASK53 = (1 << 53) - 1


def _uniform(seed: int, tag: str, *cols: Column) -> Column:
    """A uniform double in (0, 1) from a keyed hash: deterministic, independent per tag."""
    h = F.xxhash64(F.lit(seed).cast("bigint"), F.lit(tag), *cols)
    return (h.bitwiseAND(F.lit(_MASK53)).cast("double") + F.lit(0.5)) / F.lit(float(2**53))


def _check_int(name: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an int")
    if value < lo or (hi is not None and value > hi):
        raise ConfigError(f"{name} must be in [{lo}, {hi}]")
    return value


def _region_cdf(regions: int) -> list[float]:
    weights = [1.0 / (r**_REGION_ZIPF) for r in range(1, regions + 1)]
    total = sum(weights)
    cdf, acc = [], 0.0
    for w in weights:
        acc += w
        cdf.append(acc / total)
    cdf[-1] = 1.0
    return cdf


def generate_events(
    spark: SparkSession,
    *,
    n_users: int = 20000,
    days: int = 30,
    start_date: date = date(2026, 11, 1),
    regions: int = 20,
    seed: int = 7,
    heavy_users: int = 3,
    heavy_rows: int = 10000,
    partitions: int | None = None,
    mean_rows_per_user: float = 20.0,
) -> DataFrame:
    """Build the synthetic event table (lazily; nothing runs until an action).

    About ``n_users * mean_rows_per_user + heavy_users * heavy_rows`` rows: the defaults give
    ~0.4 M rows, ``n_users=1_000_000`` ~20 M. ``mean_rows_per_user`` (> 1, default 20) sets the
    mean of the ordinary users' heavy-tailed activity (the Lomax scale; the tail stays alpha 1.5). ``partitions`` sets the number of input partitions (default:
    one per ~1 M expected rows, at least 2). The result is a deterministic function of the
    arguments other than ``partitions`` (which changes only the layout).
    """
    _check_int("n_users", n_users, 1, 10**12)
    if isinstance(mean_rows_per_user, bool) or not isinstance(mean_rows_per_user, (int, float)) or not (
            1 < float(mean_rows_per_user) <= 1000):
        raise ConfigError("mean_rows_per_user must be a number in (1, 1000]")
    xm = (float(mean_rows_per_user) - 1.0) * (_ALPHA - 1.0)
    _check_int("days", days, 1, 100_000)
    _check_int("regions", regions, 1, 10_000)
    _check_int("heavy_users", heavy_users, 0, n_users)
    _check_int("heavy_rows", heavy_rows, 1, 10**9)
    _check_int("seed", seed, -(2**63), 2**63 - 1)
    if partitions is not None:
        _check_int("partitions", partitions, 1, 100_000)
    if not isinstance(start_date, date):
        raise ConfigError("start_date must be a datetime.date")

    stride = max(_MAX_ORDINARY_ROWS, heavy_rows)
    if n_users * stride >= 2**63:
        raise ConfigError("n_users * max rows per user does not fit event_id (a long)")
    if partitions is None:
        expected = n_users * _ESTIMATED_MEAN_ROWS + heavy_users * heavy_rows
        partitions = max(2, math.ceil(expected / _ROWS_PER_PARTITION))
    # Heavy users: a seeded choice of user indices (O(heavy_users) driver work).
    heavy = sorted(random.Random(seed).sample(range(n_users), heavy_users))
    width = max(6, len(str(n_users - 1)))
    region_width = max(2, len(str(regions)))
    start_epoch = calendar.timegm(start_date.timetuple())

    uidx = F.col("uidx")
    # --- users: uidx: long, n_rows: int, home: int (1-based region index)
    u_act = _uniform(seed, "activity", uidx)
    ordinary = F.least(
        F.lit(1) + F.floor(F.lit(xm) * (F.pow(u_act, F.lit(-1.0 / _ALPHA)) - F.lit(1.0))),
        F.lit(_MAX_ORDINARY_ROWS),
    )
    n_rows = F.when(uidx.isin(heavy), F.lit(heavy_rows)).otherwise(ordinary) if heavy else ordinary
    u_home = _uniform(seed, "home", uidx)
    cdf = _region_cdf(regions)
    home = F.lit(regions)
    for r in range(regions - 1, 0, -1):  # builds CASE WHEN u < cdf[0] THEN 1 WHEN ... ELSE regions
        home = F.when(u_home < F.lit(cdf[r - 1]), F.lit(r)).otherwise(home)
    users = spark.range(0, n_users, 1, partitions).select(
        F.col("id").alias("uidx"),
        n_rows.cast("int").alias("n_rows"),
        home.cast("int").alias("home"),
    )

    # --- events: uidx, home, j: int (ordinal of the event within its user)
    events = users.select(
        "uidx", "home", F.explode(F.sequence(F.lit(0), F.col("n_rows") - F.lit(1))).alias("j")
    )
    event_id = uidx * F.lit(stride) + F.col("j").cast("bigint")
    events = events.select("uidx", "home", event_id.alias("event_id"))
    eid = F.col("event_id")

    # --- per-event attributes, each from its own hash stream
    day_offset = F.least(F.floor(_uniform(seed, "day", eid) * F.lit(days)), F.lit(days - 1))
    second = F.least(F.floor(_uniform(seed, "second", eid) * F.lit(86400)), F.lit(86399))
    event_time = F.timestamp_seconds(F.lit(start_epoch) + day_offset * F.lit(86400) + second)
    day = F.date_add(F.lit(start_date), day_offset.cast("int"))

    away = _uniform(seed, "away", eid) < F.lit(_AWAY_SHARE)
    away_region = F.least(
        F.floor(_uniform(seed, "away_region", eid) * F.lit(regions)) + F.lit(1), F.lit(regions)
    )
    region_idx = F.when(away, away_region).otherwise(F.col("home"))
    region = F.format_string(f"region_%0{region_width}d", region_idx.cast("int"))

    # Box-Muller: z ~ N(0, 1) from two uniforms in (0, 1).
    z = F.sqrt(F.lit(-2.0) * F.log(_uniform(seed, "value_r", eid))) * F.cos(
        F.lit(2.0 * math.pi) * _uniform(seed, "value_t", eid)
    )
    base_value = F.round(F.exp(F.lit(math.log(_VALUE_MEDIAN)) + F.lit(_VALUE_SIGMA) * z), 2)
    u_special = _uniform(seed, "special", eid)
    order_value = (
        F.when(u_special < F.lit(_P_NULL_VALUE), F.lit(None).cast("double"))
        .when(u_special < F.lit(_P_NAN_VALUE), F.lit(float("nan")))
        .when(u_special < F.lit(_P_NEGATIVE_VALUE), -base_value)
        .when(u_special < F.lit(_P_ABSURD_VALUE), F.lit(_ABSURD_VALUE))
        .otherwise(base_value)
    )
    # Null ids only on ordinary users, so that heavy users keep exactly heavy_rows rows.
    null_user = _uniform(seed, "null_user", eid) < F.lit(_P_NULL_USER)
    if heavy:
        null_user = null_user & ~uidx.isin(heavy)
    user_id = F.when(null_user, F.lit(None).cast("string")).otherwise(
        F.format_string(f"u%0{width}d", uidx)
    )

    # schema: EVENT_SCHEMA
    return events.select(
        eid.alias("event_id"),
        user_id.alias("user_id"),
        event_time.alias("event_time"),
        day.alias("day"),
        region.alias("region"),
        order_value.cast("double").alias("order_value"),
    )
