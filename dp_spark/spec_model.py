"""Pydantic v2 models of a release spec: structural validation and the JSON Schema.

:func:`check_release_dict` runs FIRST in :func:`dp_spark.config.release_spec_from_dict` (so
also in :func:`~dp_spark.config.load_release_spec`). It checks every field's presence, type
and range in ONE pass and raises one :class:`~dp_spark.errors.ConfigError` listing ALL the
problems of the file, each with its field path (``statistics[2].upper``,
``group_by[0].public_keys``); a message never contains a value of the file (pydantic's
``input_value=`` is never rendered). The existing parser then runs unchanged: the cross-field
semantics (cells against ``max_cells``, a value column for ``sum``/``mean``, the ``where``
predicate, the delta a private key selection needs, ...) stay in ``dp_spark.config``. The
models therefore never refuse a spec that the parser accepts; they are the same check or
laxer.

Two forms, chosen by the presence of ``statistics`` (as the parser does):

* :class:`SingleMetricSpec`: ``metric``, one ``group_by`` mapping, ``value``, ``mean``
  (rewritten at parse time into the ``statistics`` form: ``dp_spark.config``);
* :class:`MultiStatisticSpec`: ``statistics``, ``group_by`` (one mapping or a list, each
  with ``public_keys`` or ``private_keys``).

Both take ``min_group_size`` and ``where``.

:func:`release_spec_json_schema` is the JSON Schema of both (``dp-spark schema``; shipped as
``conf/release-spec.schema.json``, referenced from every ``conf/releases/*.yaml`` by a
``yaml-language-server`` comment so editors complete and check specs). Every field path of
the models is documented in ``docs/config.md`` (checked by ``tests/unit/test_spec_model.py``).

Numbers are what :func:`dp_spark.budget.to_fraction` reads: an integer, a float or a string
such as ``"1e-8"`` or ``"1/3"`` (YAML 1.1 reads ``1e-8`` without a dot as a string).
"""

from __future__ import annotations

import json
import re
from datetime import date
from fractions import Fraction
from typing import Any, Callable, Literal, Mapping, Optional, Union

from pydantic import (BaseModel, ConfigDict, Field, PlainValidator, TypeAdapter, ValidationError,
                      WithJsonSchema, field_validator, model_validator)
from pydantic_core import InitErrorDetails, PydanticCustomError
from typing_extensions import Annotated

from dp_spark.errors import ConfigError, DpSparkError

__all__ = ["SingleMetricSpec", "MultiStatisticSpec", "check_release_dict", "release_spec_errors",
           "release_spec_json_schema", "field_paths", "SCHEMA_ID"]

SCHEMA_ID = "https://dp-spark.local/conf/release-spec.schema.json"
NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_]{0,63}$"
COLUMN_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
NUMBER_STRING_PATTERN = r"^\s*[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?(/\d+)?\s*$"
HARD_MAX_CELLS = 100_000  # dp_spark.config.HARD_MAX_CELLS (not imported: no cycle)
MAX_BINS = 1024
RELATIVE_DAYS = ("today", "yesterday")


def _fail(message: str) -> PydanticCustomError:
    # our own message: no input value, no pydantic URL
    return PydanticCustomError("dp_spark", message.replace("{", "(").replace("}", ")"))


def _fail_at(field: str, message: str) -> ValidationError:
    """From a model validator: the error of one of its fields (its path ends in ``field``)."""
    return ValidationError.from_exception_data("release spec", [InitErrorDetails(
        type=_fail(message), loc=(field,), input=None)])


# ----------------------------------------------------------------------------------------
# Field types: the parser's own checks (dp_spark.config), nothing stricter
# ----------------------------------------------------------------------------------------
def _pattern_type(pattern: str, problem: str, description: str):
    rx = re.compile(pattern)

    def check(v: Any) -> Any:
        if not isinstance(v, str) or not rx.match(v):
            raise _fail(problem)
        return v

    return Annotated[Any, PlainValidator(check),
                     WithJsonSchema({"type": "string", "pattern": pattern, "description": description})]


Identifier = _pattern_type(NAME_PATTERN, "must be an identifier of letters, digits and '_' (max 64)",
                           "an identifier: a letter, then letters, digits and '_' (at most 64)")
Column = _pattern_type(COLUMN_PATTERN, "must be a plain column name", "a plain column name")


def _int_type(minimum: int = 1, maximum: Optional[int] = None):
    def check(v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, int):
            raise _fail("must be an integer")
        if v < minimum:
            raise _fail(f"must be >= {minimum}")
        if maximum is not None and v > maximum:
            raise _fail(f"must be <= {maximum}")
        return v

    schema: dict[str, Any] = {"type": "integer", "minimum": minimum}
    if maximum is not None:
        schema["maximum"] = maximum
    return Annotated[Any, PlainValidator(check), WithJsonSchema(schema)]


PositiveInt = _int_type(1)


def _number_type(*, gt: Any = None, ge: Any = None, lt: Any = None, le: Any = None,
                 what: str = "", strings: bool = True):
    """A number as :func:`dp_spark.budget.to_fraction` reads it (``strings=False``: an int or a
    float only, as ``quantile``'s ``q``), within the given bounds."""
    from dp_spark.budget import to_fraction

    def check(v: Any) -> Any:
        if not strings and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise _fail("must be a number")
        try:
            f = to_fraction(v, "value")
        except DpSparkError:
            raise _fail("must be a finite number") from None
        if ((gt is not None and not f > Fraction(str(gt))) or (ge is not None and not f >= Fraction(str(ge)))
                or (lt is not None and not f < Fraction(str(lt))) or (le is not None and not f <= Fraction(str(le)))):
            raise _fail(f"must be {what}")
        return f

    num: dict[str, Any] = {"type": "number"}
    for key, bound in (("exclusiveMinimum", gt), ("minimum", ge), ("exclusiveMaximum", lt), ("maximum", le)):
        if bound is not None:
            num[key] = bound
    schema = num if not strings else {"anyOf": [num, {"type": "string", "pattern": NUMBER_STRING_PATTERN}]}
    return Annotated[Any, PlainValidator(check), WithJsonSchema(schema)]


Number = _number_type()
PositiveNumber = _number_type(gt=0, what="> 0")


def _date_check(*, fixed: bool) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:  # dp_spark.config._date_bound
        if isinstance(v, date):
            return v
        text = str(v).strip().lower()
        if text in RELATIVE_DAYS:
            if fixed and isinstance(v, str):
                raise _fail("must be a fixed ISO date")
            return v
        try:
            date.fromisoformat(text)
        except ValueError:
            raise _fail("must be an ISO date, 'today' or 'yesterday'" if not fixed
                        else "must be a fixed ISO date") from None
        return v

    return check


FixedDate = Annotated[Any, PlainValidator(_date_check(fixed=True)),
                      WithJsonSchema({"type": "string", "format": "date",
                                      "description": "an ISO date (YYYY-MM-DD)"})]
DateBound = Annotated[Any, PlainValidator(_date_check(fixed=False)),
                      WithJsonSchema({"anyOf": [{"type": "string", "format": "date"},
                                                {"enum": list(RELATIVE_DAYS)}],
                                      "description": "an ISO date, or today / yesterday: relative to the "
                                                     "job's date (--date), never to the data"})]


def _key_value(v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise _fail("entries must be strings or integers")
    return v


KeyValue = Annotated[Any, PlainValidator(_key_value), WithJsonSchema({"type": ["string", "integer"]})]
# description: the parser keeps str(value) of anything; the schema asks for text
FreeText = Annotated[Any, PlainValidator(lambda v: v), WithJsonSchema({"type": "string"})]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _exactly_one(obj: BaseModel, a: str, b: str, problem: str) -> None:
    if (getattr(obj, a) is None) == (getattr(obj, b) is None):
        raise _fail(problem)


# ----------------------------------------------------------------------------------------
# Blocks shared by both forms
# ----------------------------------------------------------------------------------------
class PrivacyUnitModel(_Model):
    """``privacy_unit``: the protected unit."""

    kind: Literal["user", "account", "device", "event"]
    column: Column


class BoundsModel(_Model):
    """``bounds``: the contribution bounds the engine enforces."""

    max_rows_per_unit: PositiveInt = Field(description="K: at most this many rows per unit")
    max_partitions_per_unit: PositiveInt = Field(1, description="L0: at most this many cells (key tuples) per unit")
    max_rows_per_partition: Optional[PositiveInt] = Field(None, description="Linf: rows per unit and cell (default K)")


class BudgetModel(_Model):
    """``budget``: the charge of one release against the named budget policy."""

    id: Identifier
    measure: Literal["pure_dp", "zcdp"]
    epsilon: PositiveNumber = Field(None, description="pure_dp: the charge; zcdp: the epsilon at 'delta' "
                                                      "that the charge converts to")
    rho: PositiveNumber = Field(None, description="zcdp: the charge in rho")
    delta: _number_type(ge=0, lt=1, what=">= 0 and < 1") = Field(  # type: ignore[valid-type]
        None, description="the delta the release spends (private_keys), or, with a zcdp epsilon, the delta "
                          "of its conversion")

    @model_validator(mode="after")
    def _charge(self) -> "BudgetModel":
        if self.measure == "pure_dp":
            if self.epsilon is None or self.rho is not None:
                raise _fail("a pure_dp charge takes 'epsilon' (and optionally 'delta'), not 'rho'")
        else:
            _exactly_one(self, "rho", "epsilon",
                         "a zcdp charge takes 'rho', or 'epsilon' with 'delta', exactly one of the two")
            if self.epsilon is not None and not self.delta:
                raise _fail_at("delta", "a zcdp charge given as epsilon needs the delta of its conversion "
                               "(0 < delta < 1)")
        return self


class OnExhaustedModel(_Model):
    """``on_exhausted``: what happens when the budget cannot pay."""

    policy: Literal["reject", "degrade", "return_existing"] = "reject"
    fallback: Optional[str] = Field(None, description="degrade: path of a coarser spec, relative to this one")

    @model_validator(mode="after")
    def _fallback(self) -> "OnExhaustedModel":
        if self.policy == "degrade" and not self.fallback:
            raise _fail_at("fallback", "'degrade' needs the path of a coarser spec")
        if self.policy != "degrade" and self.fallback is not None:
            raise _fail_at("fallback", "only 'degrade' takes a fallback")
        return self


class DateRangeModel(_Model):
    """``public_keys.dates``: every day from ``start`` to ``end`` (or ``through``), inclusive."""

    start: FixedDate
    end: DateBound = None
    through: DateBound = None

    @model_validator(mode="after")
    def _last(self) -> "DateRangeModel":
        _exactly_one(self, "end", "through", "give exactly one of 'end' or 'through' (the last day)")
        return self


class PublicKeysModel(_Model):
    """``public_keys``: the declared key set (never read from the data)."""

    values: Annotated[list[KeyValue], Field(min_length=1)] = None
    dates: DateRangeModel = None

    @model_validator(mode="after")
    def _one(self) -> "PublicKeysModel":
        _exactly_one(self, "values", "dates", "give exactly one of 'values' or 'dates'")
        if self.values is not None and len({str(v) for v in self.values}) != len(self.values):
            raise _fail("keys must be distinct")
        return self


class PrivateKeysModel(_Model):
    """``private_keys``: keys selected privately from the data (multi-statistic form)."""

    max_keys: PositiveInt = Field(description="at most this many keys of the column are published")
    share: Optional[_number_type(gt=0, lt=1, what="in (0, 1): the fraction of the release's charge "  # type: ignore
                                 "spent on selecting the keys")] = Field(
        None, description="fraction of the release's charge spent on selecting the keys (default 0.25)")


class SingleGroupByModel(_Model):
    """``group_by`` of the single-metric form: one column and its public keys."""

    column: Column
    public_keys: PublicKeysModel


class GroupByEntryModel(_Model):
    """One ``group_by`` entry of the multi-statistic form."""

    column: Column
    public_keys: PublicKeysModel = None
    private_keys: PrivateKeysModel = None

    @model_validator(mode="after")
    def _one(self) -> "GroupByEntryModel":
        _exactly_one(self, "public_keys", "private_keys",
                     "give exactly one of 'public_keys' (the keys, listed) or 'private_keys' (keys "
                     "selected from the data with differential privacy)")
        return self


class ValueModel(_Model):
    """``value``: the value column and its clamp bounds (sum, mean)."""

    column: Column
    lower: Number
    upper: Number


class MeanOptionsModel(_Model):
    """``mean``: public parameters of a mean release."""

    assumed_group_size: PositiveInt = 100
    min_count: PositiveInt = 1
    assumed_mean: Optional[Number] = None


class MinGroupSizeModel(_Model):
    """``min_group_size``: suppress or merge cells whose noisy count is small (or an integer:
    the threshold)."""

    threshold: PositiveInt
    strategy: Literal["suppress", "merge_other"] = "suppress"
    other_key: Annotated[str, Field(min_length=1)] = "__other__"


# ----------------------------------------------------------------------------------------
# Statistics (multi-statistic form), one model per kind
# ----------------------------------------------------------------------------------------
class _Statistic(_Model):
    name: Identifier
    weight: Optional[PositiveNumber] = Field(None, description="share of the release's charge (on every "
                                                               "statistic or on none)")


class _GroupSized(_Statistic):
    assumed_group_size: PositiveInt = 100


class CountStatistic(_GroupSized):
    kind: Literal["count"]


class DistinctUnitsStatistic(_GroupSized):
    kind: Literal["distinct_units"]


class _Valued(_GroupSized):
    column: Column
    lower: Number
    upper: Number


class SumStatistic(_Valued):
    kind: Literal["sum"]


class _Ratio(_Valued):
    min_count: PositiveInt = 1
    assumed_mean: Optional[Number] = None


class MeanStatistic(_Ratio):
    kind: Literal["mean"]


class VarianceStatistic(_Ratio):
    kind: Literal["variance"]


class StddevStatistic(_Ratio):
    kind: Literal["stddev"]


class QuantileStatistic(_Valued):
    kind: Literal["quantile"]
    q: _number_type(gt=0, lt=1, what="a number strictly between 0 and 1", strings=False)  # type: ignore
    bins: _int_type(2, MAX_BINS) = 64  # type: ignore[valid-type]


STATISTIC_MODELS = (CountStatistic, DistinctUnitsStatistic, SumStatistic, MeanStatistic, VarianceStatistic,
                    StddevStatistic, QuantileStatistic)
KINDS = tuple(m.model_fields["kind"].annotation.__args__[0] for m in STATISTIC_MODELS)
Statistic = Annotated[Union[STATISTIC_MODELS], Field(discriminator="kind")]  # type: ignore[valid-type]


# ----------------------------------------------------------------------------------------
# The two forms
# ----------------------------------------------------------------------------------------
def _schema_any_of(*alternatives: dict) -> Callable[[dict], None]:
    """json_schema_extra: the field also takes a shorter form (converted before validation)."""

    def extra(schema: dict) -> None:
        inner = {k: schema.pop(k) for k in list(schema) if k not in ("title", "description", "default")}
        schema["anyOf"] = [*alternatives, inner]

    return extra


def _also_one_entry(schema: dict) -> None:
    """json_schema_extra of the multi-statistic ``group_by``: one mapping stands for a list of one."""
    for alt in list(schema.get("anyOf", [])):
        if alt.get("type") == "array":
            schema["anyOf"].insert(0, dict(alt["items"]))


class _SpecBase(_Model):
    name: Identifier = Field(description="identifier of this query")
    family: Identifier = Field(None, description="names the release table (default: name)")
    description: FreeText = Field("", description="free text, shown in the privacy statement")
    dataset: Identifier = Field(description="logical dataset, resolved by the env file's datasets")
    privacy_unit: PrivacyUnitModel
    neighbouring: Literal["add_remove_unit", "replace_unit", "event"] = "add_remove_unit"
    bounds: BoundsModel
    budget: BudgetModel
    confidence: _number_type(ge=0.5, lt=1, what="in [0.5, 1)") = Field(  # type: ignore[valid-type]
        0.95, description="level of the published intervals")
    on_exhausted: OnExhaustedModel = Field(
        "reject", json_schema_extra=_schema_any_of({"enum": ["reject", "return_existing"]}))
    columns: Optional[Annotated[list[Column], Field(min_length=1)]] = Field(
        None, description="columns the release may read (default: unit, group-by and value columns)")
    max_cells: _int_type(1, HARD_MAX_CELLS) = Field(1000, description="at most this many cells")  # type: ignore
    min_group_size: Optional[MinGroupSizeModel] = Field(
        None, json_schema_extra=_schema_any_of({"type": "integer", "minimum": 1}))
    where: Optional[Annotated[str, Field(min_length=1, max_length=4000)]] = Field(
        None, description="a public, row-wise Spark SQL predicate over 'columns'")

    @field_validator("min_group_size", mode="before")
    @classmethod
    def _threshold(cls, v: Any) -> Any:
        return {"threshold": v} if isinstance(v, int) and not isinstance(v, bool) else v

    @field_validator("on_exhausted", mode="before")
    @classmethod
    def _policy_name(cls, v: Any) -> Any:
        return {"policy": v} if isinstance(v, str) else v


class SingleMetricSpec(_SpecBase):
    """A release spec in the single-statistic form (``metric``)."""

    model_config = ConfigDict(title="single-metric release spec")
    metric: Literal["count", "distinct_units", "sum", "mean"]
    group_by: Optional[SingleGroupByModel] = None
    value: Optional[ValueModel] = None
    mean: Optional[MeanOptionsModel] = None


class MultiStatisticSpec(_SpecBase):
    """A release spec in the multi-statistic form (``statistics``)."""

    model_config = ConfigDict(title="multi-statistic release spec")
    statistics: Annotated[list[Statistic], Field(min_length=1)]
    group_by: Optional[Annotated[list[GroupByEntryModel], Field(min_length=1)]] = Field(
        None, json_schema_extra=lambda schema: _also_one_entry(schema))

    @field_validator("group_by", mode="before")
    @classmethod
    def _one_mapping(cls, v: Any) -> Any:
        return [v] if isinstance(v, Mapping) else v


# ----------------------------------------------------------------------------------------
# Validation: all errors, field paths, no values
# ----------------------------------------------------------------------------------------
#: top-level fields the parser reads as absent when null (``data.get(f) is not None``)
_NULL_IS_ABSENT = ("group_by", "value", "mean", "columns", "where", "min_group_size", "statistics", "metric")
_WRONG_FORM = {
    ("multi", "metric"): "a release with 'statistics' declares its value columns per statistic: drop "
                         "'metric', 'value' and 'mean'",
    ("multi", "value"): "a release with 'statistics' declares its value columns per statistic: drop "
                        "'metric', 'value' and 'mean'",
    ("multi", "mean"): "a release with 'statistics' declares its value columns per statistic: drop "
                       "'metric', 'value' and 'mean'",
    ("single", "group_by.private_keys"): "keys found privately need the multi-statistic form (a "
                                         "'statistics' list and a 'group_by' list); see docs/config.md",
}
_INPUT_VALUE = re.compile(r",?\s*input_value=.*$", re.S)


def _path(loc: tuple) -> str:
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif (part in KINDS and i > 0 and isinstance(loc[i - 1], int) and len(loc) > 1 and
              loc[0] == "statistics"):
            continue  # the discriminated union's tag
        else:
            out += ("." if out else "") + str(part)
    return out


def _message(err: Mapping[str, Any], form: str, path: str) -> tuple[str, str]:
    t = err["type"]
    if t == "dp_spark":
        msg = err["msg"]
    elif t == "missing":
        msg = "is required"
    elif t == "extra_forbidden":
        msg = _WRONG_FORM.get((form, path), "unknown field (docs/config.md lists the fields)")
    elif t == "literal_error":
        msg = "must be one of " + err.get("ctx", {}).get("expected", "the documented values")
    elif t in ("model_type", "model_attributes_type", "dict_type"):
        msg = "must be a mapping"
    elif t == "list_type":
        msg = "must be a list"
    elif t == "too_short":
        msg = "must not be empty"
    elif t == "too_long":
        msg = "is too long"
    elif t in ("string_type", "string_too_short"):
        msg = "must be a non-empty string"
    elif t == "union_tag_invalid":
        tag = err.get("ctx", {}).get("tag")
        path = f"{path}.kind"
        if tag == "distinct":
            msg = ("a distinct count of a column other than the privacy unit has no sensitivity bounded by "
                   "the enforced bounds: use 'distinct_units' for the unit, or make the column the privacy unit")
        else:
            msg = f"unknown statistic kind (allowed: {sorted(KINDS)})"
    elif t == "union_tag_not_found":
        path, msg = f"{path}.kind", "is required"
    else:  # any other pydantic message, without the value it was given
        msg = _INPUT_VALUE.sub("", str(err.get("msg", "is invalid")))
    return path, msg


def release_spec_errors(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every structural problem of a release spec mapping, as (field path, problem) pairs, in
    the order of the models' fields. Empty when the spec is well-formed. No value of the spec appears."""
    if not isinstance(data, Mapping):
        return [("", "the top level must be a mapping")]
    form = "multi" if data.get("statistics") is not None else "single"
    raw = {k: v for k, v in data.items() if not (k in _NULL_IS_ABSENT and v is None)}
    model = MultiStatisticSpec if form == "multi" else SingleMetricSpec
    try:
        model.model_validate(raw)
    except ValidationError as exc:
        out: list[tuple[str, str]] = []
        for err in exc.errors(include_url=False, include_input=False, include_context=True):
            item = _message(err, form, _path(tuple(err["loc"])))
            if item not in out:
                out.append(item)
        return out
    return []


def check_release_dict(data: Mapping[str, Any], source: str = "<dict>") -> None:
    """Raise one :class:`ConfigError` naming every structural problem of the spec (each with
    its field path, never a value); return None when there is none."""
    errors = release_spec_errors(data)
    if not errors:
        return
    lines = [f"field '{p}': {m}" if p else m for p, m in errors]
    if len(lines) == 1:
        raise ConfigError(f"{source}: {lines[0]}")
    raise ConfigError(f"{source}: {len(lines)} errors:\n  " + "\n  ".join(lines))


# ----------------------------------------------------------------------------------------
# JSON Schema and field paths
# ----------------------------------------------------------------------------------------
def _drop_null_defaults(node: Any) -> Any:
    if isinstance(node, dict):
        if node.get("default", 0) is None and "null" not in json.dumps(node.get("anyOf", node.get("type", ""))):
            node.pop("default")
        for v in node.values():
            _drop_null_defaults(v)
    elif isinstance(node, list):
        for v in node:
            _drop_null_defaults(v)
    return node


def release_spec_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a release spec: either form."""
    adapter = TypeAdapter(Union[SingleMetricSpec, MultiStatisticSpec])
    schema = _drop_null_defaults(adapter.json_schema(mode="validation"))
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "dp_spark release spec",
        "description": "A pre-registered differentially private release (conf/releases/*.yaml); "
                       "fields: docs/config.md. Generated by `dp-spark schema` from dp_spark/spec_model.py.",
        **schema,
    }


def release_spec_json_schema_text() -> str:
    return json.dumps(release_spec_json_schema(), indent=2, sort_keys=False) + "\n"


def field_paths() -> set[str]:
    """Every field path the models accept: ``budget.delta``, ``group_by[].private_keys.share``,
    ``statistics[].q``; a list's entries are ``[]``."""
    out: set[str] = set()

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, f in model.model_fields.items():
            path = f"{prefix}{name}"
            out.add(path)
            for sub, suffix in _models_in(f.annotation):
                walk(sub, f"{path}{suffix}.")

    walk(SingleMetricSpec, "")
    walk(MultiStatisticSpec, "")
    return out


def _models_in(tp: Any, suffix: str = "") -> list[tuple[type[BaseModel], str]]:
    import typing

    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [(tp, suffix)]
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is list:
        return [m for a in args for m in _models_in(a, suffix + "[]")]
    if origin in (Union, Annotated) or str(origin) == "typing.Annotated":
        return [m for a in args for m in _models_in(a, suffix)]
    return []
