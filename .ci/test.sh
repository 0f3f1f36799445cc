#!/usr/bin/env bash
# Runs the whole test suite. Starts a throwaway PostgreSQL on loopback for the ledger
# tests unless DP_SPARK_TEST_PG_DSN already points at one. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export PYSPARK_PYTHON="$(pwd)/$PY" PYSPARK_DRIVER_PYTHON="$(pwd)/$PY" SPARK_LOCAL_IP=127.0.0.1
export DP_SPARK_TEST_MODE=1
if [ -z "${DP_SPARK_TEST_PG_DSN:-}" ]; then
  # shellcheck source=.ci/postgres.sh
  source .ci/postgres.sh
  pg_start
  trap pg_stop EXIT
fi
set +e
"$PY" -m pytest -q -rs "$@"
rc=$?
set -e
# pytest exit 5 = no tests collected: that is a failure for us, not a pass.
exit $rc
