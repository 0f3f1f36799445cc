"""Secrets named by an env file, read from a Databricks secret scope.

An env file may name where the ledger's secrets live instead of holding them::

    ledger_key_secret: {scope: dp_spark, key: ledger_hmac_key}        # the ledger's HMAC key
    ledger_password_secret: {scope: dp_spark, key: ledger_db_password} # PostgreSQL password

On Databricks (``$DATABRICKS_RUNTIME_VERSION`` is set) :func:`export_secrets` reads each one
with ``dbutils.secrets.get(scope, key)`` and puts it in this process's environment, where the
ledger already looks: ``$DP_SPARK_LEDGER_KEY`` (the HMAC key) and ``$PGPASSWORD`` (libpq's
password). A variable that is already set (e.g. by the job cluster's ``spark_env_vars``
``{{secrets/scope/key}}`` reference) is left alone. Off Databricks nothing is read: the key
comes from ``$DP_SPARK_LEDGER_KEY`` / ``$DP_SPARK_LEDGER_KEY_FILE`` as everywhere else. A
secret's value is never logged or put in an error message.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping, Optional

from pydantic import ValidationError

from dp_spark.errors import ConfigError
from dp_spark.spec.env import SecretRefModel

__all__ = ["SecretRef", "parse_secret_ref", "export_secrets", "on_databricks"]

#: (scope, key) of a Databricks secret.
SecretRef = tuple[str, str]

#: env-file field -> the environment variable its secret is exported to.
SECRET_FIELDS: Mapping[str, str] = {
    "ledger_key_secret": "DP_SPARK_LEDGER_KEY",
    "ledger_password_secret": "PGPASSWORD",
}


def parse_secret_ref(raw: Any, source: str, field: str) -> Optional[SecretRef]:
    """``{scope: S, key: K}`` -> ``(S, K)``; ``None`` stays ``None`` (the env model's check:
    :class:`dp_spark.spec.env.SecretRefModel`)."""
    if raw is None:
        return None
    try:
        ref = SecretRefModel.model_validate(raw)
    except ValidationError:
        raise ConfigError(f"{source}: '{field}' must be a mapping with exactly 'scope' and 'key', "
                          "non-empty strings") from None
    return ref.scope, ref.key


def on_databricks() -> bool:
    return bool(os.environ.get("DATABRICKS_RUNTIME_VERSION"))


def _databricks_get_secret(scope: str, key: str) -> str:
    try:  # the Databricks SDK's runtime shim (Databricks Runtime 13+, serverless)
        from databricks.sdk.runtime import dbutils  # type: ignore[import-not-found]
    except Exception:  # noqa: BLE001 - fall back to the classic cluster's DBUtils
        from pyspark.dbutils import DBUtils  # type: ignore[import-not-found]
        from pyspark.sql import SparkSession

        dbutils = DBUtils(SparkSession.getActiveSession() or SparkSession.builder.getOrCreate())
    return dbutils.secrets.get(scope=scope, key=key)


def export_secrets(refs: Mapping[str, Optional[SecretRef]], source: str, *,
                   get_secret: Optional[Callable[[str, str], str]] = None,
                   environ: Optional[dict] = None) -> list[str]:
    """Export each named secret to its variable (on Databricks only, unset variables only).

    Returns the variables set. ``get_secret`` and ``environ`` are for tests."""
    environ = os.environ if environ is None else environ
    if get_secret is None:
        if not on_databricks():
            return []
        get_secret = _databricks_get_secret
    exported = []
    for field, ref in refs.items():
        if ref is None:
            continue
        var = SECRET_FIELDS[field]
        if environ.get(var):
            continue
        scope, key = ref
        try:
            value = get_secret(scope, key)
        except Exception as e:  # noqa: BLE001 - the message names the secret, never a value
            raise ConfigError(f"{source}: cannot read Databricks secret {scope}/{key} "
                              f"('{field}'): {type(e).__name__}") from None
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{source}: Databricks secret {scope}/{key} ('{field}') is empty")
        environ[var] = value
        exported.append(var)
    return exported
