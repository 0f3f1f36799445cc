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
#   cds_start      # makes the archive (60-75 s) for $PY (ci_python), or takes $TEST_CDS_ARCHIVE
#                  # if that file exists; exports CDS_JVM_OPTS (-XX:SharedArchiveFile=...;
#                  # empty when no archive could be made)
#   cds_stop       # removes the archive it made (safe to call twice)
#   cds_make FILE  # only makes an archive, at FILE
#
# `bash .ci/cds.sh --make FILE` makes one (.ci/run, beside `make lint`). TEST_CDS=0 turns it
# off.

_cds_log() { echo "cds.sh: $*" >&2; }

# shellcheck source=.ci/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# cds_make FILE: run the warm-up job and write its archive to FILE; 0 when FILE was written.
cds_make() {
    local py start=$SECONDS file="$1"
    py="$(ci_python)" || return 1
    rm -f "$file"
    # the warm-up is a short-lived JVM: the children's options
    if SPARK_SUBMIT_OPTS="$TEST_JVM_OPTS${TEST_CHILD_JVM_OPTS:+ $TEST_CHILD_JVM_OPTS} -XX:ArchiveClassesAtExit=$file" \
        PYSPARK_PYTHON="${PYSPARK_PYTHON:-$py}" SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}" \
        timeout "${CDS_WARMUP_TIMEOUT:-300}" "$py" "$_CI_ROOT/.ci/cds_warmup.py" >"$file.log" 2>&1 \
        && [ -s "$file" ]; then
        _cds_log "archive $file ($(( $(stat -c %s "$file") >> 20 )) MiB, $((SECONDS - start)) s)"
        return 0
    fi
    # not a failure: the JVMs load their classes as usual, only slower
    _cds_log "no archive (the JVMs load their classes as usual); the warm-up's log:"
    tail -n 20 "$file.log" >&2
    rm -f "$file"
    return 1
}

cds_start() {
    export CDS_JVM_OPTS=""
    if [ "${TEST_CDS:-1}" = 0 ]; then
        _cds_log "off (TEST_CDS=0)"
        return 0
    fi
    # an archive made beforehand (.ci/run makes it beside `make lint`): used, not removed
    if [ -n "${TEST_CDS_ARCHIVE:-}" ] && [ -s "$TEST_CDS_ARCHIVE" ]; then
        export CDS_JVM_OPTS="-XX:SharedArchiveFile=$TEST_CDS_ARCHIVE"
        _cds_log "archive $TEST_CDS_ARCHIVE (made beforehand)"
        return 0
    fi
    _CDS_DIR="$(mktemp -d "${TMPDIR:-/tmp}/dp_spark_cds.XXXXXX")" || return 0
    if cds_make "$_CDS_DIR/spark.jsa"; then
        CDS_JVM_OPTS="-XX:SharedArchiveFile=$_CDS_DIR/spark.jsa"
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

if [ "${BASH_SOURCE[0]}" = "$0" ] && [ "${1:-}" = "--make" ] && [ $# -eq 2 ]; then
    cds_make "$2"
    exit $?
fi
