"""The ``dp-spark`` command: ``publish``, ``plan``, ``validate``, ``refresh``, ``budget``,
``rollback``, ``generate-demo``.

Thin: arguments -> config -> engine. Every path and table name comes from the env file.
"""

from __future__ import annotations

import argparse
import logging
import sys
from datetime import date
from typing import Optional, Sequence

from dp_spark.errors import DpSparkError

DEFAULT_ENV = "conf/envs/local.yaml"


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


def _publish_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dp-spark publish", description="Publish pre-registered DP releases.",
                                epilog=PUBLISH_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default=DEFAULT_ENV, help="environment file (default: %(default)s)")
    p.add_argument("--conf", action="append", required=True, metavar="SPEC",
                   help="release spec YAML; repeat for several releases")
    p.add_argument("--date", type=date.fromisoformat, default=None,
                   help="scheduled daily run: publish only this day's cell (ISO date)")
    p.add_argument("--mode", choices=("official", "exploration"), default="official")
    p.add_argument("--quiet", action="store_true", help="print only the summary lines")
    return p


def _unexpected(exc: BaseException) -> str:
    """An error that is not a dp_spark error (Spark, I/O): its class only, since its message
    may quote input data."""
    return f"{type(exc).__name__} (not a dp_spark error; its message is not shown, as it may quote data)"


def publish_main(argv: Optional[Sequence[str]] = None) -> int:
    """Validate every spec, then publish each; see :data:`PUBLISH_EPILOG` for the exit codes."""
    args = _publish_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from dp_spark.config import load_env, load_release_spec

    # 1. validate everything, for every spec, before the first charge
    try:
        env = load_env(args.env)
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
                print(f"dp-spark: error: {spec.name}: {exc}", file=sys.stderr)
            print(f"dp-spark: {len(refused)} of {len(specs)} specs refused before any charge; "
                  f"nothing was published", file=sys.stderr)
            return 2
        for v in validated:  # budget registration and dataset binding: refusals charge nothing
            engine.admit(v)
    except DpSparkError as exc:
        print(f"dp-spark: error: {exc}", file=sys.stderr)
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
        engine.finish()  # versions (one commit), ledger mirror and statements, for what succeeded
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
            print(f"dp-spark: error: {spec.name}: {error}", file=sys.stderr)
    failed = sum(1 for _, result, _ in outcomes if result is None)
    if finish_error is not None:
        print(f"dp-spark: error: versioning the batch failed: {finish_error}; the releases above are "
              f"committed: rerun the job (they are cache hits) to version them", file=sys.stderr)
    if failed:
        print(f"dp-spark: {failed} of {len(outcomes)} specs failed", file=sys.stderr)
    return 1 if failed or finish_error is not None else 0


def generate_demo_main(argv: Optional[Sequence[str]] = None) -> int:
    """Write the env's demo dataset unless it exists (a rewrite is a new input snapshot,
    so the next publish would be a new release and charge the budget again)."""
    p = argparse.ArgumentParser(prog="dp-spark generate-demo")
    p.add_argument("--env", default=DEFAULT_ENV)
    p.add_argument("--force", action="store_true", help="overwrite an existing demo table")
    args = p.parse_args(argv)
    from datetime import date as _date

    from dp_spark.config import load_env

    try:
        env = load_env(args.env)
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
        print(f"dp-spark: error: {exc}", file=sys.stderr)
        return 2
    return 0


def rollback_main(argv: Optional[Sequence[str]] = None) -> int:
    """Withdraw the current version of a release family and restore the previous one.

    Needs the admin role. Keeps the history; refunds no budget (the withdrawn release was seen).
    """
    p = argparse.ArgumentParser(prog="dp-spark rollback")
    p.add_argument("--env", default=DEFAULT_ENV)
    p.add_argument("--family", required=True)
    p.add_argument("--reason", required=True, help="recorded in the audit log and the statement's errata")
    args = p.parse_args(argv)
    from dp_spark.config import load_env
    from dp_spark.governance import rollback_family
    from dp_spark.governance.access import access_policy_for_env, resolve_principal
    from dp_spark.ledger import open_ledger
    from dp_spark.spark import get_or_create_session

    try:
        env = load_env(args.env)
        access = access_policy_for_env(env)
        spark = get_or_create_session(master=env.master, extra_conf=dict(env.spark_conf))
        principal = resolve_principal(spark, env_name=env.name)
        with open_ledger(env.ledger_url) as ledger:
            withdrawn, restored = rollback_family(spark, env=env, family=args.family, principal=principal,
                                                  reason=args.reason, ledger=ledger, access=access)
        print(f"withdrew release {withdrawn} of {args.family}; current is now {restored or 'none'}")
    except DpSparkError as exc:
        print(f"dp-spark: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _plan_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dp-spark plan", description=COMMANDS["plan"],
        epilog="Reads no data, starts no Spark session, charges nothing. Exit 0, or 2 on an invalid "
               "spec or env.")
    p.add_argument("--env", default=DEFAULT_ENV, help="environment file (default: %(default)s)")
    p.add_argument("--conf", action="append", required=True, metavar="SPEC", help="release spec YAML; repeatable")
    p.add_argument("--group-size", type=int, default=None,
                   help="rows per cell at which to state the expected error (default: each statistic's "
                        "assumed_group_size, else 100)")
    return p


def plan_rows(spec, policy, group_size: Optional[int]) -> list[dict]:
    """Per statistic, what the engine will publish for a cell of ``group_size`` rows: the
    same functions as the engine (multi-statistic specs: each kind's post-processing; single
    metric: the epsilon explorer, which calls the engine's own interval code)."""
    from dp_spark.api import plan_table

    if spec.statistics:
        return plan_table(spec, group_size=group_size, budget_policy=policy)
    from dp_spark.engine import plan_release
    from dp_spark.evaluation import explorer

    n = group_size or (spec.mean.assumed_group_size if spec.mean is not None else 100)
    amount = spec.charge.epsilon if spec.charge.MEASURE == "pure_dp" else spec.charge.rho
    plan = plan_release(spec)
    rows = []
    for r in explorer.explore(spec, [n], [amount]):
        used = ("count", "normalised_sum") if r["statistic"] == "mean" else (r["statistic"],)
        ps = [p for p in plan.statistics if p.statistic in used]
        rows.append({"statistic": r["statistic"], "kind": spec.metric, "components": [p.statistic for p in ps],
                     "share_of_charge": [str((p.budget.epsilon if spec.charge.MEASURE == "pure_dp" else p.budget.rho)
                                             / amount) for p in ps],
                     "mechanism": r["mechanism"],
                     "sensitivity_l1": [str(p.sensitivity.l1) for p in ps],
                     "sensitivity_l2": [p.sensitivity.l2 for p in ps],
                     "noise_scale": [float(p.scale * p.grid_unit) for p in ps],
                     "group_size": n, "expected_abs_error": r["expected_abs_error"],
                     "interval_half_width": r["halfwidth"], "cells": spec.cells})
    return rows


def _remaining_after(env, spec, policy) -> str:
    """The budget left after this charge, from the ledger if it exists (read only)."""
    from pathlib import Path

    url = env.ledger_url
    if url.startswith("sqlite:") and not Path(url[len("sqlite:"):]).exists():
        left = policy.cap - spec.charge if spec.charge.fits_in(policy.cap) else None
        return (f"no ledger yet ({url[len('sqlite:'):]}): the whole cap {policy.cap} remains; after this "
                f"release: {left if left is not None else 'REFUSED (over the cap)'}")
    from dp_spark.ledger import open_ledger

    try:
        st = open_ledger(url).status(spec.budget_id)
    except DpSparkError as exc:
        return f"budget status unavailable ({type(exc).__name__}: {exc})"
    after = st.remaining - spec.charge if spec.charge.fits_in(st.remaining) else None
    return (f"remaining now {st.remaining} (window {st.window_start or '-'} .. {st.window_end or '-'}); "
            f"after this release: {after if after is not None else 'REFUSED (does not fit)'}")


def plan_main(argv: Optional[Sequence[str]] = None) -> int:
    args = _plan_parser().parse_args(argv)
    from dp_spark.accountant import Accountant
    from dp_spark.config import load_env, load_release_spec
    from dp_spark.ledger.policy import load_policies

    try:
        env = load_env(args.env)
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
                comps = ", ".join(f"{c} (share {sh}, L1 {l1}, scale {sc:.4g})" for c, sh, l1, sc in
                                  zip(r["components"], r["share_of_charge"], r["sensitivity_l1"], r["noise_scale"]))
                print(f"   {r['statistic']:<16}{r['kind']:<15} {r['mechanism']:<18} at {r['group_size']:,} rows/cell: "
                      f"E|error| {r['expected_abs_error']:.4g}, {float(spec.confidence):.0%} half-width "
                      f"{r['interval_half_width']:.4g}  <- {comps}")
    except DpSparkError as exc:
        print(f"dp-spark plan: error: {exc}", file=sys.stderr)
        return 2
    return 0


def validate_main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="dp-spark validate", description=COMMANDS["validate"],
                                epilog="Exit 0 when every spec is valid, 2 otherwise (each error printed).")
    p.add_argument("--env", default=DEFAULT_ENV, help="environment file (default: %(default)s)")
    p.add_argument("--conf", action="append", required=True, metavar="SPEC", help="release spec YAML; repeatable")
    args = p.parse_args(argv)
    from dp_spark.config import load_env, load_release_spec
    from dp_spark.ledger.policy import load_policies

    bad = 0
    try:
        env = load_env(args.env)
        policies = load_policies(env.policies)
    except DpSparkError as exc:
        print(f"dp-spark validate: error: {exc}", file=sys.stderr)
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
            print(f"{path}: error: {exc}", file=sys.stderr)
    return 2 if bad else 0


COMMANDS = {
    "publish": "publish pre-registered releases (validates every spec first)",
    "plan": "print a release's costs, sensitivities and expected errors per statistic: no data read",
    "validate": "check release specs against the env and its budget policies: no data read",
    "refresh": "daily refresh or backfill of a day-keyed release (--date / --from --to)",
    "budget": "budget status, history, verify, accept-policy, rebuild-mirror",
    "rollback": "withdraw the current version of a release family (admin)",
    "generate-demo": "write the synthetic demo events to the env's demo dataset",
}


def _usage() -> str:
    from dp_spark import __version__

    lines = [f"usage: dp-spark COMMAND [--env ENV] ...   (dp_spark {__version__})", "", "commands:"]
    lines += [f"  {c:<14}{d}" for c, d in COMMANDS.items()]
    lines += ["", "dp-spark COMMAND --help for a command's options; --version for the version."]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        from dp_spark import __version__

        print(f"dp-spark {__version__}")
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "publish":
        return publish_main(rest)
    if cmd == "plan":
        return plan_main(rest)
    if cmd == "validate":
        return validate_main(rest)
    if cmd == "budget":
        from dp_spark.ledger.cli import budget_command

        return budget_command(rest)
    if cmd == "refresh":
        from dp_spark.schedule import refresh_main

        return refresh_main(rest, prog="dp-spark refresh")
    if cmd == "rollback":
        return rollback_main(rest)
    if cmd == "generate-demo":
        return generate_demo_main(rest)
    print(f"dp-spark: unknown command {cmd!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
