"""``dp-spark budget status|history|verify``: what each budget allows, spent, and on what.

    python -m dp_spark.ledger.cli status [--budget ID] [--ledger URL] [--policies PATH] [--json]
    python -m dp_spark.ledger.cli history --budget ID [--ledger URL] [--json]
    python -m dp_spark.ledger.cli verify [--ledger URL]
    python -m dp_spark.ledger.cli rebuild-mirror [--env ENV]   (starts Spark; writes the mirror only)
    python -m dp_spark.ledger.cli accept-policy --budget ID --reason TEXT [--env ENV]   (admin)

Every subcommand takes ``--env ENV`` (default: ``$DP_SPARK_ENV``, else the project's
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

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from fractions import Fraction
from pathlib import Path
from typing import Any, Optional, Sequence, TextIO

from dp_spark.budget import MEASURES, Budget
from dp_spark.errors import ConfigError, DpSparkError
from dp_spark.ledger import open_ledger, sqlite_path
from dp_spark.ledger.base import BudgetStatus, Ledger, LedgerEntry, UnknownBudgetError, ts_text
from dp_spark.ledger.policy import BudgetPolicy, load_policies

__all__ = ["budget_command", "run_budget", "add_budget_arguments", "accept_policy_command", "main",
           "BUDGET_SUBCOMMANDS", "LedgerNotFoundError", "DEFAULT_LEDGER_URL", "DEFAULT_POLICIES", "LEDGER_URL_ENV"]

LEDGER_URL_ENV = "DP_SPARK_LEDGER_URL"
DEFAULT_LEDGER_URL = "sqlite:warehouse/ledger.db"
DEFAULT_POLICIES = "conf/policies/budgets.yaml"


def _env_option(p: argparse.ArgumentParser, default: Any = None) -> None:
    p.add_argument("--env", default=default, metavar="ENV",
                   help="environment file: its ledger, budget policies and paths (default: $DP_SPARK_ENV, "
                        "else the project's conf/envs/local.yaml)")


def add_budget_arguments(p: argparse.ArgumentParser) -> None:
    """The ``budget`` subcommands, on ``p`` (``dp-spark budget`` or ``python -m dp_spark.ledger.cli``)."""
    # --env before or after the subcommand (dp-spark budget --env E status, or status --env E):
    # the subcommands' own --env sets nothing unless given, so it never hides the first
    _env_option(p)
    common = argparse.ArgumentParser(add_help=False)
    _env_option(common, argparse.SUPPRESS)
    common.add_argument("--ledger", default=None, metavar="URL",
                        help=f"ledger URL (default: ${LEDGER_URL_ENV}, else the env's ledger_url)")
    common.add_argument("--policies", default=None, metavar="PATH",
                        help="budget policy file (default: the env's)")
    common.add_argument("--json", action="store_true", help="machine-readable output")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="SUBCOMMAND")
    s = sub.add_parser("status", parents=[common], help="cap, spent, remaining and window of each budget")
    s.add_argument("--budget", default=None, metavar="ID", help="only this budget")
    h = sub.add_parser("history", parents=[common], help="every release that spent a budget")
    h.add_argument("--budget", required=True, metavar="ID")
    sub.add_parser("verify", parents=[common], help="check the integrity of the whole ledger")
    m = sub.add_parser("rebuild-mirror", help="rebuild the env's Delta mirror of the ledger and audit log "
                                              "from the SQL ledger (the authority)")
    _env_option(m, argparse.SUPPRESS)
    a = sub.add_parser("accept-policy", help="admin: apply a changed budget policy file (recorded, audited)")
    a.add_argument("--budget", required=True, metavar="ID")
    a.add_argument("--reason", required=True, help="why: recorded in the audit log and the policy history")
    _env_option(a, argparse.SUPPRESS)


BUDGET_SUBCOMMANDS = {
    "status": "cap, spent, remaining and window of each budget",
    "history": "every release that spent a budget",
    "verify": "check the integrity of the whole ledger",
    "rebuild-mirror": "rebuild the env's Delta mirror of the ledger from the SQL ledger",
    "accept-policy": "admin: apply a changed budget policy file (recorded, audited)",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dp-spark budget", description="Privacy budgets: cap, spent, remaining, releases.")
    add_budget_arguments(p)
    return p


class LedgerNotFoundError(ConfigError):
    """A command that only reads the ledger was pointed at one that does not exist."""

    def __init__(self, path: str) -> None:
        super().__init__(f"no ledger at {Path(path).resolve()}: nothing has been published with this env yet, or "
                         "--env / --ledger points at the wrong place")
        self.path = path


def accept_policy_command(args: argparse.Namespace, out: TextIO, *, spark: Any = None,
                          environ: Optional[dict] = None) -> int:
    """``accept-policy``: the env's admin applies the env's policy file for one budget.

    The principal is resolved like a job's (:func:`~dp_spark.governance.access.resolve_principal`,
    ``$DP_SPARK_PRINCIPAL`` only on the local env); it must hold the ``admin`` role in the
    env's ``access.yaml`` (a refusal is audited). The change, with its reason, is written to
    the budget's policy history and the audit log in one ledger transaction."""
    from dp_spark.config import load_env
    from dp_spark.governance.access import access_policy_for_env, authorize, resolve_principal

    environ = dict(os.environ) if environ is None else environ
    if not args.reason.strip():
        raise DpSparkError("--reason must say why the policy changes")
    from dp_spark.cli import resolve_env

    env = load_env(resolve_env(args.env, environ))
    policies = load_policies(env.policies)
    if args.budget not in policies:
        raise UnknownBudgetError(args.budget)
    _require_sqlite(env.ledger_url)
    access = access_policy_for_env(env, environ)
    principal = resolve_principal(spark, environ, env_name=env.name)
    with open_ledger(env.ledger_url) as ledger:
        authorize(access, principal, "admin", ledger=ledger, spec_name=f"accept-policy:{args.budget}")
        rec = ledger.accept_policy(policies[args.budget], principal=principal, reason=args.reason.strip())
    if rec is None:
        print(f"budget {args.budget}: the policy file equals the registered policy; nothing to accept", file=out)
        return 0
    print(f"budget {args.budget}: policy version {rec.version} accepted by {principal} "
          f"({rec.policy_hash[:12]}): " + "; ".join(rec.changes), file=out)
    return 0


def _num(v: Fraction) -> str:
    text = f"{float(v):.6g}"
    return text if Fraction(text) == v else f"{text} (exactly {v})"


def fmt_budget(b: Budget, policy: Optional[BudgetPolicy] = None, *, show_delta: bool = False) -> str:
    """``rho=0.5`` / ``epsilon=1``; the delta when it is > 0, or always with ``show_delta``
    (pure_dp and zcdp; approx_dp always shows it). With the budget's ``policy``, a zcdp amount
    is also shown as (epsilon, delta) at the budget's statement delta: epsilon is OpenDP's
    conversion of rho at the statement delta, delta is the statement delta plus the amount's
    own delta (``Accountant.statement``)."""
    shown = [f for f in b.FIELDS if f not in b.OPTIONAL or show_delta or getattr(b, f) > 0]
    text = ", ".join(f"{f}={_num(getattr(b, f))}" for f in shown)
    return text + _as_epsilon(b, policy)


def _as_epsilon(b: Budget, policy: Optional[BudgetPolicy]) -> str:
    """`` (epsilon=E at delta=D)`` for a zcdp amount with rho > 0 under a policy with a
    statement delta; empty otherwise."""
    if policy is None or b.MEASURE != "zcdp" or policy.statement_delta is None or b.rho == 0:
        return ""
    from dp_spark.accountant import Accountant

    st = Accountant("zcdp", statement_delta=policy.statement_delta).statement(b)
    return f" (epsilon={st['epsilon']:.4g} at delta={st['delta']:.3g})"


def _delta_json(policy: BudgetPolicy, cap: Budget, spent: Budget, remaining: Budget) -> dict[str, Any]:
    """The delta block of ``budget status --json`` and, for zcdp, the spend as (epsilon, delta)."""
    out: dict[str, Any] = {"delta_cap": str(cap.delta_part), "delta_spent": str(spent.delta_part),
                           "delta_remaining": str(remaining.delta_part)}
    if policy.measure == "zcdp" and policy.statement_delta is not None:
        from dp_spark.accountant import Accountant

        acc = Accountant("zcdp", statement_delta=policy.statement_delta)
        for name, amount in (("spent", spent), ("cap", cap)):
            st = acc.statement(amount)  # one OpenDP conversion per amount
            out[f"{name}_as_epsilon_delta"] = {"epsilon": st["epsilon"], "delta": st["delta"]}
    return out


def _ts(dt: Optional[datetime]) -> str:
    return "-" if dt is None else ts_text(dt)[:19] + "Z"


def _require_sqlite(url: str) -> None:
    """A SQLite ledger that does not exist is an error naming its path (never "nothing spent")."""
    path = sqlite_path(url)
    if path is not None and not Path(path).exists():
        raise LedgerNotFoundError(path)


def _open(url: str) -> Ledger:
    """The existing ledger at ``url``; a missing SQLite file raises :class:`LedgerNotFoundError`."""
    path = sqlite_path(url)
    if path is not None:
        _require_sqlite(url)
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


def _status(args: argparse.Namespace, ledger: Optional[Ledger], policies: dict[str, BudgetPolicy],
            out: TextIO) -> int:
    known = set(policies)
    if ledger is not None:
        known |= set(ledger.budget_ids())
    ids = [args.budget] if args.budget else sorted(known)
    if args.budget and args.budget not in known:
        raise UnknownBudgetError(args.budget)
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


def _history(args: argparse.Namespace, ledger: Optional[Ledger], policies: dict[str, BudgetPolicy],
             out: TextIO) -> int:
    if ledger is None or args.budget not in ledger.budget_ids():
        if args.budget in policies:
            entries: list[LedgerEntry] = []
        else:
            raise UnknownBudgetError(args.budget)
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


def _sources(args: argparse.Namespace, environ: dict) -> tuple[str, Optional[Path]]:
    """The ledger URL and policy file: ``--ledger`` / ``$DP_SPARK_LEDGER_URL`` and ``--policies``
    when given, otherwise the env file's (resolved against its project root)."""
    url = args.ledger or environ.get(LEDGER_URL_ENV)
    policies = Path(args.policies) if args.policies else None
    if url is None or policies is None:
        from dp_spark.cli import resolve_env
        from dp_spark.config import load_env

        env = load_env(resolve_env(args.env, environ))
        url = url or env.ledger_url
        policies = policies or Path(env.policies)
    return url, policies


def run_budget(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run a parsed ``budget`` subcommand. Errors are printed as ``dp-spark: error: ...``:
    exit 2 for a configuration error (env, policy file, missing ledger), 1 for any other
    (an unknown budget, an unreachable or tampered ledger, a refused permission)."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        return _run_budget(args, out)
    except UnknownBudgetError as exc:  # exit 1, as before this command had --env
        print(f"dp-spark: error: {exc}", file=err)
        return 1
    except ConfigError as exc:
        print(f"dp-spark: error: {exc}", file=err)
        return 2
    except DpSparkError as exc:
        print(f"dp-spark: error: {exc}", file=err)
        return 1


def _run_budget(args: argparse.Namespace, out: TextIO) -> int:
    environ = dict(os.environ)
    if args.cmd == "rebuild-mirror":
        from dp_spark.cli import resolve_env
        from dp_spark.config import load_env
        from dp_spark.ledger.mirror import rebuild_mirror_command

        env_path = resolve_env(args.env, environ)
        _require_sqlite(load_env(env_path).ledger_url)
        return rebuild_mirror_command(env_path, out)
    if args.cmd == "accept-policy":
        return accept_policy_command(args, out, environ=environ)
    url, policy_file = _sources(args, environ)
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


def budget_command(argv: Sequence[str], *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """``dp-spark budget ...`` from an argument list. Returns the exit status (2: usage)."""
    try:
        args = _parser().parse_args(list(argv))
    except SystemExit as exc:  # argparse: usage error (2) or --help (0)
        return int(exc.code or 0)
    return run_budget(args, out, err)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m dp_spark.ledger.cli ...``: the same as ``dp-spark budget ...``."""
    from dp_spark.cli import closed_pipe_safe

    return closed_pipe_safe(lambda: budget_command(sys.argv[1:] if argv is None else list(argv)))


if __name__ == "__main__":
    sys.exit(main())
