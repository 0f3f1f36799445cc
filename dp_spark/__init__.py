"""dp_spark: central differential-privacy releases on Spark, written to Delta tables.

Importing the package loads no pyspark: the privacy core (budgets, units, events,
accountant, mechanisms, config) runs on any driver, Spark Connect included.
"""

__version__ = "0.1.0"
