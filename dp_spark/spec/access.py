"""The access policy file (``conf/policies/access.yaml``): a frozen pydantic model, every
problem of the file at once by field path. :func:`dp_spark.governance.access.access_policy_from_dict`
builds the policy the engine enforces from it (``releases_dir`` resolved against the project root).
Nothing here imports pyspark.
"""

from __future__ import annotations

import re
from typing import Any, Literal, Mapping, Optional

from pydantic import Field, PlainValidator, ValidationError, WithJsonSchema, field_validator, model_validator
from typing_extensions import Annotated

from dp_spark.errors import ConfigError
from dp_spark.spec.errors import model_errors, raise_errors
from dp_spark.core.fields import FreeText, SpecModel, fail, fail_at

__all__ = ["ROLES", "AccessPolicyModel", "GrantModel", "LocalDefaultModel", "access_policy_model"]

#: the roles (their permissions are fixed in code: dp_spark.governance.access)
ROLES = ("analyst", "publisher", "admin")
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
# principals may be e-mail addresses (Databricks) or service principals
PRINCIPAL_PATTERN = r"^[A-Za-z0-9_.@+\-\\/:]{1,256}$"
_ID_RE, _PRINCIPAL_RE, _VERSION_RE = re.compile(ID_PATTERN), re.compile(PRINCIPAL_PATTERN), re.compile(r"[0-9a-f]{16}")


def _id_list(v: Any) -> list[str]:
    if not isinstance(v, list) or not all(isinstance(x, str) and _ID_RE.match(x) for x in v):
        raise fail("must be a list of identifiers")
    return v


IdList = Annotated[list[str], PlainValidator(_id_list),
                   WithJsonSchema({"type": "array", "items": {"type": "string", "pattern": ID_PATTERN}})]
Role = Literal["analyst", "publisher", "admin"]


class _GrantBase(SpecModel):
    roles: Annotated[list[Role], Field(min_length=1)] = Field(description="its roles (at least one)")
    exploration_budgets: Optional[IdList] = Field(
        None, description="analyst: the budgets it may spend in exploration mode")

    @field_validator("roles", mode="before")
    @classmethod
    def _listed(cls, v: Any) -> Any:
        if isinstance(v, list) and not v:
            raise fail("must list at least one role")
        return v

    @model_validator(mode="after")
    def _analyst_budgets(self) -> "_GrantBase":
        if self.exploration_budgets and "analyst" not in self.roles:
            raise fail_at([(("exploration_budgets",), "only an analyst has exploration budgets")])
        return self


class GrantModel(_GrantBase):
    """``principals.<name>``: the roles of one principal."""

    description: Optional[FreeText] = Field(None, description="free text")


class LocalDefaultModel(_GrantBase):
    """``local_default``: the grant of whoever runs in the listed (local) envs."""

    envs: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] = Field(
        description="the env names it applies to")

    @field_validator("envs", mode="before")
    @classmethod
    def _names(cls, v: Any) -> Any:
        if not isinstance(v, list) or not v or not all(isinstance(e, str) and e for e in v):
            raise fail("must list the env names it applies to")
        return v


class AccessPolicyModel(SpecModel):
    """An access policy file."""

    version: Literal[1] = Field(1, description="the file format (1)")
    releases_dir: Annotated[str, Field(min_length=1)] = Field(
        "conf/releases", description="where pre-registered specs live (relative to the project root)")
    pinned_versions: Optional[dict[str, str]] = Field(
        None, description="spec name -> the one reviewed version (16 hex digits) that may be published")
    principals: Optional[dict[str, GrantModel]] = Field(None, description="principal -> its grant (default deny)")
    local_default: Optional[LocalDefaultModel] = Field(None, description="the grant in local envs")

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, v: Any) -> Any:
        if v != 1:
            raise fail("only version 1 is supported")
        return v

    @field_validator("principals", mode="before")
    @classmethod
    def _principal_names(cls, v: Any) -> Any:
        if v is not None and not isinstance(v, Mapping):
            raise fail("must be a mapping of principal -> {roles, ...}")
        if v and not all(isinstance(n, str) and _PRINCIPAL_RE.match(n) for n in v):
            raise fail("a principal name must be 1-256 characters of letters, digits and _.@+-\\/:")
        return v

    @field_validator("pinned_versions", mode="before")
    @classmethod
    def _pins(cls, v: Any) -> Any:
        if v and (not isinstance(v, Mapping) or not all(
                isinstance(k, str) and isinstance(x, str) and _VERSION_RE.fullmatch(x) for k, x in v.items())):
            raise fail("must map spec names to 16-hex-digit versions")
        return v


def access_policy_model(data: Any, source: str = "<dict>") -> AccessPolicyModel:
    """Validate an access policy mapping: one ConfigError naming every problem by field path."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: top level must be a mapping")
    try:
        return AccessPolicyModel.model_validate(data)
    except ValidationError as exc:
        raise_errors(source, model_errors(exc, model=AccessPolicyModel))
        raise  # unreachable: raise_errors raises
