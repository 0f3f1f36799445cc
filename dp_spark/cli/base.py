"""What every ``dp-spark`` command shares: the help layout, running a command with the
documented exit codes, error lines, the ``--env`` option and a closed pipe.

Help keeps the layout the commands always had: ``usage: dp-spark ...``, a raw description and
epilog (their line breaks are kept), 100 columns, commands listed in the order they are added.
Usage errors print the usage line, then ``dp-spark COMMAND: error: MESSAGE``, and exit 2.
"""

from __future__ import annotations

import os
import sys
import textwrap
from typing import Any, Callable, Optional, Sequence

import click

from dp_spark.env_file import DEFAULT_ENV, ENV_VAR

#: exit status when the reader of our output went away (``dp-spark budget status | head -1``)
EXIT_CLOSED_PIPE = 141
#: usage error, configuration error, or refused before anything was done
EXIT_USAGE = 2

#: every exit status of every ``dp-spark`` command: the one table of docs/cli.md (generated
#: from this by :func:`exit_codes_table`, checked by tests/unit/test_exit_codes.py) and the
#: lines of ``dp-spark --help``
EXIT_CODES: dict[int, str] = {
    0: "done: every release published or served (cache hit, returned existing, degraded), or the report "
       "printed; `refresh`/`backfill` without `--strict`: a stale day is reported as a warning",
    1: "the command ran and something failed or was refused while running: a spec failed while publishing "
       "(its budget exhausted at the reservation, ...; the others are published), versioning a batch failed, a "
       "refresh/backfill day failed; for `budget`: an unknown budget, an unreachable or tampered ledger, a "
       "refused permission",
    EXIT_USAGE: "usage or configuration error, or refused before anything was done: bad arguments, unknown "
                "command, an env, spec or policy file missing or invalid, no ledger at the env's path, a spec "
                "refused at validation (`validate`; `publish`: nothing charged, nothing created), `rollback` "
                "refused",
    3: "`refresh` / `backfill` with `--strict`: a day was left stale (its input changed after publication); "
       "the error is printed",
    EXIT_CLOSED_PIPE: "the reader of the output went away (closed pipe)",
}

EXIT_BEGIN = "<!-- exit codes: generated from dp_spark.cli.base.EXIT_CODES (tests/unit/test_exit_codes.py) -->"
EXIT_END = "<!-- end of generated exit codes -->"


def exit_codes_table() -> str:
    """The Markdown table of :data:`EXIT_CODES`."""
    rows = [f"| {code} | {text.replace('|', chr(92) + '|')} |" for code, text in EXIT_CODES.items()]
    return "\n".join(["| code | meaning |", "|---|---|", *rows]) + "\n"


def docs_with_exit_codes(text: str) -> str:
    """``text`` (docs/cli.md) with its exit-code table replaced by the current one."""
    a, b = text.index(EXIT_BEGIN) + len(EXIT_BEGIN), text.index(EXIT_END)
    return text[:a] + "\n" + exit_codes_table() + text[b:]
WIDTH = 100

ENV_HELP = (f"environment file: paths, Spark, ledger and budget policies, resolved against its project root "
            f"(default: ${ENV_VAR}, else the project's conf/envs/local.yaml)")


class Formatter(click.HelpFormatter):
    """click's help formatter at 100 columns, with argparse's lower-case ``usage:`` and headings."""

    def __init__(self, indent_increment: int = 2, width: Optional[int] = None,
                 max_width: Optional[int] = None) -> None:
        super().__init__(indent_increment, width=WIDTH, max_width=WIDTH)

    def write_usage(self, prog: str, args: str = "", prefix: Optional[str] = None) -> None:
        super().write_usage(prog, args, "usage: " if prefix is None else prefix)

    def write_heading(self, heading: str) -> None:
        super().write_heading(heading.lower())


class Context(click.Context):
    formatter_class = Formatter

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("help_option_names", ["-h", "--help"])
        super().__init__(*args, **kwargs)


def _raw(formatter: click.HelpFormatter, text: Optional[str]) -> None:
    if text:
        formatter.write_paragraph()
        formatter.write(text.rstrip("\n") + "\n")


def description(one_line: str, text: str = "") -> str:
    """A command's description: ``text`` (kept as written when it has line breaks, else filled
    to 96 columns), or its one-line help as a sentence."""
    text = text or one_line[0].upper() + one_line[1:] + "."
    return text if "\n" in text else textwrap.fill(text, 96)


class Command(click.Command):
    """A command whose description and epilog are printed as written."""

    context_class = Context

    def format_help_text(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        _raw(formatter, self.help)

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        _raw(formatter, self.epilog)


class Group(click.Group):
    """A command group: its commands in the order they were added; an unknown command is
    ``invalid choice``; no command prints the help on stderr (exit 2)."""

    context_class = Context
    command_class = Command

    def format_help_text(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        _raw(formatter, self.help)

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        _raw(formatter, self.epilog)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)

    def resolve_command(self, ctx: click.Context, args: list[str]):
        name = args[0]
        if self.get_command(ctx, name) is None and not name.startswith("-") and not ctx.resilient_parsing:
            choices = ", ".join(f"'{c}'" for c in self.list_commands(ctx))
            raise click.UsageError(f"argument {self.subcommand_metavar.split()[0]}: invalid choice: '{name}' "
                                   f"(choose from {choices})", ctx)
        return super().resolve_command(ctx, args)


Group.group_class = Group


def error(message: str, file: Any = None) -> None:
    """An error line: ``dp-spark: error: MESSAGE`` on stderr (never a data value)."""
    print(f"dp-spark: error: {message}", file=file or sys.stderr)


def warning(message: str, file: Any = None) -> None:
    """A warning line: ``dp-spark: warning: MESSAGE`` on stderr (the command still succeeds)."""
    print(f"dp-spark: warning: {message}", file=file or sys.stderr)


def env_option(default: Any = None) -> Callable:
    return click.option("--env", default=default, metavar="ENV", help=ENV_HELP)


def run(command: click.Command, argv: Sequence[str], prog: str, obj: Any = None) -> int:
    """Run a click command as the ``dp-spark`` commands always ran: returns the command's exit
    status; ``--help`` and ``--version`` exit 0, usage errors exit 2 (``SystemExit``, as
    argparse did: the job scripts and tests rely on it)."""
    try:
        with command.make_context(prog, list(argv), obj=obj) as ctx:
            return int(command.invoke(ctx) or 0)
    except click.exceptions.NoArgsIsHelpError as exc:  # a group without its command
        print(exc.ctx.get_help() if exc.ctx else "", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
    except click.UsageError as exc:
        if exc.ctx is not None:
            print(exc.ctx.get_usage(), file=sys.stderr)
        where = exc.ctx.command_path if exc.ctx is not None else prog
        print(f"{where}: error: {exc.format_message()}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
    except click.exceptions.Exit as exc:  # --help, --version
        raise SystemExit(exc.exit_code) from None
    except click.ClickException as exc:
        error(exc.format_message())
        raise SystemExit(exc.exit_code) from None
    except click.Abort:
        raise SystemExit(1) from None


def parse(command: click.Command, argv: Sequence[str], prog: str) -> dict[str, Any]:
    """The parameters ``argv`` gives ``command``, without running it (a usage error exits 2
    as when running it)."""
    try:
        ctx = command.make_context(prog, list(argv))
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else prog
        print(f"{where}: error: {exc.format_message()}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
    return dict(ctx.params)


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


__all__ = ["Command", "Context", "DEFAULT_ENV", "ENV_VAR", "EXIT_BEGIN", "EXIT_CLOSED_PIPE", "EXIT_CODES", "EXIT_END",
           "EXIT_USAGE", "Formatter", "Group", "docs_with_exit_codes", "exit_codes_table",
           "closed_pipe_safe", "description", "env_option", "error", "parse", "run", "warning"]
