"""A Python API for notebooks: build a multi-statistic release, plan it, publish it.

::

    import dp_spark.api as dp

    rel = (dp.release("orders_by_day_region")
             .on("demo_events", unit="user_id")
             .by(day=dp.dates("2026-11-01", "2026-11-30"), region=["region_01", "region_02"])
             .where("order_value IS NOT NULL AND region <> 'test'")
             .bounds(rows_per_unit=10, partitions_per_unit=3, rows_per_partition=5)
             .distinct_units("users").count("orders")
             .sum("revenue", "order_value", 0, 500).mean("aov", "order_value", 0, 500)
             .stddev("order_sd", "order_value", 0, 500).quantile("median_order", "order_value", 0.5, 0, 500)
             .charge(rho=0.5, budget="demo_events_user"))
    rel.plan()                    # per statistic: components, sensitivities, noise, expected errors; no data read
    cells = rel.publish(engine)   # Spark DataFrame of the published cells (as_pandas=True for pandas)

The builder makes exactly the YAML spec of ``docs/config.md`` (:meth:`ReleaseBuilder.to_dict`,
:meth:`ReleaseBuilder.to_yaml`) and validates it with the same code
(:func:`dp_spark.config.release_spec_from_dict`); :meth:`ReleaseBuilder.publish` goes through
the same :class:`~dp_spark.engine.Engine` (governance, ledger, noise, Delta): nothing here can
bypass the charge. In ``official`` mode the built spec must equal a spec file pre-registered
under the access policy's ``releases_dir`` (write :meth:`to_yaml` there); in ``exploration``
mode it is charged to the exploration budget like any exploration release.

Nothing here imports pyspark until :meth:`ReleaseBuilder.publish`.
"""

from __future__ import annotations

import copy
from datetime import date
from fractions import Fraction
from pathlib import Path
from typing import Any, Optional, Union

import yaml

from dp_spark.core.budget import ZCDP, PureDP
from dp_spark.core.events import LAPLACE
from dp_spark.errors import ConfigError

__all__ = ["release", "dates", "private", "ReleaseBuilder", "plan_table", "schema_reference"]


def dates(start: Union[str, date], end: Union[str, date]) -> dict[str, Any]:
    """A public date key set from ``start`` to ``end`` (inclusive)."""
    return {"dates": {"start": str(start), "end": str(end)}}


def private(max_keys: int, *, share: Optional[float] = None, mechanism: Optional[str] = None) -> dict[str, Any]:
    """Keys of a group-by column found privately from the data (at most ``max_keys`` values
    published; ``share`` of the charge spent on selecting them, 1/4 by default; ``mechanism``
    the threshold's noise, laplace by default, gaussian or cheaper under zcdp): the release
    then spends delta too (``charge(..., delta=...)``). ``by(region=private(500))``."""
    pk: dict[str, Any] = {"max_keys": max_keys}
    if share is not None:
        pk["share"] = share
    if mechanism is not None:
        pk["mechanism"] = mechanism
    return {"private_keys": pk}


#: the first line of a spec file: editors (yaml-language-server) complete and check it
SCHEMA_HEADER = "# yaml-language-server: $schema={}"
SCHEMA_FILE = "release-spec.schema.json"


def schema_reference(path: Union[str, Path, None]) -> Optional[str]:
    """The path of the project's release-spec JSON Schema relative to the folder of the spec
    file ``path`` (``../release-spec.schema.json`` for ``conf/releases/x.yaml``): the first
    ``release-spec.schema.json`` or ``conf/release-spec.schema.json`` found in the folder or
    one of its parents; None when there is none. Without a path: the reference of a file in
    ``conf/releases/``."""
    import os

    if path is None:
        return f"../{SCHEMA_FILE}"
    folder = Path(path).resolve().parent
    for d in (folder, *folder.parents):
        for candidate in (d / SCHEMA_FILE, d / "conf" / SCHEMA_FILE):
            if candidate.is_file():
                return Path(os.path.relpath(candidate, folder)).as_posix()
    return None


def release(name: str) -> "ReleaseBuilder":
    """Start a release spec named ``name`` (also its family, unless :meth:`ReleaseBuilder.family`)."""
    return ReleaseBuilder(name)


def _keys(value: Any) -> dict[str, Any]:
    """A group_by entry's key part: {"public_keys": ...} or {"private_keys": ...}."""
    if isinstance(value, dict) and set(value) == {"private_keys"}:
        return copy.deepcopy(value)
    if isinstance(value, dict) and set(value) <= {"values", "dates"}:
        return {"public_keys": value}
    if isinstance(value, (list, tuple)):
        return {"public_keys": {"values": list(value)}}
    raise ConfigError("group-by keys are a list of values, dp_spark.api.dates(start, end) or "
                      "dp_spark.api.private(max_keys)")


class ReleaseBuilder:
    """Immutable-style builder: every call returns a new builder (safe to branch in notebooks)."""

    def __init__(self, name: str, _data: Optional[dict] = None) -> None:
        self._data: dict[str, Any] = _data if _data is not None else {
            "name": name, "neighbouring": "add_remove_unit", "statistics": []}

    def _with(self, **changes) -> "ReleaseBuilder":
        d = copy.deepcopy(self._data)
        d.update(changes)
        return ReleaseBuilder(d["name"], d)

    # -- what and whom ---------------------------------------------------------------------
    def on(self, dataset: str, *, unit: str = "user_id", unit_kind: str = "user",
           neighbouring: Optional[str] = None) -> "ReleaseBuilder":
        """The logical dataset (a name of the env's ``datasets``) and its privacy unit."""
        changes = {"dataset": dataset, "privacy_unit": {"kind": unit_kind, "column": unit}}
        if neighbouring is not None:
            changes["neighbouring"] = neighbouring
        elif unit_kind == "event":
            changes["neighbouring"] = "event"
        return self._with(**changes)

    def family(self, family: str) -> "ReleaseBuilder":
        return self._with(family=family)

    def describe(self, text: str) -> "ReleaseBuilder":
        return self._with(description=text)

    def by(self, *columns: str, **public_keys: Any) -> "ReleaseBuilder":
        """Group-by columns, in order; every column needs its public keys, given here as a
        keyword (``region=[...]``, ``day=dates(a, b)``) or by :meth:`keys`."""
        order = list(columns) + [c for c in public_keys if c not in columns]
        known = {g["column"]: {k: v for k, v in g.items() if k != "column"}
                 for g in self._data.get("group_by", [])}
        known.update({c: _keys(v) for c, v in public_keys.items()})
        return self._with(group_by=[{"column": c, **known.get(c, {"public_keys": None})} for c in order])

    def keys(self, **public_keys: Any) -> "ReleaseBuilder":
        """Public keys of group-by columns already named in :meth:`by`."""
        gb = copy.deepcopy(self._data.get("group_by", []))
        names = [g["column"] for g in gb]
        for c, v in public_keys.items():
            if c not in names:
                raise ConfigError(f"keys(): '{c}' is not a group-by column (call by() first)")
            entry = gb[names.index(c)]
            entry.pop("public_keys", None)
            entry.pop("private_keys", None)
            entry.update(_keys(v))
        return self._with(group_by=gb)

    def where(self, predicate: str) -> "ReleaseBuilder":
        return self._with(where=predicate)

    def columns(self, *columns: str) -> "ReleaseBuilder":
        return self._with(columns=list(columns))

    def bounds(self, *, rows_per_unit: int, partitions_per_unit: int = 1,
               rows_per_partition: Optional[int] = None) -> "ReleaseBuilder":
        b = {"max_rows_per_unit": rows_per_unit, "max_partitions_per_unit": partitions_per_unit}
        if rows_per_partition is not None:
            b["max_rows_per_partition"] = rows_per_partition
        return self._with(bounds=b)

    def confidence(self, level: float, *, simultaneous: bool = False) -> "ReleaseBuilder":
        """The intervals' level; ``simultaneous``: also a band per cell covering all cells of a
        statistic together (``docs/accuracy.md``)."""
        return self._with(confidence={"level": level, "simultaneous": True} if simultaneous else level)

    def max_cells(self, n: int) -> "ReleaseBuilder":
        return self._with(max_cells=n)

    # -- statistics ------------------------------------------------------------------------
    def statistic(self, name: str, kind: str, **fields: Any) -> "ReleaseBuilder":
        """Any registered statistic kind with its fields (``docs/config.md``)."""
        stats = copy.deepcopy(self._data["statistics"])
        stats.append({"name": name, "kind": kind, **{k: v for k, v in fields.items() if v is not None}})
        return self._with(statistics=stats)

    def count(self, name: str = "count", **opts) -> "ReleaseBuilder":
        return self.statistic(name, "count", **opts)

    def distinct_units(self, name: str = "units", **opts) -> "ReleaseBuilder":
        return self.statistic(name, "distinct_units", **opts)

    def sum(self, name: str, column: str, lower, upper, **opts) -> "ReleaseBuilder":
        return self.statistic(name, "sum", column=column, lower=lower, upper=upper, **opts)

    def mean(self, name: str, column: str, lower, upper, **opts) -> "ReleaseBuilder":
        return self.statistic(name, "mean", column=column, lower=lower, upper=upper, **opts)

    def variance(self, name: str, column: str, lower, upper, **opts) -> "ReleaseBuilder":
        return self.statistic(name, "variance", column=column, lower=lower, upper=upper, **opts)

    def stddev(self, name: str, column: str, lower, upper, **opts) -> "ReleaseBuilder":
        return self.statistic(name, "stddev", column=column, lower=lower, upper=upper, **opts)

    def quantile(self, name: str, column: str, q: float, lower, upper, **opts) -> "ReleaseBuilder":
        return self.statistic(name, "quantile", column=column, q=q, lower=lower, upper=upper, **opts)

    # -- the charge ------------------------------------------------------------------------
    def charge(self, *, rho=None, epsilon=None, delta=None, budget: Optional[str] = None) -> "ReleaseBuilder":
        """The release's charge: ``rho`` (zCDP, discrete Gaussian) or ``epsilon`` (pure DP,
        discrete Laplace), against ``budget``; ``delta`` only for a release with private keys
        (:func:`private`). Without ``budget``, :meth:`publish` and :meth:`for_policies` take the
        one budget policy that governs the dataset in that measure (and refuse when there is
        none or more than one)."""
        if (rho is None) == (epsilon is None):
            raise ConfigError("charge(): give exactly one of rho (zcdp) or epsilon (pure_dp)")
        b = {"id": budget, "measure": "zcdp", "rho": rho} if rho is not None else \
            {"id": budget, "measure": "pure_dp", "epsilon": epsilon}
        if delta is not None:
            b["delta"] = delta
        return self._with(budget=b)

    # -- the spec --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The spec as the YAML of ``docs/config.md`` holds it."""
        d = copy.deepcopy(self._data)
        order = ["name", "family", "description", "dataset", "privacy_unit", "neighbouring", "where",
                 "group_by", "bounds", "statistics", "budget", "confidence", "columns", "max_cells"]
        return {k: d[k] for k in order if k in d}

    def to_yaml(self, path: Union[str, Path, None] = None) -> str:
        """The spec as YAML (written to ``path`` when given, e.g. to pre-register it under
        ``conf/releases/``), headed like the shipped specs by the ``yaml-language-server``
        comment that points editors at the project's JSON Schema
        (``conf/release-spec.schema.json``): relative to ``path``'s folder when the schema is
        found in it or one of its parents (as ``conf/`` or beside it), the conventional
        ``../release-spec.schema.json`` of ``conf/releases/`` when no path is given, and no
        header when a path has no schema above it. The comment changes nothing in the spec
        (nor its version or release id)."""
        ref = schema_reference(path)
        body = yaml.safe_dump(self.to_dict(), sort_keys=False)
        text = (SCHEMA_HEADER.format(ref) + "\n" + body) if ref is not None else body
        if path is not None:
            Path(path).write_text(text)
        return text

    def for_policies(self, policies) -> "ReleaseBuilder":
        """The builder with its budget id filled in from ``policies`` ({id: BudgetPolicy}) when
        :meth:`charge` named none: the one policy of the dataset in the charge's measure. When
        there is none or more than one, the error lists the declared budgets and names the
        field to add (``budget.id``: ``charge(..., budget='ID')``)."""
        b = self._data.get("budget")
        if b is None or b.get("id") is not None:
            return self
        dataset = self._data.get("dataset")
        ids = sorted(i for i, p in policies.items() if p.dataset == dataset and p.measure == b["measure"])
        if len(ids) != 1:
            declared = ", ".join(f"{i} ({p.measure} on '{p.dataset}')" for i, p in sorted(policies.items()))
            raise ConfigError(
                f"charge(): {len(ids)} {b['measure']} budget policies govern dataset '{dataset}'"
                f"{f' ({ids})' if ids else ''}; name one with charge(..., budget='ID') (field budget.id). "
                f"Declared budgets: {declared or 'none'}")
        return self._with(budget=dict(b, id=ids[0]))

    def spec(self, source: str = "<python api>"):
        """The validated :class:`~dp_spark.config.ReleaseSpec` (same checks as a YAML file)."""
        from dp_spark.config import release_spec_from_dict

        for g in self._data.get("group_by", []):
            if g.get("public_keys") is None and g.get("private_keys") is None:
                raise ConfigError(f"{source}: group-by column '{g['column']}' has no keys: give "
                                  "them in by(...) or keys(...), or private(max_keys) to find them privately")
        return release_spec_from_dict(self.to_dict(), source=source)

    def plan(self, *, group_size: Optional[int] = None, budget_policy=None, env=None):
        """Per statistic, from public parameters only (no data read, nothing charged): its
        components with their share of the charge, sensitivity, mechanism and noise scale, and
        the expected error and interval half-width per cell at ``group_size`` rows (default:
        the statistic's ``assumed_group_size``). See :func:`plan_table`.

        The budget is resolved as :meth:`publish` resolves it: when :meth:`charge` named none,
        the one policy that governs the dataset in the charge's measure fills it in, taken
        from ``budget_policy`` when given (it must govern the dataset in that measure), else
        from the budget policies of ``env`` (an :class:`~dp_spark.config.EnvConfig` or an env
        file; default: the env the CLI uses, ``$DP_SPARK_ENV`` or the project's
        ``conf/envs/local.yaml``). The policy found also gives the (epsilon, delta) statement
        of the charge. When no budget can be found the error says which field to add."""
        builder, policy = self._with_budget(budget_policy, env)
        return plan_table(builder.spec(), group_size=group_size, budget_policy=policy)

    def _with_budget(self, budget_policy, env) -> tuple["ReleaseBuilder", Any]:
        """(the builder with its budget id filled in, the budget's policy or None)."""
        b = self._data.get("budget")
        if b is None:
            raise ConfigError("no charge: call charge(rho=...) or charge(epsilon=...) (field 'budget') "
                              "before plan() or publish()")
        if budget_policy is not None:
            builder = self.for_policies({budget_policy.budget_id: budget_policy})
            return builder, budget_policy
        try:
            policies = _env_policies(env)
        except ConfigError as exc:
            if b.get("id") is not None:
                return self, None  # the budget is named; only the (epsilon, delta) statement is missing
            raise ConfigError("charge(): no budget named and no budget policies to look it up in: name it "
                              "with charge(..., budget='ID') (field budget.id), or give plan(env=...) or "
                              f"plan(budget_policy=...) ({exc})") from None
        builder = self.for_policies(policies)
        return builder, policies.get(builder._data["budget"]["id"])

    def publish(self, engine, *, as_pandas: bool = False):
        """Publish through ``engine`` (its mode, ledger, governance); returns the release's
        cells as a Spark DataFrame (or pandas with ``as_pandas=True``). In official mode the
        spec must be pre-registered under the access policy's ``releases_dir``."""
        from dataclasses import replace

        spec = self.for_policies(engine.policies).spec()
        if engine.mode == "official":
            spec = replace(spec, source=str(_registered_path(spec, engine)))
        result = engine.publish(spec)
        if as_pandas:
            import pandas as pd

            return pd.DataFrame(list(result.rows))
        from pyspark.sql import functions as F

        return engine.spark.read.format("delta").load(result.table_path).where(
            F.col("release_id") == result.release_id)


def _env_policies(env) -> dict:
    """The budget policies ({id: BudgetPolicy}) of ``env``: an EnvConfig, an env file, or None
    for the env the CLI uses (``--env`` absent: ``$DP_SPARK_ENV``, else the project's
    ``conf/envs/local.yaml``). Raises ConfigError when there is none."""
    from dp_spark.ledger.policy import load_policies

    if env is None or isinstance(env, (str, Path)):
        from dp_spark.config import load_env
        from dp_spark.env_file import resolve_env

        env = load_env(resolve_env(None if env is None else str(env)))
    return load_policies(env.policies)


def _registered_path(spec, engine) -> Path:
    """The pre-registered spec file that this spec equals (by content hash)."""
    from dp_spark.config import load_release_spec
    from dp_spark.errors import DpSparkError

    rdir = getattr(engine.access, "releases_dir", None)
    if rdir is not None:
        for p in sorted(Path(rdir).glob("*.y*ml")):
            try:
                if load_release_spec(p).version() == spec.version():
                    return p
            except DpSparkError:
                continue
    raise ConfigError(f"official mode: no spec file under the releases directory {rdir} has this release's "
                      f"content (version {spec.version()}); pre-register it with builder.to_yaml(path) "
                      "or publish in exploration mode")


def _stream_plan_rows(spec, own, whole) -> list[dict[str, Any]]:
    """The plan of a stream (``stream: {horizon_days, start}``): per statistic its tree (one
    noise per node, the node vector's sensitivity), the error of the running total at the
    spec's last declared day, and ``stream_error``: the error at day 1, 30 and 365 of the
    horizon (those within it). Public parameters only."""
    from dp_spark.mechanisms import tree
    from dp_spark.statistics.stream import plan_stream

    sp = plan_stream(spec)
    profile = sp.error_profile()
    rows = []
    for stat, comps in zip(spec.statistics, sp.query.stat_components):
        part = sp.part_of(stat, comps)
        cal, unit = part.calibration, float(part.grid_unit)
        share = sp.query.fractions[sp.query.components.index(part.component)]
        rows.append({
            "statistic": stat.name, "kind": stat.kind, "components": [part.name],
            "share_of_charge": [str(share)], "mechanism": cal.mechanism,
            "sensitivity_l1": [str(Fraction(cal.sensitivity.l1) * part.grid_unit)],
            "sensitivity_l2": [cal.sensitivity.l2_squared ** 0.5 * unit],
            "noise_scale": [float(cal.scale) * unit], "group_size": None,
            "expected_abs_error": tree.point_expected_abs(sp.days, cal) * unit,
            "interval_half_width": tree.point_halfwidth(sp.days, cal, spec.confidence) * unit,
            "cells": spec.cells, "charge": spec.charge.to_json(), "share": str(share),
            "stream": {"horizon_days": sp.horizon, "start": spec.stream.start, "day": sp.days,
                       "tree_nodes": len(tree.tree_nodes(sp.horizon)), "levels": tree.levels(sp.horizon)},
            "stream_error": [{k: r[k] for k in ("day", "nodes", "stddev", "halfwidth")}
                             for r in profile if r["statistic"] == stat.name],
            **own(share), **whole,
        })
    return rows


def plan_table(spec, *, group_size: Optional[int] = None, budget_policy=None) -> list[dict[str, Any]]:
    """The plan of a multi-statistic spec as rows (one per statistic): what ``dp-spark plan``
    prints. Expected errors come from each kind's own post-processing at noiseless inputs of
    ``group_size`` rows (mean at the statistic's ``assumed_mean``, else the midpoint), so they
    are what the engine publishes in ``expected_abs_error`` for a cell of that size (with the
    spread at W / 2 around the midpoint, and values uniform over a quantile's bins).

    Each row's ``share`` is the statistic's own share of the charge (the sum of its
    components'; a component two statistics read, such as a mean's count, is one noisy value
    paid once and counted in both), and ``epsilon`` / ``delta`` the statement of that share
    alone (with a ``budget_policy``); ``release_epsilon`` / ``release_delta`` are the whole
    release's."""
    from dp_spark.accountant import Accountant
    from dp_spark.statistics.base import kind_of
    from dp_spark.statistics.plan import plan_query

    qp = plan_query(spec)
    measure = spec.charge.MEASURE
    delta = None if budget_policy is None else budget_policy.statement_delta
    acc = Accountant(measure, statement_delta=delta) if delta is not None else None
    statement = acc.statement(spec.charge) if acc is not None else None

    def own(share: Fraction) -> dict[str, Any]:  # the statement of one share of the charge
        if acc is None or spec.charge.MEASURE not in ("pure_dp", "zcdp"):
            return {"epsilon": None, "delta": None}
        part = (PureDP(epsilon=spec.charge.epsilon * share) if spec.charge.MEASURE == "pure_dp"
                else ZCDP(rho=spec.charge.rho * share))
        st = acc.statement(part)
        return {"epsilon": st.get("epsilon"), "delta": st.get("delta")}

    whole = {"release_epsilon": None if statement is None else statement.get("epsilon"),
             "release_delta": None if statement is None else statement.get("delta")}
    if spec.stream is not None:
        return _stream_plan_rows(spec, own, whole)
    rows = []
    rest = 1 - spec.selection_share if qp.selection is not None else Fraction(1)
    if qp.selection is not None:
        sel = qp.selection
        # private key selection: which keys get published, and how many units they need
        rows.append({
            "statistic": "key_selection", "kind": "private_keys", "components": list(sel.columns),
            "share_of_charge": [str(spec.selection_share)], "mechanism": f"{sel.mechanism} (thresholded)",
            "sensitivity_l1": [str(sel.sensitivity) if sel.mechanism == LAPLACE else None],
            "sensitivity_l2": [None if sel.mechanism == LAPLACE else float(sel.sensitivity) ** 0.5],
            "noise_scale": [float(sel.scale)],
            "epsilon_selection": None if sel.epsilon is None else float(sel.epsilon),
            # every selection the charge can pay for (both under zCDP), the chosen one included
            "selection_alternatives": [a.summary() for a in sel.alternatives],
            "delta_selection": float(sel.delta), "threshold_units": sel.threshold,
            "units_for_even_odds": sel.count_for(0.5), "units_for_95_percent": sel.count_for(0.95),
            "max_keys": list(sel.max_keys),
            "group_size": None, "expected_abs_error": None, "interval_half_width": None,
            "cells": spec.cells, "charge": spec.charge.to_json(), "share": str(spec.selection_share),
            **own(spec.selection_share), **whole,
        })
    for stat, comps in zip(spec.statistics, qp.stat_components):
        n = group_size or stat.option("assumed_group_size", 100)
        noisy: dict = {}
        for c in comps:
            if c.kind in ("rows", "units"):
                noisy[c] = Fraction(n)
            elif c.kind == "sum":
                m = stat.option("assumed_mean", c.clamp.midpoint)
                noisy[c] = Fraction(n) * m
            elif c.kind == "nsum":
                m = stat.option("assumed_mean", c.clamp.midpoint)
                noisy[c] = Fraction(n) * (m - c.clamp.midpoint)
            elif c.kind == "nsumsq":
                # an assumed spread of W / 2 around the midpoint: sum of x^2 - W^2/2 = -n W^2 / 4
                noisy[c] = -Fraction(n) * c.clamp.half_width ** 2 / 4
            elif c.kind == "hist":
                noisy[c] = [Fraction(n, c.bins)] * c.bins  # uniform over the bins
        plans = {c: qp.plan_of(c) for c in comps}
        out = kind_of(stat.kind).finish(stat, noisy, plans, 1 - spec.confidence)
        share = sum((qp.fractions[qp.components.index(c)] * rest for c in comps), Fraction(0))
        rows.append({
            "statistic": stat.name, "kind": stat.kind,
            "components": [c.name for c in comps],
            "share_of_charge": [str(qp.fractions[qp.components.index(c)] * rest) for c in comps],
            "mechanism": plans[comps[0]].mechanism,
            "sensitivity_l1": [str(plans[c].sensitivity.l1) for c in comps],
            "sensitivity_l2": [plans[c].sensitivity.l2 for c in comps],
            "noise_scale": [float(plans[c].scale * plans[c].grid_unit) for c in comps],
            "group_size": n, "expected_abs_error": out["expected_abs_error"],
            "interval_half_width": (out["ci_high"] - out["ci_low"]) / 2,
            "cells": spec.cells,
            "charge": spec.charge.to_json(),
            "share": str(share), **own(share), **whole,
        })
    return rows
