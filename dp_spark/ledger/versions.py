"""The version record of release families (``dp_versions``): publish, supersede, withdraw,
restore. Rows whose state changes, each MAC'd over all its fields, at most one ``current``
row per (family, series key): a version of a whole family (series key NULL) supersedes the
family's previous one; a version of one key of a series (a day) supersedes only the previous
version of that key, so every day of a series stays current. A change runs in one write transaction under the budget lock of the
releases' budgets, so it is serialised with their reservations. Rows are never deleted.

Nothing here imports pyspark.
"""

from __future__ import annotations

import hmac
from dataclasses import replace
from datetime import datetime
from typing import Any, Optional, Sequence

from dp_spark.errors import ConfigError, LedgerError, LedgerIntegrityError
from dp_spark.ledger.dialects import Cursor, Retry
from dp_spark.ledger.integrity import Integrity
from dp_spark.ledger.records import VERSION_STATES, VersionRecord, check_text, parse_ts, ts_text
from dp_spark.ledger.schema import VERSION_COLS, VERSIONS_SEQ

__all__ = ["Versions"]


class Versions(Integrity):
    """Record, withdraw and read the versions of release families."""

    def _version(self, r: Sequence[Any]) -> VersionRecord:
        """A dp_versions row (VERSION_COLS order), its MAC checked."""
        if not hmac.compare_digest(str(r[9]), self._version_mac(r, r[10])):
            raise LedgerIntegrityError(
                f"ledger integrity check failed: version {r[1]} of family {r[0]!r} was edited outside the ledger")
        return VersionRecord(family=r[0], version_no=int(r[1]), release_id=r[2], state=r[3], reason=r[4],
                             principal=r[5], at=parse_ts(r[6]), changed_by=r[7],
                             changed_at=None if r[8] is None else parse_ts(r[8]), series_key=r[10])

    def _family_versions(self, cur: Cursor, families: Sequence[str]) -> list[VersionRecord]:
        """Every version of ``families``, ordered by (family, version_no), MACs checked, and
        at most one current version per (family, series key) (else LedgerIntegrityError)."""
        if not families:
            return []
        marks = ", ".join("?" * len(families))
        out = [self._version(r) for r in cur.q(
            f"SELECT {VERSION_COLS} FROM dp_versions WHERE family IN ({marks}) ORDER BY family, version_no",
            tuple(families))]
        seen: set[tuple[str, Optional[str]]] = set()
        for v in out:
            if v.state == "current":
                if (v.family, v.series_key) in seen:
                    raise LedgerIntegrityError(f"ledger integrity check failed: family {v.family!r} has several "
                                               "current versions" + ("" if v.series_key is None else " of one key"))
                seen.add((v.family, v.series_key))
        return out

    def _lock_budgets_of(self, cur: Cursor, release_ids: Sequence[str]) -> None:
        """Take the budget lock (the budget row, ``FOR UPDATE`` on PostgreSQL; SQLite's write
        transaction is already exclusive) of every budget that charged one of ``release_ids``,
        in budget order, so a version change is serialised with that budget's reservations."""
        ids = sorted(set(release_ids))
        if not ids:
            return
        marks = ", ".join("?" * len(ids))
        budgets = sorted({r[0] for r in cur.q(
            f"SELECT DISTINCT budget_id FROM dp_entries WHERE release_id IN ({marks})", tuple(ids))})
        for bid in budgets:
            self._load_budget(cur, bid, lock=True)

    def _bump_versions_seq(self, cur: Cursor) -> int:
        """Count one more version-record change (``dp_ledger_meta``: an atomic increment);
        returns the new count. The derived ``_published`` Delta table records the count it
        was refreshed at."""
        n = cur.x("UPDATE dp_ledger_meta SET value = CAST(CAST(value AS BIGINT) + 1 AS TEXT) WHERE name = ?",
                  (VERSIONS_SEQ,))
        if n == 0:
            cur.x("INSERT INTO dp_ledger_meta (name, value) VALUES (?, ?)", (VERSIONS_SEQ, "1"))
        return int(cur.scalar("SELECT value FROM dp_ledger_meta WHERE name = ?", (VERSIONS_SEQ,)))

    def _insert_version(self, cur: Cursor, r: tuple, series_key: Optional[str]) -> None:
        cur.x(f"INSERT INTO dp_versions ({VERSION_COLS}) VALUES ({', '.join(['?'] * 11)})",
              (*r, self._version_mac(r, series_key), series_key))

    def _change_version(self, cur: Cursor, v: VersionRecord, new_state: str, principal: str, at: str,
                        reason: Optional[str] = None) -> None:
        """Compare-and-set one version's state (from ``v.state``); a lost race is retried."""
        r = (v.family, v.version_no, v.release_id, new_state, v.reason if reason is None else reason,
             v.principal, ts_text(v.at), principal, at)
        n = cur.x("UPDATE dp_versions SET state = ?, reason = ?, changed_by = ?, changed_at = ?, mac = ? "
                  "WHERE family = ? AND version_no = ? AND state = ?",
                  (new_state, r[4], principal, at, self._version_mac(r, v.series_key), v.family, v.version_no,
                   v.state))
        if n != 1:
            raise Retry()

    def record_versions(self, items: Sequence[tuple[str, ...]], principal: str,
                        now: Optional[datetime] = None) -> list[int]:
        """Make each (family, release id[, series key]) of ``items``, in order, the current
        version of its family (of that key of the family), in ONE write transaction under the
        budget lock of the releases' budgets: a new version supersedes the current one of the
        same (family, series key) -- without a key (or None), the family's one current version;
        with a key (a day of a series), that day's only -- so the last new release of each ends
        up current. Idempotent per (family, release id): one that already has a version (in any
        state) changes nothing, so a withdrawn release never comes back. Returns each item's
        version number."""
        norm: list[tuple[str, str, Optional[str]]] = [
            (check_text(it[0], "family"), check_text(it[1], "release_id"),
             None if len(it) < 3 or it[2] is None else check_text(it[2], "series_key")) for it in items]
        check_text(principal, "principal")
        at = ts_text(self._now(now))

        def fn(cur: Cursor) -> list[int]:
            self._lock_budgets_of(cur, [r for _, r, _ in norm])
            families = sorted({f for f, _, _ in norm})
            rows = self._family_versions(cur, families)
            known = {(v.family, v.release_id): v.version_no for v in rows}
            next_no = {f: max((v.version_no for v in rows if v.family == f), default=0) + 1 for f in families}
            out = []
            changed = False
            for f, rid, key in norm:
                if (f, rid) not in known:
                    replaced = [v for v in rows if v.family == f and v.series_key == key and v.state == "current"]
                    for v in replaced:
                        self._change_version(cur, v, "superseded", principal, at)
                    rows = [replace(v, state="superseded") if v in replaced else v for v in rows]
                    no = next_no[f]
                    next_no[f] += 1
                    self._insert_version(cur, (f, no, rid, "current", None, principal, at, None, None), key)
                    rows.append(VersionRecord(f, no, rid, "current", None, principal, parse_ts(at), None, None, key))
                    known[(f, rid)] = no
                    changed = True
                out.append(known[(f, rid)])
            if changed:
                self._bump_versions_seq(cur)
            return out

        if not items:
            return []
        return self._run("record_versions", fn, write=True)

    def withdraw_version(self, family: str, principal: str, reason: str,
                         now: Optional[datetime] = None, *,
                         series_key: Optional[str] = None) -> tuple[str, Optional[str]]:
        """Withdraw a current version of the family and make the latest earlier superseded one
        of the same series key current, in one write transaction under the budget lock of both
        releases' budgets. Which: the current version of ``series_key`` (a day of a series)
        when given, else the family's latest current version (a family that is not a series
        has one). Returns (withdrawn release id, restored release id or None). Rows are never
        deleted. ConfigError when there is no such current version."""
        check_text(family, "family")
        check_text(principal, "principal")
        check_text(reason, "reason")
        if series_key is not None:
            check_text(series_key, "series_key")
        at = ts_text(self._now(now))

        def fn(cur: Cursor) -> tuple[str, Optional[str]]:
            rows = self._family_versions(cur, [family])
            self._lock_budgets_of(cur, [v.release_id for v in rows if v.state in ("current", "superseded")])
            rows = self._family_versions(cur, [family])  # under the lock
            cur_ = [v for v in rows if v.state == "current" and (series_key is None or v.series_key == series_key)]
            if not cur_:
                what = "" if series_key is None else " for that key"
                raise ConfigError(f"family {family!r} has no current version{what} to roll back")
            c = cur_[-1]
            earlier = [v for v in rows if v.version_no < c.version_no and v.state == "superseded"
                       and v.series_key == c.series_key]
            prev = earlier[-1] if earlier else None
            self._change_version(cur, c, "withdrawn", principal, at, reason)
            if prev is not None:
                self._change_version(cur, prev, "current", principal, at)
            self._bump_versions_seq(cur)
            return c.release_id, None if prev is None else prev.release_id

        return self._run("withdraw_version", fn, write=True)

    def versions(self, family: Optional[str] = None) -> list[VersionRecord]:
        """The versions of ``family`` (of every family by default), ordered by (family,
        version_no), each row's MAC checked."""
        return self.versions_snapshot(family)[1]

    def versions_snapshot(self, family: Optional[str] = None) -> tuple[int, list[VersionRecord]]:
        """(the number of version-record changes so far, :meth:`versions`), read in one
        transaction: the derived ``_published`` table is refreshed from it."""
        def fn(cur: Cursor) -> tuple[int, list[VersionRecord]]:
            row = cur.one("SELECT value FROM dp_ledger_meta WHERE name = ?", (VERSIONS_SEQ,))
            if family is not None:
                return (0 if row is None else int(row[0])), self._family_versions(cur, [family])
            families = [r[0] for r in cur.q("SELECT DISTINCT family FROM dp_versions ORDER BY family")]
            return (0 if row is None else int(row[0])), self._family_versions(cur, families)

        return self._run("versions", fn, write=False)

    def import_versions(self, records: Sequence[VersionRecord]) -> bool:
        """Adopt a version history kept elsewhere (the ``_published`` Delta table of a
        deployment older than the ledger's version record), once: inserted in one transaction
        only while the ledger holds no version at all; True when imported. Every row is checked
        like the ledger's own (states, one current version per (family, series key), unique
        numbers)."""
        recs = sorted(records, key=lambda v: (v.family, v.version_no))
        for v in recs:
            check_text(v.family, "family")
            check_text(v.release_id, "release_id")
            check_text(v.principal, "principal")
            if v.state not in VERSION_STATES:
                raise LedgerError(f"version {v.version_no} of family {v.family!r}: unknown state")

        def fn(cur: Cursor) -> bool:
            if cur.one("SELECT 1 FROM dp_versions LIMIT 1") is not None:
                return False
            for v in recs:
                self._insert_version(cur, (v.family, v.version_no, v.release_id, v.state, v.reason, v.principal,
                                           ts_text(v.at), v.changed_by,
                                           None if v.changed_at is None else ts_text(v.changed_at)),
                                    v.series_key)
            if recs:
                self._bump_versions_seq(cur)
            return bool(recs)

        return self._run("import_versions", fn, write=True)

    def _version_problems(self, cur: Cursor) -> list[str]:
        """Every version row's MAC and at most one current version per (family, series key)."""
        problems = []
        current: dict[tuple[str, str], int] = {}
        for r in cur.q(f"SELECT {VERSION_COLS} FROM dp_versions ORDER BY family, version_no"):
            if not hmac.compare_digest(str(r[9]), self._version_mac(r, r[10])):
                problems.append(f"version {r[1]} of family {r[0]!r} edited outside the ledger")
            if r[3] == "current":
                k = (r[0], "" if r[10] is None else r[10])
                current[k] = current.get(k, 0) + 1
        problems.extend(f"family {f!r} has {n} current versions" + (" of one key" if key else "")
                        for (f, key), n in sorted(current.items()) if n > 1)
        return problems
