"""The pure part of a day's input fingerprint (dp_spark.core.fingerprint): order-independent,
exact modulo 2^64 whatever the number of rows, keyed by the salt. No Spark."""

from __future__ import annotations

import random

import pytest

from dp_spark.core.fingerprint import (
    LIMBS,
    MOD,
    RowDigest,
    fingerprint,
    fingerprint_keys,
    same_fingerprint,
)

SALT = "0123456789abcdef" * 4


def signed64(rng: random.Random) -> int:
    return rng.randrange(-(1 << 63), 1 << 63)  # what Spark's xxhash64 returns


def limb_digest(hashes) -> RowDigest:
    """What the executors compute: a count and four 16-bit limb sums, recombined."""
    sums = [0] * LIMBS
    n = 0
    for h in hashes:
        n += 1
        for i, limb in enumerate(RowDigest.limbs_of(h)):
            sums[i] += limb
    return RowDigest.from_limb_sums(n, sums)


def test_the_digest_ignores_order_and_partitioning():
    rng = random.Random(5)
    hashes = [signed64(rng) for _ in range(2000)]
    whole = RowDigest.of_hashes(hashes)
    shuffled = hashes[:]
    rng.shuffle(shuffled)
    assert RowDigest.of_hashes(shuffled) == whole
    parts = [shuffled[i::7] for i in range(7)]  # seven partitions, any order
    total = RowDigest()
    for p in reversed(parts):
        total = total + limb_digest(p)
    assert total == whole and whole.rows == 2000
    # one row changed, added or removed: another digest
    assert RowDigest.of_hashes(hashes[:-1] + [hashes[-1] ^ 1]) != whole
    assert RowDigest.of_hashes(hashes[:-1]) != whole
    assert RowDigest.of_hashes(hashes + [0]) != whole  # a row hashing to 0 still counts


def test_the_sum_is_exact_modulo_2_64():
    top = (1 << 63) - 1
    # signed hashes wrap as unsigned: -1 is 2^64 - 1
    assert RowDigest.of_hashes([-1]).total == MOD - 1
    assert RowDigest.of_hashes([top, top, 2]).total == 0  # 2^64 exactly
    assert RowDigest.of_hashes([-(1 << 63), -(1 << 63)]).total == 0
    assert limb_digest([top, top, 2]) == RowDigest.of_hashes([top, top, 2])
    rng = random.Random(11)
    hs = [signed64(rng) for _ in range(500)] + [-1, top, -(1 << 63), 0]
    assert limb_digest(hs) == RowDigest.of_hashes(hs)
    # limb sums of 2^46 rows of all-ones hashes (the largest sums the executors can produce
    # below 2^47 rows) recombine exactly: (2^46 x (2^64 - 1)) mod 2^64
    n = 1 << 46
    d = RowDigest.from_limb_sums(n, [n * 0xFFFF] * LIMBS)
    assert d.total == (n * (MOD - 1)) % MOD and d.rows == n
    with pytest.raises(ValueError):
        RowDigest.from_limb_sums(1, [0, 0, 0])
    with pytest.raises(ValueError):
        RowDigest(rows=1, total=MOD)


def test_the_fingerprint_is_keyed_by_the_salt_and_hides_it():
    d = RowDigest.of_hashes([1, 2, 3])
    key, row_key = fingerprint_keys(SALT)
    fp = fingerprint(d, key, columns=("user_id", "day"), days=("2026-11-03",))
    assert fp == fingerprint(d, fingerprint_keys(SALT)[0], columns=("user_id", "day"), days=("2026-11-03",))
    other = fingerprint(d, fingerprint_keys("f" * 64)[0], columns=("user_id", "day"), days=("2026-11-03",))
    assert not same_fingerprint(fp, other)  # the same rows under another salt
    assert fp != fingerprint(RowDigest.of_hashes([1, 2, 4]), key, columns=("user_id", "day"), days=("2026-11-03",))
    assert fp != fingerprint(d, key, columns=("user_id",), days=("2026-11-03",))
    assert fp != fingerprint(d, key, columns=("user_id", "day"), days=("2026-11-04",))
    # the keys are derived in their own domains: neither is the salt, nor each other
    assert SALT not in fp and SALT not in row_key and row_key != key.hex()
    assert len(fp) == 64 and int(fp, 16) >= 0
    with pytest.raises(ValueError):
        fingerprint_keys("")


# -- which rows and columns a day's fingerprint covers (dp_spark.schedule) -----------------------
def test_a_day_fingerprints_the_rows_reaching_its_cells_and_the_columns_the_spec_reads(tmp_path):
    from datetime import date
    from pathlib import Path

    import yaml

    from dp_spark.config import load_release_spec
    from dp_spark.schedule import day_spec, fingerprint_columns, source_days

    conf = Path(__file__).resolve().parents[2] / "conf" / "releases"
    dau = day_spec(load_release_spec(conf / "dau_daily.yaml"), date(2026, 11, 3))
    assert source_days(dau) == ("2026-11-03",) and fingerprint_columns(dau) == ("user_id", "day")
    # rolling windows: the 28 days the monthly window of the day covers
    mau = day_spec(load_release_spec(conf / "wau_mau_daily.yaml"), date(2026, 11, 30))
    assert source_days(mau) == tuple(f"2026-11-{d:02d}" for d in range(3, 31))
    # a where's columns count; a column only listed in `columns` does not (it changes no cell)
    raw = yaml.safe_load((conf / "dau_daily.yaml").read_text())
    raw.update(columns=["user_id", "day", "region", "event_time"], where="region <> 'region_01'")
    p = tmp_path / "dau_where.yaml"
    p.write_text(yaml.safe_dump(raw))
    spec = day_spec(load_release_spec(p), date(2026, 11, 3))
    assert fingerprint_columns(spec) == ("user_id", "day", "region")
