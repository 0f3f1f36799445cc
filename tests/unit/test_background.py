"""``dp_spark.background.Coalescing``: the ledger mirror's background refresher.

Its contract: one run at a time; every request is followed by a run that started after it
(requests made during a run coalesce into ONE more run); ``wait`` returns when nothing is
pending or running; a failing run is logged and does not stop later runs."""

from __future__ import annotations

import logging
import threading
import time

from dp_spark.background import Coalescing


def test_requests_during_a_run_coalesce_into_one_more_run_that_starts_after_them():
    gate, started = threading.Event(), threading.Event()
    starts: list[int] = []  # the number of requests made before each run started
    requests = [0]

    def fn():
        starts.append(requests[0])
        started.set()
        gate.wait(10)

    task = Coalescing(fn, name="t")
    requests[0] += 1
    task.request()
    assert started.wait(10)
    for _ in range(5):  # all while the first run is blocked
        requests[0] += 1
        task.request()
    assert not task.idle
    assert task.wait(timeout=0.2) is False  # the blocked run is still going
    gate.set()
    assert task.wait(timeout=10) is True
    # exactly two runs: the first, then ONE run for the five requests, started after all of them
    assert starts == [1, 6] and task.runs == 2 and task.idle


def test_never_two_runs_at_once_and_no_request_is_lost():
    active, peak, lock = [0], [0], threading.Lock()
    seen: list[int] = []
    counter = [0]

    def fn():
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
            seen.append(counter[0])
        time.sleep(0.002)
        with lock:
            active[0] -= 1

    task = Coalescing(fn, name="t")

    def requester():
        for _ in range(50):
            with lock:
                counter[0] += 1
            task.request()

    threads = [threading.Thread(target=requester) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert task.wait(timeout=10)
    assert peak[0] == 1
    # the last run started after the last request: it saw every one of them
    assert seen[-1] == 200 and 1 <= task.runs <= 200


def test_a_failing_run_is_logged_by_type_and_the_next_request_runs_again(caplog):
    calls = []

    def fn():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("value 12345 must not be logged")

    task = Coalescing(fn, name="dp_spark-mirror")
    with caplog.at_level(logging.WARNING, logger="dp_spark.background"):
        task.request()
        assert task.wait(timeout=10)
    assert "RuntimeError" in caplog.text and "12345" not in caplog.text
    task.request()
    assert task.wait(timeout=10) and len(calls) == 2 and task.runs == 2


def test_wait_on_an_idle_task_returns_at_once():
    task = Coalescing(lambda: None, name="t")
    assert task.idle and task.wait(timeout=0) is True and task.runs == 0
