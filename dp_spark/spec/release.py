"""THE release spec: frozen pydantic v2 models of a ``conf/releases/*.yaml`` file, with every rule.

Two forms, chosen by the presence of ``statistics``:

* :class:`MultiStatisticSpec`: ``statistics`` (one entry model per statistic kind, built from
  the kind registry: each kind declares its own options model, ``StatisticKind.options``),
  ``group_by`` (one mapping or a list, each with ``public_keys`` or ``private_keys``);
* :class:`SingleMetricSpec`: ``metric``, one ``group_by`` mapping, ``value``, ``mean``; rewritten
  into the ``statistics`` form when read (:mod:`dp_spark.spec.legacy`), its release ids unchanged.

Field rules are the fields' types (:mod:`dp_spark.core.fields`: numbers are exact Fractions);
cross-field rules (cells against ``max_cells``, the delta a private key selection spends, the
``where`` predicate, ``min_group_size`` against the statistics, ...) are model validators.
:func:`release_spec_from_dict` validates a mapping and builds the
:class:`~dp_spark.spec.runtime.ReleaseSpec` the engine reads (relative dates resolved against
the job's date, clamps grid-aligned, the charge converted). Every problem of the file is
reported at once, one line each with its field path (``statistics[2].upper``), and never a
value of the file. The JSON Schema and the field table of ``docs/config.md`` are generated from
these models (:mod:`dp_spark.spec.schema`).

Nothing here imports pyspark.
"""

from __future__ import annotations

import functools
from datetime import date, datetime, timedelta, timezone
from fractions import Fraction
from typing import Any, Literal, Mapping, Optional, Union

from pydantic import (BaseModel, ConfigDict, Field, StrictBool, TypeAdapter, ValidationError, ValidationInfo,
                      create_model, field_validator, model_validator)
from typing_extensions import Annotated

from dp_spark.core.budget import Budget, ZCDP, parse_budget
from dp_spark.errors import ConfigError, DpSparkError, InvalidBoundsError
from dp_spark.statistics.postprocess import OTHER_KEY, MinGroupSize, count_statistic_for
from dp_spark.mechanisms.calibration import approx_to_zcdp_rho
from dp_spark.spec.legacy import legacy_statistics
from dp_spark.spec.errors import did_you_mean, model_errors, raise_errors
from dp_spark.spec.runtime import (DEFAULT_SELECTION_SHARE, ExhaustionPolicy, KeyTable, MeanOptions, PrivateKeys,
                                   PublicKeys, ReleaseSpec, StreamSpec, TableKeys, ValueSpec, bucketed, grid_align)
from dp_spark.mechanisms.tree import MAX_HORIZON_DAYS
from dp_spark.core.fields import (NUMBER_STRING_PATTERN, RELATIVE_DAYS, Column, DateBound, FixedDate, FreeText,
                                 Identifier, KeyValue,
                                 Number, PositiveInt, PositiveNumber, SpecModel, fail, fail_at, int_type,
                                 number_type)
from dp_spark.spec.where import check_where
from dp_spark.statistics.base import StatisticSpec, align_clamp, kinds
from dp_spark.core.units import ContributionBounds, Neighbouring, PrivacyUnit, UnitKind

__all__ = ["SingleMetricSpec", "MultiStatisticSpec", "release_spec_from_dict", "release_spec_errors",
           "check_release_dict", "budget_charge", "statistic_models", "DEFAULT_MAX_CELLS", "HARD_MAX_CELLS",
           "EXHAUSTION_POLICIES", "MERGEABLE_KINDS", "DEFAULT_SELECTION_SHARE", "release_errors"]

EXHAUSTION_POLICIES = ("reject", "degrade", "return_existing")
#: the longest rolling window, in days
MAX_WINDOW_DAYS = 366
# Limits against the many-segments trap (MISSION 9): at most this many cells per release unless
# the spec raises it explicitly (never above the hard limit).
DEFAULT_MAX_CELLS = 1000
HARD_MAX_CELLS = 10_000_000
#: the statistic kinds ``min_group_size: {strategy: merge_other}`` can combine over merged keys
MERGEABLE_KINDS = ("count", "distinct_units", "mean")
#: problems that are refused clamp bounds (raised as InvalidBoundsError)
_BOUNDS_PROBLEMS = ("lower is above upper", "lower must be below upper")
_GRID_PROBLEM = "not representable on the fixed-point grid"
#: marks an error list that holds a refused clamp bound (raised as InvalidBoundsError)
_BOUNDS_MARK = ("", "")


def _run_date(info: Optional[ValidationInfo]) -> date:
    """The job's date against which relative date keys resolve (UTC today by default)."""
    ctx = info.context if info is not None else None
    if ctx and ctx.get("run_date") is not None:
        return ctx["run_date"]
    return datetime.now(timezone.utc).date()


def _exactly_one(obj: BaseModel, a: str, b: str, problem: str) -> None:
    if (getattr(obj, a) is None) == (getattr(obj, b) is None):
        raise fail(problem)


# ----------------------------------------------------------------------------------------
# Blocks
# ----------------------------------------------------------------------------------------
class PrivacyUnitModel(SpecModel):
    """``privacy_unit``: the protected unit."""

    kind: Literal["user", "account", "device", "event"] = Field(description="what one unit is")
    column: Column = Field(description="the column holding the unit's id (rows with a null id are dropped)")


class BoundsModel(SpecModel):
    """``bounds``: the contribution bounds the engine enforces."""

    max_rows_per_unit: PositiveInt = Field(description="K: at most this many rows per unit")
    max_partitions_per_unit: PositiveInt = Field(
        1, description="L0: at most this many cells (key tuples) per unit; 1 without group_by")
    max_rows_per_partition: Optional[PositiveInt] = Field(
        None, description="Linf: at most this many rows per unit and cell (default K)")


class BudgetModel(SpecModel):
    """``budget``: the charge of one release against the named budget policy."""

    id: Identifier = Field(description="the budget policy the release is charged to (docs/ledger.md)")
    measure: Literal["pure_dp", "zcdp"] = Field(
        description="pure_dp (discrete Laplace) or zcdp (discrete Gaussian)")
    epsilon: Optional[PositiveNumber] = Field(
        None, description="pure_dp: the charge; zcdp: the epsilon at 'delta' that the charge converts to (the "
                          "largest rho whose zCDP -> (epsilon, delta) conversion is at most epsilon)")
    rho: Optional[PositiveNumber] = Field(None, description="zcdp: the charge in rho")
    delta: Optional[number_type(ge=0, lt=1, what=">= 0 and < 1")] = Field(  # type: ignore[valid-type]
        None, description="with rho or a pure_dp epsilon: the delta the release spends (private_keys; within the "
                          "policy's delta_cap); with a zcdp epsilon: the delta of its conversion (nothing spent)")

    @model_validator(mode="after")
    def _charge_form(self) -> "BudgetModel":
        if self.measure == "pure_dp":
            if self.epsilon is None or self.rho is not None:
                raise fail("a pure_dp charge takes 'epsilon' (and optionally 'delta'), not 'rho'")
        else:
            _exactly_one(self, "rho", "epsilon",
                         "a zcdp charge takes 'rho', or 'epsilon' with 'delta', exactly one of the two")
            if self.epsilon is not None and not self.delta:
                raise fail_at([(("delta",), "a zcdp charge given as epsilon needs the delta of its conversion "
                                            "(0 < delta < 1)")])
        try:
            self.charge()
        except DpSparkError as exc:
            raise fail_at([(("epsilon",) if self.measure == "zcdp" and self.epsilon is not None else (),
                            str(exc))]) from None
        return self

    def charge(self) -> Budget:
        """``{pure_dp, epsilon[, delta]}`` -> PureDP; ``{zcdp, rho[, delta]}`` -> ZCDP(rho, delta);
        ``{zcdp, epsilon, delta}`` -> ZCDP(rho), rho the largest whose OpenDP zCDP -> (epsilon,
        delta) conversion at delta is at most epsilon (rounded down, checked by converting back)."""
        if self.measure == "zcdp" and self.epsilon is not None:
            return ZCDP(_approx_to_zcdp_rho(self.epsilon, self.delta))
        fields = {k: getattr(self, k) for k in ("epsilon", "rho") if getattr(self, k) is not None}
        if self.delta is not None:
            fields["delta"] = self.delta
        return parse_budget(self.measure, **fields)


@functools.lru_cache(maxsize=256)
def _approx_to_zcdp_rho(epsilon: Fraction, delta: Fraction) -> Fraction:
    return approx_to_zcdp_rho(epsilon, delta)  # a search: run once per (epsilon, delta)


class OnExhaustedModel(SpecModel):
    """``on_exhausted``: what happens when the budget cannot pay (a policy name stands for ``{policy: name}``)."""

    policy: Literal["reject", "degrade", "return_existing"] = Field(
        "reject", description="reject (default), return_existing, or degrade to a coarser spec")
    fallback: Optional[str] = Field(None, description="degrade: path of the coarser spec, relative to this one")

    @model_validator(mode="after")
    def _fallback(self) -> "OnExhaustedModel":
        if self.policy == "degrade" and not self.fallback:
            raise fail_at([(("fallback",), "'degrade' needs the path of a coarser spec")])
        if self.policy != "degrade" and self.fallback is not None:
            raise fail_at([(("fallback",), "only 'degrade' takes a fallback")])
        return self


class DateRangeModel(SpecModel):
    """``public_keys.dates``: every day from ``start`` to ``end`` (or ``through``), inclusive."""

    start: FixedDate = Field(description="the first day: a fixed ISO date")
    end: Optional[DateBound] = Field(
        None, description="the last day: an ISO date, or today / yesterday, resolved against the job's date "
                          "(--date of the refresh or backfill, else UTC today), never against the data")
    through: Optional[DateBound] = Field(None, description="the same as end")

    @model_validator(mode="after")
    def _last(self, info: ValidationInfo) -> "DateRangeModel":
        _exactly_one(self, "end", "through", "give exactly one of 'end' or 'through' (the last day)")
        if self.days(_run_date(info)) == ():
            raise fail("end is before start")
        return self

    def days(self, run_date: date) -> tuple[str, ...]:
        last = self.end if self.end is not None else self.through
        if isinstance(last, str):
            last = run_date - timedelta(days=RELATIVE_DAYS[last])
        return tuple((self.start + timedelta(days=i)).isoformat() for i in range((last - self.start).days + 1))


class PublicKeysModel(SpecModel):
    """``public_keys``: the declared key set: ``values``, ``dates``, or a public key ``table``
    (never read from the data the release counts)."""

    values: Optional[Annotated[list[KeyValue], Field(min_length=1)]] = Field(
        None, description="the keys, listed (strings or integers)")
    dates: Optional[DateRangeModel] = Field(None, description="a range of days")
    table: Optional[Identifier] = Field(
        None, description="the keys are the distinct non-null values of 'column' in this dataset of the env file, "
                          "which must declare it public: true (a catalogue holding no personal data); read at a "
                          "pinned Delta version when the release is validated, sorted; their number counts "
                          "against max_cells before the charge")
    column: Optional[Column] = Field(None, description="table: the key table's column holding the keys")
    where: Optional[Annotated[str, Field(min_length=1, max_length=4000)]] = Field(
        None, description="table: a row-wise Spark SQL predicate over the key table's columns selecting the keys "
                          "(the same allow-list as the release's where)")

    @model_validator(mode="after")
    def _one(self) -> "PublicKeysModel":
        given = [f for f in ("values", "dates", "table") if getattr(self, f) is not None]
        if len(given) != 1:
            raise fail("give exactly one of 'values', 'dates' or 'table'")
        if self.values is not None and len({str(v) for v in self.values}) != len(self.values):
            raise fail("keys must be distinct")
        if self.table is None:
            extra = [f for f in ("column", "where") if getattr(self, f) is not None]
            if extra:
                raise fail_at([((f,), "only a key 'table' takes it") for f in extra])
        elif self.column is None:
            raise fail_at([(("column",), "a key table needs the column holding the keys")])
        elif self.where is not None:
            try:  # the functions and operators now; the columns against the table's schema when it is read
                check_where(self.where, None, "<key table>")
            except ConfigError as exc:
                raise fail_at([(("where",), str(exc).split("field 'where': ", 1)[-1])]) from None
        return self

    def resolve(self, column: str, run_date: date) -> Union[PublicKeys, TableKeys]:
        if self.table is not None:
            return TableKeys(column=column, table=KeyTable(dataset=self.table, column=self.column, where=self.where))
        if self.values is not None:
            return PublicKeys(column=column, kind="string", values=tuple(str(v) for v in self.values))
        return PublicKeys(column=column, kind="date", values=self.dates.days(run_date))


class PrivateKeysModel(SpecModel):
    """``private_keys``: the column's keys are selected privately from the data."""

    max_keys: PositiveInt = Field(description="at most this many keys of the column are published (those with "
                                              "the largest noisy counts)")
    share: Optional[number_type(gt=0, lt=1, what="in (0, 1): the fraction of the release's charge "  # type: ignore
                                "spent on selecting the keys")] = Field(
        None, description="fraction of the release's charge spent on selecting the keys (default 0.25)")
    mechanism: Optional[Literal["laplace", "gaussian", "cheaper"]] = Field(
        None, description="the noise of the selection's threshold: laplace (the default), gaussian (zcdp charges "
                          "only) or cheaper (whichever needs fewer units under the charge's measure: gaussian "
                          "under zcdp)")


class GroupByEntryModel(SpecModel):
    """One ``group_by`` entry of the multi-statistic form."""

    column: Column = Field(description="the key column")
    public_keys: Optional[PublicKeysModel] = Field(None, description="its declared keys (listed, a range of days, "
                                                                     "or read from a public key table)")
    private_keys: Optional[PrivateKeysModel] = Field(
        None, description="instead of public_keys: keys selected privately (the budget then declares a delta)")
    bucket: Optional[Literal["week", "month"]] = Field(
        None, description="derive the key from a date column: week (ISO weeks, Monday to Sunday, keys like "
                          "2026-W45) or month (keys like 2026-11); the keys are the buckets the declared dates "
                          "cover, and rows on days outside them are dropped (needs public_keys.dates)")

    @model_validator(mode="after")
    def _one(self) -> "GroupByEntryModel":
        _exactly_one(self, "public_keys", "private_keys",
                     "give exactly one of 'public_keys' (the keys, listed) or 'private_keys' (keys "
                     "selected from the data with differential privacy)")
        if self.bucket is not None and (self.public_keys is None or self.public_keys.dates is None):
            raise fail_at([(("bucket",), "a bucket derives weeks or months from declared dates: give "
                                         "public_keys.dates")])
        return self

    def key_set(self, run_date: date) -> Any:
        if self.private_keys is not None:
            return PrivateKeys(column=self.column, max_keys=self.private_keys.max_keys, share=self.private_keys.share,
                               mechanism=self.private_keys.mechanism)
        keys = self.public_keys.resolve(self.column, run_date)
        return keys if self.bucket is None else bucketed(self.column, keys.values, self.bucket)


class SingleGroupByModel(GroupByEntryModel):
    """``group_by`` of the single-metric form: one column with its public keys, or with keys
    selected privately (the spec is rewritten into the statistics form, which runs both)."""

    model_config = ConfigDict(title="SingleGroupByModel")


class ValueModel(SpecModel):
    """``value``: the value column and its clamp bounds (``sum``, ``mean``)."""

    column: Column = Field(description="the value column (rows with a null or NaN value are dropped)")
    lower: Number = Field(description="clamp lower bound, rounded outward to the fixed-point grid")
    upper: Number = Field(description="clamp upper bound, rounded outward to the fixed-point grid")

    @model_validator(mode="after")
    def _order(self) -> "ValueModel":
        if self.lower > self.upper:
            raise fail("lower is above upper")
        return self


class MeanOptionsModel(SpecModel):
    """``mean``: public parameters of a ``mean`` release."""

    assumed_group_size: PositiveInt = Field(100, description="public group size used to split the budget "
                                                             "between sum and count")
    min_count: PositiveInt = Field(1, description="floor of the noisy count")
    assumed_mean: Optional[Number] = Field(
        None, description="public estimate of the mean (within the value's [lower, upper]) for the split")


class MinGroupSizeModel(SpecModel):
    """``min_group_size``: suppress or merge the cells whose NOISY group size is below the
    threshold (an integer stands for ``{threshold: N}``)."""

    threshold: PositiveInt = Field(description="the smallest noisy group size published")
    strategy: Literal["suppress", "merge_other"] = Field("suppress", description="suppress the small cells, or "
                                                                                 "merge them into other_key")
    other_key: Annotated[str, Field(min_length=1)] = Field(OTHER_KEY, description="merge_other: the merged key")

    def rule(self) -> MinGroupSize:
        return MinGroupSize(threshold=self.threshold, strategy=self.strategy, other_key=self.other_key)


# ----------------------------------------------------------------------------------------
# Statistics: one entry model per registered kind
# ----------------------------------------------------------------------------------------
class WindowModel(SpecModel):
    """``window``: a rolling window over the release's date key."""

    days: int_type(1, MAX_WINDOW_DAYS) = Field(  # type: ignore[valid-type]
        description="N: the cell of day d covers the rows of days d-N+1 .. d (7: weekly active, 28 or 30: "
                    "monthly active)")


class StatisticBase(SpecModel):
    """Fields of every ``statistics[]`` entry."""

    name: Identifier = Field(description="what the release table's statistic column holds")
    weight: Optional[PositiveNumber] = Field(
        None, description="share of the release's charge, on every statistic or on none (default: the "
                          "error-minimising split)")
    window: Optional[WindowModel] = Field(
        None, description="a rolling window over the one group_by column with public_keys.dates (each unit "
                          "still touches at most max_partitions_per_unit (day, window) cells)")


class ValuedStatisticBase(StatisticBase):
    """Fields of a statistic of a value column."""

    column: Column = Field(description="the value column")
    lower: Number = Field(description="clamp lower bound, aligned outward to the fixed-point grid")
    upper: Number = Field(description="clamp upper bound, aligned outward to the fixed-point grid")

    @model_validator(mode="after")
    def _order(self) -> "ValuedStatisticBase":
        if self.lower >= self.upper:
            raise fail("lower must be below upper")
        return self


@functools.lru_cache(maxsize=1)
def statistic_models() -> tuple[type[BaseModel], ...]:
    """The entry model of each registered kind that a spec may use: ``kind`` (its tag), the
    common fields, the value fields when the kind reads a value column, and the kind's own
    options model (``StatisticKind.options``)."""
    out = []
    for name, kind in sorted(kinds().items()):
        if kind.options is None:
            continue
        base = ValuedStatisticBase if kind.needs_value else StatisticBase
        out.append(create_model(
            f"{type(kind).__name__}Statistic", __base__=(kind.options, base),
            __doc__=f"A ``{name}`` statistic.",
            kind=(Literal[name], Field(description="the statistic kind"))))  # type: ignore[valid-type]
    return tuple(out)


def _refusals() -> dict[str, str]:
    return {name: k.refusal for name, k in kinds().items() if k.options is None and k.refusal}


def _statistic_spec(entry: BaseModel) -> StatisticSpec:
    kind = kinds()[entry.kind]
    clamp = align_clamp(entry.column, entry.lower, entry.upper) if kind.needs_value else None
    options = {f: getattr(entry, f) for f in kind.options.model_fields if getattr(entry, f) is not None}
    return StatisticSpec(name=entry.name, kind=entry.kind, clamp=clamp, weight=entry.weight,
                         options=tuple(sorted(options.items())),
                         window=None if entry.window is None else entry.window.days)


# ----------------------------------------------------------------------------------------
# The two forms
# ----------------------------------------------------------------------------------------
_LEVEL = number_type(ge=0.5, lt=1, what="in [0.5, 1)")
_LEVEL_ADAPTER: TypeAdapter = TypeAdapter(_LEVEL)


class ConfidenceModel(SpecModel):
    """``confidence``: the level of the published intervals, and whether each cell also gets a
    simultaneous band (a number stands for ``{level: N}``, pointwise only)."""

    level: _LEVEL = Field(  # type: ignore[valid-type]
        "0.95", validate_default=True, description="level of the published intervals")
    simultaneous: StrictBool = Field(
        False, description="also publish a band per cell (band_low, band_high) such that all cells of a "
                           "statistic of the release are inside their bands together with probability >= level "
                           "(Sidak: each band at level^(1/m) for m cells, exact for independent noises; a stream: "
                           "all points of its horizon, each band at 1 - (1 - level)/m, Bonferroni)")


#: the statistic kinds a stream publishes as running totals
STREAM_KINDS = ("count", "distinct_units", "sum")


class StreamModel(SpecModel):
    """``stream``: publish each day's running total (from ``start`` through the day) under
    continual release, through the binary-tree mechanism: the whole horizon is charged once."""

    horizon_days: int_type(1, MAX_HORIZON_DAYS) = Field(  # type: ignore[valid-type]
        description="T: the days the stream covers (its one charge pays for all of them; each point's error "
                    "grows like log^2 T)")
    start: FixedDate = Field(description="day 1 of the stream: a fixed ISO date, the first of the group_by dates")

    def check(self, statistics: tuple, key_sets: tuple, err) -> None:
        """The stream's cross-field rules (reported to ``err(loc, problem)``)."""
        dated = [k for k in key_sets if isinstance(k, PublicKeys) and k.kind == "date" and k.bucket is None]
        if len(key_sets) != 1 or len(dated) != 1:
            err(("stream",), "a stream is keyed by day: give exactly one group_by column with public_keys.dates "
                             "(no bucket)")
        else:
            days = dated[0].values
            if days[0] != self.start.isoformat():
                err(("stream", "start"), "must be the first of the group_by dates")
            if len(days) > self.horizon_days:
                err(("stream", "horizon_days"), "the group_by dates run past the stream's horizon")
        other = [s.kind for s in statistics if s.kind not in STREAM_KINDS]
        if other:
            err(("statistics",), f"a stream publishes running totals of {list(STREAM_KINDS)} statistics, not "
                                 f"'{other[0]}'")
        if any(s.window is not None for s in statistics):
            err(("statistics",), "a stream's statistics take no window (each point is a running total)")

    def spec(self) -> StreamSpec:
        return StreamSpec(horizon_days=self.horizon_days, start=self.start.isoformat())


def _schema_any_of(*alternatives: dict):
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


class _SpecBase(SpecModel):
    name: Identifier = Field(description="identifier of this query")
    family: Optional[Identifier] = Field(
        None, description="identifier of the release table (<output_root>/<family>; default: name)")
    description: FreeText = Field("", description="free text, shown in the privacy statement")
    dataset: Identifier = Field(description="logical dataset, resolved to a Delta location by the env file's "
                                            "datasets")
    privacy_unit: PrivacyUnitModel = Field(description="the protected unit")
    neighbouring: Literal["add_remove_unit", "replace_unit", "event"] = Field(
        "add_remove_unit", description="the neighbour relation: add_remove_unit (default), replace_unit, or "
                                       "event (only with an event unit)")
    bounds: BoundsModel = Field(description="the contribution bounds the engine enforces")
    budget: BudgetModel = Field(description="the charge of one release against the named budget policy")
    confidence: ConfidenceModel = Field(
        "0.95", validate_default=True, description="level of the published intervals (a number), or {level, simultaneous}",
        json_schema_extra=_schema_any_of({"anyOf": [{"type": "number", "minimum": 0.5, "exclusiveMaximum": 1},
                                                    {"type": "string", "pattern": NUMBER_STRING_PATTERN}]}))
    on_exhausted: OnExhaustedModel = Field(
        "reject", validate_default=True, description="what happens when the budget cannot pay",
        json_schema_extra=_schema_any_of({"enum": ["reject", "return_existing"]}))
    columns: Optional[Annotated[list[Column], Field(min_length=1)]] = Field(
        None, description="the columns the release may read, nothing else is selected (default: the unit, "
                          "group-by and value columns)")
    max_cells: int_type(1, HARD_MAX_CELLS) = Field(  # type: ignore[valid-type]
        DEFAULT_MAX_CELLS, description=f"at most this many cells (hard limit {HARD_MAX_CELLS}): the "
                                       "many-segments guard; in the multi-statistic form a cell is a (key tuple, "
                                       "statistic) pair")
    min_group_size: Optional[MinGroupSizeModel] = Field(
        None, description="suppress or merge cells whose noisy group size is small (post-processing)",
        json_schema_extra=_schema_any_of({"type": "integer", "minimum": 1}))
    where: Optional[Annotated[str, Field(min_length=1, max_length=4000)]] = Field(
        None, description="a public, row-wise Spark SQL predicate over 'columns' that cannot fail on a row")

    @field_validator("min_group_size", mode="before")
    @classmethod
    def _threshold(cls, v: Any) -> Any:
        return {"threshold": v} if isinstance(v, int) and not isinstance(v, bool) else v

    @field_validator("confidence", mode="before")
    @classmethod
    def _level(cls, v: Any) -> Any:
        if isinstance(v, (ConfidenceModel, Mapping)):
            return v
        try:  # the number form: its errors are the field's own (path 'confidence', no value)
            _LEVEL_ADAPTER.validate_python(v)
        except ValidationError as exc:
            raise fail(str(exc.errors()[0]["msg"])) from None
        return {"level": v}

    @field_validator("on_exhausted", mode="before")
    @classmethod
    def _policy_name(cls, v: Any) -> Any:
        return {"policy": v} if isinstance(v, str) else v

    # -- cross-field rules and the built spec ------------------------------------------------
    @model_validator(mode="after")
    def _cross_field(self, info: ValidationInfo) -> "_SpecBase":
        errors: list[tuple[tuple, str]] = []
        spec = self._build(_run_date(info), (info.context or {}).get("source", "<dict>"),
                           lambda loc, msg: errors.append((loc, msg)))
        if errors:
            if info.context is not None and any(m in _BOUNDS_PROBLEMS or m.startswith(_GRID_PROBLEM)
                                                for _, m in errors):
                info.context["bounds"] = True
            raise fail_at(errors)
        if info.context is not None:
            info.context["spec"] = spec
        return self

    def _key_sets(self, run_date: date) -> tuple:
        raise NotImplementedError

    def _build(self, run_date: date, source: str, err) -> Optional[ReleaseSpec]:  # noqa: C901 - the rules, in order
        """The engine's ReleaseSpec, or None after reporting each broken rule to ``err(loc, problem)``."""
        multi = isinstance(self, MultiStatisticSpec)
        unit = PrivacyUnit(kind=UnitKind(self.privacy_unit.kind), column=self.privacy_unit.column)
        neighbouring = Neighbouring(self.neighbouring)
        if (unit.kind == UnitKind.EVENT) != (neighbouring == Neighbouring.EVENT):
            err(("neighbouring",), "an event-level unit needs neighbouring 'event', and only an event-level unit "
                                   "may use it")
        key_sets = self._key_sets(run_date)
        statistics: tuple[StatisticSpec, ...] = ()
        value: Optional[ValueSpec] = None
        mean: Optional[MeanOptions] = None
        metric = None
        if multi:
            built = []
            for i, e in enumerate(self.statistics):
                try:
                    built.append(_statistic_spec(e))
                except InvalidBoundsError as exc:  # bounds the fixed-point grid cannot hold
                    err(("statistics", i), f"{_GRID_PROBLEM}: {exc}")
            statistics = tuple(built)
            names = [s.name for s in statistics]
            if len(set(names)) != len(names):
                err(("statistics",), "statistic names must be distinct")
            if any(s.weight is None for s in statistics) and any(s.weight is not None for s in statistics):
                err(("statistics",), "give 'weight' on every statistic or on none")
            cols = [k.column for k in key_sets]
            if len(set(cols)) != len(cols):
                err(("group_by",), "a key column is listed twice")
            shares = {k.share for k in key_sets if isinstance(k, PrivateKeys) and k.share is not None}
            if len(shares) > 1:
                err(("group_by",), "private key columns are selected jointly with one share of the charge: give "
                                   "'share' once, or the same value on each")
            mechs = {k.mechanism for k in key_sets if isinstance(k, PrivateKeys) and k.mechanism is not None}
            if len(mechs) > 1:
                err(("group_by",), "private key columns are selected jointly with one mechanism: give "
                                   "'mechanism' once, or the same value on each")
            n_keys = 1
            for k in key_sets:  # private key columns count as their most selected keys; a key
                # table as one key until it is read (Engine.validate checks its size then)
                n_keys *= (k.max_keys if isinstance(k, PrivateKeys) else 1 if isinstance(k, TableKeys)
                           else len(k.values))
            n_cells = n_keys * len(statistics)
            windows = {s.window for s in statistics if s.window is not None}
            if windows:
                dated = [k for k in key_sets if isinstance(k, PublicKeys) and k.kind == "date" and k.bucket is None]
                if len(dated) != 1:
                    err(("statistics",), "a window rolls over a date key: give exactly one group_by column with "
                                         "public_keys.dates (and no bucket)")
                if any(isinstance(k, PrivateKeys) for k in key_sets):
                    err(("statistics",), "a window needs public keys only (no private_keys)")
                if neighbouring == Neighbouring.EVENT:
                    err(("statistics",), "an event-level release cannot take a window (one event would feed "
                                         "several cells)")
                # a unit's (day, window) cells: each window length has its own cells
                n_keys *= len(windows | ({1} if any(s.window is None for s in statistics) else set()))
        else:
            metric = self.metric
            n_keys = n_cells = (1 if not key_sets or isinstance(key_sets[0], TableKeys)
                                else key_sets[0].max_keys if isinstance(key_sets[0], PrivateKeys)
                                else len(key_sets[0].values))
            if metric in ("sum", "mean"):
                if self.value is None:
                    err(("value",), "is required")
                else:
                    v = self.value
                    try:
                        e_lo, e_hi, k = grid_align(v.lower, v.upper)
                        value = ValueSpec(column=v.column, lower=e_lo, upper=e_hi, declared_lower=v.lower,
                                          declared_upper=v.upper, grid_exponent=k)
                    except InvalidBoundsError as exc:  # bounds the fixed-point grid cannot hold
                        err(("value",), f"{_GRID_PROBLEM}: {exc}")
            elif self.value is not None:
                err(("value",), f"metric '{metric}' reads no value column")
            if metric == "mean":
                m = self.mean or MeanOptionsModel()
                if (m.assumed_mean is not None and value is not None
                        and not value.declared_lower <= m.assumed_mean <= value.declared_upper):
                    err(("mean", "assumed_mean"), "must lie within the value's [lower, upper]")
                mean = MeanOptions(assumed_group_size=m.assumed_group_size, min_count=m.min_count,
                                   assumed_mean=m.assumed_mean)
            elif self.mean is not None:
                err(("mean",), "only a 'mean' metric takes mean options")
        if n_cells > self.max_cells:
            err(("group_by", "public_keys"),
                f"{n_cells} cells (key tuples x statistics) exceed max_cells={self.max_cells}: every cell shares "
                "the budget and sparse, high-dimensional segments are mostly noise; coarsen the keys or "
                "pre-register a smaller release")

        b = self.bounds
        l0 = b.max_partitions_per_unit
        if not key_sets and l0 != 1:
            err(("bounds", "max_partitions_per_unit"), "must be 1 without group_by")
        if getattr(self, "stream", None) is not None:  # a stream's days: its horizon, whatever is declared yet
            l0 = min(l0, self.stream.horizon_days)
        elif not any(isinstance(k, TableKeys) for k in key_sets):  # else capped when the keys are read
            l0 = min(l0, n_keys)  # a unit cannot touch more cells (key tuples) than exist
        if neighbouring == Neighbouring.EVENT and (b.max_rows_per_unit != 1 or l0 != 1
                                                   or (b.max_rows_per_partition or 1) != 1):
            err(("bounds",), "event-level releases bound each event to one row: set all bounds to 1")
        try:
            bounds = ContributionBounds(max_rows_per_unit=b.max_rows_per_unit, max_partitions_per_unit=l0,
                                        max_rows_per_partition=b.max_rows_per_partition,
                                        lower=None if value is None else value.lower,
                                        upper=None if value is None else value.upper)
        except DpSparkError as exc:
            err(("bounds",), str(exc))
            bounds = None

        charge = self.budget.charge()
        private = [k for k in key_sets if isinstance(k, PrivateKeys)]
        spends_delta = getattr(charge, "delta", 0) > 0
        if private and not spends_delta:
            err(("budget", "delta"),
                "a release with private_keys spends delta (the probability that a key created by one unit alone "
                "is published): declare it beside rho or epsilon, e.g. budget: {id: ..., measure: zcdp, rho: 0.5, "
                "delta: 1e-8} (a zcdp charge given as {epsilon, delta} converts rho and cannot carry it)")
        if spends_delta and not private:
            err(("budget", "delta"), "only a release with private_keys spends delta; drop it")
        for i, k in enumerate(key_sets):
            if isinstance(k, PrivateKeys) and k.mechanism == "gaussian" and charge.MEASURE != "zcdp":
                err(("group_by", i, "private_keys", "mechanism") if multi else ("group_by", "private_keys", "mechanism"),
                    "the Gaussian threshold is priced in zCDP: use a zcdp charge, or mechanism laplace or cheaper")

        needed = [unit.column]
        if multi:
            needed.extend(k.column for k in key_sets)
            needed.extend(s.column for s in statistics if s.column is not None)
            if unit.column in [k.column for k in key_sets] + [s.column for s in statistics]:
                err(("privacy_unit", "column"), "the unit column cannot be a group-by or value column")
        else:
            needed.extend(k.column for k in key_sets)
            if value is not None:
                needed.append(value.column)
        if self.columns is None:
            columns = tuple(dict.fromkeys(needed))
        else:
            columns = tuple(self.columns)
            if any(c not in columns for c in needed):
                err(("columns",), "must include the unit, group-by and value columns")
        where = None
        if self.where is not None:
            try:
                where = check_where(self.where, columns, source)
            except ConfigError as exc:
                err(("where",), str(exc).split("field 'where': ", 1)[-1])
        stream_model = getattr(self, "stream", None)
        if stream_model is not None:
            stream_model.check(statistics, key_sets, err)
            if neighbouring != Neighbouring.ADD_REMOVE_UNIT:
                err(("neighbouring",), "a stream's sensitivity is derived for add_remove_unit")
            if self.min_group_size is not None:
                err(("min_group_size",), "a stream publishes every day's running total: no min_group_size")
        if not multi and metric is not None:
            statistics = legacy_statistics(metric, value, mean) if (value is not None or metric in
                                                                    ("count", "distinct_units")) else ()
        min_group = self._min_group_size(metric, key_sets, statistics, err)
        if bounds is None:
            return None
        return ReleaseSpec(
            name=self.name, family=self.family or self.name, description=self.description, dataset=self.dataset,
            unit=unit, neighbouring=neighbouring, metric=metric,
            group_by=(key_sets[0] if len(key_sets) == 1 and isinstance(key_sets[0], PublicKeys) else None),
            value=value, bounds=bounds, budget_id=self.budget.id, charge=charge, mean=mean,
            confidence=self.confidence.level, simultaneous=self.confidence.simultaneous,
            on_exhausted=ExhaustionPolicy(policy=self.on_exhausted.policy, fallback=self.on_exhausted.fallback),
            columns=columns, max_cells=self.max_cells, min_group_size=min_group, source=source,
            statistics=statistics, key_sets=key_sets, where=where,
            stream=None if stream_model is None else stream_model.spec())

    def _min_group_size(self, metric: Optional[str], key_sets: tuple, statistics: tuple,
                        err) -> Optional[MinGroupSize]:
        """On either form it thresholds the group-size statistic (a count or a distinct count of
        units: ``ReleaseSpec.group_size_statistic``); ``merge_other`` needs one public key
        column and statistics it can combine."""
        if self.min_group_size is None:
            return None
        rule = self.min_group_size.rule()
        if metric is not None:
            try:
                count_statistic_for(metric)
            except ConfigError as exc:
                err(("min_group_size",), str(exc))
        public = {v for k in key_sets if isinstance(k, PublicKeys) for v in k.values}
        if rule.other_key in public:
            err(("min_group_size", "other_key"), "clashes with a declared public key")
        if rule.strategy == "merge_other" and self.confidence.simultaneous:
            err(("confidence", "simultaneous"), "simultaneous bands do not cover a merged cell (its noise sums the "
                                                "noises of keys chosen by their noisy counts): use min_group_size "
                                                "with strategy 'suppress'")
        if metric is not None:
            return rule
        if not any(s.kind in ("count", "distinct_units") for s in statistics):
            err(("min_group_size",), "needs a noisy group size: add a 'count' or 'distinct_units' statistic (its "
                                     "noisy value is thresholded)")
        if rule.strategy == "merge_other":
            if len(key_sets) != 1 or not isinstance(key_sets[0], (PublicKeys, TableKeys)):
                err(("min_group_size", "strategy"), "merge_other needs exactly one group-by column, with public "
                                                    "keys (use suppress)")
            other = [s.name for s in statistics if s.kind not in MERGEABLE_KINDS]
            if other:
                err(("min_group_size", "strategy"), f"merge_other combines {list(MERGEABLE_KINDS)} statistics "
                                                    f"only, not '{other[0]}' (use suppress)")
        return rule


class SingleMetricSpec(_SpecBase):
    """A release spec in the single-metric form (``metric``), rewritten into the statistics form."""

    model_config = ConfigDict(title="single-metric release spec")
    metric: Literal["count", "distinct_units", "sum", "mean"] = Field(
        description="count (rows), distinct_units, sum or mean (of value): the single-metric form")
    group_by: Optional[SingleGroupByModel] = Field(None, description="one key column and its public or private keys")
    value: Optional[ValueModel] = Field(None, description="sum, mean: the value column and its clamp bounds")
    mean: Optional[MeanOptionsModel] = Field(None, description="mean: its public options")

    def _key_sets(self, run_date: date) -> tuple:
        return () if self.group_by is None else (self.group_by.key_set(run_date),)


class MultiStatisticSpec(_SpecBase):
    """A release spec in the multi-statistic form (``statistics``)."""

    model_config = ConfigDict(title="multi-statistic release spec")
    statistics: Annotated[list[Annotated[Union[statistic_models()], Field(discriminator="kind")]],  # type: ignore
                          Field(min_length=1)] = Field(description="the statistics, each {name, kind, ...}")
    group_by: Optional[Annotated[list[GroupByEntryModel], Field(min_length=1)]] = Field(
        None, description="key columns (one mapping, or a list; none: one global cell); the cells are the cross "
                          "product of their key sets",
        json_schema_extra=lambda schema: _also_one_entry(schema))

    @field_validator("group_by", mode="before")
    @classmethod
    def _one_mapping(cls, v: Any) -> Any:
        return [v] if isinstance(v, Mapping) else v

    stream: Optional[StreamModel] = Field(
        None, description="publish running totals under continual release (the binary-tree mechanism): "
                          "{horizon_days, start}; the horizon is charged once, at the first refresh")

    def _key_sets(self, run_date: date) -> tuple:
        return tuple(e.key_set(run_date) for e in self.group_by or ())


# ----------------------------------------------------------------------------------------
# Validation: all errors, field paths, no values
# ----------------------------------------------------------------------------------------
#: top-level fields read as absent when null
_NULL_IS_ABSENT = ("group_by", "value", "mean", "columns", "where", "min_group_size", "statistics", "metric",
                   "stream")
_DROP_FORM = ("a release with 'statistics' declares its value columns per statistic: drop 'metric', 'value' "
              "and 'mean'")
_WRONG_FORM = {
    ("multi", "metric"): _DROP_FORM, ("multi", "value"): _DROP_FORM, ("multi", "mean"): _DROP_FORM,
}


def _kind_tags() -> frozenset:
    return frozenset(m.model_fields["kind"].annotation.__args__[0] for m in statistic_models())


def _unknown_kind(tag: Any) -> str:
    refusal = _refusals().get(tag)
    return refusal or (f"unknown statistic kind{did_you_mean(tag, _kind_tags())} "
                       f"(allowed: {sorted(_kind_tags())})")


def release_errors(exc: ValidationError, form: str, prefix: tuple = (),
                   model: Optional[type[BaseModel]] = None) -> list[tuple[str, str]]:
    """The (field path, problem) pairs of a release spec's ValidationError (``form``: multi or single)."""
    model = model or (MultiStatisticSpec if form == "multi" else SingleMetricSpec)
    return model_errors(exc, prefix=prefix, tags=_kind_tags(), unknown_tag=_unknown_kind, model=model,
                        unknown_field=lambda path: _WRONG_FORM.get((form, path)))


def _validate(data: Any, run_date: Optional[date], source: str) -> tuple[Optional[ReleaseSpec], list]:
    if not isinstance(data, Mapping):
        return None, [("", "the top level must be a mapping")]
    form = "multi" if data.get("statistics") is not None else "single"
    raw = {k: v for k, v in data.items() if not (k in _NULL_IS_ABSENT and v is None)}
    model = MultiStatisticSpec if form == "multi" else SingleMetricSpec
    context: dict[str, Any] = {"run_date": run_date, "source": source}
    try:
        model.model_validate(raw, context=context)
    except ValidationError as exc:
        errors = release_errors(exc, form)
        if context.get("bounds") or any(m in _BOUNDS_PROBLEMS for _, m in errors):
            errors.append(_BOUNDS_MARK)
        return None, errors
    return context["spec"], []


def release_spec_errors(data: Mapping[str, Any], *, run_date: Optional[date] = None) -> list[tuple[str, str]]:
    """Every problem of a release spec mapping, as (field path, problem) pairs (field rules
    first, then, when the fields are well-formed, the cross-field rules). Empty when the spec
    is valid. No value of the spec appears."""
    return [e for e in _validate(data, run_date, "<dict>")[1] if e != _BOUNDS_MARK]


def _raise(source: str, errors: list[tuple[str, str]]) -> None:
    bounds = _BOUNDS_MARK in errors
    raise_errors(source, [e for e in errors if e != _BOUNDS_MARK], InvalidBoundsError if bounds else ConfigError)


def check_release_dict(data: Mapping[str, Any], source: str = "<dict>") -> None:
    """Raise one :class:`ConfigError` naming every problem of the spec (each with its field
    path, never a value); return None when there is none."""
    errors = _validate(data, None, source)[1]
    if errors:
        _raise(source, errors)


def release_spec_from_dict(data: Mapping[str, Any], source: str = "<dict>", *,
                           run_date: Optional[date] = None) -> ReleaseSpec:
    """Validate a release spec mapping and build the engine's :class:`ReleaseSpec`.
    ``run_date``: the job's date, against which relative date keys (``end: today``,
    ``through: yesterday``) resolve; default UTC today."""
    spec, errors = _validate(data, run_date, source)
    if errors:
        _raise(source, errors)
    return spec


def budget_charge(budget: Mapping[str, Any], source: str = "<dict>") -> Budget:
    """The charge of a ``budget`` block alone (whether a release may spend delta at all depends
    on its private keys: checked with the whole spec)."""
    try:
        return BudgetModel.model_validate(budget).charge()
    except ValidationError as exc:
        _raise(source, release_errors(exc, "multi", prefix=("budget",), model=BudgetModel))
        raise  # unreachable: _raise raises
