"""A stream refresh killed mid-way (tests/deploy/test_stream.py): ``dp-spark refresh`` in this
process (its own local Spark session and JVM), stopped right after the FIRST noisy component's
tree nodes are stored in the ledger (the charge reserved, the other components' nodes not
drawn yet, no point written). There it creates ``SYNC_DIR/at.nodes`` and waits for ever: the
test kills its whole process group with SIGKILL.

    python stream_kill_driver.py SYNC_DIR --env ENV_FILE --conf SPEC --date D
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv: list[str]) -> int:
    sync, args = Path(argv[0]), argv[1:]
    from dp_spark.ledger.streams import StreamNodes

    real = StreamNodes.record_stream_nodes

    def record_then_stop(self, *a, **kw):
        real(self, *a, **kw)  # stored and committed in the ledger
        (sync / "at.nodes").touch()
        while True:  # killed here
            time.sleep(1)

    StreamNodes.record_stream_nodes = record_then_stop  # type: ignore[method-assign]
    from dp_spark.cli import refresh_main

    return refresh_main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
