"""The ledger's tables: their DDL and column lists (the same SQL on SQLite and PostgreSQL).

::

    dp_ledger_meta(name PK, value)                      schema version, key check, audit head
    dp_budgets(budget_id PK, policy columns..., head_seq, head_hash, updated_at, mac)
    dp_bindings(dataset_identity, privacy_unit, budget_id, created_at, mac)
        PRIMARY KEY (dataset_identity, privacy_unit)
    dp_entries(budget_id, seq, release_id UNIQUE, release_family, charge, event_json, state,
               principal, code_version, owner_token, lease_expires_at, created_at,
               committed_at, row_hash, state_mac)   PRIMARY KEY (budget_id, seq)
    dp_audit(seq PK, at, principal, action, spec_name, spec_version, decision, release_id,
             charge, detail, row_hash)
    dp_policies(budget_id, version, policy_hash, policy_json, principal, reason, at, row_hash)
        PRIMARY KEY (budget_id, version)
    dp_versions(family, version_no, release_id, state, reason, principal, at, changed_by,
                changed_at, mac)   PRIMARY KEY (family, version_no), UNIQUE (family, release_id),
                at most one 'current' row per family (a partial unique index);
                + series_key (migration 5): the key (a day) a version of a series publishes,
                NULL for a whole-family version; then at most one 'current' row per
                (family, series_key)
    dp_fingerprints(release_id PK -> dp_entries, fingerprint, at, mac)
                the keyed content fingerprint of the input rows a release read (write once)
    dp_stream_nodes(stream_id -> dp_entries, component, level, idx, value, at, mac)
                PRIMARY KEY (stream_id, component, level, idx): the noisy value of each
                completed node of a stream's tree (write once)

Which of them a ledger gets, and when, is :mod:`dp_spark.ledger.migrations`; the guard
triggers are each store's (:mod:`dp_spark.ledger.sqlite`, :mod:`dp_spark.ledger.postgres`).
"""

from __future__ import annotations

__all__ = [
    "AUDIT_COLS",
    "BUDGET_COLS",
    "CORE_DDL",
    "ENTRY_COLS",
    "FINGERPRINTS_DDL",
    "FINGERPRINT_COLS",
    "STREAM_NODES_DDL",
    "STREAM_NODE_COLS",
    "IMMUTABLE_ENTRY_COLUMNS",
    "IMMUTABLE_VERSION_COLUMNS",
    "POLICIES_DDL",
    "POLICY_COLS",
    "SCHEMA_VERSION",
    "SPEND_PREFIX",
    "VERSIONS_DDL",
    "VERSIONS_SEQ",
    "VERSION_COLS",
    "VERSION_KEYS_DDL",
]

SCHEMA_VERSION = "1"  # dp_ledger_meta 'schema_version' (tables added later do not change it)
VERSIONS_SEQ = "versions_seq"  # dp_ledger_meta: the number of version-record changes so far
SPEND_PREFIX = "spend:"  # dp_ledger_meta name of a budget's spend summary

BUDGET_COLS = (
    "budget_id, dataset, privacy_unit, measure, cap, statement_delta, window_kind, window_days, "
    "max_per_release, head_seq, head_hash, updated_at, mac"
)
ENTRY_COLS = (
    "budget_id, seq, release_id, release_family, charge, event_json, state, principal, "
    "code_version, owner_token, lease_expires_at, created_at, committed_at, row_hash, state_mac"
)
AUDIT_COLS = (
    "seq, at, principal, action, spec_name, spec_version, decision, release_id, charge, detail, row_hash"
)

# The policy history of each budget: one row per policy the ledger registered (the first
# registration, then each change an admin accepted), chained per budget by an HMAC.
POLICIES_DDL = """CREATE TABLE IF NOT EXISTS dp_policies (
        budget_id TEXT NOT NULL REFERENCES dp_budgets (budget_id),
        version BIGINT NOT NULL CHECK (version >= 1),
        policy_hash TEXT NOT NULL,
        policy_json TEXT NOT NULL,
        principal TEXT NOT NULL,
        reason TEXT NOT NULL,
        at TEXT NOT NULL,
        row_hash TEXT NOT NULL,
        PRIMARY KEY (budget_id, version)
    )"""
POLICY_COLS = "budget_id, version, policy_hash, policy_json, principal, reason, at, row_hash"

# The version record of each release family (publish, supersede, withdraw, restore): rows
# whose state changes, each MAC'd over all its fields. Added to existing ledgers on open.
VERSIONS_DDL = (
    """CREATE TABLE IF NOT EXISTS dp_versions (
        family TEXT NOT NULL,
        version_no BIGINT NOT NULL CHECK (version_no >= 1),
        release_id TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('current', 'superseded', 'withdrawn')),
        reason TEXT,
        principal TEXT NOT NULL,
        at TEXT NOT NULL,
        changed_by TEXT,
        changed_at TEXT,
        mac TEXT NOT NULL,
        PRIMARY KEY (family, version_no),
        UNIQUE (family, release_id)
    )""",
    "CREATE UNIQUE INDEX IF NOT EXISTS dp_versions_one_current ON dp_versions (family) WHERE state = 'current'",
)
VERSION_COLS = "family, version_no, release_id, state, reason, principal, at, changed_by, changed_at, mac, series_key"
IMMUTABLE_VERSION_COLUMNS = "family, version_no, release_id, principal, at"

# Versions keyed by (family, series key): a family published a day at a time (a series) keeps
# every day current, a day superseded only by a re-publication of that same day. A version's
# key is fixed when it is inserted (a guard trigger of its own; the MAC covers it when set).
# NULL keys (every version of a ledger before this, and of any family that is not a series)
# keep one current version per family. Added to existing ledgers on open.
VERSION_KEYS_DDL = (
    "ALTER TABLE dp_versions ADD COLUMN series_key TEXT",
    "DROP INDEX IF EXISTS dp_versions_one_current",
    "CREATE UNIQUE INDEX IF NOT EXISTS dp_versions_one_current_key ON dp_versions "
    "(family, COALESCE(series_key, '')) WHERE state = 'current'",
)

# The keyed content fingerprint of the input rows a committed release read (a scheduled
# refresh compares it with the current input's: dp_spark.schedule). Written once per release,
# MAC'd; never mirrored to Delta, never audited, never shown.
FINGERPRINTS_DDL = """CREATE TABLE IF NOT EXISTS dp_fingerprints (
        release_id TEXT PRIMARY KEY REFERENCES dp_entries (release_id),
        fingerprint TEXT NOT NULL,
        at TEXT NOT NULL,
        mac TEXT NOT NULL
    )"""
FINGERPRINT_COLS = "release_id, fingerprint, at, mac"

# The noisy value of each completed node of a stream's binary tree (dp_spark.mechanisms.tree),
# under the stream's ledger entry (its one charge): drawn and stored once, reused by every later
# point. Written once, MAC'd; never mirrored to Delta, never audited, never shown.
STREAM_NODES_DDL = """CREATE TABLE IF NOT EXISTS dp_stream_nodes (
        stream_id TEXT NOT NULL REFERENCES dp_entries (release_id),
        component TEXT NOT NULL,
        level INTEGER NOT NULL CHECK (level >= 0),
        idx BIGINT NOT NULL CHECK (idx >= 0),
        value TEXT NOT NULL,
        at TEXT NOT NULL,
        mac TEXT NOT NULL,
        PRIMARY KEY (stream_id, component, level, idx)
    )"""
STREAM_NODE_COLS = "stream_id, component, level, idx, value, at, mac"

# The tables of the first ledgers (before the policy history and the version record).
CORE_DDL = (
    """CREATE TABLE IF NOT EXISTS dp_ledger_meta (
        name TEXT PRIMARY KEY,
        value TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS dp_budgets (
        budget_id TEXT PRIMARY KEY,
        dataset TEXT NOT NULL,
        privacy_unit TEXT NOT NULL,
        measure TEXT NOT NULL,
        cap TEXT NOT NULL,
        statement_delta TEXT,
        window_kind TEXT NOT NULL,
        window_days INTEGER,
        max_per_release TEXT,
        head_seq BIGINT NOT NULL,
        head_hash TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        mac TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS dp_bindings (
        dataset_identity TEXT NOT NULL,
        privacy_unit TEXT NOT NULL,
        budget_id TEXT NOT NULL REFERENCES dp_budgets (budget_id),
        created_at TEXT NOT NULL,
        mac TEXT NOT NULL,
        PRIMARY KEY (dataset_identity, privacy_unit)
    )""",
    """CREATE TABLE IF NOT EXISTS dp_entries (
        budget_id TEXT NOT NULL REFERENCES dp_budgets (budget_id),
        seq BIGINT NOT NULL CHECK (seq >= 1),
        release_id TEXT NOT NULL UNIQUE,
        release_family TEXT NOT NULL,
        charge TEXT NOT NULL,
        event_json TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('reserved', 'committed')),
        principal TEXT NOT NULL,
        code_version TEXT NOT NULL,
        owner_token TEXT NOT NULL,
        lease_expires_at TEXT NOT NULL,
        created_at TEXT NOT NULL,
        committed_at TEXT,
        row_hash TEXT NOT NULL,
        state_mac TEXT NOT NULL,
        PRIMARY KEY (budget_id, seq)
    )""",
    "CREATE INDEX IF NOT EXISTS dp_entries_family ON dp_entries (release_family, state)",
    "CREATE INDEX IF NOT EXISTS dp_entries_created ON dp_entries (budget_id, created_at)",
    """CREATE TABLE IF NOT EXISTS dp_audit (
        seq BIGINT PRIMARY KEY,
        at TEXT NOT NULL,
        principal TEXT NOT NULL,
        action TEXT NOT NULL,
        spec_name TEXT,
        spec_version TEXT,
        decision TEXT NOT NULL,
        release_id TEXT,
        charge TEXT,
        detail TEXT,
        row_hash TEXT NOT NULL
    )""",
)

# Columns no code path ever updates (the protocol only touches state, owner, lease, commit time).
IMMUTABLE_ENTRY_COLUMNS = (
    "budget_id, seq, release_id, release_family, charge, event_json, principal, code_version, "
    "created_at, row_hash"
)
