"""Helpers of the tests that run a job in a process of its own and kill it."""

from __future__ import annotations

import os
import signal
import subprocess


def kill_group(proc: subprocess.Popen) -> None:
    """kill -9 of the run's whole process group (its Python driver, its JVM, its Python
    workers): the process must have been started with ``start_new_session=True``."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(60)
