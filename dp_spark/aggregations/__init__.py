"""One bounded Spark pass for every statistic of a release: partials per key tuple.

See :mod:`dp_spark.aggregations.query` (``build_query_partials``, ``collect_query_partials``).
"""
