"""One accountant per budget: prices events in one measure, composes, checks, states.

Measures (one per budget, fixed when the budget is created):

* ``pure_dp``  -- epsilon (and delta); basic composition adds epsilons and deltas. Gaussian
  events are refused (:class:`~dp_spark.errors.MeasureMismatchError`): a Gaussian has no
  pure-DP guarantee.
* ``zcdp``     -- rho (and delta); composition adds rho and delta. A pure epsilon-DP event
  costs rho = epsilon^2 / 2 (Bun & Steinke 2016, Prop. 1.4), exact; a thresholded Laplace
  event (epsilon, delta) costs ``ZCDP(epsilon^2 / 2, delta)``: delta-approximate zCDP (Bun &
  Steinke 2016, Def. 8.1: with probability 1 - delta the pure part holds). The published
  (epsilon, delta) statement converts the rho part with OpenDP at the budget's stated delta
  and adds the delta spent (:func:`Accountant.statement`).
* ``approx_dp`` -- (epsilon, delta), basic composition. Only Laplace events are priced here
  (a Laplace event costs ``ApproxDP(epsilon, its delta)``); Gaussian events are refused: budgets for
  Gaussian releases are zCDP budgets, converted to (epsilon, delta) only in the statement.
  Converting each Gaussian release to (epsilon, delta) and adding would be valid but much
  looser than adding rho, and would force a per-release delta split.

Adaptive composition (RELIABILITY 22). Analysts choose later epsilons after seeing earlier
outputs. Summing the epsilons (or rhos) of an adaptively chosen sequence is still a valid
bound when the sequence is stopped by a *privacy filter*: before each charge, refuse it if
spent + requested would exceed the cap (Rogers, Roth, Ullman, Vadhan 2016 for pure DP and
basic composition; Feldman & Zrnic 2021 / Whitehouse et al. 2023 for Renyi DP and zCDP).
The ledger's check-before-commit (:meth:`Accountant.check`, applied atomically at the end of
the log) is exactly that filter, with exact Fraction arithmetic; :class:`PrivacyFilter`
is the same rule in memory. Advanced composition of adaptively chosen epsilons is *not* a
filter in general and is not offered.

Nothing here imports pyspark.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Iterable, Optional

from dp_spark.core.budget import ApproxDP, Budget, MEASURES, PureDP, ZCDP, to_fraction
from dp_spark.errors import BudgetExceededError, ConfigError, InvalidBudgetError, MeasureMismatchError
from dp_spark.core.events import ComposedEvent, Event, LAPLACE, NoiseEvent

__all__ = ["Accountant", "PrivacyFilter", "DeltaCapExceededError", "budget_exceeded"]


class DeltaCapExceededError(BudgetExceededError):
    """A charge's delta does not fit in what remains of the budget's delta cap.

    When the cap's delta is 0 the message names the policy field to add (``delta_cap``)."""

    def __init__(self, budget_id: str, cap: Budget, spent: Budget, requested: Budget):
        super().__init__(budget_id, cap, spent, requested)
        cap_delta, spent_delta, asked = cap.delta_part, spent.delta_part, requested.delta_part
        if cap_delta == 0:
            text = (f"budget {budget_id!r} has delta_cap 0: a release that spends delta (private keys) "
                    f"needs `delta_cap:` in budgets.{budget_id} of the policy file "
                    f"(requested delta {float(asked):.6g})")
        else:
            text = (f"budget {budget_id!r}: delta exhausted: delta_cap {float(cap_delta):.6g}, "
                    f"delta spent {float(spent_delta):.6g}, remaining "
                    f"{float(max(cap_delta - spent_delta, Fraction(0))):.6g}, requested {float(asked):.6g}")
        self.args = (text,)


def budget_exceeded(budget_id: str, cap: Budget, spent: Budget, request: Budget) -> BudgetExceededError:
    """The error for a request that does not fit: a :class:`DeltaCapExceededError` when the
    delta is what does not fit (and the rest does), else a plain BudgetExceededError. Messages
    carry budget amounts only, never data or noisy values."""
    if spent.delta_part + request.delta_part > cap.delta_part:
        return DeltaCapExceededError(budget_id, cap, spent, request)
    return BudgetExceededError(budget_id, cap, spent, request)


class Accountant:
    """Composes DP events under one measure. Stateless: the ledger holds what was spent.

    ``Accountant("pure_dp")``, ``Accountant("approx_dp")``, or
    ``Accountant("zcdp", statement_delta=Fraction(1, 10**6))`` (the delta is needed only for
    the published (epsilon, delta) statement; the spend itself is rho).
    """

    def __init__(self, measure: str, statement_delta: Any = None):
        if measure not in MEASURES:
            raise ConfigError(f"unknown accountant measure; expected one of {sorted(MEASURES)}")
        self.measure = measure
        self.budget_type = MEASURES[measure]
        if statement_delta is not None:
            if measure != "zcdp":
                raise ConfigError("statement_delta is only meaningful for a zcdp accountant")
            delta = to_fraction(statement_delta, "statement_delta")
            if not (0 < delta < 1):
                raise InvalidBudgetError("statement_delta must be in (0, 1)")
            statement_delta = delta
        self.statement_delta: Optional[Fraction] = statement_delta

    def __repr__(self) -> str:
        extra = "" if self.statement_delta is None else f", statement_delta={self.statement_delta}"
        return f"Accountant({self.measure!r}{extra})"

    def zero(self) -> Budget:
        return self.budget_type.zero()

    # --- pricing --------------------------------------------------------------------------
    def cost(self, event: Event) -> Budget:
        """The loss of ``event`` in this accountant's measure (exact)."""
        if isinstance(event, ComposedEvent):
            return self.compose(event.children)
        if not isinstance(event, NoiseEvent):
            raise ConfigError("the accountant prices DP events only")
        natural = event.natural_cost()
        if self.measure == "pure_dp":
            if event.mechanism != LAPLACE:
                raise MeasureMismatchError(
                    "a discrete_gaussian event has no pure-DP cost; use a zcdp budget")
            return natural
        if self.measure == "zcdp":
            if isinstance(natural, PureDP):  # a Laplace event
                eps = natural.epsilon
                return ZCDP(eps * eps / 2, natural.delta)
            return natural
        # approx_dp
        if not isinstance(natural, PureDP):  # a Gaussian event
            raise MeasureMismatchError(
                "Gaussian releases are accounted in zCDP; an approx_dp budget takes Laplace events only")
        return ApproxDP(natural.epsilon, natural.delta)

    def compose(self, events: Iterable[Event]) -> Budget:
        """Sequential composition: the sum of the costs (zero for no events)."""
        total = self.zero()
        for e in events:
            total = total + self.cost(e)
        return total

    # --- the filter -------------------------------------------------------------------------
    def _own(self, amount: Budget, name: str) -> None:
        if type(amount) is not self.budget_type:
            raise MeasureMismatchError(
                f"{name} is not in this accountant's measure ({self.measure})")

    def check(self, spent: Budget, request: Budget, cap: Budget, budget_id: str = "") -> None:
        """Raise BudgetExceededError unless spent + request fits in cap (exact, per component)."""
        self._own(spent, "spent")
        self._own(request, "request")
        self._own(cap, "cap")
        if not (spent + request).fits_in(cap):
            raise budget_exceeded(budget_id, cap, spent, request)

    def remaining(self, spent: Budget, cap: Budget) -> Budget:
        self._own(spent, "spent")
        self._own(cap, "cap")
        return cap - spent

    # --- the published statement ----------------------------------------------------------
    def statement(self, total: Budget) -> dict[str, Any]:
        """The (epsilon, delta) statement of a total spend.

        Keys: ``measure``; ``epsilon`` and ``delta`` as floats (for display and the release
        metadata); the exact amounts as strings: ``epsilon_exact``/``delta_exact`` (pure and
        approx), ``rho_exact``/``delta_exact`` (zcdp). For zcdp, ``epsilon`` is OpenDP's
        conversion of rho at the stated delta
        (``dp_spark.mechanisms.calibration.zcdp_to_approx_epsilon``), a valid upper bound.

        With a delta spent (``total.delta > 0``, pure_dp or zcdp) two more keys are set,
        ``delta_spent``/``delta_spent_exact``, and the stated delta includes it:

        * pure_dp: (epsilon, delta spent)-DP by basic composition;
        * zcdp: delta_s-approximate rho-zCDP is (epsilon, delta_stmt + delta_s)-DP, where
          epsilon is the conversion of rho at delta_stmt (Bun & Steinke 2016, Def. 8.1 and
          Prop. 1.3 applied to the zCDP part, which holds except on an event of probability
          delta_s). This is what OpenDP 0.16's ``make_zCDP_to_approxDP`` does for an
          ``Approximate(ZeroConcentratedDivergence)`` measurement: the profile of rho, plus the
          approximate part's delta added unchanged.
        """
        self._own(total, "total")
        out: dict[str, Any] = {"measure": self.measure}
        spent_delta = total.delta_part
        # _own made type(total) this accountant's budget type, so the measure names the class
        if isinstance(total, PureDP):
            out.update(epsilon=float(total.epsilon), delta=float(spent_delta),
                       epsilon_exact=str(total.epsilon), delta_exact=str(spent_delta))
        elif isinstance(total, ApproxDP):
            out.update(epsilon=float(total.epsilon), delta=float(total.delta),
                       epsilon_exact=str(total.epsilon), delta_exact=str(total.delta))
        else:
            if self.statement_delta is None:
                raise ConfigError("a zcdp accountant needs statement_delta for an (epsilon, delta) statement")
            if total.rho == 0:
                eps = 0.0
            else:
                from dp_spark.mechanisms.calibration import zcdp_to_approx_epsilon
                eps = float(zcdp_to_approx_epsilon(total.rho, self.statement_delta))
            stated = self.statement_delta + spent_delta
            out.update(epsilon=eps, delta=float(stated),
                       rho_exact=str(total.rho), delta_exact=str(stated))
        if self.measure != "approx_dp" and spent_delta > 0:
            out.update(delta_spent=float(spent_delta), delta_spent_exact=str(spent_delta))
        return out


class PrivacyFilter:
    """In-memory privacy filter: charges are accepted while the sum fits the cap.

    The ledger applies the same rule durably and atomically; this class is the reference
    for tests and for single-process exploration. A refused charge spends nothing.
    """

    def __init__(self, accountant: Accountant, cap: Budget, budget_id: str = ""):
        accountant._own(cap, "cap")
        self.accountant = accountant
        self.cap = cap
        self.budget_id = budget_id
        self.spent: Budget = accountant.zero()
        self.events: list[Event] = []

    def charge(self, event: Event) -> Budget:
        """Price ``event``, refuse it if it does not fit, else record it. Returns its cost."""
        cost = self.accountant.cost(event)
        self.accountant.check(self.spent, cost, self.cap, self.budget_id)
        self.spent = self.spent + cost
        self.events.append(event)
        return cost

    def charge_budget(self, request: Budget) -> None:
        """Charge an amount directly (a reservation of a budget share)."""
        self.accountant.check(self.spent, request, self.cap, self.budget_id)
        self.spent = self.spent + request

    @property
    def remaining(self) -> Budget:
        return self.cap - self.spent
