"""The transaction protocol of the SQL ledger: every operation is one function of a cursor,
run in one transaction (write: serialised with the other writers; SQLite ``BEGIN IMMEDIATE``,
PostgreSQL a budget row locked ``FOR UPDATE``), retried when a compare-and-set lost a race
(:class:`~dp_spark.ledger.dialects.Retry`) or the driver reports a transient conflict, and
turned into the package's errors otherwise (no password, no data value in a message).

Nothing here imports pyspark.
"""

from __future__ import annotations

import random
import threading
import time
from datetime import datetime
from typing import Any, Callable, Optional

from dp_spark.errors import DpSparkError, LedgerError, LedgerIntegrityError, LedgerUnavailableError
from dp_spark.ledger.dialects import Cursor, Retry, SqlDialect
from dp_spark.ledger.policy import as_utc
from dp_spark.ledger.records import UTC, Clock

__all__ = ["Transactions", "utc_now"]


def utc_now() -> datetime:
    return datetime.now(UTC)


class Transactions(SqlDialect):
    """The connection-independent half of a SQL store: its key, clock, lock and :meth:`_run`."""

    max_attempts = 50

    def __init__(self, *, key: bytes, clock: Optional[Clock], description: str):
        self._key = key
        self._clock: Clock = clock or utc_now
        self._lock = threading.RLock()
        self._closed = False
        self.description = description

    def _now(self, now: Optional[datetime]) -> datetime:
        return as_utc(now if now is not None else self._clock(), "now")

    def _run(self, op: str, fn: Callable[[Cursor], Any], *, write: bool) -> Any:
        if self._closed:
            raise LedgerError(f"{self.description} is closed")
        for attempt in range(1, self.max_attempts + 1):
            kind: Optional[str]
            try:
                with self._lock:
                    with self._transaction(write) as cur:
                        return fn(cur)
            except DpSparkError:
                raise
            except Retry:
                kind = "retry"
                exc: BaseException = Retry()
            except Exception as e:  # driver errors
                exc = e
                kind = self._classify(e)
            if kind == "retry" and attempt < self.max_attempts:
                time.sleep(random.uniform(0, 0.002 * min(attempt, 20)))
                continue
            reason = self._reason(exc)
            if kind == "unavailable":
                raise LedgerUnavailableError(
                    f"{self.description} is unavailable ({op}): {reason}; nothing was recorded"
                ) from None
            if kind == "corrupt":
                raise LedgerIntegrityError(f"{self.description} is corrupt or was tampered with ({op}): {reason}") from None
            raise LedgerError(f"{self.description}: {op} failed: {reason}") from None
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._close_connection()
