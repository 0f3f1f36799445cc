"""The validated release spec as the engine reads it: frozen dataclasses built from the
models of :mod:`dp_spark.spec.release` (key sets resolved against the job's date, clamps
aligned to the grid, the charge converted, the single-``metric`` form rewritten), and its
identity: :meth:`ReleaseSpec.canonical` and :meth:`ReleaseSpec.version`, from which every
release id is derived. The canonical form is byte-stable: ``tests/unit/golden_release_ids.json``.

Nothing here imports pyspark.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from datetime import date
from fractions import Fraction
from typing import Any, Optional

from dp_spark.core.budget import Budget
from dp_spark.errors import ConfigError
from dp_spark.statistics.postprocess import MinGroupSize
from dp_spark.statistics.base import StatisticSpec, align_clamp
from dp_spark.core.units import ContributionBounds, Neighbouring, PrivacyUnit

__all__ = ["PublicKeys", "PrivateKeys", "KeyTable", "TableKeys", "ValueSpec", "MeanOptions", "ExhaustionPolicy", "ReleaseSpec",
           "StreamSpec",
           "DEFAULT_SELECTION_SHARE", "key_set_canonical", "bounds_to_json", "grid_align", "bucket_of",
           "bucketed"]


@dataclass(frozen=True)
class PublicKeys:
    """The declared, public set of group keys. Keys are never read from the data."""

    column: str
    kind: str  # "string" | "date"
    values: tuple[str, ...]
    #: a derived date key (``{column: day, bucket: week}``): "week" (ISO weeks, Monday to
    #: Sunday, keys "2026-W45") or "month" (keys "2026-11"); ``values`` are the buckets that the
    #: declared days cover, ``days`` the declared days (rows on other days are dropped)
    bucket: Optional[str] = None
    days: tuple[str, ...] = ()
    #: keys read from a public key table (``public_keys: {table, column, where}``): the table
    #: declared, and the pinned (Delta table id, version) they were read at; ``values`` are then
    #: its distinct non-null values of the column, as strings, sorted
    table: Optional["KeyTable"] = None
    pin: Optional[tuple[str, int]] = None

    def restricted_to(self, keys: tuple[str, ...]) -> "PublicKeys":
        missing = [k for k in keys if k not in self.values]
        if missing:
            raise ConfigError("requested keys are outside the declared public key set")
        bucket = self.bucket
        if bucket is not None:
            days = tuple(d for d in self.days if bucket_of(d, bucket) in keys)
            return replace(self, values=tuple(keys), days=days)
        return replace(self, values=tuple(keys))

    def bucket_index(self) -> dict[str, int]:
        """A bucketed key set: each declared day -> the index of its bucket in ``values``."""
        if self.bucket is None:
            raise ConfigError("this key set has no bucket")
        at = {v: i for i, v in enumerate(self.values)}
        return {d: at[bucket_of(d, self.bucket)] for d in self.days}


def bucket_of(day: str, bucket: str) -> str:
    """The key of an ISO day's bucket: "week" -> its ISO week "YYYY-Www" (weeks run Monday to
    Sunday; the year is the ISO week-numbering year), "month" -> "YYYY-MM"."""
    d = date.fromisoformat(day)
    if bucket == "week":
        y, w, _ = d.isocalendar()
        return f"{y}-W{w:02d}"
    if bucket == "month":
        return f"{d.year}-{d.month:02d}"
    raise ConfigError("a date bucket is 'week' or 'month'")


def bucketed(column: str, days: tuple[str, ...], bucket: str) -> PublicKeys:
    """The public key set of ``days`` derived into ``bucket`` (the buckets they cover, in order)."""
    return PublicKeys(column=column, kind="date", values=tuple(dict.fromkeys(bucket_of(d, bucket) for d in days)),
                      bucket=bucket, days=tuple(days))


@dataclass(frozen=True)
class KeyTable:
    """``public_keys: {table, column, where}``: a group-by column's public keys are the distinct
    non-null values of ``column`` in the dataset ``dataset`` (declared ``public: true`` in the env
    file), restricted by ``where`` (a row-wise predicate on that table), read at a pinned Delta
    version when the release is validated."""

    dataset: str
    column: str
    where: Optional[str] = None

    def canonical(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "column": self.column, "where": self.where}


@dataclass(frozen=True)
class TableKeys:
    """A group-by column whose public keys are still to be read from its key table (the spec as
    written: the engine reads the keys when it validates the release, :meth:`ReleaseSpec.with_table_keys`).
    Its keys, and so the cells of the release, are unknown until then."""

    column: str
    table: KeyTable
    kind: str = "table"


@dataclass(frozen=True)
class PrivateKeys:
    """A group-by column whose keys are NOT declared: they are selected privately from the
    bounded data (``group_by: [{column: region, private_keys: {max_keys: 500}}]``).

    ``max_keys``: at most this many values of the column are published (the selected keys
    with the largest noisy counts). ``share``: the fraction of the release's charge spent on
    selecting the keys (default :data:`DEFAULT_SELECTION_SHARE`); the statistics share the rest.
    ``mechanism``: the noise of the threshold, ``laplace`` (None: the default), ``gaussian``
    (zCDP) or ``cheaper``. Several private columns are selected jointly, as tuples (see
    :mod:`dp_spark.statistics.selection`)."""

    column: str
    max_keys: int
    share: Optional[Fraction] = None
    kind: str = "private"
    mechanism: Optional[str] = None


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
class StreamSpec:
    """``stream: {horizon_days, start}``: running totals under continual release over a
    declared horizon (:mod:`dp_spark.mechanisms.tree`): day ``start`` is day 1."""

    horizon_days: int
    start: str  # ISO date

    def canonical(self) -> dict[str, Any]:
        return {"horizon_days": self.horizon_days, "start": self.start}


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
    #: the bounds as written, when reading a key table capped L0 at its cells
    #: (:meth:`with_table_keys`): the canonical form, and so the spec version, keep them
    declared_bounds: Optional[ContributionBounds] = None
    # confidence: {simultaneous: true}: each cell also gets a band, all of a statistic's cells
    # inside their bands together with probability >= confidence (QueryPlan.noise)
    simultaneous: bool = False
    #: ``stream: {horizon_days, start}``: each cell is the running total through its day,
    #: published through the binary-tree mechanism (one charge for the horizon)
    stream: Optional[StreamSpec] = None
    #: a day release of a series (:func:`dp_spark.schedule.day_spec`): the day it publishes,
    #: its version's key in the ledger (a day superseded only by that same day). Not part of
    #: the release's identity: its canonical form, and so its release id, leave it out
    series_key: Optional[str] = None

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
                "group_by": [key_set_canonical(k) for k in self.key_sets],
                "statistics": [s.canonical() for s in self.statistics],
                "bounds": bounds_to_json(self.declared_bounds or self.bounds),
                "budget_id": self.budget_id,
                "charge": self.charge.to_json(),
                "confidence": str(self.confidence),
                "columns": list(self.columns),
                **({} if self.min_group_size is None else {"min_group_size": self.min_group_size.to_json()}),
                # only when set: specs without simultaneous bands keep their release ids
                **({"simultaneous": True} if self.simultaneous else {}),
                # only when set: specs without a stream keep their release ids
                **({} if self.stream is None else {"stream": self.stream.canonical()}),
            }
        return {
            "name": self.name,
            "family": self.family,
            "dataset": self.dataset,
            "unit": {"kind": self.unit.kind.value, "column": self.unit.column},
            "neighbouring": self.neighbouring.value,
            "metric": self.metric,
            # keys from a key table: the declaration (new specs only; old ones keep their shape)
            "group_by": key_set_canonical(self.key_sets[0])
            if self.key_sets and getattr(self.key_sets[0], "table", None) is not None
            else None
            if self.group_by is None
            else {"column": self.group_by.column, "kind": self.group_by.kind, "keys": list(self.group_by.values),
                  # only when set: specs without a bucket keep their release ids
                  **({} if self.group_by.bucket is None
                     else {"bucket": self.group_by.bucket, "days": list(self.group_by.days)})},
            "value": None
            if self.value is None
            else {"column": self.value.column, "lower": str(self.value.lower), "upper": str(self.value.upper),
                  "grid_exponent": self.value.grid_exponent},
            "bounds": bounds_to_json(self.declared_bounds or self.bounds),
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
            **({"simultaneous": True} if self.simultaneous else {}),
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
    def table_key_sets(self) -> tuple[tuple[int, TableKeys], ...]:
        """The group-by columns whose keys are still to be read from a key table: (position in
        ``key_sets``, declaration). Empty once :meth:`with_table_keys` has read them."""
        return tuple((i, k) for i, k in enumerate(self.key_sets) if isinstance(k, TableKeys))

    @property
    def key_table_pins(self) -> tuple[tuple[str, int], ...]:
        """The (Delta table id, version) each key table was read at, in ``group_by`` order
        (empty for a spec without key tables: its release ids stay what they were)."""
        return tuple(k.pin for k in self.key_sets if isinstance(k, PublicKeys) and k.pin is not None)

    def key_table_field(self, i: int) -> str:
        """The field path of the key table of ``key_sets[i]``, as errors name it."""
        return "group_by.public_keys.table" if self.metric is not None else f"group_by[{i}].public_keys.table"

    def cells_with(self, sizes: dict[int, int]) -> int:
        """The cells (the single-metric form: key tuples; else key tuples x statistics) once the
        key tables at ``sizes``' positions hold that many keys each."""
        n = 1
        for i, k in enumerate(self.key_sets):
            n *= (sizes[i] if isinstance(k, TableKeys) else k.max_keys if isinstance(k, PrivateKeys)
                  else len(k.values))
        return n if self.metric is not None else n * len(self.statistics)

    def check_key_table_sizes(self, sizes: dict[int, int]) -> None:
        """Refuse key tables that hold no key, or so many that the cells exceed ``max_cells``
        (before any charge; the message has the sizes and the cap, never a key)."""
        for i, n in sizes.items():
            if n == 0:
                raise ConfigError(f"{self.source}: field '{self.key_table_field(i)}': the key table holds no key "
                                  "(no non-null value of its column matches its where): a release needs one cell at "
                                  "least")
        cells = self.cells_with(sizes)
        if cells > self.max_cells:
            held = ", ".join(f"{self.key_table_field(i)} holds {n} keys" for i, n in sorted(sizes.items()))
            raise ConfigError(
                f"{self.source}: {held}: {cells} cells (key tuples x statistics) exceed max_cells={self.max_cells}; "
                "restrict the key table with public_keys.where, or raise max_cells (every cell shares the budget)")

    def with_table_keys(self, read: dict[int, tuple[tuple[str, ...], str, int]]) -> "ReleaseSpec":
        """The spec with its key tables read: ``read[i]`` is (the keys, the Delta table id, the
        version read) of ``key_sets[i]``; each becomes a :class:`PublicKeys` like any declared key
        set, its L0 capped at the cells as a declared set's is. Refused (ConfigError: sizes,
        never a key) when a key table is empty or the cells exceed ``max_cells``."""
        if set(read) != {i for i, _ in self.table_key_sets}:
            raise ConfigError(f"{self.source}: internal: every key table is read, and only those")
        self.check_key_table_sizes({i: len(v[0]) for i, v in read.items()})
        key_sets = list(self.key_sets)
        for i, (values, table_id, version) in read.items():
            k = key_sets[i]
            if len(set(values)) != len(values):
                raise ConfigError(f"{self.source}: internal: the keys read from a key table are not distinct")
            key_sets[i] = PublicKeys(column=k.column, kind="string", values=tuple(values), table=k.table,
                                     pin=(str(table_id), int(version)))
        mgs = self.min_group_size
        if mgs is not None and any(mgs.other_key in key_sets[i].values for i in read):
            raise ConfigError(f"{self.source}: field 'min_group_size.other_key' is a key of the key table: choose "
                              "another other_key")
        single = key_sets[0] if len(key_sets) == 1 and isinstance(key_sets[0], PublicKeys) else None
        out = replace(self, key_sets=tuple(key_sets), group_by=single)
        # a unit cannot touch more cells than exist (with windows: (key tuple, window) cells)
        l0 = min(self.bounds.max_partitions_per_unit, out.cells * len(out.windows))
        return replace(out, bounds=replace(self.bounds, max_partitions_per_unit=l0), declared_bounds=self.bounds)

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
    def selection_mechanism(self) -> str:
        """The private key selection's threshold noise: ``laplace`` unless a private column
        says ``gaussian`` or ``cheaper`` (see :mod:`dp_spark.statistics.selection`)."""
        named = {k.mechanism for k in self.private_key_sets if k.mechanism is not None}
        return named.pop() if named else "laplace"

    @property
    def cells(self) -> int:
        """The number of key tuples (cells per statistic); with private keys, the most there
        can be (public key tuples x the most private key tuples selected). Unknown, and
        refused, while a key table is unread (:meth:`with_table_keys`)."""
        self._require_keys_read()
        n = 1
        for k in self.public_key_sets:
            n *= len(k.values)
        return n * self.max_private_tuples

    def _require_keys_read(self) -> None:
        if self.table_key_sets:
            raise ConfigError(f"{self.source}: the keys of '{self.key_table_field(self.table_key_sets[0][0])}' are "
                              "read from the key table when the release is validated against an env (publish); "
                              "the cells are not known before")

    @property
    def keys(self) -> tuple[str, ...]:
        """The canonical ``key`` string of every cell, in order (known before the data only
        when every group-by column has public keys)."""
        if self.private_key_sets:
            raise ConfigError(f"{self.source}: the keys of a release with private_keys are selected "
                              "from the data at publication; they are not known in advance")
        self._require_keys_read()
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
        dated = [k for k in self.public_key_sets if k.kind == "date" and k.bucket is None]
        return dated[0] if len(dated) == 1 else None

    @property
    def windows(self) -> tuple[int, ...]:
        """The distinct window lengths (days) of the statistics, ascending; 1 for a statistic
        without ``window`` (its cell covers its own day). ``(1,)``: no rolling window."""
        return tuple(sorted({s.window or 1 for s in self.statistics})) or (1,)

    @property
    def windowed(self) -> bool:
        return self.windows != (1,)

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
        if self.stream is not None:  # a stream's trees are calibrated over its horizon: every point alike
            return out
        # with rolling windows a unit has (day, window) cells: one per window length and day
        l0 = min(self.bounds.max_partitions_per_unit, out.cells * len(out.windows))
        return replace(out, bounds=replace(self.bounds, max_partitions_per_unit=l0))


def key_set_canonical(k: Any) -> dict[str, Any]:
    table = getattr(k, "table", None)
    if table is not None:  # the declaration, read or not (the release id adds the pinned version)
        return {"column": k.column, "kind": "table", "table": table.canonical()}
    if isinstance(k, PrivateKeys):
        out = {"column": k.column, "kind": "private", "max_keys": k.max_keys,
               "share": None if k.share is None else str(k.share)}
        if k.mechanism not in (None, "laplace"):  # only then: specs without it keep their release ids
            out["mechanism"] = k.mechanism
        return out
    if k.bucket is not None:  # only when set: key sets without a bucket keep their release ids
        return {"column": k.column, "kind": k.kind, "keys": list(k.values), "bucket": k.bucket, "days": list(k.days)}
    return {"column": k.column, "kind": k.kind, "keys": list(k.values)}


def bounds_to_json(b: ContributionBounds) -> dict[str, Any]:
    return {
        "max_rows_per_unit": b.max_rows_per_unit,
        "max_partitions_per_unit": b.max_partitions_per_unit,
        "max_rows_per_partition": b.max_rows_per_partition,
        "lower": None if b.lower is None else str(b.lower),
        "upper": None if b.upper is None else str(b.upper),
    }




def grid_align(declared_lower: Fraction, declared_upper: Fraction) -> tuple[Fraction, Fraction, int]:
    """Round the clamp bounds outward to the fixed-point grid (multiples of 2^(k+1)).

    The grid exponent k depends on the public bounds only. Aligning to 2^(k+1) makes the
    lower bound, the upper bound and their midpoint exact grid points, so the sensitivity
    derived from the enforced bounds is exactly what the Spark path can produce.
    """
    c = align_clamp("", declared_lower, declared_upper)
    return c.lower, c.upper, c.grid_exponent
