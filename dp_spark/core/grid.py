"""The fixed-point grid 2^k on which every value is summed and every output is released.

A real value v is represented by the integer n = round(v * 2^-k) (value = n * 2^k, k <= 0).
Noise is an exact integer draw in the same units, so a release is (n_true + noise) * 2^k:
its set of possible values is the grid 2^k Z whatever the data (Mironov 2012; Haney et al.
2022: true values 0, 1 and 2^40 all release on the same grid).

The exponent is chosen from the PUBLIC clamp bounds only (never from data):

    k = max(GRID_FINEST_EXPONENT, e - max_bits),  e = the smallest integer with 2^e >= max(|L|, |U|)

i.e. the finest grid not finer than 2^-20 such that max(|L|, |U|) * 2^-k <= 2^max_bits. With
the default max_bits = 52, a clamped value in grid units is an integer a double holds exactly,
and K <= 2^10 of them per unit stay within 2^62 (the aggregation layer owns overflow of the
totals; see RELIABILITY 8). Coarser grids (k > -20) appear only for bounds above 2^32. A bound
beyond 2^max_bits
would need k > 0 (a grid coarser than 1), which is refused with InvalidBoundsError.
"""

from __future__ import annotations

import math
from fractions import Fraction
from numbers import Rational
from typing import Optional, Union

from dp_spark.errors import InvalidBoundsError

__all__ = [
    "EXACT_INT",
    "dyadic",
    "GRID_DEFAULT_EXPONENT",
    "GRID_FINEST_EXPONENT",
    "grid_exponent_for",
    "to_grid",
    "from_grid",
    "on_grid",
]

GRID_FINEST_EXPONENT = -20
"""The finest grid ever used: 2^-20 (about 1e-6), finer than any reported precision."""

GRID_DEFAULT_EXPONENT = GRID_FINEST_EXPONENT
"""The exponent used when bounds are small (|bound| <= 2^32 with max_bits = 52)."""

Real = Union[int, float, Fraction]


def _exact(value: Real, name: str) -> Fraction:
    """Exact rational value of an int, Fraction or finite float (a float's binary value)."""
    if isinstance(value, bool):
        raise InvalidBoundsError(f"{name} must be a number, not a boolean")
    if isinstance(value, Fraction):
        return value
    if isinstance(value, Rational):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidBoundsError(f"{name} must be finite")
        return Fraction(value)
    raise InvalidBoundsError(f"{name} must be an int, float or Fraction")


def _check_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k > 0:
        raise InvalidBoundsError("the grid exponent k must be an integer <= 0")
    return k


def grid_exponent_for(lower: Real, upper: Real, *, max_bits: int = 52) -> int:
    """Grid exponent k <= 0 for clamp bounds [lower, upper] (public), see the module docstring.

    Raises InvalidBoundsError for non-finite or inverted bounds, a bad max_bits, or bounds
    too large to fit max_bits bits at k = 0.
    """
    if isinstance(max_bits, bool) or not isinstance(max_bits, int) or not 1 <= max_bits <= 62:
        raise InvalidBoundsError("max_bits must be an integer in [1, 62]")
    lo = _exact(lower, "lower bound")
    hi = _exact(upper, "upper bound")
    if lo > hi:
        raise InvalidBoundsError("the lower clamp bound exceeds the upper bound")
    m = max(abs(lo), abs(hi))
    if m == 0:
        return GRID_FINEST_EXPONENT
    # smallest e with 2^e >= m, exactly
    e = m.numerator.bit_length() - m.denominator.bit_length()
    while Fraction(2) ** e < m:
        e += 1
    while Fraction(2) ** (e - 1) >= m:
        e -= 1
    k = max(GRID_FINEST_EXPONENT, e - max_bits)
    if k > 0:
        raise InvalidBoundsError(
            f"clamp bounds exceed 2^{max_bits} in absolute value; the integer grid cannot hold them"
        )
    return k


def to_grid(value: Real, k: int) -> int:
    """round(value * 2^-k), ties to even, exactly (a float is read at its binary value)."""
    k = _check_k(k)
    v = _exact(value, "value")
    return round(v * (1 << -k))


def from_grid(n: int, k: int) -> Fraction:
    """The exact real value n * 2^k."""
    k = _check_k(k)
    if isinstance(n, bool) or not isinstance(n, int):
        raise InvalidBoundsError("a grid value must be an integer")
    return Fraction(n, 1 << -k)


def on_grid(value: Real, k: int) -> bool:
    """True when value * 2^-k is an integer (the value lies on the grid 2^k)."""
    k = _check_k(k)
    v = _exact(value, "value") * (1 << -k)
    return v.denominator == 1


#: integers of magnitude below this are exact doubles
EXACT_INT = 2**53


def dyadic(x: Real) -> Optional[tuple[int, int]]:
    """``x`` as (m, e) with x = m 2^e exactly, or None when its denominator is not a power of 2."""
    x = Fraction(x)
    d = x.denominator
    if d & (d - 1):
        return None
    return x.numerator, -(d.bit_length() - 1)
