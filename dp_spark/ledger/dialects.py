"""What differs between the SQL stores: the driver's placeholder style (one thin cursor that
takes ``?`` SQL for both), and the hooks each store supplies (its transactions, how a driver
error is classified, its guard triggers, how it finds a table, its schema lock).

SQL is written once, with ``?`` placeholders; :class:`Cursor` turns them into ``%s`` for
psycopg. :class:`~dp_spark.ledger.sqlite.SQLiteLedger` and
:class:`~dp_spark.ledger.postgres.PostgresLedger` implement :class:`SqlDialect`.
"""

from __future__ import annotations

import abc
from typing import Any, Callable, ContextManager, Optional, Sequence

from dp_spark.errors import LedgerError

__all__ = ["Cursor", "Retry", "SqlDialect"]


class Retry(Exception):
    """A compare-and-set lost a race: run the transaction again."""


class Cursor:
    """A thin cursor over either driver; SQL is written with ``?`` placeholders."""

    def __init__(self, execute: Callable[..., Any], paramstyle: str):
        self._execute = execute
        self._pg = paramstyle == "format"

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self._pg else sql

    def _run(self, sql: str, params: Sequence[Any]) -> Any:
        # no parameters -> no placeholder parsing (DDL may contain a literal '%')
        return self._execute(self._sql(sql), tuple(params)) if params else self._execute(sql)

    def q(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        return list(self._run(sql, params).fetchall())

    def one(self, sql: str, params: Sequence[Any] = ()) -> Optional[tuple]:
        rows = self.q(sql, params)
        return rows[0] if rows else None

    def scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """The first column of the one row a query always returns (a count, a setting)."""
        row = self.one(sql, params)
        if row is None:
            raise LedgerError("a query that always returns a row returned none")
        return row[0]

    def x(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self._run(sql, params).rowcount


class SqlDialect(abc.ABC):
    """The class attributes and hooks a SQL store defines."""

    dialect = "sql"
    paramstyle = "qmark"
    for_update = ""  # appended to a SELECT that locks the rows it reads (PostgreSQL)
    # -- subclass hooks --------------------------------------------------------------
    @abc.abstractmethod
    def _transaction(self, write: bool) -> ContextManager[Cursor]:
        """Context manager: one transaction (write: serialised with other writers)."""

    @abc.abstractmethod
    def _classify(self, exc: BaseException) -> Optional[str]:
        """'retry' | 'unavailable' | 'corrupt' | None for a driver exception."""

    @abc.abstractmethod
    def _guard_ddl(self) -> Sequence[str]:
        """Triggers refusing UPDATE/DELETE of immutable rows (dialect-specific)."""

    @abc.abstractmethod
    def _table_exists(self, cur: Cursor, name: str) -> bool: ...

    @abc.abstractmethod
    def _column_exists(self, cur: Cursor, table: str, column: str) -> bool: ...

    # optional hooks (a store without them does nothing)
    def _schema_lock(self, cur: Cursor) -> None:  # noqa: B027
        """Serialise schema creation between processes (PostgreSQL: advisory lock)."""

    def _close_connection(self) -> None:  # noqa: B027
        """Close the store's connection (once, from :meth:`close`)."""

    def _reason(self, exc: BaseException) -> str:
        """A driver error in one line, for the ledger's messages (a store may scrub it)."""
        text = str(exc).strip().splitlines()
        return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__

