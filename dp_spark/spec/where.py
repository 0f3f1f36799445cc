"""The ``where`` of a release spec: a public, row-wise predicate that cannot fail on data.

Why it matters (RELIABILITY 23): the predicate runs on every row *after* the charge. If one
row can make it raise (``raise_error``, a failing cast under ANSI mode, a division by zero,
``element_at`` out of range, an invalid ``LIKE`` pattern held in a column), then whether the
release fails, and what its error says, is decided by one user's rows: a one-bit channel at
best, the row's values in the message at worst. Two defences, both before any data is read:

1. **An allow-list** (:data:`ALLOWED_FUNCTIONS`): comparisons, boolean logic, ``IN``,
   ``BETWEEN``, ``IS [NOT] NULL``, ``CASE``, ``LIKE``/``ILIKE`` with a *literal* pattern,
   ``+ - *`` and bitwise operators, and named functions that are total and deterministic on
   every input: null handling, rounding, string functions, date parts and date arithmetic,
   hashes and the ``try_*`` variants. Everything else is refused with a message naming the
   function: ``cast``/``::``/type-named casts (use ``try_cast``), ``/``, ``div``, ``%``,
   ``mod``, ``pmod`` (use ``try_divide`` / ``try_mod``), ``[]`` and ``element_at``, regular
   expressions, ``raise_error``, ``assert_true``, aggregates, windows, subqueries, UDFs and
   non-deterministic functions.
2. **Total evaluation** (:func:`dp_spark.backends.spark.total_where`): the engine resolves
   and runs the predicate with ``spark.sql.ansi.enabled=false``, under which the implicit casts
   the analyser inserts (``coupon = 5`` on a string column) and integer overflow yield null or
   wrap instead of raising; a null predicate makes the row not match. The allow-list is tested
   against that mode with adversarial arguments of every type (``tests/spark/test_where_total.py``).

A third line catches what is left: any exception between the reservation and the commit
reaches the caller as :class:`dp_spark.errors.ReleaseFailedError`, whose message carries the
release id, the stage and the exception class, never its text.

This module is pure (no pyspark): it runs before any data is read, and its errors never echo
the expression's literals.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from dp_spark.errors import ConfigError
from dp_spark.spec.errors import did_you_mean

__all__ = ["ALLOWED_FUNCTIONS", "REFUSED_HINTS", "check_where", "where_columns"]

#: what a ``where`` naming a column outside ``columns`` is told
_NOT_LISTED = ("a where reads only columns that exist in the input and are listed in 'columns': add it "
               "there if the input has it")

#: Functions a ``where`` may call: total (no input makes them raise once evaluated with ANSI
#: mode off; tests/spark/test_where_total.py drives each with adversarial columns) and
#: deterministic (row-wise, no state, no clock, no randomness).
ALLOWED_FUNCTIONS = frozenset("""
coalesce ifnull nvl nvl2 nullif if isnull isnotnull isnan nanvl equal_null greatest least
abs negative positive sign signum floor ceil ceiling round bround sqrt cbrt exp ln log log10 log2
pow power try_add try_subtract try_multiply try_divide try_mod try_cast
lower upper lcase ucase trim ltrim rtrim btrim length len char_length character_length
octet_length bit_length substring substr left right concat concat_ws startswith endswith
contains instr locate position replace translate initcap reverse ascii
md5 sha1 sha sha2 crc32 hash xxhash64
year quarter month day dayofmonth dayofweek dayofyear weekday weekofyear hour minute second
extract date_part to_date to_timestamp try_to_timestamp date_add date_sub dateadd datediff
date_diff last_day next_day months_between date_trunc trunc unix_date make_date
""".split())

#: Refused names with the total alternative to name in the error.
REFUSED_HINTS = {
    "cast": "use try_cast(x AS type), which gives null where the value does not convert",
    "element_at": "index arrays or maps with a public key set instead",
    "try_element_at": "index arrays or maps with a public key set instead",
    "mod": "use try_mod(a, b)",
    "pmod": "use try_mod(a, b)",
    "raise_error": "a predicate may not raise",
    "assert_true": "a predicate may not raise",
    "rlike": "use LIKE with a literal pattern, startswith, endswith or contains",
    "regexp": "use LIKE with a literal pattern, startswith, endswith or contains",
    "regexp_like": "use LIKE with a literal pattern, startswith, endswith or contains",
    "like": "write it as an operator with a literal pattern: col LIKE 'a%'",
    "ilike": "write it as an operator with a literal pattern: col ILIKE 'a%'",
}

# Words of the predicate's grammar (not column names). Type names are words here only after
# AS (inside try_cast); a type name called like a function, int(x), is a cast and refused.
_TYPE_NAMES = frozenset("""
date timestamp timestamp_ntz timestamp_ltz int integer bigint smallint tinyint long short byte
double float real decimal dec numeric string varchar char boolean binary
""".split())
_KEYWORDS = frozenset("""
and or not is null true false in between case when then else end as interval distinct from to
year years month months day days hour hours minute minutes second seconds week weeks quarter
millisecond milliseconds microsecond microseconds both leading trailing for unknown x
""".split()) | _TYPE_NAMES
#: words that may stand before an opening parenthesis without being a function call
_GROUPING_WORDS = frozenset({"and", "or", "not", "in", "when", "then", "else", "between", "is", "as"})
_FORBIDDEN_WORDS = frozenset({"select", "over", "window", "exists", "join", "union", "lateral", "intersect",
                              "except", "values", "table", "with", "escape", "rlike", "regexp", "div",
                              "similar", "filter"})
_WORD_HINTS = {
    "div": "use try_divide(a, b)",
    "rlike": REFUSED_HINTS["rlike"],
    "regexp": REFUSED_HINTS["regexp"],
    "escape": "write the pattern with the default escape character '\\'",
    "similar": REFUSED_HINTS["rlike"],
}
_OPERATOR_HINTS = {
    "/": "use try_divide(a, b), which gives null on a zero divisor",
    "%": "use try_mod(a, b), which gives null on a zero divisor",
    ":": "'::' casts and ':' paths are not allowed: use try_cast(x AS type)",
    "[": "indexing can fail on a row: index with a public key set instead",
    "]": "indexing can fail on a row: index with a public key set instead",
    "->": "lambda functions are not allowed",
}
_TOKEN = re.compile(r"""\s+|'(?:[^'\\]|\\.|'')*'|"(?:[^"\\]|\\.)*"|`(?:[^`]|``)+`|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?[a-zA-Z]*|[A-Za-z_][A-Za-z0-9_]*|<=>|->|<>|!=|<=|>=|==|\|\||[-+*/%=<>(),.!&|^~:\[\];{}$@#?]""")


def _err(source: str, problem: str) -> ConfigError:
    return ConfigError(f"{source}: field 'where': {problem}")


def _string_literal(tok: str) -> bool:
    return len(tok) >= 2 and tok[0] in "'\"" and tok[-1] == tok[0]


def _like_pattern_ok(tok: str) -> bool:
    """A LIKE pattern literal that Spark accepts on every row: after unquoting, every escape
    character ``\\`` is followed by ``_``, ``%`` or ``\\`` (Spark raises on any other, at the
    first row it evaluates: a data-dependent failure)."""
    body = tok[1:-1]
    quote = tok[0]
    body = body.replace(quote * 2, quote)
    # the SQL string literal's own escapes: \\ -> \, \' -> ', \x -> x for the rest
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            out.append("\\" if nxt == "\\" else ("\\" + nxt if nxt in "%_" else nxt))
            i += 2
            continue
        out.append(c)
        i += 1
    pat = "".join(out)
    i = 0
    while i < len(pat):
        if pat[i] == "\\":
            if i + 1 >= len(pat) or pat[i + 1] not in "_%\\":
                return False
            i += 2
            continue
        i += 1
    return True


#: functions whose optional second argument (a format pattern) can fail on a row
_ONE_ARGUMENT = frozenset({"to_date", "to_timestamp", "try_to_timestamp"})


def _has_second_argument(tokens: list[str], open_at: int) -> bool:
    depth = 0
    for t in tokens[open_at:]:
        if t == "(":
            depth += 1
        elif t == ")":
            depth -= 1
            if depth == 0:
                return False
        elif t == "," and depth == 1:
            return True
    return False


def _tokens(raw: str, source: str) -> list[str]:
    out, pos = [], 0
    while pos < len(raw):
        m = _TOKEN.match(raw, pos)
        if m is None:
            raise _err(source, f"cannot be read at character {pos + 1}")
        if not m.group().isspace():
            out.append(m.group())
        pos = m.end()
    return out


def check_where(raw: Any, columns: Optional[tuple[str, ...]], source: str) -> str:
    """``raw`` if it is an allowed ``where`` over ``columns``, else a :class:`ConfigError`.

    Checked before any data is read: every column it names is in ``columns``; every function
    is in :data:`ALLOWED_FUNCTIONS`; no operator that can raise on a row (``/``, ``%``,
    ``div``, ``::``, ``[]``); ``LIKE``/``ILIKE`` only against a valid literal pattern; no
    aggregate, window, subquery or set operation. The engine then resolves it against the
    input's schema restricted to ``columns`` (a column outside them cannot be resolved) and
    evaluates it totally (module docstring). Errors name the function or operator refused,
    never a literal of the expression. ``columns`` None: every check but the columns' (a key
    table's ``where``, whose columns are checked against the table's schema once it is pinned).
    """
    if not isinstance(raw, str) or not raw.strip():
        raise _err(source, "must be a non-empty Spark SQL boolean expression")
    if len(raw) > 4000:
        raise _err(source, "is longer than 4000 characters")
    tokens = _tokens(raw, source)
    depth = 0
    for i, t in enumerate(tokens):
        low = t.lower()
        nxt = tokens[i + 1] if i + 1 < len(tokens) else ""
        prev = tokens[i - 1].lower() if i > 0 else ""
        if t == "(":
            depth += 1
            continue
        if t == ")":
            depth -= 1
            if depth < 0:
                raise _err(source, "has unbalanced parentheses")
            continue
        if t in _OPERATOR_HINTS:
            raise _err(source, f"operator '{t}' is not allowed: it can fail on a row ({_OPERATOR_HINTS[t]})")
        if t in (";", "{", "}", "$", "@", "#", "?"):
            raise _err(source, f"character '{t}' is not allowed in a row-wise predicate")
        if t.startswith("`"):
            name = t[1:-1].replace("``", "`")
            if columns is not None and name not in columns:
                raise _err(source, f"references column '{name}', which is not in 'columns'"
                           f"{did_you_mean(name, columns)}: {_NOT_LISTED}")
            continue
        if _string_literal(t) or not (t[0].isalpha() or t[0] == "_"):
            continue
        if low in _FORBIDDEN_WORDS:
            hint = _WORD_HINTS.get(low, "no subqueries, windows, set operations or lambdas")
            raise _err(source, f"'{low.upper()}' is not allowed in a row-wise predicate ({hint})")
        if low in ("like", "ilike") and nxt != "(":
            pattern = tokens[i + 1] if i + 1 < len(tokens) else ""
            if not _string_literal(pattern):
                raise _err(source, f"{low.upper()} needs a literal pattern ('...'): a pattern read from "
                           "a column can fail on a row")
            if not _like_pattern_ok(pattern):
                raise _err(source, f"the {low.upper()} pattern has an escape character '\\' that is not "
                           "followed by '_', '%' or '\\' (Spark would fail on the first row)")
            continue
        if nxt == "(":
            if low in _GROUPING_WORDS or (low in _TYPE_NAMES and prev == "as"):
                continue
            if prev == ".":
                raise _err(source, "method calls are not allowed")
            if low in ALLOWED_FUNCTIONS:
                if low in _ONE_ARGUMENT and _has_second_argument(tokens, i + 1):
                    raise _err(source, f"function '{low}' is allowed with one argument only: a format "
                               "pattern can fail on a row (the default ISO formats never do)")
                continue
            if low in _TYPE_NAMES:
                raise _err(source, f"function '{low}' is a cast, which can fail on a row "
                           f"({REFUSED_HINTS['cast']})")
            refused_hint = REFUSED_HINTS.get(low)
            raise _err(source, f"function '{low}' is not allowed in a where"
                       + (f" ({refused_hint})" if refused_hint else " (only total, deterministic, row-wise functions are: "
                          "see docs/config.md, 'where')"))
        if prev == "." or low in _KEYWORDS:
            continue
        if columns is not None and t not in columns:
            raise _err(source, f"references column '{t}', which is not in 'columns'"
                       f"{did_you_mean(t, columns)}: {_NOT_LISTED}")
    if depth != 0:
        raise _err(source, "has unbalanced parentheses")
    return raw


def where_columns(raw: str, columns: tuple[str, ...]) -> tuple[str, ...]:
    """The columns of ``columns`` that a ``where`` already accepted by :func:`check_where`
    names, each once, in order of appearance (a token equal to a column name, quoted or not,
    that is not called as a function nor follows a dot)."""
    tokens = _tokens(raw, "<where>")
    out: list[str] = []
    for i, t in enumerate(tokens):
        name = t[1:-1].replace("``", "`") if t.startswith("`") else t
        nxt = tokens[i + 1] if i + 1 < len(tokens) else ""
        prev = tokens[i - 1] if i > 0 else ""
        if name in columns and nxt != "(" and prev != "." and name not in out:
            out.append(name)
    return tuple(out)
