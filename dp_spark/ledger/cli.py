"""``dp-spark budget status|history|verify``: what each budget allows, spent, and on what.

    python -m dp_spark.ledger.cli status [--budget ID] [--ledger URL] [--policies PATH] [--json]
    python -m dp_spark.ledger.cli history --budget ID [--ledger URL] [--json]
    python -m dp_spark.ledger.cli verify [--ledger URL]
    python -m dp_spark.ledger.cli rebuild-mirror [--env ENV]   (starts Spark; writes the mirror only)
    python -m dp_spark.ledger.cli accept-policy --budget ID --reason TEXT [--env ENV]   (admin)

``--ledger`` defaults to ``$DP_SPARK_LEDGER_URL``, else ``sqlite:warehouse/ledger.db``;
``--policies`` to ``conf/policies/budgets.yaml``. ``status``, ``history`` and ``verify`` only
read: they never create a ledger or register a budget (a budget declared in the policy file but never used shows
spent 0). Exit status: 0 ok, 1 error (unknown budget, unreachable or tampered ledger),
2 usage.
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
from dp_spark.errors import DpSparkError
from dp_spark.ledger import open_ledger, sqlite_path
from dp_spark.ledger.base import BudgetStatus, Ledger, LedgerEntry, UnknownBudgetError, ts_text
from dp_spark.ledger.policy import BudgetPolicy, load_policies

__all__ = ["budget_command", "accept_policy_command", "main", "DEFAULT_LEDGER_URL", "DEFAULT_POLICIES", "LEDGER_URL_ENV"]

LEDGER_URL_ENV = "DP_SPARK_LEDGER_URL"
DEFAULT_LEDGER_URL = "sqlite:warehouse/ledger.db"
DEFAULT_POLICIES = "conf/policies/budgets.yaml"


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--ledger", default=None, metavar="URL",
                        help=f"ledger URL (default: ${LEDGER_URL_ENV} or {DEFAULT_LEDGER_URL})")
    common.add_argument("--policies", default=None, metavar="PATH",
                        help=f"budget policy file (default: {DEFAULT_POLICIES})")
    common.add_argument("--json", action="store_true", help="machine-readable output")
    p = argparse.ArgumentParser(prog="dp-spark budget", description="Privacy budgets: cap, spent, remaining, releases.")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("status", parents=[common], help="cap, spent, remaining and window of each budget")
    s.add_argument("--budget", default=None, metavar="ID", help="only this budget")
    h = sub.add_parser("history", parents=[common], help="every release that spent a budget")
    h.add_argument("--budget", required=True, metavar="ID")
    sub.add_parser("verify", parents=[common], help="check the integrity of the whole ledger")
    m = sub.add_parser("rebuild-mirror", help="rebuild the env's Delta mirror of the ledger and audit log "
                                              "from the SQL ledger (the authority)")
    m.add_argument("--env", default="conf/envs/local.yaml",
                   help="environment file: its ledger and mirror paths (default: %(default)s)")
    a = sub.add_parser("accept-policy", help="admin: apply a changed budget policy file (recorded, audited)")
    a.add_argument("--budget", required=True, metavar="ID")
    a.add_argument("--reason", required=True, help="why: recorded in the audit log and the policy history")
    a.add_argument("--env", default="conf/envs/local.yaml",
                   help="environment file: its ledger, budget policies and access policy (default: %(default)s)")
    return p


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
    env = load_env(args.env)
    policies = load_policies(env.policies)
    if args.budget not in policies:
        raise UnknownBudgetError(args.budget)
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


def fmt_budget(b: Budget) -> str:
    return ", ".join(f"{f}={_num(getattr(b, f))}" for f in b.FIELDS)


def _ts(dt: Optional[datetime]) -> str:
    return "-" if dt is None else ts_text(dt)[:19] + "Z"


def _open(url: str) -> Optional[Ledger]:
    """The ledger, or None when a SQLite ledger file does not exist yet (nothing spent)."""
    path = sqlite_path(url)
    if path is not None:
        if not Path(path).exists():
            return None
        return open_ledger(url, create=False)
    return open_ledger(url)


def _entry_json(e: LedgerEntry) -> dict[str, Any]:
    return {"seq": e.seq, "release_id": e.release_id, "release_family": e.release_family,
            "charge": e.charge.to_json(), "state": e.state, "principal": e.principal,
            "code_version": e.code_version, "created_at": _ts(e.created_at),
            "committed_at": _ts(e.committed_at) if e.committed_at else None}


def _print_entries(entries: list[LedgerEntry], out: TextIO, indent: str = "  ") -> None:
    if not entries:
        print(f"{indent}(no releases)", file=out)
        return
    rows = [("seq", "release_id", "family", "charge", "state", "created", "committed")]
    rows += [(str(e.seq), e.release_id, e.release_family, fmt_budget(e.charge), e.state,
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
    print(f"  cap        {fmt_budget(cap)}", file=out)
    if policy.max_per_release is not None:
        print(f"  per release at most {fmt_budget(policy.max_per_release)}", file=out)
    print(f"  spent      {fmt_budget(spent)}  ({n} release{'s' if n != 1 else ''} in this window; "
          f"reserved counts as spent)", file=out)
    print(f"  remaining  {fmt_budget(remaining)}", file=out)
    if note:
        print(f"  note       {note}", file=out)
    print("  releases in this window:", file=out)
    _print_entries(in_window, out, indent="    ")


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
    _print_entries(entries, out)
    return 0


def budget_command(argv: Sequence[str], *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Entry point of ``dp-spark budget``. Returns the exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        args = _parser().parse_args(list(argv))
    except SystemExit as exc:  # argparse: usage error (2) or --help (0)
        return int(exc.code or 0)
    if args.cmd == "rebuild-mirror":
        from dp_spark.ledger.mirror import rebuild_mirror_command

        try:
            return rebuild_mirror_command(args.env, out)
        except DpSparkError as exc:
            print(f"dp-spark budget: error: {exc}", file=err)
            return 1
    if args.cmd == "accept-policy":
        try:
            return accept_policy_command(args, out)
        except DpSparkError as exc:
            print(f"dp-spark budget: error: {exc}", file=err)
            return 1
    url = args.ledger or os.environ.get(LEDGER_URL_ENV) or DEFAULT_LEDGER_URL
    try:
        policies: dict[str, BudgetPolicy] = {}
        if args.policies is not None or Path(DEFAULT_POLICIES).is_file():
            policies = load_policies(args.policies or DEFAULT_POLICIES)
        ledger = _open(url)
        try:
            if args.cmd == "verify":
                if ledger is None:
                    print("no ledger yet: nothing to verify", file=out)
                    return 0
                ledger.verify()
                print("ledger verified: every budget row, entry chain, binding and audit row is intact", file=out)
                return 0
            if args.cmd == "status":
                return _status(args, ledger, policies, out)
            return _history(args, ledger, policies, out)
        finally:
            if ledger is not None:
                ledger.close()
    except DpSparkError as exc:
        print(f"dp-spark budget: error: {exc}", file=err)
        return 1


def main(argv: Optional[Sequence[str]] = None) -> int:
    return budget_command(sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    sys.exit(main())
