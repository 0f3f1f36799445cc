"""What ``dp-spark chart`` draws, computed from published rows only (pure: no pyspark, no plotting).

For each statistic of a family's series (the rows ``dp-spark show`` reads: one per key and
statistic), :func:`series_chart_data` returns the points (value, pointwise interval, the
simultaneous band when the release has one), a flag on each point whose interval is wider
than the value (half-width >= |value|: the value says nothing at this budget), and the
changes between consecutive points with an interval for the whole family of changes at once:
a change is *significant* when its family-wise interval excludes 0, so that the chance of
marking any change of the chart that is not there is at most 1 - confidence.

How the changes' intervals are built (:attr:`SeriesChart.change_method`):

* ``exact``: every cell is one noise of its mechanism (a count, a distinct count, a sum:
  :func:`dp_spark.evaluation.utility.single_noise_cell`). A change's noise is the difference
  of two independent noises; its interval is from that difference's exact law
  (:func:`dp_spark.evaluation.utility.change_halfwidth`) at 1 - alpha/(m - 1) for the m - 1
  changes (Bonferroni: consecutive changes share a cell, :func:`utility.trend_differences`).
* ``bands``: other kinds (a mean, a quantile, a variance: several noises, and the bounding
  error in their intervals; a stream's running totals, which share noises), when every point
  is from ONE release with a simultaneous band, or from one stream (its band covers every
  point of its horizon, whichever refresh wrote it): all points are inside their bands
  together with probability >= confidence, so a change is significant when the two bands do
  not overlap (conservative).
* ``none``: neither holds (no band, or points from several releases whose bands each cover
  only their own release): no change is marked, and the chart says so.

The band of a series of single-noise cells whose releases stored none (a spec without
``simultaneous: true``, such as the shipped DAU / WAU / MAU series) is computed here
(:func:`computed_band`): every point's noise is one independent draw (its own cell, in its own
release or not), so each point's exact interval at the Sidak level 1 - (1 - confidence)^(1/m)
covers all m points together with probability >= confidence: the band the release would have
stored, from public noise parameters only (``band_rule`` "Sidak, computed").

Nothing here reads data or draws noise: post-processing of published values.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Optional, Sequence

__all__ = ["USELESS_RELATIVE_ERROR", "ZOOM_MARGIN", "ChartPoint", "ChartChange", "SeriesChart",
           "computed_band", "series_chart_data", "wider_than_value", "zoom_range"]

#: A relative error (interval half-width, or expected error, over the value) at or above this
#: says nothing about the value: the interval is at least as wide as the value itself.
USELESS_RELATIVE_ERROR = 1.0


#: room around the data and its intervals, as a share of their span, when an axis is zoomed
ZOOM_MARGIN = 0.12


def zoom_range(low: Iterable[float], high: Iterable[float]) -> Optional[tuple[float, float]]:
    """The y range of a chart zoomed to the data and its intervals (``low``..``high``) with a
    margin of :data:`ZOOM_MARGIN` of their span, so that the trend and its bands fill the chart
    (an axis from 0 would flatten them); never below 0 for data that is not. None when nothing
    is finite."""
    finite_lo = [v for v in low if v is not None and math.isfinite(v)]
    finite_hi = [v for v in high if v is not None and math.isfinite(v)]
    if not finite_lo or not finite_hi:
        return None
    lo, hi = min(finite_lo), max(finite_hi)
    span = hi - lo if hi > lo else max(abs(hi) * 0.05, 1.0)
    bottom, top = lo - ZOOM_MARGIN * span, hi + ZOOM_MARGIN * span
    if lo >= 0:
        bottom = max(bottom, 0.0)
    return bottom, top


@dataclass(frozen=True)
class ChartPoint:
    key: str
    value: float
    ci_low: float
    ci_high: float
    band_low: Optional[float]
    band_high: Optional[float]
    wide: bool  # the pointwise interval's half-width >= |value|
    release_id: Optional[str] = None


@dataclass(frozen=True)
class ChartChange:
    key: str
    previous_key: str
    change: float
    low: float
    high: float
    significant: bool


#: what a band's points are taken together over, by its rule: a stream's stored band (Bonferroni
#: over its horizon), a band computed for the chart's points (Sidak), a release's stored band
_BAND_SCOPE = {"Bonferroni": "stream", "Sidak, computed": "chart"}


@dataclass(frozen=True)
class SeriesChart:
    statistic: str
    points: tuple[ChartPoint, ...]
    changes: tuple[ChartChange, ...]
    confidence: Optional[float]
    simultaneous: bool  # every point has a band
    releases: int  # distinct release ids among the points (a stream's points: one, its band covers them all)
    change_method: str  # exact | bands | none
    suppressed: int = 0  # cells withheld by min_group_size (not drawn)
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: how the band covers the points together: "Sidak" (a release's independent cells),
    #: "Sidak, computed" (no stored band: computed from the noise parameters, over the chart's
    #: independent single-noise points) or "Bonferroni" (a stream's points, over its horizon)
    band_rule: str = "Sidak"

    @property
    def significant(self) -> tuple[ChartChange, ...]:
        return tuple(c for c in self.changes if c.significant)

    @property
    def wide(self) -> tuple[ChartPoint, ...]:
        return tuple(p for p in self.points if p.wide)

    def y_range(self) -> Optional[tuple[float, float]]:
        """:func:`zoom_range` over the values, intervals and bands."""
        ps = self.points
        lows = [p.ci_low for p in ps] + [p.value for p in ps] + [p.band_low for p in ps if p.band_low is not None]
        highs = [p.ci_high for p in ps] + [p.value for p in ps] + [p.band_high for p in ps if p.band_high is not None]
        return zoom_range(lows, highs)

    def legend(self) -> dict[str, str]:
        """The labels of what is drawn (the same words in the PNG and the HTML)."""
        level = f"{self.confidence:.0%}" if self.confidence is not None else "?"
        return {
            "value": "DP estimate",
            "interval": f"{level} interval of each point alone",
            "band": f"{level} band: all points of the {_BAND_SCOPE.get(self.band_rule, 'release')} together",
            "up": f"increase, significant over all changes at {level}",
            "down": f"decrease, significant over all changes at {level}",
            "wide": "interval wider than the value: says nothing",
        }


def _num(x: Any) -> Optional[float]:
    if x is None:
        return None
    v = float(x)
    return v if math.isfinite(v) else None


def wider_than_value(value: float, low: float, high: float) -> bool:
    """The interval's half-width is at least the value's magnitude (relative error >= 100%)."""
    return (high - low) / 2 >= USELESS_RELATIVE_ERROR * abs(value)


def _changes_from_bands(points: Sequence[ChartPoint]) -> list[ChartChange]:
    out = []
    for prev, cur in zip(points[:-1], points[1:]):
        lo = cur.band_low - prev.band_high  # type: ignore[operator]
        hi = cur.band_high - prev.band_low  # type: ignore[operator]
        out.append(ChartChange(key=cur.key, previous_key=prev.key, change=cur.value - prev.value,
                               low=lo, high=hi, significant=lo > 0 or hi < 0))
    return out


def _band_group(row: Mapping[str, Any]) -> Any:
    """What a point's band covers together with: its release, or, for a running total of a
    stream (its charge_json names the stream), the whole stream: a stream's band covers every
    point of its horizon, whichever release wrote it (docs/accuracy.md, section 7)."""
    try:
        stream = json.loads(row.get("charge_json") or "{}").get("stream")
    except (TypeError, ValueError, AttributeError):
        stream = None
    if isinstance(stream, dict) and stream.get("stream_id"):
        return ("stream", stream["stream_id"])
    return row.get("release_id")


def computed_band(row: Mapping[str, Any], confidence: float, points: int) -> tuple[float, float]:
    """The simultaneous band of a published single-noise cell (a count, a distinct count, a
    sum: :func:`dp_spark.evaluation.utility.single_noise_cell`) among ``points`` such cells
    with independent noises: its exact interval at the Sidak level 1 - (1 - confidence)^(1/m),
    computed from its public noise parameters: value -/+ that half-width, or the pointwise
    interval widened at each end by the two levels' half-widths' difference if that is wider;
    where the release clamped the interval at 0 (a count: every truth is >= 0) the lower end
    stays 0 and the upper end is widened by that difference (and one grid step). Never narrower
    than the band the release would have stored; where a count's band would reach below 0 the
    release cuts it at 0 and this does not (the kind is not in the row): wider, never narrower."""
    from dp_spark.evaluation.utility import single_noise_halfwidth
    from dp_spark.statistics.noise import joint_alpha

    alpha = 1.0 - float(confidence)
    h_point = single_noise_halfwidth(row, alpha)
    h_band = single_noise_halfwidth(row, joint_alpha(alpha, max(1, points)))
    v, lo, hi = float(row["value"]), float(row["ci_low"]), float(row["ci_high"])
    tol = 1e-9 * (abs(v) + h_point) + float(row.get("grid") or 0.0)
    clamped = lo == 0.0 and v - h_point < -tol  # the release's interval was cut at 0
    widen = max(0.0, h_band - h_point)
    if clamped:
        # v~ (before the clamp) <= hi - h_point, so v~ + h_band <= hi + widen; one grid step
        # of slack for a Laplace scale read back from the row (rounded up)
        return lo, hi + widen + float(row.get("grid") or 0.0)
    return min(lo - widen, v - h_band), max(hi + widen, v + h_band)


def _series(statistic: str, rows: list[Mapping[str, Any]]) -> SeriesChart:
    from dp_spark.evaluation.utility import single_noise_cell, trend_differences

    live = [r for r in rows if not r.get("suppressed") and _num(r.get("value")) is not None]
    live.sort(key=lambda r: str(r["key"]))
    points = []
    for r in live:
        v, lo, hi = float(r["value"]), float(r["ci_low"]), float(r["ci_high"])
        points.append(ChartPoint(key=str(r["key"]), value=v, ci_low=lo, ci_high=hi,
                                 band_low=_num(r.get("band_low")), band_high=_num(r.get("band_high")),
                                 wide=wider_than_value(v, lo, hi), release_id=r.get("release_id")))
    confs = {float(r["confidence"]) for r in live if r.get("confidence") is not None}
    confidence = min(confs) if confs else None
    simultaneous = bool(points) and all(p.band_low is not None and p.band_high is not None for p in points)
    groups = {_band_group(r) for r in live}
    releases = len(groups)
    band_rule = "Bonferroni" if groups and all(isinstance(g, tuple) for g in groups) else "Sidak"
    notes: list[str] = []
    single = bool(live) and all(single_noise_cell(r) for r in live)  # every point one noise
    if not any(p.band_low is not None for p in points) and confidence is not None and single:
        # no stored band: single independent noises, the Sidak band over this chart's points
        bands = [computed_band(r, confidence, len(points)) for r in live]
        points = [replace(p, band_low=b[0], band_high=b[1]) for p, b in zip(points, bands)]
        simultaneous, releases, band_rule = True, 1, "Sidak, computed"
        notes.append("the band is computed from the published noise parameters: every point is one "
                     "independent noise, so all points are inside their bands together")
    if len(confs) > 1:
        notes.append("the points' releases have different confidence levels: the lowest is used")
    changes: list[ChartChange] = []
    method = "none"
    if len(points) >= 2 and confidence is not None:
        if single:
            method = "exact"
            diffs = trend_differences(live, statistic=statistic, confidence=confidence, simultaneous=True)
            changes = [ChartChange(key=d["key"], previous_key=d["previous_key"], change=d["value"],
                                   low=d["ci_low"], high=d["ci_high"],
                                   significant=d["ci_low"] > 0 or d["ci_high"] < 0) for d in diffs]
        elif simultaneous and releases == 1:
            method = "bands"
            changes = _changes_from_bands(points)
        else:
            notes.append("no change is marked: this statistic's cells combine several noises, and its points "
                         + ("come from several releases" if simultaneous else "have no simultaneous band"))
    if simultaneous and releases > 1:
        notes.append(f"the points come from {releases} releases: each release's band covers its own cells "
                     "together, not the whole chart")
    return SeriesChart(statistic=statistic, points=tuple(points), changes=tuple(changes), confidence=confidence,
                       simultaneous=simultaneous, releases=releases, change_method=method, band_rule=band_rule,
                       suppressed=len(rows) - len(live), notes=tuple(notes))


def series_chart_data(rows: Iterable[Mapping[str, Any]], *, statistics: Optional[Sequence[str]] = None
                      ) -> list[SeriesChart]:
    """One :class:`SeriesChart` per statistic of ``rows`` (published release rows: ``key``,
    ``statistic``, ``value``, ``ci_low``, ``ci_high``, ``confidence``, ``band_low``,
    ``band_high``, the noise fields), in the order given by ``statistics`` (default: sorted)."""
    by: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        by.setdefault(str(r["statistic"]), []).append(r)
    names = list(statistics) if statistics is not None else sorted(by)
    return [_series(n, by.get(n, [])) for n in names]
