"""THE spec, pure (no pyspark): the frozen pydantic v2 models of a release spec
(:mod:`dp_spark.spec.release`, its field types :mod:`dp_spark.core.fields`) and of an env file
(:mod:`dp_spark.spec.env`); the validated spec the engine reads and its identity
(:mod:`dp_spark.spec.runtime`); the single-``metric`` rewrite (:mod:`dp_spark.spec.legacy`);
the ``where`` allow-list (:mod:`dp_spark.spec.where`); the JSON Schema and the docs tables
generated from the models (:mod:`dp_spark.spec.schema`)."""
