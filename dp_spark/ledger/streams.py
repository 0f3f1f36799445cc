"""The noisy nodes of streams under continual release (``dp_stream_nodes``).

A stream (``stream: {horizon_days, start}``, :mod:`dp_spark.statistics.stream`) has ONE ledger
entry, its charge for the whole horizon; under that entry's id this table holds, per noisy
component of the stream, the noisy value (grid units, an exact integer) of every node of its
binary tree completed so far. A node is written once, when a refresh first needs it, with a
noise drawn for it then; every later point reuses it (a node redrawn would average the noise
away). Rows are MAC'd and guarded against update and delete like ``dp_fingerprints``.

The values are compared and summed, never shown: no method here puts one in a message, the
audit log does not hold them, and the Delta mirror of the ledger does not copy this table.

Nothing here imports pyspark.
"""

from __future__ import annotations

import hmac
from typing import Mapping

from dp_spark.errors import LedgerError, LedgerIntegrityError
from dp_spark.ledger.dialects import Cursor
from dp_spark.ledger.integrity import Integrity, edited_rows
from dp_spark.ledger.records import UnknownReleaseError, check_text, ts_text
from dp_spark.ledger.schema import STREAM_NODE_COLS

__all__ = ["StreamNodes"]

Node = tuple[int, int]


def _check_nodes(values: Mapping[Node, int]) -> dict[Node, int]:
    out = {}
    for node, v in values.items():
        ok = (isinstance(node, tuple) and len(node) == 2
              and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in node)
              and isinstance(v, int) and not isinstance(v, bool))
        if not ok:
            raise LedgerError("a stream node is (level, index) -> an integer value")  # never echoed
        out[node] = v
    return out


class StreamNodes(Integrity):
    """Record and read the noisy nodes of a stream (each MAC checked)."""

    def _stream_node_mac(self, stream_id: str, component: str, level: int, idx: int, value: str, at: str) -> str:
        return self._mac("stream_node", stream_id, component, level, idx, value, at)

    def _checked_stream_node(self, row: tuple) -> tuple[Node, int]:
        stream_id, component, level, idx, value, at, mac = row
        if not hmac.compare_digest(str(mac), self._stream_node_mac(stream_id, component, int(level), int(idx),
                                                                   str(value), str(at))):
            raise LedgerIntegrityError(
                f"ledger integrity check failed: a node of stream {stream_id!r} was edited outside the ledger")
        return (int(level), int(idx)), int(value)

    def stream_nodes(self, stream_id: str, component: str) -> dict[Node, int]:
        """The stored nodes of ``component`` of stream ``stream_id`` (MACs checked): node -> value."""
        check_text(stream_id, "stream_id")
        check_text(component, "component")

        def fn(cur: Cursor) -> dict[Node, int]:
            rows = cur.q(f"SELECT {STREAM_NODE_COLS} FROM dp_stream_nodes WHERE stream_id = ? AND component = ?",
                         (stream_id, component))
            return dict(self._checked_stream_node(r) for r in rows)

        return self._run("stream_nodes", fn, write=False)

    def record_stream_nodes(self, stream_id: str, component: str, values: Mapping[Node, int]) -> dict[Node, int]:
        """Store each node of ``values`` not stored yet (insert-if-absent, one transaction) and
        return the stored value of every node of ``values``: a node another run stored first
        keeps ITS value (the caller publishes what is returned, never what it offered).
        ``stream_id`` must be a ledger entry (the stream's charge)."""
        check_text(stream_id, "stream_id")
        check_text(component, "component")
        nodes = _check_nodes(values)

        def fn(cur: Cursor) -> dict[Node, int]:
            if cur.one("SELECT 1 FROM dp_entries WHERE release_id = ?", (stream_id,)) is None:
                raise UnknownReleaseError(f"no ledger entry for stream {stream_id!r}")
            stamp = ts_text(self._now(None))
            for (level, idx), v in sorted(nodes.items()):
                text = str(v)
                cur.x(f"INSERT INTO dp_stream_nodes ({STREAM_NODE_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?) "
                      "ON CONFLICT (stream_id, component, level, idx) DO NOTHING",
                      (stream_id, component, level, idx, text, stamp,
                       self._stream_node_mac(stream_id, component, level, idx, text, stamp)))
            rows = cur.q(f"SELECT {STREAM_NODE_COLS} FROM dp_stream_nodes WHERE stream_id = ? AND component = ?",
                         (stream_id, component))
            stored = dict(self._checked_stream_node(r) for r in rows)
            if any(n not in stored for n in nodes):
                raise LedgerError("internal: a stream node was not stored")
            return {n: stored[n] for n in nodes}

        return self._run("record_stream_nodes", fn, write=True)

    def _stream_node_problems(self, cur: Cursor) -> list[str]:
        return edited_rows(cur.q(f"SELECT {STREAM_NODE_COLS} FROM dp_stream_nodes ORDER BY stream_id, component, level, idx"), self._checked_stream_node,
                           lambda row: f"a node of stream {row[0]!r}")
