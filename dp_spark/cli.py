"""The ``dp-spark`` command: ``publish``, ``budget``, ``generate-demo``.

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


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: dp-spark {publish,refresh,budget,rollback,generate-demo} ...")
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "publish":
        return publish_main(rest)
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
