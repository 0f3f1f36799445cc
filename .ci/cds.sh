# shellcheck shell=bash
# A dynamic class-data-sharing archive of this pyspark's JVM (JDK 13+), made once per test run:
# a warm-up job (.ci/cds_warmup.py: a local session writing, reading and aggregating a small
# Delta table) runs with -XX:ArchiveClassesAtExit, and every later JVM of the run maps the
# classes it archived instead of loading, parsing and verifying them again. Each test starts
# tens of JVMs (dp-spark jobs, notebooks, kill -9 drivers); a small Delta job took 27 CPU
# seconds without the archive, 20-21 with it, and 22 s -> 16 s of wall time. A JVM whose
# classpath or Java does not match the archive ignores it silently (-Xshare:auto). Source this
# file, then:
#
#   cds_start      # makes the archive (~30 s) for $PY (ci_python); exports CDS_JVM_OPTS
#                  # (-XX:SharedArchiveFile=...; empty when no archive could be made)
#   cds_stop       # removes it (safe to call twice)
#
# Usable by hand: `bash .ci/cds.sh CMD...` runs CMD with SPARK_SUBMIT_OPTS and
# DP_SPARK_TEST_SESSION_JVM_OPTS extended by the archive. TEST_CDS=0 turns it off.

_cds_log() { echo "cds.sh: $*" >&2; }

# shellcheck source=.ci/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

cds_start() {
    export CDS_JVM_OPTS=""
    if [ "${TEST_CDS:-1}" = 0 ]; then
        _cds_log "off (TEST_CDS=0)"
        return 0
    fi
    local py start=$SECONDS
    py="$(ci_python)" || return 0
    _CDS_DIR="$(mktemp -d "${TMPDIR:-/tmp}/dp_spark_cds.XXXXXX")" || return 0
    if SPARK_SUBMIT_OPTS="${SPARK_SUBMIT_OPTS:+$SPARK_SUBMIT_OPTS }-XX:ArchiveClassesAtExit=$_CDS_DIR/spark.jsa" \
        timeout "${CDS_WARMUP_TIMEOUT:-300}" "$py" "$_CI_ROOT/.ci/cds_warmup.py" >"$_CDS_DIR/warmup.log" 2>&1 \
        && [ -s "$_CDS_DIR/spark.jsa" ]; then
        CDS_JVM_OPTS="-XX:SharedArchiveFile=$_CDS_DIR/spark.jsa"
        _cds_log "archive $_CDS_DIR/spark.jsa ($(( $(stat -c %s "$_CDS_DIR/spark.jsa") >> 20 )) MiB, $((SECONDS - start)) s)"
    else
        # not a failure: the JVMs load their classes as usual, only slower
        _cds_log "no archive (the JVMs load their classes as usual); the warm-up's log:"
        tail -n 20 "$_CDS_DIR/warmup.log" >&2
    fi
    export CDS_JVM_OPTS
}

cds_stop() {
    if [ -n "${_CDS_DIR:-}" ] && [ -d "${_CDS_DIR}" ]; then
        rm -rf "$_CDS_DIR"
    fi
    unset _CDS_DIR CDS_JVM_OPTS
    return 0
}

_cds_run() {
    if [ -n "${CDS_JVM_OPTS:-}" ]; then
        export SPARK_SUBMIT_OPTS="${SPARK_SUBMIT_OPTS:+$SPARK_SUBMIT_OPTS }$CDS_JVM_OPTS"
        if [ -n "${DP_SPARK_TEST_SESSION_JVM_OPTS+x}" ]; then
            export DP_SPARK_TEST_SESSION_JVM_OPTS="${DP_SPARK_TEST_SESSION_JVM_OPTS:+$DP_SPARK_TEST_SESSION_JVM_OPTS }$CDS_JVM_OPTS"
        fi
    fi
    "$@"
}

if [ "${BASH_SOURCE[0]}" = "$0" ] && [ $# -gt 0 ]; then
    trap cds_stop EXIT
    ci_with cds_start cds_stop _cds_run "$@"
    exit $?
fi
