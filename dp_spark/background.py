"""Driver-side overlap: run a short, independent piece of work in a thread while the caller
goes on (e.g. Delta metadata while the executors aggregate, or two tables written at once).

Spark sessions (classic and Connect) accept jobs from several driver threads at once.
"""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator


@contextmanager
def alongside(fn: Callable[..., Any], *args: Any, name: str) -> Iterator[None]:
    """Run ``fn(*args)`` in a thread for the duration of the ``with`` body, then wait for it.

    An exception of ``fn`` is raised in the caller's thread after the body (one of the body
    takes precedence); a ``fn`` that must never fail the caller catches its own errors.
    """
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn(*args)
        except BaseException as exc:  # handed to the caller below
            errors.append(exc)

    t = threading.Thread(target=run, name=name, daemon=True)
    t.start()
    try:
        yield
    finally:
        t.join()
    if errors:
        raise errors[0]


class Coalescing:
    """Run ``fn`` in ONE background thread whenever it is requested, never twice at once.

    Requests made while ``fn`` runs are coalesced into one more run after it, so every request
    is followed by a run that *started after it* (what a refresh needs: the last run saw the
    state of the last request). :meth:`wait` blocks until no run is pending or running.

    ``fn`` must not raise (it is a refresh whose authority lives elsewhere); an exception that
    escapes is logged by its type only (no data) and the next request runs ``fn`` again.
    """

    def __init__(self, fn: Callable[[], Any], *, name: str):
        self._fn = fn
        self._name = name
        self._cv = threading.Condition()
        self._pending = False
        self._thread: threading.Thread | None = None
        self.runs = 0  # completed runs (tests, benchmarks)

    def request(self) -> None:
        """Ask for a run; returns at once."""
        with self._cv:
            self._pending = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()

    @property
    def idle(self) -> bool:
        with self._cv:
            return self._thread is None and not self._pending

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every requested run has completed; False when ``timeout`` ran out."""
        with self._cv:
            return self._cv.wait_for(lambda: self._thread is None and not self._pending, timeout)

    def _loop(self) -> None:
        while True:
            with self._cv:
                if not self._pending:
                    self._thread = None
                    self._cv.notify_all()
                    return
                self._pending = False
            try:
                self._fn()
            except BaseException as exc:  # noqa: BLE001 - see the class docstring
                logging.getLogger("dp_spark.background").warning(
                    "%s: background run failed (%s)", self._name, type(exc).__name__)
            with self._cv:
                self.runs += 1
