"""Run test functions of this directory on a Spark Connect session, in one client process
(tests/jobs/test_at_most_once_connect.py): the same test bodies as on the local session, with
``spark`` a Connect session.

    python connect_runner.py URL OUT_JSON MODULE::FUNCTION=DIR [MODULE::FUNCTION=DIR ...]

Each FUNCTION of ``tests.jobs.MODULE`` is called with the fixtures it names: ``spark`` (the
Connect session of URL), ``warehouse`` (``DIR/conf/envs/test.yaml``, an env made by the
caller), ``tmp_path`` (``DIR/tmp``) and ``monkeypatch`` (undone after the call). A separate
process because pyspark switches a whole process to Connect once a remote session exists (the
pytest process holds a local one). Writes {"MODULE::FUNCTION": {"ok", "seconds", "error"}}
to OUT_JSON; exits 0 when the file is written, whatever the outcomes.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main(url: str, out: str, cases: list[str]) -> int:
    import pytest

    from dp_spark.spark import get_or_create_session, is_connect_session

    spark = get_or_create_session("dp_spark-connect-tests", remote=url)
    assert is_connect_session(spark), type(spark)
    outcomes = {}
    for case in cases:
        name, _, base = case.partition("=")
        module, _, func = name.partition("::")
        fn = getattr(importlib.import_module(f"tests.jobs.{module}"), func)
        mp = pytest.MonkeyPatch()
        tmp = Path(base) / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        given = {"spark": spark, "warehouse": Path(base) / "conf" / "envs" / "test.yaml",
                 "tmp_path": tmp, "monkeypatch": mp}
        t0 = time.monotonic()
        try:
            fn(**{p: given[p] for p in inspect.signature(fn).parameters})
            outcomes[name] = {"ok": True, "error": None}
        except BaseException:  # noqa: BLE001 - reported to the test
            outcomes[name] = {"ok": False, "error": traceback.format_exc()[-6000:]}
        finally:
            mp.undo()
        outcomes[name]["seconds"] = round(time.monotonic() - t0, 1)
    Path(out).write_text(json.dumps(outcomes))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
