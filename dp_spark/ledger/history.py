"""The policy history of each budget (``dp_policies``): one row per policy the ledger
registered (the first registration, then each change an admin accepted), chained per budget
by an HMAC, with the content hash of each policy.

Nothing here imports pyspark.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Optional

from dp_spark.ledger.dialects import Cursor
from dp_spark.ledger.integrity import BudgetRow, Integrity
from dp_spark.ledger.policy import BudgetPolicy
from dp_spark.ledger.records import (
    GENESIS,
    PolicyRecord,
    field_changes,
    parse_ts,
    policy_changes,
    policy_hash,
    policy_json,
)
from dp_spark.ledger.schema import POLICY_COLS

__all__ = ["PolicyHistory"]


class PolicyHistory(Integrity):
    """Append to and read (verified) the policy history of the budgets."""

    def _last_policy(self, cur: Cursor, budget_id: str) -> Optional[tuple]:
        return cur.one(f"SELECT {POLICY_COLS} FROM dp_policies WHERE budget_id = ? ORDER BY version DESC LIMIT 1",
                       (budget_id,))

    def _append_policy(self, cur: Cursor, policy: BudgetPolicy, principal: str, reason: str, stamp: str,
                       previous: Optional[BudgetPolicy]) -> PolicyRecord:
        last = self._last_policy(cur, policy.budget_id)
        version = 1 if last is None else int(last[1]) + 1
        prev_hash = GENESIS if last is None else str(last[7])
        r = (policy.budget_id, version, policy_hash(policy), policy_json(policy), principal, reason, stamp)
        cur.x(f"INSERT INTO dp_policies ({POLICY_COLS}) VALUES ({', '.join(['?'] * 8)})",
              (*r, self._policy_row_hash(prev_hash, r)))
        return PolicyRecord(policy.budget_id, version, r[2], json.loads(r[3]), principal, reason, parse_ts(stamp),
                            tuple(policy_changes(previous, policy)) if previous is not None else ())

    def _policy_problems(self, cur: Cursor, b: BudgetRow) -> tuple[list[str], list[PolicyRecord]]:
        bid = b.policy.budget_id
        rows = cur.q(f"SELECT {POLICY_COLS} FROM dp_policies WHERE budget_id = ? ORDER BY version", (bid,))
        problems: list[str] = []
        records: list[PolicyRecord] = []
        prev, prev_policy = GENESIS, None
        for i, r in enumerate(rows, start=1):
            if int(r[1]) != i:
                problems.append(f"budget {bid!r}: policy version {r[1]}: sequence gap (expected {i})")
            if not hmac.compare_digest(str(r[7]), self._policy_row_hash(prev, r)):
                problems.append(f"budget {bid!r}: policy version {r[1]}: edited or inserted outside the ledger")
            try:
                content = json.loads(r[3])
            except ValueError:
                content = {}
            if hashlib.sha256(str(r[3]).encode("utf-8")).hexdigest() != r[2]:
                problems.append(f"budget {bid!r}: policy version {r[1]}: content does not match its hash")
            records.append(PolicyRecord(bid, int(r[1]), str(r[2]), content, str(r[4]), str(r[5]), parse_ts(r[6]),
                                        tuple(field_changes(prev_policy, content)) if prev_policy is not None else ()))
            prev, prev_policy = str(r[7]), content
        if rows and str(rows[-1][2]) != policy_hash(b.policy):
            problems.append(f"budget {bid!r}: the registered policy is not the last one in its policy history "
                            "(changed or history truncated outside the ledger)")
        return problems, records

    def policy_history(self, budget_id: str) -> list[PolicyRecord]:
        """Every policy the ledger registered for ``budget_id``, oldest first, verified (MAC
        chain, content hashes, and that the last is the policy in force)."""
        def fn(cur: Cursor) -> list[PolicyRecord]:
            b = self._load_budget(cur, budget_id, lock=False)
            problems, records = self._policy_problems(cur, b)
            self._raise_problems(problems)
            return records

        return self._run("policy_history", fn, write=False)
