"""Driver-side overlap: run a short, independent piece of work in a thread while the caller
goes on (e.g. Delta metadata while the executors aggregate, or two tables written at once).

Spark sessions (classic and Connect) accept jobs from several driver threads at once.
"""

from __future__ import annotations

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
