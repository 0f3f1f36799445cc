"""Official releases are built from the env's ledger, OpenDP noise, the real clock and the
platform's principal; anything else is test-only (issue 13, item 14).

CI runs with DP_SPARK_TEST_MODE=1 (.ci/test.sh), so these tests remove it themselves
(monkeypatch.delenv, and one subprocess with a clean environment) to prove the refusal a
production job gets.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from dp_spark.config import env_from_dict
from dp_spark.errors import TestModeError
from dp_spark.governance.trust import require_trusted_components
from dp_spark.mechanisms.samplers import OpenDPNoiseSource, RecordingNoiseSource, default_source

ROOT = Path(__file__).resolve().parents[2]


def _env(tmp_path, name="prod"):
    return env_from_dict({"name": name, "warehouse": str(tmp_path / "wh"), "datasets": {},
                          "policies": str(ROOT / "conf/policies/budgets.yaml")}, root=tmp_path)


class FakeLedger:
    pass


def clock():
    return datetime(2026, 1, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize("kw, named", [
    ({"ledger": FakeLedger()}, "ledger="),
    ({"source": RecordingNoiseSource(default_source())}, "source=RecordingNoiseSource"),
    ({"clock": clock}, "clock="),
    ({"principal": "publisher_bob"}, "principal= on env 'prod'"),
])
def test_official_refuses_caller_parts_outside_test_mode(monkeypatch, kw, named):
    monkeypatch.delenv("DP_SPARK_TEST_MODE", raising=False)
    with pytest.raises(TestModeError) as ei:
        require_trusted_components("official", "prod", **kw)
    assert named in str(ei.value) and "mode='exploration'" in str(ei.value)
    # exploration accepts them; so does the test-only escape
    require_trusted_components("exploration", "prod", **kw)
    monkeypatch.setenv("DP_SPARK_TEST_MODE", "1")
    require_trusted_components("official", "prod", **kw)


def test_official_accepts_the_vetted_parts(monkeypatch):
    monkeypatch.delenv("DP_SPARK_TEST_MODE", raising=False)
    require_trusted_components("official", "prod")
    require_trusted_components("official", "prod", source=default_source())
    require_trusted_components("official", "prod", source=OpenDPNoiseSource())
    require_trusted_components("official", "local", principal="someone")  # local: may declare itself

    class Sub(OpenDPNoiseSource):
        pass

    with pytest.raises(TestModeError):  # a subclass can override the draws
        require_trusted_components("official", "prod", source=Sub())


def test_engine_refuses_before_spark_or_ledger(monkeypatch, tmp_path):
    from dp_spark.engine import Engine

    monkeypatch.delenv("DP_SPARK_TEST_MODE", raising=False)
    env = _env(tmp_path)
    with pytest.raises(TestModeError, match="ledger=.*clock="):
        Engine(env, ledger=FakeLedger(), clock=clock)  # spark=None: refused before a session starts
    assert not (tmp_path / "wh").exists()  # no ledger file, no warehouse


def test_engine_refusal_in_a_clean_process(tmp_path):
    """Exactly what a production job sees: no DP_SPARK_TEST_MODE at all."""
    code = (
        "import sys\n"
        "from dp_spark.config import env_from_dict\n"
        "from dp_spark.engine import Engine\n"
        "from dp_spark.errors import TestModeError\n"
        f"env = env_from_dict({{'name': 'prod', 'warehouse': {str(tmp_path / 'wh')!r}, 'datasets': {{}}, "
        f"'policies': {str(ROOT / 'conf/policies/budgets.yaml')!r}}})\n"
        "try:\n"
        "    from dp_spark.mechanisms.samplers import SeededNoiseSource\n"
        "    SeededNoiseSource(1)\n"
        "    sys.exit('seeded source built outside test mode')\n"
        "except TestModeError:\n"
        "    pass\n"
        "class Fake: pass\n"
        "try:\n"
        "    Engine(env, ledger=Fake())\n"
        "except TestModeError as e:\n"
        "    print('REFUSED', e)\n"
        "    sys.exit(0)\n"
        "sys.exit('not refused')\n"
    )
    environ = {k: v for k, v in os.environ.items() if k != "DP_SPARK_TEST_MODE"}
    r = subprocess.run([sys.executable, "-c", code], env=environ, cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr + r.stdout
    assert "REFUSED" in r.stdout and "ledger=" in r.stdout


def test_engine_principal_is_the_platform_user_outside_local(monkeypatch, tmp_path):
    """A cluster env: the Spark user is the principal, $DP_SPARK_PRINCIPAL is ignored."""
    from types import SimpleNamespace

    from dp_spark.engine import Engine

    class FakeSpark:
        sparkContext = SimpleNamespace(sparkUser=lambda: "svc_publisher")

    monkeypatch.delenv("DP_SPARK_TEST_MODE", raising=False)
    monkeypatch.setenv("DP_SPARK_PRINCIPAL", "admin_carol")
    assert Engine(_env(tmp_path, "prod"), spark=FakeSpark()).principal == "svc_publisher"
    assert Engine(_env(tmp_path, "local"), spark=FakeSpark()).principal == "admin_carol"
