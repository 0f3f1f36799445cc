"""DP events: what a release did, in a form the accountant prices and the ledger stores.

A mechanism returns an event; one :class:`~dp_spark.accountant.Accountant` composes events
under one measure; the ledger stores the events as canonical JSON (``canonical_json``), so
the JSON round trip is exact: Fractions are written as strings (``"1/3"``), never floats.

* :class:`NoiseEvent` -- one vector of discrete Laplace or discrete Gaussian noise, one
  draw per released cell, on the integer grid 2^grid_exponent;
* :class:`ComposedEvent` -- sequential composition of child events.

Events are frozen and hashable. Nothing here imports pyspark.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from fractions import Fraction
from numbers import Integral
from typing import Any, Optional, Union

from dp_spark.core.budget import PureDP, ZCDP
from dp_spark.errors import ConfigError

__all__ = [
    "MECHANISMS",
    "InvalidEventError",
    "NoiseEvent",
    "ComposedEvent",
    "Event",
    "event_to_json",
    "event_from_json",
    "canonical_json",
]

LAPLACE = "discrete_laplace"
GAUSSIAN = "discrete_gaussian"
MECHANISMS = (LAPLACE, GAUSSIAN)
_FORMAT = 1


class InvalidEventError(ConfigError):
    """An event is malformed (unknown mechanism, non-positive scale, bad JSON, ...)."""


def _frac(value: Any, name: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (Fraction, Integral)):
        raise InvalidEventError(f"event field {name!r} must be an exact rational")
    return Fraction(value)


def _int(value: Any, name: str, minimum: Optional[int]) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise InvalidEventError(f"event field {name!r} must be an integer")
    value = int(value)
    if minimum is not None and value < minimum:
        raise InvalidEventError(f"event field {name!r} must be >= {minimum}")
    return value


@dataclass(frozen=True)
class NoiseEvent:
    """One noised statistic: ``cells`` draws of one exact discrete mechanism.

    * ``mechanism``: ``"discrete_laplace"`` (needs ``sensitivity``, the L1 sensitivity of the
      whole vector of cells in grid units) or ``"discrete_gaussian"`` (needs ``l2_squared``,
      the squared L2 sensitivity of the vector in grid units^2);
    * ``scale``: the noise parameter in grid units (Laplace scale t, P(x) ~ exp(-|x|/t);
      Gaussian sigma, P(x) ~ exp(-x^2 / (2 sigma^2)));
    * ``cells``: how many cells (public keys) were released, one draw each;
    * ``grid_exponent``: outputs are multiples of 2^grid_exponent (0 for counts);
    * ``partitions_per_unit``: the effective L0 the sensitivity was derived with;
    * ``parallel``: True exactly when ``partitions_per_unit == 1``;
    * ``delta``: default 0: a failure probability on top of the pure epsilon (Laplace) or rho
      (Gaussian) part, for a *thresholded* mechanism (private partition selection: the noisy
      counts are epsilon-DP or rho-zCDP, publishing only the keys above a threshold fails with
      probability at most delta). Written in the event JSON only when > 0, so events without
      it keep their JSON (and so their hashes) unchanged.

    Cost (:meth:`natural_cost`): Laplace -> ``PureDP(sensitivity / scale, delta)``; Gaussian ->
    ``ZCDP(l2_squared / (2 scale^2), delta)`` (Canonne, Kamath, Steinke 2020, for integer-valued
    statistics). The cost is always derived from the *vector* sensitivity, so the cells of
    one event are priced together:

    * when partitions are disjoint in units (L0 = 1, ``parallel=True``) the vector
      sensitivity equals the per-partition one and all cells cost as one (parallel
      composition, made true by the enforced L0 bound);
    * when a unit may touch L0 > 1 partitions the vector sensitivity already scales with
      L0 (L1 ~ L0, L2 ~ sqrt(L0)), which is what sequential composition over the partitions
      a unit touches costs. Parallel composition is applied only when L0 = 1 makes it true.
    """

    mechanism: str
    statistic: str
    scale: Fraction
    sensitivity: Optional[Fraction] = None
    l2_squared: Optional[Fraction] = None
    cells: int = 1
    grid_exponent: int = 0
    partitions_per_unit: int = 1
    parallel: Optional[bool] = None
    delta: Fraction = Fraction(0)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.mechanism not in MECHANISMS:
            raise InvalidEventError(f"unknown mechanism; expected one of {list(MECHANISMS)}")
        if not isinstance(self.statistic, str) or not self.statistic:
            raise InvalidEventError("event field 'statistic' must be a non-empty string")
        scale = _frac(self.scale, "scale")
        if scale <= 0:
            raise InvalidEventError("event field 'scale' must be > 0")
        set_(self, "scale", scale)
        if self.mechanism == LAPLACE:
            if self.sensitivity is None or self.l2_squared is not None:
                raise InvalidEventError("a discrete_laplace event takes 'sensitivity' (L1) and no 'l2_squared'")
            sens = _frac(self.sensitivity, "sensitivity")
            if sens <= 0:
                raise InvalidEventError("event field 'sensitivity' must be > 0")
            set_(self, "sensitivity", sens)
        else:
            if self.l2_squared is None or self.sensitivity is not None:
                raise InvalidEventError("a discrete_gaussian event takes 'l2_squared' and no 'sensitivity'")
            l2sq = _frac(self.l2_squared, "l2_squared")
            if l2sq <= 0:
                raise InvalidEventError("event field 'l2_squared' must be > 0")
            set_(self, "l2_squared", l2sq)
        set_(self, "cells", _int(self.cells, "cells", 1))
        set_(self, "grid_exponent", _int(self.grid_exponent, "grid_exponent", None))
        set_(self, "partitions_per_unit", _int(self.partitions_per_unit, "partitions_per_unit", 1))
        delta = _frac(self.delta, "delta")
        if not 0 <= delta < 1:
            raise InvalidEventError("event field 'delta' must be >= 0 and < 1")
        set_(self, "delta", delta)
        expected = self.partitions_per_unit == 1
        if self.parallel is None:
            set_(self, "parallel", expected)
        elif not isinstance(self.parallel, bool) or self.parallel != expected:
            raise InvalidEventError(
                "event field 'parallel' must be true exactly when partitions_per_unit is 1"
            )

    def natural_cost(self) -> Union[PureDP, ZCDP]:
        """The privacy loss in the mechanism's own measure (exact)."""
        if self.mechanism == LAPLACE:
            if self.sensitivity is None:  # __post_init__ refuses it; a None here is a bug
                raise InvalidEventError("a discrete_laplace event takes 'sensitivity' (L1)")
            return PureDP(self.sensitivity / self.scale, self.delta)
        if self.l2_squared is None:  # __post_init__ refuses it; a None here is a bug
            raise InvalidEventError("a discrete_gaussian event takes 'l2_squared'")
        return ZCDP(self.l2_squared / (2 * self.scale * self.scale), self.delta)


@dataclass(frozen=True)
class ComposedEvent:
    """Sequential composition: the losses of the children add (in the accountant's measure)."""

    children: tuple

    def __post_init__(self) -> None:
        children = self.children
        if isinstance(children, (list, tuple)):
            children = tuple(children)
        else:
            raise InvalidEventError("a composed event needs a sequence of child events")
        for c in children:
            if not isinstance(c, (NoiseEvent, ComposedEvent)):
                raise InvalidEventError("a composed event's children must be events")
        object.__setattr__(self, "children", children)

    def leaves(self) -> tuple[NoiseEvent, ...]:
        """All noise events, depth first, in order."""
        out: list[NoiseEvent] = []
        for c in self.children:
            out.extend(c.leaves() if isinstance(c, ComposedEvent) else (c,))
        return tuple(out)


Event = Union[NoiseEvent, ComposedEvent]


def event_to_json(e: Event) -> dict[str, Any]:
    """A JSON-ready dict; Fractions as strings, so the round trip is exact."""
    if isinstance(e, NoiseEvent):
        out = {
            "type": "noise",
            "format": _FORMAT,
            "mechanism": e.mechanism,
            "statistic": e.statistic,
            "scale": str(e.scale),
            "sensitivity": None if e.sensitivity is None else str(e.sensitivity),
            "l2_squared": None if e.l2_squared is None else str(e.l2_squared),
            "cells": e.cells,
            "grid_exponent": e.grid_exponent,
            "partitions_per_unit": e.partitions_per_unit,
            "parallel": e.parallel,
        }
        if e.delta > 0:  # only when set: events without delta keep their JSON and hashes
            out["delta"] = str(e.delta)
        return out
    if isinstance(e, ComposedEvent):
        return {"type": "composed", "format": _FORMAT, "children": [event_to_json(c) for c in e.children]}
    raise InvalidEventError("not an event")


def _frac_from_json(value: Any, name: str) -> Optional[Fraction]:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidEventError(f"event field {name!r} must be an exact fraction written as a string")
    try:
        return Fraction(value)
    except (ValueError, ZeroDivisionError):
        raise InvalidEventError(f"event field {name!r} is not a fraction") from None


_NOISE_KEYS = {"type", "format", "mechanism", "statistic", "scale", "sensitivity", "l2_squared",
               "cells", "grid_exponent", "partitions_per_unit", "parallel", "delta"}


def event_from_json(d: Any) -> Event:
    """Inverse of :func:`event_to_json`; strict (unknown or missing fields are refused)."""
    if not isinstance(d, dict):
        raise InvalidEventError("an event must be a JSON object")
    if d.get("format", _FORMAT) != _FORMAT:
        raise InvalidEventError("unsupported event format version")
    kind = d.get("type")
    if kind == "noise":
        unknown = set(d) - _NOISE_KEYS
        missing = {"mechanism", "statistic", "scale", "cells", "grid_exponent",
                   "partitions_per_unit", "parallel"} - set(d)
        if unknown or missing:
            raise InvalidEventError(
                f"noise event fields: unknown {sorted(unknown)}, missing {sorted(missing)}")
        scale = _frac_from_json(d["scale"], "scale")
        if scale is None:  # the refusal NoiseEvent itself gives a null scale
            raise InvalidEventError("event field 'scale' must be an exact rational")
        return NoiseEvent(
            mechanism=d["mechanism"],
            statistic=d["statistic"],
            scale=scale,
            sensitivity=_frac_from_json(d.get("sensitivity"), "sensitivity"),
            l2_squared=_frac_from_json(d.get("l2_squared"), "l2_squared"),
            cells=d["cells"],
            grid_exponent=d["grid_exponent"],
            partitions_per_unit=d["partitions_per_unit"],
            parallel=d["parallel"],
            delta=_frac_from_json(d.get("delta"), "delta") or Fraction(0),
        )
    if kind == "composed":
        if set(d) - {"type", "format", "children"} or not isinstance(d.get("children"), list):
            raise InvalidEventError("a composed event has exactly a 'children' list")
        return ComposedEvent(tuple(event_from_json(c) for c in d["children"]))
    raise InvalidEventError("unknown event type")


def canonical_json(e: Event) -> str:
    """Stable text of an event (sorted keys, no whitespace): used in hashes and the ledger."""
    return json.dumps(event_to_json(e), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
