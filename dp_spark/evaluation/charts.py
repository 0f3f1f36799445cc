"""Charts a person can read: the DAU trend with interval bands, the AOV per region with error
bars, and the epsilon explorer's relative error against the budget.

Every chart has a title, axis labels with units, and a caption that states the privacy charge
(epsilon or rho, and the (epsilon, delta) statement when there is one), the window of keys and
the confidence of the intervals. The figures are built by ``build_*`` helpers that return the
matplotlib :class:`~matplotlib.figure.Figure` (tests inspect them); the ``*_chart`` functions
save a PNG and return its path.

Input rows are release rows (``ReleaseResult.rows`` or rows read from a Delta release table) or
the cell dicts of :func:`dp_spark.engine.noise_cells`: dicts with at least ``statistic``,
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
]

_CAPTION_WRAP = 110


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
def build_explorer_figure(rows: Sequence[Mapping[str, Any]], caption: str = "", *,
                          statistic: Optional[str] = None, target: Optional[float] = None,
                          error_column: str = "expected_rel_error") -> Figure:
    """Relative error against the budget, one line per assumed group size (log-log axes).

    ``rows`` are :func:`dp_spark.evaluation.explorer.explore` rows. ``statistic`` picks the
    statistic to draw (default: the spec's headline statistic, the last one of the rows);
    ``target`` draws the stated error target as a horizontal line.
    """
    if not rows:
        raise ValueError("no explorer rows to chart")
    stat = statistic or rows[-1]["statistic"]
    picked = [r for r in rows if r["statistic"] == stat]
    if not picked:
        raise ValueError(f"no explorer rows for statistic {stat!r}")
    measure = picked[0]["measure"]
    budget_name = "epsilon" if measure == "pure_dp" else "rho"
    sizes = sorted({int(r["group_size"]) for r in picked})

    fig = _new_figure(8, 5)
    ax = fig.add_subplot(1, 1, 1)
    for n in sizes:
        pts = sorted((float(r["budget"]), float(r[error_column])) for r in picked if int(r["group_size"]) == n)
        pts = [(b, e) for b, e in pts if math.isfinite(e) and e > 0]
        if pts:
            ax.plot([b for b, _ in pts], [e for _, e in pts], marker="o", label=f"group size {n:,}")
    if target is not None:
        ax.axhline(target, color="black", linestyle="--", linewidth=1, label=f"target {target:.1%}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    what = {"expected_rel_error": "expected relative error",
            "rel_halfwidth": "relative half-width of the interval"}.get(error_column, error_column.replace("_", " "))
    ax.set_title(f"{picked[0].get('release', '')}: {stat} - {what} vs {budget_name}".strip(": "))
    ax.set_xlabel(f"{budget_name} of the release ({'pure DP' if measure == 'pure_dp' else 'zCDP'})")
    ax.set_ylabel(f"{what} (fraction of the true value)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    if caption:
        fig.supxlabel(_wrap(caption), fontsize=8)
    return fig


def explorer_chart(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike, caption: str = "",
                   **kwargs: Any) -> str:
    """Write the explorer PNG to ``path``; returns the path."""
    return _save(build_explorer_figure(rows, caption, **kwargs), path)
