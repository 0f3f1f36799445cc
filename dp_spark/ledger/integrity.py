"""The ledger's integrity: every MAC it writes, and the checks of the budget rows and the
entry chains.

Every entry carries ``row_hash = HMAC-SHA256(key, prev_row_hash, immutable fields)`` chained
per budget, and ``state_mac`` over its mutable fields (state, owner, lease, commit time); the
budget row carries a MAC over its policy and the chain head (last seq, last hash), so an
edited, inserted or deleted row, a raised cap or a truncated tail fails
:meth:`~dp_spark.ledger.store.SqlLedger.verify`. Bindings, policy-history rows, version rows,
audit rows and the spend summaries are MAC'd too (each in its own domain, below). Triggers
refuse UPDATE/DELETE of immutable columns as a first line.

The write path checks the chain's tail from the MAC'd head back (:meth:`Integrity._verified_tail`,
the last ``verify_tail`` entries, their links, and that nothing lies past the head) and the
entry it acts on (:meth:`Integrity._verified_entry`): O(1) in the number of entries.

Nothing here imports pyspark.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Iterable, NoReturn, Optional, Sequence

from dp_spark.errors import DpSparkError, LedgerIntegrityError
from dp_spark.ledger.dialects import Cursor
from dp_spark.ledger.policy import BudgetPolicy, WindowPolicy
from dp_spark.ledger.records import (
    GENESIS,
    STATES,
    LedgerEntry,
    UnknownBudgetError,
    canonical,
    parse_charge,
    parse_ts,
)
from dp_spark.ledger.schema import BUDGET_COLS, ENTRY_COLS
from dp_spark.ledger.transactions import Transactions

__all__ = ["BudgetRow", "Integrity"]


def edited_rows(rows: Iterable[Any], check: Callable[[Any], Any], describe: Callable[[Any], str]) -> list[str]:
    """For each of ``rows`` whose MAC ``check`` refuses (:class:`LedgerIntegrityError`), the
    problem ``verify()`` reports: ``describe(row)`` + " edited outside the ledger"."""
    problems = []
    for row in rows:
        try:
            check(row)
        except LedgerIntegrityError:
            problems.append(f"{describe(row)} edited outside the ledger")
    return problems


@dataclass(frozen=True)
class BudgetRow:
    policy: BudgetPolicy
    head_seq: int
    head_hash: str
    updated_at: str
    texts: tuple  # the stored policy columns, as text, in BUDGET_COLS order (without head/mac)


class Integrity(Transactions):
    """The MACs of every table, the budget rows, and the verified reads of the entry chains."""

    # reserve/commit fully verify this many entries at the end of a budget's chain (plus the
    # link to the entry before them and the absence of any entry past the head): O(1) work.
    verify_tail = 8

    # -- the MACs (one domain per kind of row) ------------------------------------------
    def _mac(self, domain: str, *parts: Any) -> str:
        msg = domain.encode() + b"\x00" + canonical(list(parts)).encode("utf-8")
        return hmac.new(self._key, msg, hashlib.sha256).hexdigest()

    # -- budgets ---------------------------------------------------------------------
    def _budget_mac(self, texts: tuple, head_seq: int, head_hash: str, updated_at: str) -> str:
        return self._mac("budget", *texts, head_seq, head_hash, updated_at)

    def _load_budget(self, cur: Cursor, budget_id: str, *, lock: bool) -> BudgetRow:
        row = cur.one(
            f"SELECT {BUDGET_COLS} FROM dp_budgets WHERE budget_id = ?" + (self.for_update if lock else ""),
            (budget_id,),
        )
        if row is None:
            raise UnknownBudgetError(budget_id)
        return self._budget_from_row(row)

    def _budget_from_row(self, row: tuple) -> BudgetRow:
        texts = tuple(row[:9])
        head_seq, head_hash, updated_at, mac = row[9], row[10], row[11], row[12]
        bid = texts[0]
        if not hmac.compare_digest(str(mac), self._budget_mac(texts, head_seq, head_hash, updated_at)):
            raise LedgerIntegrityError(
                f"ledger integrity check failed: budget {bid!r}: the budget row was edited "
                f"outside the ledger (policy or chain head), or the key is wrong"
            )
        try:
            policy = BudgetPolicy(
                budget_id=texts[0],
                dataset=texts[1],
                privacy_unit=texts[2],
                measure=texts[3],
                cap=parse_charge(texts[4]),
                statement_delta=None if texts[5] is None else Fraction(texts[5]),
                window=WindowPolicy(kind=texts[6], days=texts[7]),
                max_per_release=None if texts[8] is None else parse_charge(texts[8]),
            )
        except (DpSparkError, ValueError, TypeError):
            raise LedgerIntegrityError(f"ledger integrity check failed: budget {bid!r}: unreadable policy") from None
        return BudgetRow(policy, int(head_seq), head_hash, updated_at, texts)

    # -- bindings --------------------------------------------------------------------
    def _binding_mac(self, identity: str, unit: str, budget_id: str, created_at: str) -> str:
        return self._mac("binding", identity, unit, budget_id, created_at)

    # -- entries ---------------------------------------------------------------------
    def _row_hash(self, prev: str, r: tuple) -> str:
        # immutable fields: budget_id, seq, release_id, release_family, charge, event_json,
        # principal, code_version, created_at
        return self._mac("entry", prev, r[0], r[1], r[2], r[3], r[4], r[5], r[7], r[8], r[11])

    def _state_mac(self, row_hash: str, state: str, owner: str, lease: str, committed: Optional[str]) -> str:
        return self._mac("entry-state", row_hash, state, owner, lease, committed)

    # -- spend summaries ---------------------------------------------------------------
    def _spend_mac(self, bid: str, seq: int, head: str, total: dict, from_day: str, days: dict) -> str:
        return self._mac("spend", bid, seq, head, total, from_day, days)

    # -- audit -----------------------------------------------------------------------
    def _audit_head_value(self, seq: int, head: str) -> str:
        return canonical({"seq": seq, "hash": head, "mac": self._mac("audit-head", seq, head)})

    def _audit_hash(self, prev: str, r: tuple) -> str:
        return self._mac("audit", prev, *r[:10])

    # -- the version record of release families ----------------------------------------
    def _version_mac(self, r: Sequence[Any], series_key: Optional[str]) -> str:
        # r: the first nine VERSION_COLS. A version without a series key keeps the MAC it had
        # before keys existed (the rows of older ledgers verify unchanged).
        return self._mac("version", *r[:9]) if series_key is None else self._mac("version", *r[:9], series_key)

    # -- policy history ----------------------------------------------------------------
    def _policy_row_hash(self, prev: str, r: Sequence[Any]) -> str:
        return self._mac("policy", prev, r[0], int(r[1]), *r[2:7])

    # -- the entry chains --------------------------------------------------------------
    @staticmethod
    def _entry(r: tuple) -> LedgerEntry:
        return LedgerEntry(
            budget_id=r[0],
            seq=int(r[1]),
            release_id=r[2],
            charge=parse_charge(r[4]),
            event_json=r[5],
            state=r[6],
            principal=r[7],
            code_version=r[8],
            owner_token=r[9],
            lease_expires_at=parse_ts(r[10]),
            created_at=parse_ts(r[11]),
            committed_at=None if r[12] is None else parse_ts(r[12]),
            release_family=r[3],
            row_hash=r[13],
        )

    def _chain_problems(self, b: BudgetRow, rows: list[tuple]) -> tuple[list[str], list[LedgerEntry]]:
        """Problems of a budget's whole chain (``rows``: all its entries in seq order)."""
        problems, entries, prev = self._link_problems(b, rows, GENESIS, 1)
        if b.head_seq != len(rows) or b.head_hash != prev:
            problems.append(
                f"budget {b.policy.budget_id!r}: chain head says {b.head_seq} entries but {len(rows)} are stored "
                f"(rows deleted or inserted outside the ledger)"
            )
        return problems, entries

    def _link_problems(
        self, b: BudgetRow, rows: Sequence[tuple], prev: str, first: int
    ) -> tuple[list[str], list[LedgerEntry], str]:
        """Check ``rows`` as consecutive links seq ``first``, ``first + 1``, ... chained from
        ``prev`` (the row hash before them). Returns (problems, entries, last row hash)."""
        problems: list[str] = []
        entries: list[LedgerEntry] = []
        bid = b.policy.budget_id
        for i, r in enumerate(rows, start=first):
            seq = int(r[1])
            where = f"budget {bid!r} seq {seq}"
            if seq != i:
                problems.append(f"{where}: sequence gap or duplicate (expected seq {i})")
            if not hmac.compare_digest(str(r[13]), self._row_hash(prev, r)):
                problems.append(f"{where}: row hash mismatch (row edited or inserted outside the ledger)")
            elif not hmac.compare_digest(str(r[14]), self._state_mac(r[13], r[6], r[9], r[10], r[12])):
                problems.append(f"{where}: state, owner or lease edited outside the ledger")
            try:
                e = self._entry(r)
                if e.state not in STATES:
                    raise ValueError("state")
                if e.charge.MEASURE != b.policy.measure:
                    problems.append(f"{where}: charge is not in the budget's measure")
                entries.append(e)
            except (DpSparkError, ValueError, TypeError, KeyError):
                problems.append(f"{where}: unreadable row")
            prev = str(r[13])
        return problems, entries, prev

    @staticmethod
    def _fail(problem: str) -> NoReturn:
        """Raise the integrity error of one problem (as :meth:`_raise_problems` would)."""
        raise LedgerIntegrityError("ledger integrity check failed: " + problem)

    @staticmethod
    def _raise_problems(problems: list[str]) -> None:
        if problems:
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            raise LedgerIntegrityError("ledger integrity check failed: " + "; ".join(problems[:5]) + more)

    def _verified_entries(self, cur: Cursor, b: BudgetRow) -> list[LedgerEntry]:
        rows = cur.q(f"SELECT {ENTRY_COLS} FROM dp_entries WHERE budget_id = ? ORDER BY seq", (b.policy.budget_id,))
        problems, entries = self._chain_problems(b, rows)
        self._raise_problems(problems)
        return entries

    # -- the write path's O(1) checks ---------------------------------------------------
    def _verified_tail(self, cur: Cursor, b: BudgetRow) -> dict[str, LedgerEntry]:
        """Verify the end of the budget's chain against its (MAC-checked) head: the last
        ``verify_tail`` entries' row hashes and state MACs, their links back to the entry
        before them, that the last one is the head (seq and hash) and that no entry lies past
        it. Catches a truncated, rewritten or extended tail. Returns those entries by release id."""
        bid = b.policy.budget_id
        lo = b.head_seq - self.verify_tail
        if lo >= 1:
            rows = cur.q(f"SELECT {ENTRY_COLS} FROM dp_entries WHERE budget_id = ? AND seq >= ? ORDER BY seq LIMIT ?",
                         (bid, lo, self.verify_tail + 2))
            if not rows or int(rows[0][1]) != lo:
                self._fail(f"budget {bid!r} seq {lo}: missing (rows deleted outside the ledger)")
            prev, body, first = str(rows[0][13]), rows[1:], lo + 1
        else:
            body = cur.q(f"SELECT {ENTRY_COLS} FROM dp_entries WHERE budget_id = ? ORDER BY seq LIMIT ?",
                         (bid, b.head_seq + 1))
            prev, first = GENESIS, 1
        problems, entries, last = self._link_problems(b, body, prev, first)
        if first + len(body) - 1 != b.head_seq or last != b.head_hash:
            end = int(body[-1][1]) if body else first - 1
            problems.append(
                f"budget {bid!r}: chain head says {b.head_seq} entries but the stored chain ends at seq {end} "
                f"(rows deleted or inserted outside the ledger)"
            )
        self._raise_problems(problems)
        return {e.release_id: e for e in entries}

    def _after_watermark(self, rows: Sequence[tuple], w: int, seq_i: int, hash_i: int,
                         where: str) -> tuple[str, Sequence[tuple]]:
        """``rows`` (seq >= max(w, 1), in order) split into the stored hash of row ``w`` (the
        link the next row must chain from; the genesis when ``w`` is 0) and the rows after it."""
        if w < 1:
            return GENESIS, rows
        if not rows or int(rows[0][seq_i]) != w:
            self._fail(f"{where} {w}: missing (rows deleted outside the ledger)")
        return str(rows[0][hash_i]), rows[1:]

    def _verified_entry(self, cur: Cursor, b: BudgetRow, r: tuple) -> LedgerEntry:
        """Verify one entry row of budget ``b`` (its row hash, linked to the stored hash of the
        entry before it, and its state MAC) without reading the rest of the chain."""
        bid = b.policy.budget_id
        seq = int(r[1])
        if seq > b.head_seq:
            self._fail(f"budget {bid!r} seq {seq}: past the chain head (inserted outside the ledger)")
        if seq == 1:
            prev = GENESIS
        else:
            p = cur.one("SELECT row_hash FROM dp_entries WHERE budget_id = ? AND seq = ?", (bid, seq - 1))
            if p is None:
                self._fail(f"budget {bid!r} seq {seq - 1}: missing (rows deleted outside the ledger)")
            prev = str(p[0])
        problems, entries, _ = self._link_problems(b, [r], prev, seq)
        self._raise_problems(problems)
        return entries[0]
