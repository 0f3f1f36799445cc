"""The plan of a stream release (``stream: {horizon_days, start}``): running totals through the
binary-tree mechanism (:mod:`dp_spark.mechanisms.tree`), one charge for the whole horizon.

::

    spec (dates start .. d, statistics count / sum / distinct_units)
      -> QueryPlan of the bounded pass (the partials per day: the daily increments)
      -> per component (rows, sum): its share of the charge (the release's split), the unit's
         contribution to the stream from the enforced bounds, the tree calibrated for the
         horizon, one NoiseEvent over the tree's nodes; all of them: one composed event
      -> [ledger: the noisy value of every node completed so far, each drawn and stored once]
      -> the cell of day d: the sum of the noisy values of the nodes of days 1 .. d

A unit's contribution to the stream (grid units), derived from the enforced bounds, never
typed: it touches at most L0 days (the engine keeps each unit's rows on its FIRST L0 days of
the stream, so a later day never changes which earlier days it counts on), each by at most the
per-cell sensitivity of the component with L0 = 1 (count: min(K, Linf); sum: that times
max(|lower|, |upper|)); "distinct units ever seen" counts each unit once, on its first day of
the stream (before the row cuts): one day, 1 (:func:`tree.distinct_units_contribution`). The total bound K is not used: a node is frozen when it completes and
the rows kept before and after need not be the same K rows.

Why noisy node values are stored, not only the noises: a node's value is fixed when it
completes. A rerun on a later snapshot (a late row for a past day) would otherwise add the
same noise to a changed value, and the difference of two published points would show the
change without noise.

Nothing here imports pyspark.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from datetime import date, timedelta
from fractions import Fraction
from typing import Any, Mapping

from dp_spark.core.budget import Budget, PureDP
from dp_spark.core.events import ComposedEvent, NoiseEvent
from dp_spark.errors import ConfigError, DpSparkError
from dp_spark.mechanisms import tree
from dp_spark.statistics.components import Component
from dp_spark.statistics.plan import QueryPlan, charge_share, true_vector

#: a budget to build a one-cell plan with (only its sensitivity is read)
_ANY_SHARE = (PureDP(Fraction(1)),)

__all__ = ["StreamPart", "StreamPlan", "plan_stream", "stream_id_for", "stream_contribution", "stream_days"]


def _grid_int(x: Fraction, what: str) -> int:
    if Fraction(x).denominator != 1:
        raise DpSparkError(f"internal: the {what} of a stream is not an integer on its grid")
    return int(x)


def stream_contribution(component, bounds, relation, days: int) -> tree.StreamContribution:
    """What one unit can do to the component's daily increments (grid units): at most
    min(L0, days) days, each by the component's sensitivity over ONE cell (module text)."""
    one_day = component.plan(replace(bounds, max_partitions_per_unit=1), relation, _ANY_SHARE[0], 1)
    return tree.StreamContribution(max_days=min(bounds.max_partitions_per_unit, days),
                                   per_day=_grid_int(one_day.sensitivity_grid.l1, "per-day sensitivity"))


def stream_id_for(spec, mode: str) -> str:
    """The stream's id: its declaration (the spec's canonical form with the date keys replaced by
    the stream block, so every day of it is the same stream) and the mode. Its ledger entry
    holds the one charge; its nodes are stored under it."""
    canon = dict(spec.canonical())
    canon.pop("group_by", None)
    canon.pop("name", None)  # a day's spec is named <name>_YYYYMMDD
    blob = json.dumps({"stream": canon, "mode": mode, "key_column": spec.key_columns[0]}, sort_keys=True,
                      separators=(",", ":"))
    return "stream-" + hashlib.sha256(blob.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class StreamPart:
    """One noisy component of the stream: its tree and its share of the charge."""

    component: Any
    share: Budget
    contribution: tree.StreamContribution
    calibration: tree.TreeCalibration

    @property
    def name(self) -> str:
        return self.component.name

    @property
    def grid_unit(self) -> Fraction:
        return Fraction(2) ** self.component.grid_exponent

    @property
    def event(self) -> NoiseEvent:
        cal = self.calibration
        touched = tree.levels(cal.horizon) * self.contribution.max_days
        common = dict(statistic=f"stream:{self.name}", scale=cal.scale, cells=len(tree.tree_nodes(cal.horizon)),
                      grid_exponent=self.component.grid_exponent, partitions_per_unit=touched)
        if cal.mechanism == tree.DISCRETE_LAPLACE:
            return NoiseEvent(mechanism=cal.mechanism, sensitivity=Fraction(cal.sensitivity.l1), **common)
        return NoiseEvent(mechanism=cal.mechanism, l2_squared=Fraction(cal.sensitivity.l2_squared), **common)


@dataclass(frozen=True)
class StreamPlan:
    """A stream release's plan: the bounded pass (``query``) and one tree per component."""

    query: QueryPlan
    parts: tuple  # StreamPart, in the order of query.components
    horizon: int
    start: date

    # what the engine and the bounded pass read of a plan
    @property
    def spec(self):
        return self.query.spec

    @property
    def components(self) -> tuple:
        return self.query.components

    @property
    def selection(self) -> None:
        return None

    @property
    def mean_split(self) -> None:
        return None

    @property
    def event(self) -> ComposedEvent:
        return ComposedEvent(children=tuple(p.event for p in self.parts))

    @property
    def events(self) -> tuple:
        return self.event.children

    def split_json(self) -> dict[str, str]:
        return {f"stream:{k}": v for k, v in self.query.split_json().items()}

    # the stream
    @property
    def band_points(self) -> int:
        """m: the points a simultaneous band covers together: every point of the whole horizon
        (its days x the statistics; a stream has one cell per day). Fixed by the declaration,
        never by the days published so far, so a point's band never changes between refreshes."""
        return self.horizon * len(self.spec.statistics)

    @property
    def days(self) -> int:
        """n: the days of this release (start .. its last date key)."""
        return len(self.spec.key_sets[0].values)

    def increments(self, part: StreamPart, partials: Mapping[int, Mapping[str, int]]) -> list[int]:
        """The component's exact daily increments (grid units), days 1 .. n."""
        return [int(v) for v in true_vector(part.component, partials, self.days).tolist()]

    def completed(self, part: StreamPart, partials: Mapping[int, Mapping[str, int]]) -> dict:
        """The true value of every node completed by day n."""
        return tree.node_values(self.increments(part, partials), self.horizon)

    def part_of(self, stat, comps) -> StreamPart:
        """The part whose running total the statistic publishes (count: rows; sum: the sum)."""
        want = {"sum": "sum", "distinct_units": "units"}.get(stat.kind, "rows")
        for p in self.parts:
            if p.component in comps and p.component.kind == want:
                return p
        raise DpSparkError("internal: a stream statistic without its component")

    def cells(self, noisy_nodes: Mapping[str, Mapping[tuple[int, int], int]]) -> list[dict[str, Any]]:
        """The cells of days 1 .. n (every date key of the release): per statistic, the running
        total through the day from the stored noisy nodes (``noisy_nodes``: component name ->
        node -> noisy value, grid units), its interval at the spec's confidence, its stddev and,
        with ``confidence: {simultaneous: true}``, its band (``band_low``, ``band_high``: all
        :attr:`band_points` points of the horizon inside their bands together with probability
        >= the confidence; :func:`tree.band_halfwidth`). A day's total, interval and band are
        the same in every release that holds it (the same stored nodes). Driver memory only."""
        spec = self.spec
        keys = spec.key_sets[0].values
        column = spec.key_sets[0].column
        out = []
        for stat, comps in zip(spec.statistics, self.query.stat_components):
            part = self.part_of(stat, comps)
            nodes = noisy_nodes[part.name]
            unit = part.grid_unit
            cal = part.calibration
            for t, key in enumerate(keys, start=1):
                total = sum(nodes[node] for node in tree.prefix_nodes(t, self.horizon))
                # the noise is an integer: |noise| <= h iff |noise| <= floor(h)
                h = int(tree.point_halfwidth(t, cal, spec.confidence))
                ends = [total, total - h, total + h]
                if spec.simultaneous:
                    hb = int(tree.band_halfwidth(t, cal, spec.confidence, self.band_points))
                    ends += [total - hb, total + hb]
                reals = [Fraction(v) * unit for v in ends]
                if stat.kind in ("count", "distinct_units"):  # a running count is never negative (post-processing:
                    reals = [max(v, Fraction(0)) for v in reals]  # a true total >= 0 stays inside)
                value, lo, hi = reals[:3]
                cell = {"statistic": stat.name, "key": key, "keys": {column: key},
                        "value": float(value), "ci_low": float(lo), "ci_high": float(hi),
                        "mechanism": cal.mechanism, "noise_scale": float(cal.scale * unit),
                        "noise_stddev": tree.point_variance(t, cal) ** 0.5 * float(unit), "grid": float(unit),
                        "expected_abs_error": tree.point_expected_abs(t, cal) * float(unit)}
                if spec.simultaneous:
                    cell["band_low"], cell["band_high"] = float(reals[3]), float(reals[4])
                out.append(cell)
        return out

    def error_profile(self) -> list[dict[str, Any]]:
        """Per statistic: the error at day 1, 30 and 365 of the horizon (real units)."""
        out = []
        for stat, comps in zip(self.spec.statistics, self.query.stat_components):
            part = self.part_of(stat, comps)
            for row in tree.error_profile(part.calibration, self.spec.confidence,
                                          grid_exponent=part.component.grid_exponent):
                out.append({"statistic": stat.name, **row})
        return out


def plan_stream(spec) -> StreamPlan:
    """The stream's plan (no data read). Refuses a spec without ``stream``.

    Components: a ``count`` reads the rows, a ``sum`` the plain clamped sum, ``distinct_units``
    the units counted on their first day (one tree each;
    statistics that read the same component share it). Split: ``weight`` when given, else equal
    shares per statistic; a shared component receives the sum of its statistics' shares."""
    if spec.stream is None:
        raise ConfigError(f"{spec.source}: not a stream release")
    comps: list = []
    per_stat = []
    for stat in spec.statistics:
        if stat.kind == "count":
            c = Component("rows")
        elif stat.kind == "sum":
            c = Component("sum", clamp=stat.clamp)
        elif stat.kind == "distinct_units":  # units ever seen, each on its first day
            c = Component("units")
        else:
            raise ConfigError(f"{spec.source}: a stream publishes running totals of counts, sums and distinct units only")
        per_stat.append((c,))
        if c not in comps:
            comps.append(c)
    weights = [Fraction(s.weight) if s.weight is not None else Fraction(1) for s in spec.statistics]
    share_of = {c: Fraction(0) for c in comps}
    for w, (c,) in zip(weights, per_stat):
        share_of[c] += w / sum(weights)
    fractions = tuple(share_of[c] for c in comps)
    cells = spec.cells
    plans = tuple(c.plan(spec.bounds, spec.neighbouring, charge_share(spec.charge, f), cells)
                  for c, f in zip(comps, fractions))
    query = QueryPlan(spec=spec, components=tuple(comps), fractions=fractions, statistics=plans,
                      stat_components=tuple(per_stat))
    horizon = spec.stream.horizon_days
    parts = []
    for comp, frac in zip(comps, fractions):
        share = charge_share(spec.charge, frac)
        contribution = (tree.distinct_units_contribution() if comp.kind == "units"
                        else stream_contribution(comp, spec.bounds, spec.neighbouring, horizon))
        parts.append(StreamPart(component=comp, share=share, contribution=contribution,
                                calibration=tree.calibrate(horizon, contribution, share)))
    return StreamPlan(query=query, parts=tuple(parts), horizon=horizon,
                      start=date.fromisoformat(spec.stream.start))


def stream_days(spec, last: date) -> tuple[str, ...]:
    """The date keys of a stream's release for day ``last``: start .. last."""
    start = date.fromisoformat(spec.stream.start)
    return tuple((start + timedelta(days=i)).isoformat() for i in range((last - start).days + 1))
