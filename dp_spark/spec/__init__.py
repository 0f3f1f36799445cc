"""The release spec's pure checks (no pyspark): :mod:`dp_spark.spec.where`, the allow-list
of a ``where`` predicate."""
