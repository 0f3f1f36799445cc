"""The bounding salt is created atomically on first use (issue 13, "Trust", item 2).

Real processes race to create fresh salt files: every one of them must get the same
non-empty salt and none may raise. Before dp_spark.salt, six processes doing this gave
FileExistsError, an empty salt and two different salts.
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import re
import stat
import threading
import time
from pathlib import Path

import pytest

from dp_spark.errors import ConfigError
from dp_spark.salt import read_or_create_salt

PROCS = 8
ROUNDS = 150
HEX64 = re.compile(r"[0-9a-f]{64}")


def _worker(base: str, rounds: int, barrier, out, no_link: bool) -> None:
    if no_link:  # a filesystem without hard links (FUSE): the O_EXCL fallback
        def _no_link(src, dst):
            raise OSError(errno.EPERM, "Operation not permitted")

        os.link = _no_link
    results = []
    for i in range(rounds):
        barrier.wait(timeout=60)  # everybody starts the round at once
        try:
            results.append(("ok", read_or_create_salt(Path(base) / f"r{i}" / "sub" / "salt")))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            results.append(("error", f"{type(exc).__name__}: {exc}"))
    out.put((os.getpid(), results))


def _race(tmp_path: Path, rounds: int, no_link: bool = False) -> list[list[tuple[str, str]]]:
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(PROCS)
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(str(tmp_path), rounds, barrier, out, no_link))
             for _ in range(PROCS)]
    for p in procs:
        p.start()
    per_proc = [out.get(timeout=120)[1] for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return per_proc


def _check_rounds(tmp_path: Path, per_proc, rounds: int) -> None:
    bad = []
    for i in range(rounds):
        got = [res[i] for res in per_proc]
        errors = [v for k, v in got if k == "error"]
        salts = {v for k, v in got if k == "ok"}
        path = tmp_path / f"r{i}" / "sub" / "salt"
        on_disk = path.read_text()
        if errors or len(salts) != 1 or not HEX64.fullmatch(next(iter(salts), "")) or salts != {on_disk}:
            bad.append((i, errors[:2], len(salts)))
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert os.listdir(path.parent) == ["salt"]  # no temporary file left behind
    assert not bad, f"{len(bad)} of {rounds} rounds went wrong (round, errors, distinct salts): {bad[:5]}"


def test_concurrent_processes_all_get_the_same_salt(tmp_path):
    per_proc = _race(tmp_path, ROUNDS)
    _check_rounds(tmp_path, per_proc, ROUNDS)


def test_concurrent_processes_without_hard_links(tmp_path):
    per_proc = _race(tmp_path, 40, no_link=True)
    _check_rounds(tmp_path, per_proc, 40)


def test_created_once_0600_and_read_back(tmp_path):
    path = tmp_path / "a" / "b" / ".bounding_salt"
    salt = read_or_create_salt(path)
    assert HEX64.fullmatch(salt)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_or_create_salt(path) == salt == path.read_text()
    assert read_or_create_salt(str(path)) == salt


@pytest.mark.parametrize("content", ["ab" * 32, "ab" * 32 + "\n", "c2FsdC1zYWx0LXNhbHQtc2FsdC1zYWx0LXNhbHQ=\n"])
def test_an_existing_salt_is_kept(tmp_path, content):
    path = tmp_path / "salt"
    path.write_text(content)
    assert read_or_create_salt(path) == content.strip()
    assert path.read_text() == content


def test_the_engine_delegates(tmp_path):
    from dp_spark import engine

    path = tmp_path / "salt"
    salt = engine.read_or_create_salt(path)
    assert HEX64.fullmatch(salt) and read_or_create_salt(path) == salt


@pytest.mark.parametrize("content, problem", [
    ("", "is empty"),
    ("\n  \n", "is empty"),
    ("deadbeef", "shorter than 32"),
    ("xyzzy plugh-secret-value-with-spaces-inside", "not a single token"),
    ("\u00e9" * 40, "not a single token"),
])
def test_an_empty_or_malformed_salt_is_refused_without_showing_it(tmp_path, content, problem):
    path = tmp_path / "salt"
    path.write_text(content)
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=problem) as err:
        read_or_create_salt(path, wait_seconds=0.2)
    assert time.monotonic() - t0 >= 0.2  # it waited for a writer that might still be filling it
    msg = str(err.value)
    assert str(path) in msg
    for word in content.split():
        assert word not in msg.replace(str(path), "")  # the content is never shown
    assert path.read_text() == content  # never overwritten


def test_an_empty_salt_being_filled_is_waited_for(tmp_path):
    path = tmp_path / "salt"
    path.write_text("")
    salt = "0123456789abcdef" * 4
    timer = threading.Timer(0.2, lambda: path.write_text(salt))
    timer.start()
    try:
        assert read_or_create_salt(path, wait_seconds=5) == salt
    finally:
        timer.join()
