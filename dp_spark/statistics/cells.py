"""A release's cells as columns, from the noise step to the Delta write, without a Python
object per cell on the way.

``QueryPlan.noise_columns`` returns :class:`CellColumns`: one :class:`CellBlock` per
statistic, each field either a column (a numpy vector or a list, one entry per key tuple) or a
:class:`Const` (the same value for every cell of the block: the statistic's name, its
mechanism and noise figures, and the release's common fields once they are added with
:meth:`CellColumns.with_common`). The key tuples are columns too, one per group-by column,
shared by the blocks of one release. From there:

* :meth:`CellColumns.record_batches` builds the Arrow record batches of the release table
  (driver path: the one Delta append; executor path: each Arrow batch of ``mapInArrow``);
* :meth:`CellColumns.dicts` gives the per-cell dicts (``QueryPlan.noise``, the merge of small
  groups, the returned result), in the same order and with the same values.

Per-cell dicts (a stream's points, thresholded cells) come in through
:meth:`CellColumns.from_dicts`: one Arrow builder for every release write.

Noisy values: driver or task memory only, never logged before the write commits. Nothing here
imports pyspark.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterator, Mapping, Optional, Sequence

import numpy as np

__all__ = ["CellBlock", "CellColumns", "Const", "canonical_keys"]


@dataclass(frozen=True)
class Const:
    """One value for every cell of a block."""

    value: Any


@dataclass(frozen=True)
class CellBlock:
    """``size`` cells. ``fields``: name -> a sequence of ``size`` values, or a :class:`Const`.
    ``key_values``: group-by column -> its ``size`` key values (the cells' ``keys`` map, in
    group-by order); None when ``fields`` holds ``keys`` itself (cells given as dicts)."""

    size: int
    fields: Mapping[str, Any]
    key_values: Optional[Mapping[str, Sequence[str]]] = None

    def column(self, name: str) -> list:
        """Field ``name`` as a list of Python values (None where the block lacks the field)."""
        if name == "keys" and self.key_values is not None:
            names = list(self.key_values)
            cols = [self.key_values[c] for c in names]
            return [dict(zip(names, vals)) for vals in zip(*cols)] if names else [{} for _ in range(self.size)]
        v = self.fields.get(name)
        if v is None or isinstance(v, Const):
            return [None if v is None else v.value] * self.size
        return v.tolist() if isinstance(v, np.ndarray) else list(v)


@dataclass(frozen=True)
class CellColumns:
    """The cells of a release (or of one executor batch of it): blocks in order."""

    blocks: tuple[CellBlock, ...] = field(default_factory=tuple)

    def __len__(self) -> int:
        return sum(b.size for b in self.blocks)

    def __bool__(self) -> bool:
        return len(self) > 0

    @staticmethod
    def from_dicts(cells: Sequence[Mapping[str, Any]]) -> "CellColumns":
        """Per-cell dicts (each with its ``keys`` map) as one block."""
        names: list[str] = []
        for c in cells:
            for k in c:
                if k not in names:
                    names.append(k)
        fields = {k: [c.get(k) for c in cells] for k in names}
        return CellColumns((CellBlock(len(cells), fields),))

    def with_common(self, common: Mapping[str, Any]) -> "CellColumns":
        """Every block with ``common``'s fields added as constants; a cell's own field wins
        (as ``{**common, **cell}``)."""
        out = []
        for b in self.blocks:
            fields = {k: Const(v) for k, v in common.items() if k not in b.fields}
            fields.update(b.fields)
            out.append(CellBlock(b.size, fields, b.key_values))
        return CellColumns(tuple(out))

    def distinct(self, name: str) -> set:
        """The distinct values of field ``name`` (a constant counts once)."""
        out: set = set()
        for b in self.blocks:
            v = b.fields.get(name)
            if isinstance(v, Const):
                out.add(v.value)
            else:
                out.update(b.column(name))
        return out

    def dicts(self, names: Optional[Sequence[str]] = None) -> list[dict[str, Any]]:
        """One dict per cell, block by block. ``names``: exactly these fields (None where a
        block lacks one); by default each block's own fields and ``keys``."""
        out: list[dict[str, Any]] = []
        for b in self.blocks:
            if not b.size:
                continue
            fs = list(names) if names is not None else (
                [k for k in b.fields if k != "keys"] + ["keys"] if (b.key_values is not None or "keys" in b.fields)
                else list(b.fields))
            cols = [b.column(f) for f in fs]
            out.extend(dict(zip(fs, vals)) for vals in zip(*cols))
        return out

    def record_batches(self, schema) -> Iterator[Any]:
        """One Arrow record batch of ``schema`` (a ``pyarrow.Schema``) per non-empty block.
        A field the block lacks is null (the schema says which may be); a map field is the
        cells' ``keys``; a timestamp with a time zone takes a naive ``datetime`` as local
        time (what Spark makes of a naive time: :func:`instant`)."""
        import pyarrow as pa

        for b in self.blocks:
            if not b.size:
                continue
            arrays = [_arrow_column(b, f, b.size) for f in schema]
            yield pa.RecordBatch.from_arrays(arrays, schema=schema)

    def arrow_table(self, schema):
        import pyarrow as pa

        batches = list(self.record_batches(schema))
        return pa.Table.from_batches(batches, schema=schema) if batches else schema.empty_table()


def instant(t: Optional[datetime]) -> Optional[datetime]:
    """A ``created_at`` as the UTC instant Spark makes of it: a naive time is in the Python
    process's local time zone (what ``createDataFrame(rows, schema)`` and ``F.lit`` assume,
    not the session's ``spark.sql.session.timeZone``)."""
    if t is None:
        return None
    return datetime.fromtimestamp(t.timestamp(), tz=timezone.utc)


def _arrow_column(b: CellBlock, f, n: int):
    import pyarrow as pa

    t = f.type
    if pa.types.is_map(t) and b.key_values is not None:
        names = list(b.key_values)
        k = len(names)
        offsets = pa.array(np.arange(0, n * k + 1, k, dtype=np.int32) if k else np.zeros(n + 1, dtype=np.int32))
        if k:
            items = np.empty(n * k, dtype=object)
            for j, c in enumerate(names):
                items[j::k] = np.asarray(b.key_values[c], dtype=object)
            keys = pa.array(np.tile(np.asarray(names, dtype=object), n), type=pa.string())
            vals = pa.array(items, type=pa.string())
        else:
            keys = vals = pa.array([], type=pa.string())
        return pa.MapArray.from_arrays(offsets, keys, vals, type=t)
    v = b.fields.get(f.name)
    if isinstance(v, Const) or v is None:
        value = None if v is None else v.value
        if pa.types.is_timestamp(t) and t.tz is not None:
            value = instant(value)
        if value is None:
            return pa.nulls(n, type=t)
        return pa.repeat(pa.scalar(value, type=t), n)
    if pa.types.is_map(t):
        return pa.array([None if m is None else list(m.items()) for m in v], type=t)
    if pa.types.is_timestamp(t) and t.tz is not None:
        v = [instant(x) for x in (v.tolist() if isinstance(v, np.ndarray) else v)]
    return pa.array(v, type=t)


def canonical_keys(columns: Sequence[Sequence[str]], n: int) -> list[str]:
    """``key`` of each of ``n`` key tuples given by column (:func:`~dp_spark.statistics.plan.canonical_key`
    per tuple, without a JSON encoder call per cell): the value itself for one column,
    "__all__" for none, else the JSON array ``["a","b"]`` (each distinct value encoded once)."""
    if not columns:
        return ["__all__"] * n
    if len(columns) == 1:
        return list(columns[0])
    encoded = []
    for col in columns:
        memo: dict[str, str] = {}
        encoded.append([memo[v] if v in memo else memo.setdefault(v, json.dumps(v)) for v in col])
    return ["[" + ",".join(parts) + "]" for parts in zip(*encoded)]
