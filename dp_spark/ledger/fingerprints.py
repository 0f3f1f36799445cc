"""The input fingerprint of releases (``dp_fingerprints``): the keyed content fingerprint of
the input rows a committed release read (:mod:`dp_spark.core.fingerprint`), written once per
release and MAC'd. A scheduled refresh compares it with the current input's to tell a day
whose rows did not change (served by its release, nothing charged) from one whose rows did.

A fingerprint is compared, never shown: no method here returns it in a message, and the
Delta mirror of the ledger does not copy this table.

Nothing here imports pyspark.
"""

from __future__ import annotations

import hmac
from typing import Optional

from dp_spark.errors import LedgerError, LedgerIntegrityError
from dp_spark.ledger.dialects import Cursor, Retry
from dp_spark.ledger.integrity import Integrity, edited_rows
from dp_spark.ledger.records import UnknownReleaseError, check_text, ts_text
from dp_spark.ledger.schema import FINGERPRINT_COLS

__all__ = ["Fingerprints"]


class Fingerprints(Integrity):
    """Record and read the input fingerprint of a release (each MAC checked)."""

    def _fingerprint_mac(self, release_id: str, fingerprint: str, at: str) -> str:
        return self._mac("fingerprint", release_id, fingerprint, at)

    def _checked_fingerprint(self, row: tuple) -> str:
        release_id, fp, at, mac = row
        if not hmac.compare_digest(str(mac), self._fingerprint_mac(release_id, fp, at)):
            raise LedgerIntegrityError(
                f"ledger integrity check failed: the input fingerprint of release {release_id!r} "
                "was edited outside the ledger")
        return str(fp)

    def record_fingerprint(self, release_id: str, fingerprint: str) -> bool:
        """Record the input fingerprint of ``release_id`` (a release with a ledger entry),
        once: True when recorded now, False when one was already recorded (it is kept)."""
        check_text(release_id, "release_id")
        if not isinstance(fingerprint, str) or not fingerprint or len(fingerprint) > 256:
            raise LedgerError("a fingerprint is a non-empty text")  # never echoed

        def fn(cur: Cursor) -> bool:
            if cur.one("SELECT 1 FROM dp_entries WHERE release_id = ?", (release_id,)) is None:
                raise UnknownReleaseError(f"no ledger entry for release {release_id!r}")
            stamp = ts_text(self._now(None))
            n = cur.x(
                f"INSERT INTO dp_fingerprints ({FINGERPRINT_COLS}) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (release_id) DO NOTHING",
                (release_id, fingerprint, stamp, self._fingerprint_mac(release_id, fingerprint, stamp)),
            )
            if n == 1:
                return True
            if cur.one("SELECT 1 FROM dp_fingerprints WHERE release_id = ?", (release_id,)) is None:
                raise Retry()
            return False

        return self._run("record_fingerprint", fn, write=True)

    def fingerprint(self, release_id: str) -> Optional[str]:
        """The input fingerprint recorded for ``release_id`` (MAC checked), or None (a release
        recorded before fingerprints, or none)."""
        def fn(cur: Cursor) -> Optional[str]:
            row = cur.one(f"SELECT {FINGERPRINT_COLS} FROM dp_fingerprints WHERE release_id = ?", (release_id,))
            return None if row is None else self._checked_fingerprint(row)

        return self._run("fingerprint", fn, write=False)

    def _fingerprint_problems(self, cur: Cursor) -> list[str]:
        return edited_rows(cur.q(f"SELECT {FINGERPRINT_COLS} FROM dp_fingerprints ORDER BY release_id"), self._checked_fingerprint,
                           lambda row: f"input fingerprint of release {row[0]!r}")
