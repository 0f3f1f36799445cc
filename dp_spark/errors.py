"""Exceptions of dp_spark.

Every error the engine raises on purpose is a subclass of :class:`DpSparkError`.
Messages name fields, budgets and limits; they never contain data values or noisy
values (RELIABILITY: errors and logs never carry data).
This module imports nothing from the package.
"""


class DpSparkError(Exception):
    """Base class of every deliberate dp_spark error."""


class ConfigError(DpSparkError):
    """A spec, policy or environment file is invalid. Raised before data is read."""


class InvalidBudgetError(ConfigError):
    """A privacy budget value is invalid (<= 0, NaN, inf, delta >= 1, ...)."""


class InvalidBoundsError(ConfigError):
    """Contribution bounds are invalid (K < 1, inverted or non-finite clamp, ...)."""


class UnknownRelationError(ConfigError):
    """An unknown neighbour relation, privacy-unit kind or aggregate was named."""


class MeasureMismatchError(DpSparkError):
    """A charge is expressed in a measure that the budget's accountant does not use."""


class BudgetExceededError(DpSparkError):
    """A charge does not fit in what remains of a budget."""

    def __init__(self, budget_id: str, cap, spent, requested):
        self.budget_id = budget_id
        self.cap = cap
        self.spent = spent
        self.requested = requested
        super().__init__(
            f"budget {budget_id!r} exhausted: cap {cap}, spent {spent}, requested {requested}"
        )


class SchemaError(DpSparkError):
    """The input table lacks a column, or a column has the wrong type."""


class LedgerError(DpSparkError):
    """The budget ledger is unavailable, inconsistent or was tampered with."""


class LedgerIntegrityError(LedgerError):
    """A ledger row fails its integrity check (hand-edited or corrupted)."""


class LedgerUnavailableError(LedgerError):
    """The ledger database cannot be reached."""


class ReleaseConflictError(DpSparkError):
    """Another run owns the reservation of this release (its lease has not expired)."""


class PermissionDeniedError(DpSparkError):
    """The principal lacks the permission the request needs."""


class OutputSchemaError(DpSparkError):
    """An output table exists with a schema the release cannot be written into."""


class TestModeError(DpSparkError):
    """A test-only switch (seeded noise) was used outside test mode."""

    __test__ = False  # not a pytest test class


class ReleaseFailedError(DpSparkError):
    """A release failed after its charge was reserved, for a reason that is not one of the
    engine's own errors (a Spark job failure, a worker error, a bug).

    Its message is fixed: the release id, the stage and the failing exception's class, never
    the exception's text, which can carry a row's values (RELIABILITY 23). The original
    exception is not chained (``__cause__`` and ``__context__`` are None). The charge stays
    spent: a rerun of the same spec on the same snapshot reuses the reservation and draws no
    second charge (docs/ledger.md, "A release that fails after its charge")."""

    def __init__(self, release_id: str, stage: str, exception_class: str):
        self.release_id = release_id
        self.stage = stage
        self.exception_class = exception_class
        super().__init__(
            f"release {release_id[:12]} failed in stage '{stage}' ({exception_class}); the "
            "failure's text is withheld because it can contain data values; the reserved charge "
            "stays spent, and rerunning the same spec on the same input reuses it without a "
            "second charge")
