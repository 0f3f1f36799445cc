"""Concurrent charges (RELIABILITY "Ledger and faults"), on SQLite and PostgreSQL.

32 charges of 0.1 against a cap of 1.0, from 32 threads and from 32 spawned processes, each
with its own connection: exactly 10 succeed and their sequence numbers are 1..10, no gaps
and no duplicates. Retries and concurrent runs of one release make one entry.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections import Counter

import pytest

from dp_spark.core.budget import PureDP
from dp_spark.errors import BudgetExceededError, ReleaseConflictError

N = 32
CHARGE = "0.1"


def _charge_once(url: str, key, i: int, wait) -> tuple[int, str, object]:
    from dp_spark.ledger import open_ledger

    ledger = open_ledger(url, key=key)
    try:
        wait()
        r = ledger.reserve("b", f"release-{i}", PureDP(CHARGE), "{}", principal=f"p{i}", code_version="v1",
                           release_family="fam", owner_token=f"owner-{i}")
        return i, "ok", r.entry.seq
    except BudgetExceededError:
        return i, "exceeded", None
    except Exception as exc:  # reported, then asserted absent
        return i, "error", repr(exc)
    finally:
        ledger.close()


def _process_worker(url: str, key, i: int, barrier, queue) -> None:
    queue.put(_charge_once(url, key, i, lambda: barrier.wait(timeout=120)))


def _check(ledger, results) -> None:
    kinds = Counter(r[1] for r in results)
    assert [r for r in results if r[1] == "error"] == []
    assert kinds == {"ok": 10, "exceeded": N - 10}
    assert sorted(r[2] for r in results if r[1] == "ok") == list(range(1, 11))
    assert [e.seq for e in ledger.entries("b")] == list(range(1, 11))
    st = ledger.status("b")
    assert st.spent == PureDP(1) and st.remaining == PureDP.zero() and st.entries == 10
    ledger.verify()


@pytest.fixture
def capped(ledger_factory, policy):
    ledger = ledger_factory()
    ledger.register_budget(policy("b", cap=1))
    return ledger


def test_32_threads_exactly_10_succeed(ledger_factory, capped):
    barrier = threading.Barrier(N)
    results: list = []
    lock = threading.Lock()

    def run(i: int) -> None:
        r = _charge_once(ledger_factory.url, ledger_factory.key, i, lambda: barrier.wait(timeout=120))
        with lock:
            results.append(r)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert len(results) == N
    _check(capped, results)


def test_32_processes_exactly_10_succeed(ledger_factory, capped):
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(N)
    queue = ctx.Queue()
    procs = [ctx.Process(target=_process_worker, args=(ledger_factory.url, ledger_factory.key, i, barrier, queue))
             for i in range(N)]
    for p in procs:
        p.start()
    try:
        results = [queue.get(timeout=240) for _ in range(N)]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs)
    _check(capped, results)


def test_one_ledger_object_shared_by_32_threads(capped):
    barrier = threading.Barrier(N)
    results: list = []

    def run(i: int) -> None:
        barrier.wait(timeout=60)
        try:
            r = capped.reserve("b", f"release-{i}", PureDP(CHARGE), "{}", principal="p", code_version="v1",
                               release_family="fam", owner_token=f"owner-{i}")
            results.append((i, "ok", r.entry.seq))
        except BudgetExceededError:
            results.append((i, "exceeded", None))
        except Exception as exc:
            results.append((i, "error", repr(exc)))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    _check(capped, results)


def _protocol_run(ledger, owner: str) -> bool:
    """One run of a release: reserve, then (the release write), then commit. True if charged."""
    r = ledger.reserve("b", "the-release", PureDP(CHARGE), "{}", principal="p", code_version="v1",
                       release_family="fam", owner_token=owner)
    if r.entry.state != "committed":
        ledger.commit("the-release", owner)
    return not r.reused


def test_five_retries_of_one_release_make_one_entry(capped):
    charged = [_protocol_run(capped, f"run-{i}") for i in range(5)]
    assert charged == [True, False, False, False, False]
    assert [(e.release_id, e.seq, e.state) for e in capped.entries("b")] == [("the-release", 1, "committed")]
    assert capped.status("b").spent == PureDP(CHARGE)


def test_five_concurrent_runs_of_one_release_one_charge(ledger_factory, capped):
    barrier = threading.Barrier(5)
    outcomes: list = []

    def run(i: int) -> None:
        led = ledger_factory()
        barrier.wait(timeout=60)
        try:
            outcomes.append("charged" if _protocol_run(led, f"run-{i}") else "reused")
        except ReleaseConflictError:
            outcomes.append("conflict")  # the engine waits, then serves the winner's output

    threads = [threading.Thread(target=run, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(outcomes) == 5 and outcomes.count("charged") == 1
    assert set(outcomes) <= {"charged", "reused", "conflict"}
    entries = capped.entries("b")
    assert len(entries) == 1 and entries[0].state == "committed"
    assert capped.status("b").spent == PureDP(CHARGE)
