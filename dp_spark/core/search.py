"""Integer search for the thresholds and half-widths computed from exact tails."""

from __future__ import annotations

from typing import Callable


def smallest_passing(ok: Callable[[int], bool], guess: int) -> int:
    """The smallest integer ``k >= 1`` with ``ok(k)``, for ``ok`` monotone (false, then true
    from some ``k`` on); ``ok(0)`` is taken as false. Doubles from ``guess`` until ``ok`` holds,
    then bisects: O(log k) calls of ``ok``."""
    hi = max(1, guess)
    while not ok(hi):
        hi *= 2
    lo = 0  # invariant: not ok(lo), ok(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi
