# shellcheck shell=bash
# A throwaway Spark standalone cluster on loopback, from the installed pyspark distribution
# (SPARK_HOME = the pyspark package directory; nothing is downloaded). Source this file, then:
#
#   cluster_start          # a master on 127.0.0.1:<free port> (web UI on another free port)
#                          # and one worker (1 core, 1g); exports
#                          # DP_SPARK_TEST_MASTER=spark://127.0.0.1:PORT and
#                          # DP_SPARK_TEST_MASTER_UI=http://127.0.0.1:UIPORT (its JSON status)
#   trap cluster_stop EXIT # stops the worker (and its executors), then the master, and
#                          # removes the temp dir (safe to call twice, or if never started)
#
# Each daemon runs in its own session (setsid), so that cluster_stop can end exactly the
# process groups this script started (the worker's executors are in the worker's group),
# by id. Logs: $_CL_DIR/{master,worker}.log (printed on a failed start).
# Usable by hand: `source .ci/cluster.sh && cluster_start`, or `bash .ci/cluster.sh CMD...`
# runs CMD with a cluster and stops it afterwards.
#
# Knobs: CLUSTER_WORKER_CORES (1), CLUSTER_WORKER_MEMORY (1g), CLUSTER_START_TIMEOUT (90 s).

_cl_log() { echo "cluster.sh: $*" >&2; }

# shellcheck source=.ci/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# Number of ALIVE workers the master's JSON status page reports (0 when unreachable).
_cl_alive_workers() {
    "$(ci_python)" - "$1" <<'EOF' 2>/dev/null || echo 0
import json, sys, urllib.request
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/json/", timeout=2) as r:
        print(int(json.load(r).get("aliveworkers", 0)))
except Exception:
    print(0)
EOF
}

# _cl_spawn NAME CMD...: start CMD in a new session; records its pid (= its process group id).
_cl_spawn() {
    local name="$1"; shift
    SPARK_HOME="$_CL_SPARK_HOME" SPARK_LOCAL_IP=127.0.0.1 SPARK_LOCAL_DIRS="$_CL_DIR/local" \
    SPARK_DAEMON_MEMORY="${SPARK_DAEMON_MEMORY:-512m}" SPARK_LOG_DIR="$_CL_DIR" \
        setsid bash -c 'echo $$ > "$0"; exec "$@"' "$_CL_DIR/$name.pid" "$@" \
        >"$_CL_DIR/$name.log" 2>&1 </dev/null &
    local i
    for i in $(seq 1 50); do
        [ -s "$_CL_DIR/$name.pid" ] && return 0
        sleep 0.1
    done
    _cl_log "$name did not start"
    return 1
}

_cl_alive() { [ -s "$_CL_DIR/$1.pid" ] && kill -0 "$(cat "$_CL_DIR/$1.pid")" 2>/dev/null; }

cluster_start() {
    if [ -n "${_CL_DIR:-}" ] && [ -d "${_CL_DIR}" ]; then
        _cl_log "already running (${DP_SPARK_TEST_MASTER:-?}, dir ${_CL_DIR})"
        return 0
    fi
    local py
    py="$(ci_python)" || return 1
    _CL_SPARK_HOME="$("$py" -c 'import os, pyspark; print(os.path.dirname(os.path.realpath(pyspark.__file__)))')" || {
        _cl_log "pyspark is not importable with $py"
        return 1
    }
    if [ ! -x "$_CL_SPARK_HOME/bin/spark-class" ]; then
        _cl_log "$_CL_SPARK_HOME/bin/spark-class not found: this pyspark has no full distribution"
        return 1
    fi
    _CL_DIR="$(mktemp -d "${TMPDIR:-/tmp}/dp_spark_cluster.XXXXXX")" || return 1
    mkdir -p "$_CL_DIR/work" "$_CL_DIR/local"
    # The daemons (only) get SPARK_LOCAL_IP=127.0.0.1, small heaps (SPARK_DAEMON_MEMORY,
    # 512m) and local dirs under $_CL_DIR; executors get spark.executor.memory within the
    # worker's memory.
    local timeout="${CLUSTER_START_TIMEOUT:-90}" cores="${CLUSTER_WORKER_CORES:-1}" mem="${CLUSTER_WORKER_MEMORY:-1g}"
    local port ui attempt deadline ok=""
    for attempt in 1 2 3; do
        port="$(ci_free_port)"; ui="$(ci_free_port)"
        _cl_spawn master "$_CL_SPARK_HOME/bin/spark-class" org.apache.spark.deploy.master.Master \
            --host 127.0.0.1 --port "$port" --webui-port "$ui" || break
        ci_wait_ports "$_CL_DIR/master.pid" "$timeout" "$port" "$ui" && { ok=1; break; }
        _cl_log "master on port $port did not come up (attempt $attempt)"
        tail -n 20 "$_CL_DIR/master.log" >&2
        ci_kill_group "$_CL_DIR/master.pid" 100
    done
    if [ -z "$ok" ]; then
        cluster_stop
        return 1
    fi
    local wui
    wui="$(ci_free_port)"
    if ! _cl_spawn worker "$_CL_SPARK_HOME/bin/spark-class" org.apache.spark.deploy.worker.Worker \
            --host 127.0.0.1 --cores "$cores" --memory "$mem" --webui-port "$wui" \
            --work-dir "$_CL_DIR/work" "spark://127.0.0.1:$port"; then
        cluster_stop
        return 1
    fi
    ok=""
    deadline=$(( $(date +%s) + timeout ))
    while [ "$(date +%s)" -lt "$deadline" ] && _cl_alive worker; do
        if [ "$(_cl_alive_workers "$ui")" -ge 1 ]; then ok=1; break; fi
        sleep 0.5
    done
    if [ -z "$ok" ]; then
        _cl_log "the worker did not register with the master within ${timeout}s:"
        tail -n 30 "$_CL_DIR/worker.log" >&2
        cluster_stop
        return 1
    fi
    _CL_PORT="$port"; _CL_UI_PORT="$ui"
    export DP_SPARK_TEST_MASTER="spark://127.0.0.1:$port"
    export DP_SPARK_TEST_MASTER_UI="http://127.0.0.1:$ui"
    export DP_SPARK_TEST_SPARK_HOME="$_CL_SPARK_HOME"
    _cl_log "Spark standalone master $DP_SPARK_TEST_MASTER (UI 127.0.0.1:$ui), 1 worker ($cores core, $mem); logs in $_CL_DIR"
}

cluster_stop() {
    if [ -n "${_CL_DIR:-}" ] && [ -d "${_CL_DIR}" ]; then
        ci_kill_group "$_CL_DIR/worker.pid" 100   # its executors are in its process group
        ci_kill_group "$_CL_DIR/master.pid" 100
        if [ "${CLUSTER_KEEP_LOGS:-}" = 1 ]; then
            _cl_log "logs kept in $_CL_DIR"
        else
            rm -rf "$_CL_DIR"
        fi
    fi
    unset _CL_DIR _CL_PORT _CL_UI_PORT DP_SPARK_TEST_MASTER DP_SPARK_TEST_MASTER_UI DP_SPARK_TEST_SPARK_HOME
    return 0
}

if [ "${BASH_SOURCE[0]}" = "$0" ] && [ $# -gt 0 ]; then
    trap cluster_stop EXIT
    ci_with cluster_start cluster_stop "$@"
    exit $?
fi
