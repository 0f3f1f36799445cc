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


def _publish_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dp-spark publish", description="Publish pre-registered DP releases.")
    p.add_argument("--env", default=DEFAULT_ENV, help="environment file (default: %(default)s)")
    p.add_argument("--conf", action="append", required=True, metavar="SPEC",
                   help="release spec YAML; repeat for several releases")
    p.add_argument("--date", type=date.fromisoformat, default=None,
                   help="scheduled daily run: publish only this day's cell (ISO date)")
    p.add_argument("--mode", choices=("official", "exploration"), default="official")
    p.add_argument("--quiet", action="store_true", help="print only the summary lines")
    return p


def publish_main(argv: Optional[Sequence[str]] = None) -> int:
    args = _publish_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from dp_spark.config import load_env, load_release_spec

    try:
        env = load_env(args.env)
        specs = [load_release_spec(c) for c in args.conf]  # all validated before Spark starts
        if args.date is not None:
            day = args.date.isoformat()
            specs = [s.for_keys((day,), name_suffix=f"_{day.replace('-', '')}") for s in specs]
        from dp_spark.engine import Engine
        from dp_spark.governance import statement_dir
        from dp_spark.report import print_summary

        engine = Engine(env, mode=args.mode, refresh="deferred")
        results = []
        try:
            for spec in specs:
                results.append((spec, engine.publish(spec)))
        finally:
            engine.finish()  # versions (one commit), ledger mirror and statements, once for the batch
        for spec, result in results:
            statement = statement_dir(env) / f"{spec.family}.md" if args.mode == "official" else None
            print_summary(spec, result, statement)
    except DpSparkError as exc:
        print(f"dp-spark: error: {exc}", file=sys.stderr)
        return 2
    return 0


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
