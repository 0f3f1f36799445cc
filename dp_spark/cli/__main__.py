"""``python -m dp_spark.cli ...``: the same as ``dp-spark ...``."""

import sys

from dp_spark.cli import main

sys.exit(main())
