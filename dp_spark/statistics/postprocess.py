"""Minimum group sizes, applied to NOISY counts only (post-processing).

Why noisy and never true counts. A rule "publish a cell only if its true count >= T" is a
function of the raw data: on neighbours D (true count T - 1) and D' (true count T) it
suppresses with probability 1 and 0, so the *suppression pattern alone* distinguishes D
from D' with certainty: no epsilon bounds that. The same rule applied to the noisy count is
post-processing of a DP output, so it costs no budget and its suppression probability
changes by at most a factor e^epsilon between neighbours (``tests/governance/
test_thresholds.py`` measures both). The functions here receive only the engine's noisy
cell dicts; no true value can reach them.

Strategies (per spec, see :class:`MinGroupSize`):

* ``suppress``    -- every cell of a key whose noisy count is below the threshold keeps its
  row, with ``value``, ``ci_low``, ``ci_high`` set to NaN and ``suppressed = True``. The
  release table thus records *which* keys were suppressed (its metadata), not their values.
  A mean cell's ``noise_stddev`` and ``expected_abs_error`` are set to NaN too: they are
  computed from its noisy count (sum sd / noisy count) and noisy mean, so they would reveal
  the withheld count (:data:`DATA_DEPENDENT_FIELDS`). What stays is public: the mechanism,
  the noise scale, the grid.
* ``merge_other`` -- the same suppression, plus one extra key (``other_key``, default
  ``__other__``) whose cells combine the suppressed keys:

  - additive statistics (``count``, ``distinct_units``, ``sum``, ``normalised_sum``): the sum
    of the suppressed noisy values;
  - ``mean``: ``midpoint + sum(noisy normalised sums) / max(sum(noisy counts), min_count)``,
    clamped to the bounds. The cells carry only the mean, so the caller passes the noisy
    normalised sums in ``extra`` (see :func:`apply_min_group_size`); without them a mean
    release refuses ``merge_other`` (use ``suppress``).

  The "other" key is itself thresholded: if its merged noisy count is below the threshold,
  its cells are suppressed too (so merging a single small key never reveals it under another
  name). Its interval is conservative: a union bound over the m merged noises, each within
  its exact ``alpha / m`` half-width (``accuracy.noise_halfwidth``), which also holds after
  the non-negativity clamp of counts (clamping never increases an error). ``noise_stddev``
  of a merged cell is sqrt(sum of variances) of the merged noises, ``expected_abs_error``
  that value too (an upper bound of E|sum of noises| by Jensen), ``noise_scale`` is NaN (a sum
  of noises has no single scale).

A sum release has no noisy count: a minimum group size needs a count or mean release
(:func:`count_statistic_for` raises). Nothing here imports pyspark.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Mapping, Optional, Sequence

from dp_spark.errors import ConfigError

__all__ = [
    "STRATEGIES",
    "OTHER_KEY",
    "MinGroupSize",
    "min_group_size_from_dict",
    "count_statistic_for",
    "apply_min_group_size",
    "suppression_summary",
]

STRATEGIES = ("suppress", "merge_other")
OTHER_KEY = "__other__"
ADDITIVE = ("count", "distinct_units", "sum", "normalised_sum")
_NAN = float("nan")


@dataclass(frozen=True)
class MinGroupSize:
    """A spec's minimum group size: ``{threshold: N, strategy: suppress|merge_other}``."""

    threshold: int
    strategy: str = "suppress"
    other_key: str = OTHER_KEY

    def __post_init__(self) -> None:
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, int) or self.threshold < 1:
            raise ConfigError("min_group_size.threshold must be an integer >= 1")
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"min_group_size.strategy must be one of {list(STRATEGIES)}")
        if not isinstance(self.other_key, str) or not self.other_key:
            raise ConfigError("min_group_size.other_key must be a non-empty string")

    def to_json(self) -> dict[str, Any]:
        return {"threshold": self.threshold, "strategy": self.strategy, "other_key": self.other_key}


def min_group_size_from_dict(raw: Any, source: str = "<dict>", *, metric: Optional[str] = None,
                             public_keys: Sequence[str] = ()) -> Optional[MinGroupSize]:
    """Validate a spec's ``min_group_size`` field (None -> None). Before any data is read.

    ``metric`` (when given) must have a noisy count (not ``sum``); ``merge_other`` on a
    ``mean`` is accepted (the engine must pass the noisy normalised sums). ``other_key``
    must not be one of the declared ``public_keys``.
    """
    if raw is None:
        return None
    if isinstance(raw, bool):
        raise ConfigError(f"{source}: field 'min_group_size': must be an integer or a mapping")
    if isinstance(raw, int):
        raw = {"threshold": raw}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: field 'min_group_size': must be an integer or a mapping")
    unknown = sorted(set(map(str, raw)) - {"threshold", "strategy", "other_key"})
    if unknown:
        raise ConfigError(f"{source}: field 'min_group_size.{unknown[0]}': unknown field "
                          "(allowed: ['other_key', 'strategy', 'threshold'])")
    threshold: Any = raw.get("threshold")  # unvalidated: MinGroupSize checks it
    try:
        rule = MinGroupSize(threshold=threshold, strategy=raw.get("strategy", "suppress"),
                            other_key=raw.get("other_key", OTHER_KEY))
    except ConfigError as exc:
        raise ConfigError(f"{source}: field 'min_group_size': {exc}") from None
    if metric is not None:
        try:
            count_statistic_for(metric)
        except ConfigError as exc:
            raise ConfigError(f"{source}: field 'min_group_size': {exc}") from None
    if rule.other_key in set(public_keys):
        raise ConfigError(f"{source}: field 'min_group_size.other_key': clashes with a declared public key")
    return rule


def count_statistic_for(metric: str) -> str:
    """The statistic whose noisy value is the group size, per release metric."""
    if metric in ("count", "distinct_units"):
        return metric
    if metric == "mean":
        return "count"
    raise ConfigError(f"a minimum group size needs a noisy count; a '{metric}' release has none "
                      "(release a mean, or a count of the same groups)")


# --------------------------------------------------------------------------------------
def _number(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, Fraction)):
        raise ConfigError(f"{what} must be a number")
    return float(v)


def _scale_grid(cell: Mapping[str, Any]) -> float:
    """The cell's noise scale in grid units, rounded up (conservative)."""
    s = _number(cell.get("noise_scale"), "noise_scale") / _number(cell.get("grid", 1.0), "grid")
    if not (math.isfinite(s) and s > 0):
        raise ConfigError("a merged cell needs a finite positive noise scale")
    return math.nextafter(s, math.inf)


def _union_halfwidth(cells: Sequence[Mapping[str, Any]], alpha: float) -> float:
    """h (real units) with P(|sum of the cells' noises| > h) <= alpha: each noise within its
    exact alpha/m half-width (union bound); valid after a non-negativity clamp too."""
    from dp_spark.mechanisms.accuracy import noise_halfwidth

    m = len(cells)
    return float(sum(noise_halfwidth(c["mechanism"], _scale_grid(c), alpha / m) * float(c["grid"]) for c in cells))


# Accuracy fields that are functions of the noisy values, per statistic kind. A mean's
# noise_stddev is the sum's noise sd over the floored noisy count, and its expected error
# depends on the noisy count and mean (a variance's, a stddev's and a quantile's likewise):
# published for a suppressed cell they would give the withheld count away (sd_sum /
# noise_stddev = the noisy count). A count's or a sum's are public noise parameters (the same
# for every cell of the release) and stay.
PUBLIC_ACCURACY_KINDS = ("count", "distinct_units", "sum", "normalised_sum")
DATA_DEPENDENT_FIELDS = ("noise_stddev", "expected_abs_error")


def _suppressed(cell: Mapping[str, Any], kind: Optional[str] = None) -> dict[str, Any]:
    out = dict(cell)
    out.update(value=_NAN, ci_low=_NAN, ci_high=_NAN, suppressed=True)
    if out.get("band_low") is not None:  # a band is centred on the withheld value: withheld too
        out.update(band_low=_NAN, band_high=_NAN)
    if (kind or cell.get("statistic")) not in PUBLIC_ACCURACY_KINDS:
        out.update({f: _NAN for f in DATA_DEPENDENT_FIELDS if f in out})
    return out


def _merge_additive(group: Sequence[Mapping[str, Any]], key: str, alpha: float, nonneg: bool,
                    keys: Sequence[str]) -> dict[str, Any]:
    value = sum(float(c["value"]) for c in group)
    h = _union_halfwidth(group, alpha)
    lo, hi = value - h, value + h
    if nonneg:
        lo, hi = max(lo, 0.0), max(hi, 0.0)
    sd = math.sqrt(sum(float(c["noise_stddev"]) ** 2 for c in group))
    out = dict(group[0])
    out.update(key=key, value=value, ci_low=lo, ci_high=hi, noise_scale=_NAN, noise_stddev=sd,
               expected_abs_error=sd, suppressed=False, merged_keys=tuple(keys))
    if "band_low" in out:  # no band for a merged cell (the spec refuses merge_other with bands)
        out.update(band_low=None, band_high=None)
    return out


def _merge_mean(means: Sequence[Mapping[str, Any]], counts: Sequence[Mapping[str, Any]], key: str,
                alpha: float, extra: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    from dp_spark.mechanisms.mean import mean_from_noisy, mean_interval

    for need in ("normalised_sum", "lower", "upper", "min_count"):
        if need not in extra:
            raise ConfigError(f"merge_other for a mean needs extra[{need!r}]")
    nsums = extra["normalised_sum"]
    raw_counts = extra.get("count") or {}
    try:
        nsum = sum(Fraction(nsums[k]) for k in keys)
        ncount = sum(Fraction(raw_counts[k]) if k in raw_counts else Fraction(c["value"])
                     for k, c in zip(keys, counts))
    except KeyError:
        raise ConfigError("extra['normalised_sum'] must hold the noisy normalised sum of every merged key") from None
    lower, upper = Fraction(extra["lower"]), Fraction(extra["upper"])
    mid = (lower + upper) / 2
    min_count = extra["min_count"]
    m = mean_from_noisy(nsum, ncount, mid, lower, upper, min_count)
    h_s = Fraction(_union_halfwidth(means, alpha / 2))
    h_c = Fraction(_union_halfwidth(counts, alpha / 2))
    lo, hi = mean_interval(nsum, ncount, 0.0, 0.0, mid, lower, upper, min_count, alpha,
                           sum_halfwidth=h_s, count_halfwidth=h_c)
    sd_sum = math.sqrt(sum((float(c["noise_stddev"]) * max(float(cc["value"]), float(min_count))) ** 2
                           for c, cc in zip(means, counts)))
    out = dict(means[0])
    out.update(key=key, value=float(m), ci_low=float(lo), ci_high=float(hi), noise_scale=_NAN,
               noise_stddev=sd_sum / max(float(ncount), float(min_count)),
               expected_abs_error=(float(hi) - float(lo)) / 2, suppressed=False, merged_keys=tuple(keys))
    if "band_low" in out:  # no band for a merged cell (the spec refuses merge_other with bands)
        out.update(band_low=None, band_high=None)
    return out


def apply_min_group_size(
    cells: Sequence[Mapping[str, Any]],
    *,
    threshold: int,
    strategy: str,
    count_statistic: str,
    other_key: str = OTHER_KEY,
    confidence: Optional[float] = None,
    extra: Optional[Mapping[str, Any]] = None,
    kinds: Optional[Mapping[str, str]] = None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Threshold the released cells on their NOISY count; return (new cells, suppressed keys).

    Privacy contract: post-processing. Reads only the cells' noisy ``value``s (and public
    noise parameters); costs no budget. ``cells`` are the engine's cell dicts, one per
    (statistic, key), each key having exactly one ``count_statistic`` cell. Input cells are
    not modified; every output cell has ``suppressed`` set.

    ``suppressed_keys`` lists the keys whose noisy count is below ``threshold`` (or NaN), in
    input order, then ``other_key`` if the merged cell was itself suppressed.

    ``merge_other`` needs ``confidence`` (the release's level, for the merged intervals) and,
    when the cells include a ``mean``, ``extra = {"normalised_sum": {key: noisy normalised
    sum (real units)}, "lower": L, "upper": U, "min_count": floor}`` (enforced clamp bounds
    and the mean's count floor; optionally ``"count": {key: unclamped noisy count}``).

    ``kinds``: {statistic name: kind} when the names are not the kinds (a multi-statistic
    release); ``extra`` is then keyed by the name of each mean statistic.
    """
    kinds = dict(kinds or {})

    def kind(stat: str) -> str:
        return kinds.get(stat, stat)

    def extra_of(stat: str) -> Optional[Mapping[str, Any]]:
        if extra is None or "normalised_sum" in extra:  # one mean, its options at the top level
            return extra
        return extra.get(stat)

    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
        raise ConfigError("threshold must be an integer >= 1")
    if strategy not in STRATEGIES:
        raise ConfigError(f"strategy must be one of {list(STRATEGIES)}")
    keys: list[str] = []
    count_of: dict[str, Mapping[str, Any]] = {}
    for c in cells:
        k = c["key"]
        if k not in keys:
            keys.append(k)
        if c["statistic"] == count_statistic:
            if k in count_of:
                raise ConfigError(f"two '{count_statistic}' cells for one key")
            count_of[k] = c
    if not count_of:
        raise ConfigError(f"no '{count_statistic}' cells: a minimum group size needs a noisy count")
    if len(count_of) != len(keys):
        raise ConfigError(f"every key needs one '{count_statistic}' cell")

    def small(c: Mapping[str, Any]) -> bool:
        v = float(c["value"])
        return math.isnan(v) or v < threshold

    below = [k for k in keys if small(count_of[k])]
    below_set = set(below)
    out = [_suppressed(c, kind(c["statistic"])) if c["key"] in below_set
           else {**c, "suppressed": bool(c.get("suppressed", False))} for c in cells]
    suppressed_keys = list(below)
    if strategy == "suppress" or not below:
        return out, suppressed_keys

    # merge_other
    if other_key in keys:
        raise ConfigError("other_key clashes with a released key")
    if confidence is None:
        raise ConfigError("merge_other needs the release's confidence level")
    alpha = 1.0 - float(confidence)
    if not 0 < alpha < 1:
        raise ConfigError("confidence must be in (0, 1)")
    small_cells = [c for c in cells if c["key"] in below_set and not math.isnan(float(c["value"]))]
    stats = list(dict.fromkeys(c["statistic"] for c in cells))
    merged: list[dict[str, Any]] = []
    usable = [k for k in below if not math.isnan(float(count_of[k]["value"]))]
    if usable:
        for stat in stats:
            group = [next(c for c in small_cells if c["key"] == k and c["statistic"] == stat)
                     for k in usable]
            if kind(stat) in ADDITIVE:
                merged.append(_merge_additive(group, other_key, alpha, kind(stat) in ("count", "distinct_units"),
                                              usable))
            elif kind(stat) == "mean":
                mean_extra = extra_of(stat)
                if mean_extra is None:
                    raise ConfigError("merge_other for a mean needs the noisy normalised sums (extra); "
                                      "use strategy 'suppress' otherwise")
                counts = [count_of[k] for k in usable]
                merged.append(_merge_mean(group, counts, other_key, alpha, mean_extra, usable))
            else:
                raise ConfigError(f"merge_other cannot combine statistic '{stat}'")
        other_count = next(c for c in merged if c["statistic"] == count_statistic)
        if small(other_count):
            merged = [_suppressed(c, kind(c["statistic"])) for c in merged]
            suppressed_keys.append(other_key)
    return out + merged, suppressed_keys


def suppression_summary(cells: Sequence[Mapping[str, Any]], suppressed_keys: Sequence[str], *,
                        threshold: int, strategy: str) -> dict[str, Any]:
    """A JSON-able record for the release's audit/explain row: no values, keys only."""
    merged = sorted({k for c in cells for k in c.get("merged_keys", ())})
    return {"min_group_size": threshold, "strategy": strategy, "suppressed_keys": list(suppressed_keys),
            "merged_into_other": merged, "cells_in": len({(c["statistic"], c["key"]) for c in cells})}
