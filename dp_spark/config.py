"""YAML files -> validated, frozen specs. Every check here runs before Spark starts.

Two kinds of file:

* a release spec (``conf/releases/*.yaml``): one pre-registered query. Its models and rules
  are :mod:`dp_spark.spec.release` (the engine reads the :class:`ReleaseSpec` they build);
  this module reads the YAML;
* an environment (``conf/envs/*.yaml``): where the data, the warehouse, the ledger and the
  policies are; see :class:`EnvConfig`. Relative paths resolve against the project root.

Errors are :class:`~dp_spark.errors.ConfigError` subclasses naming the file and the field;
they never contain data values (there are none yet: no data has been read).
Nothing here imports pyspark.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, Mapping, Optional

import yaml

from dp_spark.env_file import DEFAULT_ENV, ENV_VAR, resolve_env
from dp_spark.errors import ConfigError
from dp_spark.spec.env import env_model
# the release spec's names, where callers have always imported them from
from dp_spark.spec.release import release_spec_from_dict
from dp_spark.spec.runtime import (PrivateKeys, PublicKeys, ReleaseSpec, ValueSpec,  # noqa: F401
                                   bounds_to_json)

__all__ = ["load_yaml", "load_release_spec", "release_spec_from_dict", "ReleaseSpec", "PublicKeys",
           "PrivateKeys", "ValueSpec", "bounds_to_json", "EnvConfig", "env_from_dict", "load_env", "resolve_env",
           "ENV_VAR", "DEFAULT_ENV"]


def load_yaml(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: file not found")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:  # the message names line and column, not data values
        raise ConfigError(f"{p}: invalid YAML ({exc.__class__.__name__})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: top level must be a mapping")
    return data


def load_release_spec(path: str | os.PathLike, *, run_date: Optional[date] = None) -> ReleaseSpec:
    """Read and validate a release spec file (:func:`dp_spark.spec.release.release_spec_from_dict`)."""
    return release_spec_from_dict(load_yaml(path), source=str(path), run_date=run_date)


# --------------------------------------------------------------------------------------
# Environments
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EnvConfig:
    """Where things live. Relative paths resolve against the env file's project root."""

    name: str
    master: Optional[str]
    spark_conf: Mapping[str, str]
    warehouse: Path
    datasets: Mapping[str, str]  # logical dataset -> Delta path or table name
    output_root: str
    exploration_root: str
    ledger_url: str
    policies: Path
    ledger_mirror: str
    audit_mirror: str
    salt_file: Path
    lease_seconds: int
    demo: Mapping[str, Any]
    source: str = field(default="<dict>", compare=False)
    # Databricks secret scope references (scope, key): dp_spark.secrets
    ledger_key_secret: Optional[tuple[str, str]] = None
    ledger_password_secret: Optional[tuple[str, str]] = None
    #: the datasets declared ``public: true`` (no personal data): key tables may be read from them
    public_datasets: frozenset[str] = frozenset()
    #: releases of public keys with at least this many cells are noised on the executors
    executor_noise_cells: int = 250_000
    #: the catalog schema where each series' ``<family>_current`` view is registered (None: a Delta path only)
    series_schema: Optional[str] = None

    def dataset_location(self, dataset: str) -> str:
        if dataset not in self.datasets:
            raise ConfigError(f"{self.source}: dataset '{dataset}' is not declared under 'datasets'")
        return self.datasets[dataset]


def _resolve(root: Path, p: str) -> str:
    if "://" in p or p.startswith("/"):
        return p
    return str((root / p).resolve())


def env_from_dict(data: Mapping[str, Any], source: str = "<dict>", root: Optional[Path] = None) -> EnvConfig:
    """Validate an env mapping (:class:`dp_spark.spec.env.EnvModel`: every problem at once) and
    resolve its paths against ``root`` (default: the working directory)."""
    m = env_model(data, source)
    root = root or Path.cwd()
    warehouse = Path(_resolve(root, m.warehouse))

    def wpath(raw: str) -> str:
        return _resolve(root, raw.replace("{warehouse}", str(warehouse)))

    datasets = {str(k): wpath(v) if "/" in v else v for k, v in m.locations().items()}
    ledger_url = (m.ledger_url or f"sqlite:{warehouse}/ledger.db").replace("{warehouse}", str(warehouse))
    if ledger_url.startswith("sqlite:") and not ledger_url.startswith("sqlite:///"):
        ledger_url = "sqlite:" + _resolve(root, ledger_url[len("sqlite:"):])
    refs = m.secret_refs()
    _export_secrets(refs, source)
    spark = m.spark
    return EnvConfig(
        name=m.name,
        master=None if spark is None else spark.master,
        spark_conf={} if spark is None or not spark.conf else {str(k): str(v) for k, v in spark.conf.items()},
        warehouse=warehouse,
        datasets=datasets,
        output_root=wpath(m.output_root),
        exploration_root=wpath(m.exploration_root),
        ledger_url=ledger_url,
        policies=Path(wpath(m.policies)),
        ledger_mirror=wpath(m.ledger_mirror),
        audit_mirror=wpath(m.audit_mirror),
        salt_file=Path(wpath(m.salt_file)),
        lease_seconds=m.lease_seconds,
        demo=m.demo or {},
        source=source,
        public_datasets=m.public_datasets(),
        executor_noise_cells=m.executor_noise_cells,
        series_schema=m.series_schema,
        **refs,
    )


def _export_secrets(refs: Mapping[str, Any], source: str) -> None:
    """On Databricks, the env's secret references are exported to the variables the ledger
    reads ($DP_SPARK_LEDGER_KEY, $PGPASSWORD); elsewhere nothing is read. The reader (and its
    pyspark fallback) is loaded only here, never by the spec layer."""
    from dp_spark.secrets import export_secrets

    export_secrets(refs, source)


def load_env(path: Optional[str | os.PathLike] = None) -> EnvConfig:
    """Read and validate an env file (default: :func:`resolve_env`, as the CLI does). Paths in
    it resolve against its project root: ``conf/envs/x.yaml`` -> two levels up; otherwise the
    file's folder."""
    path = resolve_env(path)
    p = Path(path).resolve()
    root = p.parent.parent.parent if p.parent.parent.name == "conf" else p.parent
    return env_from_dict(load_yaml(p), source=str(path), root=root)
