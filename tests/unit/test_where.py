"""The ``where`` allow-list (dp_spark.spec.where): refused before any data is read, naming the
function or operator, never echoing a literal (RELIABILITY 23)."""

from __future__ import annotations

import pytest

from dp_spark.errors import ConfigError
from dp_spark.spec.where import ALLOWED_FUNCTIONS, REFUSED_HINTS, check_where

COLS = ("user_id", "day", "region", "order_value", "coupon", "n", "status")


@pytest.mark.parametrize("where, named", [
    # the audit's three probes
    ("raise_error(concat('leak ', user_id, ' ', order_value)) IS NULL", "raise_error"),
    ("cast(coupon AS INT) = 5", "cast"),
    ("order_value / n > 1", "'/'"),
    # the rest of the class: anything that can raise on one row
    ("assert_true(order_value > 0)", "assert_true"),
    ("int(coupon) = 5", "int"),
    ("double(coupon) > 1", "double"),
    ("coupon::int = 5", "'::'"),
    ("n div 0 = 1", "DIV"),
    ("n % 2 = 0", "'%'"),
    ("mod(n, 0) = 0", "mod"),
    ("pmod(n, 0) = 0", "pmod"),
    ("element_at(array(1, 2), n) = 1", "element_at"),
    ("try_element_at(array(1, 2), n) = 1", "try_element_at"),
    ("array(1, 2)[n] = 1", "array"),
    ("coupon RLIKE '^a'", "RLIKE"),
    ("regexp_like(coupon, '^a')", "regexp_like"),
    ("coupon LIKE status", "LIKE"),
    ("coupon ILIKE region", "ILIKE"),
    ("coupon LIKE 'a\\\\b'", "LIKE"),  # the pattern a\b: an escape before 'b' fails on a row
    ("coupon LIKE 'a!%' ESCAPE '!'", "ESCAPE"),
    ("repeat(coupon, n) = ''", "repeat"),
    ("lpad(coupon, n, 'x') = ''", "lpad"),
    ("add_months(day, n) > day", "add_months"),
    ("timestamp_seconds(n) IS NULL", "timestamp_seconds"),
    ("split_part(coupon, '-', n) = ''", "split_part"),
    ("my_udf(coupon)", "my_udf"),
    ("to_date(coupon, 'yyyy-MM-dd') IS NULL", "to_date"),
    ("to_timestamp(coupon, status) IS NULL", "to_timestamp"),
    ("transform(array(n), x -> x + 1) IS NULL", "transform"),
    ("aggregate(array(n), 0, (a, b) -> a + b) > 1", "aggregate"),
    # aggregates, windows, subqueries, non-determinism (as before)
    ("sum(order_value) > 3", "sum"),
    ("rand() < 0.5", "rand"),
    ("row_number() OVER (ORDER BY day) < 3", "row_number"),
    ("n > 1 OVER (ORDER BY day)", "OVER"),
    ("order_value > (SELECT max(order_value) FROM t)", "SELECT"),
    ("current_date() > day", "current_date"),
])
def test_anything_that_can_fail_on_a_row_is_refused_naming_it(where, named):
    with pytest.raises(ConfigError) as exc:
        check_where(where, COLS, "s.yaml")
    msg = str(exc.value)
    assert "field 'where'" in msg and named in msg, msg
    # never a literal of the expression
    for lit in ("leak ", "'^a'", "a\\b", "'-'", "'x'"):
        assert lit not in msg, msg


def test_the_refused_casts_and_divisions_say_what_to_use_instead():
    for where, hint in [("cast(coupon AS INT) = 5", "try_cast"), ("n / 2 > 1", "try_divide"),
                        ("n % 2 = 0", "try_mod"), ("int(coupon) = 5", "try_cast")]:
        with pytest.raises(ConfigError) as exc:
            check_where(where, COLS, "s.yaml")
        assert hint in str(exc.value), str(exc.value)


@pytest.mark.parametrize("where", [
    "order_value IS NOT NULL AND region <> 'test'",
    "status IN ('paid', 'shipped') AND lower(region) <> 'test' AND `order_value` BETWEEN 0 AND 1e6",
    "try_cast(coupon AS INT) = 5",
    "try_cast(coupon AS DECIMAL(10, 2)) > 1.5",
    "coupon = 5",  # an implicit cast: evaluated totally (tests/spark/test_where_total.py)
    "try_divide(order_value, n) > 1 AND try_mod(n, 2) = 0",
    "order_value * 2 + n - 1 > 0 AND -n < 5",
    "coupon LIKE 'spring%' OR coupon NOT LIKE 'a\\\\_b' OR coupon ILIKE '%X%'",
    "CASE WHEN n > 3 THEN true ELSE region = 'a' END",
    "coalesce(coupon, '') <> '' AND nullif(n, 0) IS NOT NULL AND if(n > 1, true, false)",
    "year(day) = 2026 AND month(day) IN (11, 12) AND date_add(day, 7) > date'2026-11-03'",
    "extract(year FROM day) = 2026 AND date_trunc('MONTH', day) IS NOT NULL",
    "day >= date'2026-11-01' - INTERVAL 7 DAYS",
    "startswith(coupon, 'a') AND contains(region, 'x') AND length(trim(coupon)) > 2",
    "xxhash64(user_id) > 0 AND hash(coupon) <> 0",
    "to_date(coupon) > day AND to_timestamp(coalesce(coupon, status)) IS NULL",
    "substring(coupon, 1, 3) = 'abc' AND position('a' IN coupon) > 0",
    "n & 3 = 1 OR ~n = 0 OR NOT (n <=> 2) OR !(n = 3)",
])
def test_total_row_wise_predicates_are_accepted(where):
    assert check_where(where, COLS, "s.yaml") == where


def test_allow_list_and_refusals_do_not_overlap():
    assert not (ALLOWED_FUNCTIONS & set(REFUSED_HINTS))
    for name in ("raise_error", "assert_true", "cast", "element_at", "rlike", "reflect", "java_method"):
        assert name not in ALLOWED_FUNCTIONS


def test_columns_outside_columns_and_unbalanced_parentheses_are_refused():
    for where in ("secret > 1", "`secret` > 1", "(n > 1", "n > 1)"):
        with pytest.raises(ConfigError):
            check_where(where, COLS, "s.yaml")


def test_errors_never_echo_the_expression_literals():
    with pytest.raises(ConfigError) as exc:
        check_where("coupon = 'alice@example.com' AND raise_error('bob@example.com')", COLS, "s.yaml")
    assert "example.com" not in str(exc.value)
