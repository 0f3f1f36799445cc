"""The ``dp-spark`` command: ``publish``, ``budget``, ``generate-demo``.

Thin: arguments -> config -> engine. Every path and table name comes from the env file.
"""

from __future__ import annotations

import argparse
import logging
import sys
from datetime import date
from pathlib import Path
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
        from dp_spark.report import print_summary, write_privacy_summary

        engine = Engine(env, mode=args.mode)
        for spec in specs:
            result = engine.publish(spec)
            summary_path = write_privacy_summary(env, spec, result, engine.ledger)
            print_summary(spec, result, summary_path)
    except DpSparkError as exc:
        print(f"dp-spark: error: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: dp-spark {publish,budget,generate-demo} ...")
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "publish":
        return publish_main(rest)
    if cmd == "budget":
        from dp_spark.ledger.cli import budget_command

        return budget_command(rest)
    if cmd == "generate-demo":
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "jobs"))
        from dp_spark.demo_data import main as demo_main

        return demo_main(rest)
    print(f"dp-spark: unknown command {cmd!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
