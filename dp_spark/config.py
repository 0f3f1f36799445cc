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

from dp_spark.errors import ConfigError
# the release spec's names, where callers have always imported them from
from dp_spark.spec.release import release_spec_from_dict
from dp_spark.spec.runtime import (PrivateKeys, PublicKeys, ReleaseSpec, ValueSpec,  # noqa: F401
                                   bounds_to_json)

__all__ = ["load_yaml", "load_release_spec", "release_spec_from_dict", "ReleaseSpec", "PublicKeys",
           "PrivateKeys", "ValueSpec", "bounds_to_json", "EnvConfig", "env_from_dict", "load_env"]


def _err(source: str, field_name: str, problem: str) -> ConfigError:
    return ConfigError(f"{source}: field '{field_name}': {problem}")


def _require(d: Mapping[str, Any], key: str, source: str, prefix: str = "") -> Any:
    if key not in d or d[key] is None:
        raise _err(source, prefix + key, "is required")
    return d[key]


def _check_keys(d: Mapping[str, Any], allowed: set[str], source: str, prefix: str = "") -> None:
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise _err(source, prefix + unknown[0], f"unknown field (allowed: {sorted(allowed)})")


def _mapping(value: Any, source: str, name: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _err(source, name, "must be a mapping")
    return value


def _int(value: Any, source: str, name: str, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _err(source, name, "must be an integer")
    if value < minimum:
        raise _err(source, name, f"must be >= {minimum}")
    return value


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

    def dataset_location(self, dataset: str) -> str:
        if dataset not in self.datasets:
            raise ConfigError(f"{self.source}: dataset '{dataset}' is not declared under 'datasets'")
        return self.datasets[dataset]


def _resolve(root: Path, p: str) -> str:
    if "://" in p or p.startswith("/"):
        return p
    return str((root / p).resolve())


def env_from_dict(data: Mapping[str, Any], source: str = "<dict>", root: Optional[Path] = None) -> EnvConfig:
    allowed = {"name", "spark", "warehouse", "datasets", "output_root", "exploration_root", "ledger_url",
               "policies", "ledger_mirror", "audit_mirror", "salt_file", "lease_seconds", "demo",
               "ledger_key_secret", "ledger_password_secret"}
    _check_keys(data, allowed, source)
    root = root or Path.cwd()
    name = str(_require(data, "name", source))
    spark = _mapping(data.get("spark") or {}, source, "spark")
    _check_keys(spark, {"master", "conf"}, source, "spark.")
    spark_conf = {str(k): str(v) for k, v in _mapping(spark.get("conf") or {}, source, "spark.conf").items()}
    warehouse = Path(_resolve(root, str(_require(data, "warehouse", source))))

    def wpath(key: str, default: str) -> str:
        raw = data.get(key, default)
        if not isinstance(raw, str) or not raw:
            raise _err(source, key, "must be a path")
        return _resolve(root, raw.replace("{warehouse}", str(warehouse)))

    datasets_raw = _mapping(_require(data, "datasets", source), source, "datasets")
    datasets = {}
    for k, v in datasets_raw.items():
        if not isinstance(v, str) or not v:
            raise _err(source, f"datasets.{k}", "must be a Delta path or table name")
        datasets[str(k)] = _resolve(root, v.replace("{warehouse}", str(warehouse))) if "/" in v else v
    ledger_url = str(data.get("ledger_url", f"sqlite:{warehouse}/ledger.db")).replace("{warehouse}", str(warehouse))
    if ledger_url.startswith("sqlite:") and not ledger_url.startswith("sqlite:///"):
        ledger_url = "sqlite:" + _resolve(root, ledger_url[len("sqlite:"):])
    return EnvConfig(
        name=name,
        master=spark.get("master"),
        spark_conf=spark_conf,
        warehouse=warehouse,
        datasets=datasets,
        output_root=wpath("output_root", "{warehouse}/releases"),
        exploration_root=wpath("exploration_root", "{warehouse}/exploration"),
        ledger_url=ledger_url,
        policies=Path(wpath("policies", "conf/policies/budgets.yaml")),
        ledger_mirror=wpath("ledger_mirror", "{warehouse}/ledger_mirror"),
        audit_mirror=wpath("audit_mirror", "{warehouse}/audit_mirror"),
        salt_file=Path(wpath("salt_file", "{warehouse}/.bounding_salt")),
        lease_seconds=_int(data.get("lease_seconds", 300), source, "lease_seconds"),
        demo=_mapping(data.get("demo") or {}, source, "demo"),
        source=source,
        **_secret_refs(data, source),
    )


def _secret_refs(data: Mapping[str, Any], source: str) -> dict:
    """The env's Databricks secret references; on Databricks they are exported to the
    variables the ledger reads ($DP_SPARK_LEDGER_KEY, $PGPASSWORD), elsewhere nothing is read."""
    from dp_spark.secrets import SECRET_FIELDS, export_secrets, parse_secret_ref

    refs = {f: parse_secret_ref(data.get(f), source, f) for f in SECRET_FIELDS}
    export_secrets(refs, source)
    return refs


def load_env(path: str | os.PathLike) -> EnvConfig:
    p = Path(path).resolve()
    # conf/envs/x.yaml -> project root two levels up; otherwise the file's folder.
    root = p.parent.parent.parent if p.parent.parent.name == "conf" else p.parent
    return env_from_dict(load_yaml(p), source=str(path), root=root)
