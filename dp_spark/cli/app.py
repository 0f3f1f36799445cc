"""The ``dp-spark`` command (click): one group, one function per command.

    dp-spark publish | plan | validate | explore | refresh | backfill | budget ... | rollback
             | show | generate-demo | schema

Thin: arguments -> one function of :mod:`dp_spark.commands` (or the engine's API) -> printed
lines and an exit status. Every path, table name, the ledger and the budget policies come from
the env file (``--env``, the same option on every command), resolved against the env file's
project root, never the current directory. See docs/cli.md.

Adding a command: a function decorated with ``@app.command(NAME, short_help=..., help=...)``
returning its exit status; its ``short_help`` is its line in ``dp-spark --help``.

Two imports stay in functions, the slow ones only one command needs: the explorer's chart
(matplotlib, about 1.2 s to import) and the JSON Schema models (pydantic, about 0.3 s), so that
``dp-spark --help`` and the other commands load neither. Spark and the engine are imported by
:mod:`dp_spark.commands` only when a command starts them.
"""

from __future__ import annotations

import csv
import logging
import os
import sys
from datetime import date
from fractions import Fraction
from pathlib import Path
from typing import Any, Optional, Sequence

import click

from dp_spark import __version__, commands, precheck
from dp_spark.accountant import Accountant
from dp_spark.cli.base import (
    EXIT_CLOSED_PIPE,
    Command,
    Group,
    closed_pipe_safe,
    description,
    env_option,
    error,
    parse,
    run,
    warning,
)
from dp_spark.cli.budget import BUDGET_SUBCOMMANDS, as_epsilon, budget
from dp_spark.commands import plan_rows
from dp_spark.env_file import DEFAULT_ENV, ENV_VAR, resolve_env
from dp_spark.config import load_release_spec
from dp_spark.errors import DpSparkError
from dp_spark.evaluation import explorer
from dp_spark.governance import statement_dir
from dp_spark.ledger.policy import load_policies
from dp_spark.report import cells_text, decimal, percent, print_failure, print_summary
from dp_spark.schedule import FAILED, SCHEDULES, SERVED, STALE, format_day, parse_day, schedule_cost

__all__ = ["COMMANDS", "DEFAULT_ENV", "ENV_VAR", "EXIT_CLOSED_PIPE", "app", "closed_pipe_safe", "command",
           "explore_main", "generate_demo_main", "main", "parse_args", "plan_main", "plan_rows", "publish_main",
           "refresh_main", "resolve_env", "rollback_main", "validate_main"]

MODES = click.Choice(["official", "exploration"])


def _top_epilog() -> str:
    lines = ["budget subcommands (dp-spark budget SUBCOMMAND):"]
    lines += [f"  {name:<16}{text}" for name, text in BUDGET_SUBCOMMANDS.items()]
    lines += ["",
              "every command takes --env ENV: the env file (paths, Spark, ledger, budget policies), resolved",
              f"against the env file's project root. Default: ${ENV_VAR}, else {DEFAULT_ENV}.",
              "",
              "exit codes: 0 ok; 1 a release (or budget command) failed or was refused while running;",
              "2 usage or configuration error, or refused before anything was done; 3 refresh --strict with a",
              "stale day. dp-spark COMMAND --help for a command's options and exit codes; docs/cli.md."]
    return "\n".join(lines)


@click.group("dp-spark", cls=Group, help="dp_spark: differentially private releases on Spark.",
             epilog=_top_epilog(), subcommand_metavar="COMMAND [ARGS]...")
@click.version_option(__version__, "--version", message="dp-spark %(version)s")
def app() -> None:
    """The ``dp-spark`` group: its commands do the work."""


def _command(name: str, one_line: str, text: str = "", epilog: str = ""):
    return app.command(name, cls=Command, short_help=one_line, help=description(one_line, text),
                       epilog=epilog or None)


def _logging(quiet: bool, verbose: bool = False) -> None:
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _spark_logs(verbose)


def _spark_logs(verbose: bool) -> None:
    """Spark's JVM log and py4j's Python log at ERROR (``--verbose``: as Spark and py4j set
    them), for a JVM this command starts (:data:`dp_spark.spark.JVM_LOG_LEVEL_ENV`)."""
    from dp_spark.env_file import JVM_LOG_LEVEL_ENV

    if verbose:
        os.environ.pop(JVM_LOG_LEVEL_ENV, None)
        logging.getLogger("py4j").setLevel(logging.NOTSET)
    else:
        os.environ[JVM_LOG_LEVEL_ENV] = "error"
        logging.getLogger("py4j").setLevel(logging.ERROR)


_verbose = click.option("--verbose", is_flag=True,
                        help="show Spark's and py4j's log lines (default: errors only)")


class IsoDate(click.ParamType):
    name = "DATE"

    def convert(self, value: Any, param: Any, ctx: Any) -> date:
        if isinstance(value, date):
            return value
        try:
            return date.fromisoformat(str(value))
        except ValueError:
            self.fail(f"invalid ISO date: {value!r}", param, ctx)


class Day(click.ParamType):
    """An ISO date, ``today`` or ``yesterday`` (UTC): :func:`dp_spark.schedule.parse_day`."""

    name = "D"

    def convert(self, value: Any, param: Any, ctx: Any) -> date:
        if isinstance(value, date):
            return value
        try:
            return parse_day(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class PositiveList(click.ParamType):
    """A comma-separated list of positive numbers."""

    def __init__(self, kind: type) -> None:
        self.kind = kind
        self.name = f"{kind.__name__.upper()}S"

    def convert(self, value: Any, param: Any, ctx: Any) -> list:
        if isinstance(value, (list, tuple)):
            return list(value)
        try:
            values = [self.kind(x) for x in str(value).split(",") if x.strip()]
        except ValueError:
            self.fail(f"expected a comma-separated list of {self.kind.__name__}s", param, ctx)
        if not values or any(v <= 0 for v in values):
            self.fail("values must be > 0", param, ctx)
        return values


def _conf(multiple: bool = True, text: str = "release spec YAML; repeatable"):
    return click.option("--conf", "conf", multiple=multiple, required=True, metavar="SPEC", help=text)


# -- publish ---------------------------------------------------------------------------------
PUBLISH_EPILOG = """\
how several specs are published:
  1. every spec is validated first (spec and env files, access and pre-registration, budget
     policy, measure and per-release maximum, dataset binding, every column the spec reads
     against the input's schema (its Delta log: no row read), output and input schemas
     through a lazy plan). Any refusal here stops the job before the first charge: each
     refused spec's error is printed; nothing is published or charged, and no release
     table, salt or ledger is created (a refused permission is recorded in the audit log).
     What no Spark session can change is checked before one starts: the files, the budget
     policy and limits, access for a declared principal ($DP_SPARK_PRINCIPAL on the local
     env), and whether the budget can pay a spec whose family has no release yet
     (on_exhausted: reject; a rerun of a published release is a cache hit, always served).
  2. then each spec is published in turn; a failure (an exhausted budget, a lost input, ...)
     does not stop the others; a charge the budget refuses creates no table, salt or
     statement (when no spec's budget can pay, no Spark session starts). Every spec's outcome is printed in order: its summary, or its error (never
     data values). The releases that succeeded are then versioned together and get their
     privacy statements.

exit codes:
  0  every spec was published (or served: cache hit, returned_existing, degraded)
  1  at least one spec failed while publishing, or versioning the batch failed; the other
     specs' releases are published and printed (rerun: published ones are cache hits)
  2  refused before any charge (bad arguments, invalid env or spec, refused validation):
     nothing was published
"""


@_command("publish", "publish pre-registered releases (validates every spec first)",
          "Publish pre-registered DP releases.", PUBLISH_EPILOG)
@env_option()
@_conf(text="release spec YAML; repeat for several releases")
@click.option("--date", "day", type=IsoDate(), default=None, metavar="DATE",
              help="scheduled daily run: publish only this day's cell (ISO date)")
@click.option("--mode", type=MODES, default="official", show_default=True)
@click.option("--quiet", is_flag=True, help="print only the summary lines")
@_verbose
def publish(env: Optional[str], conf: tuple[str, ...], day: Optional[date], mode: str, quiet: bool,
            verbose: bool) -> int:
    """Validate every spec, then publish each; see :data:`PUBLISH_EPILOG` for the exit codes."""
    _logging(quiet, verbose)
    try:
        env_config = commands.env_for(env)
        specs = commands.load_specs(conf, day=day)  # all validated before Spark starts
        batch = commands.publish_batch(env_config, specs, mode=mode)
    except commands.BatchRefusedError as exc:
        for spec, why in exc.refused:
            error(f"{spec.name}: {why}")
        print(f"dp-spark: {exc}", file=sys.stderr)
        return 2
    except DpSparkError as exc:
        error(str(exc))
        return 2
    for o in batch.outcomes:
        if o.result is not None:
            statement = statement_dir(env_config) / f"{o.spec.family}.md" if mode == "official" else None
            print_summary(o.spec, o.result, statement)
        else:
            print_failure(o.spec, o.error)
            error(f"{o.spec.name}: {o.error}")
    if batch.finish_error is not None:
        error(f"versioning the batch failed: {batch.finish_error}; the releases above are "
              f"committed: rerun the job (they are cache hits) to version them")
    if batch.failed:
        print(f"dp-spark: {batch.failed} of {len(batch.outcomes)} specs failed", file=sys.stderr)
    return 1 if batch.failed or batch.finish_error is not None else 0


# -- plan --------------------------------------------------------------------------------------
PLAN_EPILOG = "Reads no data, starts no Spark session, charges nothing. Exit 0, or 2 on an invalid spec or env."


def _show(b, policy) -> str:  # rho also as epsilon at the budget's statement delta (zcdp)
    return f"{b}{as_epsilon(b, policy)}"


def _budget_line(env, spec, policy) -> str:
    """The budget left before and after this charge, from the ledger if it exists (read only)."""
    try:
        left = precheck.budget_left(env.ledger_url, spec, policy)
    except DpSparkError as exc:
        return f"budget status unavailable ({type(exc).__name__}: {exc})"
    if left.ledger_path is not None:
        return (f"no ledger yet ({left.ledger_path}): the whole cap {_show(policy.cap, policy)} remains; after this "
                f"release: {_show(left.after, policy) if left.fits else 'REFUSED (over the cap)'}")
    return (f"remaining now {_show(left.remaining, policy)} (window {left.window_start or '-'} .. "
            f"{left.window_end or '-'}); after this release: "
            f"{_show(left.after, policy) if left.fits else 'REFUSED (does not fit)'}")


def _selection_line(r: dict) -> str:
    """The private key selection of a plan: how many units a key needs to be published."""
    return (f"   key_selection   columns {', '.join(r['components'])} (at most {r['max_keys']} keys): "
            f"thresholded discrete Laplace, share {percent(r['share_of_charge'][0])}, L1 {decimal(r['sensitivity_l1'][0])}, "
            f"scale {r['noise_scale'][0]:.4g}, epsilon {r['epsilon_selection']:.4g}, delta "
            f"{r['delta_selection']:.3g}: threshold {r['threshold_units']} units; a key with "
            f"{r['units_for_even_odds']} units is published with even odds, with "
            f"{r['units_for_95_percent']} units 95% of the time; fewer units, it vanishes")


@_command("plan", "a release's costs, sensitivities and expected errors per statistic: no data read",
          epilog=PLAN_EPILOG)
@env_option()
@_conf()
@click.option("--group-size", type=int, default=None,
              help="rows per cell at which to state the expected error (default: each statistic's "
                   "assumed_group_size, else 100)")
@click.option("--schedule", type=click.Choice(sorted(SCHEDULES)), default=None,
              help="also print what running these specs on this schedule costs per window of each budget, "
                   "against its cap; exit 2 when it does not fit")
def plan(env: Optional[str], conf: tuple[str, ...], group_size: Optional[int], schedule: Optional[str]) -> int:
    try:
        env_config = commands.env_for(env)
        policies = load_policies(env_config.policies)
        specs = []
        for path in conf:
            spec = load_release_spec(path)
            specs.append(spec)
            policy = precheck.policy_for(spec, policies, env_config.policies)  # publish's check, its message
            st = Accountant(policy.measure, statement_delta=policy.statement_delta).statement(spec.charge)
            eps = st.get("epsilon")
            print(f"== {spec.name} ({spec.family}): {cells_text(spec)}, unit {spec.unit.kind.value} "
                  f"({spec.neighbouring.value}), bounds K={spec.bounds.max_rows_per_unit} "
                  f"L0={spec.bounds.max_partitions_per_unit} Linf={spec.bounds.max_rows_per_partition or '-'}")
            print(f"   charge {spec.charge}" + (f" = (epsilon {eps:.4g}, delta {st.get('delta'):.3g})"
                                               if spec.charge.MEASURE == "zcdp" and eps is not None else ""))
            print(f"   budget {spec.budget_id}: {_budget_line(env_config, spec, policy)}")
            shared = False
            for r in plan_rows(spec, policy, group_size):
                if r["statistic"] == "key_selection":
                    print(_selection_line(r))
                    continue
                comps = ", ".join(f"{c} (share {percent(sh)}, L1 {decimal(l1)}, scale {sc:.4g})" for c, sh, l1, sc in
                                  zip(r["components"], r["share_of_charge"], r["sensitivity_l1"], r["noise_scale"]))
                # the statistic's own share: its components' (a component two statistics read,
                # such as a mean's count, is one noisy value paid once and counted in both)
                mine = sum(Fraction(sh) for sh in r["share_of_charge"])
                shared = shared or len(r["components"]) > 1
                if r.get("stream") is not None:  # a running total: its error by day of the horizon
                    st_ = r["stream"]
                    days = "; ".join(f"day {e['day']}: stddev {e['stddev']:.4g}, {float(spec.confidence):.0%} "
                                     f"half-width {e['halfwidth']:.4g}" for e in r["stream_error"])
                    print(f"   {r['statistic']:<16}{r['kind']:<15} {r['mechanism']:<18} {percent(mine):>6} of the charge, "
                          f"running total over {st_['horizon_days']} days from {st_['start']} (charged once, "
                          f"{st_['tree_nodes']} tree nodes): {days}  <- {comps}")
                    continue
                print(f"   {r['statistic']:<16}{r['kind']:<15} {r['mechanism']:<18} {percent(mine):>6} of the charge, "
                      f"at {r['group_size']:,} rows/cell: E|error| {r['expected_abs_error']:.4g}, "
                      f"{float(spec.confidence):.0%} half-width {r['interval_half_width']:.4g}  <- {comps}")
            if shared:
                print("   (a statistic's share is the sum of its components'; a component several statistics read "
                      "is one noisy value, paid once)")
        if schedule is not None and not _schedule_report(specs, schedule, policies):
            return 2
    except DpSparkError as exc:
        error(str(exc))
        return 2
    return 0


def _schedule_report(specs: list, schedule: str, policies: dict) -> bool:
    """Print what running ``specs`` on ``schedule`` costs per window of each budget, against
    its cap (dp_spark.schedule.schedule_cost); False (after an error line) when one does not fit."""
    fits = True
    for cost in schedule_cost([(spec, schedule) for spec in specs], policies):
        print(f"== schedule {schedule}: budget {cost.budget_id} ({cost.window} window), cap {cost.cap}")
        for name, n, charge, total in cost.items:
            if n is None:
                print(f"   {name:<24} no window: a recurring schedule spends the cap for good")
                continue
            what = "new days (each day charged once)" if any(
                sp.name == name and sp.date_key_set is not None for sp in specs) else "runs"
            print(f"   {name:<24} {n} {what} x {charge} = {total}")
        if cost.fits:
            print(f"   per window at most {cost.total}: fits the cap")
        else:
            fits = False
            error(f"schedule {schedule}: budget {cost.budget_id} would need "
                  f"{'an unbounded amount' if cost.total is None else cost.total} per {cost.window} window, "
                  f"more than its cap {cost.cap}: run the non-day-keyed specs less often, lower their charge, "
                  "or raise the cap")
    return fits


# -- validate ------------------------------------------------------------------------------------
VALIDATE_DESCRIPTION = """\
Check release specs as publish checks them before the charge: the spec, the env and its
dataset bindings, the budget policy (declared, measure, dataset, unit, the per-release
maximum, a delta cap), the access policy (may --principal publish this spec in this --mode,
pre-registration included), and the charge against what is left of the budget now (from the
env's ledger; no ledger yet: the whole cap). With --with-data, also every column the spec
reads (the unit, group_by, the statistics' values, where, columns) against the input's schema,
read from its Delta log: publish runs the same check before any reservation."""
VALIDATE_EPILOG = """\
Reads no rows and writes nothing (a refused principal is not audited); starts no Spark session
unless --with-data (which reads the input's schema only).
Exit 0 when every spec is valid, 2 otherwise (each error printed)."""


#: where validate's principal came from (commands.checker)
_FROM = {"given": "--principal", "env": "$DP_SPARK_PRINCIPAL", "os": "the OS user"}


@_command("validate", "check release specs against the env and its budget policies: no data read",
          VALIDATE_DESCRIPTION, VALIDATE_EPILOG)
@env_option()
@_conf()
@click.option("--principal", default=None, metavar="NAME",
              help="check the access policy for this principal (default: the one a job here runs as: "
                   "$DP_SPARK_PRINCIPAL on the local env, else the OS user)")
@click.option("--mode", type=MODES, default="official", show_default=True, help="the mode publish would run in")
@click.option("--schedule", type=click.Choice(sorted(SCHEDULES)), default=None,
              help="also check that running these specs on this schedule fits each budget's cap per window")
@click.option("--with-data", is_flag=True,
              help="also check the columns the spec reads against the input's schema (its Delta log; starts "
                   "Spark, reads no row)")
@_verbose
def validate(env: Optional[str], conf: tuple[str, ...], principal: Optional[str], mode: str,
             schedule: Optional[str], with_data: bool, verbose: bool) -> int:
    _spark_logs(verbose)
    bad = 0
    try:
        env_config = commands.env_for(env)
        checker = commands.checker(env_config, principal=principal, mode=mode, with_data=with_data)
    except DpSparkError as exc:
        error(str(exc))
        return 2
    specs = []
    for path in conf:
        try:
            spec = load_release_spec(path)
            specs.append(spec)
            found = checker.check(spec)
            print(f"{path}: ok ({spec.name}, version {spec.version()}, {cells_text(spec)})")
            print(f"   access: {found.principal} ({_FROM.get(checker.principal_source, checker.principal_source)}) "
                  f"may publish it ({mode})")
            left = found.budget
            if left is None:
                print(f"   budget {spec.budget_id}: {found.budget_note}")
            else:  # the amounts as the budget accounts them (plan adds epsilon: OpenDP takes ~0.5 s to load)
                print(f"   budget {spec.budget_id}: remaining now {left.remaining}"
                      f"{' (no ledger yet)' if left.ledger_path else ''}; after this release: {left.after}")
            if with_data:
                print(f"   input columns: the {len(precheck.columns_read(spec))} the spec reads are in the input's schema")
            else:
                print("   input columns: not checked (--with-data checks them against the input's schema; "
                      "publish checks them before any charge)")
        except DpSparkError as exc:
            bad += 1
            error(str(exc) if str(path) in str(exc) else f"{path}: {exc}")
    if schedule is not None and not bad:
        try:
            if not _schedule_report(specs, schedule, load_policies(env_config.policies)):
                bad += 1
        except DpSparkError as exc:
            bad += 1
            error(str(exc))
    return 2 if bad else 0


# -- explore -------------------------------------------------------------------------------------
EXPLORE_DESCRIPTION = """\
The epsilon explorer: expected error against budget and assumed group size. Budgets are
epsilons for a pure_dp spec and rhos for a zcdp spec. Prints the expected absolute and
relative error (and the interval half-width at the spec's confidence) per budget and group
size, the smallest budget meeting --target (relative half-width) for each group size, and
writes <release>_explorer.png and <release>_explorer.csv into --out. A multi-statistic spec
prints its plan per statistic instead (components, shares, expected error and half-width per
group size). Public inputs only: no data is read, no Spark session is started, nothing is
charged."""


@_command("explore", "the epsilon explorer: expected error per budget and group size: no data read",
          EXPLORE_DESCRIPTION)
@env_option()
@_conf(multiple=False, text="release spec YAML")
@click.option("--group-sizes", type=PositiveList(int), default="50,500,5000", show_default=True,
              help="assumed public group sizes, comma-separated (rows; distinct users for distinct_units)")
@click.option("--budgets", type=PositiveList(float), default="0.1,0.25,0.5,1,2", show_default=True,
              help="epsilons (pure_dp spec) or rhos (zcdp spec), comma-separated")
@click.option("--target", type=float, default=0.05,
              help="relative error target: interval half-width / true value (default 0.05)")
@click.option("--assumed-mean", type=float, default=None,
              help="assumed value per row for sums and means (default: the spec's mean.assumed_mean, "
                   "else the midpoint of the clamp bounds)")
@click.option("--out", default=None, metavar="DIR",
              help="output folder for the PNG and CSV (default: the env's warehouse/explorer; "
                   "the env is read only for this)")
def explore(env: Optional[str], conf: str, group_sizes: list, budgets: list, target: float,
            assumed_mean: Optional[float], out: Optional[str]) -> int:
    try:
        spec = load_release_spec(conf)
        out_dir = Path(out) if out else Path(commands.env_for(env).warehouse) / "explorer"
        rows = explorer.explore(spec, group_sizes, budgets, assumed_mean=assumed_mean)
        stat = explorer.headline_statistic(spec)
        budget_name = "epsilon" if spec.charge.MEASURE == "pure_dp" else "rho"
        print(f"== {spec.name}: {stat}, {spec.charge.MEASURE}, unit {spec.unit.kind.value} "
              f"({spec.neighbouring.value}), {cells_text(spec)}, confidence {float(spec.confidence):.0%}")
        # a single-metric spec: its headline statistic; else every statistic of the spec
        print(explorer.format_table(rows, statistic=stat if spec.metric is not None else None))
        print()
        for n in group_sizes:
            try:
                b = explorer.smallest_budget(spec, n, target, assumed_mean=assumed_mean)
                value = float(b.epsilon if budget_name == "epsilon" else b.rho)
                print(f"smallest {budget_name} for +-{target:.1%} at {float(spec.confidence):.0%} "
                      f"with group size {n:,}: {value:.4g}")
            except DpSparkError as exc:
                print(f"smallest {budget_name} for group size {n:,}: none ({exc})")
        configured = spec.charge.epsilon if budget_name == "epsilon" else spec.charge.rho
        print(f"(this release is configured with {budget_name} = {float(configured):.4g})")
        from dp_spark.evaluation.charts import explorer_chart  # matplotlib

        out_dir.mkdir(parents=True, exist_ok=True)
        caption = (f"{spec.name}: {spec.charge.MEASURE}; bounds {spec.bounds.max_rows_per_unit} rows/unit, "
                   f"{cells_text(spec)}; group size = assumed public size, no data read; "
                   f"relative error of the {float(spec.confidence):.0%} interval target {target:.0%}")
        delta = None  # the budget's statement delta: the chart shows epsilon beside rho
        if spec.charge.MEASURE == "zcdp":
            try:
                pol = load_policies(commands.env_for(env).policies).get(spec.budget_id)
                delta = None if pol is None or pol.statement_delta is None else float(pol.statement_delta)
            except DpSparkError:
                delta = None  # no env or policy at hand: the chart shows rho only
        png = explorer_chart(rows, out_dir / f"{spec.name}_explorer.png", caption, statistic=stat,
                             target=target, error_column="rel_halfwidth",
                             configured=float(configured), delta=delta)
        csv_path = out_dir / f"{spec.name}_explorer.csv"
        with csv_path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            w.writeheader()
            w.writerows(rows)
        print(f"wrote {png}")
        print(f"wrote {csv_path}")
    except DpSparkError as exc:
        error(str(exc))
        return 2
    return 0


# -- refresh / backfill: day-keyed releases ----------------------------------------------
REFRESH_EPILOG = """\
One line per day: status, release id, charge, remaining window budget (and, once committed,
the published cell). A rerun of a day is a no-op; a day whose input rows did not change on a
new input snapshot is served by its release (unchanged, nothing charged); a day whose input
rows changed after publication is reported (input_changed), not republished, unless --republish.

exit codes:
  0  every day served (published, cache hit, ...) or reported stale
  1  a day failed (the following days are skipped unless --keep-going)
  2  bad arguments or an invalid env or spec (nothing published)
  3  with --strict: a day was left stale
"""


def _refresh_flags(f):
    for opt in reversed([
        click.option("--republish", is_flag=True,
                     help="republish input_changed days (their input rows changed since publication; also "
                          "snapshot_changed / code_changed days): charges again"),
        click.option("--strict", is_flag=True, help="exit 3 when a day was left stale (input_changed / "
                                                    "snapshot_changed / code_changed)"),
        click.option("--keep-going", is_flag=True, help="after a failed day, still try the following days"),
        click.option("--mode", type=MODES, default="official", show_default=True),
        click.option("--quiet", is_flag=True, help="print only the per-day lines"),
        _verbose,
    ]):
        f = opt(f)
    return f


def _refresh(env: Optional[str], conf: Sequence[str], start: date, end: date, *, republish: bool, strict: bool,
             keep_going: bool, mode: str, quiet: bool, verbose: bool) -> int:
    """See :data:`REFRESH_EPILOG` for the exit codes."""
    _logging(quiet, verbose)
    engine = (click.get_current_context().find_object(dict) or {}).get("engine")
    try:
        results = commands.refresh(commands.env_for(env), conf, start, end, mode=mode, republish=republish,
                                   keep_going=keep_going, on_day=lambda r: print(format_day(r), flush=True),
                                   engine=engine)
    except DpSparkError as exc:
        error(str(exc))
        return 2
    served = sum(r.status in SERVED for r in results)
    charged = sum(r.charge is not None for r in results)
    stale = [r for r in results if r.status in STALE]
    failed = [r for r in results if r.status in FAILED]
    errors = sum(r.status == "error" for r in results)
    print(f"== {len(results)} day(s): {served} served ({charged} charged), {len(stale)} stale, "
          f"{errors} failed, {len(failed) - errors} skipped", flush=True)
    if stale:  # an error (exit 3) with --strict; otherwise reported, and the job succeeds
        (error if strict else warning)(
            f"{len(stale)} day(s) were published on an older input snapshot and were not republished "
            "(pass --republish to publish them again; that charges the budget)")
    if failed:
        return 1
    if stale and strict:
        return 3
    return 0


@_command("refresh", "publish one day's cell of a day-keyed release (--date D, 'yesterday')",
          "Publish one day's cell of a day-keyed release (or a range with --from/--to); each day is charged "
          "once, reruns are no-ops, a day whose input changed is reported.", REFRESH_EPILOG)
@env_option()
@_conf(text="day-keyed release spec YAML (grouped by declared dates); repeatable")
@click.option("--date", "day", type=Day(), default=None, metavar="D",
              help="the day to publish: ISO date, 'today' or 'yesterday' (UTC)")
@click.option("--from", "start", type=Day(), default=None, metavar="D1",
              help="first day of a range (with --to; the same as dp-spark backfill)")
@click.option("--to", "end", type=Day(), default=None, metavar="D2", help="last day of a range (inclusive)")
@_refresh_flags
def refresh(env: Optional[str], conf: tuple[str, ...], day: Optional[date], start: Optional[date],
            end: Optional[date], **flags: Any) -> int:
    if day is not None and start is not None:
        raise click.UsageError("argument --from: not allowed with argument --date")
    if day is None and start is None and end is None:
        raise click.UsageError("one of the arguments --date --from is required")
    if day is None and (start is None) != (end is None):
        raise click.UsageError("--from needs --to" if end is None else "--to needs --from")
    first, last = (day, day) if day is not None else (start, end)
    return _refresh(env, conf, first, last, **flags)


@_command("backfill", "publish every day of a range of a day-keyed release (--from D1 --to D2)",
          "Publish each day of D1..D2 of a day-keyed release, in order, each charged once; days already "
          "published are cache hits.", REFRESH_EPILOG)
@env_option()
@_conf(text="day-keyed release spec YAML (grouped by declared dates); repeatable")
@click.option("--from", "start", type=Day(), required=True, metavar="D1",
              help="first day: ISO date, 'today' or 'yesterday' (UTC)")
@click.option("--to", "end", type=Day(), required=True, metavar="D2", help="last day (inclusive)")
@_refresh_flags
def backfill(env: Optional[str], conf: tuple[str, ...], start: date, end: date, **flags: Any) -> int:
    return _refresh(env, conf, start, end, **flags)


# -- budget ---------------------------------------------------------------------------------------
app.add_command(budget)


# -- rollback, generate-demo ----------------------------------------------------------------------
@_command("rollback", "withdraw the current version of a release family (admin)",
          "Withdraw the current version of a release family and restore the previous one. Needs the admin "
          "role; keeps the history; refunds no budget (the withdrawn release was seen). A series (a family "
          "refreshed a day at a time): the current version of --day (default: the latest published), that "
          "day's previous version restored. Exit 0, or 2 when refused or on an invalid env.")
@env_option()
@click.option("--family", required=True, help="the release family whose current version is withdrawn")
@click.option("--reason", required=True, help="recorded in the audit log and the statement's errata")
@click.option("--day", type=Day(), default=None, metavar="D",
              help="a series: the day whose current version is withdrawn (ISO date, 'today' or 'yesterday', UTC)")
@_verbose
def rollback(env: Optional[str], family: str, reason: str, day: Optional[date], verbose: bool) -> int:
    _spark_logs(verbose)
    try:
        withdrawn, restored = commands.rollback(commands.env_for(env), family, reason,
                                                day=None if day is None else day.isoformat())
    except DpSparkError as exc:
        error(str(exc))
        return 2
    print(f"withdrew release {withdrawn} of {family}; current is now {restored or 'none'}")
    return 0


def _family_rows(env: Optional[str], family: str, series: bool,
                 columns: Optional[list[str]] = None) -> tuple[list[dict[str, Any]], int]:
    """The published rows ``show`` and ``chart`` read, and the exit status when there are none:
    2 after printing the error (no release table, invalid env), 0 after saying the family has no
    current version."""
    try:
        rows = commands.show_family(commands.env_for(env), family, series=series, columns=columns)
    except DpSparkError as exc:
        error(str(exc))
        return [], 2
    if not rows:
        print(f"{family}: no current version")
    return rows, 0


@_command("show", "print the published rows of a release family's current version",
          "Print the current version's published cells of a release family: one line per key and statistic "
          "(value and interval); of a series (a family refreshed a day at a time), every day's current "
          "version, as <output_root>/<family>_current holds it. Reads the release table and the ledger; "
          "charges nothing. Exit 0, or 2 when the family has no release table or on an invalid env.")
@env_option()
@click.option("--family", required=True, help="the release family (the spec's 'family', default its name)")
@click.option("--series", is_flag=True,
              help="the family as a series, whatever its versions: each key's latest version that is not "
                   "withdrawn (a series refreshed before the ledger kept days)")
def show(env: Optional[str], family: str, series: bool) -> int:
    rows, status = _family_rows(env, family, series)
    if not rows:
        return status
    print(f"{'key':<24} {'statistic':<16} {'value':>12} {'ci_low':>12} {'ci_high':>12}")
    for r in rows:
        if r["suppressed"]:
            print(f"{r['key']:<24} {r['statistic']:<16} {'suppressed':>12}")
        else:
            print(f"{r['key']:<24} {r['statistic']:<16} {r['value']:>12.6g} {r['ci_low']:>12.6g} "
                  f"{r['ci_high']:>12.6g}")
    return 0


@_command("generate-demo", "write the synthetic demo events to the env's demo dataset",
          "Write the synthetic demo events to the env's demo dataset, unless it exists (--force overwrites: "
          "a new input snapshot, so the next publish charges again).")
@env_option()
@click.option("--force", is_flag=True, help="overwrite an existing demo table")
@_verbose
def generate_demo(env: Optional[str], force: bool, verbose: bool) -> int:
    _spark_logs(verbose)
    try:
        demo = commands.generate_demo(commands.env_for(env), force=force)
    except DpSparkError as exc:
        error(str(exc))
        return 2
    if demo.written:
        print(f"demo data: {demo.rows} events written to {demo.location}")
    else:
        print(f"demo data already at {demo.location} (use --force to regenerate)")
    return 0


# -- schema: the JSON Schema of release specs (dp_spark.spec.schema) ----------------------------
@_command("schema", "print the JSON Schema of release specs (editors complete and check them)",
          "Print the JSON Schema of release specs, both forms (metric and statistics); shipped as "
          "conf/release-spec.schema.json, which conf/releases/*.yaml reference with a yaml-language-server "
          "comment.", "Reads no env file. Exit 0.")
@click.option("--out", default=None, metavar="FILE", help="write the schema to FILE instead of standard output")
def schema(out: Optional[str]) -> int:
    from dp_spark.spec.schema import release_spec_json_schema_text  # pydantic models: schema only

    text = release_spec_json_schema_text()
    if out:
        Path(out).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


@_command("chart", "draw a family's published series: values, intervals, bands, significant changes",
          "Draw a release family's current version (--series: the family as a series, as 'show --series') per "
          "statistic over its keys: the value, the pointwise interval and the simultaneous band (when published) "
          "shaded, the y axis zoomed to the data, the changes between consecutive points that are significant "
          "over the whole chart marked, and the points whose interval is wider than the value flagged "
          "(docs/accuracy.md). A PNG, or interactive HTML for a path ending in .html (needs the 'charts' extra). "
          "Reads published rows only; charges nothing.",
          "Exit 0, or 2 when the family has no release table or on an invalid env.")
@env_option()
@click.option("--family", required=True, help="the release family (the spec's 'family', default its name)")
@click.option("--out", default=None, metavar="PATH",
              help="where to write the chart: PATH.png or PATH.html (default: <family>.png in the current folder)")
@click.option("--series", is_flag=True, help="the family as a series (each key's latest version not withdrawn)")
def chart(env: Optional[str], family: str, out: Optional[str], series: bool) -> int:
    from dp_spark.delta.release_table import RELEASE_SCHEMA

    target = out or f"{family}.png"
    if not target.lower().endswith((".png", ".html", ".htm")):
        error("--out must end in .png or .html")
        return 2
    rows, status = _family_rows(env, family, series, columns=[f.name for f in RELEASE_SCHEMA.fields])
    if not rows:
        return status
    from dp_spark.evaluation.chart_data import series_chart_data
    from dp_spark.evaluation.charts import series_chart

    try:
        path = series_chart(rows, target, title=family)
    except ImportError as exc:
        error(str(exc))
        return 2
    for c in series_chart_data(rows):  # counts and names only: no value is printed
        band = "with simultaneous band" if c.simultaneous else "pointwise intervals only"
        print(f"{family}/{c.statistic}: {len(c.points)} points, {band}; {len(c.significant)} significant "
              f"changes ({c.change_method}); {len(c.wide)} intervals wider than the value")
    print(f"chart written to {path}")
    return 0


#: command -> its one-line description (``dp-spark --help``), in the order listed there
COMMANDS: dict[str, str] = {name: cmd.get_short_help_str(200) for name, cmd in app.commands.items()}


def command(name: str) -> click.Command:
    """The click command ``dp-spark NAME``."""
    return app.commands[name]


def parse_args(name: str, argv: Sequence[str]) -> dict[str, Any]:
    """The parameters ``dp-spark NAME argv`` would run with (not run; usage errors exit 2)."""
    return parse(command(name), argv, f"dp-spark {name}")


def _main_of(name: str):
    def run_command(argv: Optional[Sequence[str]] = None) -> int:
        return run(command(name), list(sys.argv[1:] if argv is None else argv), f"dp-spark {name}")

    run_command.__name__ = f"{name.replace('-', '_')}_main"
    run_command.__doc__ = f"``dp-spark {name}`` from an argument list (the job scripts, tests)."
    return run_command


publish_main = _main_of("publish")
plan_main = _main_of("plan")
validate_main = _main_of("validate")
explore_main = _main_of("explore")
rollback_main = _main_of("rollback")
generate_demo_main = _main_of("generate-demo")


def refresh_main(argv: Optional[Sequence[str]] = None, *, engine: Any = None) -> int:
    """``dp-spark refresh`` from an argument list (jobs/daily_refresh.py). ``engine``: reuse one
    (tests, notebooks); otherwise ``Engine(env, mode=...)`` on the ambient or a new session."""
    return run(command("refresh"), list(sys.argv[1:] if argv is None else argv), "dp-spark refresh",
               obj={"engine": engine})


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The ``dp-spark`` console script. Returns the exit status; ``--help``, ``--version`` (0)
    and usage errors (2) exit through SystemExit."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return closed_pipe_safe(lambda: run(app, argv, "dp-spark"))
