"""One run of tests/jobs/test_concurrent_family.py: publish the one-day restriction of
``dau_daily`` for DAY in its own Spark session (local[1]), official and deferred like the
daily refresh, then ``finish()``. Barriers (files in SYNC_DIR) make the runs overlap:

    ready.<day>      written once the engine is built; then wait for ``go``
    published.<day>  written once the release is written and committed; then wait until all
                     N runs published (bounded), so that every finish() sees the others'
                     releases committed but not yet versioned

Usage: python concurrent_family_driver.py ENV_FILE DAY SYNC_DIR N [CONNECT_URL]
(with CONNECT_URL the run is a Spark Connect client of that server instead of a local session)
Prints one JSON line {"day", "release_id", "status"}; exits 0 only when finish() succeeded.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def wait_for(pred, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            print(f"barrier timeout: {what}", file=sys.stderr)
            return
        time.sleep(0.1)


def main(env_file: str, day: str, sync_dir: str, n: int, remote: str | None = None) -> int:
    from dp_spark.config import load_env, load_release_spec
    from dp_spark.engine import Engine
    from dp_spark.schedule import day_spec
    from dp_spark.spark import get_or_create_session

    sync = Path(sync_dir)
    spark = get_or_create_session(f"dp_spark-concurrent-{day}", master="local[1]", remote=remote)
    env = load_env(env_file)
    spec = day_spec(load_release_spec(Path(env_file).parents[1] / "releases" / "dau_daily.yaml"),
                    date.fromisoformat(day))
    engine = Engine(env, spark=spark, principal="publisher_bob", refresh="deferred")
    (sync / f"ready.{day}").touch()
    wait_for(lambda: (sync / "go").exists(), "go")
    result = engine.publish(spec)
    (sync / f"published.{day}").touch()
    wait_for(lambda: len(list(sync.glob("published.*"))) >= n, "all published")
    engine.finish()
    print(json.dumps({"day": day, "release_id": result.release_id, "status": result.status}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), *sys.argv[5:6]))
