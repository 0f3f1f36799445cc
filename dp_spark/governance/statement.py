"""The published privacy statement of a release family, generated -- never written by hand.

:func:`privacy_statement` builds one JSON-able dict from exactly three sources:

* the family's pre-registered specs (``ReleaseSpec``): unit, neighbour relation, bounds,
  clamps, metric, charge per release, confidence;
* the ledger: the charge of every release (exact), its state, the budget policy (measure,
  cap, window, statement delta), and everything else charged to the same budget (other
  families on the same data compose with this one);
* the tables: the family's release rows (mechanisms, per-release (epsilon, delta)
  statements, suppressed keys) and its versions (current, superseded, withdrawn + reason).

It also cross-checks them (``consistency``): every published version has a committed ledger
entry and release rows; every release's recorded charge equals its ledger charge and its
(epsilon, delta) equals the accountant's statement of that charge; unit, neighbour relation
and bounds of each release match its spec; at most one version is current. A statement with
problems is refused by :func:`write_statement` (unless forced): an inconsistent statement
must not be published.

Concurrent runs of one family (two backfill dates, two day-restricted publications) see each
other's releases half-way: rows written while the ledger entry is still reserved, or
committed but not yet versioned (a deferred run versions in its ``finish()``). Such a release
is *pending*, not a problem: it is listed under ``pending`` and left out of the checks that
need a version, and its owner's refresh adds it. Pending means: its ledger entry is reserved
with a live lease, or committed less than one lease ago (``lease_seconds``; by default the
lease the entry was reserved with). Past that, an unversioned release in the table is a real
inconsistency again (a run that crashed before versioning: rerun it), as is a versioned release
without rows, a version whose entry is not committed, or a release row without any entry.

:func:`statement_markdown` renders the dict; :func:`write_statement` writes
``<family>.json`` and ``<family>.md``. :func:`build_and_write_statement` reads the inputs with
Spark and writes the statement (what the engine calls after a publish and after a rollback).

The statement contains no data values except published ones' metadata: keys of suppressed
cells (public keys) and privacy parameters. Nothing here imports pyspark at module level.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections import OrderedDict
from datetime import datetime, timedelta, timezone
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

from dp_spark.governance.series import is_series, series_days
from dp_spark.core.budget import MEASURES, Budget, budget_from_json
from dp_spark.errors import DpSparkError

log = logging.getLogger(__name__)

__all__ = [
    "SCHEMA",
    "LIMITATIONS",
    "privacy_statement",
    "statement_markdown",
    "write_statement",
    "summarise_release_rows",
    "specs_for_family",
    "load_release_summaries",
    "summary_cache_dir",
    "build_and_write_statement",
    "StatementInconsistentError",
]

SCHEMA = "dp_spark.privacy_statement/1"

NEIGHBOURING_MEANING = {
    "add_remove_unit": "two datasets are neighbours when one has all the records of one {unit} more "
                       "than the other (adding or removing a whole {unit})",
    "replace_unit": "two datasets are neighbours when all the records of one {unit} are replaced by "
                    "those of another {unit}",
    "event": "two datasets are neighbours when they differ in one event (one row); a {unit} with many "
             "events is NOT protected as a whole",
}

MECHANISM_MEANING = {
    "discrete_laplace": "discrete Laplace noise (pure epsilon-DP), exact sampler, one draw per cell",
    "discrete_gaussian": "discrete Gaussian noise (rho-zCDP, stated as (epsilon, delta)), exact sampler, "
                         "one draw per cell",
}

LIMITATIONS = (
    "Differential privacy bounds how much the published numbers can depend on any one protected unit. "
    "It does not protect the raw data: who can read the input tables is an access-control question.",
    "It does not stop malicious insiders: anyone with raw-data access, or with the ledger key, is "
    "outside the guarantee.",
    "It does not prevent business-logic leaks: a release that should never be public (for example one "
    "that reveals a confidential business figure) is not made acceptable by noise.",
    "Dropping names and hashing identifiers is not anonymisation: a hash is a stable, linkable "
    "identifier and gives no guarantee on what a release reveals. Here a hashed id is only the privacy "
    "unit's key; the guarantee comes from bounding and noise.",
    "Privacy loss does not expire mathematically. Budget windows (daily, monthly, rolling) only bound "
    "the loss per period; releases of different periods about the same units still compose, and the "
    "all-time totals below are the loss to date.",
    "Every release about the same data and unit composes with this family's releases, including other "
    "families and exploration releases charged to the same budget (see 'whole budget' totals).",
    "Values are clamped and rows per unit are capped before aggregation: this bias is not covered by "
    "the published intervals, which cover the noise only.",
    "Minimum group sizes are applied to noisy counts (post-processing); a suppressed cell's key is "
    "public (the key set is declared in advance), only its value is withheld.",
    "A withdrawn version was published: withdrawing it removes it from the published view, not from "
    "the world, and its privacy loss is still counted (no refund).",
)

_HASH_HINTS = ("hash", "sha", "md5", "digest", "hmac", "pseudo")


class StatementInconsistentError(DpSparkError):
    """The statement's sources disagree (ledger vs release tables vs versions)."""


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------
def _iso(t: Any) -> Optional[str]:
    if t is None:
        return None
    if isinstance(t, datetime):
        if t.tzinfo is None:
            t = t.replace(tzinfo=timezone.utc)  # release tables store naive UTC
        return t.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    return str(t)


def _budget_json(b: Optional[Budget]) -> Optional[dict[str, str]]:
    return None if b is None else b.to_json()


def _floats(b: Optional[Budget]) -> Optional[dict[str, float]]:
    return None if b is None else b.as_floats()


def _close(a: Optional[float], b: Optional[float]) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)


def _statement_of(total: Budget, policy: Any) -> dict[str, Any]:
    """The (epsilon, delta) statement of a total in the budget's measure."""
    from dp_spark.accountant import Accountant

    if policy is None:
        return {"epsilon": None, "delta": None}
    acc = Accountant(policy.measure, statement_delta=policy.statement_delta)
    st = acc.statement(total)
    return {"epsilon": st.get("epsilon"), "delta": st.get("delta")}


def _clock_now(ledger: Any, now: Optional[datetime]) -> datetime:
    """``now`` as aware UTC; by default the ledger's clock (its entries' time base)."""
    if now is None:
        clock = getattr(ledger, "_clock", None) or getattr(ledger, "clock", None)
        try:
            now = clock() if callable(clock) else None
        except Exception:
            now = None
    now = now or datetime.now(timezone.utc)
    return now.replace(tzinfo=timezone.utc) if now.tzinfo is None else now.astimezone(timezone.utc)


def _pending_reason(e: Any, now: datetime, lease_seconds: Optional[float]) -> Optional[str]:
    """Why an unversioned release with ledger entry ``e`` is still pending (its run is live),
    or None when it is not (no entry, lease expired, committed for longer than a lease)."""
    if e is None:
        return None
    if e.state == "reserved" and e.lease_expires_at > now:
        return (f"reserved by a live run (lease until {_iso(e.lease_expires_at)}): its run commits and "
                "versions it")
    if e.state == "committed" and e.committed_at is not None:
        lease = (timedelta(seconds=float(lease_seconds)) if lease_seconds is not None
                 else max(e.lease_expires_at - e.created_at, timedelta(0)))
        if now < e.committed_at + lease:
            return (f"committed {_iso(e.committed_at)}, not versioned yet: its run versions it when it "
                    "finishes")
    return None


def summarise_release_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One summary per release id from release-table rows (already-summarised rows, i.e.
    carrying ``suppressed_keys``, pass through). Ordered by creation time."""
    out: "OrderedDict[str, dict[str, Any]]" = OrderedDict()
    for r in rows:
        rid = r["release_id"]
        if "suppressed_keys" in r:
            out[rid] = dict(r)
            continue
        s = out.get(rid)
        if s is None:
            s = out[rid] = {k: r.get(k) for k in (
                "release_id", "release_family", "release_name", "spec_version", "mode", "created_at",
                "statement_epsilon", "statement_delta", "charge_json", "charge_epsilon", "charge_rho",
                "budget_id", "privacy_unit", "unit_column", "neighbouring", "bounds_json", "confidence",
                "parallel_composition", "key_column", "input_table_id", "input_version", "code_version")}
            s.update(mechanisms=set(), statistics=set(), suppressed_keys=set(), cells=0)
        s["cells"] += 1
        s["mechanisms"].add(r.get("mechanism"))
        s["statistics"].add(r.get("statistic"))
        if r.get("suppressed"):
            s["suppressed_keys"].add(r.get("key"))
        if r.get("created_at") is not None and (s["created_at"] is None or r["created_at"] < s["created_at"]):
            s["created_at"] = r["created_at"]
    res = []
    for s in out.values():
        s = dict(s)
        for k in ("mechanisms", "statistics", "suppressed_keys"):
            s[k] = sorted(x for x in (s.get(k) or ()) if x is not None)
        res.append(s)
    res.sort(key=lambda s: (_iso(s.get("created_at")) or "", s["release_id"]))
    return res


def _key_table_json(k: Any) -> dict[str, Any]:
    """A group-by column whose keys a public key table holds (read at each publication)."""
    return {"column": k.column, "kind": "table", "table": k.table.dataset, "table_column": k.table.column,
            "where": k.table.where}


def _bounds_match(recorded: Mapping[str, Any], spec: Any) -> bool:
    """A release's enforced bounds are its spec file's; with a key table, whose keys are read at
    publication, L0 may be capped at the cells they give (``ReleaseSpec.with_table_keys``)."""
    from dp_spark.config import bounds_to_json

    declared = bounds_to_json(spec.bounds)
    if not spec.table_key_sets:
        return dict(recorded) == declared
    l0 = "max_partitions_per_unit"
    return ({k: v for k, v in recorded.items() if k != l0} == {k: v for k, v in declared.items() if k != l0}
            and isinstance(recorded.get(l0), int) and 1 <= recorded[l0] <= declared[l0])


def _key_table_cells(g: Mapping[str, Any]) -> str:
    return f"the keys of public table `{g['table']}` in `{g['column']}`"


def _spec_json(spec: Any) -> dict[str, Any]:
    from dp_spark.config import bounds_to_json

    d: dict[str, Any] = {
        "name": spec.name,
        "version": spec.version(),
        "description": spec.description,
        "dataset": spec.dataset,
        "metric": spec.metric,
        "privacy_unit": {"kind": spec.unit.kind.value, "column": spec.unit.column},
        "neighbouring": spec.neighbouring.value,
        "group_by": _key_table_json(spec.key_sets[0]) if spec.table_key_sets and spec.metric is not None
        else None if spec.group_by is None else {
            "column": spec.group_by.column, "kind": spec.group_by.kind, "cells": len(spec.group_by.values),
            "first_key": spec.group_by.values[0], "last_key": spec.group_by.values[-1]},
        "bounds": bounds_to_json(spec.bounds),
        "clamp": None if spec.value is None else {
            "column": spec.value.column,
            "declared": [str(spec.value.declared_lower), str(spec.value.declared_upper)],
            "enforced": [str(spec.value.lower), str(spec.value.upper)]},
        "mean": None if spec.mean is None else {
            "assumed_group_size": spec.mean.assumed_group_size, "min_count": spec.mean.min_count,
            "assumed_mean": None if spec.mean.assumed_mean is None else str(spec.mean.assumed_mean)},
        "budget_id": spec.budget_id,
        "charge_per_release": spec.charge.to_json(),
        "confidence": str(spec.confidence),
        "simultaneous_bands": bool(getattr(spec, "simultaneous", False)),
        "columns_read": list(spec.columns),
        "max_cells": spec.max_cells,
        # a spec file's key table is read at publication: its cells are the release's
        "parallel_composition": spec.bounds.max_partitions_per_unit == 1 and (bool(spec.table_key_sets)
                                                                            or spec.cells > 1),
        "on_exhausted": spec.on_exhausted.policy,
        "source": str(spec.source),
    }
    if getattr(spec, "metric", None) is None:
        # written in the multi-statistic form: every statistic, every key column, the public
        # filter (a single-metric spec is stated as written: metric, group_by, clamp, mean)
        d["statistics"] = [s.canonical() for s in spec.statistics]
        d["group_by"] = [{"column": k.column, "kind": k.kind, "cells": len(k.values),
                          "first_key": k.values[0], "last_key": k.values[-1]}
                         if k.kind not in ("private", "table") else
                         _key_table_json(k) if k.kind == "table" else
                         {"column": k.column, "kind": "private", "max_keys": k.max_keys}
                         for k in spec.key_sets]
        d["where"] = spec.where
        d["key_tuples"] = None if spec.table_key_sets else spec.cells
        if getattr(spec, "stream", None) is not None:  # running totals, one charge for the horizon
            from dp_spark.statistics.stream import plan_stream

            d["stream"] = {"horizon_days": spec.stream.horizon_days, "start": spec.stream.start,
                           "parallel_composition": False, "error": plan_stream(spec).error_profile()}
            d["parallel_composition"] = False
        if spec.private_key_sets and not spec.table_key_sets:
            # public parameters of the private key selection only: which keys were selected is
            # in the release table, never how many units they have
            from dp_spark.statistics.plan import plan_query

            sel = plan_query(spec).selection
            d["key_tuples_at_most"] = None if spec.table_key_sets else spec.cells
            d["key_selection"] = {
                "columns": list(sel.columns), "share_of_charge": str(spec.selection_share),
                "epsilon": None if sel.epsilon is None else float(sel.epsilon), "delta": float(sel.delta),
                "noise_scale": float(sel.scale), "threshold_units": sel.threshold,
                "units_for_even_odds": sel.count_for(0.5),
                "units_for_95_percent": sel.count_for(0.95),
            }
    elif getattr(spec, "where", None) is not None:
        d["where"] = spec.where
    mgs = getattr(spec, "min_group_size", None)
    if mgs is not None:
        d["min_group_size"] = mgs.to_json() if hasattr(mgs, "to_json") else mgs
    return d


def _spec_for_release(rel: Mapping[str, Any], specs: Sequence[Any]) -> tuple[Optional[Any], str]:
    """(spec, how): the spec whose version the release carries ("exact"), or whose name
    prefixes the release's name (a per-key restriction: "restriction"), or (None, "unknown")."""
    for s in specs:
        if s.version() == rel.get("spec_version"):
            return s, "exact"
    name = rel.get("release_name") or ""
    for s in sorted(specs, key=lambda s: -len(s.name)):
        if s.group_by is not None and name.startswith(s.name) and name != s.name:
            return s, "restriction"
    return None, "unknown"


# --------------------------------------------------------------------------------------
# the statement
# --------------------------------------------------------------------------------------
def privacy_statement(
    family: str,
    specs: Sequence[Any],
    ledger: Any,
    releases: Sequence[Mapping[str, Any]],
    published: Sequence[Mapping[str, Any]],
    *,
    policies: Optional[Mapping[str, Any]] = None,
    now: Optional[datetime] = None,
    lease_seconds: Optional[float] = None,
) -> dict[str, Any]:
    """The statement of ``family`` (see the module docstring).

    ``specs``: the family's registered specs (any number of versions). ``ledger``: anything
    with ``entries(budget_id)``, ``status(budget_id)`` and ideally ``get_policy(budget_id)``
    (else pass ``policies``: budget id -> BudgetPolicy). ``releases``: the family's official
    release-table rows, or their summaries (:func:`summarise_release_rows`). ``published``:
    the family's versions (the ledger's record, :func:`versions.history`). ``now`` (default: the ledger's clock) and
    ``lease_seconds`` decide which unversioned releases are still *pending* (see the module
    docstring).
    """
    specs = [s for s in specs if s.family == family]
    if not specs:
        raise DpSparkError(f"no registered spec of family {family!r}: a statement is generated from specs")
    rels = summarise_release_rows([r for r in releases if r.get("release_family", family) == family])
    rel_by_id = {r["release_id"]: r for r in rels}
    versions = sorted((dict(v) for v in published if v.get("family", family) == family),
                      key=lambda v: int(v["version_no"]))
    version_of = {v["release_id"]: v for v in versions}
    problems: list[str] = []

    # budgets, policies, ledger entries
    budget_ids = sorted({s.budget_id for s in specs} | {r["budget_id"] for r in rels if r.get("budget_id")})
    pols: dict[str, Any] = {}
    for bid in budget_ids:
        pol = None
        if hasattr(ledger, "get_policy"):
            try:
                pol = ledger.get_policy(bid)
            except DpSparkError:
                pol = None
        if pol is None and policies is not None:
            pol = policies.get(bid)
        pols[bid] = pol
    all_entries = {bid: list(ledger.entries(bid)) for bid in budget_ids}
    fam_entries = {bid: [e for e in es if e.release_family == family] for bid, es in all_entries.items()}
    entry_of = {e.release_id: e for es in fam_entries.values() for e in es}
    for r in rels:  # a stream's points are charged by the stream's one entry (charge_json names it)
        sid = _stream_id_of(r)
        if sid is not None and sid in entry_of:
            entry_of.setdefault(r["release_id"], entry_of[sid])
    t_now = _clock_now(ledger, now)
    # releases of other live runs, seen half-way: in the table, not versioned yet
    pending = {r["release_id"]: why for r in rels
               if r["release_id"] not in version_of and r.get("mode", "official") == "official"
               and (why := _pending_reason(entry_of.get(r["release_id"]), t_now, lease_seconds)) is not None}

    # -- per release (every charge of this family, published or not) -----------------------
    per_release = []
    for bid in budget_ids:
        for e in fam_entries[bid]:
            rel = rel_by_id.get(e.release_id)
            v = version_of.get(e.release_id)
            per_release.append({
                "release_id": e.release_id, "budget_id": bid, "charge": e.charge.to_json(),
                "charge_float": e.charge.as_floats(), "ledger_state": e.state,
                "statement": _statement_of(e.charge, pols.get(bid)),
                "charged_at": _iso(e.created_at), "committed_at": _iso(e.committed_at),
                "in_release_table": rel is not None,
                "version_no": None if v is None else int(v["version_no"]),
                "version_state": None if v is None else v["state"],
                "kind": ("pending: " + pending[e.release_id]) if e.release_id in pending else
                        "official" if rel is not None else "not in the official table (exploration, "
                        "reserved and not written yet, or never written)",
            })

    # -- windows ----------------------------------------------------------------------------
    accounting, per_window, all_time, current_window = [], [], [], []
    for bid in budget_ids:
        pol = pols.get(bid)
        try:
            st = ledger.status(bid, now) if now is not None else ledger.status(bid)
        except TypeError:
            st = ledger.status(bid)
        measure = pol.measure if pol is not None else st.measure
        zero = MEASURES[measure].zero()
        accounting.append({
            "budget_id": bid, "measure": measure,
            "accountant": {"pure_dp": "pure epsilon-DP, basic composition (epsilons add)",
                           "zcdp": "rho-zCDP (rhos add), stated as (epsilon, delta) via OpenDP's conversion",
                           "approx_dp": "(epsilon, delta)-DP, basic composition"}.get(measure, measure),
            "cap": _budget_json(pol.cap if pol is not None else st.cap),
            "cap_statement": _statement_of(pol.cap if pol is not None else st.cap, pol),
            "statement_delta": None if pol is None or pol.statement_delta is None else str(pol.statement_delta),
            # the delta releases may spend per window (private key selection); 0: none may
            "delta_cap": str((pol.cap if pol is not None else st.cap).delta_part),
            "window": None if pol is None else pol.window.describe(),
            "max_per_release": None if pol is None else _budget_json(pol.max_per_release),
            "dataset": None if pol is None else pol.dataset,
            "privacy_unit": None if pol is None else pol.privacy_unit,
            # every policy the ledger registered for the budget, and who accepted each change
            "policy_history": ([h.to_json() for h in ledger.policy_history(bid)]
                               if hasattr(ledger, "policy_history") else None),
        })
        fam_total = sum((e.charge for e in fam_entries[bid]), zero)
        bud_total = sum((e.charge for e in all_entries[bid]), zero)
        all_time.append({"budget_id": bid, "family_total": fam_total.to_json(),
                         "family_statement": _statement_of(fam_total, pol),
                         "budget_total": bud_total.to_json(), "budget_statement": _statement_of(bud_total, pol),
                         "family_releases": len(fam_entries[bid]), "budget_releases": len(all_entries[bid])})
        current_window.append({"budget_id": bid, "start": _iso(st.window_start), "end": _iso(st.window_end),
                               "cap": st.cap.to_json(), "spent": st.spent.to_json(),
                               "remaining": st.remaining.to_json(),
                               "spent_statement": _statement_of(st.spent, pol),
                               "delta_spent": str(st.spent.delta_part),
                               "delta_remaining": str(st.remaining.delta_part)})
        if pol is not None and pol.window.kind in ("none", "daily", "monthly"):
            groups: "OrderedDict[tuple, dict[str, Any]]" = OrderedDict()
            for e in sorted(all_entries[bid], key=lambda e: e.created_at):
                start, end = pol.window.bounds(e.created_at)
                g = groups.setdefault((start, end), {"fam": zero, "bud": zero, "n_fam": 0, "n_bud": 0})
                g["bud"] = g["bud"] + e.charge
                g["n_bud"] += 1
                if e.release_family == family:
                    g["fam"] = g["fam"] + e.charge
                    g["n_fam"] += 1
            for (start, end), g in groups.items():
                if g["n_fam"] == 0:
                    continue
                per_window.append({
                    "budget_id": bid, "window": pol.window.describe(), "start": _iso(start), "end": _iso(end),
                    "family_total": g["fam"].to_json(), "family_statement": _statement_of(g["fam"], pol),
                    "family_releases": g["n_fam"], "budget_total": g["bud"].to_json(),
                    "budget_statement": _statement_of(g["bud"], pol), "budget_releases": g["n_bud"],
                    "cap": pol.cap.to_json(),
                })

    # -- versions, errata, current ------------------------------------------------------------
    version_rows, errata = [], []
    current = [v for v in versions if v["state"] == "current"]
    current_keys = [v.get("series_key") for v in current]
    if len(current_keys) != len(set(current_keys)):
        problems.append(f"{len(current)} versions are current" + (" for one day" if is_series(versions) else ""))
    for v in versions:
        rid = v["release_id"]
        rel = rel_by_id.get(rid)
        e = entry_of.get(rid)
        if e is None:
            problems.append(f"version {v['version_no']}: release {rid} has no ledger entry of this family")
        elif e.state != "committed":
            problems.append(f"version {v['version_no']}: ledger entry of release {rid} is not committed")
        if rel is None:
            problems.append(f"version {v['version_no']}: release {rid} has no rows in the official release table")
        row = {
            "version_no": int(v["version_no"]), "release_id": rid, "state": v["state"],
            **({} if v.get("series_key") is None else {"day": v["series_key"]}),
            "published_by": v.get("principal"), "published_at": _iso(v.get("at")),
            "release_name": None if rel is None else rel.get("release_name"),
            "spec_version": None if rel is None else rel.get("spec_version"),
            "input_version": None if rel is None else rel.get("input_version"),
            "charge": None if e is None else e.charge.to_json(),
            "statement": None if rel is None else {"epsilon": rel.get("statement_epsilon"),
                                                    "delta": rel.get("statement_delta")},
            "mechanisms": [] if rel is None else rel.get("mechanisms", []),
            "suppressed_keys": [] if rel is None else rel.get("suppressed_keys", []),
        }
        version_rows.append(row)
        if v["state"] == "withdrawn":
            errata.append({"version_no": int(v["version_no"]), "release_id": rid,
                           **({} if v.get("series_key") is None else {"day": v["series_key"]}),
                           "withdrawn_at": _iso(v.get("changed_at")), "withdrawn_by": v.get("changed_by"),
                           "reason": v.get("reason"),
                           "charge_kept": None if e is None else e.charge.to_json(),
                           "note": "withdrawn from the published view; its privacy loss still counts"})

    # -- release rows vs ledger vs specs -------------------------------------------------------
    thresholds = []
    for rel in rels:
        rid = rel["release_id"]
        e = entry_of.get(rid)
        if e is None:
            problems.append(f"release {rid} is in the release table but has no ledger entry of this family")
        else:
            if e.state != "committed" and rid not in pending:
                problems.append(f"release {rid}: ledger entry is {e.state}, not committed")
            try:
                recorded = budget_from_json(json.loads(rel["charge_json"])["charge"])
            except (KeyError, TypeError, ValueError, DpSparkError):
                recorded = None
            if recorded != e.charge:
                problems.append(f"release {rid}: recorded charge differs from the ledger's")
            expect = _statement_of(e.charge, pols.get(e.budget_id))
            if expect["epsilon"] is not None and not (
                    _close(rel.get("statement_epsilon"), expect["epsilon"])
                    and _close(rel.get("statement_delta"), expect["delta"])):
                problems.append(f"release {rid}: recorded (epsilon, delta) differs from the accountant's")
        spec, how = _spec_for_release(rel, specs)
        if spec is None:
            problems.append(f"release {rid}: its spec version is not among the registered specs")
        else:
            if rel.get("privacy_unit") not in (None, spec.unit.kind.value) or \
                    rel.get("neighbouring") not in (None, spec.neighbouring.value):
                problems.append(f"release {rid}: unit or neighbour relation differs from its spec")
            if how == "exact" and rel.get("bounds_json") is not None and \
                    not _bounds_match(json.loads(rel["bounds_json"]), spec):
                problems.append(f"release {rid}: bounds differ from its spec")
        if rid not in version_of and rel.get("mode", "official") == "official" and rid not in pending:
            e = entry_of.get(rid)
            since = "" if e is None or e.committed_at is None else f" (committed {_iso(e.committed_at)})"
            problems.append(f"release {rid} is in the official table but has no version{since}: its run "
                            "ended before versioning it; rerun it (a cache hit versions it)")
        mgs = getattr(spec, "min_group_size", None) if spec is not None else None
        thresholds.append({"release_id": rid, "suppressed_keys": rel.get("suppressed_keys", []),
                           "suppressed_cells": len(rel.get("suppressed_keys", [])),
                           "rule": None if mgs is None else (mgs.to_json() if hasattr(mgs, "to_json") else mgs)})

    # -- limitations derived from the specs -------------------------------------------------
    limitations = list(LIMITATIONS)
    for s in specs:
        col = s.unit.column.lower()
        if any(h in col for h in _HASH_HINTS):
            limitations.append(f"Spec {s.name}: the unit column '{s.unit.column}' looks like a hashed "
                               "identifier. It is accepted as the privacy unit (it still identifies one "
                               "unit); hashing it provides no privacy by itself.")
        if s.neighbouring.value == "event":
            limitations.append(f"Spec {s.name}: event-level privacy; a {s.unit.kind.value} with many "
                               "events can be distinguishable.")
        if s.bounds.max_partitions_per_unit > 1:
            limitations.append(f"Spec {s.name}: one {s.unit.kind.value} may appear in up to "
                               f"{s.bounds.max_partitions_per_unit} cells; the charge covers all of them "
                               "together (no parallel composition).")
    limitations = list(dict.fromkeys(limitations))

    units = sorted({(s.unit.kind.value, s.unit.column) for s in specs})
    relations = sorted({s.neighbouring.value for s in specs})
    unit_kind = units[0][0]
    mechanisms = sorted({m for r in rels for m in r.get("mechanisms", [])} |
                        {"discrete_laplace" if s.charge.MEASURE == "pure_dp" else "discrete_gaussian" for s in specs})
    cur = current[-1] if current else None
    return {
        "schema": SCHEMA,
        "family": family,
        "generated_at": _iso(now or datetime.now(timezone.utc)),
        "generated_from": {
            "specs": [{"name": s.name, "version": s.version(), "source": str(s.source)} for s in specs],
            "ledger_entries_of_family": sum(len(v) for v in fam_entries.values()),
            "release_rows_summarised": len(rels), "versions": len(versions),
            "note": "generated from the registered specs, the budget ledger and the release and versions "
                    "tables; never edited by hand",
        },
        "privacy_unit": [{"kind": k, "column": c} for k, c in units],
        "neighbouring": [{"relation": r, "meaning": NEIGHBOURING_MEANING.get(r, r).format(unit=unit_kind)}
                         for r in relations],
        "queries": [_spec_json(s) for s in specs],
        "mechanisms": [{"name": m, "meaning": MECHANISM_MEANING.get(m, m)} for m in mechanisms],
        "accounting": accounting,
        "current": None if cur is None else {"version_no": int(cur["version_no"]), "release_id": cur["release_id"]},
        "versions": version_rows,
        # a series (versions keyed by day): each day, its current version (or withdrawn)
        **({"days": [{**x, "published_at": _iso(x["published_at"])} for x in series_days(versions)]}
           if is_series(versions) else {}),
        "charges": {"per_release": per_release, "per_window": per_window, "all_time": all_time,
                    "current_window": current_window,
                    "note": "withdrawn releases keep their charge: they were published"},
        "thresholds": {"applied_to": "noisy counts only (post-processing, no budget)", "per_release": thresholds},
        "limitations": limitations,
        "errata": errata,
        "pending": [{"release_id": rid, "release_name": rel_by_id[rid].get("release_name"), "why": why}
                    for rid, why in pending.items()],
        "consistency": {"ok": not problems, "problems": problems},
    }


def _b(d: Optional[Mapping[str, Any]]) -> str:
    if not d:
        return "-"
    # decimals for people; the exact fractions stay in the statement's JSON
    return ", ".join(f"{k}={float(Fraction(str(v))):.6g}" for k, v in d.items() if k != "measure") + (
        f" ({d['measure']})" if "measure" in d else "")


def _st(d: Optional[Mapping[str, Any]]) -> str:
    if not d or d.get("epsilon") is None:
        return "-"
    return f"epsilon={float(d['epsilon']):.4g}, delta={float(d['delta']):.3g}"


def _stream_id_of(rel: Mapping[str, Any]) -> Optional[str]:
    """The stream a release row's point belongs to (its charge_json's ``stream.stream_id``), or None."""
    try:
        stream = json.loads(rel.get("charge_json") or "{}").get("stream")
    except (TypeError, ValueError):
        return None
    return stream.get("stream_id") if isinstance(stream, dict) else None


def streams_paragraph(queries: Sequence[Mapping[str, Any]]) -> list[str]:
    """The statement's section on running totals published under continual release."""
    streams = [q for q in queries if q.get("stream")]
    if not streams:
        return []
    out = ["## Running totals (continual release)", ""]
    for q in streams:
        st = q["stream"]
        out.append(f"- `{q['name']}` publishes running totals from {st['start']} over a horizon of "
                   f"{st['horizon_days']} days through the binary-tree mechanism: the whole horizon is charged "
                   "once, at the first refresh, and every day's point reuses noises stored once. Error "
                   f"(noise stddev; {float(Fraction(q['confidence'])):.0%} half-width) by day of the horizon:")
        for e in st["error"]:
            out.append(f"  - {e['statistic']}, day {e['day']}: {e['stddev']:.4g}; {e['halfwidth']:.4g}")
    out.append("")
    return out


def intervals_paragraph(queries: Sequence[Mapping[str, Any]]) -> list[str]:
    """The statement's section on what an interval promises over a whole chart (multiplicity),
    and the simultaneous bands of the queries that publish them: Markdown lines."""
    levels = sorted({float(Fraction(q["confidence"])) for q in queries}) or [0.95]
    c = levels[-1]
    misses = (1 - c) * 60
    out = ["## Intervals over a whole chart", "",
           f"Each published value comes with a {c:.0%} interval: that one value's interval contains the true "
           f"value with probability {c:.0%}. Over a chart of 60 such values, about {misses:.3g} intervals are "
           "expected to miss by design, and nobody can tell which; the chance that every one of the 60 holds is "
           f"only about {c ** 60:.0%} (for independent noises). A *simultaneous band* promises more: all values of "
           f"the release are inside their bands together with probability {c:.0%}, so a chart read as a whole is "
           "covered; the price is a wider band per value.", ""]
    banded = [q for q in queries if q.get("simultaneous_bands")]
    for q in banded:
        level = float(Fraction(q["confidence"]))
        if q.get("stream"):  # dependent points (shared tree nodes): Bonferroni over the horizon
            m = q["stream"]["horizon_days"] * max(len(q.get("statistics") or ()), 1)
            out.append(f"- `{q['name']}` publishes a simultaneous band with every running total (columns "
                       f"`band_low`, `band_high`): all {m} points of its horizon (days x statistics) are inside "
                       f"their bands together with probability at least {level:.0%}; each band is that point's "
                       f"interval at miss probability {1 - level:g}/{m} (Bonferroni, valid although the points "
                       "share noises), the same band at every refresh.")
            continue
        out.append(f"- `{q['name']}` publishes a simultaneous band with every value (columns `band_low`, "
                   f"`band_high`): for each statistic of a release with m values, each band is that value's "
                   f"interval at the level {level:g}^(1/m) (Sidak), so all m are covered together with "
                   f"probability {level:.0%}: exact when each interval is exact for its noise, since the noises "
                   "of distinct values are independent (and at least that for the kinds whose intervals are "
                   "conservative bounds).")
    if not banded:
        out.append("No query of this family publishes simultaneous bands (`confidence: {level: ..., "
                   "simultaneous: true}` in its spec).")
    out.append("")
    return out


def statement_markdown(d: Mapping[str, Any]) -> str:
    """Render a statement dict as Markdown (everything in it comes from the dict)."""
    L: list[str] = []
    add = L.append
    add(f"# Privacy statement: {d['family']}")
    add("")
    add(f"_Generated {d['generated_at']} from the registered specs, the budget ledger and the release "
        f"tables ({d['schema']}). Do not edit: regenerate._")
    add("")
    if not d["consistency"]["ok"]:
        add("> **WARNING: the sources of this statement disagree:**")
        for p in d["consistency"]["problems"]:
            add(f"> - {p}")
        add("")
    cur = d.get("current")
    days = d.get("days") or []
    if days:  # a series: every day has its own current version
        live = [x for x in days if x["state"] == "current"]
        add("## Published days")
        add("")
        add(f"A series published a day at a time: {len(live)} day(s) published"
            + (f", {live[0]['day']} to {live[-1]['day']}" if live else "")
            + "; each day is replaced only by a re-publication of that same day.")
    else:
        add("## Current version")
        add("")
        add("No version is currently published." if cur is None else
            f"Version {cur['version_no']} (release `{cur['release_id']}`).")
    add("")
    add("## What is protected")
    add("")
    for u in d["privacy_unit"]:
        add(f"- Privacy unit: **{u['kind']}** (column `{u['column']}`); all records of one {u['kind']} form one unit.")
    for n in d["neighbouring"]:
        add(f"- Neighbour relation `{n['relation']}`: {n['meaning']}.")
    add("")
    add("## Queries (pre-registered specs)")
    add("")
    add("| spec | version | metric | cells | bounds (K, L0, Linf) | clamp (enforced) | charge per release | confidence |")
    add("|---|---|---|---|---|---|---|---|")
    for q in d["queries"]:
        b = q["bounds"]
        metric = q["metric"]
        if isinstance(q["group_by"], list):  # multi-statistic form: key tuples x statistics
            cells = " x ".join(f"{g['cells']} `{g['column']}`" if g.get("kind") not in ("private", "table") else
                               _key_table_cells(g) if g.get("kind") == "table" else
                               f"at most {g['max_keys']} `{g['column']}` (found privately)"
                               for g in q["group_by"]) or "1"
            metric = ", ".join(f"{st['name']} ({st['kind']})" for st in q["statistics"])
            clamps = sorted({f"`{st['clamp']['column']}` [{st['clamp']['lower']}, {st['clamp']['upper']}]"
                             for st in q["statistics"] if st["clamp"] is not None})
            clamp = "; ".join(clamps) or "-"
            if q.get("where"):
                metric += " where " + q["where"].replace("|", "\\|")
        else:
            cells = (1 if q["group_by"] is None else _key_table_cells(q["group_by"]) if q["group_by"].get("kind") == "table"
                     else f"{q['group_by']['cells']} by `{q['group_by']['column']}`")
            clamp = "-" if q["clamp"] is None else f"[{q['clamp']['enforced'][0]}, {q['clamp']['enforced'][1]}]"
        add(f"| {q['name']} | `{q['version']}` | {metric} | {cells} | "
            f"{b['max_rows_per_unit']}, {b['max_partitions_per_unit']}, {b['max_rows_per_partition'] or b['max_rows_per_unit']} | "
            f"{clamp} | {_b(q['charge_per_release'])} | {float(Fraction(q['confidence'])):g} |")
    add("")
    add("Sensitivities are derived from these enforced bounds. Columns read: " +
        "; ".join(f"{q['name']}: {', '.join(q['columns_read'])}" for q in d["queries"]) + ".")
    add("")
    for q in d["queries"]:
        sel = q.get("key_selection")
        if sel:
            add(f"Keys of {', '.join(f'`{c}`' for c in sel['columns'])} in {q['name']} are found privately: a "
                f"key is published when its noisy number of distinct units ("
                + (f"discrete Laplace of scale {sel['noise_scale']:.4g}, epsilon {sel['epsilon']:.4g}"
                   if sel.get("epsilon") is not None else f"discrete Gaussian of sigma {sel['noise_scale']:.4g}")
                + f", {float(Fraction(sel['share_of_charge'])) * 100:.3g}% of the charge) "
                f"reaches {sel['threshold_units']}; a key with {sel['units_for_even_odds']} units is published "
                f"with even odds, with {sel['units_for_95_percent']} units 95% of the time. A key that one unit "
                f"alone creates is published with probability at most delta = {sel['delta']:.3g}. "
                "Unselected keys leave no trace.")
            add("")
    for line in streams_paragraph(d["queries"]):
        add(line)
    for line in intervals_paragraph(d["queries"]):
        add(line)
    add("## Mechanisms")
    add("")
    for m in d["mechanisms"]:
        add(f"- `{m['name']}`: {m['meaning']}.")
    add("")
    add("## Accounting")
    add("")
    for a in d["accounting"]:
        add(f"- Budget `{a['budget_id']}`: {a['accountant']}; cap {_b(a['cap'])} ({_st(a['cap_statement'])}); "
            f"delta cap {float(Fraction(a.get('delta_cap') or '0')):.3g}; "
            f"window {a['window']}; max per release {_b(a['max_per_release'])}.")
    add("")
    for a in d["accounting"]:
        if a.get("policy_history"):
            add(f"### Policy history of budget `{a['budget_id']}`")
            add("")
            add("| version | policy | accepted by | at | reason | changes |")
            add("|---|---|---|---|---|---|")
            for h in a["policy_history"]:
                add(f"| {h['version']} | `{h['policy_hash'][:12]}` | {h['principal']} | {h['at']} | {h['reason']} | "
                    f"{'; '.join(h['changes']) or '-'} |")
            add("")
    add("### Charge per release")
    add("")
    add("| release | version | state | charge | (epsilon, delta) | charged at |")
    add("|---|---|---|---|---|---|")
    for r in d["charges"]["per_release"]:
        add(f"| `{r['release_id'][:16]}` | {r['version_no'] or '-'} | {r['version_state'] or r['kind']} | "
            f"{_b(r['charge'])} | {_st(r['statement'])} | {r['charged_at']} |")
    add("")
    if d["charges"]["per_window"]:
        add("### Charge per window")
        add("")
        add("| budget | window | this family | (epsilon, delta) | whole budget | (epsilon, delta) | cap |")
        add("|---|---|---|---|---|---|---|")
        for w in d["charges"]["per_window"]:
            span = "all time" if w["start"] is None else f"{w['start']} to {w['end']}"
            add(f"| {w['budget_id']} | {span} | {_b(w['family_total'])} | {_st(w['family_statement'])} | "
                f"{_b(w['budget_total'])} | {_st(w['budget_statement'])} | {_b(w['cap'])} |")
        add("")
    add("### All time (loss does not expire)")
    add("")
    for t in d["charges"]["all_time"]:
        add(f"- `{t['budget_id']}`: this family {_b(t['family_total'])} ({_st(t['family_statement'])}) over "
            f"{t['family_releases']} releases; whole budget {_b(t['budget_total'])} "
            f"({_st(t['budget_statement'])}) over {t['budget_releases']} releases.")
    for c in d["charges"]["current_window"]:
        add(f"- Current window of `{c['budget_id']}`: spent {_b(c['spent'])} ({_st(c.get('spent_statement'))}), "
            f"remaining {_b(c['remaining'])}; delta spent {float(Fraction(c.get('delta_spent') or '0')):.3g}, "
            f"delta remaining {float(Fraction(c.get('delta_remaining') or '0')):.3g}.")
    add("")
    add("## Minimum group sizes")
    add("")
    add(f"Applied to {d['thresholds']['applied_to']}.")
    add("")
    for t in d["thresholds"]["per_release"]:
        rule = "no minimum group size" if t["rule"] is None else f"threshold {t['rule'].get('threshold')} ({t['rule'].get('strategy')})"
        keys = ", ".join(t["suppressed_keys"]) if t["suppressed_keys"] else "none"
        add(f"- `{t['release_id'][:16]}`: {rule}; suppressed keys: {keys}.")
    add("")
    if days:
        add("## Days")
        add("")
        add("| day | release | version | state | published by | published at | earlier versions |")
        add("|---|---|---|---|---|---|---|")
        for x in days:
            earlier = ", ".join(f"{n} {what}" for n, what in ((x["superseded"], "replaced"),
                                                              (x["withdrawn"], "withdrawn")) if n) or "-"
            add(f"| {x['day']} | `{x['release_id'][:16]}` | {x['version_no']} | {x['state']} | {x['principal']} | "
                f"{x['published_at']} | {earlier} |")
        keyless = [v for v in d["versions"] if v.get("day") is None]
        if keyless:
            add("")
            add("Versions of the whole family (before its days were versioned one by one):")
            add("")
    else:
        keyless = d["versions"]
    if keyless or not days:
        if not days:
            add("## Versions")
            add("")
        add("| version | release | state | published by | published at | (epsilon, delta) |")
        add("|---|---|---|---|---|---|")
        for v in keyless:
            add(f"| {v['version_no']} | `{v['release_id'][:16]}` | {v['state']} | {v['published_by']} | "
                f"{v['published_at']} | {_st(v['statement'])} |")
    add("")
    if d.get("pending"):
        add("## Pending releases")
        add("")
        add("Published by runs still in progress; they are added to this statement when their run "
            "versions them:")
        add("")
        for x in d["pending"]:
            add(f"- `{x['release_id'][:16]}` ({x.get('release_name') or '-'}): {x['why']}.")
        add("")
    add("## Errata")
    add("")
    if not d["errata"]:
        add("None.")
    for e in d["errata"]:
        on = "" if e.get("day") is None else f" of day {e['day']}"
        add(f"- Version {e['version_no']}{on} (release `{e['release_id'][:16]}`) withdrawn {e['withdrawn_at']} by "
            f"{e['withdrawn_by']}: {e['reason']}. Its charge ({_b(e['charge_kept'])}) still counts.")
    add("")
    add("## What differential privacy does not cover")
    add("")
    for x in d["limitations"]:
        add(f"- {x}")
    add("")
    return "\n".join(L)


def write_statement(directory: str | os.PathLike, d: Mapping[str, Any], *, force: bool = False) -> tuple[Path, Path]:
    """Write ``<family>.json`` and ``<family>.md`` atomically (temp file + rename).

    Refuses an inconsistent statement (``StatementInconsistentError``) unless ``force``.
    """
    if not d["consistency"]["ok"] and not force:
        raise StatementInconsistentError(
            f"privacy statement of {d['family']!r} not written: " + "; ".join(d["consistency"]["problems"][:5]))
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for suffix, text in ((".json", json.dumps(d, indent=2, sort_keys=False, default=str) + "\n"),
                         (".md", statement_markdown(d))):
        p = out / f"{d['family']}{suffix}"
        tmp = out / f".{d['family']}{suffix}.{os.getpid()}.tmp"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, p)
        paths.append(p)
    return paths[0], paths[1]


# --------------------------------------------------------------------------------------
# inputs from the tables (Spark) and the one call the engine makes
# --------------------------------------------------------------------------------------
def specs_for_family(releases_dir: str | os.PathLike, family: str) -> list[Any]:
    """Every valid spec file under ``releases_dir`` whose family is ``family`` (sorted by path)."""
    from dp_spark.config import load_release_spec

    out = []
    for p in sorted(Path(releases_dir).glob("*.y*ml")):
        try:
            s = load_release_spec(p)
        except DpSparkError:
            continue
        if s.family == family:
            out.append(s)
    return out


#: The release summaries of a family kept between statements (:func:`load_release_summaries`).
SUMMARY_CACHE_SCHEMA = "dp_spark.release_summaries/1"
#: The most commits since the cached version that are read from the table's history; more: the whole table is read.
SUMMARY_CACHE_MAX_COMMITS = 256
#: The commits read by the first ``DESCRIBE HISTORY`` when there is a cache (most statements
#: follow one or a few release writes).
SUMMARY_CACHE_RECENT = 16
_FIRSTS = ("release_name", "spec_version", "statement_epsilon", "statement_delta", "charge_json", "charge_epsilon",
           "charge_rho", "budget_id", "privacy_unit", "unit_column", "neighbouring", "bounds_json", "confidence",
           "parallel_composition", "key_column", "input_table_id", "input_version", "code_version")


#: Up to this many releases read by id, a release's fields that are the same in every row of it
#: (:data:`_FIRSTS`) come from one row of it (a Spark job each) instead of the aggregation
#: (18 more aggregate buffers per row: half the aggregation's time on 1.8M rows).
_FIRSTS_BY_ROW = 8


def _summarise_frame(df, ids: Optional[Sequence[str]] = None) -> list[dict[str, Any]]:
    """One summary per (release id, family, mode) of the rows of ``df`` (one Spark aggregation),
    or of its rows of the release ids ``ids``."""
    from pyspark.sql import functions as F

    by_row = ids is not None and len(ids) <= _FIRSTS_BY_ROW
    if ids is not None:
        df = df.where(F.col("release_id").isin(list(ids)))
    agg = df.groupBy("release_id", "release_family", "mode").agg(
        *([] if by_row else [F.first(c).alias(c) for c in _FIRSTS]),
        F.min("created_at").alias("created_at"),
        F.count(F.lit(1)).alias("cells"),
        F.sort_array(F.collect_set("mechanism")).alias("mechanisms"),
        F.sort_array(F.collect_set("statistic")).alias("statistics"),
        F.sort_array(F.collect_set(F.when(F.col("suppressed"), F.col("key")))).alias("suppressed_keys"),
    )
    rows = [r.asDict() for r in agg.collect()]
    if by_row:
        firsts: dict[str, dict[str, Any]] = {}
        for rid in {r["release_id"] for r in rows}:
            one = df.where(F.col("release_id") == rid).select(*_FIRSTS).limit(1).collect()
            firsts[rid] = one[0].asDict() if one else {c: None for c in _FIRSTS}
        rows = [{**r, **firsts[r["release_id"]]} for r in rows]
    return rows


#: The release rows' fields a summary reads.
_ROW_FIELDS = ("release_id", "release_family", "mode", *_FIRSTS, "created_at", "mechanism", "statistic", "suppressed",
               "key")
#: Releases added since the cache with at most this many rows in all are summarised from their
#: rows read to the driver (one Spark job) rather than by a Spark aggregation (a shuffle: two
#: stages, each with its fixed cost).
SUMMARY_ROWS_ON_DRIVER = 20_000


def _summarise_added(df, added: Mapping[str, int]) -> list[dict[str, Any]]:
    """The summaries of the release ids ``added`` (id -> rows its commits added) in ``df``: from
    their rows on the driver when they are few (:data:`SUMMARY_ROWS_ON_DRIVER`), else by
    :func:`_summarise_frame`."""
    from pyspark.sql import functions as F

    if not added:
        return []
    ids = sorted(added)
    if sum(added.values()) > SUMMARY_ROWS_ON_DRIVER:
        return _summarise_frame(df, ids)
    got = df.where(F.col("release_id").isin(ids)).select(*_ROW_FIELDS).collect()
    return _summarise_groups(r.asDict() for r in got)


def _summarise_groups(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """:func:`_summarise_frame` of release rows at hand: one summary per (release id, family, mode)."""
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["release_id"], r["release_family"], r["mode"]), []).append(r)
    return [s for g in groups.values() for s in summarise_release_rows(g)]


def summary_cache_dir(statements_dir: str | os.PathLike) -> Path:
    """Where :func:`load_release_summaries` keeps a family's summaries: ``<statements>/.summaries``
    (a cache: deleting it costs one read of the whole table at the next statement)."""
    return Path(statements_dir) / ".summaries"


def _cache_file(cache_dir: str | os.PathLike, family: str) -> Path:
    return Path(cache_dir) / (family + ".json")


def _to_json(v: Any) -> Any:
    return {"$datetime": v.isoformat()} if isinstance(v, datetime) else v


def _from_json(v: Any) -> Any:
    return datetime.fromisoformat(v["$datetime"]) if isinstance(v, dict) and set(v) == {"$datetime"} else v


def _read_summary_cache(cache_dir: Optional[str | os.PathLike], family: str, table: str) -> Optional[dict[str, Any]]:
    """The family's cached summaries, or None (no cache, or one that cannot be read: never raises)."""
    if cache_dir is None:
        return None
    try:
        d = json.loads(_cache_file(cache_dir, family).read_text(encoding="utf-8"))
        if d.get("schema") != SUMMARY_CACHE_SCHEMA or d.get("family") != family or d.get("table") != table:
            return None
        d["version"], d["timestamp"] = int(d["version"]), str(d["timestamp"])
        d["summaries"] = [{k: _from_json(v) for k, v in x.items()} for x in d["summaries"]]
        return d
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _write_summary_cache(cache_dir: Optional[str | os.PathLike], family: str, table: str, version: int, timestamp: str,
                         summaries: list[dict[str, Any]]) -> None:
    """Keep the summaries of the table at ``version`` (atomically: a temporary file, then a
    rename; never raises: the cache only saves a read)."""
    if cache_dir is None:
        return
    try:
        out = _cache_file(cache_dir, family)
        out.parent.mkdir(parents=True, exist_ok=True)
        body = json.dumps({"schema": SUMMARY_CACHE_SCHEMA, "family": family, "table": table, "version": version,
                           "timestamp": timestamp,
                           "summaries": [{k: _to_json(v) for k, v in x.items()} for x in summaries]},
                          sort_keys=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.{id(body)}.part")
        tmp.write_text(body, encoding="utf-8")
        os.replace(tmp, out)
    except OSError as exc:
        log.warning("release summaries of %s: the cache could not be written (%s)", family, type(exc).__name__)


def _added_releases(commits: list[dict[str, Any]], version: int, timestamp: Optional[str],
                    last: int) -> Optional[dict[str, int]]:
    """The releases the commits after the cached ``version`` added (release id -> rows), when
    every one of them is a release write of dp_spark (``WRITE``, its ``userMetadata`` naming the
    release, its row count in ``operationMetrics``) and the commit at ``version`` is the one the
    cache saw (same ``timestamp``: not a table dropped and made again; None: the table's
    creation, see :func:`_empty_creation`); None otherwise."""
    from dp_spark.delta.release_table import committed_release_id

    if [int(c["version"]) for c in commits] != list(range(version, last + 1)):
        return None  # the log no longer holds them all (or the table is younger than the cache)
    if timestamp is not None and str(commits[0].get("timestamp")) != timestamp:
        return None
    added: dict[str, int] = {}
    for c in commits[1:]:
        rid = committed_release_id(c)
        rows = (c.get("operationMetrics") or {}).get("numOutputRows")
        if c.get("operation") != "WRITE" or rid is None or rows is None:
            return None
        added[rid] = added.get(rid, 0) + int(rows)
    return added


def _empty_creation(commit: dict[str, Any]) -> bool:
    """Is ``commit`` a table's version 0 that wrote no row (how dp_spark creates a release table:
    :func:`~dp_spark.delta.release_table.ensure_release_table`)? Then the table's summaries are
    those of the releases its later commits added, as if cached, empty, at its creation."""
    from dp_spark.delta.release_table import committed_release_id

    metrics = commit.get("operationMetrics") or {}
    return (int(commit["version"]) == 0 and commit.get("operation") == "WRITE"
            and committed_release_id(commit) is None
            and metrics.get("numOutputRows") == "0")


def load_release_summaries(spark, *, family: str, releases_path: str,
                           cache_dir: Optional[str | os.PathLike] = None,
                           written: Optional[Mapping[str, dict[str, Any]]] = None) -> list[dict[str, Any]]:
    """The release summaries of a statement (one per official release of ``family``): they
    depend on the release table only, not on the version records. One aggregation over the
    family's rows, at one version of the table.

    With ``cache_dir``, the summaries are kept there with the table's version, and the next
    call reads only what was added since: when every commit after that version is a release
    write of dp_spark (:func:`~dp_spark.delta.release_table.release_commit_metadata` names its
    release, Delta's ``numOutputRows`` counts its rows), only the rows of those release ids are
    aggregated, and each id's row count in the table must equal what its commits added, so a
    commit that wrote rows of another release is caught. Anything else since (a ``DELETE`` of
    the retention, an ``OPTIMIZE``, any other writer, a commit the log no longer holds, a table
    made again) and the whole table is read. Without a cache, a table of at most
    :data:`SUMMARY_CACHE_RECENT` commits that dp_spark created empty (:func:`_empty_creation`)
    is read the same way from its creation.

    ``written``: release id -> the summary (:func:`summarise_release_rows`) of rows this process
    wrote to the table itself, in a write that landed (the engine's, kept from its publish).
    Such a release added since the cache is not read back when its commit added exactly that
    summary's number of rows; any other is read as above."""
    from pyspark.sql import functions as F

    from dp_spark.delta.release_table import recent_commits

    cached = _read_summary_cache(cache_dir, family, releases_path)
    # one DESCRIBE HISTORY: the latest version and the commits since the cached one
    hist = recent_commits(spark, releases_path, SUMMARY_CACHE_RECENT)
    if not hist:  # no Delta table there
        return summarise_release_rows([])
    last, last_ts = int(hist[0]["version"]), str(hist[0].get("timestamp"))
    df = spark.read.format("delta").option("versionAsOf", last).load(releases_path)
    if cached is None and _empty_creation(hist[-1]):  # a young table: all its history is at hand
        cached = {"version": 0, "timestamp": None, "summaries": []}
    added = None
    if cached is not None and 0 <= last - cached["version"] < SUMMARY_CACHE_MAX_COMMITS:
        if last - cached["version"] >= len(hist):  # more since than that read: read them all
            hist = recent_commits(spark, releases_path, last - cached["version"] + 1)
        chain = sorted((c for c in hist if cached["version"] <= int(c["version"]) <= last),
                       key=lambda c: int(c["version"]))
        added = _added_releases(chain, cached["version"], cached["timestamp"], last)
    rows: Optional[list[dict[str, Any]]] = None
    how = "the whole table read"
    if added is not None:
        known = {rid: dict(written[rid]) for rid in added
                 if written and rid in written and written[rid].get("cells") == added[rid]}
        read = [*known.values(), *_summarise_added(df, {rid: n for rid, n in added.items() if rid not in known})]
        cells: dict[str, int] = {}
        for r in read:
            cells[r["release_id"]] = cells.get(r["release_id"], 0) + r["cells"]
        if cells == added:
            rows = [s for s in cached["summaries"] if s["release_id"] not in added] + read
            n_read = f"{len(added) - len(known)} release(s) read" + (f", {len(known)} as written" if known else "")
            how = (f"{n_read}, the rest from the cache of version {cached['version']}"
                   if cached["timestamp"] is not None else
                   f"{n_read} (every commit since the table's creation is a release write)")
        else:  # a commit wrote rows of another release id: read everything
            how += " (a commit's rows are not its release's)"
    if rows is None:
        rows = _summarise_frame(df.where((F.col("release_family") == family) & (F.col("mode") == "official")))
    rows = [r for r in rows if r["release_family"] == family and r["mode"] == "official"]
    log.info("release summaries of %s at version %d: %s", family, last, how)
    summaries = summarise_release_rows(rows)
    _write_summary_cache(cache_dir, family, releases_path, last, last_ts, summaries)
    return summaries


REBUILDS = 5


def build_and_write_statement(spark, *, family: str, ledger: Any, releases_dir: str | os.PathLike,
                              releases_path: str, out_dir: str | os.PathLike,
                              force: bool = False, now: Optional[datetime] = None,
                              summaries: Optional[list[dict[str, Any]]] = None,
                              lease_seconds: Optional[float] = None,
                              written: Optional[Mapping[str, dict[str, Any]]] = None,
                              ) -> tuple[dict[str, Any], Path, Path]:
    """Read the specs, tables and ledger, build the statement, write it. Returns (dict, json, md).

    ``summaries``: the family's :func:`load_release_summaries`, when the caller read them
    already (after the family's last release write); read here otherwise (``written``: see
    :func:`load_release_summaries`). ``lease_seconds``:
    how long an unversioned release stays *pending* after its commit (see the module docstring).

    Concurrent runs of the family each write the statement; the last write must not be a
    stale one. So after writing, the family's versions are read again: when another run
    changed them meanwhile (it versioned a release after our read), the statement is rebuilt
    and rewritten. Any run versioning later reads after our write, so the last file written
    reflects every version committed before it (as long as no run dies between its
    versioning and its statement)."""
    from dp_spark.governance.versions import history

    specs = specs_for_family(releases_dir, family)
    pub = history(ledger, family)
    for _attempt in range(REBUILDS):
        if summaries is None:
            summaries = load_release_summaries(spark, family=family, releases_path=releases_path,
                                               cache_dir=summary_cache_dir(out_dir), written=written)
        d = privacy_statement(family, specs, ledger, summaries, pub, now=now, lease_seconds=lease_seconds)
        j, m = write_statement(out_dir, d, force=force)
        again = history(ledger, family)
        if again == pub:
            break
        # another run versioned meanwhile: rebuild from the new state
        pub, summaries = again, None
    return d, j, m
