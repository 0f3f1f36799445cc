"""What an official release may be built from: the env's ledger, the vetted noise source,
the real clock and the platform's principal (issue 13, item 14).

An :class:`~dp_spark.engine.Engine` in ``official`` mode refuses a caller-supplied

* ``ledger`` object: official charges go to the ledger opened from ``env.ledger_url``;
* ``source``: only the production :class:`~dp_spark.mechanisms.samplers.OpenDPNoiseSource`
  (``default_source()``) draws official noise (a seeded, recording or home-made source is
  refused, even one that subclasses it);
* ``clock``: the ledger's windows and leases run on the real UTC clock;
* ``principal`` outside the ``local`` env: the principal comes from the platform (Databricks
  user, Spark user), see :func:`~dp_spark.governance.access.resolve_principal_with_source`.

Tests substitute them in two ways: ``mode="exploration"`` (never published, never versioned),
or the test-only escape ``DP_SPARK_TEST_MODE=1`` (the switch that also guards
:class:`~dp_spark.mechanisms.samplers.SeededNoiseSource`; CI sets it in ``.ci/test.sh``; a
production job never does). Nothing here imports pyspark.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional

from dp_spark.errors import TestModeError

__all__ = ["test_mode", "require_trusted_components", "require_test_mode"]

TEST_MODE_ENV = "DP_SPARK_TEST_MODE"
LOCAL_ENV_NAME = "local"


def test_mode(environ: Mapping[str, str] = os.environ) -> bool:
    """True when the test-only switch ``DP_SPARK_TEST_MODE=1`` is set."""
    return environ.get(TEST_MODE_ENV) == "1"


test_mode.__test__ = False  # type: ignore[attr-defined]  # not a pytest test


def require_test_mode(what: str, instead: str, environ: Mapping[str, str] = os.environ) -> None:
    """Raise :class:`TestModeError` naming ``what`` unless ``DP_SPARK_TEST_MODE=1``."""
    if not test_mode(environ):
        raise TestModeError(f"{what} is refused outside test mode ({TEST_MODE_ENV}=1 is for tests only); {instead}")


def require_trusted_components(mode: str, env_name: Optional[str], *, ledger: Any = None, source: Any = None,
                               clock: Any = None, principal: Optional[str] = None,
                               environ: Mapping[str, str] = os.environ) -> None:
    """Refuse (``TestModeError``) an official engine built from caller-supplied parts.

    Exploration mode and ``DP_SPARK_TEST_MODE=1`` accept them. The message names every
    offending argument and both ways out."""
    if mode != "official" or test_mode(environ):
        return
    from dp_spark.mechanisms.samplers import OpenDPNoiseSource

    bad = []
    if ledger is not None:
        bad.append("ledger= (official charges go to the ledger opened from the env's ledger_url)")
    if source is not None and type(source) is not OpenDPNoiseSource:
        bad.append(f"source={type(source).__name__} (official noise comes from OpenDPNoiseSource, "
                   "dp_spark.mechanisms.samplers.default_source())")
    if clock is not None:
        bad.append("clock= (official releases run on the real UTC clock)")
    if principal is not None and env_name != LOCAL_ENV_NAME:
        bad.append(f"principal= on env {env_name!r} (the principal comes from the platform: the Databricks "
                   "or Spark user)")
    if bad:
        raise TestModeError(
            "an official release may not use a caller-supplied " + "; ".join(bad)
            + f". Use mode='exploration', or set {TEST_MODE_ENV}=1 in a test environment only"
        )
