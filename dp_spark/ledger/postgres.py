"""The shared ledger: PostgreSQL (psycopg 3), the same tables and SQL as SQLite.

Writers serialise per budget by locking the budget row ``SELECT ... FOR UPDATE`` in a READ
COMMITTED transaction; every later statement of the transaction then sees all entries
committed before the lock was granted, so check-then-append is a compare-and-set. Readers
(status, verify) use one REPEATABLE READ READ ONLY snapshot. Lock waits, serialisation
failures, deadlocks and unique violations are retried. A connection that breaks is
reopened on the next call.

Durability: a reservation or commit is acknowledged only once its WAL is flushed to disk. Each
write transaction raises ``synchronous_commit`` to ``on`` for itself (``SET LOCAL``; a
stronger ``remote_apply`` is kept), whatever the server, role or URL default is; with
``off`` a COMMIT returns before its WAL is written and a server crash drops acknowledged
charges without a trace (the chain is still consistent, so verify cannot see it). A server
running with ``fsync = off`` cannot keep anything across an OS crash, so every connection
checks it and the ledger refuses to open (``LedgerError`` naming the setting).

The schema is whatever ``search_path`` selects: tests give each test its own schema with
``?options=-csearch_path%3D<schema>`` in the URL. The HMAC key must come from ``key=``,
``$DP_SPARK_LEDGER_KEY`` or ``$DP_SPARK_LEDGER_KEY_FILE``. Errors never show the password.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Iterator, Optional, Sequence
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import errors as pgerr

from dp_spark.errors import LedgerError, LedgerUnavailableError
from dp_spark.ledger.dialects import Cursor
from dp_spark.ledger.keys import resolve_key
from dp_spark.ledger.records import Clock
from dp_spark.ledger.schema import IMMUTABLE_ENTRY_COLUMNS, IMMUTABLE_VERSION_COLUMNS
from dp_spark.ledger.store import SqlLedger

__all__ = ["PostgresLedger", "redact_url"]

_SCHEMA_LOCK_ID = 7_360_411_203  # pg_advisory_xact_lock key for schema creation

# Run first in every write transaction: at least `on` (the COMMIT waits for the WAL flush, and
# for synchronous standbys if any are configured); `remote_apply`, stronger, is left alone.
_DURABLE_COMMIT = (
    "SELECT set_config('synchronous_commit', CASE WHEN current_setting('synchronous_commit') "
    "IN ('on', 'remote_apply') THEN current_setting('synchronous_commit') ELSE 'on' END, true)"
)


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (also ``password=`` query parameters)."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, host = netloc.rsplit("@", 1)
            if ":" in userinfo:
                userinfo = userinfo.split(":", 1)[0] + ":***"
            netloc = f"{userinfo}@{host}"
        query = re.sub(r"(?i)(password=)[^&]*", r"\1***", parts.query)
        return urlunsplit((parts.scheme, netloc, parts.path, query, ""))
    except ValueError:
        return "postgresql://<unparsable url>"


def _password(url: str) -> Optional[str]:
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.Error:
        return None
    pw = info.get("password")
    return str(pw) if pw else None


class PostgresLedger(SqlLedger):
    dialect = "postgresql"
    paramstyle = "format"
    for_update = " FOR UPDATE"

    def __init__(
        self,
        url: str,
        *,
        key: Optional[bytes] = None,
        clock: Optional[Clock] = None,
        connect_timeout: int = 5,
    ):
        self._url = url
        self._secret = _password(url)
        super().__init__(key=resolve_key(key, None), clock=clock,
                         description=f"PostgreSQL ledger at {redact_url(url)}")
        self.connect_timeout = int(connect_timeout)
        self._conn: Optional[psycopg.Connection] = None
        self._connect()
        self._init_schema()

    def _scrub(self, text: str) -> str:
        return text.replace(self._secret, "***") if self._secret else text

    def _reason(self, exc: BaseException) -> str:
        return self._scrub(super()._reason(exc))

    def _connect(self) -> psycopg.Connection:
        try:
            self._conn = psycopg.connect(
                self._url, autocommit=True, connect_timeout=self.connect_timeout,
                application_name="dp_spark_ledger",
            )
        except psycopg.Error as exc:
            raise LedgerUnavailableError(
                f"{self.description} is unreachable: {self._reason(exc)}; nothing was recorded"
            ) from None
        try:
            row = self._conn.execute("SELECT current_setting('fsync')").fetchone()
            fsync = "unknown" if row is None else row[0]
        except psycopg.Error as exc:
            self._close_connection()
            raise LedgerUnavailableError(
                f"{self.description} is unavailable: {self._reason(exc)}; nothing was recorded"
            ) from None
        if fsync != "on":
            self._close_connection()
            raise LedgerError(
                f"{self.description} runs with fsync = {fsync}: the server does not flush its "
                f"write-ahead log, so an acknowledged charge can be lost in a crash. Set "
                f"fsync = on in postgresql.conf (and reload) before using it as a budget ledger; "
                f"nothing was recorded"
            )
        return self._conn

    # -- hooks -----------------------------------------------------------------------
    @contextmanager
    def _transaction(self, write: bool) -> Iterator[Cursor]:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            conn = self._connect()
        try:
            with conn.transaction():
                cur = conn.cursor()
                if write:
                    cur.execute(_DURABLE_COMMIT)
                else:
                    cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                yield Cursor(cur.execute, "format")
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            if self._classify(exc) == "unavailable":
                # the server ended the session ("terminating connection due to administrator
                # command") before psycopg marked the connection broken: the next call must
                # open a new one, not send to this one again
                self._close_connection()
            raise

    def _classify(self, exc: BaseException) -> Optional[str]:
        if isinstance(exc, (pgerr.SerializationFailure, pgerr.DeadlockDetected, pgerr.LockNotAvailable,
                            pgerr.UniqueViolation)):
            return "retry"
        if isinstance(exc, (pgerr.UndefinedTable, pgerr.UndefinedColumn)):
            return "corrupt"
        if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
            return "unavailable"
        return None

    def _table_exists(self, cur: Cursor, name: str) -> bool:
        return bool(cur.scalar("SELECT to_regclass(?) IS NOT NULL", (name,)))

    def _column_exists(self, cur: Cursor, table: str, column: str) -> bool:
        return cur.one("SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(?) AND attname = ? "
                       "AND NOT attisdropped", (table, column)) is not None

    def _schema_lock(self, cur: Cursor) -> None:
        cur.q("SELECT pg_advisory_xact_lock(?)", (_SCHEMA_LOCK_ID,))

    def _guard_ddl(self) -> Sequence[str]:
        refuse = (
            "CREATE OR REPLACE FUNCTION dp_ledger_refuse() RETURNS trigger LANGUAGE plpgsql AS $f$ "
            "BEGIN RAISE EXCEPTION 'dp_spark ledger: % on % is refused (append-only)', TG_OP, TG_TABLE_NAME; "
            "END $f$"
        )

        def trig(name: str, when: str, table: str, level: str = "ROW", cond: str = "") -> str:
            return (f"CREATE OR REPLACE TRIGGER {name} {when} ON {table} FOR EACH {level} {cond}"
                    f"EXECUTE FUNCTION dp_ledger_refuse()")

        return (
            refuse,
            trig("dp_entries_no_delete", "BEFORE DELETE", "dp_entries"),
            trig("dp_entries_no_truncate", "BEFORE TRUNCATE", "dp_entries", "STATEMENT"),
            trig("dp_entries_immutable", f"BEFORE UPDATE OF {IMMUTABLE_ENTRY_COLUMNS}", "dp_entries"),
            trig("dp_entries_no_uncommit", "BEFORE UPDATE OF state", "dp_entries", "ROW",
                 "WHEN (OLD.state = 'committed' AND NEW.state <> 'committed') "),
            trig("dp_budgets_no_delete", "BEFORE DELETE", "dp_budgets"),
            trig("dp_budgets_no_truncate", "BEFORE TRUNCATE", "dp_budgets", "STATEMENT"),
            trig("dp_bindings_no_change", "BEFORE UPDATE OR DELETE", "dp_bindings"),
            trig("dp_bindings_no_truncate", "BEFORE TRUNCATE", "dp_bindings", "STATEMENT"),
            trig("dp_audit_no_change", "BEFORE UPDATE OR DELETE", "dp_audit"),
            trig("dp_audit_no_truncate", "BEFORE TRUNCATE", "dp_audit", "STATEMENT"),
            trig("dp_policies_no_change", "BEFORE UPDATE OR DELETE", "dp_policies"),
            trig("dp_policies_no_truncate", "BEFORE TRUNCATE", "dp_policies", "STATEMENT"),
            trig("dp_versions_no_delete", "BEFORE DELETE", "dp_versions"),
            trig("dp_versions_no_truncate", "BEFORE TRUNCATE", "dp_versions", "STATEMENT"),
            trig("dp_versions_immutable", f"BEFORE UPDATE OF {IMMUTABLE_VERSION_COLUMNS}", "dp_versions"),
            trig("dp_versions_withdrawn_stays", "BEFORE UPDATE OF state", "dp_versions", "ROW",
                 "WHEN (OLD.state = 'withdrawn' AND NEW.state <> 'withdrawn') "),
            trig("dp_versions_key_immutable", "BEFORE UPDATE OF series_key", "dp_versions"),
            trig("dp_fingerprints_no_change", "BEFORE UPDATE OR DELETE", "dp_fingerprints"),
            trig("dp_fingerprints_no_truncate", "BEFORE TRUNCATE", "dp_fingerprints", "STATEMENT"),
            trig("dp_stream_nodes_no_change", "BEFORE UPDATE OR DELETE", "dp_stream_nodes"),
            trig("dp_stream_nodes_no_truncate", "BEFORE TRUNCATE", "dp_stream_nodes", "STATEMENT"),
        )

    def _close_connection(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except psycopg.Error:
                pass
            self._conn = None
