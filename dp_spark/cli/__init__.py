"""The ``dp-spark`` command line (click): ``dp-spark = dp_spark.cli:main``.

* :mod:`dp_spark.cli.app` -- the commands (publish, plan, validate, explore, refresh, backfill,
  rollback, generate-demo, schema) and :func:`main`;
* :mod:`dp_spark.cli.budget` -- the ``budget`` group;
* :mod:`dp_spark.cli.base` -- help layout, exit codes, error lines, a closed pipe.

The CLI is the top of the stack: it imports :mod:`dp_spark.commands` (what each command does),
the engine's API, the ledger and the schedule; nothing in ``dp_spark`` imports it. See docs/cli.md.
"""

from dp_spark.cli.app import (
    COMMANDS,
    DEFAULT_ENV,
    ENV_VAR,
    EXIT_CLOSED_PIPE,
    app,
    closed_pipe_safe,
    command,
    explore_main,
    generate_demo_main,
    main,
    parse_args,
    plan_main,
    plan_rows,
    publish_main,
    refresh_main,
    resolve_env,
    rollback_main,
    validate_main,
)

__all__ = ["COMMANDS", "DEFAULT_ENV", "ENV_VAR", "EXIT_CLOSED_PIPE", "app", "closed_pipe_safe", "command",
           "explore_main", "generate_demo_main", "main", "parse_args", "plan_main", "plan_rows", "publish_main",
           "refresh_main", "resolve_env", "rollback_main", "validate_main"]
