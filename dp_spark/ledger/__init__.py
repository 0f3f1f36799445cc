"""The privacy-budget ledger: durable, append-only, exactly-once charges per release.

``open_ledger(url)`` picks the store from the URL:

* ``sqlite:///abs/path/ledger.db``, ``sqlite:/abs/path.db`` or ``sqlite:relative/path.db``
  -> :class:`~dp_spark.ledger.sqlite.SQLiteLedger` (the embedded default; parent folders are
  created; the HMAC key defaults to ``<db>.key`` beside it, 0600);
* ``postgresql://user@host:port/db`` (or ``postgres://``) ->
  :class:`~dp_spark.ledger.postgres.PostgresLedger` (key from ``key=`` or
  ``$DP_SPARK_LEDGER_KEY``).

A database that cannot be reached raises LedgerUnavailableError (no password in the
message). Nothing in this package imports pyspark, except :mod:`dp_spark.delta.mirror`.
"""

from __future__ import annotations

from typing import Any, Optional

from dp_spark.errors import ConfigError
from dp_spark.ledger.policy import BudgetPolicy, WindowPolicy, load_policies
from dp_spark.ledger.records import (
    AuditRow,
    BudgetStatus,
    Clock,
    LedgerEntry,
    ReleaseLimitExceededError,
    Reservation,
    UnknownBudgetError,
    UnknownReleaseError,
)
from dp_spark.ledger.sqlite import SQLiteLedger
from dp_spark.ledger.store import Ledger

__all__ = [
    "AuditRow",
    "BudgetPolicy",
    "BudgetStatus",
    "Ledger",
    "LedgerEntry",
    "ReleaseLimitExceededError",
    "Reservation",
    "UnknownBudgetError",
    "UnknownReleaseError",
    "WindowPolicy",
    "load_policies",
    "open_ledger",
    "sqlite_path",
]


def sqlite_path(url: str) -> Optional[str]:
    """The file path of a ``sqlite:`` URL, or None for another scheme."""
    if not url.startswith("sqlite:"):
        return None
    if url.startswith("sqlite:///"):
        path = url[len("sqlite://"):]
    elif url.startswith("sqlite://"):
        raise ConfigError("a sqlite URL is sqlite:///absolute/path.db or sqlite:relative/path.db")
    else:
        path = url[len("sqlite:"):]
    if not path or path == ":memory:":
        raise ConfigError("a sqlite ledger needs a file path (an in-memory ledger would not be durable)")
    return path


def open_ledger(url: str, *, key: Optional[bytes] = None, clock: Optional[Clock] = None, **options: Any) -> Ledger:
    """Open (and create if needed) the ledger at ``url``.

    ``key``: the HMAC key of the row chain (see docs/ledger.md). ``clock``: a callable
    returning aware UTC datetimes (tests inject a fake clock). ``options`` go to the store
    class (``busy_timeout_ms``, ``create`` for SQLite; ``connect_timeout`` for PostgreSQL).
    """
    if not isinstance(url, str) or not url:
        raise ConfigError("ledger URL must be a non-empty string")
    path = sqlite_path(url)
    if path is not None:
        return SQLiteLedger(path, key=key, clock=clock, **options)
    if url.startswith(("postgresql://", "postgres://")):
        # imported here, not above: psycopg (and libpq) load only for a PostgreSQL ledger
        from dp_spark.ledger.postgres import PostgresLedger

        return PostgresLedger(url, key=key, clock=clock, **options)
    scheme = url.split(":", 1)[0] if ":" in url else "(none)"
    raise ConfigError(f"unsupported ledger URL scheme {scheme!r}: use sqlite: or postgresql://")
