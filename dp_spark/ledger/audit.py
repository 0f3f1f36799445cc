"""The audit log (``dp_audit``): append-only rows (who, what, which spec, which decision; never
a data value), hash-chained, with the chain head MAC'd in ``dp_ledger_meta``.

Nothing here imports pyspark.
"""

from __future__ import annotations

import hmac
import json
from datetime import datetime
from typing import Any, Mapping, Optional

from dp_spark.core.budget import MEASURES
from dp_spark.errors import LedgerError, LedgerIntegrityError
from dp_spark.ledger.dialects import Cursor, Retry
from dp_spark.ledger.integrity import Integrity
from dp_spark.ledger.records import GENESIS, AuditRow, canonical, charge_text, check_text, parse_ts, ts_text
from dp_spark.ledger.schema import AUDIT_COLS

__all__ = ["AuditLog"]


class AuditLog(Integrity):
    """Append audit rows and read them back (verified)."""

    def _audit_head(self, cur: Cursor, *, lock: bool) -> tuple[int, str]:
        row = cur.one("SELECT value FROM dp_ledger_meta WHERE name = 'audit_head'" + (self.for_update if lock else ""))
        if row is None:
            raise LedgerIntegrityError("ledger integrity check failed: the audit chain head is missing or unreadable")
        try:
            d = json.loads(row[0])
            seq, head, mac = int(d["seq"]), str(d["hash"]), str(d["mac"])
        except (TypeError, ValueError, KeyError):
            raise LedgerIntegrityError("ledger integrity check failed: the audit chain head is missing or unreadable") from None
        if not hmac.compare_digest(mac, self._mac("audit-head", seq, head)):
            raise LedgerIntegrityError("ledger integrity check failed: the audit chain head was edited")
        return seq, head

    def _audit_problems(self, cur: Cursor) -> list[str]:
        try:
            seq, head = self._audit_head(cur, lock=False)
        except LedgerIntegrityError as exc:
            return [str(exc).replace("ledger integrity check failed: ", "")]
        problems = []
        prev = GENESIS
        rows = cur.q(f"SELECT {AUDIT_COLS} FROM dp_audit ORDER BY seq")
        for i, r in enumerate(rows, start=1):
            if int(r[0]) != i:
                problems.append(f"audit seq {r[0]}: sequence gap (expected {i})")
            if not hmac.compare_digest(str(r[10]), self._audit_hash(prev, r)):
                problems.append(f"audit seq {r[0]}: row hash mismatch (edited or inserted outside the ledger)")
            prev = str(r[10])
        if seq != len(rows) or head != prev:
            problems.append(f"audit chain head says {seq} rows but {len(rows)} are stored")
        return problems

    def audit_rows_since(self, after: int) -> tuple[list[AuditRow], int]:
        """Audit rows with ``seq > after`` and the audit head's seq, verified in O(rows
        returned): each row's hash links to the stored row ``after`` (or the genesis) and the
        last one is the MAC'd audit head. An edit to a row at or before ``after`` (other than
        row ``after``'s own hash) is not seen here: ``verify()`` finds it."""
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise LedgerError("after must be a non-negative integer")

        def fn(cur: Cursor) -> tuple[list[AuditRow], int]:
            seq, head = self._audit_head(cur, lock=False)
            if after >= seq:
                return [], seq
            rows = cur.q(f"SELECT {AUDIT_COLS} FROM dp_audit WHERE seq >= ? AND seq <= ? ORDER BY seq",
                         (max(after, 1), seq))
            prev, body = self._after_watermark(rows, after, 0, 10, "audit seq")
            problems = []
            for i, r in enumerate(body, start=after + 1):
                if int(r[0]) != i:
                    problems.append(f"audit seq {r[0]}: sequence gap (expected {i})")
                if not hmac.compare_digest(str(r[10]), self._audit_hash(prev, r)):
                    problems.append(f"audit seq {r[0]}: row hash mismatch (edited or inserted outside the ledger)")
                prev = str(r[10])
            if after + len(body) != seq or prev != head:
                problems.append(f"audit chain head says {seq} rows but the stored chain ends at seq {after + len(body)}")
            self._raise_problems(problems)
            return [self._audit(r) for r in body], seq

        return self._run("audit_rows_since", fn, write=False)

    @staticmethod
    def _audit(r: tuple) -> AuditRow:
        return AuditRow(int(r[0]), parse_ts(r[1]), r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10])

    def append_audit(
        self,
        principal: str,
        action: str,
        spec_name: Optional[str],
        spec_version: Optional[str],
        decision: str,
        release_id: Optional[str],
        charge_json: Any,
        detail: Any,
        now: Optional[datetime] = None,
    ) -> AuditRow:
        """Append one audit row (append-only, hash-chained). Never pass data values.

        ``charge_json``: JSON text, a budget amount, or None. ``detail``: text, a mapping
        (stored as canonical JSON) or None.
        """
        check_text(principal, "principal")
        check_text(action, "action")
        check_text(decision, "decision")
        check_text(spec_name, "spec_name", optional=True)
        check_text(spec_version, "spec_version", optional=True)
        check_text(release_id, "release_id", optional=True)
        if charge_json is not None and not isinstance(charge_json, str):
            if type(charge_json) in MEASURES.values():
                charge_json = charge_text(charge_json)
            else:
                raise LedgerError("charge_json must be JSON text, a budget amount or None")
        if isinstance(charge_json, str):
            try:
                json.loads(charge_json)
            except ValueError:
                raise LedgerError("charge_json is not valid JSON") from None
        if isinstance(detail, Mapping):
            detail = canonical(dict(detail))
        elif detail is not None and not isinstance(detail, str):
            raise LedgerError("detail must be text, a mapping or None")
        if detail == "":
            detail = None

        def fn(cur: Cursor) -> AuditRow:
            return self._append_audit_in(cur, ts_text(self._now(now)), (
                principal, action, spec_name, spec_version, decision, release_id, charge_json, detail))

        return self._run("append_audit", fn, write=True)

    def _append_audit_in(self, cur: Cursor, at: str, fields: tuple) -> AuditRow:
        """Append one audit row inside the caller's write transaction."""
        seq, head = self._audit_head(cur, lock=True)
        r = (seq + 1, at, *fields)
        rh = self._audit_hash(head, r)
        cur.x(f"INSERT INTO dp_audit ({AUDIT_COLS}) VALUES ({', '.join(['?'] * 11)})", (*r, rh))
        n = cur.x(
            "UPDATE dp_ledger_meta SET value = ? WHERE name = 'audit_head' AND value = ?",
            (self._audit_head_value(seq + 1, rh), self._audit_head_value(seq, head)),
        )
        if n != 1:
            raise Retry()
        return self._audit((*r, rh))

    def audit_rows(self, limit: Optional[int] = None) -> list[AuditRow]:
        """Audit rows in order; with ``limit``, the latest ``limit`` rows (still in order)."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise LedgerError("limit must be a non-negative integer")

        def fn(cur: Cursor) -> list[AuditRow]:
            if limit is None:
                rows = cur.q(f"SELECT {AUDIT_COLS} FROM dp_audit ORDER BY seq")
            else:
                rows = cur.q(f"SELECT {AUDIT_COLS} FROM dp_audit ORDER BY seq DESC LIMIT ?", (limit,))[::-1]
            return [self._audit(r) for r in rows]

        return self._run("audit_rows", fn, write=False)
