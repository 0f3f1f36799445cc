#!/usr/bin/env bash
# Runs the whole test suite. Starts what the tests need, on loopback, unless the env already
# points at one: a throwaway PostgreSQL (ledger tests), a Spark standalone master and worker
# (cluster test) and a Spark Connect server (Connect test). Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export PYSPARK_PYTHON="$(pwd)/$PY" PYSPARK_DRIVER_PYTHON="$(pwd)/$PY" SPARK_LOCAL_IP=127.0.0.1
export DP_SPARK_TEST_MODE=1
# shellcheck source=.ci/postgres.sh
source .ci/postgres.sh
# shellcheck source=.ci/cluster.sh
source .ci/cluster.sh
# shellcheck source=.ci/connect.sh
source .ci/connect.sh
cleanup() { connect_stop; cluster_stop; pg_stop; }
trap cleanup EXIT
[ -n "${DP_SPARK_TEST_PG_DSN:-}" ] || pg_start
[ -n "${DP_SPARK_TEST_MASTER:-}" ] || cluster_start
[ -n "${DP_SPARK_TEST_CONNECT:-}" ] || connect_start
set +e
"$PY" -m pytest -q -rs --durations=30 -n "${PYTEST_WORKERS:-0}" --dist loadgroup "$@"
rc=$?
set -e
# pytest exit 5 = no tests collected: that is a failure for us, not a pass.
exit $rc
