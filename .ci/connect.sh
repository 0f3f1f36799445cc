# shellcheck shell=bash
# A throwaway Spark Connect server on loopback, from the installed pyspark distribution
# (its jars/ holds spark-connect_2.13; nothing is downloaded), with the Delta jars of .jars/
# and Delta's SQL extension and catalog. Source this file, then:
#
#   connect_start           # SparkConnectServer (local[2] by default) on 127.0.0.1:<free port>;
#                           # exports DP_SPARK_TEST_CONNECT=sc://127.0.0.1:PORT
#   trap connect_stop EXIT  # stops it and removes the temp dir (safe to call twice)
#
# The server runs in its own session (setsid); connect_stop ends exactly that process group
# by id. Logs: $_SC_DIR/server.log (printed on a failed start). The Python client needs
# pyspark's `connect` extra (grpcio, grpcio-status, googleapis-common-protos, zstandard).
# Usable by hand: `source .ci/connect.sh && connect_start`, or `bash .ci/connect.sh CMD...`.
#
# Knobs: CONNECT_MASTER (local[2]: a write held in the middle of its commit keeps one task
# slot while the run taking it over needs the other, tests/jobs/; e.g. $DP_SPARK_TEST_MASTER
# to run on the standalone cluster of .ci/cluster.sh), CONNECT_DRIVER_MEMORY (1g), CONNECT_START_TIMEOUT (120 s),
# DP_SPARK_JARS_DIR (the Delta jars; default <repo>/.jars).

_sc_log() { echo "connect.sh: $*" >&2; }

# shellcheck source=.ci/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"


connect_start() {
    if [ -n "${_SC_DIR:-}" ] && [ -d "${_SC_DIR}" ]; then
        _sc_log "already running (${DP_SPARK_TEST_CONNECT:-?}, dir ${_SC_DIR})"
        return 0
    fi
    local py spark_home jars_dir jars
    py="$(ci_python)" || return 1
    spark_home="$("$py" -c 'import os, pyspark; print(os.path.dirname(os.path.realpath(pyspark.__file__)))')" || {
        _sc_log "pyspark is not importable with $py"
        return 1
    }
    if ! ls "$spark_home"/jars/spark-connect_*.jar >/dev/null 2>&1; then
        _sc_log "no spark-connect jar in $spark_home/jars: this pyspark cannot serve Spark Connect"
        return 1
    fi
    jars_dir="${DP_SPARK_JARS_DIR:-$_CI_ROOT/.jars}"
    jars="$(ls "$jars_dir"/*.jar 2>/dev/null | paste -sd, -)"
    case "$jars" in
        *delta-spark*) ;;
        *) _sc_log "no delta-spark jar in $jars_dir (run \`make jars\`)"; return 1 ;;
    esac
    _SC_DIR="$(mktemp -d "${TMPDIR:-/tmp}/dp_spark_connect.XXXXXX")" || return 1
    mkdir -p "$_SC_DIR/local" "$_SC_DIR/warehouse"
    local timeout="${CONNECT_START_TIMEOUT:-120}" port attempt ok=""
    for attempt in 1 2 3; do
        port="$(ci_free_port)"
        # setsid: the server leads its own process group, which connect_stop ends by id
        SPARK_HOME="$spark_home" SPARK_LOCAL_IP=127.0.0.1 SPARK_LOCAL_DIRS="$_SC_DIR/local" \
        PYSPARK_PYTHON="${PYSPARK_PYTHON:-$py}" \
            setsid bash -c 'echo $$ > "$0"; exec "$@"' "$_SC_DIR/server.pid" \
            "$spark_home/bin/spark-submit" \
            --class org.apache.spark.sql.connect.service.SparkConnectServer \
            --name dp_spark-connect-server \
            --master "${CONNECT_MASTER:-local[2]}" \
            --driver-memory "${CONNECT_DRIVER_MEMORY:-1g}" \
            --jars "$jars" \
            --conf spark.connect.grpc.binding.address=127.0.0.1 \
            --conf spark.connect.grpc.binding.port="$port" \
            --conf spark.connect.grpc.port.maxRetries=0 \
            --conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension \
            --conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog \
            --conf spark.sql.session.timeZone=UTC \
            --conf spark.sql.shuffle.partitions=4 \
            --conf spark.sql.codegen.cache.maxEntries=1000 \
            --conf spark.databricks.delta.snapshotPartitions=2 \
            --conf spark.sql.warehouse.dir="$_SC_DIR/warehouse" \
            --conf spark.driver.host=127.0.0.1 \
            --conf spark.driver.bindAddress=127.0.0.1 \
            --conf spark.ui.enabled=false \
            --conf spark.log.level=WARN \
            --conf "spark.driver.extraJavaOptions=-Dderby.system.home=$_SC_DIR" \
            >"$_SC_DIR/server.log" 2>&1 </dev/null &
        local i
        for i in $(seq 1 50); do [ -s "$_SC_DIR/server.pid" ] && break; sleep 0.1; done
        ci_wait_ports "$_SC_DIR/server.pid" "$timeout" "$port" && { ok=1; break; }
        _sc_log "Spark Connect server on port $port did not come up (attempt $attempt):"
        tail -n 30 "$_SC_DIR/server.log" >&2
        ci_kill_group "$_SC_DIR/server.pid" 150
    done
    if [ -z "$ok" ]; then
        connect_stop
        return 1
    fi
    _SC_PORT="$port"
    export DP_SPARK_TEST_CONNECT="sc://127.0.0.1:$port"
    _sc_log "Spark Connect server $DP_SPARK_TEST_CONNECT (master ${CONNECT_MASTER:-local[2]}); log $_SC_DIR/server.log"
}

connect_stop() {
    if [ -n "${_SC_DIR:-}" ] && [ -d "${_SC_DIR}" ]; then
        ci_kill_group "$_SC_DIR/server.pid" 150
        if [ "${CONNECT_KEEP_LOGS:-}" = 1 ]; then
            _sc_log "logs kept in $_SC_DIR"
        else
            rm -rf "$_SC_DIR"
        fi
    fi
    unset _SC_DIR _SC_PORT DP_SPARK_TEST_CONNECT
    return 0
}

if [ "${BASH_SOURCE[0]}" = "$0" ] && [ $# -gt 0 ]; then
    trap connect_stop EXIT
    ci_with connect_start connect_stop "$@"
    exit $?
fi
