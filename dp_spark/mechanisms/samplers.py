"""Noise sources: the only place dp_spark draws noise.

Every source draws *integers* (noise in grid units, see :mod:`dp_spark.core.grid`):

* ``discrete_laplace(scale, n)``: n iid draws with P(x) proportional to exp(-|x| / scale), x in Z;
* ``discrete_gaussian(sigma, n)``: n iid draws with P(x) proportional to exp(-x^2 / (2 sigma^2)).

Sources
-------
:class:`OpenDPNoiseSource` (production, :func:`default_source`)
    OpenDP 0.16's exact samplers (Canonne, Kamath, Steinke 2020, in Rust, on the operating
    system's CSPRNG), through one vector measurement per call: ``make_laplace`` /
    ``make_gaussian`` over ``vector_domain(atom_domain(T="i64"))`` invoked on a zero vector.
    OpenDP's privacy map is *not* used: dp_spark's own calibration
    (:mod:`dp_spark.mechanisms.calibration`) decides the scale. No seed exists on this path.

    Two details the OpenDP API imposes, both handled exactly:

    * the scale is an ``f64``: the requested Fraction is rounded *up* to the next double, so
      the noise drawn is never smaller than calibrated (relative excess below 2^-52);
    * noise is added to an ``i64`` with a saturating cast, so a draw beyond +-(2^63 - 1) would
      come back clamped. A clamped draw is replaced by an exact draw from the conditional tail
      (discrete Laplace: memoryless, so X | X >= M is M + Geometric; discrete Gaussian: exact
      rejection from a geometric proposal). For sigma above 2^56 the discrete Gaussian is drawn
      wholly by the exact pure-Python CKS20 sampler below on ``secrets`` (the OS CSPRNG);
      below 2^56 a clamped Gaussian draw has probability < e^-8192 and the tail code is a guard.

:class:`SeededNoiseSource` (tests only)
    The same CKS20 algorithms written in pure Python with integer/Fraction arithmetic, driven
    by a deterministic bit stream: SHAKE-256 in counter mode keyed by the seed. Refuses to be
    built unless ``DP_SPARK_TEST_MODE=1`` (:class:`~dp_spark.errors.TestModeError`); no
    configuration field can reach it.

:class:`RecordingNoiseSource`
    Wraps a source and records each call (kind, scale, n) for grey-box replay tests.

No module here uses a general-purpose pseudo-random generator; a unit test scans the sources.
"""

from __future__ import annotations

import abc
import hashlib
import math
import os
import secrets
import threading
from collections import OrderedDict
from fractions import Fraction
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from dp_spark.core.budget import to_fraction
from dp_spark.errors import ConfigError, InvalidBudgetError, TestModeError

__all__ = [
    "DISCRETE_LAPLACE",
    "DISCRETE_GAUSSIAN",
    "KINDS",
    "NoiseCall",
    "NoiseSource",
    "OpenDPNoiseSource",
    "SeededNoiseSource",
    "RecordingNoiseSource",
    "default_source",
    "TEST_MODE_ENV",
]

DISCRETE_LAPLACE = "discrete_laplace"
DISCRETE_GAUSSIAN = "discrete_gaussian"
KINDS = (DISCRETE_LAPLACE, DISCRETE_GAUSSIAN)

TEST_MODE_ENV = "DP_SPARK_TEST_MODE"

_I64_MAX = 2**63 - 1
_I64_MIN = -(2**63)
# Above this sigma the discrete Gaussian is drawn by the pure-Python exact sampler (the
# i64 path could clamp); below it a clamped draw needs |X| > 2^63 > 128 sigma.
_GAUSSIAN_OPENDP_MAX_SIGMA = Fraction(2**56)

RandBelow = Callable[[int], int]


# ---------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------
def check_scale(value: Any, name: str) -> Fraction:
    """Exact, strictly positive, finite Fraction (InvalidBudgetError otherwise; no value in text)."""
    frac = to_fraction(value, name)  # rejects NaN, inf, bool, junk
    if frac <= 0:
        raise InvalidBudgetError(f"{name} must be > 0")
    return frac


def _check_n(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ConfigError("the number of noise draws n must be a non-negative integer")
    return n


# ---------------------------------------------------------------------------------------
# Exact CKS20 samplers (Canonne, Kamath, Steinke 2020, Algorithms 1-3), integers only.
# ``rb(m)`` returns a uniform integer in [0, m).
# ---------------------------------------------------------------------------------------
def _bernoulli_exp_le1(num: int, den: int, rb: RandBelow) -> bool:
    """Bernoulli(exp(-num/den)) for 0 <= num/den <= 1 (CKS20 Algorithm 1, first part)."""
    k = 1
    while rb(den * k) < num:  # A ~ Bernoulli(gamma / k)
        k += 1
    return k % 2 == 1


def _bernoulli_exp(num: int, den: int, rb: RandBelow) -> bool:
    """Bernoulli(exp(-num/den)) for num/den >= 0 (CKS20 Algorithm 1)."""
    while num > den:
        if not _bernoulli_exp_le1(1, 1, rb):
            return False
        num -= den
    return _bernoulli_exp_le1(num, den, rb)


def _geometric(t: int, s: int, rb: RandBelow) -> int:
    """Y >= 0 with P(Y = y) proportional to exp(-y s / t) (scale t/s; inner part of CKS20 Alg. 2)."""
    while True:
        u = rb(t)
        if _bernoulli_exp(u, t, rb):
            break
    v = 0
    while _bernoulli_exp_le1(1, 1, rb):
        v += 1
    return (u + t * v) // s


def _discrete_laplace_one(t: int, s: int, rb: RandBelow) -> int:
    """Discrete Laplace with scale t/s (CKS20 Algorithm 2)."""
    while True:
        y = _geometric(t, s, rb)
        b = rb(2)
        if b == 1 and y == 0:
            continue
        return -y if b else y


def _discrete_gaussian_one(sigma2_num: int, sigma2_den: int, rb: RandBelow) -> int:
    """Discrete Gaussian with sigma^2 = sigma2_num / sigma2_den (CKS20 Algorithm 3)."""
    # t = floor(sigma) + 1, exactly: floor(sqrt(x)) == isqrt(floor(x)) for x >= 0.
    t = math.isqrt(sigma2_num // sigma2_den) + 1
    # gamma = (|Y| - sigma^2/t)^2 / (2 sigma^2) = (|Y| Q t - P)^2 / (2 P Q t^2), sigma^2 = P/Q
    p, q = sigma2_num, sigma2_den
    den = 2 * p * q * t * t
    while True:
        y = _discrete_laplace_one(t, 1, rb)
        diff = abs(y) * q * t - p
        if _bernoulli_exp(diff * diff, den, rb):
            return y


def _laplace_tail_excess(scale: Fraction, rb: RandBelow) -> int:
    """G >= 0 with X | X >= M  ==  M + G for discrete Laplace (memorylessness of the tail)."""
    return _geometric(scale.numerator, scale.denominator, rb)


def _gaussian_tail_excess(m: int, sigma2: Fraction, rb: RandBelow) -> int:
    """G >= 0 with X | X >= m == m + G for the discrete Gaussian (m >= 1), exactly.

    Target P(g) ~ exp(-(m+g)^2 / 2s^2) = C exp(-m g / s^2) exp(-g^2 / 2s^2): propose g from the
    geometric with ratio exp(-m / s^2) (scale s^2/m) and accept with Bernoulli(exp(-g^2/2s^2)).
    """
    geo_scale = sigma2 / m
    p, q = sigma2.numerator, sigma2.denominator
    while True:
        g = _geometric(geo_scale.numerator, geo_scale.denominator, rb)
        if _bernoulli_exp(g * g * q, 2 * p, rb):
            return g


class _ShakeStream:
    """Deterministic uniform integers from SHAKE-256 in counter mode keyed by a seed."""

    _BLOCK = 4096

    def __init__(self, seed: int) -> None:
        seed_bytes = seed.to_bytes((seed.bit_length() + 8) // 8 + 1, "big", signed=True)
        self._key = hashlib.sha256(b"dp_spark.SeededNoiseSource.v1\x00" + seed_bytes).digest()
        self._counter = 0
        self._buf = b""
        self._pos = 0

    def _take(self, nbytes: int) -> bytes:
        if self._pos + nbytes > len(self._buf):
            rest = self._buf[self._pos:]
            chunks = [rest]
            have = len(rest)
            while have < nbytes:
                block = hashlib.shake_256(self._key + self._counter.to_bytes(16, "big")).digest(
                    self._BLOCK
                )
                self._counter += 1
                chunks.append(block)
                have += len(block)
            self._buf = b"".join(chunks)
            self._pos = 0
        out = self._buf[self._pos:self._pos + nbytes]
        self._pos += nbytes
        return out

    def randbelow(self, m: int) -> int:
        if m <= 1:
            return 0
        k = (m - 1).bit_length()
        nbytes = (k + 7) // 8
        shift = nbytes * 8 - k
        while True:
            r = int.from_bytes(self._take(nbytes), "big") >> shift
            if r < m:
                return r


def _os_randbelow(m: int) -> int:
    """Uniform integer in [0, m) from the operating system's CSPRNG (``secrets``)."""
    return 0 if m <= 1 else secrets.randbelow(m)


def _exact_laplace_draws(scale: Fraction, n: int, rb: RandBelow) -> list[int]:
    t, s = scale.numerator, scale.denominator
    return [_discrete_laplace_one(t, s, rb) for _ in range(n)]


def _exact_gaussian_draws(sigma: Fraction, n: int, rb: RandBelow) -> list[int]:
    sigma2 = sigma * sigma
    return [_discrete_gaussian_one(sigma2.numerator, sigma2.denominator, rb) for _ in range(n)]


# ---------------------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------------------
class NoiseCall(NamedTuple):
    """One recorded noise request: ``kind`` in KINDS, its scale (or sigma), and n."""

    kind: str
    scale: Fraction
    n: int


class NoiseSource(abc.ABC):
    """A source of exact integer noise. Implementations validate before drawing anything."""

    name: str = "abstract"

    @abc.abstractmethod
    def discrete_laplace(self, scale: Fraction, n: int) -> list[int]:
        """n iid draws, P(x) proportional to exp(-|x| / scale), x in Z."""

    @abc.abstractmethod
    def discrete_gaussian(self, sigma: Fraction, n: int) -> list[int]:
        """n iid draws, P(x) proportional to exp(-x^2 / (2 sigma^2)), x in Z."""

    def draw(self, kind: str, scale: Fraction, n: int) -> list[int]:
        """Dispatch on ``kind`` ("discrete_laplace" or "discrete_gaussian")."""
        if kind == DISCRETE_LAPLACE:
            return self.discrete_laplace(scale, n)
        if kind == DISCRETE_GAUSSIAN:
            return self.discrete_gaussian(scale, n)
        raise ConfigError(f"unknown noise kind {kind!r}; expected one of {list(KINDS)}")

    def draw_array(self, kind: str, scale: Fraction, n: int) -> np.ndarray:
        """The draws of :meth:`draw` as one numpy array: ``int64``, or ``object`` (Python ints)
        when a draw does not fit in 64 bits. The same draws, in the same order, as ``draw``."""
        return as_int_array(self.draw(kind, scale, n))

    def for_batch(self, start: int) -> "NoiseSource":
        """The source a batch of cells starting at cell ``start`` draws from on an executor
        (executor-side noise: the source is shipped to each task). A source without state
        (OpenDP's, on the OS CSPRNG) is itself; a seeded test source derives an independent
        stream per batch (:class:`SeededNoiseSource`), so batches never repeat draws."""
        return self

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


def as_int_array(values) -> np.ndarray:
    """Exact integers as an ``int64`` array, or an ``object`` array of Python ints when one
    does not fit (never a float, never a wrapped value)."""
    try:
        return np.asarray(values, dtype=np.int64)
    except OverflowError:
        return np.asarray([int(v) for v in values], dtype=object)


def float_at_least(frac: Fraction, name: str) -> float:
    """The smallest double >= frac (privacy-safe rounding of a scale)."""
    try:
        f = float(frac)
    except OverflowError:
        raise InvalidBudgetError(f"{name} exceeds the supported range") from None
    if math.isinf(f):
        raise InvalidBudgetError(f"{name} exceeds the supported range")
    if Fraction(f) < frac:
        f = math.nextafter(f, math.inf)
        if math.isinf(f):
            raise InvalidBudgetError(f"{name} exceeds the supported range")
    return f


class OpenDPNoiseSource(NoiseSource):
    """Production noise: OpenDP 0.16's exact vector samplers on the OS CSPRNG. No seed.

    One call draws n values with OpenDP invocations on zero vectors of ``i64``: one, or, for
    n of at least 2 x :data:`PARALLEL_MIN` draws, one per slice of n on up to ``threads``
    threads at once (default: the CPUs this process may run on, at most 8). OpenDP's samplers
    run outside the GIL, each invocation draws its slice i.i.d. from the OS CSPRNG, and the
    slices are concatenated in order, so the vector has the law of one invocation's. Measurements
    are cached per (kind, float scale); the domain is unsized so n does not enter the cache key.
    """

    name = "opendp"
    _CACHE_SIZE = 64
    #: the fewest draws a thread of one call is given
    PARALLEL_MIN = 1 << 14

    def __init__(self, threads: Optional[int] = None) -> None:
        import opendp.prelude as dp  # local: keeps import of the package cheap

        dp.enable_features("contrib")  # see docs/noise.md: samplers vetted, map not relied on
        self._dp = dp
        self._cache: OrderedDict[tuple[str, float], Any] = OrderedDict()
        self._lock = threading.Lock()
        if threads is None:
            threads = min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ConfigError("threads must be a positive integer")
        self.threads = threads

    def __getstate__(self) -> dict:
        # shipped to executors (executor-side noise) without its cache, lock or module: each
        # process rebuilds them (the OS CSPRNG holds no state to ship)
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()  # type: ignore[misc]

    def _measurement(self, kind: str, scale: float) -> Any:
        key = (kind, scale)
        with self._lock:
            meas = self._cache.get(key)
            if meas is not None:
                self._cache.move_to_end(key)
                return meas
        dp = self._dp
        domain = dp.vector_domain(dp.atom_domain(T="i64"))
        if kind == DISCRETE_LAPLACE:
            meas = dp.m.make_laplace(domain, dp.l1_distance(T="i64"), scale=scale)
        else:
            meas = dp.m.make_gaussian(domain, dp.l2_distance(T="i64"), scale=scale)
        with self._lock:
            self._cache[key] = meas
            while len(self._cache) > self._CACHE_SIZE:
                self._cache.popitem(last=False)
        return meas

    def _invoke(self, kind: str, scale: float, n: int) -> np.ndarray:
        """n draws as an int64 array: OpenDP on zero vectors (its buffer path, no per-element
        Python checks; numpy makes the zeros only, never randomness), sliced over threads when
        n is large (class docstring)."""
        meas = self._measurement(kind, scale)

        def one(k: int) -> np.ndarray:
            return np.asarray(meas(np.zeros(k, dtype=np.int64)), dtype=np.int64)

        parts = min(self.threads, n // self.PARALLEL_MIN)
        if parts <= 1:
            out = one(n)
        else:
            from concurrent.futures import ThreadPoolExecutor

            sizes = [n // parts + (i < n % parts) for i in range(parts)]
            with ThreadPoolExecutor(parts, thread_name_prefix="dp_spark-noise") as pool:
                out = np.concatenate(list(pool.map(one, sizes)))
        if out.shape != (n,):  # defensive: never release a short vector
            raise ConfigError("the noise library returned the wrong number of draws")
        return out

    def _vector(self, kind: str, scale: float, n: int) -> list[int]:
        return self._invoke(kind, scale, n).tolist()

    def draw_array(self, kind: str, scale: Fraction, n: int) -> np.ndarray:
        """:meth:`draw` without a Python loop over the draws when none saturated the ``i64``
        (the common case): OpenDP's vector as an ``int64`` array. A saturated draw (probability
        below e^-8192 at the scales the engine uses) takes the exact tail code of ``draw``."""
        if kind not in KINDS:
            return super().draw_array(kind, scale, n)
        scale = check_scale(scale, "sigma" if kind == DISCRETE_GAUSSIAN else "scale")
        n = _check_n(n)
        if n == 0 or (kind == DISCRETE_GAUSSIAN and scale > _GAUSSIAN_OPENDP_MAX_SIGMA):
            return super().draw_array(kind, scale, n)
        f = float_at_least(scale, "sigma" if kind == DISCRETE_GAUSSIAN else "scale")
        out = self._invoke(kind, f, n)
        if bool(np.any((out == _I64_MAX) | (out == _I64_MIN))):
            return as_int_array(self._fix_saturated(kind, out.tolist(), f))
        return out

    def _fix_saturated(self, kind: str, draws: list[int], f: float) -> list[int]:
        """Replace each draw OpenDP saturated at +-(2^63 - 1) by an exact draw from its tail."""
        if kind == DISCRETE_LAPLACE:
            exact_scale = Fraction(f)
            for i, x in enumerate(draws):
                # Saturated: the true draw is X >= 2^63 - 1 (or <= -2^63); redraw its tail exactly.
                if x == _I64_MAX:
                    draws[i] = _I64_MAX + _laplace_tail_excess(exact_scale, _os_randbelow)
                elif x == _I64_MIN:
                    draws[i] = _I64_MIN - _laplace_tail_excess(exact_scale, _os_randbelow)
            return draws
        sigma2 = Fraction(f) ** 2
        for i, x in enumerate(draws):
            if x == _I64_MAX:
                draws[i] = _I64_MAX + _gaussian_tail_excess(_I64_MAX, sigma2, _os_randbelow)
            elif x == _I64_MIN:
                draws[i] = _I64_MIN - _gaussian_tail_excess(-_I64_MIN, sigma2, _os_randbelow)
        return draws

    def discrete_laplace(self, scale: Fraction, n: int) -> list[int]:
        scale = check_scale(scale, "scale")
        n = _check_n(n)
        if n == 0:
            return []
        f = float_at_least(scale, "scale")
        draws = self._vector(DISCRETE_LAPLACE, f, n)
        return self._fix_saturated(DISCRETE_LAPLACE, draws, f)

    def discrete_gaussian(self, sigma: Fraction, n: int) -> list[int]:
        sigma = check_scale(sigma, "sigma")
        n = _check_n(n)
        if n == 0:
            return []
        if sigma > _GAUSSIAN_OPENDP_MAX_SIGMA:
            f = float_at_least(sigma, "sigma")
            return _exact_gaussian_draws(Fraction(f), n, _os_randbelow)
        f = float_at_least(sigma, "sigma")
        return self._fix_saturated(DISCRETE_GAUSSIAN, self._vector(DISCRETE_GAUSSIAN, f, n), f)


class SeededNoiseSource(NoiseSource):
    """Test-only deterministic exact CKS20 sampler (pure Python, SHAKE-256 counter stream).

    Raises :class:`~dp_spark.errors.TestModeError` unless ``DP_SPARK_TEST_MODE=1``. The same
    seed and the same sequence of calls give the same draws. Slow (tens of microseconds per
    draw): meant for tests, replay and small examples, never for releases.
    """

    name = "seeded-cks20"

    def __init__(self, seed: int) -> None:
        if os.environ.get(TEST_MODE_ENV) != "1":
            raise TestModeError(
                f"SeededNoiseSource is test-only: set {TEST_MODE_ENV}=1 in a test environment"
            )
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError("the test seed must be an integer")
        self.seed = seed
        self._stream = _ShakeStream(seed)

    def for_batch(self, start: int) -> "SeededNoiseSource":
        """An independent seeded stream for the batch of cells starting at ``start``: the seed
        is derived from (this seed, start) by SHAKE-256, so a release noised in batches on the
        executors is reproducible and no two batches share draws."""
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ConfigError("a batch starts at a cell index >= 0")
        digest = hashlib.shake_256(f"dp_spark-batch:{self.seed}:{start}".encode()).digest(16)
        return SeededNoiseSource(int.from_bytes(digest, "big"))

    def discrete_laplace(self, scale: Fraction, n: int) -> list[int]:
        scale = check_scale(scale, "scale")
        n = _check_n(n)
        return _exact_laplace_draws(scale, n, self._stream.randbelow)

    def discrete_gaussian(self, sigma: Fraction, n: int) -> list[int]:
        sigma = check_scale(sigma, "sigma")
        n = _check_n(n)
        return _exact_gaussian_draws(sigma, n, self._stream.randbelow)


class RecordingNoiseSource(NoiseSource):
    """Wraps another source; records every call as a :class:`NoiseCall` in ``calls``.

    The recorded scale is the validated exact Fraction. Calls that fail validation are not
    recorded (nothing was drawn).
    """

    def __init__(self, inner: NoiseSource) -> None:
        if not isinstance(inner, NoiseSource):
            raise ConfigError("RecordingNoiseSource wraps a NoiseSource")
        self.inner = inner
        self.name = f"recording({inner.name})"
        self.calls: list[NoiseCall] = []

    def discrete_laplace(self, scale: Fraction, n: int) -> list[int]:
        scale = check_scale(scale, "scale")
        n = _check_n(n)
        out = self.inner.discrete_laplace(scale, n)
        self.calls.append(NoiseCall(DISCRETE_LAPLACE, scale, n))
        return out

    def discrete_gaussian(self, sigma: Fraction, n: int) -> list[int]:
        sigma = check_scale(sigma, "sigma")
        n = _check_n(n)
        out = self.inner.discrete_gaussian(sigma, n)
        self.calls.append(NoiseCall(DISCRETE_GAUSSIAN, sigma, n))
        return out


_DEFAULT: OpenDPNoiseSource | None = None
_DEFAULT_LOCK = threading.Lock()


def default_source() -> NoiseSource:
    """The production source, an :class:`OpenDPNoiseSource` (shared; it holds no seed)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = OpenDPNoiseSource()
        return _DEFAULT
