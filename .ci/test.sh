#!/usr/bin/env bash
# Runs the whole test suite. Starts what the tests need, on loopback, unless the env already
# points at one: a throwaway PostgreSQL (ledger tests), a Spark standalone master and worker
# (cluster test) and a Spark Connect server (Connect test). Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export PYSPARK_PYTHON="$(pwd)/$PY" PYSPARK_DRIVER_PYTHON="$(pwd)/$PY" SPARK_LOCAL_IP=127.0.0.1
export DP_SPARK_TEST_MODE=1
# shellcheck source=.ci/lib.sh
source .ci/lib.sh
# Every JVM of the run (the workers' sessions, the spark-submit jobs, the Connect server, the
# standalone master and worker) on the serial garbage collector: on 2 cores G1's concurrent
# marking and GC threads were a sixth of a test session's CPU. Measured on tests/spark's
# equivalence, transforms, grey-box and writer files, serially on a quiet machine: 252 -> 208
# CPU seconds, 164 -> 144 s. Settings only the test run makes (`make test-compat` too, Makefile);
# TEST_JVM_OPTS and TEST_CHILD_JVM_OPTS, defaults in .ci/lib.sh.
# The short-lived JVMs the tests start (a `dp-spark` job, a notebook's kernel, the tutorial's
# commands, kill -9 drivers) compile with C1 only: C2 spent a third of such a JVM's CPU on code
# it ran a few times. A small Delta write-and-read job, 4 runs each, alternating: 38-46 -> 22-31
# CPU seconds, and no slower. The long-lived ones (the workers' sessions, the Connect server)
# keep C2: there C1-only saved 7% of the CPU but lost 20% of the wall time (tests/conftest.py
# gives a worker's session DP_SPARK_TEST_SESSION_JVM_OPTS instead).
# The long-lived JVMs (the workers' sessions, the Connect server) compile with C2 only the
# methods ten times hotter than C2's default thresholds (TEST_SESSION_JVM_OPTS): C2 was 43% of a
# session's CPU (per-thread CPU over four Spark files), mostly on planner and Delta code that a
# test suite runs a few thousand times, not the millions that repay C2. The same files, a quiet
# machine, serially, machine CPU: 352 -> 311 s (wall 228 -> 226 s); the 60-refresh stream test
# 298 -> 245 s (wall 199 -> 189 s); a third set 161 -> 147 s (wall 99 -> 108 s). Under load as
# in CI (make test-compat's selection on this venv, three workers, alternating pairs): 613 / 600
# -> 576 / 491 CPU s, wall 322 / 312 -> 308 / 262 s. Thirty times the thresholds saved little
# more and slowed the stream test by a sixth; C1 only (with its 48 MB code cache) spent more CPU
# than it saved. Production JVMs keep the JVM's defaults.
export SPARK_SUBMIT_OPTS="${SPARK_SUBMIT_OPTS:+$SPARK_SUBMIT_OPTS }$TEST_JVM_OPTS${TEST_SESSION_JVM_OPTS:+ $TEST_SESSION_JVM_OPTS}"
export DP_SPARK_TEST_SESSION_JVM_OPTS="$SPARK_SUBMIT_OPTS"
export SPARK_DAEMON_JAVA_OPTS="${SPARK_DAEMON_JAVA_OPTS:+$SPARK_DAEMON_JAVA_OPTS }$TEST_JVM_OPTS"
# shellcheck source=.ci/postgres.sh
source .ci/postgres.sh
# shellcheck source=.ci/cluster.sh
source .ci/cluster.sh
# shellcheck source=.ci/connect.sh
source .ci/connect.sh
# shellcheck source=.ci/cds.sh
source .ci/cds.sh
cleanup() { connect_stop; cluster_stop; pg_stop; cds_stop; }
trap cleanup EXIT
# one class-data-sharing archive for every JVM of the run, the services' too (.ci/cds.sh)
cds_start
if [ -n "$CDS_JVM_OPTS" ]; then
    export SPARK_SUBMIT_OPTS="$SPARK_SUBMIT_OPTS $CDS_JVM_OPTS"
    export DP_SPARK_TEST_SESSION_JVM_OPTS="$DP_SPARK_TEST_SESSION_JVM_OPTS $CDS_JVM_OPTS"
    export SPARK_DAEMON_JAVA_OPTS="$SPARK_DAEMON_JAVA_OPTS $CDS_JVM_OPTS"
fi
[ -n "${DP_SPARK_TEST_PG_DSN:-}" ] || pg_start
[ -n "${DP_SPARK_TEST_MASTER:-}" ] || cluster_start
[ -n "${DP_SPARK_TEST_CONNECT:-}" ] || connect_start
# the services above are long-lived (session options); what the tests start is not (C1 only:
# C2's thresholds above no longer matter)
export SPARK_SUBMIT_OPTS="$SPARK_SUBMIT_OPTS${TEST_CHILD_JVM_OPTS:+ $TEST_CHILD_JVM_OPTS}"
set +e
"$PY" -m pytest -q -rs --durations="${PYTEST_DURATIONS:-30}" -n "${PYTEST_WORKERS:-0}" --dist loadgroup "$@"
rc=$?
set -e
# pytest exit 5 = no tests collected: that is a failure for us, not a pass.
exit $rc
