"""The reference backend: the exact partials of a release plan from a list of rows, in Python.

No pyspark. It computes what :func:`dp_spark.backends.spark.build_query_partials` followed by
:func:`~dp_spark.backends.spark.collect_query_partials` computes on Spark -- the same
``{cell index: {partial column: int}}`` -- written as the plain definition of each step rather
than as Spark's plan, so that ``tests/spark/test_backend_equivalence.py`` can hold the Spark
path to it on random data, and the unit tests of kinds, plans and evaluation can run without
Spark (``make test-fast``)::

    rows (dicts)
      -> only spec.columns; rows with a null unit dropped
      -> where: a Python predicate (see below); null / NaN values of every value column
         dropped, -0.0 -> 0.0
      -> public keys: cast to string, kept when declared; the cell is the key tuple's index in
         the cross product (row-major); a bucketed date key (week, month): the declared day's
         bucket; private keys: non-null, the cell is (public index, private values as strings)
      -> rolling windows (dp_spark.statistics.plan.DateFeeds): a row becomes one row per
         (day, window) cell it feeds, the cell ``index * windows + w``; everything below bounds
         these cells; the partials are split back per window at the end (``<partial>@N``)
      -> neighbouring 'event': one row per event id, ids with two different rows dropped
      -> bounding, by the same keyed priorities as the Spark path (Spark's xxhash64, seed 42,
         over (salt, "partition", unit, cell) and (salt, "row", unit, cell, values...)):
         each unit keeps its L0 cells of smallest priority, then <= Linf rows per cell, then
         <= K rows in all, each time the rows of smallest priority
      -> clamp each value column to the fixed-point grid; per-row squares and bins
      -> per cell: the partial columns of every component (exact integers)
      -> distinct units: the (unit, cell) pairs before the row cuts, each unit's first
         min(L0, K) cells by the cell priority

The priorities are Spark's, bit for bit, so the local backend keeps the very rows Spark keeps
(the salt decides which; any salt gives bounded partials). Ties of the row priority (identical
rows, or a 64-bit collision) are broken by the row's values, as Spark does.

Limits, stated: the ``where`` of a spec is Spark SQL; this backend does not evaluate SQL.
Pass the same predicate as a Python callable ``where(row) -> bool`` over the row restricted to
``spec.columns`` (a falsy or None result drops the row, as a null predicate does in Spark);
a spec with a ``where`` and no callable, or a callable without a spec ``where``, is refused.
Column types (what the priorities hash) come from ``schema`` or from the values: ``string``,
``long``, ``int``, ``double``, ``boolean``, ``date`` (Python str, int, float, bool,
datetime.date); other types are refused (SchemaError, naming the column only).
"""

from __future__ import annotations

import datetime as _dt
import math
import struct
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Optional

import xxhash

from dp_spark.spec.runtime import PrivateKeys
from dp_spark.errors import ConfigError, SchemaError
from dp_spark.statistics.components import SUM_PART_BITS
from dp_spark.statistics.plan import date_feeds, key_tuples, split_windows
from dp_spark.statistics.selection import keep_over_threshold, limit_keys
from dp_spark.core.units import Neighbouring

__all__ = ["LocalPartials", "TYPES", "query_partials", "select_private_keys", "spark_xxhash64", "table_keys"]

#: the column types this backend reads (Spark's simple type names)
TYPES = frozenset({"string", "long", "int", "double", "boolean", "date"})
_NUMERIC = frozenset({"long", "int", "double"})
_MASK64 = 2**64 - 1
_PART_MASK = 2**SUM_PART_BITS - 1
_SEED = 42  # Spark's xxhash64 seed
_EPOCH = _dt.date(1970, 1, 1)
Row = Mapping[str, Any]


# --------------------------------------------------------------------------- Spark's xxhash64
def _signed(h: int) -> int:
    return h - 2**64 if h >= 2**63 else h


def _hash_value(value: Any, kind: str, seed: int) -> int:
    """One value into Spark's XxHash64 chain (``HashExpression.computeHash``): ints and dates
    (days) as 4 bytes, longs and doubles (zeros as 0L) as 8, strings as their UTF-8 bytes,
    structs field by field; a null leaves the hash unchanged."""
    if value is None:
        return seed
    if kind == "struct":
        for v, k in value:
            seed = _hash_value(v, k, seed)
        return seed
    if kind == "string":
        data = value.encode("utf-8")
    elif kind == "long":
        data = struct.pack("<q", value)
    elif kind == "int":
        data = struct.pack("<i", value)
    elif kind == "boolean":
        data = struct.pack("<i", 1 if value else 0)
    elif kind == "date":
        data = struct.pack("<i", (value - _EPOCH).days)
    elif kind == "double":
        data = struct.pack("<d", 0.0 if value == 0 else value)
    else:
        raise SchemaError(f"type {kind!r} cannot be hashed by the local backend")
    return _signed(xxhash.xxh64_intdigest(data, seed & _MASK64))


def spark_xxhash64(*typed: tuple[Any, str]) -> int:
    """Spark's ``xxhash64(c1, c2, ...)`` of (value, type) pairs: a signed 64-bit integer."""
    h = _SEED
    for value, kind in typed:
        h = _hash_value(value, kind, h)
    return h


# --------------------------------------------------------------------------- helpers
def _infer_type(column: str, values: list) -> str:
    kinds = set()
    for v in values:
        if v is None:
            continue
        if isinstance(v, bool):
            kinds.add("boolean")
        elif isinstance(v, int):
            kinds.add("long")
        elif isinstance(v, float):
            kinds.add("double")
        elif isinstance(v, str):
            kinds.add("string")
        elif isinstance(v, _dt.date) and not isinstance(v, _dt.datetime):
            kinds.add("date")
        else:
            raise SchemaError(f"column {column!r} holds a type the local backend does not read; "
                              f"give its type in schema (one of {sorted(TYPES)})")
    if len(kinds) > 1:
        raise SchemaError(f"column {column!r} holds values of several types; give its type in schema")
    return kinds.pop() if kinds else "string"


def _as_string(value: Any, kind: str) -> str:
    """Spark's cast to string of a key value (string, integral or date)."""
    if kind == "date":
        return value.isoformat()
    return str(value)


def _round_half_up(x: float) -> int:
    """Spark's ``round(x, 0)`` of a finite double: half away from zero, on the exact value."""
    a = abs(x)
    f = math.floor(a)
    r = f + 1 if a - f >= 0.5 else f
    return int(-r if x < 0 else r)


def _fixed(value: Any, clamp) -> int:
    """clamp_to_fixed_point: the value as a double, clamped, times 2^-k, rounded half up."""
    v = float(value)
    lo, hi = float(clamp.lower) + 0.0, float(clamp.upper) + 0.0
    c = lo if v < lo else hi if v > hi else v
    return _round_half_up(c * float(2 ** -clamp.grid_exponent))


def _square(fx: int, comp) -> int:
    """``nsumsq``'s per-row grid integer (dp_spark.backends.spark.component_row_columns), in the same double steps."""
    k2, s = comp.square_grid
    c = comp.clamp
    x = float(fx) * float(Fraction(2) ** c.grid_exponent) - float(c.midpoint)
    half = float(c.half_width * c.half_width / 2)
    y = _round_half_up((x * x - half) * float(Fraction(2) ** -k2))
    return min(max(y, -s), s)


def _bin(fx: int, comp) -> int:
    """``hist``'s per-row bin (dp_spark.backends.spark.component_row_columns), in the same double steps."""
    c = comp.clamp
    lo = float(c.lower * Fraction(2) ** -c.grid_exponent)
    span = float((c.upper - c.lower) * Fraction(2) ** -c.grid_exponent)
    pos = (float(fx) - lo) / span * float(comp.bins)
    return min(max(math.floor(pos), 0), comp.bins - 1)


def _split(v: int) -> tuple[int, int, int]:
    """A long's three parts as the Spark aggregation takes them (arithmetic shifts)."""
    return v & _PART_MASK, (v >> SUM_PART_BITS) & _PART_MASK, v >> (2 * SUM_PART_BITS)


def _sort_key(value: Any):
    """Spark's ascending order, nulls first (the row priority's tie-break)."""
    if isinstance(value, tuple):
        return tuple(_sort_key(v) for v in value)
    return (0,) if value is None else (1, value)


# --------------------------------------------------------------------------- the pass
@dataclass(frozen=True)
class LocalPartials:
    """What the local pass computed.

    ``cells``: public keys only, ``{cell index: {partial: int}}`` exactly as
    ``collect_query_partials`` returns it (the cells present in the data). With private keys,
    ``{(public index, private tuple): {partial: int}}`` for EVERY candidate tuple (before the
    noisy selection), and ``unit_counts``: the distinct units of each private tuple in the
    bounded rows (what the selection thresholds; never published)."""

    cells: dict
    unit_counts: Optional[dict] = None


def table_keys(rows: Iterable[Row], column: str, *, where: Optional[Callable[[Row], Any]] = None,
               kind: Optional[str] = None) -> tuple[str, ...]:
    """The key set a public key table gives (``public_keys: {table, column, where}``), as
    :func:`dp_spark.backends.spark.key_table_frame` and ``collect_table_keys`` read it: the
    distinct non-null values of ``column`` cast to string (``kind``: the column's type, else
    inferred), of the rows the Python predicate ``where`` keeps (the spec's SQL ``where`` is
    not evaluated here: see the module docstring), sorted. The release then reads it as any
    public key set (:meth:`ReleaseSpec.with_table_keys`)."""
    kept = [r for r in rows if where is None or where(dict(r))]
    values = [r[column] for r in kept]
    kind = kind or _infer_type(column, values)
    return tuple(sorted({_as_string(v, kind) for v in values if v is not None}))


def query_partials(rows: Iterable[Row], plan, salt: str, *, where: Optional[Callable[[Row], Any]] = None,
                   schema: Optional[Mapping[str, str]] = None) -> LocalPartials:
    """The exact partials of ``plan`` (a :class:`~dp_spark.statistics.plan.QueryPlan`) over
    ``rows`` (mappings holding at least ``spec.columns``), bounded with ``salt``.

    Privacy contract: the same bounds as the Spark path (module docstring); this function is
    the definition the Spark path is tested against. It draws no noise."""
    spec = plan.spec
    if not isinstance(salt, str) or not salt:
        raise ConfigError("salt must be a non-empty string")
    if (spec.where is None) != (where is None):
        raise ConfigError(f"{spec.source}: the local backend evaluates a spec's where as a Python "
                          "predicate: give where=callable exactly when the spec has a where")
    unit = spec.unit.column
    columns = list(spec.columns)
    rows = [{c: r[c] for c in columns} for r in rows]  # KeyError: a missing column
    types = {c: (schema or {}).get(c) or _infer_type(c, [r[c] for r in rows]) for c in columns}
    for c, t in types.items():
        if t not in TYPES:
            raise SchemaError(f"column {c!r}: type {t!r} is not read by the local backend ({sorted(TYPES)})")
    value_cols = list(dict.fromkeys(c.clamp.column for c in plan.components if c.clamp is not None))
    for v in value_cols:
        if types[v] not in _NUMERIC:
            raise SchemaError(f"value column {v!r} must be numeric")

    rows = [r for r in rows if r[unit] is not None]
    if where is not None:
        rows = [r for r in rows if where(dict(r))]
    for v in value_cols:
        kept = []
        for r in rows:
            x = r[v]
            if x is None or (isinstance(x, float) and math.isnan(x)):
                continue
            if types[v] == "double" and x == 0:
                r = {**r, v: 0.0}
            kept.append(r)
        rows = kept

    public, private = spec.public_key_sets, spec.private_key_sets
    cell_type = "long" if not private else "struct"
    feeds = date_feeds(spec)  # rolling windows: a row feeds several (day, window) cells
    n_w = 1 if feeds is None else feeds.n_windows
    # the index of each key in its column: a bucket maps its declared days to their bucket;
    # the windowed date column contributes 0 (its feeds add the day's part below)
    index = [ks.bucket_index() if ks.bucket is not None
             else {d: 0 for d in feeds.days} if feeds is not None and ks.column == feeds.column
             else {k: i for i, k in enumerate(ks.values)} for ks in public]
    targets = {} if feeds is None else dict(zip(feeds.days, feeds.targets))
    table = []  # (unit, cell, values...) as the Spark path selects them
    for r in rows:
        cell = 0
        for ks, idx in zip(public, index):
            k = r[ks.column]
            i = None if k is None else idx.get(_as_string(k, types[ks.column]))
            if i is None:
                break
            cell = cell * len(ks.values) + i
        else:
            if private:
                priv = tuple(r[ks.column] for ks in private)
                if any(p is None for p in priv):
                    continue
                cell = (cell, tuple(_as_string(p, types[ks.column]) for p, ks in zip(priv, private)))
            if feeds is None:
                table.append((r[unit], cell, *[r[v] for v in value_cols]))
            else:
                day = _as_string(r[feeds.column], types[feeds.column])
                table.extend((r[unit], cell * n_w + t, *[r[v] for v in value_cols]) for t in targets[day])

    if spec.neighbouring is Neighbouring.EVENT:
        by_id: dict = defaultdict(set)
        for t in table:
            by_id[t[0]].add(t)
        table = [next(iter(s)) for s in by_id.values() if len(s) == 1]

    kinds = [types[unit], cell_type, *[types[v] for v in value_cols]]

    def typed_cell(cell):
        if not private:
            return (cell, "long")
        return (((cell[0], "long"), *[(p, "string") for p in cell[1]]), "struct")

    def cell_priority(u, cell) -> tuple:
        return (spark_xxhash64((salt, "string"), ("partition", "string"), (u, kinds[0]), typed_cell(cell)),
                _sort_key(cell))

    def row_priority(t) -> tuple:
        typed = [(t[0], kinds[0]), typed_cell(t[1]), *[(x, k) for x, k in zip(t[2:], kinds[2:])]]
        return (spark_xxhash64((salt, "string"), ("row", "string"), *typed), _sort_key(t))

    b = spec.bounds
    l0, k = b.max_partitions_per_unit, b.max_rows_per_unit
    linf = b.max_rows_per_partition
    by_unit: dict = defaultdict(list)
    for t in table:
        by_unit[t[0]].append(t)
    bounded = []
    pairs: dict = defaultdict(set)  # cell -> the units counted in it (distinct units)
    for u, mine in by_unit.items():
        cells = sorted({t[1] for t in mine}, key=lambda c: cell_priority(u, c))
        for c in cells[:min(l0, k)]:
            pairs[c].add(u)
        keep_cells = set(cells[:l0])
        mine = sorted((t for t in mine if t[1] in keep_cells), key=row_priority)
        if linf is not None:
            seen: dict = defaultdict(int)
            cut = []
            for t in mine:
                seen[t[1]] += 1
                if seen[t[1]] <= linf:
                    cut.append(t)
            mine = cut
        bounded.extend(mine[:k])

    comps = plan.components
    clamps = list(dict.fromkeys(c.clamp for c in comps if c.clamp is not None))
    names: dict[str, int] = {}
    for c in comps:
        for n in _names(c):
            names.setdefault(n, 0)
    # one accumulator per partial prefix: equal components (a sum and a mean's nsum of one
    # column) share their partial columns, as in the Spark aggregation
    per_row: dict = {}
    for c in comps:
        alias = {"sum": c.sum_alias if c.clamp else None, "nsum": c.sum_alias if c.clamp else None,
                 "nsumsq": c.square_alias if c.clamp else None,
                 "hist": c.hist_alias if c.clamp else None}.get(c.kind)
        if alias is not None:
            per_row.setdefault(alias, c)
    out: dict = {}
    col_of = {v: 2 + j for j, v in enumerate(value_cols)}
    for t in bounded:
        cell = out.setdefault(t[1], dict(names))
        fx = {cl: _fixed(t[col_of[cl.column]], cl) for cl in clamps}
        if "dp_rows" in cell:
            cell["dp_rows"] += 1  # one row count, shared by rows and nsum
        for alias, c in per_row.items():
            if c.kind in ("sum", "nsum"):
                _add_parts(cell, alias, fx[c.clamp])
            elif c.kind == "nsumsq":
                _add_parts(cell, alias, _square(fx[c.clamp], c))
            else:
                cell[f"{alias}_{_bin(fx[c.clamp], c)}"] += 1
    if any(c.kind == "units" for c in comps):
        for c, units in pairs.items():
            out.setdefault(c, dict(names))["dp_units"] = len(units)
    if not private:
        return LocalPartials(cells=out if feeds is None else split_windows(spec, out))
    per_tuple: dict = defaultdict(set)
    for t in bounded:
        per_tuple[t[1][1]].add(t[0])
    return LocalPartials(cells=out, unit_counts={p: len(us) for p, us in per_tuple.items()})


def _add_parts(cell: dict, alias: str, v: int) -> None:
    for suffix, part in zip(("_lo", "_mid", "_hi"), _split(v)):
        cell[alias + suffix] += part


def _names(comp) -> list[str]:
    """The partial columns of one component (those of ``Component.aggregates``)."""
    if comp.kind == "rows":
        return ["dp_rows"]
    if comp.kind == "units":
        return ["dp_units"]
    if comp.kind in ("sum", "nsum"):
        parts = [f"{comp.sum_alias}{s}" for s in ("_lo", "_mid", "_hi")]
        return parts + (["dp_rows"] if comp.kind == "nsum" else [])
    if comp.kind == "nsumsq":
        return [f"{comp.square_alias}{s}" for s in ("_lo", "_mid", "_hi")]
    if comp.kind == "hist":
        return [f"{comp.hist_alias}_{j}" for j in range(comp.bins)]
    raise ValueError(f"unknown component kind {comp.kind!r}")


def select_private_keys(local: LocalPartials, plan, source=None) -> tuple[dict[int, dict[str, int]], list]:
    """The noisy selection of the private key tuples from the local candidates, as the Spark
    path does it (``count + Z >= threshold``; the ``max_tuples`` largest noisy counts, ties by
    the key; at most ``max_keys`` values per column): ``(partials, tuples)`` as
    ``collect_query_partials`` returns them, ready for ``plan.noise``. ``source``: the noise
    source of the draws (OpenDP's exact sampler by default; a seeded one in tests)."""
    spec, sel = plan.spec, plan.selection
    if sel is None or local.unit_counts is None:
        raise ConfigError(f"{spec.source}: this release has no private key columns")
    candidates = sorted(local.unit_counts)
    noisy = keep_over_threshold([local.unit_counts[t] for t in candidates], sel.scale, sel.threshold, source,
                                mechanism=sel.mechanism)
    passed = sorted(((v, t) for t, v in zip(candidates, noisy) if v is not None), key=lambda vt: (-vt[0], vt[1]))
    chosen = limit_keys(passed[:sel.max_tuples], sel.max_keys, sel.max_tuples)
    order = [isinstance(ks, PrivateKeys) for ks in spec.key_sets]
    tuples: list[tuple[str, ...]] = []
    partials: dict[int, dict[str, int]] = {}
    for p_idx, pub in enumerate(key_tuples(spec.public_key_sets)):
        for priv in chosen:
            pi, vi = iter(pub), iter(priv)
            tuples.append(tuple(next(vi) if is_private else next(pi) for is_private in order))
            got = local.cells.get((p_idx, priv))
            if got is not None:
                partials[len(tuples) - 1] = dict(got)
    return partials, tuples
