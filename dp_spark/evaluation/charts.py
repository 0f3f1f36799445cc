"""Charts a person can read: the DAU trend with interval bands, the AOV per region with error
bars, and the epsilon explorer's relative error against the budget.

Every chart has a title, axis labels with units, and a caption that states the privacy charge
(epsilon or rho, and the (epsilon, delta) statement when there is one), the window of keys and
the confidence of the intervals. The figures are built by ``build_*`` helpers that return the
matplotlib :class:`~matplotlib.figure.Figure` (tests inspect them); the ``*_chart`` functions
save a PNG and return its path.

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
from typing import Any, Iterable, Mapping, Optional, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = [
    "release_caption",
    "build_dau_figure",
    "dau_trend_chart",
    "build_aov_figure",
    "aov_chart",
    "build_explorer_figure",
    "explorer_chart",
    "epsilon_at_delta",
    "USELESS_RELATIVE_ERROR",
]

_CAPTION_WRAP = 110
#: A relative error (interval half-width, or expected error, over the value) at or above this
#: says nothing about the value: the interval is at least as wide as the value itself.
USELESS_RELATIVE_ERROR = 1.0


def _select(rows: Iterable[Mapping[str, Any]], statistic: str) -> list[Mapping[str, Any]]:
    picked = [r for r in rows if r.get("statistic") == statistic]
    if not picked:
        raise ValueError(f"no rows with statistic {statistic!r} to chart")
    return sorted(picked, key=lambda r: str(r["key"]))


def _fmt(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def release_caption(rows: Sequence[Mapping[str, Any]], *, statistic: Optional[str] = None,
                    window: Optional[str] = None) -> str:
    """A caption from the release metadata of ``rows``: charge, statement, window, confidence.

    ``window`` overrides the key range (e.g. ``"2026-11-01 .. 2026-11-30 (30 days)"``).
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
    if window is None:
        keys = sorted({str(r["key"]) for r in rows})
        window = keys[0] if len(keys) == 1 else f"{keys[0]} .. {keys[-1]} ({len(keys)} keys)"
    parts.append(f"window: {window}")
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

    One line (the DP estimate) and one band (``fill_between``) per figure.
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
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best")
    if is_date:
        fig.autofmt_xdate()
    if caption:
        fig.supxlabel(_wrap(caption), fontsize=8)
    return fig


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


def build_explorer_figure(rows: Sequence[Mapping[str, Any]], caption: str = "", *,
                          statistic: Optional[str] = None, target: Optional[float] = None,
                          error_column: str = "expected_rel_error", configured: Optional[float] = None,
                          delta: Optional[float] = None) -> Figure:
    """Relative error against the budget, one line per assumed group size (log-log axes).

    ``rows`` are :func:`dp_spark.evaluation.explorer.explore` rows. ``statistic`` picks the
    statistic to draw (default: the spec's headline statistic, the last one of the rows);
    ``target`` draws the stated error target as a horizontal line; ``configured`` marks the
    spec's charge (a vertical line, and a point on each group's line); ``delta`` (the budget's
    ``statement_delta``) adds, for a zCDP spec, the epsilon of the (epsilon, delta) statement
    on a second x axis above the rho axis.

    The budget axis has a labelled tick at each explored budget (or 1-2-5 steps when there are
    many), the error axis percent labels. A group whose relative error is 100% or more (at the
    configured charge, else at the largest budget drawn) gets a note on the chart: its
    interval is wider than the value itself, so the release says nothing about that group at
    that budget; the band above 100% is shaded.
    """
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter

    if not rows:
        raise ValueError("no explorer rows to chart")
    stat = statistic or rows[-1]["statistic"]
    picked = [r for r in rows if r["statistic"] == stat]
    if not picked:
        raise ValueError(f"no explorer rows for statistic {stat!r}")
    measure = picked[0]["measure"]
    budget_name = "epsilon" if measure == "pure_dp" else "rho"
    sizes = sorted({int(r["group_size"]) for r in picked})
    budgets = sorted({float(r["budget"]) for r in picked})

    fig = _new_figure(11, 5.6)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    series: dict[int, list[tuple[float, float]]] = {}
    colors: dict[int, Any] = {}
    for n in sizes:
        pts = sorted((float(r["budget"]), float(r[error_column])) for r in picked if int(r["group_size"]) == n)
        pts = [(b, e) for b, e in pts if math.isfinite(e) and e > 0]
        if pts:
            (line,) = ax.plot([b for b, _ in pts], [e for _, e in pts], marker="o", label=f"group size {n:,}")
            series[n], colors[n] = pts, line.get_color()
    if target is not None:
        ax.axhline(target, color="black", linestyle="--", linewidth=1, label=f"target {target:.1%}")

    # the configured charge: a vertical line and the error each group gets there
    def at(pts: list[tuple[float, float]], x: float) -> float:
        import numpy as np

        bs, es = np.log([b for b, _ in pts]), np.log([e for _, e in pts])
        return float(np.exp(np.interp(math.log(x), bs, es)))

    eps_conf = None
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

    # groups too small for the interval to say anything
    where = configured if configured is not None else (budgets[-1] if budgets else None)
    useless: list[tuple[int, float]] = []
    for n, pts in series.items():
        x = min(max(where, pts[0][0]), pts[-1][0]) if where is not None else pts[-1][0]
        e = at(pts, x)
        if e >= USELESS_RELATIVE_ERROR:
            useless.append((n, e))
    ymax = max([e for pts in series.values() for _, e in pts] + ([target] if target else [])
               + ([] if series else [USELESS_RELATIVE_ERROR]))
    ymin = min([e for pts in series.values() for _, e in pts] + ([target] if target else []) + [0.5])
    ax.set_ylim(ymin / 1.6, ymax * 1.6)
    if any(e >= USELESS_RELATIVE_ERROR for pts in series.values() for _, e in pts):
        ax.axhspan(USELESS_RELATIVE_ERROR, ymax * 1.6, color="0.5", alpha=0.12, linewidth=0)
        ax.axhline(USELESS_RELATIVE_ERROR, color="0.4", linewidth=0.8)
    at_what = (f"at the configured {budget_name} {_tick_label(where)}" if configured is not None
               else f"even at {budget_name} {_tick_label(where)}" if where is not None else "")
    for n, e in useless:
        x = min(max(where, series[n][0][0]), series[n][-1][0])
        ax.annotate(f"group size {n:,}: +-{_pct(e)} {at_what}.\nToo small: the interval is wider than the value, "
                    "it says nothing about this group", xy=(x, at(series[n], x)), xytext=(0.98, 0.97),
                    textcoords="axes fraction", ha="right", va="top", fontsize=8, color=colors[n],
                    bbox={"boxstyle": "round", "fc": "white", "ec": colors[n], "alpha": 0.9},
                    arrowprops={"arrowstyle": "->", "color": colors[n]})
    if useless or any(e >= USELESS_RELATIVE_ERROR for pts in series.values() for _, e in pts):
        ax.text(0.01, 0.99 if not useless else 0.6, "shaded: relative error >= 100%,\nthe interval says nothing",
                transform=ax.transAxes, ha="left", va="top", fontsize=7, color="0.3")

    # readable ticks: a label at each explored budget; percent labels on the error axis
    ticks = _nice_budget_ticks(budgets + ([configured] if configured is not None else []))
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: _tick_label(x)))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: _pct(y)))
    ax.yaxis.set_minor_formatter(NullFormatter())

    what = {"expected_rel_error": "expected relative error",
            "rel_halfwidth": "relative half-width of the interval"}.get(error_column, error_column.replace("_", " "))
    ax.set_title(f"{picked[0].get('release', '')}: {stat} - {what} vs {budget_name}".strip(": "))
    ax.set_xlabel(f"{budget_name} of the release ({'pure DP' if measure == 'pure_dp' else 'zCDP'})")
    ax.set_ylabel(f"{what} (% of the true value)")
    if measure == "zcdp" and delta is not None and budgets:
        lo, hi = min(ticks), max(ticks)
        sec = ax.secondary_xaxis("top", functions=_rho_to_epsilon_functions(lo, hi, float(delta)))
        eps_ticks = [epsilon_at_delta(b, float(delta)) for b in ticks]
        sec.xaxis.set_major_locator(FixedLocator(eps_ticks))
        sec.xaxis.set_major_formatter(FuncFormatter(lambda x, _: _tick_label(x)))
        sec.xaxis.set_minor_formatter(NullFormatter())
        sec.set_xlabel(f"epsilon of the (epsilon, delta) statement, delta = {float(delta):.0e} (the budget's)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, borderaxespad=0)
    if caption:
        fig.supxlabel(_wrap(caption), fontsize=8)
    return fig


def explorer_chart(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike, caption: str = "",
                   **kwargs: Any) -> str:
    """Write the explorer PNG to ``path``; returns the path."""
    return _save(build_explorer_figure(rows, caption, **kwargs), path)
