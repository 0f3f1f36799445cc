"""Dataset bindings (``dp_bindings``): each (dataset identity, privacy unit) belongs to at
most one budget, for ever, so a copied config or a new budget id does not reset a budget.

Nothing here imports pyspark.
"""

from __future__ import annotations

import hmac
from typing import Optional

from dp_spark.errors import ConfigError, DpSparkError, LedgerIntegrityError
from dp_spark.ledger.dialects import Cursor, Retry
from dp_spark.ledger.integrity import Integrity
from dp_spark.ledger.records import check_text, ts_text

__all__ = ["Bindings"]


class Bindings(Integrity):
    """Bind datasets to budgets and read the bindings (each MAC checked)."""

    def _check_binding(self, row: tuple) -> str:
        identity, unit, budget_id, created_at, mac = row
        if not hmac.compare_digest(str(mac), self._binding_mac(identity, unit, budget_id, created_at)):
            raise LedgerIntegrityError(
                f"ledger integrity check failed: the binding of a dataset to budget {budget_id!r} "
                f"was edited outside the ledger"
            )
        return budget_id

    def bind_dataset(self, budget_id: str, dataset_identity: str, privacy_unit: str) -> None:
        """Bind a dataset identity (e.g. a Delta table id) and privacy unit to one budget.

        The pair (dataset_identity, privacy_unit) belongs to at most one budget, for ever:
        binding it to another budget raises ConfigError, so a copied config under a new budget
        id, or a renamed or moved table, cannot start from a fresh budget. Binding the same
        pair to the same budget again is a no-op.
        """
        check_text(dataset_identity, "dataset_identity")
        check_text(privacy_unit, "privacy_unit")

        def existing(cur: Cursor) -> Optional[str]:
            row = cur.one(
                "SELECT dataset_identity, privacy_unit, budget_id, created_at, mac FROM dp_bindings "
                "WHERE dataset_identity = ? AND privacy_unit = ?",
                (dataset_identity, privacy_unit),
            )
            return None if row is None else self._check_binding(row)

        def conflict(other: str, cur: Optional[Cursor] = None) -> ConfigError:
            how = ""
            if cur is not None:
                try:
                    measure = self._load_budget(cur, other, lock=False).policy.measure
                    amount = "rho: ..." if measure == "zcdp" else "epsilon: ..."
                    how = (f" To publish from this data, charge that budget: "
                           f"budget: {{id: {other}, measure: {measure}, {amount}}} in the spec.")
                except DpSparkError:  # an unreadable budget row: the message stays useful without the hint
                    how = ""
            return ConfigError(
                f"dataset identity {dataset_identity!r} (unit {privacy_unit!r}) is already governed "
                f"by budget {other!r}; it cannot also draw on budget {budget_id!r}: one budget per "
                f"dataset and unit, so that one accountant composes every release of it (a copied "
                f"config or a new budget id does not reset a budget).{how}"
            )

        def fn(cur: Cursor) -> None:
            b = self._load_budget(cur, budget_id, lock=True)
            if privacy_unit != b.policy.privacy_unit:
                raise ConfigError(
                    f"budget {budget_id!r} protects unit {b.policy.privacy_unit!r}, not {privacy_unit!r}"
                )
            other = existing(cur)
            if other is not None:
                if other != budget_id:
                    raise conflict(other, cur)
                return
            stamp = ts_text(self._now(None))
            n = cur.x(
                "INSERT INTO dp_bindings (dataset_identity, privacy_unit, budget_id, created_at, mac) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (dataset_identity, privacy_unit) DO NOTHING",
                (dataset_identity, privacy_unit, budget_id, stamp,
                 self._binding_mac(dataset_identity, privacy_unit, budget_id, stamp)),
            )
            if n != 1:  # a concurrent binder won: read its binding (READ COMMITTED sees it)
                other = existing(cur)
                if other is None:
                    raise Retry()
                if other != budget_id:
                    raise conflict(other, cur)

        self._run("bind_dataset", fn, write=True)

    def budget_for_dataset(self, dataset_identity: str, privacy_unit: str) -> Optional[str]:
        """The budget a dataset identity and unit are bound to, or None."""
        def fn(cur: Cursor) -> Optional[str]:
            row = cur.one(
                "SELECT dataset_identity, privacy_unit, budget_id, created_at, mac FROM dp_bindings "
                "WHERE dataset_identity = ? AND privacy_unit = ?",
                (dataset_identity, privacy_unit),
            )
            return None if row is None else self._check_binding(row)

        return self._run("budget_for_dataset", fn, write=False)

    def bindings(self, budget_id: Optional[str] = None) -> list[tuple[str, str, str]]:
        """(dataset_identity, privacy_unit, budget_id) triples, verified."""
        def fn(cur: Cursor) -> list[tuple[str, str, str]]:
            sql = "SELECT dataset_identity, privacy_unit, budget_id, created_at, mac FROM dp_bindings"
            rows = cur.q(sql + " WHERE budget_id = ? ORDER BY 1, 2", (budget_id,)) if budget_id else cur.q(sql + " ORDER BY 1, 2")
            return [(r[0], r[1], self._check_binding(r)) for r in rows]

        return self._run("bindings", fn, write=False)
