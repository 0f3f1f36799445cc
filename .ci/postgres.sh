# shellcheck shell=bash
# A throwaway PostgreSQL cluster on loopback, for the ledger tests. Source this file, then:
#
#   pg_start            # installs Debian's postgresql if initdb is missing, starts a cluster
#                       # in a temp dir on 127.0.0.1:<free port>, creates dp_spark_test and
#                       # exports DP_SPARK_TEST_PG_DSN=postgresql://postgres@127.0.0.1:PORT/dp_spark_test
#   trap pg_stop EXIT   # stops it and removes the dir (safe to call twice, or if never started)
#
# As root the cluster is owned by the `postgres` OS user (initdb refuses to run as root);
# otherwise by the current user. Trust authentication, loopback only. fsync stays on (the
# ledger refuses a server with fsync=off) and full_page_writes stays on (torn pages otherwise);
# synchronous_commit=off is the server default on purpose: the ledger must (and does) require
# a synchronous commit in each of its own write transactions, so every ledger test checks that.
# Sourced by .ci/test.sh and usable by hand (`source .ci/postgres.sh && pg_start`).

# shellcheck source=.ci/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

_pg_log() { echo "postgres.sh: $*" >&2; }

_pg_bindir() {
    local d
    if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
        d="$(dirname "$(readlink -f "$(command -v initdb)")")"
        if [ -x "$d/createdb" ]; then echo "$d"; return 0; fi
    fi
    # Debian keeps the server binaries out of PATH: the newest version wins.
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5 -V -r); do
        if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && [ -x "$d/createdb" ]; then
            echo "$d"
            return 0
        fi
    done
    return 1
}

_pg_install() {
    _pg_log "initdb not found: installing Debian's postgresql package"
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq >&2 || return 1
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends postgresql >&2 || return 1
}

# Run a command as the cluster owner.
_pg_as_owner() {
    if [ "$(id -u)" -eq 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

pg_start() {
    if [ -n "${_PG_DIR:-}" ] && [ -d "${_PG_DIR}" ]; then
        _pg_log "already running in ${_PG_DIR}"
        return 0
    fi
    local bindir
    bindir="$(_pg_bindir)" || { _pg_install && bindir="$(_pg_bindir)"; } || {
        _pg_log "cannot find or install PostgreSQL server binaries"
        return 1
    }
    if [ "$(id -u)" -eq 0 ] && ! id postgres >/dev/null 2>&1; then
        useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres || return 1
    fi
    _PG_DIR="$(mktemp -d "${TMPDIR:-/tmp}/dp_spark_pg.XXXXXX")" || return 1
    mkdir -p "$_PG_DIR/data" "$_PG_DIR/sock"
    if [ "$(id -u)" -eq 0 ]; then
        chown -R postgres: "$_PG_DIR"
    fi
    chmod 700 "$_PG_DIR"
    _PG_BIN="$bindir"
    if ! _pg_as_owner "$bindir/initdb" -D "$_PG_DIR/data" -A trust -U postgres -E UTF8 --no-locale \
            >"$_PG_DIR/initdb.log" 2>&1; then
        _pg_log "initdb failed:"; cat "$_PG_DIR/initdb.log" >&2
        pg_stop
        return 1
    fi
    local port attempt
    for attempt in 1 2 3 4 5; do
        port="$(ci_free_port)"
        if _pg_as_owner "$bindir/pg_ctl" -D "$_PG_DIR/data" -l "$_PG_DIR/server.log" -w -t 60 \
                -o "-c listen_addresses=127.0.0.1 -p $port -k $_PG_DIR/sock -c fsync=on \
-c synchronous_commit=off -c max_connections=200 -c shared_buffers=32MB" \
                start >/dev/null 2>&1; then
            break
        fi
        _pg_log "start on port $port failed (attempt $attempt)"
        port=""
    done
    if [ -z "$port" ]; then
        _pg_log "could not start PostgreSQL:"; tail -n 20 "$_PG_DIR/server.log" >&2
        pg_stop
        return 1
    fi
    _PG_PORT="$port"
    if ! "$bindir/createdb" -h 127.0.0.1 -p "$port" -U postgres dp_spark_test; then
        _pg_log "createdb failed"
        pg_stop
        return 1
    fi
    export DP_SPARK_TEST_PG_DSN="postgresql://postgres@127.0.0.1:${port}/dp_spark_test"
    _pg_log "PostgreSQL $("$bindir/postgres" --version | awk '{print $3}') on 127.0.0.1:$port (data in $_PG_DIR)"
}

pg_stop() {
    if [ -n "${_PG_DIR:-}" ] && [ -d "${_PG_DIR}" ]; then
        if [ -f "$_PG_DIR/data/postmaster.pid" ]; then
            _pg_as_owner "${_PG_BIN}/pg_ctl" -D "$_PG_DIR/data" -m fast -w -t 30 stop >/dev/null 2>&1 \
                || _pg_as_owner "${_PG_BIN}/pg_ctl" -D "$_PG_DIR/data" -m immediate -w stop >/dev/null 2>&1 \
                || true
        fi
        rm -rf "$_PG_DIR"
    fi
    unset _PG_DIR _PG_PORT DP_SPARK_TEST_PG_DSN
    return 0
}

if [ "${BASH_SOURCE[0]}" = "$0" ] && [ $# -gt 0 ]; then
    ci_with pg_start pg_stop "$@"
    exit $?
fi
