"""The environment file (``conf/envs/*.yaml``): a frozen pydantic model, every field checked at once.

Where the data, the warehouse, the ledger and the policies are. The model holds the file as
written; :func:`dp_spark.config.env_from_dict` resolves its paths against the project root
(``{warehouse}`` placeholders, relative paths) and exports its Databricks secret references.
Nothing here imports pyspark (the secrets reader, :mod:`dp_spark.secrets`, is the loader's).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from pydantic import Field, PlainValidator, ValidationError, WithJsonSchema, field_validator
from typing_extensions import Annotated

from dp_spark.errors import ConfigError
from dp_spark.spec.errors import model_errors, raise_errors
from dp_spark.core.fields import FreeText, PositiveInt, SpecModel, fail

__all__ = ["DatasetModel", "EnvModel", "SecretRefModel", "SparkModel", "env_model"]


def _path_text(v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise fail("must be a path")
    return v


def _location(v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise fail("must be a Delta path or table name")
    return v


PathText = Annotated[str, PlainValidator(_path_text), WithJsonSchema({"type": "string", "minLength": 1})]
Location = Annotated[str, PlainValidator(_location), WithJsonSchema({"type": "string", "minLength": 1})]
NonEmpty = Annotated[str, Field(min_length=1)]


class SecretRefModel(SpecModel):
    """A Databricks secret: ``{scope: S, key: K}`` (read on Databricks only; never logged)."""

    scope: NonEmpty = Field(description="the secret scope")
    key: NonEmpty = Field(description="the secret's key in the scope")


class DatasetModel(SpecModel):
    """A dataset with properties (a bare location stands for ``{location: L}``)."""

    location: Location = Field(description="Delta path (contains /) or catalog table name")
    public: bool = Field(
        False, description="the dataset holds no personal data (a product catalogue, a store list): a release may "
                           "read its group-by keys from it (public_keys.table); declared here, by whoever owns the "
                           "env's datasets, because it is a property of the data (access.yaml says who may "
                           "publish, not what is public)")


class SparkModel(SpecModel):
    """``spark``: the session the jobs build."""

    master: Optional[str] = Field(None, description="the Spark master (local runs)")
    conf: Optional[dict[str, Any]] = Field(None, description="Spark configuration, each value as text")


class EnvModel(SpecModel):
    """An environment file."""

    name: FreeText = Field(description="label")
    spark: Optional[SparkModel] = Field(None, description="used only when no SparkSession exists yet")
    warehouse: FreeText = Field(description="root folder; {warehouse} in other fields expands to it")
    datasets: dict[str, DatasetModel] = Field(
        description="logical dataset -> its Delta path (contains /) or catalog table name, or {location, public}")
    output_root: PathText = Field("{warehouse}/releases", description="where official release tables go")
    exploration_root: PathText = Field("{warehouse}/exploration", description="where exploration release tables go")
    series_schema: Optional[str] = Field(
        None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$",
        description="catalog schema (schema or catalog.schema) where dp-spark refresh registers each series' "
                    "<family>_current as a view over its Delta path; unset: the Delta path "
                    "<output_root>/<family>_current only (docs/series.md)")
    ledger_url: Optional[FreeText] = Field(None, description="sqlite:PATH (embedded; default sqlite:{warehouse}/ledger.db) or postgresql://... (shared)")
    policies: PathText = Field("conf/policies/budgets.yaml", description="budget policy file")
    ledger_mirror: PathText = Field("{warehouse}/ledger_mirror", description="Delta mirror of the ledger, for analysts")
    audit_mirror: PathText = Field("{warehouse}/audit_mirror", description="Delta mirror of the audit log, for analysts")
    salt_file: PathText = Field("{warehouse}/.bounding_salt", description="salt of the bottom-K priority, created with mode 0600; kept out of Spark plans, confidential for the sample's uniformity only (the DP guarantee does not depend on it: docs/privacy-semantics.md section 3)")
    lease_seconds: PositiveInt = Field(300, description="how long one run owns a reservation before another may take it over")
    demo: Optional[dict[str, Any]] = Field(None, description="parameters of the demo data generator")
    executor_noise_cells: PositiveInt = Field(
        250_000, description="a release of public keys with at least this many cells (key tuples x statistics) is "
                             "noised on the executors and written straight to Delta; below it the partials are "
                             "streamed to the driver and noised there (docs/performance.md)")
    ledger_key_secret: Optional[SecretRefModel] = Field(
        None, description="{scope, key} of the Databricks secret holding the ledger's HMAC key, exported to "
                          "$DP_SPARK_LEDGER_KEY on Databricks unless set (docs/deploy.md)")
    ledger_password_secret: Optional[SecretRefModel] = Field(
        None, description="{scope, key} of the Databricks secret holding the PostgreSQL password, exported to "
                          "$PGPASSWORD on Databricks unless set")

    @field_validator("datasets", mode="before")
    @classmethod
    def _bare_locations(cls, v: Any) -> Any:
        """A bare location stands for ``{location: L}`` (not public)."""
        return {k: {"location": d} if isinstance(d, str) else d for k, d in v.items()} if isinstance(v, Mapping) else v

    def locations(self) -> dict[str, str]:
        """Each dataset's location, as written."""
        return {k: v.location for k, v in self.datasets.items()}

    def public_datasets(self) -> frozenset[str]:
        """The datasets declared ``public: true``."""
        return frozenset(k for k, v in self.datasets.items() if v.public)

    def secret_refs(self) -> dict[str, Optional[tuple[str, str]]]:
        return {f: None if getattr(self, f) is None else (getattr(self, f).scope, getattr(self, f).key)
                for f in ("ledger_key_secret", "ledger_password_secret")}


def env_model(data: Mapping[str, Any], source: str = "<dict>") -> EnvModel:
    """Validate an env mapping: one :class:`ConfigError` naming every problem by field path."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: top level must be a mapping")
    raw = {k: v for k, v in data.items() if not (k in ("spark", "demo") and v is None)}
    try:
        return EnvModel.model_validate(raw)
    except ValidationError as exc:
        raise_errors(source, model_errors(exc, model=EnvModel))
        raise  # unreachable: raise_errors raises
