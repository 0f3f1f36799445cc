"""Human-readable summaries of committed releases (printed and written as Markdown/JSON).

Only called after the release's Delta write and ledger commit: the values printed here are
published values.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dp_spark.config import EnvConfig, ReleaseSpec, bounds_to_json

_WHAT_DP_MEANS = (
    "Differential privacy bounds how much any one {unit} (all of their records) can change the "
    "distribution of these published numbers. It does not protect the raw table (access control "
    "does), it does not make a hashed user id anonymous (a hash is a stable, linkable identifier), "
    "and privacy loss adds up across releases of the same data: that is what the budget tracks."
)


def _fmt_budget(b) -> str:
    return "none" if b is None else str(b)


def summary_dict(spec: ReleaseSpec, result, ledger) -> dict[str, Any]:
    status = ledger.status(spec.budget_id)
    first = result.rows[0] if result.rows else {}
    return {
        "release_id": result.release_id,
        "family": spec.family,
        "name": spec.name,
        "status": result.status,
        "note": result.note,
        "table": result.table_path,
        "privacy_unit": {"kind": spec.unit.kind.value, "column": spec.unit.column},
        "neighbouring": spec.neighbouring.value,
        "metric": spec.metric,
        "bounds": bounds_to_json(spec.bounds),
        "clamp": None if spec.value is None else {"declared": [str(spec.value.declared_lower), str(spec.value.declared_upper)],
                                                  "enforced": [str(spec.value.lower), str(spec.value.upper)]},
        "cells": spec.cells,
        "charge_of_this_release": spec.charge.to_json(),
        "charged_now": None if result.charge is None else result.charge.to_json(),
        "statement": {"epsilon": first.get("statement_epsilon"), "delta": first.get("statement_delta")},
        "parallel_composition": first.get("parallel_composition"),
        "budget": {"id": spec.budget_id, "cap": status.cap.to_json(), "spent": status.spent.to_json(),
                   "remaining": status.remaining.to_json(),
                   "window": [status.window_start.isoformat() if status.window_start else None,
                              status.window_end.isoformat() if status.window_end else None]},
        "input": {"table_id": first.get("input_table_id"), "version": first.get("input_version")},
        "mechanism": sorted({r["mechanism"] for r in result.rows}),
        "confidence": float(spec.confidence),
    }


def write_privacy_summary(env: EnvConfig, spec: ReleaseSpec, result, ledger) -> Path:
    d = summary_dict(spec, result, ledger)
    out = Path(env.warehouse) / "summaries"
    out.mkdir(parents=True, exist_ok=True)
    jpath = out / f"{spec.family}.json"
    jpath.write_text(json.dumps(d, indent=2, sort_keys=True))
    md = [
        f"# {spec.family}: privacy summary",
        "",
        f"- Release `{d['release_id']}` ({d['status']}), table `{d['table']}`",
        f"- Protected unit: **{spec.unit.kind.value}** (column `{spec.unit.column}`); neighbours: "
        f"`{spec.neighbouring.value}`",
        f"- Bounds enforced: {json.dumps(d['bounds'])}" + (f"; clamp {d['clamp']['enforced']}" if d["clamp"] else ""),
        f"- Charge: {spec.charge} -> statement epsilon={d['statement']['epsilon']}, delta={d['statement']['delta']}",
        f"- Budget `{spec.budget_id}`: spent {ledger.status(spec.budget_id).spent} of "
        f"{ledger.status(spec.budget_id).cap}",
        f"- Parallel composition across cells: {d['parallel_composition']}",
        "",
        _WHAT_DP_MEANS.format(unit=spec.unit.kind.value),
        "",
    ]
    mpath = out / f"{spec.family}.md"
    mpath.write_text("\n".join(md))
    return mpath


def print_summary(spec: ReleaseSpec, result, summary_path: Path, file=None) -> None:
    import sys

    f = file or sys.stdout
    print(f"== {spec.name}: {result.status} ({len(result.rows)} cells)", file=f)
    print(f"   release_id: {result.release_id}", file=f)
    print(f"   table:      {result.table_path}", file=f)
    print(f"   charged:    {_fmt_budget(result.charge)}   remaining in {spec.budget_id}: "
          f"{_fmt_budget(result.budget_remaining)}", file=f)
    print(f"   privacy summary: {summary_path}", file=f)
    if result.note:
        print(f"   note: {result.note}", file=f)
    shown = [r for r in result.rows if r["statistic"] != "count" or spec.metric == "count"][:8]
    for r in shown:
        print(f"   {r['statistic']:>15} {r['key']:>12}: {r['value']:12.2f}  "
              f"[{r['ci_low']:.2f}, {r['ci_high']:.2f}] at {r['confidence']:.0%}", file=f)
    if len(result.rows) > len(shown):
        print(f"   ... query the table for all {len(result.rows)} cells", file=f)
