"""Privacy budgets with exact arithmetic.

Three measures, one class each, all frozen and validated on construction:

* :class:`PureDP` (epsilon[, delta])   -- epsilon-DP, basic composition adds epsilons; with
  ``delta > 0`` it is (epsilon, delta)-DP under basic composition (epsilons and deltas add);
* :class:`ZCDP` (rho[, delta])         -- rho-zero-concentrated DP, composition adds rhos; with
  ``delta > 0`` it is delta-approximate rho-zCDP (Bun & Steinke 2016, Def. 8.1), composition
  adds rhos and deltas (ibid., Lemma 8.3);
* :class:`ApproxDP` (epsilon, delta)   -- (epsilon, delta)-DP, basic composition adds both.

The optional ``delta`` of PureDP and ZCDP (default 0, ``0 <= delta < 1``) is what a thresholded
mechanism (private partition selection) spends besides its pure or zCDP part. It is written
in JSON (``to_json``) and in ``str()`` only when it is > 0, so every amount without delta keeps
the JSON (and so the release ids, ledger MACs and policy hashes) it had before delta existed.

Values are :class:`fractions.Fraction`. A float is read through its shortest decimal
representation (``repr``), so ``0.1`` is exactly 1/10 and ``0.1 + 0.2 == 0.3`` holds
(RELIABILITY 21). Strings such as ``"0.1"`` or ``"1/3"`` are accepted too.

A budget used as a *cap* or a *request* must be strictly positive; a *spent* amount may be
zero (``PureDP.zero()``). Arithmetic across measures is refused with
:class:`~dp_spark.errors.MeasureMismatchError`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from numbers import Rational
from typing import Any, Callable, ClassVar, Self, Union

from dp_spark.errors import InvalidBudgetError, MeasureMismatchError

Number = Union[int, float, str, Fraction]


def to_fraction(value: Any, name: str) -> Fraction:
    """Exact Fraction from an int, float (via its shortest repr), str or Fraction.

    Raises InvalidBudgetError for NaN, infinities, booleans and unparsable strings. The
    message names the field only.
    """
    if isinstance(value, bool):
        raise InvalidBudgetError(f"{name} must be a number, not a boolean")
    if isinstance(value, Fraction):
        return value
    if isinstance(value, Rational):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidBudgetError(f"{name} must be finite")
        return Fraction(repr(value))
    if isinstance(value, str):
        text = value.strip()
        try:
            frac = Fraction(text)
        except (ValueError, ZeroDivisionError):
            try:
                as_float = float(text)
            except ValueError:
                raise InvalidBudgetError(f"{name} is not a number") from None
            return to_fraction(as_float, name)
        return frac
    raise InvalidBudgetError(f"{name} must be a number")


def _check(value: Fraction, name: str, *, allow_zero: bool, below_one: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise InvalidBudgetError(f"{name} must be {'>= 0' if allow_zero else '> 0'}")
    if below_one and value >= 1:
        raise InvalidBudgetError(f"{name} must be < 1")


@dataclass(frozen=True)
class _Budget:
    MEASURE: ClassVar[str] = ""
    FIELDS: ClassVar[tuple[str, ...]] = ()
    # fields left out of to_json/str/as_floats when zero (and read as 0 when absent)
    OPTIONAL: ClassVar[tuple[str, ...]] = ()

    # --- arithmetic -------------------------------------------------------------------
    def _same(self, other: Any) -> None:
        if type(other) is not type(self):
            raise MeasureMismatchError(
                f"cannot combine a {self.MEASURE} amount with a "
                f"{getattr(other, 'MEASURE', type(other).__name__)} amount"
            )

    def _values(self) -> tuple[Fraction, ...]:
        return tuple(getattr(self, f) for f in self.FIELDS)

    def __add__(self, other: "_Budget") -> Self:
        self._same(other)
        return self._build(*(a + b for a, b in zip(self._values(), other._values())))

    def __sub__(self, other: "_Budget") -> Self:
        self._same(other)
        return self._build(*(max(a - b, Fraction(0)) for a, b in zip(self._values(), other._values())))

    def __mul__(self, k: int) -> Self:
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise InvalidBudgetError("a budget can only be multiplied by a non-negative integer")
        return self._build(*(v * k for v in self._values()))

    __rmul__ = __mul__

    def fits_in(self, cap: "_Budget") -> bool:
        """True when every component of self is <= the cap's (exact)."""
        self._same(cap)
        return all(a <= b for a, b in zip(self._values(), cap._values()))

    def __le__(self, other: "_Budget") -> bool:
        return self.fits_in(other)

    def __lt__(self, other: "_Budget") -> bool:
        return self.fits_in(other) and self != other

    def is_zero(self) -> bool:
        return all(v == 0 for v in self._values())

    @classmethod
    def _build(cls, *values: Fraction) -> Self:
        obj = object.__new__(cls)
        for f, v in zip(cls.FIELDS, values):
            object.__setattr__(obj, f, Fraction(v))
        return obj

    @classmethod
    def zero(cls) -> Self:
        return cls._build(*(Fraction(0) for _ in cls.FIELDS))

    # --- serialisation ----------------------------------------------------------------
    def _shown(self) -> list[tuple[str, Fraction]]:
        """(field, value) pairs, without an optional field that is zero."""
        return [(f, v) for f, v in zip(self.FIELDS, self._values()) if v != 0 or f not in self.OPTIONAL]

    def to_json(self) -> dict[str, str]:
        out = {"measure": self.MEASURE}
        out.update({f: str(v) for f, v in self._shown()})
        return out

    def as_floats(self) -> dict[str, float]:
        return {f: float(v) for f, v in self._shown()}

    @property
    def delta_part(self) -> Fraction:
        """The delta this amount carries (0 when it has none)."""
        return Fraction(getattr(self, "delta", 0))

    def __str__(self) -> str:
        parts = ", ".join(f"{f}={float(v):.6g}" for f, v in self._shown())
        return f"{self.MEASURE}({parts})"


@dataclass(frozen=True)
class PureDP(_Budget):
    """Pure epsilon-DP. ``PureDP(1)`` is a cap or request; ``PureDP.zero()`` an empty spend.

    ``PureDP(1, delta=1e-8)`` is (1, 1e-8)-DP (a thresholded Laplace mechanism); deltas add
    under basic composition like epsilons.
    """

    epsilon: Fraction
    delta: Fraction = Fraction(0)
    MEASURE: ClassVar[str] = "pure_dp"
    FIELDS: ClassVar[tuple[str, ...]] = ("epsilon", "delta")
    OPTIONAL: ClassVar[tuple[str, ...]] = ("delta",)

    def __post_init__(self) -> None:
        eps = to_fraction(self.epsilon, "epsilon")
        delta = to_fraction(self.delta, "delta")
        _check(eps, "epsilon", allow_zero=False)
        _check(delta, "delta", allow_zero=True, below_one=True)
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "delta", delta)


@dataclass(frozen=True)
class ZCDP(_Budget):
    """rho-zCDP (Bun & Steinke 2016). Composition adds rho.

    ``ZCDP(rho, delta)`` with ``delta > 0`` is delta-approximate rho-zCDP (Bun & Steinke 2016,
    Def. 8.1); composition adds rho and delta. Its (epsilon, delta') statement is the rho part
    converted at a stated delta, plus the delta part (``Accountant.statement``).
    """

    rho: Fraction
    delta: Fraction = Fraction(0)
    MEASURE: ClassVar[str] = "zcdp"
    FIELDS: ClassVar[tuple[str, ...]] = ("rho", "delta")
    OPTIONAL: ClassVar[tuple[str, ...]] = ("delta",)

    def __post_init__(self) -> None:
        rho = to_fraction(self.rho, "rho")
        delta = to_fraction(self.delta, "delta")
        _check(rho, "rho", allow_zero=False)
        _check(delta, "delta", allow_zero=True, below_one=True)
        object.__setattr__(self, "rho", rho)
        object.__setattr__(self, "delta", delta)


@dataclass(frozen=True)
class ApproxDP(_Budget):
    """(epsilon, delta)-DP; basic composition adds epsilons and deltas. 0 <= delta < 1."""

    epsilon: Fraction
    delta: Fraction
    MEASURE: ClassVar[str] = "approx_dp"
    FIELDS: ClassVar[tuple[str, ...]] = ("epsilon", "delta")

    def __post_init__(self) -> None:
        eps = to_fraction(self.epsilon, "epsilon")
        delta = to_fraction(self.delta, "delta")
        _check(eps, "epsilon", allow_zero=False)
        _check(delta, "delta", allow_zero=True, below_one=True)
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "delta", delta)


Budget = Union[PureDP, ZCDP, ApproxDP]
MEASURES: dict[str, type[Budget]] = {c.MEASURE: c for c in (PureDP, ZCDP, ApproxDP)}


def budget_from_json(data: dict[str, Any]) -> Budget:
    """Inverse of ``to_json``. Zero amounts are accepted (a spent total may be zero).

    An optional field (the ``delta`` of pure_dp and zcdp) may be absent: it reads as 0.
    """
    try:
        cls = MEASURES[data["measure"]]
    except (KeyError, TypeError):
        raise InvalidBudgetError("unknown or missing budget measure") from None
    values = []
    for f in cls.FIELDS:
        if f not in data:
            if f in cls.OPTIONAL:
                values.append(Fraction(0))
                continue
            raise InvalidBudgetError(f"budget field {f!r} is missing")
        v = to_fraction(data[f], f)
        if v < 0:
            raise InvalidBudgetError(f"{f} must be >= 0")
        if f == "delta" and v >= 1:
            raise InvalidBudgetError("delta must be < 1")
        values.append(v)
    return cls._build(*values)


def parse_budget(measure: str, **values: Number) -> Budget:
    """Build a strictly positive budget from a measure name and its fields (config path)."""
    try:
        cls = MEASURES[measure]
    except KeyError:
        raise InvalidBudgetError(
            f"unknown measure {measure!r}; expected one of {sorted(MEASURES)}"
        ) from None
    missing = [f for f in cls.FIELDS if f not in values and f not in cls.OPTIONAL]
    extra = [k for k in values if k not in cls.FIELDS]
    if missing or extra:
        raise InvalidBudgetError(
            f"measure {measure!r} takes fields {list(cls.FIELDS)}; missing {missing}, unexpected {extra}"
        )
    # the fields are declared as Fractions (what they hold once built); the constructors take
    # any Number and convert it with to_fraction in __post_init__
    build: Callable[..., Budget] = cls
    return build(**values)
