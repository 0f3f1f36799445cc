"""YAML -> frozen, validated specs. Every check here runs before Spark starts.

Two kinds of file:

* a release spec (``conf/releases/*.yaml``): one pre-registered query; see
  :class:`ReleaseSpec` and ``docs/config.md``;
* an environment (``conf/envs/*.yaml``): where the data, the warehouse, the ledger and the
  policies are; see :class:`EnvConfig`.

Errors are :class:`~dp_spark.errors.ConfigError` subclasses naming the file and the field;
they never contain data values (there are none yet: no data has been read).
Nothing here imports pyspark.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field, replace
from datetime import date, timedelta
from fractions import Fraction
from pathlib import Path
from typing import Any, Mapping, Optional

import yaml

from dp_spark.budget import Budget, parse_budget, to_fraction
from dp_spark.spec.where import check_where  # noqa: F401  (re-exported)
from dp_spark.errors import ConfigError, DpSparkError, InvalidBoundsError
from dp_spark.governance.thresholds import MinGroupSize, min_group_size_from_dict
from dp_spark.statistics.base import StatisticSpec, align_clamp, kind_of
from dp_spark.units import ContributionBounds, Neighbouring, PrivacyUnit, UnitKind

METRICS = ("count", "distinct_units", "sum", "mean")
EXHAUSTION_POLICIES = ("reject", "degrade", "return_existing")
MODES = ("official", "exploration")
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
_COLUMN_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Limits against the many-segments trap (MISSION 9): one group-by column, at most this many
# cells per release unless the spec raises it explicitly (never above the hard limit).
DEFAULT_MAX_CELLS = 1000
HARD_MAX_CELLS = 100_000


def _err(source: str, field_name: str, problem: str) -> ConfigError:
    return ConfigError(f"{source}: field '{field_name}': {problem}")


def _require(d: Mapping[str, Any], key: str, source: str, prefix: str = "") -> Any:
    if key not in d or d[key] is None:
        raise _err(source, prefix + key, "is required")
    return d[key]


def _budget_charge(bud: Mapping[str, Any], measure: str, source: str) -> Budget:
    """The charge of a spec's ``budget`` block (see docs/config.md, "The budget block").

    * ``{measure: pure_dp, epsilon: E[, delta: D]}`` -> ``PureDP(E, D)``;
    * ``{measure: zcdp, rho: R[, delta: D]}`` -> ``ZCDP(R, D)`` (delta-approximate zCDP);
    * ``{measure: zcdp, epsilon: E, delta: D}`` -> ``ZCDP(R)``, R the largest rho whose OpenDP
      zCDP -> (epsilon, delta) conversion at D is at most E (rounded down, checked by converting
      back); D is then the conversion's delta, not a delta spent, so the charge has delta 0.
    """
    from dp_spark.budget import ZCDP

    delta = None
    if "delta" in bud:
        delta = _fraction(bud["delta"], source, "budget.delta")
        if not 0 <= delta < 1:
            raise _err(source, "budget.delta", "must be >= 0 and < 1")
    if measure == "zcdp" and "epsilon" in bud:
        if "rho" in bud:
            raise _err(source, "budget", "a zcdp charge takes rho, or epsilon with delta, not both")
        if delta is None or delta == 0:
            raise _err(source, "budget",
                       "a zcdp charge takes rho, or epsilon with delta (the delta of its conversion, "
                       "0 < delta < 1)")
        from dp_spark.mechanisms.calibration import approx_to_zcdp_rho

        try:
            return ZCDP(approx_to_zcdp_rho(bud["epsilon"], delta))
        except DpSparkError as exc:
            raise _err(source, "budget.epsilon", str(exc)) from None
    fields = {k: bud[k] for k in ("epsilon", "rho") if k in bud}
    if delta is not None:
        fields["delta"] = delta
    try:
        return parse_budget(measure, **fields)
    except DpSparkError as exc:
        raise _err(source, "budget", str(exc)) from None


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


def _fraction(value: Any, source: str, name: str) -> Fraction:
    """An exact number for field ``name`` (:func:`~dp_spark.budget.to_fraction`); the error
    names the field, never the value."""
    try:
        return to_fraction(value, name)
    except DpSparkError as exc:
        raise _err(source, name, str(exc)) from None


def _column(value: Any, source: str, name: str) -> str:
    if not isinstance(value, str) or not _COLUMN_RE.match(value):
        raise _err(source, name, "must be a plain column name")
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


# --------------------------------------------------------------------------------------
# Release specs
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PublicKeys:
    """The declared, public set of group keys. Keys are never read from the data."""

    column: str
    kind: str  # "string" | "date"
    values: tuple[str, ...]

    def restricted_to(self, keys: tuple[str, ...]) -> "PublicKeys":
        missing = [k for k in keys if k not in self.values]
        if missing:
            raise ConfigError("requested keys are outside the declared public key set")
        return replace(self, values=tuple(keys))


@dataclass(frozen=True)
class PrivateKeys:
    """A group-by column whose keys are NOT declared: they are selected privately from the
    bounded data (``group_by: [{column: region, private_keys: {max_keys: 500}}]``).

    ``max_keys``: at most this many values of the column are published (the selected keys
    with the largest noisy counts). ``share``: the fraction of the release's charge spent on
    selecting the keys (default :data:`DEFAULT_SELECTION_SHARE`); the statistics share the rest.
    Several private columns are selected jointly, as tuples (see
    :mod:`dp_spark.statistics.selection`)."""

    column: str
    max_keys: int
    share: Optional[Fraction] = None
    kind: str = "private"


#: the fraction of a release's charge that private key selection takes unless ``share`` says
DEFAULT_SELECTION_SHARE = Fraction(1, 4)


@dataclass(frozen=True)
class ValueSpec:
    column: str
    lower: Fraction  # enforced (grid-aligned) bounds
    upper: Fraction
    declared_lower: Fraction
    declared_upper: Fraction
    grid_exponent: int


@dataclass(frozen=True)
class MeanOptions:
    assumed_group_size: int
    min_count: int
    # a PUBLIC estimate of the mean (e.g. last period's published release), used only to
    # split the budget between sum and count; a wrong value costs accuracy, never privacy
    assumed_mean: Optional[Fraction] = None


@dataclass(frozen=True)
class ExhaustionPolicy:
    policy: str
    fallback: Optional[str] = None  # path of the coarser spec for "degrade"


@dataclass(frozen=True)
class ReleaseSpec:
    """A pre-registered release. Frozen; every field validated in ``from_dict``.

    One form runs: ``statistics`` and ``key_sets``. A spec written in the single-``metric``
    form is rewritten into it at parse time (:func:`legacy_statistics`); ``metric``,
    ``group_by``, ``value`` and ``mean`` then keep what it declared, so that its canonical
    form -- and so its release ids and spec version -- stay what they always were
    (``tests/unit/golden_release_ids.json``). They are None for a spec written with
    ``statistics`` (``group_by`` is then its one public key set, if it has exactly one)."""

    name: str
    family: str
    description: str
    dataset: str
    unit: PrivacyUnit
    neighbouring: Neighbouring
    metric: str
    group_by: Optional[PublicKeys]
    value: Optional[ValueSpec]
    bounds: ContributionBounds
    budget_id: str
    charge: Budget
    mean: Optional[MeanOptions]
    confidence: Fraction
    on_exhausted: ExhaustionPolicy
    columns: tuple[str, ...]
    max_cells: int
    min_group_size: Optional[MinGroupSize] = None
    source: str = field(default="<dict>", compare=False)
    # what the release computes (a single-``metric`` spec: its rewrite, legacy_statistics)
    statistics: tuple[StatisticSpec, ...] = ()
    # one per group-by column, as declared: PublicKeys, or PrivateKeys (selected privately);
    # cells = the cross product of the public key sets x the selected private key tuples
    key_sets: tuple[Any, ...] = ()
    where: Optional[str] = None

    # -- identity ------------------------------------------------------------------------
    def canonical(self) -> dict[str, Any]:
        """Everything that determines the release, in a JSON-stable form.

        A spec written in the single-``metric`` form keeps the shape (and so the release ids) it
        always had, whatever it is rewritten into; the multi-statistic form has its own shape
        (fields added since, such as ``min_group_size`` there or ``where`` on the single-metric
        form, appear only when set: specs without them keep their ids)."""
        if self.metric is None:
            return {
                "form": "statistics",
                "name": self.name, "family": self.family, "dataset": self.dataset,
                "unit": {"kind": self.unit.kind.value, "column": self.unit.column},
                "neighbouring": self.neighbouring.value,
                "where": self.where,
                "group_by": [_key_set_canonical(k) for k in self.key_sets],
                "statistics": [s.canonical() for s in self.statistics],
                "bounds": bounds_to_json(self.bounds),
                "budget_id": self.budget_id,
                "charge": self.charge.to_json(),
                "confidence": str(self.confidence),
                "columns": list(self.columns),
                **({} if self.min_group_size is None else {"min_group_size": self.min_group_size.to_json()}),
            }
        return {
            "name": self.name,
            "family": self.family,
            "dataset": self.dataset,
            "unit": {"kind": self.unit.kind.value, "column": self.unit.column},
            "neighbouring": self.neighbouring.value,
            "metric": self.metric,
            "group_by": None
            if self.group_by is None
            else {"column": self.group_by.column, "kind": self.group_by.kind, "keys": list(self.group_by.values)},
            "value": None
            if self.value is None
            else {"column": self.value.column, "lower": str(self.value.lower), "upper": str(self.value.upper),
                  "grid_exponent": self.value.grid_exponent},
            "bounds": bounds_to_json(self.bounds),
            "budget_id": self.budget_id,
            "charge": self.charge.to_json(),
            "mean": None
            if self.mean is None
            else {"assumed_group_size": self.mean.assumed_group_size, "min_count": self.mean.min_count,
                  # only when set, so that specs without it keep their release ids
                  **({} if self.mean.assumed_mean is None else {"assumed_mean": str(self.mean.assumed_mean)})},
            "confidence": str(self.confidence),
            "columns": list(self.columns),
            "min_group_size": None if self.min_group_size is None else self.min_group_size.to_json(),
            **({} if self.where is None else {"where": self.where}),
        }

    def version(self) -> str:
        """Content hash of the canonical spec: an edited spec is a new version."""
        blob = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def public_key_sets(self) -> tuple[PublicKeys, ...]:
        return tuple(k for k in self.key_sets if isinstance(k, PublicKeys))

    @property
    def private_key_sets(self) -> tuple[PrivateKeys, ...]:
        return tuple(k for k in self.key_sets if isinstance(k, PrivateKeys))

    @property
    def max_private_tuples(self) -> int:
        """At most this many private key tuples are selected (1 without private keys): the
        product of the private columns' ``max_keys``."""
        n = 1
        for k in self.private_key_sets:
            n *= k.max_keys
        return n

    @property
    def selection_share(self) -> Optional[Fraction]:
        """The fraction of the charge spent on private key selection (None without)."""
        if not self.private_key_sets:
            return None
        shares = {k.share for k in self.private_key_sets if k.share is not None}
        return shares.pop() if shares else DEFAULT_SELECTION_SHARE

    @property
    def cells(self) -> int:
        """The number of key tuples (cells per statistic); with private keys, the most there
        can be (public key tuples x the most private key tuples selected)."""
        n = 1
        for k in self.public_key_sets:
            n *= len(k.values)
        return n * self.max_private_tuples

    @property
    def keys(self) -> tuple[str, ...]:
        """The canonical ``key`` string of every cell, in order (known before the data only
        when every group-by column has public keys)."""
        if self.private_key_sets:
            raise ConfigError(f"{self.source}: the keys of a release with private_keys are selected "
                              "from the data at publication; they are not known in advance")
        from dp_spark.statistics.plan import canonical_key, key_tuples

        return tuple(canonical_key(self.key_sets, t) for t in key_tuples(self.key_sets))

    @property
    def key_columns(self) -> tuple[str, ...]:
        return tuple(k.column for k in self.key_sets)

    @property
    def group_size_statistic(self) -> Optional[str]:
        """The statistic whose noisy value is a cell's group size (``min_group_size``
        thresholds it): the first ``count``, else the first ``distinct_units`` (None without)."""
        for kind in ("count", "distinct_units"):
            for s in self.statistics:
                if s.kind == kind:
                    return s.name
        return None

    @property
    def date_key_set(self) -> Optional[PublicKeys]:
        """The one group-by column keyed by declared dates (None when there is none or several)."""
        dated = [k for k in self.public_key_sets if k.kind == "date"]
        return dated[0] if len(dated) == 1 else None

    def for_keys(self, keys: tuple[str, ...], *, name_suffix: str, column: Optional[str] = None) -> "ReleaseSpec":
        """The same spec restricted to a subset of its public keys (e.g. one day): ``column``
        (default: its one date-keyed column, or its one public key column); its other key
        columns, public or private, are unchanged; L0 is capped at the cells left. Either form
        (a single-metric spec restricts its ``group_by`` too, which its release id reads)."""
        if not self.key_sets:
            raise ConfigError(f"{self.source}: this release has no group_by to restrict")
        public = self.public_key_sets
        default = (self.date_key_set.column if self.date_key_set is not None
                   else public[0].column if len(public) == 1 else None)
        target = column or default
        idx = [i for i, k in enumerate(self.key_sets) if isinstance(k, PublicKeys) and k.column == target]
        if target is None or len(idx) != 1:
            raise ConfigError(f"{self.source}: name the public key column to restrict (a release with "
                              "several key columns restricts one: by default its one date-keyed column)")
        key_sets = list(self.key_sets)
        key_sets[idx[0]] = key_sets[idx[0]].restricted_to(keys)
        out = replace(self, key_sets=tuple(key_sets), name=f"{self.name}{name_suffix}")
        if len(key_sets) == 1:
            out = replace(out, group_by=key_sets[0])
        l0 = min(self.bounds.max_partitions_per_unit, out.cells)
        return replace(out, bounds=replace(self.bounds, max_partitions_per_unit=l0))


def _key_set_canonical(k: Any) -> dict[str, Any]:
    if isinstance(k, PrivateKeys):
        return {"column": k.column, "kind": "private", "max_keys": k.max_keys,
                "share": None if k.share is None else str(k.share)}
    return {"column": k.column, "kind": k.kind, "keys": list(k.values)}


def bounds_to_json(b: ContributionBounds) -> dict[str, Any]:
    return {
        "max_rows_per_unit": b.max_rows_per_unit,
        "max_partitions_per_unit": b.max_partitions_per_unit,
        "max_rows_per_partition": b.max_rows_per_partition,
        "lower": None if b.lower is None else str(b.lower),
        "upper": None if b.upper is None else str(b.upper),
    }


RELATIVE_DAYS = {"today": 0, "yesterday": 1}


def _run_date(run_date: Optional[date]) -> date:
    """The job's date against which relative date keys resolve (UTC today by default)."""
    if run_date is None:
        from datetime import datetime, timezone

        return datetime.now(timezone.utc).date()
    return run_date


def _date_bound(value: Any, source: str, field_name: str, run_date: Optional[date]) -> date:
    """An ISO date, or ``today`` / ``yesterday``: relative to the job's date (``--date``),
    never to the data, so the key set stays public."""
    if isinstance(value, date):
        return value
    text = str(value).strip().lower()
    if text in RELATIVE_DAYS:
        return _run_date(run_date) - timedelta(days=RELATIVE_DAYS[text])
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise _err(source, field_name, "must be an ISO date, 'today' or 'yesterday'") from None


def _private_keys(gb: Mapping[str, Any], column: str, source: str, p: str) -> PrivateKeys:
    pk = _mapping(gb["private_keys"], source, f"{p}.private_keys")
    _check_keys(pk, {"max_keys", "share"}, source, f"{p}.private_keys.")
    max_keys = _int(_require(pk, "max_keys", source, f"{p}.private_keys."), source,
                    f"{p}.private_keys.max_keys")
    share = None
    if pk.get("share") is not None:
        share = _fraction(pk["share"], source, f"{p}.private_keys.share")
        if not 0 < share < 1:
            raise _err(source, f"{p}.private_keys.share", "must be in (0, 1): the fraction of the "
                       "release's charge spent on selecting the keys")
    return PrivateKeys(column=column, max_keys=max_keys, share=share)


def _public_keys(raw: Any, source: str, p: str = "group_by", run_date: Optional[date] = None,
                 *, allow_private: bool = False) -> Any:
    gb = _mapping(raw, source, p)
    if "private_keys" in gb and not allow_private:
        raise _err(source, f"{p}.private_keys", "keys found privately need the multi-statistic form "
                   "(a 'statistics' list and a 'group_by' list); see docs/config.md")
    _check_keys(gb, {"column", "public_keys", "private_keys"} if allow_private else {"column", "public_keys"},
                source, f"{p}.")
    column = _column(_require(gb, "column", source, f"{p}."), source, f"{p}.column")
    if allow_private:
        if ("public_keys" in gb) == ("private_keys" in gb):
            raise _err(source, p, "give exactly one of 'public_keys' (the keys, listed) or "
                       "'private_keys' (keys selected from the data with differential privacy)")
        if "private_keys" in gb:
            return _private_keys(gb, column, source, p)
    pk = _mapping(_require(gb, "public_keys", source, f"{p}."), source, f"{p}.public_keys")
    _check_keys(pk, {"values", "dates"}, source, f"{p}.public_keys.")
    if ("values" in pk) == ("dates" in pk):
        raise _err(source, f"{p}.public_keys", "give exactly one of 'values' or 'dates'")
    if "values" in pk:
        values = pk["values"]
        if not isinstance(values, list) or not values:
            raise _err(source, f"{p}.public_keys.values", "must be a non-empty list")
        if not all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in values):
            raise _err(source, f"{p}.public_keys.values", "entries must be strings or integers")
        keys = tuple(str(v) for v in values)
        kind = "string"
    else:
        dates = _mapping(pk["dates"], source, f"{p}.public_keys.dates")
        _check_keys(dates, {"start", "end", "through"}, source, f"{p}.public_keys.dates.")
        if ("end" in dates) == ("through" in dates):
            raise _err(source, f"{p}.public_keys.dates", "give exactly one of 'end' or 'through' (the last day)")
        last = "end" if "end" in dates else "through"
        start = _require(dates, "start", source, f"{p}.public_keys.dates.")
        if isinstance(start, str) and start.strip().lower() in RELATIVE_DAYS:
            raise _err(source, f"{p}.public_keys.dates.start", "must be a fixed ISO date")
        start = _date_bound(start, source, f"{p}.public_keys.dates.start", run_date)
        end = _date_bound(_require(dates, last, source, f"{p}.public_keys.dates."), source,
                          f"{p}.public_keys.dates.{last}", run_date)
        if end < start:
            raise _err(source, f"{p}.public_keys.dates", "end is before start")
        keys = tuple((start + timedelta(days=i)).isoformat() for i in range((end - start).days + 1))
        kind = "date"
    if len(set(keys)) != len(keys):
        raise _err(source, f"{p}.public_keys", "keys must be distinct")
    return PublicKeys(column=column, kind=kind, values=keys)


def _grid_align(declared_lower: Fraction, declared_upper: Fraction) -> tuple[Fraction, Fraction, int]:
    """Round the clamp bounds outward to the fixed-point grid (multiples of 2^(k+1)).

    The grid exponent k depends on the public bounds only. Aligning to 2^(k+1) makes the
    lower bound, the upper bound and their midpoint exact grid points, so the sensitivity
    derived from the enforced bounds is exactly what the Spark path can produce.
    """
    c = align_clamp("", declared_lower, declared_upper)
    return c.lower, c.upper, c.grid_exponent


def release_spec_from_dict(data: Mapping[str, Any], source: str = "<dict>", *,
                           run_date: Optional[date] = None) -> ReleaseSpec:
    """Validate a release spec. ``run_date``: the job's date, against which relative date keys
    (``end: today``, ``through: yesterday``) resolve; default UTC today."""
    from dp_spark.spec_model import check_release_dict

    check_release_dict(data, source)  # every structural error at once (pydantic); then the checks below
    allowed = {
        "name", "family", "description", "dataset", "privacy_unit", "neighbouring", "metric",
        "group_by", "value", "bounds", "budget", "mean", "confidence", "on_exhausted",
        "columns", "max_cells", "min_group_size", "statistics", "where",
    }
    _check_keys(data, allowed, source)
    name = _require(data, "name", source)
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise _err(source, "name", "must be an identifier of letters, digits and '_' (max 64)")
    family = data.get("family", name)
    if not isinstance(family, str) or not _NAME_RE.match(family):
        raise _err(source, "family", "must be an identifier of letters, digits and '_'")
    description = str(data.get("description", ""))
    dataset = _require(data, "dataset", source)
    if not isinstance(dataset, str) or not _NAME_RE.match(dataset):
        raise _err(source, "dataset", "must be a logical dataset name declared in the env file")

    # privacy unit and neighbours: declared first, always explicit
    pu = _mapping(_require(data, "privacy_unit", source), source, "privacy_unit")
    _check_keys(pu, {"kind", "column"}, source, "privacy_unit.")
    try:
        unit = PrivacyUnit(kind=UnitKind(_require(pu, "kind", source, "privacy_unit.")),
                           column=_column(_require(pu, "column", source, "privacy_unit."), source,
                                          "privacy_unit.column"))
    except ValueError:
        raise _err(source, "privacy_unit.kind", f"must be one of {[k.value for k in UnitKind]}") from None
    except DpSparkError as exc:
        raise _err(source, "privacy_unit", str(exc)) from None
    rel = data.get("neighbouring", Neighbouring.ADD_REMOVE_UNIT.value)
    try:
        neighbouring = Neighbouring(rel)
    except ValueError:
        raise _err(source, "neighbouring", f"must be one of {[n.value for n in Neighbouring]}") from None
    if (unit.kind == UnitKind.EVENT) != (neighbouring == Neighbouring.EVENT):
        raise _err(source, "neighbouring",
                   "an event-level unit needs neighbouring 'event', and only an event-level unit may use it")

    multi = data.get("statistics") is not None
    statistics: tuple[StatisticSpec, ...] = ()
    key_sets: tuple[Any, ...] = ()
    if multi:
        for f in ("metric", "value", "mean"):
            if data.get(f) is not None:
                raise _err(source, f, "a release with 'statistics' declares its value columns per "
                           "statistic: drop 'metric', 'value' and 'mean'")
        metric = None
        key_sets = _key_sets(data.get("group_by"), source, run_date)
        group_by = key_sets[0] if len(key_sets) == 1 and isinstance(key_sets[0], PublicKeys) else None
        statistics = _statistics(data["statistics"], source)
    else:
        metric = _require(data, "metric", source)
        if metric not in METRICS:
            raise _err(source, "metric", f"must be one of {list(METRICS)}")
        group_by = (_public_keys(data["group_by"], source, run_date=run_date)
                    if data.get("group_by") is not None else None)
        key_sets = () if group_by is None else (group_by,)
    max_cells = _int(data.get("max_cells", DEFAULT_MAX_CELLS), source, "max_cells")
    if max_cells > HARD_MAX_CELLS:
        raise _err(source, "max_cells", f"must be <= {HARD_MAX_CELLS}")
    if multi:
        n_cells = len(statistics)
        for k in key_sets:  # private key columns count as their most selected keys
            n_cells *= k.max_keys if isinstance(k, PrivateKeys) else len(k.values)
    else:
        n_cells = 1 if group_by is None else len(group_by.values)
    if n_cells > max_cells:
        raise _err(source, "group_by.public_keys",
                   f"{n_cells} cells (key tuples x statistics) exceed max_cells={max_cells}: every "
                   "cell shares the budget and "
                   "sparse, high-dimensional segments are mostly noise; coarsen the keys or "
                   "pre-register a smaller release")

    # value column and clamp bounds
    value: Optional[ValueSpec] = None
    needs_value = metric in ("sum", "mean")
    if needs_value:
        v = _mapping(_require(data, "value", source), source, "value")
        _check_keys(v, {"column", "lower", "upper"}, source, "value.")
        column = _column(_require(v, "column", source, "value."), source, "value.column")
        try:
            lo = to_fraction(_require(v, "lower", source, "value."), "value.lower")
            hi = to_fraction(_require(v, "upper", source, "value."), "value.upper")
        except DpSparkError as exc:
            raise _err(source, "value", str(exc)) from None
        if lo > hi:
            raise InvalidBoundsError(f"{source}: field 'value': lower is above upper")
        e_lo, e_hi, k = _grid_align(lo, hi)
        value = ValueSpec(column=column, lower=e_lo, upper=e_hi, declared_lower=lo, declared_upper=hi,
                          grid_exponent=k)
    elif data.get("value") is not None and not multi:
        raise _err(source, "value", f"metric '{metric}' reads no value column")

    b = _mapping(_require(data, "bounds", source), source, "bounds")
    _check_keys(b, {"max_rows_per_unit", "max_partitions_per_unit", "max_rows_per_partition"}, source, "bounds.")
    k_rows = _int(_require(b, "max_rows_per_unit", source, "bounds."), source, "bounds.max_rows_per_unit")
    l0 = _int(b.get("max_partitions_per_unit", 1), source, "bounds.max_partitions_per_unit")
    linf = b.get("max_rows_per_partition")
    linf = None if linf is None else _int(linf, source, "bounds.max_rows_per_partition")
    n_keys = (n_cells // len(statistics)) if multi else (1 if group_by is None else len(group_by.values))
    if n_keys == 1 and not (multi and key_sets) and group_by is None and l0 != 1:
        raise _err(source, "bounds.max_partitions_per_unit", "must be 1 without group_by")
    if l0 > n_keys:
        l0 = n_keys  # a unit cannot touch more cells (key tuples) than exist
    if neighbouring == Neighbouring.EVENT and (k_rows != 1 or l0 != 1 or (linf or 1) != 1):
        raise _err(source, "bounds", "event-level releases bound each event to one row: set all bounds to 1")
    try:
        bounds = ContributionBounds(
            max_rows_per_unit=k_rows,
            max_partitions_per_unit=l0,
            max_rows_per_partition=linf,
            lower=None if value is None else value.lower,
            upper=None if value is None else value.upper,
        )
    except DpSparkError as exc:
        raise _err(source, "bounds", str(exc)) from None

    bud = _mapping(_require(data, "budget", source), source, "budget")
    _check_keys(bud, {"id", "measure", "epsilon", "rho", "delta"}, source, "budget.")
    budget_id = _require(bud, "id", source, "budget.")
    if not isinstance(budget_id, str) or not _NAME_RE.match(budget_id):
        raise _err(source, "budget.id", "must be an identifier")
    measure = _require(bud, "measure", source, "budget.")
    if measure not in ("pure_dp", "zcdp"):
        raise _err(source, "budget.measure",
                   "must be 'pure_dp' (discrete Laplace) or 'zcdp' (discrete Gaussian)")
    charge = _budget_charge(bud, measure, source)

    mean: Optional[MeanOptions] = None
    if metric == "mean":
        m = _mapping(data.get("mean") or {}, source, "mean")
        _check_keys(m, {"assumed_group_size", "min_count", "assumed_mean"}, source, "mean.")
        assumed_mean = None
        if m.get("assumed_mean") is not None:
            assumed_mean = _fraction(m["assumed_mean"], source, "mean.assumed_mean")
            if not value.declared_lower <= assumed_mean <= value.declared_upper:
                raise _err(source, "mean.assumed_mean", "must lie within the value's [lower, upper]")
        mean = MeanOptions(
            assumed_group_size=_int(m.get("assumed_group_size", 100), source, "mean.assumed_group_size"),
            min_count=_int(m.get("min_count", 1), source, "mean.min_count"),
            assumed_mean=assumed_mean,
        )
    elif data.get("mean") is not None:
        raise _err(source, "mean", "only a 'mean' metric takes mean options")

    try:
        confidence = to_fraction(data.get("confidence", "0.95"), "confidence")
    except DpSparkError:
        raise _err(source, "confidence", "must be a number") from None
    if not (Fraction(1, 2) <= confidence < 1):
        raise _err(source, "confidence", "must be in [0.5, 1)")

    ex = data.get("on_exhausted", {"policy": "reject"})
    if isinstance(ex, str):
        ex = {"policy": ex}
    ex = _mapping(ex, source, "on_exhausted")
    _check_keys(ex, {"policy", "fallback"}, source, "on_exhausted.")
    policy = ex.get("policy", "reject")
    if policy not in EXHAUSTION_POLICIES:
        raise _err(source, "on_exhausted.policy", f"must be one of {list(EXHAUSTION_POLICIES)}")
    fallback = ex.get("fallback")
    if policy == "degrade":
        if not isinstance(fallback, str) or not fallback:
            raise _err(source, "on_exhausted.fallback", "'degrade' needs the path of a coarser spec")
    elif fallback is not None:
        raise _err(source, "on_exhausted.fallback", "only 'degrade' takes a fallback")

    private = [k for k in key_sets if isinstance(k, PrivateKeys)]
    spends_delta = getattr(charge, "delta", 0) > 0
    if private and not spends_delta:
        raise _err(source, "budget.delta",
                   "a release with private_keys spends delta (the probability that a key created by one "
                   "unit alone is published): declare it beside rho or epsilon, e.g. budget: {id: ..., "
                   "measure: zcdp, rho: 0.5, delta: 1e-8} (a zcdp charge given as {epsilon, delta} "
                   "converts rho and cannot carry it)")
    if spends_delta and not private:
        raise _err(source, "budget.delta", "only a release with private_keys spends delta; drop it")
    needed = [unit.column]
    if multi:
        needed.extend(k.column for k in key_sets)
        needed.extend(s.column for s in statistics if s.column is not None)
        if unit.column in [k.column for k in key_sets] + [s.column for s in statistics]:
            raise _err(source, "privacy_unit.column", "the unit column cannot be a group-by or value column")
    if group_by is not None and not multi:
        needed.append(group_by.column)
    if value is not None:
        needed.append(value.column)
    cols = data.get("columns")
    if cols is None:
        columns = tuple(dict.fromkeys(needed))
    else:
        if not isinstance(cols, list) or not cols:
            raise _err(source, "columns", "must be a non-empty list of column names")
        columns = tuple(_column(c, source, "columns") for c in cols)
        missing = [c for c in needed if c not in columns]
        if missing:
            raise _err(source, "columns", "must include the unit, group-by and value columns")
    where = None
    if data.get("where") is not None:
        where = check_where(data["where"], columns, source)
    if not multi:  # the single-metric form runs as its rewrite
        statistics = legacy_statistics(metric, value, mean)
    min_group = _min_group_size(data.get("min_group_size"), source, metric, key_sets, statistics)
    return ReleaseSpec(
        name=name, family=family, description=description, dataset=dataset, unit=unit,
        neighbouring=neighbouring, metric=metric, group_by=group_by, value=value, bounds=bounds,
        budget_id=budget_id, charge=charge, mean=mean, confidence=confidence,
        on_exhausted=ExhaustionPolicy(policy=policy, fallback=fallback), columns=columns,
        max_cells=max_cells, min_group_size=min_group, source=source,
        statistics=statistics, key_sets=key_sets, where=where,
    )


def legacy_statistics(metric: str, value: Optional[ValueSpec], mean: Optional[MeanOptions]) -> tuple[StatisticSpec, ...]:
    """The ``statistics`` a single-``metric`` spec is rewritten into (what it publishes, under
    the names it always published): ``count`` -> a count; ``distinct_units`` -> a distinct
    count of units; ``sum`` -> a sum of ``value``; ``mean`` -> a count and a mean of ``value``
    (one noisy row count, shared), with the mean's options."""
    from dp_spark.statistics.moments import DEFAULT_GROUP_SIZE

    n = mean.assumed_group_size if mean is not None else DEFAULT_GROUP_SIZE
    size = (("assumed_group_size", n),)
    if metric in ("count", "distinct_units"):
        return (StatisticSpec(name=metric, kind=metric, options=size),)
    clamp = align_clamp(value.column, value.declared_lower, value.declared_upper)
    if metric == "sum":
        return (StatisticSpec(name="sum", kind="sum", clamp=clamp, options=size),)
    opts = {"assumed_group_size": n, "min_count": mean.min_count,
            **({} if mean.assumed_mean is None else {"assumed_mean": mean.assumed_mean})}
    return (StatisticSpec(name="count", kind="count", options=size),
            StatisticSpec(name="mean", kind="mean", clamp=clamp, options=tuple(sorted(opts.items()))))


#: the statistic kinds ``min_group_size: {strategy: merge_other}`` can combine over merged keys
MERGEABLE_KINDS = ("count", "distinct_units", "mean")


def _min_group_size(raw: Any, source: str, metric: Optional[str], key_sets, statistics) -> Optional[MinGroupSize]:
    """``min_group_size`` on either form: thresholds the group-size statistic (a count or a
    distinct count of units: ``ReleaseSpec.group_size_statistic``); ``merge_other`` needs one
    public key column and statistics it can combine."""
    public = [v for k in key_sets if isinstance(k, PublicKeys) for v in k.values]
    rule = min_group_size_from_dict(raw, source, metric=metric, public_keys=public)
    if rule is None or metric is not None:
        return rule
    if not any(s.kind in ("count", "distinct_units") for s in statistics):
        raise _err(source, "min_group_size", "needs a noisy group size: add a 'count' or 'distinct_units' "
                   "statistic (its noisy value is thresholded)")
    if rule.strategy == "merge_other":
        if len(key_sets) != 1 or not isinstance(key_sets[0], PublicKeys):
            raise _err(source, "min_group_size.strategy", "merge_other needs exactly one group-by column, "
                       "with public keys (use suppress)")
        other = [s.name for s in statistics if s.kind not in MERGEABLE_KINDS]
        if other:
            raise _err(source, "min_group_size.strategy", f"merge_other combines {list(MERGEABLE_KINDS)} "
                       f"statistics only, not '{other[0]}' (use suppress)")
    return rule


def _key_sets(raw: Any, source: str, run_date: Optional[date] = None) -> tuple[PublicKeys, ...]:
    """``group_by``: absent (one global cell), one mapping, or a list of mappings."""
    if raw is None:
        return ()
    entries = raw if isinstance(raw, list) else [raw]
    if not entries:
        raise _err(source, "group_by", "must list at least one column (or be left out)")
    out = [_public_keys(e, source, f"group_by[{i}]", run_date, allow_private=True)
           for i, e in enumerate(entries)]
    cols = [k.column for k in out]
    if len(set(cols)) != len(cols):
        raise _err(source, "group_by", "a key column is listed twice")
    shares = {k.share for k in out if isinstance(k, PrivateKeys) and k.share is not None}
    if len(shares) > 1:
        raise _err(source, "group_by", "private key columns are selected jointly with one share of "
                   "the charge: give 'share' once, or the same value on each")
    return tuple(out)


def _statistics(raw: Any, source: str) -> tuple[StatisticSpec, ...]:
    if not isinstance(raw, list) or not raw:
        raise _err(source, "statistics", "must be a non-empty list")
    out: list[StatisticSpec] = []
    for i, entry in enumerate(raw):
        p = f"statistics[{i}]"
        e = _mapping(entry, source, p)
        name = _require(e, "name", source, f"{p}.")
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise _err(source, f"{p}.name", "must be an identifier of letters, digits and '_'")
        kind_name = _require(e, "kind", source, f"{p}.")
        try:
            kind = kind_of(str(kind_name))
        except ConfigError as exc:
            raise _err(source, f"{p}.kind", str(exc)) from None

        def err(f: str, problem: str, _p: str = p) -> ConfigError:
            return _err(source, f"{_p}.{f}", problem)

        allowed = {"name", "kind", "weight"} | set(kind.fields) | (
            {"column", "lower", "upper"} if kind.needs_value else set())
        _check_keys(e, allowed, source, f"{p}.")
        clamp = None
        if kind.needs_value:
            column = _column(_require(e, "column", source, f"{p}."), source, f"{p}.column")
            try:
                lo = to_fraction(_require(e, "lower", source, f"{p}."), f"{p}.lower")
                hi = to_fraction(_require(e, "upper", source, f"{p}."), f"{p}.upper")
            except DpSparkError as exc:
                raise _err(source, p, str(exc)) from None
            if lo >= hi:
                raise InvalidBoundsError(f"{source}: field '{p}': lower must be below upper")
            clamp = align_clamp(column, lo, hi)
        weight = None
        if e.get("weight") is not None:
            weight = _fraction(e["weight"], source, f"{p}.weight")
            if weight <= 0:
                raise _err(source, f"{p}.weight", "must be > 0")
        options = kind.parse(e, err, clamp)
        out.append(StatisticSpec(name=name, kind=kind.kind, clamp=clamp, weight=weight,
                                 options=tuple(sorted(options.items()))))
    names = [s.name for s in out]
    if len(set(names)) != len(names):
        raise _err(source, "statistics", "statistic names must be distinct")
    if any(s.weight is None for s in out) and any(s.weight is not None for s in out):
        raise _err(source, "statistics", "give 'weight' on every statistic or on none")
    return tuple(out)


def load_release_spec(path: str | os.PathLike, *, run_date: Optional[date] = None) -> ReleaseSpec:
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
