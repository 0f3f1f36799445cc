"""A helper of the write tests: hold a Delta write inside its Spark job.

``stalled(df, sync)`` is ``df`` with its ``release_id`` column passed through a Python UDF that,
in the task, creates ``sync/started`` and then waits until ``sync/go`` exists. A write of that
frame is therefore held after Delta has started its transaction (read its snapshot, looked its
idempotency key up) and while it writes its files, i.e. in the middle of its commit; the test
creates ``go`` to let it finish. Files, not events: the task runs in a Python worker process
(and on Spark Connect in the server's). The UDF is a closure, so it is shipped by value.
"""

from __future__ import annotations

import time
from pathlib import Path


def stalled(df, sync: Path, timeout: float = 300.0):
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    started, go = str(Path(sync) / "started"), str(Path(sync) / "go")

    def hold(value):
        import os
        import time as _time

        open(started, "a").close()
        deadline = _time.monotonic() + timeout
        while not os.path.exists(go) and _time.monotonic() < deadline:
            _time.sleep(0.05)
        return value

    hold_udf = F.udf(hold, T.StringType())
    return df.withColumn("release_id", hold_udf(F.col("release_id")))


def wait_started(sync: Path, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not (Path(sync) / "started").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the held write never started")
        time.sleep(0.05)


def release(sync: Path) -> None:
    (Path(sync) / "go").touch()
