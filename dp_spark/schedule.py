"""Scheduled daily refresh and backfill of a day-keyed release (the DAU trend).

A day-keyed release (``group_by`` over declared ``dates``) is refreshed one day at a time:
the day's spec is ``spec.for_keys((day,), name_suffix="_YYYYMMDD")`` -- one cell, the same
family, so every day appends to the same Delta table (the trend keeps growing) -- and is
published through :meth:`dp_spark.engine.Engine.publish`, which gives it the exactly-once
protocol: a rerun of a day on the same input snapshot is the same release id, served from the
ledger (no charge, no new noise).

What this module adds on top of the engine is the *schedule's* view of a day::

    day spec -> current snapshot (pin_snapshot) -> release id it would get now
      -> the ledger knows that id?            -> engine.publish (cache hit / heal / resume)
      -> the family table has a release of this
         day spec (same spec version, mode) for
         another snapshot?  the day's input fingerprint now == the one recorded with it?
           yes (same code)                    -> "unchanged": served by that release, nothing
                                                 charged, no new noise
           no                                 -> REPORTED as "input_changed"; republished only
                                                 with republish=True (a new charge)
           none recorded (an older release)   -> REPORTED as "snapshot_changed", as before
           same snapshot, other code version  -> REPORTED as "code_changed"
      -> otherwise                            -> engine.publish (a new release, one charge),
                                                 then its input fingerprint is recorded

The input fingerprint of a day (:mod:`dp_spark.core.fingerprint`, computed by
:mod:`dp_spark.backends.fingerprint` in one aggregation, for every day of a backfill at once)
is an order-independent, salt-keyed hash of the rows whose date key reaches the day's cells,
restricted to the columns the spec reads (:func:`fingerprint_columns`): an append of other
days, a rewrite of the same rows in another order or partitioning, or a column the spec does
not read leave it unchanged. It lives in the ledger (``dp_fingerprints``) and is compared,
never logged, printed, audited or written to a Delta table.

Every :class:`DayResult` carries the budget's window (cap, spent, remaining, window bounds)
after the day, so a scheduled job's log shows what is left. Nothing here reads or logs a data
value before the engine has committed it; the rows a result carries are the published cells
read back from the release table.

The command line is ``dp-spark refresh`` / ``backfill`` (:mod:`dp_spark.cli`, through
:func:`dp_spark.commands.refresh`; ``jobs/daily_refresh.py`` is the same command); a day is an
ISO date, ``today`` or ``yesterday`` (UTC, :func:`parse_day`). This module imports nothing of
the CLI.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timedelta, timezone
from typing import Any, Callable, Optional, Sequence

from dp_spark.core.budget import Budget
from dp_spark.config import ReleaseSpec
from dp_spark.errors import ConfigError, DpSparkError

log = logging.getLogger("dp_spark.schedule")

__all__ = [
    "SCHEDULES",
    "ScheduleCost",
    "schedule_cost",
    "runs_per_window",
    "BudgetWindow",
    "DayResult",
    "InputFingerprints",
    "PriorRelease",
    "backfill",
    "daily_refresh",
    "day_spec",
    "fingerprint_columns",
    "format_day",
    "parse_day",
    "prior_releases",
    "source_days",
    "today_utc",
]

#: statuses of a day whose release is in the table and committed after the call
SERVED = frozenset({"published", "cache_hit", "healed", "republished", "degraded", "returned_existing",
                    "unchanged"})
#: statuses of a day that already has a release of another snapshot (or code) whose input
#: rows changed (or cannot be compared), left as it is
STALE = frozenset({"input_changed", "snapshot_changed", "code_changed"})
#: a day that failed, or was not attempted because an earlier day failed
FAILED = frozenset({"error", "skipped"})


# --------------------------------------------------------------------------------------
# What a schedule costs per budget window (public parameters only)
# --------------------------------------------------------------------------------------
#: how often a scheduled job runs, and the shortest time between two runs (days)
SCHEDULES = {"daily": 1, "weekly": 7, "monthly": 28}


def runs_per_window(schedule: str, window: Any) -> Optional[int]:
    """The most runs of ``schedule`` that one window of a budget can hold (``window``: its
    :class:`~dp_spark.ledger.policy.WindowPolicy`); None for a budget without a window, which
    no recurring schedule fits. A UTC day holds 1 run; a calendar month (up to 31 days,
    half-open) ceil(31 / period); a rolling window of N days counts the entries at or after
    now - N days, both ends included: floor(N / period) + 1."""
    if schedule not in SCHEDULES:
        raise ConfigError(f"a schedule is one of {sorted(SCHEDULES)}")
    period = SCHEDULES[schedule]
    if window.kind == "none":
        return None
    if window.kind == "daily":
        return 1
    if window.kind == "monthly":
        return 1 if schedule == "monthly" else -(-31 // period)
    return window.days // period + 1


@dataclass(frozen=True)
class ScheduleCost:
    """What the scheduled specs charged to one budget cost in one window, at most.

    ``items``: (spec name, runs or new days per window, charge of one, cost per window) each. A
    day-keyed spec (grouped by declared dates) is refreshed a day at a time, each day charged
    once, whatever the schedule: its cost per window is the most days a window holds times
    its charge. Any other spec is a new release at each run (its input changed): the most
    runs a window holds times its charge. ``runs`` None: the budget has no window."""

    budget_id: str
    window: str
    cap: Budget
    items: tuple
    total: Optional[Budget]

    @property
    def fits(self) -> bool:
        return self.total is not None and self.total.fits_in(self.cap)


def schedule_cost(jobs: list, policies: dict) -> list[ScheduleCost]:
    """Per budget, the cost of ``jobs`` -- (ReleaseSpec, schedule) pairs: each spec run on its
    schedule -- against the cap of its policy (``policies``: budget id -> BudgetPolicy):
    nothing read, nothing charged."""
    by_budget: dict[str, list] = {}
    for spec, schedule in jobs:
        if spec.budget_id not in policies:
            raise ConfigError(f"{spec.source}: budget '{spec.budget_id}' is not declared in the policies")
        by_budget.setdefault(spec.budget_id, []).append((spec, schedule))
    out = []
    for budget_id, mine in by_budget.items():
        policy = policies[budget_id]
        items: list[tuple] = []
        total: Optional[Budget] = None
        unbounded = False
        for spec, schedule in mine:
            per_day = spec.date_key_set is not None
            n = runs_per_window("daily" if per_day else schedule, policy.window)
            if spec.stream is not None and n is not None:
                n = 1  # a stream is charged once, at its first refresh, for its whole horizon
            if n is None:
                unbounded = True
                items.append((spec.name, None, spec.charge, None))
                continue
            cost = spec.charge * n
            items.append((spec.name, n, spec.charge, cost))
            total = cost if total is None else total + cost
        w = policy.window
        label = w.kind if w.kind != "rolling" else f"rolling {w.days} days"
        out.append(ScheduleCost(budget_id=budget_id, window=label, cap=policy.cap, items=tuple(items),
                                total=None if unbounded else total))
    return out


# --------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BudgetWindow:
    """The budget's state after a day: exact amounts and the window they count in (UTC)."""

    budget_id: str
    measure: str
    cap: Budget
    spent: Budget
    remaining: Budget
    window: str  # none | daily | monthly | rolling N days
    window_start: Optional[datetime]
    window_end: Optional[datetime]
    entries: int
    # zcdp: the budget's statement delta, to show the spend as (epsilon, delta) too
    statement_delta: Optional[Any] = None

    def _spent_as_epsilon(self) -> str:
        if self.measure != "zcdp" or self.statement_delta is None or self.spent.is_zero():
            return ""
        from dp_spark.accountant import Accountant

        st = Accountant("zcdp", statement_delta=self.statement_delta).statement(self.spent)
        return f" = epsilon {st['epsilon']:.4g} at delta {st['delta']:.3g}"

    def describe(self) -> str:
        if self.window_start is None:
            span = "whole life (no window)"
        else:
            end = "now" if self.window.startswith("rolling") or self.window_end is None else \
                self.window_end.strftime("%Y-%m-%d")
            span = f"{self.window} window {self.window_start.strftime('%Y-%m-%d')}..{end}"
        return (f"{self.remaining} of cap {self.cap} (spent {self.spent}{self._spent_as_epsilon()}; "
                f"budget {self.budget_id}, {span})")


@dataclass(frozen=True)
class PriorRelease:
    """A release of a day spec found in the family table (metadata only, no values)."""

    release_id: str
    input_table_id: str
    input_version: int
    code_version: str
    created_at: Optional[datetime]


@dataclass(frozen=True)
class DayResult:
    """What the schedule did for one day.

    * ``status``: ``published`` | ``cache_hit`` | ``healed`` | ``degraded`` |
      ``returned_existing`` (from the engine), ``unchanged`` (a release of this day spec
      exists for another input snapshot, and the day's input rows are the same: it serves the
      day, nothing charged), ``republished`` (a stale day republished with
      ``republish=True``), ``input_changed`` (a release exists for another snapshot and the
      day's input rows changed), ``snapshot_changed`` (a release exists for another snapshot,
      recorded before input fingerprints: its rows cannot be compared) / ``code_changed``
      (another code version on the same input or the same rows) -- these three left as they
      are, nothing charged --, ``error`` or ``skipped`` (not attempted after an earlier error);
    * ``release_id``: the release in force for the day after the call (for a stale day: the
      published one); ``input_version``: the input version that release read;
    * ``current_release_id`` / ``current_input_version``: what a publish now would be / read;
    * ``published_release_id`` / ``published_input_version``: the earlier release of the day
      (unchanged, stale and republished days);
    * ``charge``: what this call spent (None when nothing was charged);
    * ``budget``: the window budget after the call (None if it could not be read);
    * ``rows``: the published cells of the day (read back after commit), else empty;
    * ``note``: for a stale day, why (never a fingerprint or a data value).
    """

    day: date
    release_name: str
    status: str
    release_id: Optional[str] = None
    input_version: Optional[int] = None
    current_release_id: Optional[str] = None
    current_input_version: Optional[int] = None
    published_release_id: Optional[str] = None
    published_input_version: Optional[int] = None
    charge: Optional[Budget] = None
    budget: Optional[BudgetWindow] = None
    note: str = ""
    error: Optional[str] = None
    rows: tuple[dict[str, Any], ...] = field(default=(), repr=False)

    @property
    def ok(self) -> bool:
        return self.status not in FAILED


# --------------------------------------------------------------------------------------
# Helpers (no data values)
# --------------------------------------------------------------------------------------
def day_spec(spec: ReleaseSpec, day: date) -> ReleaseSpec:
    """The spec restricted to one declared day: one cell, name ``<name>_YYYYMMDD``, same family.

    Raises ConfigError when the spec is not keyed by declared dates or the day is not one of
    them (before any data is read).
    """
    dated = spec.date_key_set
    if dated is None:
        raise ConfigError(f"{spec.source}: a daily refresh needs a release grouped by declared dates "
                          "(one group-by column with public_keys.dates)")
    if not isinstance(day, date) or isinstance(day, datetime):
        raise ConfigError("the day to refresh must be a date")
    iso = day.isoformat()
    if iso not in dated.values:
        raise ConfigError(f"{spec.source}: {iso} is outside the declared dates "
                          f"{dated.values[0]}..{dated.values[-1]}")
    if spec.stream is not None:  # a stream's point reads every day from its start through the day
        keys = dated.values[:dated.values.index(iso) + 1]
        out = spec.for_keys(keys, name_suffix=f"_{day.strftime('%Y%m%d')}", column=dated.column)
        # versioned under its day, like any day of a series: each release writes only the points
        # not written yet, and the family reads as the series of all of them (series_view)
        return replace(out, series_key=iso)
    out = spec.for_keys((iso,), name_suffix=f"_{day.strftime('%Y%m%d')}", column=dated.column)
    return replace(out, series_key=iso)  # its version is the day's: every day of the family stays current


def budget_window(engine, budget_id: str) -> Optional[BudgetWindow]:
    """The budget's window state from the ledger (None when the budget is not registered yet)."""
    try:
        st = engine.ledger.status(budget_id, full=False)  # O(1): the job path
    except DpSparkError:
        return None
    policy = getattr(engine, "policies", {}).get(budget_id)
    window = policy.window.describe() if policy is not None else "unknown"
    return BudgetWindow(budget_id=st.budget_id, measure=st.measure, cap=st.cap, spent=st.spent,
                        remaining=st.remaining, window=window, window_start=st.window_start,
                        window_end=st.window_end, entries=st.entries,
                        statement_delta=None if policy is None else policy.statement_delta)


def prior_releases(spark, path: str, dspec: ReleaseSpec, mode: str) -> list[PriorRelease]:
    """Releases of exactly this day spec (name, spec version, mode) in the family table at
    ``path``, newest first. Reads release metadata columns only, never values."""
    from pyspark.sql import functions as F

    from dp_spark.delta.release_table import table_exists

    if not table_exists(spark, path):
        return []
    df = (
        spark.read.format("delta").load(path)
        .where((F.col("release_name") == dspec.name) & (F.col("spec_version") == dspec.version())
               & (F.col("mode") == mode))
        .groupBy("release_id", "input_table_id", "input_version", "code_version")
        .agg(F.max("created_at").alias("created_at"))
        .orderBy(F.col("created_at").desc(), F.col("release_id"))
    )
    return [PriorRelease(release_id=r["release_id"], input_table_id=r["input_table_id"],
                         input_version=int(r["input_version"]), code_version=r["code_version"],
                         created_at=r["created_at"])
            for r in df.limit(100).collect()]


def _authorize(engine, dspec: ReleaseSpec) -> None:
    """The engine's access check for publishing ``dspec`` (refusals are audited), run before
    the schedule reads the input's snapshot or the release table."""
    access = getattr(engine, "access", None)
    if access is None:  # an engine without governance
        return
    from dp_spark.governance.access import authorize

    authorize(access, engine.principal, "publish", mode=engine.mode, spec=dspec, ledger=engine.ledger,
              budget_id=dspec.budget_id)


def _day_rows(result, iso: str) -> tuple[dict[str, Any], ...]:
    return tuple(r for r in (result.rows or ()) if r.get("key") == iso)


# --------------------------------------------------------------------------------------
# Input fingerprints (compared, never shown)
# --------------------------------------------------------------------------------------
def fingerprint_columns(spec: ReleaseSpec) -> tuple[str, ...]:
    """The columns a day's input fingerprint hashes: the ones the spec reads (unit, group-by,
    value and ``where`` columns, :func:`dp_spark.precheck.columns_read`), not the rest of
    ``columns``, which are selected but change no cell."""
    from dp_spark.precheck import columns_read

    return tuple(c for path, c in columns_read(spec) if not path.startswith("columns["))


def source_days(dspec: ReleaseSpec) -> tuple[str, ...]:
    """The date keys whose rows reach the cells of a day spec: the day itself, and with rolling
    windows every day a window of it covers."""
    from dp_spark.statistics.plan import date_feeds

    feeds = date_feeds(dspec)
    if feeds is not None:
        return tuple(feeds.days)
    dated = dspec.date_key_set
    assert dated is not None  # a day spec is keyed by its date
    return tuple(dated.values)


class InputFingerprints:
    """The input fingerprints of the days of a refresh or backfill (``days``: the day specs'
    source days are digested together, in ONE Spark aggregation per input snapshot, on the
    first day that needs one). Digests stay in memory; nothing here logs or returns more than
    the keyed fingerprint, which the caller compares or stores in the ledger."""

    def __init__(self, spec: ReleaseSpec, days: Sequence[date]):
        self._spec = spec
        self._days = tuple(days)
        self._digests: dict[tuple[str, str, int], dict[str, Any]] = {}

    def of(self, engine, dspec: ReleaseSpec, snap, day: date) -> Optional[str]:
        """The fingerprint of ``day``'s input rows on ``snap`` (None when the warehouse has no
        salt yet: nothing was ever published with it)."""
        from dp_spark.backends.fingerprint import day_digests
        from dp_spark.core.fingerprint import RowDigest, fingerprint, fingerprint_keys
        from dp_spark.salt import read_salt
        from dp_spark.spark import quiet_pyspark_error_logs

        salt = read_salt(engine.env.salt_file)
        if salt is None:
            return None
        mac_key, row_key = fingerprint_keys(salt)
        columns = fingerprint_columns(dspec)
        mine = source_days(dspec)
        at = (snap.location, snap.table_id, snap.version)
        digests = self._digests.get(at, {})
        if any(src not in digests for src in mine):
            wanted = set(mine)
            for d in self._days:
                if d != day:
                    try:
                        wanted.update(source_days(day_spec(self._spec, d)))
                    except ConfigError:
                        continue
            wanted -= set(digests)
            dated = dspec.date_key_set
            assert dated is not None
            log.info("day %s: %s: digesting the input rows of %d day(s) (one aggregation)",
                     day.isoformat(), dspec.name, len(wanted))
            with quiet_pyspark_error_logs():
                got = day_digests(snap.reader(engine.spark), date_column=dated.column, days=sorted(wanted),
                                  columns=columns, row_key=row_key)
            digests = {**digests, **got}
            self._digests[at] = digests
        total = RowDigest()
        for src in mine:
            total = total + digests[src]
        return fingerprint(total, mac_key, columns=columns, days=mine)


def _withdrawn(engine, family: str, release_id: str) -> bool:
    if engine.mode != "official":
        return False
    return any(v.release_id == release_id and v.state == "withdrawn" for v in engine.ledger.versions(family))


def _record_fingerprint(engine, dspec: ReleaseSpec, snap, day: date, release_id: str,
                        fps: InputFingerprints) -> None:
    """Record the input fingerprint of a release of ``day`` just served on ``snap`` (once per
    release: a release published before fingerprints gets one at its next cache hit). A
    failure is logged (class only) and leaves the day served: its next run records it."""
    try:
        if engine.ledger.fingerprint(release_id) is not None:
            return
        fp = fps.of(engine, dspec, snap, day)
        if fp is not None:
            engine.ledger.record_fingerprint(release_id, fp)
    except DpSparkError as exc:
        log.warning("day %s: the input fingerprint of release %s was not recorded (%s); the next run "
                    "records it", day.isoformat(), release_id[:12], type(exc).__name__)


# --------------------------------------------------------------------------------------
# One day, a range of days
# --------------------------------------------------------------------------------------
def daily_refresh(engine, spec: ReleaseSpec, day: date, *, republish: bool = False,
                  fingerprints: Optional[InputFingerprints] = None) -> DayResult:
    """Publish ``day``'s cell of a day-keyed ``spec`` (see the module docstring).

    Idempotent: a rerun on the same input snapshot is the engine's cache hit (no charge). A day
    already published for another input snapshot whose input rows are unchanged (its input
    fingerprint) is ``unchanged``: served by that release, nothing charged, even with
    ``republish``. One whose rows changed (``input_changed``), or whose release predates input
    fingerprints (``snapshot_changed``) or another code version (``code_changed``), is reported
    and left as it is, unless ``republish`` (a new release, charged). ``fingerprints``: shared
    by the days of a backfill (one aggregation for all). Errors (DpSparkError) propagate.
    """
    from dp_spark.core.fingerprint import same_fingerprint
    from dp_spark.engine import CODE_VERSION, release_id_for
    from dp_spark.delta.release_table import pin_snapshot, read_release

    dspec = day_spec(spec, day)
    iso = day.isoformat()
    _authorize(engine, dspec)  # who may publish this spec: before anything is read
    path = engine.table_path(dspec)
    location = engine.env.dataset_location(dspec.dataset)
    log.info("day %s: %s: pinning the input snapshot", iso, dspec.name)
    snap = pin_snapshot(engine.spark, location)
    current_id = release_id_for(dspec, snap.table_id, snap.version, engine.mode)

    fps = fingerprints if fingerprints is not None else InputFingerprints(spec, (day,))
    prior: Optional[PriorRelease] = None
    entry = engine.ledger.find(current_id)
    if entry is None:
        log.info("day %s: looking for earlier releases of %s in %s", iso, dspec.name, path)
        priors = prior_releases(engine.spark, path, dspec, engine.mode)
        if any(p.release_id == current_id for p in priors):
            prior = None  # written but unknown to the ledger: the engine decides (heal/refuse)
        elif priors:
            prior = priors[0]
    status = ""
    why = ""
    if prior is not None:
        same_input = (prior.input_table_id, prior.input_version) == (snap.table_id, snap.version)
        if same_input:
            status, why = "code_changed", f"code version {prior.code_version} -> current"
        else:
            moved = (f"input version {prior.input_version} -> {snap.version}"
                     + ("" if prior.input_table_id == snap.table_id else " (another table id)"))
            recorded = engine.ledger.fingerprint(prior.release_id)
            if recorded is None:
                status = "snapshot_changed"
                why = f"{moved}; released before input fingerprints: its rows cannot be compared"
            elif _withdrawn(engine, dspec.family, prior.release_id):
                status, why = "snapshot_changed", f"{moved}; its release was withdrawn"
            else:
                log.info("day %s: %s: comparing the day's input rows with release %s's", iso, dspec.name,
                         prior.release_id[:12])
                now = fps.of(engine, dspec, snap, day)
                if now is None:
                    status, why = "snapshot_changed", f"{moved}; the warehouse has no salt to compare its rows with"
                elif not same_fingerprint(now, recorded):
                    status, why = "input_changed", f"{moved}; the day's input rows changed"
                elif prior.code_version != CODE_VERSION:
                    status = "code_changed"
                    why = f"code version {prior.code_version} -> current ({moved}; the day's input rows are unchanged)"
                else:
                    return _unchanged(engine, dspec, day, prior, snap, current_id, moved,
                                      read_release(engine.spark, path, prior.release_id))
    if prior is not None and not republish:
        log.warning("day %s: %s: already published as %s (%s): not republished "
                    "(republish to publish and charge again)", iso, status, prior.release_id[:12], why)
        engine.ledger.append_audit(
            principal=engine.principal, action=f"refresh:{engine.mode}", spec_name=dspec.name,
            spec_version=dspec.version(), decision=f"reported_{status}", release_id=prior.release_id,
            charge_json=None, detail=f"{why}; not republished; would be release {current_id}",
        )
        return DayResult(
            day=day, release_name=dspec.name, status=status, release_id=prior.release_id,
            input_version=prior.input_version, current_release_id=current_id,
            current_input_version=snap.version, published_release_id=prior.release_id,
            published_input_version=prior.input_version, charge=None,
            budget=budget_window(engine, dspec.budget_id), note=why,
        )

    log.info("day %s: publishing %s", iso, dspec.name)
    result = engine.publish(dspec, snapshot=snap)  # the snapshot current_id was computed on
    status = result.status
    note = result.note
    if prior is not None and status == "published":
        status = "republished"
        note = (note + "; " if note else "") + f"replaces {prior.release_id} (input version {prior.input_version})"
    log.info("day %s: %s release %s", iso, status, result.release_id[:12])
    if (result.release_id == current_id and status in ("published", "republished", "cache_hit", "healed")
            and spec.stream is None):  # a stream's point has no ledger entry of its own to record it under
        _record_fingerprint(engine, dspec, snap, day, current_id, fps)
    return DayResult(
        day=day, release_name=dspec.name, status=status, release_id=result.release_id,
        input_version=_input_version(result, snap.version), current_release_id=current_id,
        current_input_version=snap.version,
        published_release_id=None if prior is None else prior.release_id,
        published_input_version=None if prior is None else prior.input_version,
        charge=result.charge, budget=budget_window(engine, dspec.budget_id), note=note,
        rows=_day_rows(result, iso),
    )


def _unchanged(engine, dspec: ReleaseSpec, day: date, prior: PriorRelease, snap, current_id: str, moved: str,
               stored: list) -> DayResult:
    """The day's input rows are those its release read: that release serves it (no charge)."""
    iso = day.isoformat()
    log.info("day %s: unchanged: %s, the day's input rows are unchanged: served by release %s, nothing charged",
             iso, moved, prior.release_id[:12])
    engine.ledger.append_audit(
        principal=engine.principal, action=f"refresh:{engine.mode}", spec_name=dspec.name,
        spec_version=dspec.version(), decision="unchanged", release_id=prior.release_id, charge_json=None,
        detail=f"{moved}; the day's input rows are unchanged: served by release {prior.release_id}, "
               f"not release {current_id}; nothing charged",
    )
    return DayResult(
        day=day, release_name=dspec.name, status="unchanged", release_id=prior.release_id,
        input_version=prior.input_version, current_release_id=current_id, current_input_version=snap.version,
        published_release_id=prior.release_id, published_input_version=prior.input_version, charge=None,
        budget=budget_window(engine, dspec.budget_id),
        note=f"{moved}; the day's input rows are unchanged: served by release {prior.release_id}",
        rows=tuple(r for r in stored if r.get("key") == iso),
    )


def _input_version(result, default: int) -> int:
    for r in result.rows or ():
        if r.get("input_version") is not None:
            return int(r["input_version"])
    return default


def days_between(start: date, end: date) -> list[date]:
    if end < start:
        raise ConfigError(f"backfill range ends ({end}) before it starts ({start})")
    return [start + timedelta(days=i) for i in range((end - start).days + 1)]


def backfill(engine, spec: ReleaseSpec, start: date, end: date, *, republish: bool = False,
             stop_on_error: bool = True,
             on_day: Optional[Callable[[DayResult], None]] = None) -> list[DayResult]:
    """:func:`daily_refresh` for every day of ``start..end`` (inclusive), in order.

    Every day is validated (declared by the spec) before the first one is published. Each
    day is charged at most once: already published days are cache hits; days published for
    another snapshot are ``unchanged`` when their input rows are the same, else reported
    (``republish`` to publish them again). A day that fails
    with a DpSparkError is an ``error`` result; with ``stop_on_error`` the remaining days
    are ``skipped`` (a refused budget would refuse them too). ``on_day`` is called with each
    result as soon as it is known (a job prints it).
    """
    days = days_between(start, end)
    for d in days:  # every check that can fail on the range fails before anything is charged
        day_spec(spec, d)
    fps = InputFingerprints(spec, days)  # the days needing a fingerprint share one aggregation
    results: list[DayResult] = []
    failed = False
    for d in days:
        if failed and stop_on_error:
            r = DayResult(day=d, release_name=day_spec(spec, d).name, status="skipped",
                          note="not attempted after an earlier error")
        else:
            try:
                r = daily_refresh(engine, spec, d, republish=republish, fingerprints=fps)
            except DpSparkError as exc:  # messages carry no data values
                failed = True
                log.error("day %s: %s", d.isoformat(), type(exc).__name__)
                r = DayResult(day=d, release_name=day_spec(spec, d).name, status="error",
                              error=f"{type(exc).__name__}: {exc}",
                              budget=budget_window(engine, spec.budget_id))
        results.append(r)
        if on_day is not None:
            on_day(r)
    return results


# --------------------------------------------------------------------------------------
# Days and the one-line report of a day
# --------------------------------------------------------------------------------------
def today_utc() -> date:
    return datetime.now(timezone.utc).date()


def parse_day(text: str, *, today: Optional[date] = None) -> date:
    """An ISO date, or ``today`` / ``yesterday`` in UTC (a scheduler's relative day).
    Raises ValueError otherwise."""
    today = today or today_utc()
    t = str(text).strip().lower()
    if t == "today":
        return today
    if t == "yesterday":
        return today - timedelta(days=1)
    try:
        return date.fromisoformat(t)
    except ValueError:
        raise ValueError(f"not an ISO date, 'today' or 'yesterday': {text!r}") from None


def _fmt_value(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def format_day(r: DayResult) -> str:
    """One line for a day: status, release id, charge, remaining budget (and, for a released
    day, its published cells: they are in the committed release table, so public)."""
    parts = [r.day.isoformat(), f"{r.status:<17}", f"{r.release_name}"]
    if r.release_id:
        parts.append(f"release={r.release_id}")
    parts.append(f"charge={r.charge if r.charge is not None else 'none'}")
    if r.budget is not None:
        parts.append(f"remaining={r.budget.describe()}")
    if r.status in STALE:
        parts.append(f"published on input v{r.published_input_version}, current input v{r.current_input_version}"
                     f" (would be release {r.current_release_id}); {r.note or r.status}; not republished")
    elif r.status == "unchanged":
        parts.append(f"published on input v{r.published_input_version}, current input v{r.current_input_version}:"
                     " the day's input rows are unchanged, served by this release")
    elif r.published_release_id and r.status == "republished":
        parts.append(f"replaces {r.published_release_id} (input v{r.published_input_version})")
    if r.status in SERVED:
        for c in r.rows:
            parts.append(f"{c['statistic']}={_fmt_value(c['value'])} "
                         f"ci=[{_fmt_value(c['ci_low'])}, {_fmt_value(c['ci_high'])}]")
    if r.error:
        parts.append(f"error: {r.error}")
    elif r.note and r.status not in STALE and r.status != "unchanged":
        parts.append(f"({r.note})")
    return "  ".join(parts)
