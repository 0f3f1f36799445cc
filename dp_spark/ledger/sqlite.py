"""The embedded default ledger: one SQLite file under the local warehouse.

SQLite's file locks serialise writers across threads and processes on one disk; every
write runs in ``BEGIN IMMEDIATE`` (the write lock is taken before anything is read, so the
check and the append of a charge are one atomic compare-and-set). WAL journal, a busy
timeout, ``synchronous=FULL`` (a committed reservation survives a power cut) and foreign
keys on. Not for network file systems (NFS/SMB locks are unreliable): use PostgreSQL there.

The HMAC key defaults to ``<db>.key`` beside the database (created 0600).
"""

from __future__ import annotations

import os
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional, Sequence

from dp_spark.errors import LedgerIntegrityError, LedgerUnavailableError
from dp_spark.ledger.dialects import Cursor
from dp_spark.ledger.keys import resolve_key
from dp_spark.ledger.records import Clock
from dp_spark.ledger.schema import IMMUTABLE_ENTRY_COLUMNS, IMMUTABLE_VERSION_COLUMNS
from dp_spark.ledger.store import SqlLedger

__all__ = ["SQLiteLedger"]


class SQLiteLedger(SqlLedger):
    dialect = "sqlite"
    paramstyle = "qmark"
    for_update = ""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        key: Optional[bytes] = None,
        clock: Optional[Clock] = None,
        busy_timeout_ms: int = 30_000,
        create: bool = True,
    ):
        self.path = Path(os.path.abspath(os.fspath(path)))
        super().__init__(key=b"", clock=clock, description=f"SQLite ledger at {self.path}")
        if create:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise LedgerUnavailableError(
                    f"{self.description} is unavailable: cannot create its folder ({type(exc).__name__})"
                ) from None
        elif not self.path.exists():
            raise LedgerUnavailableError(f"{self.description} does not exist")
        self._key = resolve_key(key, Path(str(self.path) + ".key"), create=create)
        self.busy_timeout_ms = int(busy_timeout_ms)
        self._conn: Optional[sqlite3.Connection] = None
        try:
            self._conn = sqlite3.connect(
                str(self.path),
                timeout=self.busy_timeout_ms / 1000,
                isolation_level=None,
                check_same_thread=False,
            )
            self._conn.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")
            self._set_wal()
            self._conn.execute("PRAGMA synchronous = FULL")
            self._conn.execute("PRAGMA foreign_keys = ON")
        except sqlite3.Error as exc:
            self._close_connection()
            cls = LedgerIntegrityError if self._classify(exc) == "corrupt" else LedgerUnavailableError
            raise cls(f"{self.description} cannot be opened: {self._reason(exc)}") from None
        self._init_schema()

    def _set_wal(self) -> None:
        assert self._conn is not None
        deadline = time.monotonic() + self.busy_timeout_ms / 1000
        while True:
            try:
                self._conn.execute("PRAGMA journal_mode = WAL").fetchall()
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    # -- hooks -----------------------------------------------------------------------
    @contextmanager
    def _transaction(self, write: bool) -> Iterator[Cursor]:
        conn = self._conn
        assert conn is not None
        conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            yield Cursor(conn.execute, "qmark")
        except BaseException:
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            raise
        else:
            conn.execute("COMMIT")

    def _classify(self, exc: BaseException) -> Optional[str]:
        text = str(exc).lower()
        if isinstance(exc, sqlite3.IntegrityError):
            return "retry"
        if isinstance(exc, sqlite3.OperationalError):
            if "locked" in text or "busy" in text:
                return "unavailable"
            if "no such table" in text or "no such column" in text:
                return "corrupt"
            return "unavailable"
        if isinstance(exc, sqlite3.DatabaseError):
            if "not a database" in text or "malformed" in text or "corrupt" in text:
                return "corrupt"
            return "unavailable"
        return None

    def _reason(self, exc: BaseException) -> str:
        if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
            return (f"the database is locked by another process (waited {self.busy_timeout_ms / 1000:g} s)")
        return super()._reason(exc)

    def _table_exists(self, cur: Cursor, name: str) -> bool:
        return cur.one("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)) is not None

    def _column_exists(self, cur: Cursor, table: str, column: str) -> bool:
        return cur.one("SELECT 1 FROM pragma_table_info(?) WHERE name = ?", (table, column)) is not None

    def _guard_ddl(self) -> Sequence[str]:
        def refuse(name: str, when: str, table: str, message: str, cond: str = "") -> str:
            return (
                f"CREATE TRIGGER IF NOT EXISTS {name} {when} ON {table} {cond}"
                f"BEGIN SELECT RAISE(ABORT, 'dp_spark ledger: {message}'); END"
            )

        return (
            refuse("dp_entries_no_delete", "BEFORE DELETE", "dp_entries", "entries are append-only"),
            refuse("dp_entries_immutable", f"BEFORE UPDATE OF {IMMUTABLE_ENTRY_COLUMNS}", "dp_entries",
                   "entry fields are immutable"),
            refuse("dp_entries_no_uncommit", "BEFORE UPDATE OF state", "dp_entries",
                   "a committed entry stays committed",
                   "WHEN OLD.state = 'committed' AND NEW.state <> 'committed' "),
            refuse("dp_budgets_no_delete", "BEFORE DELETE", "dp_budgets", "budgets cannot be deleted"),
            refuse("dp_bindings_no_change", "BEFORE UPDATE", "dp_bindings", "bindings are permanent"),
            refuse("dp_bindings_no_delete", "BEFORE DELETE", "dp_bindings", "bindings are permanent"),
            refuse("dp_audit_no_update", "BEFORE UPDATE", "dp_audit", "the audit log is append-only"),
            refuse("dp_audit_no_delete", "BEFORE DELETE", "dp_audit", "the audit log is append-only"),
            refuse("dp_policies_no_update", "BEFORE UPDATE", "dp_policies", "the policy history is append-only"),
            refuse("dp_policies_no_delete", "BEFORE DELETE", "dp_policies", "the policy history is append-only"),
            refuse("dp_versions_no_delete", "BEFORE DELETE", "dp_versions", "versions are never deleted"),
            refuse("dp_versions_immutable", f"BEFORE UPDATE OF {IMMUTABLE_VERSION_COLUMNS}", "dp_versions",
                   "version fields are immutable"),
            refuse("dp_versions_withdrawn_stays", "BEFORE UPDATE OF state", "dp_versions",
                   "a withdrawn version stays withdrawn",
                   "WHEN OLD.state = 'withdrawn' AND NEW.state <> 'withdrawn' "),
            refuse("dp_versions_key_immutable", "BEFORE UPDATE OF series_key", "dp_versions",
                   "version fields are immutable"),
            refuse("dp_fingerprints_no_update", "BEFORE UPDATE", "dp_fingerprints", "fingerprints are written once"),
            refuse("dp_fingerprints_no_delete", "BEFORE DELETE", "dp_fingerprints", "fingerprints are written once"),
            refuse("dp_stream_nodes_no_update", "BEFORE UPDATE", "dp_stream_nodes", "stream nodes are written once"),
            refuse("dp_stream_nodes_no_delete", "BEFORE DELETE", "dp_stream_nodes", "stream nodes are written once"),
        )

    def _close_connection(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
            self._conn = None
