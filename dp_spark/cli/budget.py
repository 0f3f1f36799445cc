"""``dp-spark budget status|history|verify|rebuild-mirror|accept-policy``: what each budget
allows, spent, and on what.

    dp-spark budget status [--budget ID] [--ledger URL] [--policies PATH] [--json]
    dp-spark budget history --budget ID [--ledger URL] [--json]
    dp-spark budget verify [--ledger URL]
    dp-spark budget rebuild-mirror [--env ENV]   (starts Spark; writes the mirror only)
    dp-spark budget accept-policy --budget ID --reason TEXT [--env ENV]   (admin)

``python -m dp_spark.cli budget SUBCOMMAND ...`` is the same. Every subcommand takes ``--env ENV``
(before or after the subcommand; default: ``$DP_SPARK_ENV``, else the project's
``conf/envs/local.yaml``; see docs/cli.md): the ledger and the budget policy file are the env
file's, resolved against the env file's project root, never the current directory.
``--ledger URL`` (or ``$DP_SPARK_LEDGER_URL``) and ``--policies PATH`` override them.
``status``, ``history`` and ``verify`` only read: they never create a ledger or register a
budget (a budget declared in the policy file but never used shows spent 0); a SQLite ledger
that does not exist is an error naming its path. Exit status: 0 ok, 1 error (unknown budget,
unreachable or tampered ledger, refused), 2 usage or configuration error (bad arguments, env or
policy file, missing ledger).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from fractions import Fraction
from pathlib import Path
from typing import Any, Optional, Sequence, TextIO

import click

from dp_spark import commands
from dp_spark.accountant import Accountant
from dp_spark.core.budget import MEASURES, Budget
from dp_spark.cli.base import Group, env_option, run
from dp_spark.errors import ConfigError, DpSparkError
from dp_spark.ledger import open_ledger, sqlite_path
from dp_spark.ledger.records import BudgetStatus, LedgerEntry, UnknownBudgetError, ts_text
from dp_spark.ledger.store import Ledger
from dp_spark.ledger.policy import BudgetPolicy, load_policies
from dp_spark.precheck import LedgerNotFoundError, require_existing_ledger
from dp_spark.spec.errors import did_you_mean

__all__ = ["BUDGET_SUBCOMMANDS", "LEDGER_URL_ENV", "LedgerNotFoundError", "as_epsilon", "budget",
           "budget_command", "fmt_budget"]

LEDGER_URL_ENV = "DP_SPARK_LEDGER_URL"
BUDGET_HELP = "budgets: status, history, verify, rebuild-mirror, accept-policy"
BUDGET_DESCRIPTION = "Privacy budgets: cap, spent, remaining, and the releases that spent them."
BUDGET_EPILOG = """\
A ledger that does not exist is an error naming its path (status, history, verify never create one).
exit codes: 0 ok; 1 unknown budget, unreachable or tampered ledger, refused; 2 bad arguments,
env or policy file, or no ledger at the env's path."""

BUDGET_SUBCOMMANDS = {
    "status": "cap, spent, remaining and window of each budget",
    "history": "every release that spent a budget",
    "verify": "check the integrity of the whole ledger",
    "rebuild-mirror": "rebuild the env's Delta mirror of the ledger from the SQL ledger",
    "accept-policy": "admin: apply a changed budget policy file (recorded, audited)",
}


def _num(v: Fraction) -> str:
    """A decimal for people (6 significant digits); the exact fraction is in ``--json``."""
    return f"{float(v):.6g}"


def fmt_budget(b: Budget, policy: Optional[BudgetPolicy] = None, *, show_delta: bool = False) -> str:
    """``rho=0.5`` / ``epsilon=1``; the delta when it is > 0, or always with ``show_delta``
    (pure_dp and zcdp; approx_dp always shows it). With the budget's ``policy``, a zcdp amount
    is also shown as (epsilon, delta) at the budget's statement delta: epsilon is OpenDP's
    conversion of rho at the statement delta, delta is the statement delta plus the amount's
    own delta (``Accountant.statement``)."""
    shown = [f for f in b.FIELDS if f not in b.OPTIONAL or show_delta or getattr(b, f) > 0]
    text = ", ".join(f"{f}={_num(getattr(b, f))}" for f in shown)
    return text + as_epsilon(b, policy)


def as_epsilon(b: Budget, policy: Optional[BudgetPolicy]) -> str:
    """`` (epsilon=E at delta=D)`` for a zcdp amount with rho > 0 under a policy with a
    statement delta; empty otherwise."""
    if policy is None or b.MEASURE != "zcdp" or policy.statement_delta is None or b.rho == 0:
        return ""
    st = Accountant("zcdp", statement_delta=policy.statement_delta).statement(b)
    return f" (epsilon={st['epsilon']:.4g} at delta={st['delta']:.3g})"


def _delta_json(policy: BudgetPolicy, cap: Budget, spent: Budget, remaining: Budget) -> dict[str, Any]:
    """The delta block of ``budget status --json`` and, for zcdp, the spend as (epsilon, delta)."""
    out: dict[str, Any] = {"delta_cap": str(cap.delta_part), "delta_spent": str(spent.delta_part),
                           "delta_remaining": str(remaining.delta_part)}
    if policy.measure == "zcdp" and policy.statement_delta is not None:
        acc = Accountant("zcdp", statement_delta=policy.statement_delta)
        for name, amount in (("spent", spent), ("cap", cap)):
            st = acc.statement(amount)  # one OpenDP conversion per amount
            out[f"{name}_as_epsilon_delta"] = {"epsilon": st["epsilon"], "delta": st["delta"]}
    return out


def _ts(dt: Optional[datetime]) -> str:
    return "-" if dt is None else ts_text(dt)[:19] + "Z"


def _open(url: str) -> Ledger:
    """The existing ledger at ``url``; a missing SQLite file raises :class:`LedgerNotFoundError`."""
    path = sqlite_path(url)
    if path is not None:
        require_existing_ledger(url)
        return open_ledger(url, create=False)
    return open_ledger(url)


def _entry_json(e: LedgerEntry) -> dict[str, Any]:
    return {"seq": e.seq, "release_id": e.release_id, "release_family": e.release_family,
            "charge": e.charge.to_json(), "state": e.state, "principal": e.principal,
            "code_version": e.code_version, "created_at": _ts(e.created_at),
            "committed_at": _ts(e.committed_at) if e.committed_at else None}


def _print_entries(entries: list[LedgerEntry], out: TextIO, indent: str = "  ",
                   policy: Optional[BudgetPolicy] = None) -> None:
    if not entries:
        print(f"{indent}(no releases)", file=out)
        return
    show_delta = policy is not None and policy.delta_cap > 0
    rows = [("seq", "release_id", "family", "charge", "state", "created", "committed")]
    rows += [(str(e.seq), e.release_id, e.release_family, fmt_budget(e.charge, policy, show_delta=show_delta),
              e.state,
              _ts(e.created_at), _ts(e.committed_at)) for e in entries]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print(indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip(), file=out)


def _status_block(bid: str, policy: BudgetPolicy, st: Optional[BudgetStatus], in_window: list[LedgerEntry],
                  note: str, out: TextIO) -> None:
    w = policy.window
    if st is None:
        cap, spent = policy.cap, MEASURES[policy.measure].zero()
        remaining, n = cap, 0
        start, end = w.bounds(datetime.now(timezone.utc))
    else:
        cap, spent, remaining, n, start, end = st.cap, st.spent, st.remaining, st.entries, st.window_start, st.window_end
    window = w.describe() if start is None else f"{w.describe()}, {_ts(start)} .. {_ts(end)}"
    print(f"budget {bid}", file=out)
    print(f"  dataset    {policy.dataset} (privacy unit: {policy.privacy_unit})", file=out)
    delta = f", statement delta {_num(policy.statement_delta)}" if policy.statement_delta is not None else ""
    print(f"  measure    {policy.measure}{delta}", file=out)
    print(f"  window     {window}", file=out)
    # delta always shown (pure_dp, zcdp: the delta cap; 0 = releases spending delta refused)
    print(f"  cap        {fmt_budget(cap, policy, show_delta=True)}", file=out)
    if policy.max_per_release is not None:
        print(f"  per release at most {fmt_budget(policy.max_per_release, policy)}", file=out)
    print(f"  spent      {fmt_budget(spent, policy, show_delta=True)}  ({n} release{'s' if n != 1 else ''} "
          f"in this window; reserved counts as spent)", file=out)
    print(f"  remaining  {fmt_budget(remaining, policy, show_delta=True)}", file=out)
    if policy.measure != "approx_dp" and cap.delta_part == 0:
        print(f"  delta cap  0: releases that spend delta (private keys) are refused; add `delta_cap:` "
              f"in budgets.{bid} of the policy file to allow them", file=out)
    if note:
        print(f"  note       {note}", file=out)
    print("  releases in this window:", file=out)
    _print_entries(in_window, out, indent="    ", policy=policy)


def _unknown_budget(budget_id: str, known) -> UnknownBudgetError:
    """An unknown ``--budget``: a close name and the budgets there are (declared or in the ledger)."""
    exc = UnknownBudgetError(budget_id)
    exc.args = (f"unknown budget {budget_id!r}{did_you_mean(budget_id, known)}: the budgets are "
                f"{', '.join(sorted(known)) or 'none'} (declared in the policy file or in the ledger)",)
    return exc


def _status(args: Args, ledger: Optional[Ledger], policies: dict[str, BudgetPolicy],
            out: TextIO) -> int:
    known = set(policies)
    if ledger is not None:
        known |= set(ledger.budget_ids())
    ids = [args.budget] if args.budget else sorted(known)
    if args.budget and args.budget not in known:
        raise _unknown_budget(args.budget, known)
    payload = []
    for i, bid in enumerate(ids):
        registered = ledger is not None and bid in ledger.budget_ids()
        if registered:
            assert ledger is not None
            policy = ledger.get_policy(bid)
            now = datetime.now(timezone.utc)
            st = ledger.status(bid, now=now)
            in_window = [e for e in ledger.entries(bid) if policy.window.contains(e.created_at, now)]
            note = ""
            if bid in policies and policies[bid] != policy:
                note = ("the policy file differs from the registered policy: releases are refused until an "
                        f"admin runs: dp-spark budget accept-policy --budget {bid} --reason \"...\"")
            elif bid not in policies:
                note = "not declared in the policy file"
        else:
            policy, st, in_window = policies[bid], None, []
            note = "declared but never used: nothing spent"
        if args.json:
            payload.append({
                "budget_id": bid, "dataset": policy.dataset, "privacy_unit": policy.privacy_unit,
                "measure": policy.measure, "window": policy.window.to_json(),
                "cap": policy.cap.to_json() if st is None else st.cap.to_json(),
                "spent": (st.spent if st else MEASURES[policy.measure].zero()).to_json(),
                "remaining": (st.remaining if st else policy.cap).to_json(),
                "window_start": _ts(st.window_start) if st and st.window_start else None,
                "window_end": _ts(st.window_end) if st and st.window_end else None,
                "releases": [_entry_json(e) for e in in_window], "note": note or None,
                **_delta_json(policy, policy.cap if st is None else st.cap,
                              st.spent if st else MEASURES[policy.measure].zero(),
                              st.remaining if st else policy.cap),
            })
            continue
        if i:
            print(file=out)
        _status_block(bid, policy, st, in_window, note, out)
    if args.json:
        print(json.dumps(payload, indent=2), file=out)
    elif not ids:
        print("no budgets (none declared, none in the ledger)", file=out)
    return 0


def _history(args: Args, ledger: Optional[Ledger], policies: dict[str, BudgetPolicy],
             out: TextIO) -> int:
    if ledger is None or args.budget not in ledger.budget_ids():
        if args.budget in policies:
            entries: list[LedgerEntry] = []
        else:
            raise _unknown_budget(args.budget, set(policies) | set(ledger.budget_ids() if ledger else ()))
    else:
        entries = ledger.entries(args.budget)
    if args.json:
        print(json.dumps({"budget_id": args.budget, "releases": [_entry_json(e) for e in entries]}, indent=2),
              file=out)
        return 0
    print(f"budget {args.budget}: {len(entries)} release{'s' if len(entries) != 1 else ''}", file=out)
    if ledger is not None and args.budget in ledger.budget_ids():
        shown_policy: Optional[BudgetPolicy] = ledger.get_policy(args.budget)
    else:
        shown_policy = policies.get(args.budget)
    _print_entries(entries, out, policy=shown_policy)
    return 0


@dataclass(frozen=True)
class Args:
    """A parsed read-only budget subcommand."""

    cmd: str
    env: Optional[str] = None
    ledger: Optional[str] = None
    policies: Optional[str] = None
    json: bool = False
    budget: Optional[str] = None


def _sources(args: Args, environ: dict) -> tuple[str, Optional[Path]]:
    """The ledger URL and policy file: ``--ledger`` / ``$DP_SPARK_LEDGER_URL`` and ``--policies``
    when given, otherwise the env file's (resolved against its project root)."""
    url = args.ledger or environ.get(LEDGER_URL_ENV)
    policies = Path(args.policies) if args.policies else None
    if url is None or policies is None:
        env = commands.env_for(args.env, environ)
        url = url or env.ledger_url
        policies = policies or Path(env.policies)
    return url, policies


def _read(args: Args, out: TextIO) -> int:
    url, policy_file = _sources(args, dict(os.environ))
    policies = load_policies(policy_file) if policy_file is not None else {}
    ledger = _open(url)
    try:
        if args.cmd == "verify":
            ledger.verify()
            print("ledger verified: every budget row, entry chain, binding and audit row is intact", file=out)
            return 0
        if args.cmd == "status":
            return _status(args, ledger, policies, out)
        return _history(args, ledger, policies, out)
    finally:
        ledger.close()


def _guarded(fn, out: TextIO, err: TextIO) -> int:
    """Run a subcommand. Errors are printed as ``dp-spark: error: ...``: exit 2 for a
    configuration error (env, policy file, missing ledger), 1 for any other (an unknown budget,
    an unreachable or tampered ledger, a refused permission)."""
    try:
        return fn(out)
    except UnknownBudgetError as exc:  # exit 1, as before this command had --env
        print(f"dp-spark: error: {exc}", file=err)
        return 1
    except ConfigError as exc:
        print(f"dp-spark: error: {exc}", file=err)
        return 2
    except DpSparkError as exc:
        print(f"dp-spark: error: {exc}", file=err)
        return 1


def _streams(ctx: click.Context) -> tuple[TextIO, TextIO]:
    obj = ctx.find_object(dict) or {}
    return obj.get("out") or sys.stdout, obj.get("err") or sys.stderr


def _env(ctx: click.Context, given: Optional[str]) -> Optional[str]:
    """``--env`` after the subcommand, else before it (``dp-spark budget --env E status``)."""
    return given or (ctx.parent.params.get("env") if ctx.parent is not None else None)


def _read_options(f):
    f = click.option("--json", "as_json", is_flag=True, help="machine-readable output")(f)
    f = click.option("--policies", default=None, metavar="PATH", help="budget policy file (default: the env's)")(f)
    f = click.option("--ledger", default=None, metavar="URL",
                     help=f"ledger URL (default: ${LEDGER_URL_ENV}, else the env's ledger_url)")(f)
    return env_option()(f)


@click.group("budget", cls=Group, help=BUDGET_DESCRIPTION, short_help=BUDGET_HELP, epilog=BUDGET_EPILOG,
             subcommand_metavar="SUBCOMMAND [ARGS]...")
@env_option()
def budget(env: Optional[str]) -> None:
    """The ``budget`` group: its subcommands do the work."""


def _read_command(name: str, ctx: click.Context, **params: Any) -> int:
    out, err = _streams(ctx)
    params["env"] = _env(ctx, params.get("env"))
    args = Args(cmd=name, json=params.pop("as_json", False), **params)
    return _guarded(lambda o: _read(args, o), out, err)


@budget.command("status", short_help="cap, spent, remaining and window of each budget",
                help="Cap, spent, remaining and window of each budget, and the releases in the window.")
@click.option("--budget", "budget_id", default=None, metavar="ID", help="only this budget")
@_read_options
@click.pass_context
def status(ctx: click.Context, budget_id: Optional[str], **params: Any) -> int:
    return _read_command("status", ctx, budget=budget_id, **params)


@budget.command("history", short_help="every release that spent a budget",
                help="Every release that spent a budget.")
@click.option("--budget", "budget_id", required=True, metavar="ID", help="the budget")
@_read_options
@click.pass_context
def history(ctx: click.Context, budget_id: str, **params: Any) -> int:
    return _read_command("history", ctx, budget=budget_id, **params)


@budget.command("verify", short_help="check the integrity of the whole ledger",
                help="Check the integrity of the whole ledger: every budget row, entry chain, binding and "
                     "audit row.")
@_read_options
@click.pass_context
def verify(ctx: click.Context, **params: Any) -> int:
    return _read_command("verify", ctx, **params)


@budget.command("rebuild-mirror", short_help="rebuild the env's Delta mirror of the ledger from the SQL ledger",
                help="Rebuild the env's Delta mirror of the ledger and audit log from the SQL ledger (the "
                     "authority). Starts Spark; writes the mirror only.")
@env_option()
@click.pass_context
def rebuild_mirror(ctx: click.Context, env: Optional[str]) -> int:
    out, err = _streams(ctx)

    def go(o: TextIO) -> int:
        from dp_spark.delta.mirror import rebuild_mirror_command  # starts Spark: pyspark

        env_path = commands.resolve_env(_env(ctx, env))
        require_existing_ledger(commands.load_env(env_path).ledger_url)
        return rebuild_mirror_command(env_path, o)

    return _guarded(go, out, err)


@budget.command("accept-policy", short_help="admin: apply a changed budget policy file (recorded, audited)",
                help="Admin: apply the env's changed budget policy file for one budget. The change and its "
                     "reason are recorded in the policy history and the audit log; a refusal is audited.")
@click.option("--budget", "budget_id", required=True, metavar="ID", help="the budget")
@click.option("--reason", required=True, help="why: recorded in the audit log and the policy history")
@env_option()
@click.pass_context
def accept_policy(ctx: click.Context, budget_id: str, reason: str, env: Optional[str]) -> int:
    out, err = _streams(ctx)

    def go(o: TextIO) -> int:
        principal, rec = commands.accept_policy(commands.env_for(_env(ctx, env)), budget_id, reason)
        if rec is None:
            print(f"budget {budget_id}: the policy file equals the registered policy; nothing to accept", file=o)
            return 0
        print(f"budget {budget_id}: policy version {rec.version} accepted by {principal} "
              f"({rec.policy_hash[:12]}): " + "; ".join(rec.changes), file=o)
        return 0

    return _guarded(go, out, err)


#: subcommand -> its one-line description (``dp-spark --help``)
BUDGET_SUBCOMMANDS = {name: cmd.get_short_help_str(200) for name, cmd in budget.commands.items()}


def budget_command(argv: Sequence[str], *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """``dp-spark budget ...`` from an argument list. Returns the exit status (2: usage)."""
    try:
        return run(budget, list(argv), "dp-spark budget", obj={"out": out, "err": err})
    except SystemExit as exc:  # a usage error (2) or --help (0)
        return int(exc.code or 0)

