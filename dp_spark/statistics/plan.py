"""Plan and noise of a multi-statistic release: public parameters in, one composed event out.

::

    spec.statistics -> components per statistic (deduplicated: shared components are paid once)
      -> budget split over the components (weights, or the error-minimising default)
      -> one StatisticPlan per component (sensitivity from the enforced bounds, calibrated
         scale, NoiseEvent over cells x width entries)
      -> [Spark: exact partials per cell, dp_spark.backends.spark]
      -> noise: one vector draw per component, then each statistic's post-processing per cell

Default split. Each statistic i declares a first-order model of its squared error relative to
a public reference magnitude, err_i^2 ~ sum_c a_ic Var_c, and Var_c = Delta2_c^2 / (2 rho_c)
(zCDP) or 2 Delta1_c^2 / eps_c^2 (pure DP; the discrete Laplace's variance, to first order).
Minimising sum_i err_i^2 subject to sum_c rho_c = rho gives rho_c proportional to
sqrt(A_c) Delta2_c (Lagrange), and eps_c proportional to (A_c Delta1_c^2)^(1/3) under pure DP,
with A_c = sum_i a_ic. With ``weight`` on every statistic, statistic i gets the share
w_i / sum w of the charge, split over its own components by the same rule; a component
shared by several statistics receives the sum of their parts. Shares are rounded to
multiples of 10^-6 of the charge (each >= 10^-6) and sum to the charge exactly.

One mean. A release whose statistics are one ``mean`` and, optionally, the ``count`` of the
same rows (what a single-``metric: mean`` spec is rewritten into), without weights, splits
its charge by the mean's numeric optimum instead
(:func:`dp_spark.mechanisms.mean.optimal_mean_split`: the worst-case expected squared error
of the clamped, floored estimator at the assumed group size, count noise included). Measured
against the first-order split above (``tests/unit/test_statistics.py``,
``test_one_mean_takes_the_numeric_split``): never worse (within the k/100 grid of the
numeric search, 0.5%), and up to 1.8x lower at small groups and Linf > 1, where the
first-order model misses the floor and the clamp. ``QueryPlan.mean_split`` is then the
share of the normalised sum.

Nothing here imports pyspark.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from fractions import Fraction
from itertools import product
from typing import Any, Mapping, Optional

import numpy as np

from dp_spark.core.budget import PureDP, ZCDP
from dp_spark.errors import ConfigError, DpSparkError
from dp_spark.core.events import ComposedEvent
from dp_spark.statistics.base import kind_of
from dp_spark.statistics.cells import CellBlock, CellColumns, Const, canonical_keys
from dp_spark.statistics.components import window_suffix
from dp_spark.statistics.noise import joint_alpha

_QUANTUM = 10**6
#: noise is drawn on the driver: a bound on the draws of one release (key tuples x entries)
MAX_NOISY_ENTRIES = 10_000_000


def key_tuples(key_sets) -> list[tuple[str, ...]]:
    """The cross product of the public key sets, row-major (the last column varies fastest)."""
    if not key_sets:
        return [()]
    return list(product(*[ks.values for ks in key_sets]))


def key_tuples_at(key_sets, indices) -> list[tuple[str, ...]]:
    """The key tuples at ``indices`` of :func:`key_tuples` (row-major, the last column fastest),
    without building the cross product: for a batch of cells on an executor."""
    if not key_sets:
        return [() for _ in indices]
    sizes = [len(ks.values) for ks in key_sets]
    out = []
    for i in indices:
        rest, parts = int(i), []
        for ks, size in zip(reversed(key_sets), reversed(sizes)):
            rest, j = divmod(rest, size)
            parts.append(ks.values[j])
        if rest:
            raise DpSparkError("internal: a cell index beyond the key set")
        out.append(tuple(reversed(parts)))
    return out


@dataclass(frozen=True)
class DateFeeds:
    """How the rows of one day feed the cells of a release with rolling windows.

    The bounded pass works on *expanded* cells: ``cell * n_windows + w`` for the key tuple's
    row-major index ``cell`` and the index ``w`` of the window length in ``spec.windows``. A
    row whose date key is ``days[i]`` feeds the expanded cells ``base + t`` for each ``t`` in
    ``targets[i]``, ``base`` the expanded index of its key tuple with the date key's index 0.
    Day d's cell of an N-day window covers days d-N+1 .. d, so ``days`` also holds the N-1
    days before the first declared one (their rows feed the first windows only). Each feed is
    a row of the bounded pass: the L0, Linf and K cuts then bound (unit, expanded cell) pairs
    and rows, and every component's sensitivity follows from the bounds as for any cell."""

    column: str
    days: tuple[str, ...]
    targets: tuple[tuple[int, ...], ...]
    n_windows: int


def date_feeds(spec) -> Optional["DateFeeds"]:
    """The :class:`DateFeeds` of a release with rolling windows (None without)."""
    if not spec.windowed:
        return None
    from datetime import date, timedelta

    dated = spec.date_key_set
    public = spec.public_key_sets
    at = [i for i, k in enumerate(public) if k is dated][0]
    stride = 1
    for k in public[at + 1:]:
        stride *= len(k.values)
    windows = spec.windows
    n_w = len(windows)
    feeds: dict = {}
    for j, day in enumerate(dated.values):
        d = date.fromisoformat(day)
        for w, n in enumerate(windows):
            for back in range(n):
                src = (d - timedelta(days=back)).isoformat()
                feeds.setdefault(src, set()).add(j * stride * n_w + w)
    days = tuple(sorted(feeds))
    return DateFeeds(column=dated.column, days=days, targets=tuple(tuple(sorted(feeds[d])) for d in days),
                     n_windows=n_w)


def split_windows(spec, expanded: Mapping[int, Mapping[str, int]]) -> dict[int, dict[str, int]]:
    """Partials per expanded cell -> partials per cell, each window's under ``<partial>@N``
    (:func:`dp_spark.statistics.components.window_suffix`; the day itself without suffix)."""
    windows = spec.windows
    out: dict[int, dict[str, int]] = {}
    for e, parts in expanded.items():
        cell, w = divmod(e, len(windows))
        sfx = window_suffix(windows[w])
        out.setdefault(cell, {}).update({f"{k}{sfx}": v for k, v in parts.items()})
    return out


def canonical_key(key_sets, values: tuple[str, ...]) -> str:
    """``key``: the value itself for one column, "__all__" for none, else a JSON array."""
    if not key_sets:
        return "__all__"
    if len(key_sets) == 1:
        return values[0]
    return json.dumps(list(values), separators=(",", ":"))


def _snap(fracs: list[float]) -> list[Fraction]:
    total = sum(fracs)
    if not total > 0:
        raise DpSparkError("internal: the budget split has no positive share")
    snapped = [Fraction(max(1, round(f / total * _QUANTUM)), _QUANTUM) for f in fracs]
    over = sum(snapped) - 1
    i = max(range(len(snapped)), key=lambda j: snapped[j])
    snapped[i] -= over
    if snapped[i] <= 0:
        raise DpSparkError("internal: the budget split rounds a share to zero")
    return snapped


def charge_share(charge, frac: Fraction):
    if isinstance(charge, PureDP):
        return PureDP(charge.epsilon * frac)
    if isinstance(charge, ZCDP):
        return ZCDP(charge.rho * frac)
    raise ConfigError("release charges are pure_dp or zcdp")


def _optimal(comps, coeffs: Mapping, sens: Mapping, measure: str) -> dict:
    raw = {}
    for c in comps:
        a = max(coeffs.get(c, 0.0), 1e-300)
        raw[c] = (a ** 0.5) * sens[c] if measure == "zcdp" else (a * sens[c] ** 2) ** (1 / 3)
    total = sum(raw.values())
    return {c: v / total for c, v in raw.items()}


@dataclass(frozen=True)
class QueryPlan:
    """Everything about a multi-statistic release that is fixed before data is read."""

    spec: Any
    components: tuple  # Component, in order of first use
    fractions: tuple  # Fraction share of the charge per component
    statistics: tuple  # StatisticPlan per component (the name the engine knows plans by)
    stat_components: tuple  # per statistic of the spec: its components
    mean_split: Optional[Fraction] = None  # one mean: the normalised sum's share (numeric optimum)
    # private key selection (dp_spark.statistics.selection.SelectionPlan), None with public keys only
    selection: Any = None

    @property
    def event(self) -> ComposedEvent:
        children = tuple(p.event for p in self.statistics)
        if self.selection is not None:
            children = (self.selection.event,) + children
        return ComposedEvent(children=children)

    @property
    def events(self) -> tuple:
        """Every event of the release (the selection's first), for the accountant."""
        return self.event.children

    def plan_of(self, component):
        return self.statistics[self.components.index(component)]

    def split_json(self) -> dict[str, str]:
        out = {c.name: str(f) for c, f in zip(self.components, self.fractions)}
        if self.selection is not None:  # fractions above are of the statistics' part
            out = {"key_selection": str(self.spec.selection_share),
                   **{k: str(Fraction(v) * (1 - self.spec.selection_share)) for k, v in out.items()}}
        return out

    def noise(self, partials: Mapping[int, Mapping[str, int]], source,
              tuples: Optional[list] = None, components: Optional[dict] = None,
              grid_cells: Optional[int] = None) -> list[dict[str, Any]]:
        """:meth:`noise_columns` as one dict per cell (statistic by statistic, the key tuples in
        order): ``statistic``, ``key``, ``keys`` ({column: key}) and the statistic's fields."""
        return self.noise_columns(partials, source, tuples, components, grid_cells).dicts()

    def noise_columns(self, partials: Mapping[int, Mapping[str, int]], source,
                      tuples: Optional[list] = None, components: Optional[dict] = None,
                      grid_cells: Optional[int] = None) -> CellColumns:
        """One noise vector per component over all cells (present in the data or not), then
        every statistic's post-processing per cell. ``partials``: cell index -> collected longs.
        ``tuples``: the key tuples (in ``group_by`` order) the indices refer to; by default the
        cross product of the public key sets (a release with private keys passes the selected
        cells). Returns the cells as columns, one block per statistic
        (:class:`~dp_spark.statistics.cells.CellColumns`; driver or task memory only: never log
        them before the write commits).
        When ``components`` is a dict, each component's noisy values (real units) are put in it,
        ``{component: {key: value or [values]}}`` (for merging small groups: post-processing).

        Vectorised over cells: each component's true values and noisy values are numpy integer
        vectors (:func:`~dp_spark.mechanisms.release.add_noise_array`: the same draws, in the
        same order, as one ``source`` call per component), and a kind with a vectorised
        post-processing (:meth:`~dp_spark.statistics.base.StatisticKind.finish_columns`: count,
        distinct_units, sum, mean, variance, stddev) computes its values and intervals as float64
        vectors, equal to its per-cell ``finish`` (exact integer ratios rounded once; the spread's
        float arithmetic on vectors). The quantile, and values too large for a kind's vector form,
        take the per-cell ``finish``.

        ``grid_cells``: the cells are a batch of a release of ``grid_cells`` key tuples (public
        keys; executor-side noise, :func:`dp_spark.backends.spark.noisy_release_frame`): the
        same draws per cell (iid, the plan's scale), the simultaneous bands at the release's
        level, and the privacy cost is the plan's, charged once for the whole grid."""
        from dataclasses import replace as _replace

        from dp_spark.mechanisms.release import add_noise_array

        spec = self.spec
        if tuples is None:
            if spec.private_key_sets:
                raise DpSparkError("internal: a release with private keys needs its selected key tuples")
            tuples = key_tuples(spec.key_sets)
        alpha = 1 - spec.confidence
        n = len(tuples)
        if grid_cells is not None and (spec.private_key_sets or n > grid_cells):
            raise DpSparkError("internal: a batch of cells is a slice of a public key grid")
        grids: dict = {}
        for comp, plan in zip(self.components, self.statistics):
            true = true_vector(comp, partials, n)
            if grid_cells is not None:  # one batch: its share of the plan's draws
                if len(true) * grid_cells != plan.cells * n:
                    raise DpSparkError("internal: the cells do not match the plan")
                plan = _replace(plan, event=_replace(plan.event, cells=max(1, len(true))))
            elif plan.cells != len(true):
                if not spec.private_key_sets or len(true) > plan.cells:
                    raise DpSparkError("internal: the cells do not match the plan")
                # the selected cells, fewer than the most the plan allowed (the privacy cost
                # does not depend on the number of cells); no draw at all for no cell
                plan = _replace(plan, event=_replace(plan.event, cells=max(1, len(true))))
            grids[comp] = add_noise_array(plan, true, source) if len(true) else np.zeros(0, dtype=np.int64)
        exact: dict = {}

        def fractions(comp) -> list:  # a component's noisy values in real units, exact
            if comp not in exact:
                unit = self.plan_of(comp).grid_unit
                exact[comp] = [Fraction(int(v)) * unit for v in grids[comp].tolist()]
            return exact[comp]

        names = [ks.column for ks in spec.key_sets]
        key_cols = [list(col) for col in zip(*tuples)] if (names and n) else [[] for _ in names]
        keys = canonical_keys(key_cols, n)
        key_values = dict(zip(names, key_cols))
        if components is not None:
            for comp in self.components:
                values, w = fractions(comp), comp.width
                components[comp] = {keys[i]: (values[i] if w == 1 else values[i * w:(i + 1) * w])
                                    for i in range(n)}
        # confidence {simultaneous: true}: every cell also gets a band, the same interval
        # construction at the Sidak level 1 - (1 - alpha)^(1/n) for the statistic's n cells: their
        # noises are independent, so all n are inside their bands with probability >= 1 - alpha
        # (exactly 1 - alpha for intervals that are exact for the noise)
        band_n = n if grid_cells is None else grid_cells
        band_alpha = Fraction(joint_alpha(alpha, band_n)) if spec.simultaneous and n else None
        blocks: list[CellBlock] = []
        for stat, comps in zip(spec.statistics, self.stat_components):
            kind = kind_of(stat.kind)
            plans = {c: self.plan_of(c) for c in comps}
            fields: dict[str, Any] = {"statistic": Const(stat.name), "key": keys}
            cols = kind.finish_columns(stat, {c: grids[c] for c in comps}, plans, alpha)
            if cols is not None:
                for f in ("value", "ci_low", "ci_high"):
                    fields[f] = cols.pop(f)
                # a field that differs by cell (a mean's error figures) is a vector too
                fields.update({f: v if isinstance(v, np.ndarray) else Const(v) for f, v in cols.items()})
                if band_alpha is not None:
                    band = kind.finish_columns(stat, {c: grids[c] for c in comps}, plans, band_alpha)
                    if band is None:  # the same grids as the intervals': a vectorised form for both
                        raise DpSparkError("internal: no vectorised band where there is a vectorised interval")
                    fields["band_low"], fields["band_high"] = band["ci_low"], band["ci_high"]
                blocks.append(CellBlock(n, fields, key_values))
                continue
            noisy = {c: fractions(c) for c in comps}
            outs = []
            for i in range(n):
                mine = {c: (noisy[c][i] if c.width == 1 else noisy[c][i * c.width:(i + 1) * c.width]) for c in comps}
                out = kind.finish(stat, mine, plans, alpha)
                if band_alpha is not None:  # without bands the cells hold no band fields (null in the table)
                    band = kind.finish(stat, mine, plans, band_alpha)
                    out["band_low"], out["band_high"] = band["ci_low"], band["ci_high"]
                outs.append(out)
            for f in dict.fromkeys(f for out in outs for f in out):
                fields[f] = [out.get(f) for out in outs]
            blocks.append(CellBlock(n, fields, key_values))
        return CellColumns(tuple(blocks))


class PartialColumns(Mapping):
    """The collected partials as columns: ``index`` the sorted indices of the cells present
    in the data (int64, distinct), ``columns`` one int64 vector per partial, aligned with it.
    A read-only ``{cell index: {partial: int}}`` mapping (what the backends return), without
    one Python object per cell; :func:`true_vector` reads the columns directly."""

    def __init__(self, index: np.ndarray, columns: Mapping[str, np.ndarray]):
        self.index = np.asarray(index, dtype=np.int64)
        self.columns = {k: np.asarray(v, dtype=np.int64) for k, v in columns.items()}
        if self.index.size and bool(np.any(np.diff(self.index) <= 0)):
            raise DpSparkError("internal: partial columns need sorted, distinct cell indices")

    def _pos(self, i) -> int:
        pos = int(np.searchsorted(self.index, i))
        if pos >= self.index.size or int(self.index[pos]) != i:
            raise KeyError(i)
        return pos

    def __getitem__(self, i) -> dict[str, int]:
        pos = self._pos(i)
        return {k: int(v[pos]) for k, v in self.columns.items()}

    def __iter__(self):
        return iter(self.index.tolist())

    def __len__(self) -> int:
        return int(self.index.size)

    def dense(self, name: str, n: int) -> np.ndarray:
        """Partial ``name`` over cells 0..n-1 (zeros where a cell is absent or lacks it)."""
        out = np.zeros(n, dtype=np.int64)
        col = self.columns.get(name)
        if col is not None and self.index.size:
            keep = self.index < n
            out[self.index[keep]] = col[keep]
        return out


def true_vector(comp, partials: Mapping[int, Mapping[str, int]], n: int) -> np.ndarray:
    """A component's exact grid integers over cells 0..n-1 (``width`` per cell), from the
    collected partials (absent cells are zeros): ``int64``, or ``object`` when one does not fit."""
    from dp_spark.mechanisms.samplers import as_int_array

    empty: dict = {}
    if comp.kind in ("rows", "units"):
        # a windowed component reads its window's partial (``<partial>@N``), as true_values does
        name = ("dp_rows" if comp.kind == "rows" else "dp_units") + window_suffix(comp.window)
        if isinstance(partials, PartialColumns):
            return partials.dense(name, n)
        return np.fromiter((partials.get(i, empty).get(name, 0) for i in range(n)), dtype=np.int64, count=n)
    if isinstance(partials, PartialColumns):
        column = comp.true_column(lambda name: partials.dense(name, n))
        if column is not None:
            return as_int_array(column)
    out: list[int] = []
    for i in range(n):
        out.extend(comp.true_values(partials.get(i, empty)))
    return as_int_array(out)


def plan_query(spec) -> QueryPlan:
    """Components, budget split and calibrated plans of ``spec.statistics``: no data read."""
    if not spec.statistics:
        raise ConfigError(f"{spec.source}: not a multi-statistic release")
    kinds = [kind_of(s.kind) for s in spec.statistics]
    alone = [k.components(s, rows_shared=False) for k, s in zip(kinds, spec.statistics)]
    rows_shared = any(c.kind == "rows" for comps in alone for c in comps)
    per_stat = [tuple(replace(c, window=s.window or 1) for c in k.components(s, rows_shared=rows_shared))
                for k, s in zip(kinds, spec.statistics)]
    comps: list = []
    for cs in per_stat:
        for c in cs:
            if c not in comps:
                comps.append(c)
    measure = spec.charge.MEASURE
    cells = spec.cells  # with private keys: the most cells there can be
    entries = cells * sum(c.width for c in comps)
    if entries > MAX_NOISY_ENTRIES:
        raise ConfigError(f"{spec.source}: {entries} noisy entries (key tuples x components, a histogram "
                          f"counting its bins) exceed {MAX_NOISY_ENTRIES}: fewer key tuples or quantile bins")
    sens = {c: c.real_sensitivity(spec.bounds, spec.neighbouring, cells, measure) for c in comps}
    coeffs = [k.error_coefficients(s, cs) for k, s, cs in zip(kinds, spec.statistics, per_stat)]
    weights = [s.weight for s in spec.statistics]
    if all(w is None for w in weights):
        total: dict = {}
        for co in coeffs:
            for c, a in co.items():
                total[c] = total.get(c, 0.0) + a
        split = _optimal(comps, total, sens, measure)
    else:
        wsum = sum(weights)
        split = {c: 0.0 for c in comps}
        for w, cs, co in zip(weights, per_stat, coeffs):
            for c, f in _optimal(cs, co, sens, measure).items():
                split[c] += float(w / wsum) * f
    selection = None
    rest = Fraction(1)
    if spec.private_key_sets:
        from dp_spark.statistics.selection import plan_selection

        rest = 1 - spec.selection_share
        selection = plan_selection(spec, charge_share(spec.charge, spec.selection_share))
    mean_split = _one_mean_split(spec, comps, charge_share(spec.charge, rest))
    if mean_split is not None:
        fractions = [mean_split if c.kind == "nsum" else 1 - mean_split for c in comps]
    else:
        fractions = _snap([split[c] for c in comps])
    plans = tuple(c.plan(spec.bounds, spec.neighbouring, charge_share(spec.charge, f * rest), cells)
                  for c, f in zip(comps, fractions))
    return QueryPlan(spec=spec, components=tuple(comps), fractions=tuple(fractions), statistics=plans,
                     stat_components=tuple(per_stat), mean_split=mean_split, selection=selection)


def _one_mean_split(spec, comps, charge) -> Optional[Fraction]:
    """The normalised sum's share by the mean's numeric optimum, when the release is one
    ``mean`` and optionally the ``count`` of its rows, without weights (module docstring);
    else None (the first-order split)."""
    stats = spec.statistics
    means = [s for s in stats if s.kind == "mean"]
    if (len(means) != 1 or any(s.kind not in ("count", "mean") for s in stats)
            or any(s.weight is not None for s in stats) or sorted(c.kind for c in comps) != ["nsum", "rows"]):
        return None
    from dataclasses import replace as _replace

    from dp_spark.mechanisms.mean import optimal_mean_split

    m = means[0]
    bounds = _replace(spec.bounds, lower=m.clamp.lower, upper=m.clamp.upper)
    mechanism = "discrete_laplace" if spec.charge.MEASURE == "pure_dp" else "discrete_gaussian"
    return optimal_mean_split(bounds, spec.neighbouring, m.option("assumed_group_size"), mechanism, budget=charge,
                              min_count=m.option("min_count"), assumed_mean=m.option("assumed_mean"))
