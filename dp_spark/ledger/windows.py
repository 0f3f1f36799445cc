"""Spend windows: what a budget has spent in the window of an instant, in O(1).

``spent`` comes from a per-budget spend summary (``dp_ledger_meta`` row ``spend:<budget_id>``:
the lifetime total and per-UTC-day totals, MAC'd together with the chain head it describes).
A summary that does not describe the current head (none yet, or written by an older ledger)
makes that one call verify the whole chain and rebuild it. :meth:`Ledger.verify` still
recomputes everything. The windows themselves (none, daily, monthly, rolling) are the
policy's (:class:`~dp_spark.ledger.policy.WindowPolicy`).

Nothing here imports pyspark.
"""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Mapping, Optional, Sequence

from dp_spark.core.budget import MEASURES, Budget, budget_from_json
from dp_spark.errors import DpSparkError, LedgerIntegrityError
from dp_spark.ledger.dialects import Cursor
from dp_spark.ledger.integrity import BudgetRow, Integrity
from dp_spark.ledger.policy import BudgetPolicy
from dp_spark.ledger.records import GENESIS, LedgerEntry, canonical, ts_text
from dp_spark.ledger.schema import ENTRY_COLS, SPEND_PREFIX

__all__ = ["Spend", "SpendWindows", "utc_day", "window_horizon"]


@dataclass(frozen=True)
class Spend:
    """A budget's spend summary at chain head (seq, hash): the lifetime total of its charges
    and, for every UTC day >= ``from_day`` (YYYY-MM-DD), the total of the entries created that
    day (days without entries are absent). Days before ``from_day`` were pruned."""

    seq: int
    hash: str
    total: Budget
    from_day: str
    days: Mapping[str, Budget]


def utc_day(ts: str) -> str:
    return ts[:10]


def window_horizon(policy: BudgetPolicy, t: datetime) -> str:
    """The first UTC day whose total the current window (at ``t``) may need."""
    start, _ = policy.window.bounds(t)
    return utc_day(ts_text(start if start is not None else t))


class SpendWindows(Integrity):
    """The spend summaries of the budgets, and ``spent`` in a window from them."""

    def _load_spend(self, cur: Cursor, b: BudgetRow) -> Optional[Spend]:
        """The budget's spend summary if it describes its current head; None when there is none
        or it describes an older head. A summary whose MAC fails is an integrity error."""
        bid = b.policy.budget_id
        row = cur.one("SELECT value FROM dp_ledger_meta WHERE name = ?", (SPEND_PREFIX + bid,))
        if row is None:
            return None
        s = self._parse_spend(bid, row[0])
        if s.seq != b.head_seq or s.hash != b.head_hash or s.total.MEASURE != b.policy.measure:
            return None
        return s

    def _parse_spend(self, bid: str, text: str) -> Spend:
        try:
            d = json.loads(text)
            seq, head, total, from_day, days, mac = (
                int(d["seq"]), str(d["hash"]), d["total"], str(d["from"]), d["days"], str(d["mac"]))
            ok = hmac.compare_digest(mac, self._spend_mac(bid, seq, head, total, from_day, days))
            if ok:
                return Spend(seq, head, budget_from_json(total), from_day,
                              {str(k): budget_from_json(v) for k, v in days.items()})
        except (TypeError, ValueError, KeyError, AttributeError, DpSparkError):
            pass
        raise LedgerIntegrityError(
            f"ledger integrity check failed: budget {bid!r}: the spend summary was edited outside the ledger"
        )

    def _store_spend(self, cur: Cursor, bid: str, s: Spend) -> None:
        total = s.total.to_json()
        days = {k: v.to_json() for k, v in sorted(s.days.items())}
        value = canonical({"seq": s.seq, "hash": s.hash, "total": total, "from": s.from_day, "days": days,
                           "mac": self._spend_mac(bid, s.seq, s.hash, total, s.from_day, days)})
        cur.x("INSERT INTO dp_ledger_meta (name, value) VALUES (?, ?) "
              "ON CONFLICT (name) DO UPDATE SET value = excluded.value", (SPEND_PREFIX + bid, value))

    @staticmethod
    def _spend_of(b: BudgetRow, entries: Sequence[LedgerEntry], from_day: str) -> Spend:
        zero = MEASURES[b.policy.measure].zero()
        total = zero
        days: dict[str, Budget] = {}
        for e in entries:
            total = total + e.charge
            d = utc_day(ts_text(e.created_at))
            if d >= from_day:
                days[d] = days.get(d, zero) + e.charge
        return Spend(b.head_seq, b.head_hash, total, from_day, days)

    def _summary_spent(self, cur: Cursor, b: BudgetRow, s: Spend, t: datetime) -> Optional[Budget]:
        """Spent in the window at ``t`` from the summary, or None if it lacks the days needed."""
        policy = b.policy
        zero = MEASURES[policy.measure].zero()
        start, end = policy.window.bounds(t)
        if start is None:
            return s.total
        sd = utc_day(ts_text(start))
        if sd < s.from_day:
            return None
        if policy.window.kind != "rolling":
            assert end is not None  # a calendar window has an end
            ed = utc_day(ts_text(end))
            return sum((v for d, v in s.days.items() if sd <= d < ed), zero)
        # rolling: whole days from the start's day on (later ones too: a skewed clock cannot
        # hide spend), less the entries of the start's day created before the start. Those are
        # verified one by one: a forged or inflated one could only lower spent, so none is trusted.
        spent = sum((v for d, v in s.days.items() if d >= sd), zero)
        early = cur.q(f"SELECT {ENTRY_COLS} FROM dp_entries WHERE budget_id = ? AND created_at >= ? "
                      "AND created_at < ? ORDER BY seq", (policy.budget_id, sd + "T00:00:00.000000Z", ts_text(start)))
        for r in early:
            spent = spent - self._verified_entry(cur, b, r).charge
        return spent

    def _window_spent(self, cur: Cursor, b: BudgetRow, t: datetime) -> tuple[Budget, Spend]:
        """Spent in the window at ``t`` and the summary at the current head. From the stored
        summary when it describes the head and covers the window (O(1)); otherwise the whole
        chain is verified and the summary rebuilt from it."""
        if b.head_seq == 0:
            return MEASURES[b.policy.measure].zero(), Spend(0, GENESIS, MEASURES[b.policy.measure].zero(),
                                                             window_horizon(b.policy, t), {})
        s = self._load_spend(cur, b)
        if s is not None:
            spent = self._summary_spent(cur, b, s, t)
            if spent is not None:
                return spent, s
        entries = self._verified_entries(cur, b)
        return self._spent(b.policy, entries, t)[0], self._spend_of(b, entries, window_horizon(b.policy, t))

    def _spend_problems(self, cur: Cursor, b: BudgetRow, entries: Sequence[LedgerEntry]) -> list[str]:
        """verify(): the summary's MAC, and its totals when it describes the head."""
        bid = b.policy.budget_id
        row = cur.one("SELECT value FROM dp_ledger_meta WHERE name = ?", (SPEND_PREFIX + bid,))
        if row is None:
            return []
        try:
            s = self._parse_spend(bid, row[0])
        except LedgerIntegrityError as exc:
            return [str(exc).replace("ledger integrity check failed: ", "")]
        if s.seq != b.head_seq or s.hash != b.head_hash:
            return []  # describes an older head: ignored, rebuilt by the next reserve
        want = self._spend_of(b, entries, s.from_day)
        if s.total != want.total or dict(s.days) != dict(want.days):
            return [f"budget {bid!r}: the spend summary does not match the entries"]
        return []

    @staticmethod
    def _spent(policy: BudgetPolicy, entries: list[LedgerEntry], now: datetime) -> tuple[Budget, int]:
        spent = MEASURES[policy.measure].zero()
        n = 0
        for e in entries:
            if policy.window.contains(e.created_at, now):
                spent = spent + e.charge
                n += 1
        return spent, n
