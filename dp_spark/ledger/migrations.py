"""The ledger's schema migrations: numbered, in order, each a small function of a cursor.

On open, every migration whose table (or column) is missing runs, in one write transaction under the
store's schema lock (PostgreSQL: an advisory lock; SQLite's write transaction is already
exclusive), then every guard trigger is (re)created; the DDL is idempotent (``IF NOT
EXISTS``), so two processes opening a new ledger at once both succeed. A new ledger runs
them all; a ledger created by an older dp_spark gets the tables it lacks. The rows of
``dp_ledger_meta`` (schema version, key check, audit head) are the store's
(:meth:`~dp_spark.ledger.store.SqlLedger._init_schema`).

Nothing here imports pyspark.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from dp_spark.ledger.dialects import Cursor
from dp_spark.ledger.schema import (
    CORE_DDL, FINGERPRINTS_DDL, POLICIES_DDL, STREAM_NODES_DDL, VERSION_KEYS_DDL, VERSIONS_DDL,
)

__all__ = ["MIGRATIONS", "Migration", "migrate"]


def create_core_tables(cur: Cursor) -> None:
    """1: meta, budgets, bindings, entries (and their indexes), audit."""
    for stmt in CORE_DDL:
        cur.x(stmt)


def add_policy_history(cur: Cursor) -> None:
    """2: the policy history of each budget (``dp_policies``)."""
    cur.x(POLICIES_DDL)


def add_version_record(cur: Cursor) -> None:
    """3: the version record of release families (``dp_versions``)."""
    for stmt in VERSIONS_DDL:
        cur.x(stmt)


def add_input_fingerprints(cur: Cursor) -> None:
    """4: the input fingerprint of releases (``dp_fingerprints``)."""
    cur.x(FINGERPRINTS_DDL)


def add_version_keys(cur: Cursor) -> None:
    """5: versions keyed by (family, series key): ``dp_versions.series_key`` (a day of a
    series; NULL otherwise) and one current version per (family, series key)."""
    for stmt in VERSION_KEYS_DDL:
        cur.x(stmt)


def add_stream_nodes(cur: Cursor) -> None:
    """6: the noisy nodes of streams under continual release (``dp_stream_nodes``)."""
    cur.x(STREAM_NODES_DDL)


@dataclass(frozen=True)
class Migration:
    number: int
    table: str  # the table it creates (or alters): the migration is due while it is missing
    apply: Callable[[Cursor], None]
    column: Optional[str] = None  # the column it adds to ``table``: also due while that is missing


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "dp_ledger_meta", create_core_tables),
    Migration(2, "dp_policies", add_policy_history),
    Migration(3, "dp_versions", add_version_record),
    Migration(4, "dp_fingerprints", add_input_fingerprints),
    Migration(5, "dp_versions", add_version_keys, column="series_key"),
    Migration(6, "dp_stream_nodes", add_stream_nodes),
)


def migrate(cur: Cursor, *, table_exists: Callable[[Cursor, str], bool],
            column_exists: Callable[[Cursor, str, str], bool], schema_lock: Callable[[Cursor], None],
            guard_ddl: Callable[[], Sequence[str]]) -> list[int]:
    """Run the due migrations, in order, then (re)create every guard trigger; returns the
    numbers of the migrations that ran (none: nothing is done). What is due is decided again
    under the schema lock (another process may have migrated meanwhile); a migration due
    because its table is missing stays due after an earlier one creates it (a new ledger runs
    them all, in order)."""
    def due() -> list[Migration]:
        return [m for m in MIGRATIONS if not table_exists(cur, m.table)
                or (m.column is not None and not column_exists(cur, m.table, m.column))]

    if not due():
        return []
    schema_lock(cur)
    todo = due()
    for m in todo:
        m.apply(cur)
    if todo:
        for stmt in guard_ddl():
            cur.x(stmt)
    return [m.number for m in todo]
