# shellcheck shell=bash
# Helpers shared by .ci/postgres.sh, .ci/cluster.sh, .ci/connect.sh and .ci/cds.sh (sourced by
# each).

_CI_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# The JVM options of the test runs (.ci/test.sh says why and what each saved; the Makefile
# gives make test-compat the same defaults): every JVM, the long-lived ones (the workers'
# sessions, the Connect server), and the short-lived ones the tests start.
: "${TEST_JVM_OPTS:=-XX:+UseSerialGC}"
: "${TEST_SESSION_JVM_OPTS=-XX:Tier4InvocationThreshold=50000 -XX:Tier4MinInvocationThreshold=6000 -XX:Tier4CompileThreshold=150000 -XX:Tier4BackEdgeThreshold=400000}"
: "${TEST_CHILD_JVM_OPTS=-XX:TieredStopAtLevel=1}"

# The project's venv python ($PY, default .venv/bin/python), else python3 on PATH.
ci_python() {
    local py="${PY:-.venv/bin/python}"
    case "$py" in /*) ;; *) py="$_CI_ROOT/$py" ;; esac
    if [ -x "$py" ]; then echo "$py"; else command -v python3; fi
}

# A free TCP port on 127.0.0.1 (a random high port when no python is available).
ci_free_port() {
    local py
    py="$(ci_python)"
    if [ -n "$py" ]; then
        "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
    else
        echo $(( 20000 + RANDOM % 20000 ))
    fi
}

# ci_port_open PORT: exit 0 when something accepts connections on 127.0.0.1:PORT.
ci_port_open() {
    "$(ci_python)" -c 'import socket, sys
s = socket.socket(); s.settimeout(1)
sys.exit(0 if s.connect_ex(("127.0.0.1", int(sys.argv[1]))) == 0 else 1)' "$1"
}

# ci_kill_group PIDFILE TENTHS: TERM the process group whose id PIDFILE holds, wait up to
# TENTHS tenths of a second for it to end, then KILL it; remove PIDFILE.
ci_kill_group() {
    local f="$1" pid i
    [ -s "$f" ] || return 0
    pid="$(cat "$f")"
    if kill -0 -- "-$pid" 2>/dev/null; then
        kill -TERM -- "-$pid" 2>/dev/null || true
        for i in $(seq 1 "$2"); do
            kill -0 -- "-$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL -- "-$pid" 2>/dev/null || true
    fi
    rm -f "$f"
}

# ci_with START STOP CMD...: run CMD between START and STOP; returns CMD's status.
ci_with() {
    local start="$1" stop="$2" rc=0
    shift 2
    "$start" || return 1
    "$@" || rc=$?
    "$stop"
    return $rc
}

# ci_wait_ports PIDFILE TIMEOUT PORT...: wait (at most TIMEOUT seconds, while the process of
# PIDFILE lives) until every PORT accepts connections on 127.0.0.1. 0 when they all do.
ci_wait_ports() {
    local f="$1" deadline p up
    deadline=$(( $(date +%s) + $2 ))
    shift 2
    while [ "$(date +%s)" -lt "$deadline" ] && [ -s "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null; do
        up=1
        for p in "$@"; do ci_port_open "$p" || { up=""; break; }; done
        [ -n "$up" ] && return 0
        sleep 0.5
    done
    return 1
}
