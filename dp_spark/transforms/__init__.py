"""Pure DataFrame -> DataFrame transforms: minimisation, special values, bounding, clamping.

See :mod:`dp_spark.transforms.bounding` for the pipeline and the policies.
"""

from dp_spark.transforms.bounding import (
    MAX_FIXED_POINT_MAGNITUDE,
    TEMP_PREFIX,
    apply_value_policy,
    bound_contributions,
    clamp_to_fixed_point,
    dedupe_unit_partition,
    drop_null_units,
    keep_unique_events,
    restrict_to_public_keys,
    select_columns,
    validate_public_keys,
)

__all__ = [
    "MAX_FIXED_POINT_MAGNITUDE",
    "TEMP_PREFIX",
    "apply_value_policy",
    "bound_contributions",
    "clamp_to_fixed_point",
    "dedupe_unit_partition",
    "drop_null_units",
    "keep_unique_events",
    "restrict_to_public_keys",
    "select_columns",
    "validate_public_keys",
]
