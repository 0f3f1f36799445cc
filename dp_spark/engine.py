"""The way of one release through the engine, end to end.

::

    spec -> validate (access, policy, per-release maximum, snapshot pin, release_id, output
            and input schemas through the lazy Spark plan: nothing created, nothing charged)
      -> ledger: committed? -> stored release
      -> reserve budget (exactly once) -> release table, salt (nothing created before the charge)
      -> executors: bound per unit, partials per public key -> collect O(keys)
      -> driver: noise (one draw per cell), post-processing, intervals
      -> Delta append insert-if-absent by release_id (idempotent write) -> ledger commit
      -> audit
      -> versions, statement (now, or at finish() in a batch)
      -> Delta mirror of the ledger: in a background thread (Engine.close() waits for it)

Noisy values stay in driver memory until the Delta write has committed: they are never
logged or printed before. The log lines name stages, counts of cells and ids only.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import secrets
import threading
import time
import uuid
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from dp_spark import __version__, precheck
from dp_spark.accountant import Accountant
from dp_spark.background import Coalescing, alongside
from dp_spark.core.budget import Budget, PureDP, ZCDP
from dp_spark.config import EnvConfig, ReleaseSpec, bounds_to_json, load_release_spec
from dp_spark.errors import (
    BudgetExceededError,
    ConfigError,
    DpSparkError,
    ReleaseConflictError,
    ReleaseFailedError,
)
from dp_spark.core.events import canonical_json
from dp_spark.ledger import open_ledger, sqlite_path
from dp_spark.ledger.policy import BudgetPolicy, load_policies
from dp_spark.mechanisms.samplers import NoiseSource, default_source
from dp_spark.statistics.cells import CellColumns

log = logging.getLogger("dp_spark.engine")
CODE_VERSION = __version__

# engines whose ledger mirror may still be refreshing in the background: drained at exit
_LIVE: "weakref.WeakSet[Engine]" = weakref.WeakSet()
_EXIT_HOOK: list[bool] = []
#: how long the interpreter's exit waits for a background mirror refresh (seconds)
EXIT_WAIT_SECONDS = 600.0


def _drain_at_exit() -> None:
    """Interpreter exit: wait for every engine's background mirror refresh (registered after
    the Spark session exists, so it runs before PySpark's own exit hooks stop the JVM)."""
    for engine in list(_LIVE):
        engine.close(timeout=EXIT_WAIT_SECONDS)


def _as_written(rows: CellColumns) -> list[dict[str, Any]]:
    """The rows a release write committed, as :func:`~dp_spark.delta.release_table.read_release`
    returns them (the table's columns, ordered by statistic and key), without reading them back."""
    from dp_spark.delta.release_table import RELEASE_SCHEMA

    return sorted(rows.dicts([f.name for f in RELEASE_SCHEMA.fields]), key=lambda r: (r["statistic"], r["key"]))


# --------------------------------------------------------------------------------------
# Result
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReleaseResult:
    release_id: str
    family: str
    status: str  # published | cache_hit | healed | returned_existing | degraded
    table_path: str
    rows: tuple[dict[str, Any], ...]
    charge: Optional[Budget]  # what this call spent (None when nothing was charged)
    budget_id: str
    budget_remaining: Optional[Budget] = None
    note: str = ""

    def values(self, statistic: str) -> dict[str, float]:
        return {r["key"]: r["value"] for r in self.rows if r["statistic"] == statistic}


@dataclass(frozen=True)
class ValidatedRelease:
    """A spec that :meth:`Engine.validate` found publishable, with what validating it fixed:
    the budget policy, the plan, the pinned input snapshot, the release id and the lazy
    partials (built with the warehouse's salt, or with a provisional in-memory salt when
    there is none yet: ``salt`` is then None and publishing rebuilds them with the real one).
    Validating created, charged and recorded nothing."""

    spec: ReleaseSpec
    policy: BudgetPolicy
    plan: Any
    snapshot: Any
    release_id: str
    path: str
    partials_df: Any
    salt: Optional[str]
    #: the spec as given, when it differs from ``spec`` (its key tables read into ``spec``)
    declared: Optional[ReleaseSpec] = None


class _LedgerOnUse:
    """Stands for an engine's ledger and opens it only when a method is called (an audited
    refusal): validating a spec does not create a SQLite ledger file."""

    def __init__(self, engine: "Engine"):
        self._engine = engine

    def __getattr__(self, name: str):
        return getattr(self._engine.ledger, name)


# --------------------------------------------------------------------------------------
# Planning (public parameters only: no data)
# --------------------------------------------------------------------------------------
def plan_for(spec: ReleaseSpec):
    """The release's plan (:func:`dp_spark.statistics.plan.plan_query`), whichever form the spec
    was written in (a single-``metric`` spec runs as its rewrite into statistics)."""
    if spec.stream is not None:  # running totals through the binary-tree mechanism
        from dp_spark.statistics.stream import plan_stream

        return plan_stream(spec)
    from dp_spark.statistics.plan import plan_query

    return plan_query(spec)


def release_id_for(spec: ReleaseSpec, table_id: str, version: int, mode: str) -> str:
    """The release id: the spec's canonical form, the input's Delta table id and version, the
    code version and the mode; for a spec with key tables, also each key table's Delta table id
    and version read (only then: the ids of other specs are unchanged), so that a changed key
    table is a new release and a rerun on the same versions is the same one."""
    if spec.table_key_sets:
        raise ConfigError(f"{spec.source}: the release id of a spec with a key table "
                          f"('{spec.key_table_field(spec.table_key_sets[0][0])}') needs its keys read first "
                          "(Engine.validate, as publish does); the daily refresh and backfill do not read key "
                          "tables: publish the spec instead")
    content: dict[str, Any] = {"spec": spec.canonical(), "input": {"table_id": table_id, "version": version},
                               "code_version": CODE_VERSION, "mode": mode}
    if spec.key_table_pins:
        content["key_tables"] = [{"table_id": t, "version": v} for t, v in spec.key_table_pins]
    blob = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def threshold_cells(spec: ReleaseSpec, cells: list[dict[str, Any]], components: dict) -> tuple[list, list[str]]:
    """``min_group_size`` on the noisy cells (post-processing: noisy values only): the cells of
    a key whose noisy group size (``spec.group_size_statistic``) is below the threshold are
    suppressed, and with ``merge_other`` combined into one more key. ``components``: the noisy
    components of :meth:`QueryPlan.noise` (a mean's merged value needs its noisy sums)."""
    from dp_spark.statistics.postprocess import apply_min_group_size

    rule = spec.min_group_size
    kinds = {s.name: s.kind for s in spec.statistics}
    extra = {}
    for s in spec.statistics:
        if s.kind == "mean":
            by_kind = {c.kind: c for c in components if c.clamp == s.clamp or c.kind == "rows"}
            extra[s.name] = {"normalised_sum": components.get(by_kind.get("nsum"), {}),
                             "count": components.get(by_kind.get("rows"), {}),
                             "lower": s.clamp.lower, "upper": s.clamp.upper, "min_count": s.option("min_count")}
    out, suppressed = apply_min_group_size(
        cells, threshold=rule.threshold, strategy=rule.strategy, count_statistic=spec.group_size_statistic,
        other_key=rule.other_key, confidence=float(spec.confidence), extra=extra, kinds=kinds,
    )
    names = spec.key_columns
    for c in out:  # a merged cell stands for the other key (one key column: merge_other's rule)
        if c.get("merged_keys") is not None:
            c["keys"] = dict(zip(names, (c["key"],)))
    return out, suppressed


# --------------------------------------------------------------------------------------
# Publishing
# --------------------------------------------------------------------------------------
def read_or_create_salt(path: Path) -> str:
    """The bounding salt at ``path``, created atomically (0600) on first use: see dp_spark.salt."""
    from dp_spark.salt import read_or_create_salt as _read_or_create_salt

    return _read_or_create_salt(path)


#: the stage and the reserved release of the publish running on this thread (for the fixed
#: message of a failure after the charge: Engine.publish)
_PROGRESS = threading.local()


@contextmanager
def _stage(spark, name: str, release_id: str) -> Iterator[None]:
    """A log line per stage (never data values) and the Spark job description / tag."""
    log.info("release %s: stage %s", release_id[:12], name)
    _PROGRESS.stage = name
    from dp_spark.spark import is_connect_session

    connect = is_connect_session(spark)
    tag = f"dp_spark-{name.replace('+', '-')}-{release_id[:12]}"
    try:
        if connect:
            spark.addTag(tag)
        else:
            spark.sparkContext.setJobDescription(f"dp_spark {name} {release_id[:12]}")
    except Exception:
        pass
    t0 = time.monotonic()
    try:
        yield
    finally:
        try:
            if connect:
                spark.removeTag(tag)
            else:
                spark.sparkContext.setJobDescription(None)
        except Exception:
            pass
    log.info("release %s: stage %s done in %.1fs", release_id[:12], name, time.monotonic() - t0)


def _statement(spec: ReleaseSpec, policy: BudgetPolicy) -> dict[str, Optional[float]]:
    acc = Accountant(policy.measure, statement_delta=policy.statement_delta)
    st = acc.statement(spec.charge)
    return {"epsilon": float(st["epsilon"]) if st.get("epsilon") is not None else None,
            "delta": float(st["delta"]) if st.get("delta") is not None else None}


class Engine:
    """Publishes release specs of one environment. Reusable across releases of a job."""

    def __init__(self, env: EnvConfig, *, spark=None, ledger=None, source: Optional[NoiseSource] = None,
                 principal: Optional[str] = None, clock: Optional[Callable[[], datetime]] = None,
                 mode: str = "official", access=None, refresh: str = "each"):
        """``refresh``: when the version records (rows of the SQL ledger) and the privacy
        statements are updated: ``"each"`` after every release (default), or ``"deferred"``:
        once, when :meth:`finish` is called (a job publishing several releases calls it at the
        end: one ledger transaction for all of them). The ledger's charges and the release
        tables are always written before ``publish`` returns. The Delta tables derived from the
        ledger (its mirror, ``_published``) are refreshed in a background thread after each
        release (``"each"``) or from :meth:`finish`; call :meth:`close` (or use ``with Engine(...) as engine:``) to wait for it, and close the
        engine before closing a ``ledger`` you passed in."""
        if mode not in ("official", "exploration"):
            raise ConfigError("mode must be 'official' or 'exploration'")
        if refresh not in ("each", "deferred"):
            raise ConfigError("refresh must be 'each' or 'deferred'")
        from dp_spark.governance.trust import require_trusted_components

        # official: the env's ledger, OpenDP noise, the real clock, the platform's principal
        require_trusted_components(mode, env.name, ledger=ledger, source=source, clock=clock, principal=principal)
        self.refresh = refresh
        self._pending_mirror = False
        # the ledger's Delta mirror is refreshed off the release's critical path (see close())
        self._mirror_task = Coalescing(self._refresh_mirror, name="dp_spark-mirror")
        # (family, release id, series key: the day of a day release of a series, else None), in order
        self._pending_versions: list[tuple[str, str, Optional[str]]] = []
        # release id -> the statement's summary of the rows this engine wrote for it (official
        # releases whose write landed as ours), until the family's statement is refreshed: read
        # there instead of reading the rows back from Delta
        self._written: dict[str, dict[str, Any]] = {}
        self.env = env
        self.policies = load_policies(env.policies)
        if spark is None:
            from dp_spark.spark import get_or_create_session

            spark = get_or_create_session(master=env.master, extra_conf=dict(env.spark_conf))
        self.spark = spark
        # opened on first use (the ``ledger`` property): a release refused while being
        # validated creates no ledger file
        self._ledger = ledger
        self._ledger_clock = clock
        self.source = source or default_source()
        from dp_spark.governance.access import access_policy_for_env, resolve_principal

        self.principal = principal or resolve_principal(spark, env_name=env.name)
        self.access = access if access is not None else access_policy_for_env(env)
        self.clock = clock or (lambda: datetime.now(timezone.utc))
        self.mode = mode
        _LIVE.add(self)
        if not _EXIT_HOOK:  # after the session exists: runs before PySpark's exit hooks
            atexit.register(_drain_at_exit)
            _EXIT_HOOK.append(True)

    def close(self, timeout: Optional[float] = None) -> bool:
        """Wait until the ledger's Delta mirror has caught up with this engine's releases.

        The mirror is refreshed in a background thread after each release (``refresh="each"``)
        or from :meth:`finish` (``"deferred"``), so neither waits for it. Returns False when
        ``timeout`` (seconds) ran out first. The engine stays usable; the CLI calls this before
        it exits, and so does the interpreter's exit (``atexit``) for engines not closed.
        The mirror is derived data: the SQL ledger is the authority, and a refresh that never
        ran (the process died) is caught up by the next one or ``budget rebuild-mirror``."""
        return self._mirror_task.wait() if timeout is None else self._mirror_task.wait(timeout)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- helpers ---------------------------------------------------------------------
    def table_path(self, spec: ReleaseSpec) -> str:
        root = self.env.output_root if self.mode == "official" else self.env.exploration_root
        return f"{root}/{spec.family}"

    @property
    def ledger(self):
        """The SQL ledger, opened (for SQLite: created) on first use."""
        if self._ledger is None:
            self._ledger = open_ledger(self.env.ledger_url, clock=self._ledger_clock)
        return self._ledger

    @ledger.setter
    def ledger(self, value) -> None:
        self._ledger = value

    def _ledger_exists(self) -> bool:
        """Whether the ledger may hold rows already (open, not SQLite, or its file exists)."""
        if self._ledger is not None:
            return True
        path = sqlite_path(self.env.ledger_url)
        return path is None or Path(path).exists()

    def policy_for(self, spec: ReleaseSpec) -> BudgetPolicy:
        return precheck.policy_for(spec, self.policies, self.env.policies)

    def _audit(self, spec: ReleaseSpec, decision: str, release_id: Optional[str], charge: Optional[Budget],
               detail: str = "") -> None:
        self.ledger.append_audit(
            principal=self.principal, action=f"publish:{self.mode}", spec_name=spec.name,
            spec_version=spec.version(), decision=decision, release_id=release_id,
            charge_json=None if charge is None else json.dumps(charge.to_json(), sort_keys=True),
            detail=detail,
        )

    def _record(self, spec: ReleaseSpec, release_id: str, *, version: bool = True) -> None:
        """After a release is committed (or served): its version record (unless ``version`` is
        false: an empty release leaves the family's current version as it was), then the derived
        tables' refresh in the background, started after the version record so that it does not
        compete with it, and also when versioning fails."""
        try:
            if version:
                self._version(spec, release_id)
        finally:
            self._mirror()

    def _mirror(self) -> None:
        if self.refresh == "deferred":
            self._pending_mirror = True
            return
        self._mirror_task.request()

    def finish(self) -> None:
        """Complete what ``refresh="deferred"`` postponed: the version records of the official
        releases published since the last call (ONE ledger transaction for all of them) and one privacy
        statement per family; and start the ledger mirror's refresh in the background
        (:meth:`close` waits for it)."""
        from dp_spark.governance import after_official_releases

        pending, self._pending_versions = self._pending_versions, []
        # the ledger's mirror is refreshed after the version records and statements, in the
        # background (it never raises; the SQL ledger is its authority): started first, it
        # would compete with them for the driver and the executors
        mirror, self._pending_mirror = self._pending_mirror, False
        written, self._written = self._written, {}
        try:
            if pending:
                after_official_releases(self.spark, env=self.env, releases=pending, principal=self.principal,
                                        ledger=self.ledger, releases_dir=self.access.releases_dir,
                                        written=written)
        finally:
            if mirror:
                self._mirror_task.request()

    def _refresh_mirror(self) -> None:
        """Refresh the Delta tables derived from the SQL ledger: its mirror and (official) the
        ``_published`` copy of the version record, the latter in a second thread meanwhile (three
        independent tables: each is a small Delta commit whose time is mostly fixed). Never raises:
        the ledger is the authority, and a refresh that fails or never runs is caught up by the next one."""
        def published() -> None:
            if self.mode != "official":
                return
            try:
                from dp_spark.governance.versions import published_path_for, refresh_published

                refresh_published(self.ledger, self.spark, published_path_for(self.env.output_root))
            except Exception as exc:
                log.warning("_published refresh failed (%s); the SQL ledger is unaffected", type(exc).__name__)

        with alongside(published, name="dp_spark-published"):
            try:
                from dp_spark.delta.mirror import mirror_to_delta

                mirror_to_delta(self.ledger, self.spark, ledger_path=self.env.ledger_mirror,
                                audit_path=self.env.audit_mirror)
            except Exception as exc:  # the SQL ledger is the authority; the mirror can be refreshed later
                log.warning("ledger mirror refresh failed (%s); the SQL ledger is unaffected", type(exc).__name__)

    def _result(self, spec, release_id, path, status, rows, *, charge=None, note="") -> ReleaseResult:
        return ReleaseResult(release_id=release_id, family=spec.family, status=status, table_path=path,
                             rows=tuple(rows), charge=charge, budget_id=spec.budget_id,
                             budget_remaining=self.ledger.status(spec.budget_id, full=False).remaining, note=note)

    def _stored(self, spec, release_id, path, status, note="") -> ReleaseResult:
        """The result of a release already in the table (read back), nothing charged by this call."""
        from dp_spark.delta.release_table import read_release

        return self._result(spec, release_id, path, status, read_release(self.spark, path, release_id), note=note)

    # -- the protocol ---------------------------------------------------------------------
    def validate(self, spec: ReleaseSpec, *, snapshot=None) -> ValidatedRelease:
        """Everything about ``spec`` that can be checked before a charge, creating nothing.

        Access and pre-registration (a refusal is audited), the budget policy (declared,
        measure, dataset, unit), the key tables (declared public in the env, else refused
        before anything is read; then read at a pinned version and counted against
        ``max_cells``: :meth:`read_key_tables`; the ``spec`` returned holds their keys), the
        per-release maximum, the plan, the input snapshot
        (pinned here unless given), the dataset's binding to a budget (when the ledger exists),
        the release table's schema (if the table exists) and the input schema, through the lazy
        partials. No release table, salt file, ledger file or ledger row is created: those are
        made by :meth:`publish`, once the release is known to be valid. A batch job validates
        all its specs before publishing the first (``dp-spark publish``).
        """
        from dp_spark.governance.access import authorize
        from dp_spark.delta.release_table import check_release_table, pin_snapshot
        from dp_spark.salt import read_salt

        # who may run this spec, in this mode? (refusals are audited; nothing is read)
        authorize(self.access, self.principal, "publish", mode=self.mode, spec=spec, ledger=_LedgerOnUse(self),
                  budget_id=spec.budget_id)
        declared = spec
        if spec.table_key_sets or spec.key_table_pins:
            # a key table must be declared public before anything of it is read
            precheck.check_key_tables(spec, self.env.public_datasets, tuple(self.env.datasets), self.env.source)
        policy = self.policy_for(spec)
        if spec.table_key_sets:  # the public key tables only: no row of the input is read
            spec = self.read_key_tables(spec)
        plan = plan_for(spec)  # every privacy parameter, before data is touched
        charge = spec.charge
        acc = Accountant(policy.measure, statement_delta=policy.statement_delta)
        cost = acc.cost(plan.event)  # every event: the statistics' and a private key selection's
        if not cost.fits_in(charge):  # calibration rounds scales up, so the cost never exceeds the charge
            raise DpSparkError("internal: planned cost exceeds the declared charge")
        # refused whatever is spent: the per-release maximum, a delta on a budget without a delta
        # cap (the ledger's reserve checks both again)
        precheck.check_charge_limits(spec, policy)

        location = self.env.dataset_location(spec.dataset)
        if snapshot is None:
            snapshot = pin_snapshot(self.spark, location)
        elif snapshot.location != location:
            raise ConfigError(f"{spec.source}: the snapshot given is of '{snapshot.location}', not of '{location}'")
        # every column the spec reads, against the input's schema (from the Delta log: no row read)
        precheck.check_input_columns(spec, *precheck.schema_names(snapshot.reader(self.spark).schema))
        if self._ledger_exists():  # read only: a fresh ledger has no bindings
            bound = self.ledger.budget_for_dataset(snapshot.table_id, spec.unit.kind.value)
            if bound is not None and bound != spec.budget_id:  # as bind_dataset says it, before any row
                try:
                    measure = self.ledger.get_policy(bound).measure
                    how = (f" To publish from this data, charge that budget: budget: {{id: {bound}, "
                           f"measure: {measure}, {'rho' if measure == 'zcdp' else 'epsilon'}: ...}} in the spec.")
                except DpSparkError:
                    how = ""
                raise ConfigError(
                    f"{spec.source}: dataset identity {snapshot.table_id!r} (unit {spec.unit.kind.value!r}) is "
                    f"already governed by budget {bound!r}; it cannot also draw on budget {spec.budget_id!r}: "
                    f"one budget per dataset and unit, so that one accountant composes every release of it "
                    f"(a copied config or a new budget id does not reset a budget).{how}")
        release_id = release_id_for(spec, snapshot.table_id, snapshot.version, self.mode)
        path = self.table_path(spec)
        check_release_table(self.spark, path)
        # the input schema fails here, in the lazy plan; without a salt yet, a provisional one
        # (never stored, never used for data) stands in for the analysis
        salt = read_salt(self.env.salt_file)
        partials_df = self._partials(spec, plan, snapshot, salt or secrets.token_hex(32))
        return ValidatedRelease(spec=spec, policy=policy, plan=plan, snapshot=snapshot, release_id=release_id,
                                path=path, partials_df=partials_df, salt=salt,
                                declared=None if declared is spec else declared)

    def read_key_tables(self, spec: ReleaseSpec) -> ReleaseSpec:
        """``spec`` with its key tables read (``public_keys: {table, column, where}``), each at
        its Delta version pinned now (:func:`~dp_spark.delta.release_table.pin_snapshot`), through
        the public Delta reader: the distinct non-null values of the column, sorted. Their number
        is counted on the executors and checked against ``max_cells`` before any key reaches the
        driver (:meth:`ReleaseSpec.check_key_table_sizes`); then at most that many (<=
        HARD_MAX_CELLS) are collected. The release id folds in each key table's id and version
        (:func:`release_id_for`). The env must declare each key table public
        (:func:`precheck.check_key_tables`): the caller checks that before this reads anything."""
        from dp_spark.backends.spark import collect_table_keys, key_table_frame, total_where
        from dp_spark.delta.release_table import pin_snapshot

        precheck.check_key_tables(spec, self.env.public_datasets, tuple(self.env.datasets), self.env.source)
        frames = {}
        for i, k in spec.table_key_sets:
            snap = pin_snapshot(self.spark, self.env.dataset_location(k.table.dataset))
            frames[i] = (snap, key_table_frame(snap.reader(self.spark), k.table.column, k.table.where, spec.source,
                                               spec.key_table_field(i)))
        with total_where(self.spark, any(k.table.where is not None for _, k in spec.table_key_sets)):
            sizes = {i: frame.count() for i, (_, frame) in frames.items()}
            spec.check_key_table_sizes(sizes)  # before any key is collected, before any charge
            read = {i: (collect_table_keys(frame, sizes[i]), snap.table_id, snap.version)
                    for i, (snap, frame) in frames.items()}
        return spec.with_table_keys(read)

    def _partials(self, spec: ReleaseSpec, plan, snapshot, salt: str):
        from dp_spark.backends.spark import build_query_partials

        return build_query_partials(snapshot.reader(self.spark), plan, salt)

    def admit(self, validated: ValidatedRelease) -> None:
        """Register the spec's budget policy in the ledger and bind the input to the budget
        (idempotent; refused when the ledger forbids the policy change or the binding).
        :meth:`publish` does it; a batch job does it for all its specs before the first charge."""
        spec, snapshot = validated.spec, validated.snapshot
        self.ledger.register_budget(validated.policy)
        self.ledger.bind_dataset(spec.budget_id, snapshot.table_id, spec.unit.kind.value)

    def publish(self, spec: ReleaseSpec, *, snapshot=None, validated: Optional[ValidatedRelease] = None,
                _degraded_from: Optional[str] = None) -> ReleaseResult:
        """Publish ``spec`` (see the module docstring).

        A failure after the charge is reserved that is not one of the engine's own errors
        (:class:`DpSparkError`, whose messages never carry data) is raised as
        :class:`ReleaseFailedError`: release id, stage and exception class only, never the
        exception's text (which can carry a row's values: RELIABILITY 23), nothing chained;
        the audit row says the same. The charge stays spent; a rerun reuses the reservation.
        Failures before the reservation pass through (they come from the spec, the schema or
        the services, not from rows)."""
        _PROGRESS.reserved = None
        _PROGRESS.stage = "reserved"
        failure: Optional[tuple[str, str, str]] = None
        from dp_spark.spark import quiet_pyspark_error_logs

        try:
            with quiet_pyspark_error_logs():  # pyspark logs a Spark exception's text: not here
                return self._publish(spec, snapshot=snapshot, validated=validated, _degraded_from=_degraded_from)
        except DpSparkError:
            raise
        except Exception as exc:
            reserved = getattr(_PROGRESS, "reserved", None)
            if reserved is None:
                raise
            failure = (reserved, getattr(_PROGRESS, "stage", "reserved"), type(exc).__name__)
        # raised outside the handler: the original exception is neither chained nor kept
        release_id, stage, cls = failure
        log.error("release %s: failed in stage %s (%s); the failure's text is withheld",
                  release_id[:12], stage, cls)
        try:
            self._audit(spec, "failed", release_id, None, f"stage {stage}: {cls} (text withheld)")
        except DpSparkError:
            log.error("release %s: the failure could not be audited", release_id[:12])
        raise ReleaseFailedError(release_id, stage, cls)

    def _publish(self, spec: ReleaseSpec, *, snapshot=None, validated: Optional[ValidatedRelease] = None,
                 _degraded_from: Optional[str] = None) -> ReleaseResult:
        """:meth:`publish` without the failure guard (see there). ``snapshot``: an input snapshot the caller
        already pinned (a :class:`~dp_spark.delta.release_table.Snapshot` of the spec's dataset), read
        instead of pinning it again. ``validated``: what :meth:`validate` returned for ``spec``
        (then it is not validated again, and its snapshot is the one read).

        A release refused before its charge (access, policy, per-release maximum, input or
        output schema) creates nothing: no release table, salt file, ledger file or row
        (except the audit row of a refused permission). A release the budget refuses (at the
        reservation) creates no release table, salt file or statement either: only its audit
        row."""
        from dp_spark.delta.release_table import ensure_release_table, release_present

        if validated is None:
            validated = self.validate(spec, snapshot=snapshot)
        elif validated.spec is not spec and validated.declared is not spec:
            raise ConfigError(f"{spec.source}: the validated release given is of another spec")
        spec = validated.spec  # with its key tables read, if it has any
        policy, plan, snapshot = validated.policy, validated.plan, validated.snapshot
        release_id, path, charge = validated.release_id, validated.path, spec.charge
        self.admit(validated)
        if spec.stream is not None:
            return self._publish_stream(validated)

        # 1. already released? (cache hit: no charge, no new noise)
        entry = self.ledger.find(release_id)
        if entry is not None and entry.state == "committed":
            self._audit(spec, "cache_hit", release_id, None)
            stored = self._stored(spec, release_id, path, "cache_hit")
            # an empty release is never versioned; a version heals a crash between commit and
            # versioning; the derived tables: the mirror of its audit row, one a killed run never refreshed
            self._record(spec, release_id, version=bool(stored.rows or not spec.private_key_sets))
            return stored
        if entry is not None and release_present(self.spark, path, release_id):
            # crashed after the write, before the commit: heal by committing what was written
            self.ledger.commit(release_id, entry.owner_token)
            self._audit(spec, "healed", release_id, None)
            self._record(spec, release_id)
            return self._stored(spec, release_id, path, "healed")

        # 2. reserve (compare-and-set; exactly once). Nothing is created before the charge is
        # admitted: a budget refusal leaves no release table, salt file or statement behind
        owner = uuid.uuid4().hex
        event_json = canonical_json(plan.event)
        try:
            reservation = self._reserve(spec, release_id, charge, event_json, owner)
        except BudgetExceededError as exc:
            return self._exhausted(spec, release_id, path, exc, _degraded_from)
        if reservation is None:  # a concurrent run committed it while we waited
            self._audit(spec, "cache_hit", release_id, None, "concurrent run won")
            return self._stored(spec, release_id, path, "cache_hit", "a concurrent run published it")
        if reservation.entry.state == "committed":
            self._audit(spec, "cache_hit", release_id, None)
            return self._stored(spec, release_id, path, "cache_hit")
        owner = reservation.entry.owner_token
        charged = None if reservation.reused else charge
        _PROGRESS.reserved = release_id  # from here on a failure's text is withheld (publish)

        # 3. the charge is admitted: now create the table and the salt (a failure here keeps
        # the reservation, which a rerun reuses: no second charge)
        ensure_release_table(self.spark, path)
        partials_df = validated.partials_df
        if validated.salt is None:  # validated with a provisional salt: the real one now
            partials_df = self._partials(spec, plan, snapshot, read_or_create_salt(self.env.salt_file))

        # 4. executors: bounding and partials; only O(keys) rows come back. Meanwhile the
        # driver resolves the release table's Delta state, where the write below looks its key up
        from dp_spark.backends.spark import collect_query_partials, total_where
        from dp_spark.delta.release_table import prepare_release_write

        prepare = alongside(prepare_release_write, self.spark, path, name=f"dp_spark-prepare-{release_id[:12]}")
        if self.noise_on_executors(spec):
            # a large release of public keys: noised on the executors and written straight to
            # Delta (one commit); no partial and no noisy value comes to the driver
            with prepare, _stage(self.spark, "bounding+aggregation+noise+write", release_id), \
                    total_where(self.spark, spec.where is not None):
                stored = self._write_frame_once(path, release_id, spec, plan, policy, snapshot, partials_df,
                                                owner, fresh=not reservation.reused)
            committed = self._commit_if_owner(release_id, owner)
            if stored is not None:
                return self._lost_the_write(spec, release_id, path, stored, charged, committed)
            status = "degraded" if _degraded_from else "published"
            detail = f"degraded from {_degraded_from}" if _degraded_from else ""
            detail = (detail + "; " if detail else "") + "noised on the executors"
            self._audit(spec, status, release_id, charged, detail)
            self._record(spec, release_id, version=committed)
            n_cells = spec.cells * len(spec.statistics)
            return self._result(spec, release_id, path, status, (), charge=charged,
                                note=f"{n_cells} cells noised on the executors and written to {path}: read them "
                                     "from the release table (they never came to the driver)")

        with prepare, _stage(self.spark, "bounding+aggregation", release_id), \
                total_where(self.spark, spec.where is not None):
            tuples = None
            if spec.private_key_sets:  # the selected cells come back with their partials
                partials, tuples = collect_query_partials(partials_df, plan)
            else:
                partials = collect_query_partials(partials_df, plan)
        # 5. driver: noise, post-processing, intervals (values stay in memory)
        with _stage(self.spark, "noise", release_id):
            # the noisy components by key are only needed to merge small groups
            components: Optional[dict[Any, Any]] = {} if spec.min_group_size is not None else None
            cells = plan.noise_columns(partials, self.source, tuples, components)
            del partials
        suppressed: list[str] = []
        if spec.min_group_size is not None:  # thresholds on NOISY counts only (post-processing)
            kept, suppressed = threshold_cells(spec, cells.dicts(), components or {})
            cells = CellColumns.from_dicts(kept)
            del kept
        del components
        rows = self._rows(spec, plan, policy, release_id, snapshot, cells)
        del cells
        # 6. write (atomic, insert-if-absent by release id), learn whose cells landed, commit
        with _stage(self.spark, "write", release_id):
            stored = self._write_once(path, release_id, rows, owner, fresh=not reservation.reused)
        committed = self._commit_if_owner(release_id, owner)
        if stored is not None:
            del rows  # never written, never shown
            return self._lost_the_write(spec, release_id, path, stored, charged, committed)
        status = "degraded" if _degraded_from else "published"
        detail = f"degraded from {_degraded_from}" if _degraded_from else ""
        if spec.min_group_size is not None:
            detail = (detail + "; " if detail else "") + f"suppressed {len(suppressed)} of {spec.cells} cells"
        if not rows:
            detail = (detail + "; " if detail else "") + "no key was selected: nothing published"
        self._audit(spec, status, release_id, charged, detail)
        # the write committed exactly these rows: return them without reading the table back
        mine = _as_written(rows)
        if committed:
            self._keep_written(release_id, mine)
        # no key selected: the current version stays; not committed by this run: its new owner versions it
        self._record(spec, release_id, version=bool(rows) and committed)
        return self._result(spec, release_id, path, status, mine, charge=charged,
                            note=f"fallback for exhausted release {_degraded_from}" if _degraded_from else "")

    def _publish_stream(self, validated: ValidatedRelease) -> ReleaseResult:
        """A stream's points (``stream: {horizon_days, start}``): the running totals through each
        of the spec's date keys (a daily refresh's spec: start .. the day; the earlier days'
        totals are those already published: sums of the same stored nodes), from the stream's
        tree (:mod:`dp_spark.statistics.stream`).

        * the point already written (found by its release id): served, nothing charged;
        * the stream's ONE ledger entry (id :func:`~dp_spark.statistics.stream.stream_id_for`)
          is reserved at its first refresh with the charge of the whole horizon; later points
          charge nothing (a reservation another run holds is charged already: its nodes are
          shared, written once whoever draws them);
        * the bounded pass gives the daily increments; every tree node completed by the last
          day and not stored yet gets one noise draw and its noisy value is stored, write once
          (a run that lost that race publishes the stored nodes); the point is the sum of the
          stored nodes of its prefix, so a rerun, a run killed and started again, or a run on
          a later snapshot publishes the same number;
        * the point's rows are written insert-if-absent by release id, then the stream's entry
          is committed (once). Noisy values stay in driver memory until the write commits."""
        from dp_spark.backends.spark import collect_query_partials, total_where
        from dp_spark.delta.release_table import (ConcurrentReleaseWrite, ensure_release_table, read_release,
                                                  stream_points, write_release)
        from dp_spark.statistics.stream import stream_id_for

        spec, plan, snapshot, policy = validated.spec, validated.plan, validated.snapshot, validated.policy
        release_id, path = validated.release_id, validated.path
        sid = stream_id_for(spec, self.mode)
        # 1. this point already written? (a rerun: no charge, no new noise). The same read
        # gives the days the stream's releases wrote (step 4)
        points = stream_points(self.spark, path, spec.family, self.mode, sid, release_id)
        if release_id in points:
            self._commit_stream(sid)  # heals a run killed between its write and the commit
            self._audit(spec, "cache_hit", release_id, None)
            self._record(spec, release_id)
            return self._stored(spec, release_id, path, "cache_hit")
        # 2. the stream's one charge, at its first refresh
        charged: Optional[Budget] = None
        entry = self.ledger.find(sid)
        if entry is None:
            try:
                reservation = self.ledger.reserve(
                    spec.budget_id, sid, spec.charge, canonical_json(plan.event), principal=self.principal,
                    code_version=CODE_VERSION, release_family=spec.family, owner_token=uuid.uuid4().hex,
                    lease_seconds=self.env.lease_seconds)
                charged = None if reservation.reused else spec.charge
            except BudgetExceededError as exc:
                return self._exhausted(spec, release_id, path, exc, None)
            except ReleaseConflictError:
                pass  # another run reserved it a moment ago: charged once, by that run
        _PROGRESS.reserved = release_id  # from here on a failure's text is withheld (publish)
        ensure_release_table(self.spark, path)
        partials_df = validated.partials_df
        if validated.salt is None:
            partials_df = self._partials(spec, plan, snapshot, read_or_create_salt(self.env.salt_file))
        # 3. executors: the daily increments (bounded: each unit's first L0 days, Linf per day)
        with _stage(self.spark, "bounding+aggregation", release_id), total_where(self.spark, spec.where is not None):
            partials = collect_query_partials(partials_df, plan.query)
        # 4. driver: the nodes completed so far, each drawn and stored once; the point
        with _stage(self.spark, "noise", release_id):
            noisy: dict[str, dict] = {}
            for part in plan.parts:
                true_nodes = plan.completed(part, partials)
                stored = self.ledger.stream_nodes(sid, part.name)
                missing = [n for n in sorted(true_nodes) if n not in stored]
                if missing:
                    cal = part.calibration
                    draws = self.source.draw(cal.mechanism, cal.scale, len(missing))
                    offered = {n: true_nodes[n] + int(z) for n, z in zip(missing, draws)}
                    del draws
                    stored = {**stored, **self.ledger.record_stream_nodes(sid, part.name, offered)}
                    del offered
                noisy[part.name] = stored
            del partials
            cells = plan.cells(noisy)
            del noisy
        # only the points not written yet (and the release's own last day): an earlier point is
        # the same sum of the same stored nodes in every release, so the table grows by the new
        # days only; readers see the whole stream through the days' versions (series_view). The
        # days are those read at step 1: a concurrent run's point written since is written
        # again here, with the same numbers (the same stored nodes), as with a read at this step
        written = self._stream_points_written(spec, points)
        last = spec.key_sets[0].values[-1]
        cells = [c for c in cells if c["key"] == last or c["key"] not in written]
        stream_note = {"stream_id": sid, "horizon_days": plan.horizon, "start": spec.stream.start,
                       "charged": "once, at the stream's first refresh"}
        rows = self._rows(spec, plan, policy, release_id, snapshot, CellColumns.from_dicts(cells),
                          stream_note=stream_note)
        del cells
        # 5. write (insert-if-absent by release id), then the stream's entry is committed
        with _stage(self.spark, "write", release_id):
            try:
                write_release(self.spark, path, rows)
                landed = True
            except ConcurrentReleaseWrite:  # the same numbers (the same nodes): theirs landed
                landed = False
        self._commit_stream(sid)
        self._audit(spec, "published", release_id, charged, f"stream {sid}: point {plan.days} of {plan.horizon}")
        # the write committed exactly these rows: returned without reading the table back
        # (another run's write of this release id landed instead: read back, theirs)
        if landed:
            mine = _as_written(rows)
            self._keep_written(release_id, mine)
        else:
            mine = read_release(self.spark, path, release_id)
        del rows
        self._record(spec, release_id)
        return self._result(spec, release_id, path, "published", mine,
                            charge=charged, note=f"stream point {plan.days} of {plan.horizon}")

    def _stream_points_written(self, spec: ReleaseSpec, points: dict[str, set]) -> set:
        """The days written by the stream's releases that are not withdrawn (``points``: release id
        -> its days, :func:`~dp_spark.delta.release_table.stream_points`)."""
        withdrawn: set[str] = set()
        if self.mode == "official":
            from dp_spark.governance.versions import history

            withdrawn = {v["release_id"] for v in history(self.ledger, spec.family) if v["state"] == "withdrawn"}
        return {day for rid, days in points.items() if rid not in withdrawn for day in days}

    def _commit_stream(self, sid: str) -> None:
        """Commit the stream's ledger entry once one of its points is written (idempotent)."""
        entry = self.ledger.find(sid)
        if entry is not None and entry.state != "committed":
            try:
                self.ledger.commit(sid, entry.owner_token)
            except ReleaseConflictError:
                pass  # a concurrent run took the entry over or committed it meanwhile

    def _version(self, spec: ReleaseSpec, release_id: str) -> None:
        """Official releases: make this the family's current version and regenerate its
        statement, now (``refresh="each"``) or in :meth:`finish` (``"deferred"``: one transaction
        for the whole batch; a crash before it leaves committed releases unversioned, and their
        rerun, a cache hit, versions them)."""
        if self.mode != "official":
            return
        if self.refresh == "deferred":
            item = (spec.family, release_id, spec.series_key)
            if item not in self._pending_versions:
                self._pending_versions.append(item)
            return
        from dp_spark.governance import after_official_release

        written, self._written = self._written, {}
        after_official_release(self.spark, env=self.env, family=spec.family, release_id=release_id,
                               principal=self.principal, ledger=self.ledger,
                               releases_dir=self.access.releases_dir, series_key=spec.series_key,
                               written=written)

    def _keep_written(self, release_id: str, mine: list[dict[str, Any]]) -> None:
        """Keep the statement's summary of ``mine``, the rows of an official release that THIS
        engine's write committed (exactly those rows: see :meth:`_write_once`), for the family's
        statement (:meth:`_version` or :meth:`finish`), which then does not read them back."""
        if self.mode != "official" or not mine:
            return
        from dp_spark.governance.statement import summarise_release_rows

        (summary,) = summarise_release_rows(mine)
        self._written[release_id] = summary

    def _write_once(self, path: str, release_id: str, rows, owner: str, *, fresh: bool):
        """Write the release insert-if-absent; None when OUR cells are the release, else the
        stored cells of the run whose write landed first.

        The write is Delta's idempotent append keyed by the release id: at most one write of a
        release id lands; a later one is skipped silently, a concurrent one fails. Whose landed
        is decided so:

        * no read: our reservation was *fresh* (we inserted the ledger entry, so no run owned
          it before us), the append raised nothing, and after it the ledger still names us as
          owner. Owners only ever change to a new token (a takeover), so nobody else owned the
          reservation up to that moment, and only an owner writes: no write of this release id
          preceded ours, so ours was not skipped: it landed, and any later one is skipped;
        * otherwise (we took a reservation over, a concurrent write won, or we lost ownership
          while writing): read the stored cells back. If they publish our numbers exactly
          they are ours; if not, another run's draw is the release and ours is discarded.
        """
        from dp_spark.delta.release_table import ConcurrentReleaseWrite, read_release, same_cells, write_release

        if not rows:
            # a release with private keys of which none was selected: nothing to write. On a
            # fresh reservation nobody wrote before us; after a takeover, a previous owner's
            # non-empty draw, if it landed, is the release
            stored = [] if fresh else read_release(self.spark, path, release_id)
            return stored or None
        try:
            write_release(self.spark, path, rows)
            raced = False
        except ConcurrentReleaseWrite:
            raced = True
        stored = self._landed(path, release_id, owner, fresh=fresh, raced=raced)
        return None if stored is None or same_cells(stored, rows) else stored

    def _landed(self, path: str, release_id: str, owner: str, *, fresh: bool, raced: bool) -> Optional[list]:
        """After a release write: None when this run's own write landed (a fresh reservation,
        no concurrent write, still its owner); otherwise the cells stored under the release id
        (the winner's), which must exist."""
        from dp_spark.delta.release_table import read_release

        if fresh and not raced:
            entry = self.ledger.find(release_id)
            if entry is not None and entry.owner_token == owner:
                return None
        stored = read_release(self.spark, path, release_id)
        if not stored:  # cannot happen: a write of this id landed (ours or the winner's)
            raise DpSparkError(f"internal: release {release_id[:12]} was written but no cell is stored")
        return stored

    def _lost_the_write(self, spec, release_id, path, stored, charged, committed: bool) -> ReleaseResult:
        """Another run (which took the reservation over) wrote first: its cells (``stored``) are
        the release; ours were never written or shown, and the reservation is charged once (by
        this run, if it made the reservation: ``charged`` says so, here and in the audit). The
        version is recorded here too when the entry is committed (the other run may not have
        versioned it)."""
        self._audit(spec, "cache_hit", release_id, charged, "concurrent run won the write")
        self._record(spec, release_id, version=committed)
        return self._result(spec, release_id, path, "cache_hit", stored, charge=charged,
                            note="a concurrent run published it")

    def _commit_if_owner(self, release_id: str, owner: str) -> bool:
        """Commit the reservation, unless another run owns it now (it took it over). True when
        the ledger entry is committed afterwards (by this run, or already by the other): only
        then may this run record a version of the release (a version of an entry that is not
        committed makes the family's statement inconsistent). False: the run that owns the
        reservation commits it and records the version; any later run heals both."""
        try:
            self.ledger.commit(release_id, owner)
            return True
        except ReleaseConflictError:
            entry = self.ledger.find(release_id)
            if entry is not None and entry.state == "committed":
                return True
            log.info("release %s: written; the reservation is owned by another run", release_id[:12])
            return False

    def _reserve(self, spec, release_id, charge, event_json, owner):
        deadline = time.monotonic() + self.env.lease_seconds + 10
        while True:
            try:
                return self.ledger.reserve(
                    spec.budget_id, release_id, charge, event_json, principal=self.principal,
                    code_version=CODE_VERSION, release_family=spec.family, owner_token=owner,
                    lease_seconds=self.env.lease_seconds,
                )
            except ReleaseConflictError:
                # another live run owns it: wait for its commit (then serve its output) or
                # for its lease to expire (then take the reservation over, no second charge)
                entry = self.ledger.find(release_id)
                if entry is not None and entry.state == "committed":
                    return None
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def _exhausted(self, spec, release_id, path, exc: BudgetExceededError, degraded_from):
        from dp_spark.delta.release_table import latest_release_id

        policy = spec.on_exhausted.policy
        if policy == "return_existing":
            existing = latest_release_id(self.spark, path, spec.family, exclude=release_id)
            if existing is not None:
                self._audit(spec, "returned_existing", existing, None, "budget exhausted")
                return self._stored(spec, existing, path, "returned_existing",
                                    "budget exhausted: this is the latest committed release of the family, "
                                    "not a release of the current input")
        if policy == "degrade" and degraded_from is None:
            fallback = load_release_spec(Path(spec.source).parent / spec.on_exhausted.fallback)
            self._audit(spec, "degraded", None, None, f"fallback {fallback.name}")
            return self.publish(fallback, _degraded_from=spec.name)
        # validate's words for the refusal (a per-release or delta-cap refusal keeps its own)
        if type(exc) is BudgetExceededError and exc.budget_id == spec.budget_id and exc.spent is not None:
            left = exc.cap - exc.spent if exc.spent.fits_in(exc.cap) else type(exc.cap).zero()
            status = self.ledger.status(spec.budget_id, full=False)
            exc = precheck.budget_refused(spec, exc.cap, left, status.window_start)
        self._audit(spec, "refused_budget", release_id, None, str(exc))
        raise exc

    def _rows(self, spec, plan, policy, release_id, snapshot, cells: CellColumns, *,
              stream_note: Optional[dict] = None) -> CellColumns:
        """The release's rows: its cells (each with ``keys``: {column: key}, {} for the global
        cell) and the release's common fields, as columns. ``stream_note``: a stream's point
        (its charge is the stream's, and a unit's rows reach a node of every level)."""
        common = self._common(spec, plan, policy, release_id, snapshot)
        if stream_note is not None:
            common["charge_json"] = json.dumps({**json.loads(common["charge_json"]), "stream": stream_note},
                                               sort_keys=True)
            common["parallel_composition"] = False
        return cells.with_common(common)

    def _common(self, spec, plan, policy, release_id, snapshot) -> dict[str, Any]:
        """The fields every row of a release shares (its metadata; no value of any cell)."""
        now = self.clock().replace(tzinfo=None)
        statement = _statement(spec, policy)
        charge = spec.charge
        common = {
            "release_id": release_id, "release_family": spec.family, "release_name": spec.name,
            "spec_version": spec.version(), "mode": self.mode,
            "key_column": ",".join(spec.key_columns) or None,
            "confidence": float(spec.confidence),
            "charge_json": json.dumps(
                {"charge": charge.to_json(), "mean_split_to_sum": None if plan.mean_split is None
                 else str(plan.mean_split), "event": json.loads(canonical_json(plan.event)),
                 "split": plan.split_json()},
                sort_keys=True),
            "charge_epsilon": float(charge.epsilon) if isinstance(charge, PureDP) else None,
            "charge_rho": float(charge.rho) if isinstance(charge, ZCDP) else None,
            "charge_delta": float(charge.delta_part) if charge.delta_part > 0 else None,
            "statement_epsilon": statement["epsilon"], "statement_delta": statement["delta"],
            "budget_id": spec.budget_id,
            "bounds_json": json.dumps(bounds_to_json(spec.bounds), sort_keys=True),
            "privacy_unit": spec.unit.kind.value, "unit_column": spec.unit.column,
            "neighbouring": spec.neighbouring.value,
            "parallel_composition": spec.bounds.max_partitions_per_unit == 1 and spec.cells > 1,
            "suppressed": False,
            "input_table_id": snapshot.table_id, "input_version": snapshot.version,
            "code_version": CODE_VERSION, "created_at": now,
        }
        return common

    def noise_on_executors(self, spec: ReleaseSpec) -> bool:
        """Whether ``spec`` is noised on the executors: a release of public keys (no windows, no
        ``min_group_size``) with at least the env's ``executor_noise_cells`` cells (key tuples x
        statistics). Below it (and for the other releases) the partials are streamed to the
        driver and noised there, as before. Either way the same samplers, grids and
        post-processing: the published cells have the same distribution."""
        from dp_spark.backends.spark import executor_noise_supported

        threshold = getattr(self.env, "executor_noise_cells", 250_000)
        return executor_noise_supported(spec) and spec.cells * len(spec.statistics) >= threshold

    def _write_frame_once(self, path: str, release_id: str, spec, plan, policy, snapshot, partials_df,
                          owner: str, *, fresh: bool):
        """:meth:`_write_once` for executor-side noise: the noisy cells are computed by the
        write's own Spark job (:func:`~dp_spark.backends.spark.noisy_release_frame`) and land in
        one idempotent Delta commit; None when ours landed, else the stored cells. Our cells
        never reach the driver, so when the ledger cannot tell (a takeover, a concurrent write)
        the stored cells are returned whoever drew them: they are the release."""
        from pyspark.sql import functions as F

        from dp_spark.backends.spark import NOISY_CELL_FIELDS, NOISY_KEY_PREFIX, noisy_release_frame
        from dp_spark.delta.release_table import RELEASE_SCHEMA, ConcurrentReleaseWrite, write_release_frame

        cells = noisy_release_frame(partials_df, plan, self.source)
        common = self._common(spec, plan, policy, release_id, snapshot)
        noisy = {f for f, _ in NOISY_CELL_FIELDS}
        names = [ks.column for ks in spec.key_sets]
        cols = []
        for f in RELEASE_SCHEMA.fields:
            if f.name in noisy:
                col = F.col(f.name)
            elif f.name == "keys":
                col = (F.map_from_arrays(F.array(*[F.lit(c) for c in names]),
                                         F.array(*[F.col(f"{NOISY_KEY_PREFIX}{j}") for j in range(len(names))]))
                       if names else F.create_map().cast("map<string,string>"))
            else:
                col = F.lit(common[f.name])
            cols.append(col.cast(f.dataType.simpleString()).alias(f.name))
        try:
            write_release_frame(path, cells.select(*cols), release_id)
            raced = False
        except ConcurrentReleaseWrite:
            raced = True
        return self._landed(path, release_id, owner, fresh=fresh, raced=raced)


def publish(spec: ReleaseSpec, env: EnvConfig, **kwargs) -> ReleaseResult:
    """One-shot helper: ``Engine(env, **kwargs).publish(spec)``, returning once the ledger's
    mirror has caught up too (the engine is closed)."""
    with Engine(env, **kwargs) as engine:
        return engine.publish(spec)
