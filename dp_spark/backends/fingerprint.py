"""The digests of the input rows of some days, in one Spark aggregation (the executors hash
and sum; O(days) rows come back). The pure part -- recombining the sums, keying, comparing --
is :mod:`dp_spark.core.fingerprint`.

::

    input (a pinned snapshot) -> the rows whose date key (as a string) is one of ``days``
      -> x one broadcast row holding the row key (a value of the data, never a plan literal)
      -> h = xxhash64(row key, [isnull(c) for c in columns], *columns)      per row
      -> group by the date key: count, and sum((h >> 16 i) & 0xFFFF), i = 0..3 (exact longs)
      -> {day: RowDigest}

Only ``columns`` enter the hash (the columns the spec reads: an added or changed column it
does not read changes nothing); the null flags keep ``(null, x)`` and ``(x, null)`` apart
(Spark's hash skips a null). Rows a ``where`` or the bounding would drop are hashed too: a
change to them reports the day as changed, never the reverse.

Privacy: nothing here is released. The digests are keyed by a key derived from the
warehouse's salt and never leave the driver's memory except as the keyed fingerprint the
ledger stores. Errors name columns and exception classes only, never values.
"""

from __future__ import annotations

from typing import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dp_spark.backends.bounding import TEMP_PREFIX, column_ref, schema_field
from dp_spark.core.fingerprint import LIMB_BITS, LIMBS, RowDigest
from dp_spark.errors import ConfigError, DpSparkError, SchemaError

__all__ = ["day_digests"]


def _fresh(name: str, taken: Sequence[str]) -> str:
    out = name
    while out in taken:
        out += "_"
    return out


def day_digests(df: DataFrame, *, date_column: str, days: Sequence[str], columns: Sequence[str],
                row_key: str) -> dict[str, RowDigest]:
    """The :class:`RowDigest` of each of ``days`` (ISO date strings; a day without rows gets
    the empty digest) over ``df``'s rows restricted to ``columns``, each row hashed with
    ``row_key`` (:func:`dp_spark.core.fingerprint.fingerprint_keys`). One aggregation.

    Raises SchemaError when a column is missing (before any row is read), DpSparkError with
    the exception's class only when the aggregation fails."""
    if not days:
        return {}
    if not columns or len(set(columns)) != len(columns):
        raise ConfigError("a fingerprint hashes a non-empty list of distinct columns")
    if not isinstance(row_key, str) or not row_key:
        raise ConfigError("a fingerprint needs its row key")
    for c in dict.fromkeys([*columns, date_column]):
        schema_field(df, c, role="fingerprinted")  # SchemaError naming the column
    taken = list(df.columns)
    key_col = _fresh(f"{TEMP_PREFIX}fp_key", taken)
    day_col = _fresh(f"{TEMP_PREFIX}fp_day", taken)
    hash_col = _fresh(f"{TEMP_PREFIX}fp_hash", taken)
    cols = [column_ref(c) for c in columns]
    day = column_ref(date_column).cast("string")
    # schema: the read columns + day: string, one broadcast row joined in for the key
    key_frame = df.sparkSession.createDataFrame(
        [(row_key,)], T.StructType([T.StructField(key_col, T.StringType(), False)]))
    rows = (df.select(*cols, day.alias(day_col)).where(F.col(day_col).isin(sorted(set(days))))
            .crossJoin(F.broadcast(key_frame)))
    # schema: day: string, hash: long
    hashed = rows.select(F.col(day_col), F.xxhash64(F.col(key_col), F.array(*[c.isNull() for c in cols]),
                                                    *cols).alias(hash_col))
    h = F.col(hash_col)
    limbs = [F.sum(F.shiftright(h, LIMB_BITS * i).bitwiseAND(F.lit((1 << LIMB_BITS) - 1))).alias(f"l{i}")
             for i in range(LIMBS)]
    # schema: day: string, n: long, l0..l3: long (each < 2^16 x rows: exact below 2^47 rows)
    agg = hashed.groupBy(day_col).agg(F.count(F.lit(1)).alias("n"), *limbs)
    try:
        _ = agg.schema  # analysis errors here (Spark Connect analyses lazily)
    except Exception as exc:
        raise SchemaError(f"the input's columns {list(columns)} cannot be fingerprinted ({type(exc).__name__})") from None
    try:
        got = agg.collect()
    except Exception as exc:  # the text of a Spark failure can carry a row: withheld
        raise DpSparkError(f"the input fingerprint failed ({type(exc).__name__}; its text is withheld)") from None
    out = {d: RowDigest() for d in days}
    for r in got:
        out[r[day_col]] = RowDigest.from_limb_sums(int(r["n"]), [int(r[f"l{i}"]) for i in range(LIMBS)])
    return out
