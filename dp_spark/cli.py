"""The ``dp-spark`` command: one parser (argparse subcommands), one function per command.

    dp-spark publish | plan | validate | explore | refresh | backfill | budget ... | rollback | generate-demo

Thin: arguments -> config -> engine. Every path, table name, the ledger and the budget
policies come from the env file (``--env``, the same option on every command), resolved
against the env file's project root, never the current directory. See docs/cli.md.

Why argparse and not click/Typer: it is the standard library, so the wheel adds no
dependency on a Databricks cluster (where every extra install is a risk to the runtime), and
the existing entry points (``jobs/*.py``, ``python -m dp_spark.ledger.cli``) are argparse
already. Adding a command: write ``_add_<name>(parser)`` and ``_run_<name>(args) -> int``
and register them in :data:`REGISTRY` (its one-line help shows in ``dp-spark --help``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from dp_spark.errors import ConfigError, DpSparkError

ENV_VAR = "DP_SPARK_ENV"
#: the project the package runs from (a source checkout or an editable install)
PROJECT_ROOT = Path(__file__).resolve().parent.parent
#: the default env file: the project's own local env (used when --env and $DP_SPARK_ENV are absent)
DEFAULT_ENV = str(PROJECT_ROOT / "conf" / "envs" / "local.yaml")
#: exit status when the reader of our output went away (``dp-spark budget status | head -1``)
EXIT_CLOSED_PIPE = 141


def resolve_env(given: Optional[str], environ: Optional[Mapping[str, str]] = None) -> str:
    """The env file to use: ``--env`` when given, else ``$DP_SPARK_ENV``, else the project's
    ``conf/envs/local.yaml`` (:data:`DEFAULT_ENV`). Paths inside it resolve against its own
    project root (:func:`dp_spark.config.load_env`). Raises ConfigError when none exists."""
    environ = os.environ if environ is None else environ
    if given:
        return str(given)
    if environ.get(ENV_VAR):
        return str(environ[ENV_VAR])
    if Path(DEFAULT_ENV).is_file():
        return DEFAULT_ENV
    raise ConfigError(f"no env file: pass --env FILE or set ${ENV_VAR} (the default {DEFAULT_ENV} does not exist: "
                      "the package is not running from a project checkout)")


def _load_env(given: Optional[str]):
    from dp_spark.config import load_env

    return load_env(resolve_env(given))


def _env_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", default=None, metavar="ENV",
                   help=f"environment file: paths, Spark, ledger and budget policies, resolved against its "
                        f"project root (default: ${ENV_VAR}, else the project's conf/envs/local.yaml)")


def _error(message: str) -> None:
    print(f"dp-spark: error: {message}", file=sys.stderr)


def closed_pipe_safe(fn: Callable[[], int]) -> int:
    """Run ``fn``; when stdout's reader has gone (``| head``), end quietly with exit 141 (as a
    shell reports SIGPIPE) instead of a BrokenPipeError traceback."""
    try:
        try:
            return fn()
        finally:
            sys.stdout.flush()
    except BrokenPipeError:
        try:  # the interpreter flushes stdout again at exit: point it at /dev/null
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_CLOSED_PIPE


PUBLISH_EPILOG = """\
how several specs are published:
  1. every spec is validated first (spec and env files, access and pre-registration, budget
     policy, measure and per-release maximum, dataset binding, output and input schemas
     through a lazy plan). Any refusal here stops the job before the first charge: each
     refused spec's error is printed; nothing is published or charged, and no release
     table, salt or ledger is created (a refused permission is recorded in the audit log).
  2. then each spec is published in turn; a failure (an exhausted budget, a lost input, ...)
     does not stop the others. Every spec's outcome is printed in order: its summary, or its
     error (never data values). The releases that succeeded are then versioned together and
     get their privacy statements.

exit codes:
  0  every spec was published (or served: cache hit, returned_existing, degraded)
  1  at least one spec failed while publishing, or versioning the batch failed; the other
     specs' releases are published and printed (rerun: published ones are cache hits)
  2  refused before any charge (bad arguments, invalid env or spec, refused validation):
     nothing was published
"""


def _add_publish(p: argparse.ArgumentParser) -> None:
    _env_option(p)
    p.add_argument("--conf", action="append", required=True, metavar="SPEC",
                   help="release spec YAML; repeat for several releases")
    p.add_argument("--date", type=date.fromisoformat, default=None,
                   help="scheduled daily run: publish only this day's cell (ISO date)")
    p.add_argument("--mode", choices=("official", "exploration"), default="official")
    p.add_argument("--quiet", action="store_true", help="print only the summary lines")


def _publish_parser() -> argparse.ArgumentParser:
    return command_parser("publish")


def _unexpected(exc: BaseException) -> str:
    """An error that is not a dp_spark error (Spark, I/O): its class only, since its message
    may quote input data."""
    return f"{type(exc).__name__} (not a dp_spark error; its message is not shown, as it may quote data)"


def publish_main(argv: Optional[Sequence[str]] = None) -> int:
    """``dp-spark publish`` from an argument list (jobs/publish_release.py)."""
    return _run_publish(_publish_parser().parse_args(argv))


def _run_publish(args: argparse.Namespace) -> int:
    """Validate every spec, then publish each; see :data:`PUBLISH_EPILOG` for the exit codes."""
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from dp_spark.config import load_env, load_release_spec

    # 1. validate everything, for every spec, before the first charge
    try:
        env = load_env(resolve_env(args.env))
        specs = [load_release_spec(c) for c in args.conf]  # all validated before Spark starts
        if args.date is not None:
            day = args.date.isoformat()
            specs = [s.for_keys((day,), name_suffix=f"_{day.replace('-', '')}") for s in specs]
        from dp_spark.engine import Engine

        engine = Engine(env, mode=args.mode, refresh="deferred")
        validated, refused = [], []
        for spec in specs:
            try:
                validated.append(engine.validate(spec))
            except DpSparkError as exc:
                refused.append((spec, exc))
        if refused:
            for spec, exc in refused:
                _error(f"{spec.name}: {exc}")
            print(f"dp-spark: {len(refused)} of {len(specs)} specs refused before any charge; "
                  f"nothing was published", file=sys.stderr)
            return 2
        for v in validated:  # budget registration and dataset binding: refusals charge nothing
            engine.admit(v)
    except DpSparkError as exc:
        _error(str(exc))
        return 2

    # 2. publish each; one failure does not stop the others
    from dp_spark.governance import statement_dir
    from dp_spark.report import print_failure, print_summary

    outcomes = []
    for v in validated:
        try:
            outcomes.append((v.spec, engine.publish(v.spec, validated=v), None))
        except DpSparkError as exc:
            outcomes.append((v.spec, None, str(exc)))
        except Exception as exc:  # noqa: BLE001 - reported per spec; the other specs still run
            logging.getLogger("dp_spark.cli").error("%s: publish failed with %s", v.spec.name, type(exc).__name__)
            outcomes.append((v.spec, None, _unexpected(exc)))
    finish_error = None
    try:
        engine.finish()  # versions (one commit) and statements for what succeeded; mirror started
    except DpSparkError as exc:
        finish_error = str(exc)
    except Exception as exc:  # noqa: BLE001
        finish_error = _unexpected(exc)
    for spec, result, error in outcomes:
        if result is not None:
            statement = statement_dir(env) / f"{spec.family}.md" if args.mode == "official" else None
            print_summary(spec, result, statement)
        else:
            print_failure(spec, error)
            _error(f"{spec.name}: {error}")
    engine.close()  # the ledger's Delta mirror, refreshed in the background, has caught up
    failed = sum(1 for _, result, _ in outcomes if result is None)
    if finish_error is not None:
        _error(f"versioning the batch failed: {finish_error}; the releases above are "
               f"committed: rerun the job (they are cache hits) to version them")
    if failed:
        print(f"dp-spark: {failed} of {len(outcomes)} specs failed", file=sys.stderr)
    return 1 if failed or finish_error is not None else 0


def _add_generate_demo(p: argparse.ArgumentParser) -> None:
    _env_option(p)
    p.add_argument("--force", action="store_true", help="overwrite an existing demo table")


def generate_demo_main(argv: Optional[Sequence[str]] = None) -> int:
    return _run_generate_demo(command_parser("generate-demo").parse_args(argv))


def _run_generate_demo(args: argparse.Namespace) -> int:
    """Write the env's demo dataset unless it exists (a rewrite is a new input snapshot,
    so the next publish would be a new release and charge the budget again)."""
    from datetime import date as _date

    try:
        env = _load_env(args.env)
        demo = dict(env.demo)
        dataset = str(demo.get("dataset", "demo_events"))
        out = env.dataset_location(dataset)
        from dp_spark.demo_data import generate_events
        from dp_spark.release.writer import table_exists
        from dp_spark.spark import get_or_create_session

        spark = get_or_create_session(master=env.master, extra_conf=dict(env.spark_conf))
        if table_exists(spark, out) and not args.force:
            print(f"demo data already at {out} (use --force to regenerate)")
            return 0
        start = demo.get("start_date", _date(2026, 11, 1))
        start = start if isinstance(start, _date) else _date.fromisoformat(str(start))
        events = generate_events(spark, n_users=int(demo.get("users", 20000)), days=int(demo.get("days", 30)),
                                 start_date=start, seed=int(demo.get("seed", 7)))
        events.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(out)
        n = spark.read.format("delta").load(out).count()
        print(f"demo data: {n} events written to {out}")
    except DpSparkError as exc:
        _error(str(exc))
        return 2
    return 0


def _add_rollback(p: argparse.ArgumentParser) -> None:
    _env_option(p)
    p.add_argument("--family", required=True, help="the release family whose current version is withdrawn")
    p.add_argument("--reason", required=True, help="recorded in the audit log and the statement's errata")


def rollback_main(argv: Optional[Sequence[str]] = None) -> int:
    return _run_rollback(command_parser("rollback").parse_args(argv))


def _run_rollback(args: argparse.Namespace) -> int:
    """Withdraw the current version of a release family and restore the previous one.

    Needs the admin role. Keeps the history; refunds no budget (the withdrawn release was seen).
    """
    from dp_spark.governance import rollback_family
    from dp_spark.governance.access import access_policy_for_env, resolve_principal
    from dp_spark.ledger import open_ledger
    from dp_spark.ledger.cli import _require_sqlite

    try:
        env = _load_env(args.env)
        _require_sqlite(env.ledger_url)  # nothing was published with this env: nothing to withdraw
        access = access_policy_for_env(env)
        from dp_spark.spark import get_or_create_session

        spark = get_or_create_session(master=env.master, extra_conf=dict(env.spark_conf))
        principal = resolve_principal(spark, env_name=env.name)
        with open_ledger(env.ledger_url) as ledger:
            withdrawn, restored = rollback_family(spark, env=env, family=args.family, principal=principal,
                                                  reason=args.reason, ledger=ledger, access=access)
        print(f"withdrew release {withdrawn} of {args.family}; current is now {restored or 'none'}")
    except DpSparkError as exc:
        _error(str(exc))
        return 2
    return 0


def _add_plan(p: argparse.ArgumentParser) -> None:
    _env_option(p)
    p.add_argument("--conf", action="append", required=True, metavar="SPEC", help="release spec YAML; repeatable")
    p.add_argument("--group-size", type=int, default=None,
                   help="rows per cell at which to state the expected error (default: each statistic's "
                        "assumed_group_size, else 100)")


def _plan_parser() -> argparse.ArgumentParser:
    return command_parser("plan")


def plan_rows(spec, policy, group_size: Optional[int]) -> list[dict]:
    """Per statistic, what the engine will publish for a cell of ``group_size`` rows: each
    kind's own post-processing (:func:`dp_spark.api.plan_table`), whichever form the spec was
    written in."""
    from dp_spark.api import plan_table

    return plan_table(spec, group_size=group_size, budget_policy=policy)


def _remaining_after(env, spec, policy) -> str:
    """The budget left after this charge, from the ledger if it exists (read only)."""
    from pathlib import Path

    from dp_spark.ledger.cli import _as_epsilon

    def show(b) -> str:  # rho also as epsilon at the budget's statement delta (zcdp)
        return f"{b}{_as_epsilon(b, policy)}"

    url = env.ledger_url
    if url.startswith("sqlite:") and not Path(url[len("sqlite:"):]).exists():
        left = policy.cap - spec.charge if spec.charge.fits_in(policy.cap) else None
        return (f"no ledger yet ({url[len('sqlite:'):]}): the whole cap {show(policy.cap)} remains; after this "
                f"release: {show(left) if left is not None else 'REFUSED (over the cap)'}")
    from dp_spark.ledger import open_ledger

    try:
        st = open_ledger(url).status(spec.budget_id)
    except DpSparkError as exc:
        return f"budget status unavailable ({type(exc).__name__}: {exc})"
    after = st.remaining - spec.charge if spec.charge.fits_in(st.remaining) else None
    return (f"remaining now {show(st.remaining)} (window {st.window_start or '-'} .. {st.window_end or '-'}); "
            f"after this release: {show(after) if after is not None else 'REFUSED (does not fit)'}")


def plan_main(argv: Optional[Sequence[str]] = None) -> int:
    return _run_plan(_plan_parser().parse_args(argv))


def _run_plan(args: argparse.Namespace) -> int:
    from dp_spark.accountant import Accountant
    from dp_spark.config import load_env, load_release_spec
    from dp_spark.ledger.policy import load_policies

    try:
        env = load_env(resolve_env(args.env))
        policies = load_policies(env.policies)
        for path in args.conf:
            spec = load_release_spec(path)
            if spec.budget_id not in policies:
                raise DpSparkError(f"{path}: budget '{spec.budget_id}' is not declared in {env.policies}")
            policy = policies[spec.budget_id]
            st = Accountant(policy.measure, statement_delta=policy.statement_delta).statement(spec.charge)
            eps = st.get("epsilon")
            print(f"== {spec.name} ({spec.family}): {spec.cells} cells, unit {spec.unit.kind.value} "
                  f"({spec.neighbouring.value}), bounds K={spec.bounds.max_rows_per_unit} "
                  f"L0={spec.bounds.max_partitions_per_unit} Linf={spec.bounds.max_rows_per_partition or '-'}")
            print(f"   charge {spec.charge}" + (f" = (epsilon {eps:.4g}, delta {st.get('delta'):.3g})"
                                               if spec.charge.MEASURE == "zcdp" and eps is not None else ""))
            print(f"   budget {spec.budget_id}: {_remaining_after(env, spec, policy)}")
            for r in plan_rows(spec, policy, args.group_size):
                if r["statistic"] == "key_selection":
                    print(_selection_line(r))
                    continue
                comps = ", ".join(f"{c} (share {sh}, L1 {l1}, scale {sc:.4g})" for c, sh, l1, sc in
                                  zip(r["components"], r["share_of_charge"], r["sensitivity_l1"], r["noise_scale"]))
                print(f"   {r['statistic']:<16}{r['kind']:<15} {r['mechanism']:<18} at {r['group_size']:,} rows/cell: "
                      f"E|error| {r['expected_abs_error']:.4g}, {float(spec.confidence):.0%} half-width "
                      f"{r['interval_half_width']:.4g}  <- {comps}")
    except DpSparkError as exc:
        _error(str(exc))
        return 2
    return 0


def _add_validate(p: argparse.ArgumentParser) -> None:
    _env_option(p)
    p.add_argument("--conf", action="append", required=True, metavar="SPEC", help="release spec YAML; repeatable")


def validate_main(argv: Optional[Sequence[str]] = None) -> int:
    return _run_validate(command_parser("validate").parse_args(argv))


def _run_validate(args: argparse.Namespace) -> int:
    from dp_spark.config import load_env, load_release_spec
    from dp_spark.ledger.policy import load_policies

    bad = 0
    try:
        env = load_env(resolve_env(args.env))
        policies = load_policies(env.policies)
    except DpSparkError as exc:
        _error(str(exc))
        return 2
    for path in args.conf:
        try:
            spec = load_release_spec(path)
            if spec.budget_id not in policies:
                raise DpSparkError(f"{path}: budget '{spec.budget_id}' is not declared in {env.policies}")
            policy = policies[spec.budget_id]
            if policy.measure != spec.charge.MEASURE or policy.dataset != spec.dataset:
                raise DpSparkError(f"{path}: budget '{spec.budget_id}' accounts {policy.measure} on dataset "
                                   f"'{policy.dataset}'; the spec charges {spec.charge.MEASURE} on '{spec.dataset}'")
            env.dataset_location(spec.dataset)
            print(f"{path}: ok ({spec.name}, version {spec.version()}, {spec.cells} cells)")
        except DpSparkError as exc:
            bad += 1
            _error(str(exc) if str(path) in str(exc) else f"{path}: {exc}")
    return 2 if bad else 0


# -- explore: the epsilon explorer ------------------------------------------------------
EXPLORE_DESCRIPTION = """\
The epsilon explorer: expected error against budget and assumed group size. Budgets are
epsilons for a pure_dp spec and rhos for a zcdp spec. Prints the expected absolute and
relative error (and the interval half-width at the spec's confidence) per budget and group
size, the smallest budget meeting --target (relative half-width) for each group size, and
writes <release>_explorer.png and <release>_explorer.csv into --out. A multi-statistic spec
prints its plan per statistic instead (components, shares, expected error and half-width per
group size). Public inputs only: no data is read, no Spark session is started, nothing is
charged."""


def _positive_list(kind):
    def parse(text: str):
        try:
            values = [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {kind.__name__}s") from None
        if not values or any(v <= 0 for v in values):
            raise argparse.ArgumentTypeError("values must be > 0")
        return values
    return parse


def _add_explore(p: argparse.ArgumentParser) -> None:
    _env_option(p)
    p.add_argument("--conf", required=True, metavar="SPEC", help="release spec YAML")
    p.add_argument("--group-sizes", type=_positive_list(int), default=[50, 500, 5000],
                   help="assumed public group sizes, comma-separated (rows; distinct users for distinct_units)")
    p.add_argument("--budgets", type=_positive_list(float), default=[0.1, 0.25, 0.5, 1, 2],
                   help="epsilons (pure_dp spec) or rhos (zcdp spec), comma-separated")
    p.add_argument("--target", type=float, default=0.05,
                   help="relative error target: interval half-width / true value (default 0.05)")
    p.add_argument("--assumed-mean", type=float, default=None,
                   help="assumed value per row for sums and means (default: the spec's mean.assumed_mean, "
                        "else the midpoint of the clamp bounds)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="output folder for the PNG and CSV (default: the env's warehouse/explorer; "
                        "the env is read only for this)")


def _selection_line(r: dict) -> str:
    """The private key selection of a plan: how many units a key needs to be published."""
    return (f"   key_selection   columns {', '.join(r['components'])} (at most {r['max_keys']} keys): "
            f"thresholded discrete Laplace, share {r['share_of_charge'][0]}, L1 {r['sensitivity_l1'][0]}, "
            f"scale {r['noise_scale'][0]:.4g}, epsilon {r['epsilon_selection']:.4g}, delta "
            f"{r['delta_selection']:.3g}: threshold {r['threshold_units']} units; a key with "
            f"{r['units_for_even_odds']} units is published with even odds, with "
            f"{r['units_for_95_percent']} units 95% of the time; fewer units, it vanishes")


def explore_main(argv: Optional[Sequence[str]] = None) -> int:
    """``dp-spark explore`` from an argument list (jobs/explore_epsilon.py)."""
    return _run_explore(command_parser("explore").parse_args(argv))


def _run_explore(args: argparse.Namespace) -> int:
    import csv

    from dp_spark.config import load_release_spec
    from dp_spark.evaluation import explorer

    try:
        spec = load_release_spec(args.conf)
        out = Path(args.out) if args.out else Path(_load_env(args.env).warehouse) / "explorer"
        rows = explorer.explore(spec, args.group_sizes, args.budgets, assumed_mean=args.assumed_mean)
        stat = explorer.headline_statistic(spec)
        budget_name = "epsilon" if spec.charge.MEASURE == "pure_dp" else "rho"
        print(f"== {spec.name}: {stat}, {spec.charge.MEASURE}, unit {spec.unit.kind.value} "
              f"({spec.neighbouring.value}), {spec.cells} cells, confidence {float(spec.confidence):.0%}")
        # a single-metric spec: its headline statistic; else every statistic of the spec
        print(explorer.format_table(rows, statistic=stat if spec.metric is not None else None))
        print()
        for n in args.group_sizes:
            try:
                b = explorer.smallest_budget(spec, n, args.target, assumed_mean=args.assumed_mean)
                value = float(b.epsilon if budget_name == "epsilon" else b.rho)
                print(f"smallest {budget_name} for +-{args.target:.1%} at {float(spec.confidence):.0%} "
                      f"with group size {n:,}: {value:.4g}")
            except DpSparkError as exc:
                print(f"smallest {budget_name} for group size {n:,}: none ({exc})")
        configured = spec.charge.epsilon if budget_name == "epsilon" else spec.charge.rho
        print(f"(this release is configured with {budget_name} = {float(configured):.4g})")
        from dp_spark.evaluation.charts import explorer_chart

        out.mkdir(parents=True, exist_ok=True)
        caption = (f"{spec.name}: {spec.charge.MEASURE}; bounds {spec.bounds.max_rows_per_unit} rows/unit, "
                   f"{spec.cells} public cells; group size = assumed public size, no data read; "
                   f"relative error of the {float(spec.confidence):.0%} interval target {args.target:.0%}")
        delta = None  # the budget's statement delta: the chart shows epsilon beside rho
        if spec.charge.MEASURE == "zcdp":
            try:
                from dp_spark.ledger.policy import load_policies

                pol = load_policies(_load_env(args.env).policies).get(spec.budget_id)
                delta = None if pol is None or pol.statement_delta is None else float(pol.statement_delta)
            except DpSparkError:
                delta = None  # no env or policy at hand: the chart shows rho only
        png = explorer_chart(rows, out / f"{spec.name}_explorer.png", caption, statistic=stat,
                             target=args.target, error_column="rel_halfwidth",
                             configured=float(configured), delta=delta)
        csv_path = out / f"{spec.name}_explorer.csv"
        with csv_path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            w.writeheader()
            w.writerows(rows)
        print(f"wrote {png}")
        print(f"wrote {csv_path}")
    except DpSparkError as exc:
        _error(str(exc))
        return 2
    return 0


# -- refresh / backfill: day-keyed releases ----------------------------------------------
REFRESH_EPILOG = """\
One line per day: status, release id, charge, remaining window budget (and, once committed,
the published cell). A rerun of a day is a no-op; a day whose input snapshot changed after
publication is reported (snapshot_changed), not republished, unless --republish.

exit codes:
  0  every day served (published, cache hit, ...) or reported stale
  1  a day failed (the following days are skipped unless --keep-going)
  2  bad arguments or an invalid env or spec (nothing published)
  3  with --strict: a day was left stale
"""


def _add_refresh_options(p: argparse.ArgumentParser) -> None:
    _env_option(p)
    p.add_argument("--conf", action="append", required=True, metavar="SPEC",
                   help="day-keyed release spec YAML (grouped by declared dates); repeatable")


def _add_refresh_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--republish", action="store_true",
                   help="republish days whose input snapshot changed since publication (charges again)")
    p.add_argument("--strict", action="store_true",
                   help="exit 3 when a day was left stale (snapshot_changed / code_changed)")
    p.add_argument("--keep-going", action="store_true", help="after a failed day, still try the following days")
    p.add_argument("--mode", choices=("official", "exploration"), default="official")
    p.add_argument("--quiet", action="store_true", help="print only the per-day lines")


def _add_refresh(p: argparse.ArgumentParser) -> None:
    from dp_spark.schedule import parse_day

    _add_refresh_options(p)
    when = p.add_mutually_exclusive_group(required=True)
    when.add_argument("--date", type=parse_day, metavar="D",
                      help="the day to publish: ISO date, 'today' or 'yesterday' (UTC)")
    when.add_argument("--from", dest="start", type=parse_day, metavar="D1",
                      help="first day of a range (with --to; the same as dp-spark backfill)")
    p.add_argument("--to", dest="end", type=parse_day, metavar="D2", help="last day of a range (inclusive)")
    _add_refresh_flags(p)


def _add_backfill(p: argparse.ArgumentParser) -> None:
    from dp_spark.schedule import parse_day

    _add_refresh_options(p)
    p.add_argument("--from", dest="start", type=parse_day, required=True, metavar="D1",
                   help="first day: ISO date, 'today' or 'yesterday' (UTC)")
    p.add_argument("--to", dest="end", type=parse_day, required=True, metavar="D2", help="last day (inclusive)")
    p.set_defaults(date=None)
    _add_refresh_flags(p)


def refresh_main(argv: Optional[Sequence[str]] = None, *, engine=None) -> int:
    """``dp-spark refresh`` from an argument list (jobs/daily_refresh.py). ``engine``: reuse one
    (tests, notebooks); otherwise ``Engine(env, mode=...)`` on the ambient or a new session."""
    p = command_parser("refresh")
    args = p.parse_args(argv)
    return _run_refresh(args, engine=engine, parser=p)


def _run_refresh(args: argparse.Namespace, *, engine=None, parser: Optional[argparse.ArgumentParser] = None) -> int:
    """See :data:`REFRESH_EPILOG` for the exit codes."""
    from dp_spark.schedule import FAILED, SERVED, STALE, _today, backfill, day_spec, days_between, format_day

    if args.date is None and (args.start is None) != (args.end is None):
        message = "--from needs --to" if args.end is None else "--to needs --from"
        if parser is not None:
            parser.error(message)
        _error(message)
        return 2
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    start, end = (args.date, args.date) if args.date is not None else (args.start, args.end)
    from dp_spark.config import load_env, load_release_spec

    results = []
    try:
        if end < start:
            raise ConfigError(f"--to {end} is before --from {start}")
        env = load_env(resolve_env(args.env))
        # relative date keys (``end: today``) resolve against the job's last day, never the data
        specs = [load_release_spec(c, run_date=max(end, _today())) for c in args.conf]
        for s in specs:  # every day of every spec validated before Spark starts
            for d in days_between(start, end):
                day_spec(s, d)
        owned = engine is None
        if owned:
            from dp_spark.engine import Engine

            # the ledger mirror and the statements are rebuilt once for the batch (finish)
            engine = Engine(env, mode=args.mode, refresh="deferred")
        try:
            for s in specs:
                results += backfill(engine, s, start, end, republish=args.republish,
                                    stop_on_error=not args.keep_going,
                                    on_day=lambda r: print(format_day(r), flush=True))
        finally:
            if owned:
                try:
                    engine.finish()
                finally:
                    engine.close()  # wait for the ledger mirror's background refresh
    except DpSparkError as exc:
        _error(str(exc))
        return 2
    served = sum(r.status in SERVED for r in results)
    charged = sum(r.charge is not None for r in results)
    stale = [r for r in results if r.status in STALE]
    failed = [r for r in results if r.status in FAILED]
    errors = sum(r.status == "error" for r in results)
    print(f"== {len(results)} day(s): {served} served ({charged} charged), {len(stale)} stale, "
          f"{errors} failed, {len(failed) - errors} skipped", flush=True)
    if stale:
        _error(f"{len(stale)} day(s) were published on an older input snapshot and were not republished "
               "(pass --republish to publish them again; that charges the budget)")
    if failed:
        return 1
    if stale and args.strict:
        return 3
    return 0


# -- budget ------------------------------------------------------------------------------
def _add_budget(p: argparse.ArgumentParser) -> None:
    from dp_spark.ledger.cli import add_budget_arguments

    add_budget_arguments(p)


def _run_budget(args: argparse.Namespace) -> int:
    from dp_spark.ledger.cli import run_budget

    return run_budget(args)


# -- the command table ---------------------------------------------------------------------
@dataclass(frozen=True)
class Command:
    """One ``dp-spark`` subcommand: its one-line help, its arguments and what runs it."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: str = ""
    epilog: str = ""


PLAN_EPILOG = "Reads no data, starts no Spark session, charges nothing. Exit 0, or 2 on an invalid spec or env."
VALIDATE_EPILOG = "Exit 0 when every spec is valid, 2 otherwise (each error printed)."
BUDGET_EPILOG = """\
A ledger that does not exist is an error naming its path (status, history, verify never create one).
exit codes: 0 ok; 1 unknown budget, unreachable or tampered ledger, refused; 2 bad arguments,
env or policy file, or no ledger at the env's path."""

REGISTRY: list[Command] = [
    Command("publish", "publish pre-registered releases (validates every spec first)", _add_publish, _run_publish,
            "Publish pre-registered DP releases.", PUBLISH_EPILOG),
    Command("plan", "a release's costs, sensitivities and expected errors per statistic: no data read",
            _add_plan, _run_plan, epilog=PLAN_EPILOG),
    Command("validate", "check release specs against the env and its budget policies: no data read",
            _add_validate, _run_validate, epilog=VALIDATE_EPILOG),
    Command("explore", "the epsilon explorer: expected error per budget and group size: no data read",
            _add_explore, _run_explore, EXPLORE_DESCRIPTION),
    Command("refresh", "publish one day's cell of a day-keyed release (--date D, 'yesterday')", _add_refresh,
            _run_refresh, "Publish one day's cell of a day-keyed release (or a range with --from/--to); each "
            "day is charged once, reruns are no-ops, a day whose input changed is reported.", REFRESH_EPILOG),
    Command("backfill", "publish every day of a range of a day-keyed release (--from D1 --to D2)", _add_backfill,
            _run_refresh, "Publish each day of D1..D2 of a day-keyed release, in order, each charged once; "
            "days already published are cache hits.", REFRESH_EPILOG),
    Command("budget", "budgets: status, history, verify, rebuild-mirror, accept-policy", _add_budget, _run_budget,
            "Privacy budgets: cap, spent, remaining, and the releases that spent them.", BUDGET_EPILOG),
    Command("rollback", "withdraw the current version of a release family (admin)", _add_rollback, _run_rollback,
            "Withdraw the current version of a release family and restore the previous one. Needs the admin "
            "role; keeps the history; refunds no budget (the withdrawn release was seen). Exit 0, or 2 "
            "when refused or on an invalid env."),
    Command("generate-demo", "write the synthetic demo events to the env's demo dataset", _add_generate_demo,
            _run_generate_demo, "Write the synthetic demo events to the env's demo dataset, unless it exists "
            "(--force overwrites: a new input snapshot, so the next publish charges again)."),
]


# -- schema: the JSON Schema of release specs (dp_spark.spec.schema) --------------------------
def _add_schema(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", metavar="FILE", help="write the schema to FILE instead of standard output")


def _run_schema(args: argparse.Namespace) -> int:
    from dp_spark.spec.schema import release_spec_json_schema_text

    text = release_spec_json_schema_text()
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


REGISTRY.append(Command(
    "schema", "print the JSON Schema of release specs (editors complete and check them)", _add_schema, _run_schema,
    "Print the JSON Schema of release specs, both forms (metric and statistics); shipped as "
    "conf/release-spec.schema.json, which conf/releases/*.yaml reference with a yaml-language-server comment.",
    "Reads no env file. Exit 0."))

#: command -> its one-line description (``dp-spark --help``)
COMMANDS: dict[str, str] = {c.name: c.help for c in REGISTRY}


def _command(name: str) -> Command:
    return next(c for c in REGISTRY if c.name == name)


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Raw description and epilog, 100 columns, and the command list without its
    ``COMMAND`` header line (one line per command)."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=22, width=100)

    def _format_action(self, action: argparse.Action) -> str:
        text = super()._format_action(action)
        if action.nargs == argparse.PARSER:  # the subcommand group: drop its own metavar line
            text = "\n".join(text.split("\n")[1:])
        return text


def _parser_kwargs(c: Command) -> dict:
    import textwrap

    description = c.description or c.help[0].upper() + c.help[1:] + "."
    if "\n" not in description:
        description = textwrap.fill(description, 96)
    return {"description": description, "epilog": c.epilog or None, "formatter_class": _Formatter}


def command_parser(name: str) -> argparse.ArgumentParser:
    """The parser of one command on its own (``prog="dp-spark NAME"``): what ``jobs/*.py`` and
    the ``*_main(argv)`` functions parse with; the same arguments as ``dp-spark NAME``."""
    c = _command(name)
    p = argparse.ArgumentParser(prog=f"dp-spark {name}", **_parser_kwargs(c))
    c.add_arguments(p)
    return p


def _top_epilog() -> str:
    from dp_spark.ledger.cli import BUDGET_SUBCOMMANDS

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


def build_parser() -> argparse.ArgumentParser:
    from dp_spark import __version__

    p = argparse.ArgumentParser(
        prog="dp-spark", description="dp_spark: differentially private releases on Spark.",
        epilog=_top_epilog(), formatter_class=_Formatter)
    p.add_argument("--version", action="version", version=f"dp-spark {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for c in REGISTRY:
        sp = sub.add_parser(c.name, help=c.help, **_parser_kwargs(c))
        c.add_arguments(sp)
        sp.set_defaults(_run=c.run)
    return p


def _dispatch(argv: Sequence[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # --help, --version and usage errors exit here (0 / 0 / 2)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    return args._run(args)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The ``dp-spark`` console script. Returns the exit status; argparse exits for ``--help``,
    ``--version`` (0) and usage errors (2)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return closed_pipe_safe(lambda: _dispatch(argv))


if __name__ == "__main__":
    sys.exit(main())
