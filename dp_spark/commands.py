"""What the ``dp-spark`` commands do, without the command line: the env to use, a batch publish,
a refresh over days, the checks of ``validate``, a rollback, an accepted policy, the demo data.

The CLI (:mod:`dp_spark.cli`) parses arguments, calls one function here and prints what it
returns; the job scripts (``jobs/*.py``) run the same commands. Nothing here parses arguments
or prints. Imports point down (engine, schedule, ledger, governance, config); nothing below
imports this module.

Function-level imports here are of the Spark side only: the engine (about 0.3 s to import) and
the session, release writer and demo data (pyspark, about 0.3 s more), so that ``plan``,
``validate``, ``explore`` and ``budget`` -- which start no Spark -- and ``dp-spark --help`` do
not load them.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from datetime import date
from typing import Any, Callable, Mapping, Optional, Sequence

from dp_spark import precheck
from dp_spark.api import plan_table
from dp_spark.config import EnvConfig, ReleaseSpec, load_env, load_release_spec
from dp_spark.env_file import DEFAULT_ENV, ENV_VAR, resolve_env
from dp_spark.errors import BudgetExceededError, ConfigError, DpSparkError
from dp_spark.governance import rollback_family
from dp_spark.governance.access import (
    PRINCIPAL_ENV,
    AccessPolicy,
    access_policy_for_env,
    authorize,
    resolve_principal_with_source,
)
from dp_spark.ledger import open_ledger, sqlite_path
from dp_spark.ledger.records import UnknownBudgetError
from dp_spark.ledger.policy import BudgetPolicy, load_policies
from dp_spark.spec.errors import did_you_mean
from dp_spark.schedule import DayResult, backfill, day_spec, days_between, today_utc

log = logging.getLogger("dp_spark.commands")

__all__ = ["DEFAULT_ENV", "ENV_VAR", "BatchRefusedError", "BatchResult", "Checker", "DemoData", "Outcome",
           "SpecCheck", "accept_policy", "checker", "env_for", "generate_demo", "load_specs", "plan_rows",
           "publish_batch", "refresh", "resolve_env", "rollback", "show_family", "unexpected"]

def env_for(given: Optional[str], environ: Optional[Mapping[str, str]] = None) -> EnvConfig:
    """The loaded env (:func:`resolve_env`)."""
    return load_env(resolve_env(given, environ))


def unexpected(exc: BaseException) -> str:
    """An error that is not a dp_spark error (Spark, I/O): its class only, since its message
    may quote input data."""
    return f"{type(exc).__name__} (not a dp_spark error; its message is not shown, as it may quote data)"


# -- publish: validate every spec, then publish each ------------------------------------------
@dataclass(frozen=True)
class Outcome:
    """One spec of a batch: its result, or its error (never a data value)."""

    spec: ReleaseSpec
    result: Any = None
    error: Optional[str] = None


@dataclass(frozen=True)
class BatchResult:
    outcomes: list[Outcome]
    #: versioning the batch (one commit) and the statements failed: the releases are committed
    finish_error: Optional[str] = None

    @property
    def failed(self) -> int:
        return sum(1 for o in self.outcomes if o.result is None)


class BatchRefusedError(ConfigError):
    """Some specs of a batch were refused at validation: nothing was published or charged."""

    def __init__(self, refused: list[tuple[ReleaseSpec, DpSparkError]], total: int) -> None:
        super().__init__(f"{len(refused)} of {total} specs refused before any charge; nothing was published")
        self.refused = refused
        self.total = total


def load_specs(paths: Sequence[str], *, day: Optional[date] = None) -> list[ReleaseSpec]:
    """The specs of ``paths``, all validated before Spark starts; with ``day``, each restricted
    to that day's cell (a scheduled daily run: ``<name>_YYYYMMDD``)."""
    specs = [load_release_spec(c) for c in paths]
    if day is not None:
        iso = day.isoformat()
        specs = [s.for_keys((iso,), name_suffix=f"_{iso.replace('-', '')}") for s in specs]
    return specs


def publish_batch(env: EnvConfig, specs: Sequence[ReleaseSpec], *, mode: str = "official",
                  engine: Any = None) -> BatchResult:
    """Validate every spec (access, policy, plan, input schema, bindings) and admit it, then
    publish each: one failure does not stop the others; the successes are versioned together
    (:meth:`~dp_spark.engine.Engine.finish`). A refusal at validation raises
    :class:`BatchRefusedError` before the first charge (nothing created); a DpSparkError while
    setting up (env, Spark, ledger) propagates likewise. Without ``engine``, what no Spark
    session can change is refused before one starts (:func:`refuse_before_spark`): a refused
    validation as above, a budget that cannot pay as that spec's failure (as at its
    reservation); when every spec fails so, no session starts at all."""
    owned = engine is None
    early: dict[int, BudgetExceededError] = {}
    if owned:
        # what no session can change, before one starts (a budget refusal: that spec fails)
        early = refuse_before_spark(env, specs, mode)
        if len(early) == len(specs):
            return BatchResult([Outcome(s, error=str(early[i])) for i, s in enumerate(specs)])
        from dp_spark.engine import Engine  # pyspark side: not for the Spark-free commands

        engine = Engine(env, mode=mode, refresh="deferred")
    validated, refused = [], []
    for i, spec in enumerate(specs):
        if i in early:
            continue
        try:
            validated.append((i, engine.validate(spec)))
        except DpSparkError as exc:
            refused.append((spec, exc))
    if refused:
        raise BatchRefusedError(refused, len(specs))
    for _, v in validated:  # budget registration and dataset binding: refusals charge nothing
        engine.admit(v)
    outcomes = {i: Outcome(s, error=str(exc)) for i, exc in early.items() for s in (specs[i],)}
    for i, v in validated:
        try:
            outcomes[i] = Outcome(v.spec, engine.publish(v.spec, validated=v))
        except DpSparkError as exc:
            outcomes[i] = Outcome(v.spec, error=str(exc))
        except Exception as exc:  # noqa: BLE001 - reported per spec; the other specs still run
            log.error("%s: publish failed with %s", v.spec.name, type(exc).__name__)
            outcomes[i] = Outcome(v.spec, error=unexpected(exc))
    finish_error = None
    try:
        engine.finish()  # versions (one commit) and statements for what succeeded; mirror started
    except DpSparkError as exc:
        finish_error = str(exc)
    except Exception as exc:  # noqa: BLE001
        finish_error = unexpected(exc)
    if owned:
        engine.close()  # the ledger's Delta mirror, refreshed in the background, has caught up
    return BatchResult([outcomes[i] for i in range(len(specs))], finish_error)


# -- refresh / backfill ------------------------------------------------------------------------
def refresh(env: EnvConfig, spec_paths: Sequence[str], start: date, end: date, *, mode: str = "official",
            republish: bool = False, keep_going: bool = False,
            on_day: Optional[Callable[[DayResult], None]] = None, engine: Any = None) -> list[DayResult]:
    """Publish each day of ``start..end`` of each day-keyed spec (:func:`dp_spark.schedule.backfill`).
    Every day of every spec is checked before Spark starts; the days' versions (one ledger
    transaction) and the statement are written once per spec, the ledger mirror in the background. In
    official mode each spec's family is then rewritten as a series,
    ``<output_root>/<family>_current`` (one row per day and statistic: each day's current
    version, :func:`dp_spark.governance.versions.series_view`), registered as the view
    ``<series_schema>.<family>_current`` when the env names a ``series_schema``.
    ``engine``: reuse one (tests, notebooks)."""
    if end < start:
        raise ConfigError(f"--to {end} is before --from {start}")
    # relative date keys (``end: today``) resolve against the job's last day, never the data
    specs = [load_release_spec(c, run_date=max(end, today_utc())) for c in spec_paths]
    for s in specs:
        for d in days_between(start, end):
            day_spec(s, d)
    owned = engine is None
    if owned:
        from dp_spark.engine import Engine  # pyspark side

        engine = Engine(env, mode=mode, refresh="deferred")
    results: list[DayResult] = []
    try:
        for s in specs:
            results += backfill(engine, s, start, end, republish=republish, stop_on_error=not keep_going,
                                on_day=on_day)
            if mode == "official":  # the family as a series: <output_root>/<family>_current
                from dp_spark.governance.versions import series_current_path, write_series_current

                engine.finish()  # the versions of the days just published (one transaction): the series reads them
                write_series_current(engine.spark, engine.table_path(s), engine.ledger, s.family,
                                     series_current_path(env.output_root, s.family),
                                     catalog_schema=env.series_schema)
    finally:
        if owned:
            try:
                engine.finish()
            finally:
                engine.close()  # wait for the ledger mirror's background refresh
    return results


# -- validate: every check publish runs before Spark starts -----------------------------------
@dataclass(frozen=True)
class SpecCheck:
    """What ``validate`` found for one spec that passed."""

    spec: ReleaseSpec
    policy: BudgetPolicy
    principal: str
    mode: str
    #: None when the ledger cannot be read from here (``budget_note`` says why)
    budget: Optional[precheck.BudgetLeft]
    budget_note: str = ""


@dataclass(frozen=True)
class Checker:
    """The env's policies, access policy and the principal, read once for several specs."""

    env: EnvConfig
    policies: Mapping[str, BudgetPolicy]
    access: AccessPolicy
    principal: str
    principal_source: str
    mode: str
    #: also check the columns the spec reads against the input's schema (starts Spark)
    with_data: bool = False
    _spark: list = field(default_factory=list, compare=False, repr=False)

    def input_columns(self, spec: ReleaseSpec) -> None:
        """Every column ``spec`` reads against its input's schema, read from the Delta log
        (the DataFrame reader's schema: no row read; :func:`dp_spark.precheck.check_input_columns`,
        which publish runs too). Starts a Spark session (once per checker)."""
        from dp_spark.delta.release_table import delta_schema  # pyspark
        from dp_spark.errors import SchemaError
        from dp_spark.spark import get_or_create_session

        if not self._spark:
            self._spark.append(get_or_create_session(master=self.env.master, extra_conf=dict(self.env.spark_conf)))
        location = self.env.dataset_location(spec.dataset)
        schema = delta_schema(self._spark[0], location)
        if schema is None:
            raise SchemaError(f"{spec.source}: dataset '{spec.dataset}' has no Delta table at '{location}'")
        precheck.check_input_columns(spec, *precheck.schema_names(schema))

    def check(self, spec: ReleaseSpec) -> SpecCheck:
        """Budget policy (declared, measure, dataset, unit), per-release and delta limits, the
        dataset binding in the env, access and pre-registration for the principal (not
        audited), and the charge against what is left of the budget now. Raises the
        DpSparkError publish would raise; reads no data, starts no Spark, creates nothing.
        With ``with_data``, the columns the spec reads are checked against the input's schema
        (:meth:`input_columns`: starts Spark, reads no row); publish checks them likewise,
        before any charge."""
        policy = precheck.policy_for(spec, self.policies, self.env.policies)
        precheck.check_charge_limits(spec, policy)
        self.env.dataset_location(spec.dataset)
        precheck.check_key_tables(spec, self.env.public_datasets, tuple(self.env.datasets), self.env.source)
        precheck.check_access(self.access, self.principal, spec, self.mode)
        if self.with_data:
            self.input_columns(spec)
        if not spec.charge.fits_in(policy.cap):  # over the whole cap: refused whatever the ledger says
            precheck.require_fit(precheck.BudgetLeft(spec.budget_id, policy.cap, None), spec, policy)
        try:
            left = precheck.budget_left(self.env.ledger_url, spec, policy)
        except DpSparkError as exc:  # a ledger this machine cannot reach or open: said, not a refusal
            return SpecCheck(spec, policy, self.principal, self.mode, None,
                             f"not checked against the ledger, which cannot be read from here "
                             f"({type(exc).__name__}: {exc}); the charge fits the cap")
        precheck.require_fit(left, spec, policy)
        return SpecCheck(spec, policy, self.principal, self.mode, left)


    def refuse_before_spark(self, spec: ReleaseSpec) -> None:
        """The validation checks of :meth:`check` whose outcome a Spark session cannot change,
        for ``publish`` to run before it starts one: the refusal is the one publish would give
        at validation, with the same message and audit row, only sooner (nothing is created).

        The budget policy (declared, measure, dataset, unit), the per-release and delta
        limits, the dataset's binding in the env, the key tables' declaration; access only for
        a declared principal (``$DP_SPARK_PRINCIPAL`` where honoured, which the engine takes
        too): otherwise the platform's user decides (the Spark user, a notebook's user), which
        needs the session. The budget fit is :meth:`budget_refusal`."""
        policy = precheck.policy_for(spec, self.policies, self.env.policies)
        precheck.check_charge_limits(spec, policy)
        self.env.dataset_location(spec.dataset)
        precheck.check_key_tables(spec, self.env.public_datasets, tuple(self.env.datasets), self.env.source)
        if self.principal_source in ("env", "given"):
            authorize(self.access, self.principal, "publish", mode=self.mode, spec=spec,
                      ledger=_AuditOnRefusal(self.env.ledger_url), budget_id=spec.budget_id)

    def budget_refusal(self, spec: ReleaseSpec) -> Optional[BudgetExceededError]:
        """The refusal publish's reservation would give ``spec`` (same message, audited alike),
        known before Spark starts, or None: only where nothing could be served instead,
        ``on_exhausted: reject`` and no release of the spec's family charged to its budget yet
        (a rerun of a release is a cache hit, served even when the budget is spent; a family
        with no release cannot have one). A ledger this machine cannot open: None (the engine
        says so when it opens it)."""
        if spec.on_exhausted.policy != "reject":
            return None
        policy = precheck.policy_for(spec, self.policies, self.env.policies)
        try:
            left = precheck.budget_left(self.env.ledger_url, spec, policy)
            if left.fits or _family_charged(self.env.ledger_url, spec):
                return None
            precheck.require_fit(left, spec, policy)
        except BudgetExceededError as exc:
            _AuditOnRefusal(self.env.ledger_url).append_audit(
                principal=self.principal, action=f"publish:{self.mode}", spec_name=spec.name,
                spec_version=spec.version(), decision="refused_budget", release_id=None, charge_json=None,
                detail=str(exc))
            return exc
        except DpSparkError:
            return None
        return None


def _family_charged(ledger_url: str, spec: ReleaseSpec) -> bool:
    """Whether the ledger (if it exists) holds any entry of ``spec``'s family on its budget."""
    path = sqlite_path(ledger_url)
    if path is not None and not os.path.exists(path):
        return False
    with open_ledger(ledger_url) as ledger:
        if spec.budget_id not in ledger.budget_ids():
            return False
        return any(e.release_family == spec.family for e in ledger.entries(spec.budget_id))


class _AuditOnRefusal:
    """The ledger at a URL, opened (for SQLite: created, as the engine's is) only to write a
    refusal's audit row."""

    def __init__(self, url: str) -> None:
        self._url = url

    def append_audit(self, **row: Any) -> None:
        with open_ledger(self._url) as ledger:
            ledger.append_audit(**row)


def refuse_before_spark(env: EnvConfig, specs: Sequence[ReleaseSpec], mode: str) -> dict[int, BudgetExceededError]:
    """What publish can refuse before any Spark session starts. The validation refusals of
    every spec (:meth:`Checker.refuse_before_spark`) raise :class:`BatchRefusedError` together,
    as at validation; then the budget refusals (:meth:`Checker.budget_refusal`) are returned by
    the spec's index: those specs fail as at the reservation, the others are still published."""
    check = checker(env, mode=mode)
    refused: list[tuple[ReleaseSpec, DpSparkError]] = []
    for spec in specs:
        try:
            check.refuse_before_spark(spec)
        except DpSparkError as exc:
            refused.append((spec, exc))
    if refused:
        raise BatchRefusedError(refused, len(specs))
    out: dict[int, BudgetExceededError] = {}
    for i, spec in enumerate(specs):
        exc = check.budget_refusal(spec)
        if exc is not None:
            out[i] = exc
    return out


def checker(env: EnvConfig, *, principal: Optional[str] = None, mode: str = "official",
            environ: Optional[Mapping[str, str]] = None, with_data: bool = False) -> Checker:
    """A :class:`Checker` for ``env``; ``principal`` defaults to the one a job would run as
    (without Spark: ``$DP_SPARK_PRINCIPAL`` where honoured, else the OS user). A principal
    given is a declared identity: matched strictly, as with ``$DP_SPARK_PRINCIPAL`` (the local
    default grant never applies to it)."""
    if mode not in ("official", "exploration"):
        raise ConfigError("mode must be 'official' or 'exploration'")
    environ = os.environ if environ is None else environ
    if principal:
        who, source = principal, "given"
        environ = {**environ, PRINCIPAL_ENV: principal}
    else:
        who, source = resolve_principal_with_source(None, environ, env_name=env.name)
    return Checker(env, load_policies(env.policies), access_policy_for_env(env, environ), who, source, mode,
                   with_data=with_data)


# -- plan ----------------------------------------------------------------------------------------
def plan_rows(spec: ReleaseSpec, policy: Optional[BudgetPolicy], group_size: Optional[int]) -> list[dict]:
    """Per statistic, what the engine will publish for a cell of ``group_size`` rows: each
    kind's own post-processing (:func:`dp_spark.api.plan_table`), whichever form the spec was
    written in."""
    return plan_table(spec, group_size=group_size, budget_policy=policy)


# -- admin commands ------------------------------------------------------------------------------
def rollback(env: EnvConfig, family: str, reason: str, *, day: Optional[str] = None) -> tuple[str, Optional[str]]:
    """Withdraw the current version of a release family and restore the previous one (admin;
    the refusal is audited; no budget refunded). Returns (withdrawn, restored). A series (a
    family refreshed a day at a time): the current version of ``day`` (default: the latest
    published one), that day's previous version restored, and ``<output_root>/<family>_current``
    rewritten when it exists."""
    from dp_spark.spark import get_or_create_session  # pyspark

    precheck.require_existing_ledger(env.ledger_url)  # nothing was published with this env
    access = access_policy_for_env(env)
    spark = get_or_create_session(master=env.master, extra_conf=dict(env.spark_conf))
    principal = resolve_principal_with_source(spark, env_name=env.name)[0]
    from dp_spark.governance.versions import history, is_series, series_current_path, write_series_current

    with open_ledger(env.ledger_url) as ledger:
        families = {v.family for v in ledger.versions()}
        if family not in families:  # names only: the families this env has published
            raise ConfigError(f"--family: no release of family '{family}' was published with this env"
                              f"{did_you_mean(family, families)} (its families: {', '.join(sorted(families)) or 'none'})")
        out = rollback_family(spark, env=env, family=family, principal=principal, reason=reason,
                              ledger=ledger, access=access, series_key=day)
        if is_series(history(ledger, family)):
            from dp_spark.delta.release_table import table_exists

            current = series_current_path(env.output_root, family)
            if table_exists(spark, current):
                write_series_current(spark, f"{env.output_root}/{family}", ledger, family, current,
                                     catalog_schema=env.series_schema)
        return out


def accept_policy(env: EnvConfig, budget_id: str, reason: str, *, spark: Any = None,
                  environ: Optional[Mapping[str, str]] = None):
    """The env's admin applies the env's policy file for one budget: the principal is resolved
    like a job's and must hold ``admin`` (a refusal is audited); the change and its reason go
    to the policy history and the audit log in one ledger transaction. Returns the policy
    (principal, record); the record is None when the file equals the registered policy."""
    environ = dict(os.environ) if environ is None else environ
    if not reason.strip():
        raise DpSparkError("--reason must say why the policy changes")
    policies = load_policies(env.policies)
    if budget_id not in policies:
        raise UnknownBudgetError(budget_id)
    precheck.require_existing_ledger(env.ledger_url)
    access = access_policy_for_env(env, environ)
    principal = resolve_principal_with_source(spark, environ, env_name=env.name)[0]
    with open_ledger(env.ledger_url) as ledger:
        authorize(access, principal, "admin", ledger=ledger, spec_name=f"accept-policy:{budget_id}")
        return principal, ledger.accept_policy(policies[budget_id], principal=principal, reason=reason.strip())


def show_family(env: EnvConfig, family: str, *, series: bool = False,
                columns: Optional[Sequence[str]] = None) -> list[dict[str, Any]]:
    """The published rows of a release family's current version (official mode), sorted by key
    and statistic: ``{key, statistic, value, ci_low, ci_high, suppressed}`` each; of a series
    (versions keyed by day: a daily refresh), every day's current version, as
    ``<family>_current`` holds it (:func:`dp_spark.governance.versions.published_view`).
    ``series``: the family as a series whatever its versions (each key's latest version not
    withdrawn: :func:`dp_spark.governance.versions.series_view`; a series refreshed before the
    ledger kept days). Reads the
    family's release table (``<output_root>/<family>``) and the ledger's version record;
    charges nothing, draws no noise. ``columns``: other columns of the release table to return
    (``dp-spark chart`` reads the noise fields and bands too); one a table written before it
    existed lacks is left out."""
    from dp_spark.delta.release_table import table_exists
    from dp_spark.governance.versions import published_view, series_view
    from dp_spark.spark import get_or_create_session

    precheck.require_existing_ledger(env.ledger_url)
    spark = get_or_create_session(master=env.master, extra_conf=dict(env.spark_conf))
    path = f"{env.output_root}/{family}"
    if not table_exists(spark, path):
        raise ConfigError(f"family {family!r} has no release table under the env's output_root")
    cols = list(dict.fromkeys(["key", "statistic", "value", "ci_low", "ci_high", "suppressed", *(columns or ())]))
    with open_ledger(env.ledger_url) as ledger:
        view = series_view if series else published_view
        df = view(spark, path, ledger, family)
        rows = df.select(*[c for c in cols if c in df.columns]).collect()
    return sorted((r.asDict() for r in rows), key=lambda r: (r["key"], r["statistic"]))


@dataclass(frozen=True)
class DemoData:
    location: str
    written: bool
    rows: Optional[int] = None


def generate_demo(env: EnvConfig, *, force: bool = False) -> DemoData:
    """Write the env's demo dataset unless it exists (a rewrite is a new input snapshot, so the
    next publish would be a new release and charge the budget again)."""
    from dp_spark.demo_data import generate_events  # pyspark
    from dp_spark.delta.release_table import table_exists
    from dp_spark.spark import get_or_create_session

    demo = dict(env.demo)
    out = env.dataset_location(str(demo.get("dataset", "demo_events")))
    spark = get_or_create_session(master=env.master, extra_conf=dict(env.spark_conf))
    if table_exists(spark, out) and not force:
        return DemoData(out, written=False)
    start = demo.get("start_date", date(2026, 11, 1))
    start = start if isinstance(start, date) else date.fromisoformat(str(start))
    events = generate_events(spark, n_users=int(demo.get("users", 20000)), days=int(demo.get("days", 30)),
                             start_date=start, seed=int(demo.get("seed", 7)))
    events.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(out)
    return DemoData(out, written=True, rows=spark.read.format("delta").load(out).count())
