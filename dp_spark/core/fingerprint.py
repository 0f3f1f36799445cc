"""The content fingerprint of a day's input rows: its pure part (combining and keying).

A scheduled refresh (:mod:`dp_spark.schedule`) asks whether the rows a day's release read
have changed since it was published, when the input table has a new snapshot (an append of
other days, a rewrite of the same rows). The executors hash each row once and sum the
hashes; this module turns those sums into one keyed fingerprint::

    row hash  h = xxhash64(row key, null flags, the columns the spec reads)   (executors)
    digest      = (number of rows, sum of h mod 2^64)                         order-independent
    fingerprint = HMAC-SHA256(fingerprint key, version, columns, days, digest) (driver, here)

* **Order-independent**: a sum does not depend on the order or partitioning of the rows, so a
  rewrite of the same rows in another order gives the same digest; the digests of disjoint row
  sets (days, partitions) add (:meth:`RowDigest.__add__`).
* **Exact modulo 2^64**: each 64-bit hash is summed in four 16-bit limbs
  (:data:`LIMB_BITS`), each limb sum an exact 64-bit integer for fewer than 2^47 rows
  (Spark's ANSI mode would raise on an overflowing sum of raw hashes, its legacy mode would
  wrap: neither ambiguity arises); :meth:`RowDigest.from_limb_sums` recombines them here.
* **Keyed**: both the row hashes and the final HMAC depend on a key derived from the
  warehouse's secret salt (:func:`fingerprint_keys`), in its own domain (the salt's other
  use, the bounding priorities, learns nothing from it). A stored fingerprint cannot be used
  to test a guessed dataset without the salt.

A fingerprint is compared, never shown: it is not logged, printed, audited, mirrored or
written to a release table.

Pure: no pyspark (the Spark aggregation is :mod:`dp_spark.backends.fingerprint`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Iterable, Sequence

__all__ = [
    "FINGERPRINT_VERSION",
    "LIMBS",
    "LIMB_BITS",
    "MOD",
    "RowDigest",
    "fingerprint",
    "fingerprint_keys",
    "same_fingerprint",
]

#: bumped when the row hash or the message changes (an old fingerprint then never matches)
FINGERPRINT_VERSION = 1
MOD = 1 << 64
LIMB_BITS = 16
LIMBS = 64 // LIMB_BITS
_LIMB_MASK = (1 << LIMB_BITS) - 1


@dataclass(frozen=True)
class RowDigest:
    """An order-independent digest of a multiset of rows: how many, and the sum of their
    64-bit hashes modulo 2^64. The digest of a union of disjoint row sets is the sum of
    their digests."""

    rows: int = 0
    total: int = 0  # in [0, 2^64)

    def __post_init__(self) -> None:
        if self.rows < 0 or not 0 <= self.total < MOD:
            raise ValueError("a digest has rows >= 0 and a total in [0, 2^64)")

    def __add__(self, other: "RowDigest") -> "RowDigest":
        return RowDigest(self.rows + other.rows, (self.total + other.total) % MOD)

    @classmethod
    def of_hashes(cls, hashes: Iterable[int]) -> "RowDigest":
        """The digest of rows with these 64-bit hashes (signed, as Spark's ``xxhash64`` gives
        them, or unsigned): the reference the Spark aggregation must agree with."""
        n = 0
        total = 0
        for h in hashes:
            n += 1
            total = (total + int(h)) % MOD
        return cls(n, total)

    @classmethod
    def from_limb_sums(cls, rows: int, limb_sums: Sequence[int]) -> "RowDigest":
        """Recombine the per-limb sums: ``limb_sums[i]`` = the sum over the rows of
        ``(h >> (16 i)) & 0xFFFF`` (two's complement ``h``; ``i = 0`` the lowest limb)."""
        if len(limb_sums) != LIMBS:
            raise ValueError(f"a digest has {LIMBS} limb sums")
        total = 0
        for i, s in enumerate(limb_sums):
            if s is None or int(s) < 0:
                raise ValueError("a limb sum is a non-negative integer")
            total += int(s) << (LIMB_BITS * i)
        return cls(int(rows), total % MOD)

    @staticmethod
    def limbs_of(h: int) -> tuple[int, ...]:
        """The limbs of one hash (what the executors sum), lowest first."""
        u = int(h) % MOD
        return tuple((u >> (LIMB_BITS * i)) & _LIMB_MASK for i in range(LIMBS))


def fingerprint_keys(salt: str) -> tuple[bytes, str]:
    """(the HMAC key of the fingerprint, the row key mixed into every row hash), derived from
    the warehouse's salt in their own domains. Neither is ever logged."""
    if not isinstance(salt, str) or not salt:
        raise ValueError("a fingerprint needs the warehouse's salt")
    mac_key = hmac.new(salt.encode("utf-8"), b"dp_spark input fingerprint: hmac key", hashlib.sha256).digest()
    row_key = hmac.new(salt.encode("utf-8"), b"dp_spark input fingerprint: row key", hashlib.sha256).hexdigest()
    return mac_key, row_key


def fingerprint(digest: RowDigest, mac_key: bytes, *, columns: Sequence[str], days: Sequence[str]) -> str:
    """The keyed fingerprint (hex) of ``digest``: the rows of ``days`` (the date keys whose
    rows reach the day's cells) restricted to ``columns`` (the columns the spec reads, in
    the order hashed)."""
    msg = json.dumps({"v": FINGERPRINT_VERSION, "columns": list(columns), "days": sorted(days),
                      "rows": digest.rows, "total": str(digest.total)},
                     sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hmac.new(mac_key, msg.encode("utf-8"), hashlib.sha256).hexdigest()


def same_fingerprint(a: str, b: str) -> bool:
    """Constant-time comparison of two fingerprints."""
    return hmac.compare_digest(str(a), str(b))
