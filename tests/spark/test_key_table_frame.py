"""The key set of a public key table on Spark (``key_table_frame``, ``collect_table_keys``):
distinct non-null values cast to string, sorted, as the reference backend reads them; a missing
column or an invalid ``where`` refused naming the field, never a value."""

from __future__ import annotations

import pytest

from dp_spark.backends.local import table_keys
from dp_spark.backends.spark import collect_table_keys, key_table_frame, total_where
from dp_spark.errors import ConfigError

ROWS = [("p3", True, 1), ("p1", True, 2), (None, True, 3), ("p3", True, 4), ("p2", False, 5), ("p10", True, 0),
        ("secret-key", False, 9)]
FIELD = "group_by[0].public_keys.table"


@pytest.fixture(scope="module")
def catalogue(spark):
    return spark.createDataFrame(ROWS, "product_id string, active boolean, shelf int")


def read(df, where=None):
    keys = key_table_frame(df, "product_id", where, "s.yaml", FIELD)
    with total_where(df.sparkSession, where is not None):
        n = keys.count()
        return n, collect_table_keys(keys, n)


def test_the_key_set_is_what_the_reference_backend_reads(catalogue):
    dicts = [dict(zip(("product_id", "active", "shelf"), r)) for r in ROWS]
    assert read(catalogue) == (5, table_keys(dicts, "product_id"))
    where = "active AND try_add(shelf, 0) > 0"
    assert read(catalogue, where) == (2, table_keys(dicts, "product_id", where=lambda r: r["active"] and r["shelf"] > 0))
    assert read(catalogue, where)[1] == ("p1", "p3")


def test_integer_keys_are_read_as_the_data_key_column_is_cast(spark):
    df = spark.createDataFrame([(12,), (5,), (5,), (None,)], "k long")
    keys = key_table_frame(df, "k", None, "s.yaml", FIELD)
    assert collect_table_keys(keys, 2) == ("12", "5")


def test_a_missing_column_or_a_bad_where_is_refused_by_field(catalogue):
    with pytest.raises(ConfigError, match=r"group_by\[0\]\.public_keys\.column'.*no column 'sku'"):
        key_table_frame(catalogue, "sku", None, "s.yaml", FIELD)
    with pytest.raises(ConfigError) as exc:
        key_table_frame(catalogue, "product_id", "colour = 'secret-key'", "s.yaml", FIELD)
    assert "group_by[0].public_keys.where" in str(exc.value) and "secret" not in str(exc.value)


def test_more_keys_than_counted_is_an_error_never_a_silent_cut(catalogue):
    keys = key_table_frame(catalogue, "product_id", None, "s.yaml", FIELD)
    with pytest.raises(ConfigError, match="internal"):
        collect_table_keys(keys, 3)
