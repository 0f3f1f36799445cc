"""Backends computing a release plan's exact partials: ``local`` (pure Python, the reference for
tests and exploration; no pyspark). The Spark pass is ``dp_spark.backends.spark``."""
