"""Which env file a command uses when none is named: ``$DP_SPARK_ENV``, else the project's
``conf/envs/local.yaml`` (the project the package runs from).

Pure and at the bottom of the stack: the CLI (:mod:`dp_spark.commands`) and the Python API
(:mod:`dp_spark.api`) resolve the env the same way. See docs/cli.md, "--env".
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Optional

from dp_spark.errors import ConfigError

__all__ = ["DEFAULT_ENV", "ENV_VAR", "PROJECT_ROOT", "resolve_env"]

ENV_VAR = "DP_SPARK_ENV"
#: the project the package runs from (a source checkout or an editable install)
PROJECT_ROOT = Path(__file__).resolve().parent.parent
#: the default env file: the project's own local env (used when --env and $DP_SPARK_ENV are absent)
DEFAULT_ENV = str(PROJECT_ROOT / "conf" / "envs" / "local.yaml")


#: the log level of the JVM's console log (log4j2's root logger) for a Spark session this
#: package starts; unset: Spark's default (WARN). The CLI sets it to ERROR unless --verbose.
JVM_LOG_LEVEL_ENV = "DP_SPARK_JVM_LOG_LEVEL"


def resolve_env(given: Optional[str | os.PathLike] = None, environ: Optional[Mapping[str, str]] = None) -> str:
    """The env file to use: ``--env`` when given, else ``$DP_SPARK_ENV``, else the project's
    ``conf/envs/local.yaml`` (:data:`DEFAULT_ENV`). Paths inside it resolve against its own
    project root (:func:`dp_spark.config.load_env`). Raises ConfigError when none exists."""
    environ = os.environ if environ is None else environ
    if given:
        return str(given)
    if environ.get(ENV_VAR):
        return str(environ[ENV_VAR])
    if Path(DEFAULT_ENV).is_file():
        return DEFAULT_ENV
    raise ConfigError(f"no env file: pass --env FILE or set ${ENV_VAR} (the default {DEFAULT_ENV} does not exist: "
                      "the package is not running from a project checkout)")
