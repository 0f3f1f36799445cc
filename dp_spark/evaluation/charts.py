"""Charts a person can read: the DAU trend with interval bands, the AOV per region with error
bars, and the epsilon explorer's relative error against the budget.

Every chart has a title, axis labels with units, and a caption that states the privacy charge
(epsilon or rho, and the (epsilon, delta) statement when there is one), the window of dates or
the keys it covers, and the confidence of the intervals. The figures are built by ``build_*``
helpers that return the matplotlib :class:`~matplotlib.figure.Figure` (tests inspect them); the
``*_chart`` functions save a PNG and return its path.

Input rows are release rows (``ReleaseResult.rows`` or rows read from a Delta release table) or
the cell dicts of :meth:`dp_spark.statistics.plan.QueryPlan.noise`: dicts with at least ``statistic``,
``key``, ``value``, ``ci_low`` and ``ci_high``. Only published (noisy) values belong here.

Figures are drawn on an explicit Agg canvas (no display needed on a cluster driver), without
pyplot and without changing the process-wide backend (a notebook's inline backend is untouched).
Nothing here imports pyspark.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from dp_spark.evaluation.chart_data import (USELESS_RELATIVE_ERROR, ZOOM_MARGIN, SeriesChart, series_chart_data,
                                            zoom_range)

__all__ = [
    "release_caption",
    "key_range",
    "build_dau_figure",
    "dau_trend_chart",
    "build_aov_figure",
    "aov_chart",
    "build_explorer_figure",
    "explorer_chart",
    "epsilon_at_delta",
    "USELESS_RELATIVE_ERROR",
    "ZOOM_MARGIN",
    "build_series_figure",
    "series_html",
    "series_chart",
]

_CAPTION_WRAP = 110


def _select(rows: Iterable[Mapping[str, Any]], statistic: str) -> list[Mapping[str, Any]]:
    picked = [r for r in rows if r.get("statistic") == statistic]
    if not picked:
        raise ValueError(f"no rows with statistic {statistic!r} to chart")
    return sorted(picked, key=lambda r: str(r["key"]))


def _fmt(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def _is_iso_date(text: str) -> bool:
    from datetime import date

    try:
        date.fromisoformat(text)
        return True
    except ValueError:
        return False


def key_range(keys: Iterable[Any]) -> str:
    """The keys of a chart in words: ``window: 2026-11-01 .. 2026-11-30 (30 days)`` when they
    are dates, else ``keys: region_01 .. region_20 (20 keys)`` (a single key: itself)."""
    ks = sorted({str(k) for k in keys})
    if not ks:
        return "keys: none"
    if all(_is_iso_date(k) for k in ks):
        return f"window: {ks[0]}" if len(ks) == 1 else f"window: {ks[0]} .. {ks[-1]} ({len(ks)} days)"
    return f"key: {ks[0]}" if len(ks) == 1 else f"keys: {ks[0]} .. {ks[-1]} ({len(ks)} keys)"


def release_caption(rows: Sequence[Mapping[str, Any]], *, statistic: Optional[str] = None,
                    window: Optional[str] = None) -> str:
    """A caption from the release metadata of ``rows``: charge, statement, keys, confidence.

    The keys are a ``window`` of dates, or the ``keys`` of another column (:func:`key_range`);
    ``window`` overrides the date range (e.g. ``"2026-11-01 .. 2026-11-30 (30 days)"``).
    """
    rows = [r for r in rows if statistic is None or r.get("statistic") == statistic] or list(rows)
    if not rows:
        return ""
    first = rows[0]
    parts: list[str] = []
    if first.get("charge_epsilon") is not None:
        parts.append(f"pure DP, epsilon = {_fmt(first['charge_epsilon'])}")
    elif first.get("charge_rho") is not None:
        st = ""
        if first.get("statement_epsilon") is not None:
            st = (f" (=> epsilon = {_fmt(first['statement_epsilon'])}, "
                  f"delta = {_fmt(first.get('statement_delta'))})")
        parts.append(f"zCDP, rho = {_fmt(first['charge_rho'])}{st}")
    if first.get("privacy_unit"):
        parts.append(f"unit: {first['privacy_unit']} ({first.get('neighbouring', '?')})")
    parts.append(key_range(r["key"] for r in rows) if window is None else f"window: {window}")
    if first.get("confidence") is not None:
        parts.append(f"{float(first['confidence']):.0%} intervals")
    if first.get("mode") == "exploration":
        parts.append("EXPLORATION - not publishable")
    return "; ".join(parts)


def _wrap(text: str) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, _CAPTION_WRAP)) if text else ""


def _new_figure(width: float, height: float) -> Figure:
    # Figure() on its own Agg canvas (not pyplot): no global state, nothing to close.
    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: str | os.PathLike) -> str:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, format="png")
    return str(p)


# --------------------------------------------------------------------------------------
# DAU trend
# --------------------------------------------------------------------------------------
def build_dau_figure(rows: Sequence[Mapping[str, Any]], caption: str = "", *,
                     statistic: str = "distinct_units", title: Optional[str] = None) -> Figure:
    """Line of the noisy DAU per date with the interval as a shaded band.

    One line (the DP estimate) and one band (``fill_between``) per figure. The y axis is
    zoomed to the values and their intervals (a margin of :data:`ZOOM_MARGIN` of their span),
    so that the day-to-day trend and the band are visible; when it does not start at 0 the
    chart says so.
    """
    from datetime import date

    cells = _select(rows, statistic)
    try:
        xs: list[Any] = [date.fromisoformat(str(r["key"])) for r in cells]
        is_date = True
    except ValueError:
        xs, is_date = [str(r["key"]) for r in cells], False
    ys = [float(r["value"]) for r in cells]
    lo = [float(r["ci_low"]) for r in cells]
    hi = [float(r["ci_high"]) for r in cells]
    conf = cells[0].get("confidence")
    conf_txt = f"{float(conf):.0%} interval" if conf is not None else "interval"

    fig = _new_figure(10, 4.8)
    ax = fig.add_subplot(1, 1, 1)
    ax.fill_between(xs, lo, hi, alpha=0.25, color="tab:blue", linewidth=0, label=conf_txt)
    ax.plot(xs, ys, marker="o", markersize=3, color="tab:blue", label="DP estimate")
    ax.set_title(title or "Daily active users (differentially private)")
    ax.set_xlabel("date (UTC)" if is_date else "key")
    ax.set_ylabel("distinct users per day")
    bottom = _zoom_to(ax, lo + ys, hi + ys)
    if bottom > 0:  # say so: a reader may assume an axis starts at 0
        ax.text(0.99, 0.02, f"y axis starts at {bottom:,.0f}, not 0", transform=ax.transAxes,
                ha="right", va="bottom", fontsize=7, color="0.35")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best")
    if is_date:
        fig.autofmt_xdate()
    if caption:
        fig.supxlabel(_wrap(caption), fontsize=8)
    return fig


def _zoom_to(ax, low: Sequence[float], high: Sequence[float]) -> float:
    """Zoom the y axis to the data and its intervals (:func:`~dp_spark.evaluation.chart_data.zoom_range`).
    Returns the bottom of the axis."""
    rng = zoom_range(low, high)
    if rng is None:
        return 0.0
    ax.set_ylim(*rng)
    return rng[0]


def dau_trend_chart(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike, caption: str = "",
                    **kwargs: Any) -> str:
    """Write the DAU trend PNG to ``path``; returns the path."""
    return _save(build_dau_figure(rows, caption, **kwargs), path)


# --------------------------------------------------------------------------------------
# AOV per region
# --------------------------------------------------------------------------------------
def build_aov_figure(rows: Sequence[Mapping[str, Any]], caption: str = "", *, statistic: str = "mean",
                     value_unit: str = "currency units", title: Optional[str] = None) -> Figure:
    """One bar per region (the noisy mean) with asymmetric error bars from the interval."""
    cells = _select(rows, statistic)
    keys = [str(r["key"]) for r in cells]
    ys = [float(r["value"]) for r in cells]
    lower_err = [max(y - float(r["ci_low"]), 0.0) for y, r in zip(ys, cells)]
    upper_err = [max(float(r["ci_high"]) - y, 0.0) for y, r in zip(ys, cells)]
    conf = cells[0].get("confidence")

    fig = _new_figure(max(6.0, 0.45 * len(keys) + 2), 4.8)
    ax = fig.add_subplot(1, 1, 1)
    ax.bar(range(len(keys)), ys, yerr=[lower_err, upper_err], capsize=3, color="tab:orange",
           edgecolor="black", linewidth=0.4, label="DP estimate")
    ax.set_xticks(range(len(keys)), keys, rotation=60, ha="right", fontsize=8)
    ax.set_title(title or "Average order value per region (differentially private)")
    ax.set_xlabel("region")
    ax.set_ylabel(f"mean order value ({value_unit})")
    ax.grid(True, axis="y", alpha=0.3)
    ax.text(0.99, 0.98, f"error bars: {float(conf):.0%} intervals" if conf is not None else "error bars: intervals",
            transform=ax.transAxes, ha="right", va="top", fontsize=8)
    # groups too small for the interval to say anything: half-width >= the value itself
    useless = [i for i, (y, r) in enumerate(zip(ys, cells))
               if (float(r["ci_high"]) - float(r["ci_low"])) / 2 >= USELESS_RELATIVE_ERROR * abs(y)]
    for i in useless:
        ax.patches[i].set_hatch("//")
        ax.patches[i].set_alpha(0.45)
    if useless:
        top = max(max(float(r["ci_high"]) for r in cells), max(ys))
        ax.set_ylim(top=top * 1.3 if top > 0 else None)  # room for the note above the bars
        names = ", ".join(keys[i] for i in useless[:4]) + (f" and {len(useless) - 4} more" if len(useless) > 4 else "")
        ax.text(0.01, 0.98, f"hatched ({names}): the interval is wider than the value (relative error >= 100%);\n"
                "the group is too small for this budget, its value says nothing",
                transform=ax.transAxes, ha="left", va="top", fontsize=8, color="tab:red",
                bbox={"boxstyle": "round", "fc": "white", "ec": "tab:red", "alpha": 0.9})
    if caption:
        fig.supxlabel(_wrap(caption), fontsize=8)
    return fig


def aov_chart(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike, caption: str = "",
              **kwargs: Any) -> str:
    """Write the AOV-per-region PNG to ``path``; returns the path."""
    return _save(build_aov_figure(rows, caption, **kwargs), path)


# --------------------------------------------------------------------------------------
# Epsilon explorer
# --------------------------------------------------------------------------------------


def _nice_budget_ticks(budgets: Sequence[float]) -> list[float]:
    """Major ticks of the budget axis: the explored budgets when they are few, else 1-2-5 steps."""
    bs = sorted({b for b in budgets if b > 0})
    if 3 <= len(bs) <= 8:
        return bs
    lo, hi = (bs[0], bs[-1]) if bs else (0.1, 1.0)
    ticks = [m * 10.0 ** e for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
             for m in (1, 2, 5)]
    inside = [x for x in ticks if lo / 1.0001 <= x <= hi * 1.0001]
    return inside if len(inside) >= 3 else sorted(set(bs) | {lo, math.sqrt(lo * hi), hi})


def _tick_label(x: float) -> str:
    return f"{x:.3g}"


def _pct(x: float) -> str:
    return f"{x:.0%}" if x >= 0.01 else f"{100 * x:.3g}%"


def epsilon_at_delta(rho: float, delta: float) -> float:
    """The epsilon of the (epsilon, delta) statement of a rho-zCDP charge (OpenDP's conversion,
    the one the engine publishes)."""
    from fractions import Fraction

    from dp_spark.mechanisms.calibration import zcdp_to_approx_epsilon

    return float(zcdp_to_approx_epsilon(Fraction(rho).limit_denominator(10**12) or Fraction(rho),
                                        Fraction(delta).limit_denominator(10**15) or Fraction(delta)))


def _rho_to_epsilon_functions(lo: float, hi: float, delta: float):
    """Monotone rho -> epsilon (and back) for a secondary axis: the exact conversion on a
    log grid, interpolated in log-log (matplotlib calls these on arrays)."""
    import numpy as np

    grid = np.geomspace(lo / 20, hi * 20, 64)
    eps = np.array([epsilon_at_delta(float(r), delta) for r in grid])
    lg, le = np.log(grid), np.log(eps)

    def forward(x):
        x = np.asarray(x, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.exp(np.interp(np.log(np.clip(x, 1e-300, None)), lg, le))

    def inverse(y):
        y = np.asarray(y, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.exp(np.interp(np.log(np.clip(y, 1e-300, None)), le, lg))

    return forward, inverse


_ABSOLUTE = {"rel_halfwidth": "halfwidth", "expected_rel_error": "expected_abs_error"}


def build_explorer_figure(rows: Sequence[Mapping[str, Any]], caption: str = "", *,
                          statistic: Union[str, Sequence[str], None] = None, target: Optional[float] = None,
                          error_column: str = "expected_rel_error", configured: Optional[float] = None,
                          delta: Optional[float] = None) -> Figure:
    """Relative error against the budget, one line per assumed group size (log-log axes).

    ``rows`` are :func:`dp_spark.evaluation.explorer.explore` rows. ``statistic`` picks the
    statistic to draw (default: the spec's headline statistic, the last one of the rows); a
    list of names draws one panel per statistic (a multi-statistic spec: every statistic it
    publishes, the legend shared above the panels). ``target`` draws the stated error target
    as a horizontal line; ``configured`` marks the spec's charge (a vertical line, and a point
    on each group's line); ``delta`` (the budget's ``statement_delta``) adds, for a zCDP spec,
    the epsilon of the (epsilon, delta) statement on a second x axis above the rho axis.

    The budget axis has a labelled tick at each explored budget (or 1-2-5 steps when there are
    many), the error axis percent labels. A group whose relative error is 100% or more (at the
    configured charge, else at the largest budget drawn) gets a note on the chart: its
    interval is wider than the value itself, so the release says nothing about that group at
    that budget; the band above 100% is shaded. A point whose interval reaches the
    statistic's range (``clipped``: a mean's clamp bounds, 0 for a count) is drawn hollow: the
    interval is cut there, not the noise. A statistic whose assumed true value is 0 (a
    variance or standard deviation, where relative errors are infinite) is drawn in absolute
    error, in the value's units.
    """
    if not rows:
        raise ValueError("no explorer rows to chart")
    if statistic is None:
        stats = [rows[-1]["statistic"]]
    elif isinstance(statistic, str):
        stats = [statistic]
    else:
        stats = list(dict.fromkeys(statistic))
    for stat in stats:
        if not any(r["statistic"] == stat for r in rows):
            raise ValueError(f"no explorer rows for statistic {stat!r}")
    if len(stats) == 1:
        fig = _new_figure(11, 5.6)
        _explorer_axes(fig.add_subplot(1, 1, 1), rows, stats[0], target=target, error_column=error_column,
                       configured=configured, delta=delta, legend=True, small=False)
    else:
        ncols = 2
        nrows = math.ceil(len(stats) / ncols)
        fig = _new_figure(14, 0.6 + 4.4 * nrows)
        axes = [fig.add_subplot(nrows, ncols, i + 1) for i in range(len(stats))]
        for ax, stat in zip(axes, stats):
            _explorer_axes(ax, rows, stat, target=target, error_column=error_column, configured=configured,
                           delta=delta, legend=False, small=True)
        handles, labels = {}, []
        for ax in axes:  # one legend for every panel: the same group sizes, target and charge
            for h, lbl in zip(*ax.get_legend_handles_labels()):
                if lbl not in handles:
                    handles[lbl] = h
                    labels.append(lbl)
        what = _ERROR_NAMES.get(error_column, error_column.replace("_", " "))
        measure = rows[0]["measure"]
        title = (f"{rows[0].get('release', '')}: {what} vs {'epsilon' if measure == 'pure_dp' else 'rho'}, "
                 "per statistic").strip(": ")
        # the figure's title heads its legend (a suptitle and an outside legend would overlap)
        fig.legend([handles[lbl] for lbl in labels], labels, loc="outside upper center", ncols=3, fontsize=8,
                   title=title, title_fontsize=12, frameon=False)
    if caption:
        fig.supxlabel(_wrap(caption), fontsize=8)
    return fig


_ERROR_NAMES = {"expected_rel_error": "expected relative error",
                "rel_halfwidth": "relative half-width of the interval",
                "expected_abs_error": "expected absolute error",
                "halfwidth": "interval half-width"}


def _explorer_axes(ax, rows: Sequence[Mapping[str, Any]], stat: str, *, target: Optional[float],
                   error_column: str, configured: Optional[float], delta: Optional[float],
                   legend: bool, small: bool) -> None:
    """One statistic's explorer chart on ``ax`` (see :func:`build_explorer_figure`)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter

    picked = [r for r in rows if r["statistic"] == stat]
    measure = picked[0]["measure"]
    budget_name = "epsilon" if measure == "pure_dp" else "rho"
    sizes = sorted({int(r["group_size"]) for r in picked})
    budgets = sorted({float(r["budget"]) for r in picked})
    # relative errors need a non-zero true value: else the absolute error, in the value's units
    relative = any(math.isfinite(float(r.get(error_column, math.inf))) and float(r.get(error_column, 0)) > 0
                   for r in picked) or error_column not in _ABSOLUTE
    column = error_column if relative else _ABSOLUTE[error_column]
    note_size = 7 if small else 8

    ax.set_xscale("log")
    ax.set_yscale("log")
    series: dict[int, list[tuple[float, float]]] = {}
    colors: dict[int, Any] = {}
    for i, n in enumerate(sizes):
        drawn = sorted((float(r["budget"]), float(r[column]), bool(r.get("clipped"))) for r in picked
                       if int(r["group_size"]) == n)
        drawn = [(b, e, c) for b, e, c in drawn if math.isfinite(e) and e > 0]
        colors[n] = f"C{i % 10}"  # by group size: the same colour in every panel
        if drawn:
            ax.plot([b for b, _, _ in drawn], [e for _, e, _ in drawn], marker="o", color=colors[n],
                    label=f"group size {n:,}")
            hollow = [(b, e) for b, e, c in drawn if c]
            if hollow:  # the interval reached the statistic's range: it is cut there
                ax.plot([b for b, _ in hollow], [e for _, e in hollow], marker="o", linestyle="none", color=colors[n],
                        markerfacecolor="white", markeredgecolor=colors[n], zorder=4)
            series[n] = [(b, e) for b, e, _ in drawn]
    if any(r.get("clipped") for r in picked):
        ax.plot([], [], marker="o", linestyle="none", markerfacecolor="white", markeredgecolor="0.3",
                label="hollow: interval cut at the statistic's range")
    shown_target: list[float] = [target] if target is not None and relative else []
    for t in shown_target:
        ax.axhline(t, color="black", linestyle="--", linewidth=1, label=f"target {t:.1%}")

    # the configured charge: a vertical line and the error each group gets there
    def at(pts: list[tuple[float, float]], x: float) -> float:
        import numpy as np

        bs, es = np.log([b for b, _ in pts]), np.log([e for _, e in pts])
        return float(np.exp(np.interp(math.log(x), bs, es)))

    if configured is not None:
        configured = float(configured)
        label = f"configured charge: {budget_name} = {_tick_label(configured)}"
        if measure == "zcdp" and delta is not None:
            eps_conf = epsilon_at_delta(configured, float(delta))
            label += f" (epsilon = {eps_conf:.3g} at delta = {float(delta):.0e})"
        ax.axvline(configured, color="tab:red", linestyle=":", linewidth=1.5, label=label)
        for n, pts in series.items():
            if pts[0][0] <= configured <= pts[-1][0]:
                ax.plot([configured], [at(pts, configured)], marker="D", markersize=7, color=colors[n],
                        markeredgecolor="tab:red", linestyle="none", zorder=5)

    values = [e for pts in series.values() for _, e in pts]
    if relative:
        # groups too small for the interval to say anything
        where = configured if configured is not None else (budgets[-1] if budgets else None)
        useless: list[tuple[int, float, float]] = []  # (group size, error, the budget it is read at)
        for n, pts in series.items():
            x = min(max(where, pts[0][0]), pts[-1][0]) if where is not None else pts[-1][0]
            e = at(pts, x)
            if e >= USELESS_RELATIVE_ERROR:
                useless.append((n, e, x))
        ymax = max(values + shown_target + ([] if series else [USELESS_RELATIVE_ERROR]))
        ymin = min(values + shown_target + [0.5])
        ax.set_ylim(ymin / 1.6, ymax * 1.6)
        if any(e >= USELESS_RELATIVE_ERROR for e in values):
            ax.axhspan(USELESS_RELATIVE_ERROR, ymax * 1.6, color="0.5", alpha=0.12, linewidth=0)
            ax.axhline(USELESS_RELATIVE_ERROR, color="0.4", linewidth=0.8)
        at_what = (f"at the configured {budget_name} {_tick_label(configured)}" if configured is not None
                   else f"even at {budget_name} {_tick_label(where)}" if where is not None else "")
        for n, e, x in useless:
            # an interval cut at the statistic's range is no +- around the value: say "up to"
            nearest = min((r for r in picked if int(r["group_size"]) == n), key=lambda r: abs(float(r["budget"]) - x))
            err = f"up to {_pct(e)}" if nearest.get("clipped") else f"+-{_pct(e)}"
            text = (f"group size {n:,}: {err} {at_what}.\nToo small: the interval is wider than the value, "
                    "it says nothing about this group") if not small else \
                (f"group size {n:,}: {err} {at_what}.\nToo small: it says nothing about this group")
            ax.annotate(text, xy=(x, at(series[n], x)), xytext=(0.98, 0.97),
                        textcoords="axes fraction", ha="right", va="top", fontsize=note_size, color=colors[n],
                        bbox={"boxstyle": "round", "fc": "white", "ec": colors[n], "alpha": 0.9},
                        arrowprops={"arrowstyle": "->", "color": colors[n]})
        if useless or any(e >= USELESS_RELATIVE_ERROR for e in values):
            ax.text(0.01, 0.99 if not useless else 0.6, "shaded: relative error >= 100%,\nthe interval says nothing",
                    transform=ax.transAxes, ha="left", va="top", fontsize=note_size - 1, color="0.3")
    elif values:
        ax.set_ylim(min(values) / 1.6, max(values) * 1.6)
        ax.text(0.01, 0.02, "assumed true value 0: absolute error, in the value's units", transform=ax.transAxes,
                ha="left", va="bottom", fontsize=note_size - 1, color="0.3")

    # readable ticks: a label at each explored budget; percent labels on a relative error axis
    ticks = _nice_budget_ticks(budgets + ([configured] if configured is not None else []))
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: _tick_label(x)))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: _pct(y) if relative else f"{y:.3g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())

    what = _ERROR_NAMES.get(column, column.replace("_", " "))
    kind = picked[0].get("kind")
    if small:
        ax.set_title(f"{stat}" + (f" ({kind})" if kind and kind != stat else ""), fontsize=10)
    else:
        ax.set_title(f"{picked[0].get('release', '')}: {stat} - {what} vs {budget_name}".strip(": "))
    ax.set_xlabel(f"{budget_name} of the release ({'pure DP' if measure == 'pure_dp' else 'zCDP'})")
    ax.set_ylabel(f"{what} (% of the true value)" if relative else what)
    if measure == "zcdp" and delta is not None and budgets:
        lo, hi = min(ticks), max(ticks)
        sec = ax.secondary_xaxis("top", functions=_rho_to_epsilon_functions(lo, hi, float(delta)))
        eps_ticks = [epsilon_at_delta(b, float(delta)) for b in ticks]
        sec.xaxis.set_major_locator(FixedLocator(eps_ticks))
        sec.xaxis.set_major_formatter(FuncFormatter(lambda x, _: _tick_label(x)))
        sec.xaxis.set_minor_formatter(NullFormatter())
        sec.set_xlabel(f"epsilon of the (epsilon, delta) statement, delta = {float(delta):.0e} (the budget's)"
                       if not small else f"epsilon at delta = {float(delta):.0e}", fontsize=None if not small else 8)
    ax.grid(True, which="major", alpha=0.3)
    if legend:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, borderaxespad=0)


def explorer_chart(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike, caption: str = "",
                   **kwargs: Any) -> str:
    """Write the explorer PNG to ``path``; returns the path."""
    return _save(build_explorer_figure(rows, caption, **kwargs), path)


# --------------------------------------------------------------------------------------
# A family's series: values, pointwise intervals, simultaneous bands, significant changes
# --------------------------------------------------------------------------------------
def _xs(chart: SeriesChart) -> tuple[list[Any], bool]:
    from datetime import date

    try:
        return [date.fromisoformat(p.key) for p in chart.points], True
    except ValueError:
        return [p.key for p in chart.points], False


def _series_caption(chart: SeriesChart, rows: Sequence[Mapping[str, Any]]) -> str:
    parts = [release_caption(rows, statistic=chart.statistic)]
    if chart.simultaneous:
        parts.append(f"band: all {len(chart.points)} points inside together with probability >= "
                     f"{chart.confidence:.0%} ({chart.band_rule})" if chart.releases == 1 else
                     f"bands: each release's points together at {chart.confidence:.0%}")
    parts.append({"exact": "changes: exact law of each difference, Bonferroni over the changes",
                  "bands": "changes: non-overlapping bands",
                  "none": "changes: not tested"}[chart.change_method])
    if chart.suppressed:
        parts.append(f"{chart.suppressed} suppressed cells not drawn")
    return "; ".join(p for p in parts if p) + "".join(f". {n}" for n in chart.notes)


def build_series_figure(charts: Sequence[SeriesChart], rows: Sequence[Mapping[str, Any]] = (), *,
                        title: Optional[str] = None) -> Figure:
    """One panel per statistic: the DP estimate (line), its pointwise interval (dark shade), the
    simultaneous band (light shade, when published), the changes significant over the whole
    chart (triangles up / down at the later point) and the points whose interval is wider than
    the value (grey crosses). The y axis is zoomed to the data (:func:`zoom_range`)."""
    if not charts or not any(c.points for c in charts):
        raise ValueError("no published point to chart")
    charts = [c for c in charts if c.points]
    fig = _new_figure(10, 3.6 * len(charts) + 0.8)
    for i, chart in enumerate(charts):
        ax = fig.add_subplot(len(charts), 1, i + 1)
        xs, is_date = _xs(chart)
        words = chart.legend()
        ys = [p.value for p in chart.points]
        if chart.simultaneous:
            ax.fill_between(xs, [float(p.band_low or 0.0) for p in chart.points],
                            [float(p.band_high or 0.0) for p in chart.points],
                            alpha=0.15, color="tab:blue", linewidth=0, label=words["band"])
        ax.fill_between(xs, [p.ci_low for p in chart.points], [p.ci_high for p in chart.points],
                        alpha=0.35, color="tab:blue", linewidth=0, label=words["interval"])
        ax.plot(xs, ys, marker="o", markersize=3, color="tab:blue", label=words["value"])
        at = {p.key: (x, p.value) for x, p in zip(xs, chart.points)}
        for sign, marker, colour in ((1, "^", "tab:green"), (-1, "v", "tab:red")):
            hits = [at[c.key] for c in chart.significant if (c.change > 0) == (sign > 0)]
            if hits:
                ax.scatter([h[0] for h in hits], [h[1] for h in hits], marker=marker, s=60, color=colour, zorder=5,
                           label=words["up" if sign > 0 else "down"])
        wide = [at[p.key] for p in chart.wide]
        if wide:
            ax.scatter([w[0] for w in wide], [w[1] for w in wide], marker="x", s=50, color="0.4", zorder=6,
                       label=words["wide"])
        rng = chart.y_range()
        if rng is not None:
            ax.set_ylim(*rng)
            if rng[0] > 0:
                ax.text(0.99, 0.02, f"y axis starts at {rng[0]:,.4g}, not 0", transform=ax.transAxes,
                        ha="right", va="bottom", fontsize=7, color="0.35")
        ax.set_title(chart.statistic if title is None else f"{title}: {chart.statistic}", fontsize=10)
        ax.set_xlabel("date (UTC)" if is_date else "key")
        ax.set_ylabel(chart.statistic)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize=7)
        if is_date:
            ax.tick_params(axis="x", labelrotation=30)
        cap = _series_caption(chart, rows)
        if cap:
            ax.text(0.0, -0.32, _wrap(cap), transform=ax.transAxes, fontsize=7, va="top", color="0.25")
    return fig


def series_html(charts: Sequence[SeriesChart], path: str | os.PathLike, rows: Sequence[Mapping[str, Any]] = (),
                *, title: Optional[str] = None) -> str:
    """The same chart as :func:`build_series_figure`, interactive (plotly: hover shows each
    point's value, interval and band), as one self-contained HTML file (plotly.js inlined: it
    opens without a network). Needs the ``charts`` extra (``pip install 'dp_spark[charts]'``)."""
    try:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots
    except ImportError:
        raise ImportError("an HTML chart needs plotly: pip install 'dp_spark[charts]'") from None
    charts = [c for c in charts if c.points]
    if not charts:
        raise ValueError("no published point to chart")
    fig = make_subplots(rows=len(charts), cols=1, subplot_titles=[c.statistic for c in charts],
                        vertical_spacing=0.12 if len(charts) > 1 else 0.0)
    for i, chart in enumerate(charts, start=1):
        words = chart.legend()
        xs = [p.key for p in chart.points]
        show = i == 1

        def shade(lo, hi, name, opacity, group, row=i, xs=xs, show=show):
            fig.add_trace(go.Scatter(x=xs, y=hi, mode="lines", line={"width": 0}, hoverinfo="skip",
                                     legendgroup=group, showlegend=False), row=row, col=1)
            fig.add_trace(go.Scatter(x=xs, y=lo, mode="lines", line={"width": 0}, fill="tonexty",
                                     fillcolor=f"rgba(31,119,180,{opacity})", name=name, legendgroup=group,
                                     showlegend=show, hoverinfo="skip"), row=row, col=1)

        if chart.simultaneous:
            shade([p.band_low for p in chart.points], [p.band_high for p in chart.points], words["band"], 0.15, "band")
        shade([p.ci_low for p in chart.points], [p.ci_high for p in chart.points], words["interval"], 0.35, "ci")
        hover = [f"{p.key}: {p.value:.6g} [{p.ci_low:.6g}, {p.ci_high:.6g}]"
                 + (f" band [{p.band_low:.6g}, {p.band_high:.6g}]" if p.band_low is not None else "")
                 for p in chart.points]
        fig.add_trace(go.Scatter(x=xs, y=[p.value for p in chart.points], mode="lines+markers", name=words["value"],
                                 line={"color": "rgb(31,119,180)"}, text=hover, hoverinfo="text",
                                 legendgroup="value", showlegend=show), row=i, col=1)
        at = {p.key: p.value for p in chart.points}
        for up, symbol, colour in ((True, "triangle-up", "green"), (False, "triangle-down", "red")):
            hits = [c for c in chart.significant if (c.change > 0) == up]
            fig.add_trace(go.Scatter(x=[c.key for c in hits], y=[at[c.key] for c in hits], mode="markers",
                                     marker={"symbol": symbol, "size": 12, "color": colour},
                                     name=words["up" if up else "down"], legendgroup="up" if up else "down",
                                     text=[f"change {c.change:.6g} [{c.low:.6g}, {c.high:.6g}]" for c in hits],
                                     hoverinfo="text", showlegend=show), row=i, col=1)
        fig.add_trace(go.Scatter(x=[p.key for p in chart.wide], y=[p.value for p in chart.wide], mode="markers",
                                 marker={"symbol": "x", "size": 10, "color": "grey"}, name=words["wide"],
                                 legendgroup="wide", showlegend=show, hoverinfo="skip"), row=i, col=1)
        rng = chart.y_range()
        if rng is not None:
            fig.update_yaxes(range=list(rng), row=i, col=1)
        fig.update_yaxes(title_text=chart.statistic, row=i, col=1)
    captions = "<br>".join(f"{c.statistic}: {_series_caption(c, rows)}" for c in charts)
    fig.update_layout(title=title or "dp-spark series", height=380 * len(charts) + 160,
                      margin={"b": 60 + 40 * len(charts)}, hovermode="closest")
    fig.add_annotation(text=captions, xref="paper", yref="paper", x=0, y=-0.12 / len(charts), showarrow=False,
                       align="left", font={"size": 10}, xanchor="left", yanchor="top")
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(str(p), include_plotlyjs=True, full_html=True)
    return str(p)


def series_chart(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike, *, title: Optional[str] = None,
                 statistics: Optional[Sequence[str]] = None) -> str:
    """Write the series chart of ``rows`` (published rows: one per key and statistic) to
    ``path``: a PNG (matplotlib) or, for a path ending in ``.html``, the interactive HTML
    (plotly). Returns the path."""
    charts = series_chart_data(rows, statistics=statistics)
    if str(path).lower().endswith((".html", ".htm")):
        return series_html(charts, path, rows, title=title)
    return _save(build_series_figure(charts, rows, title=title), path)
