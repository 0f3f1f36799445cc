"""Shared pytest setup: the markers, Spark environment defaults, one Spark session.

Markers are given from what a test needs, not by hand (``pytest_collection_modifyitems``):

* ``spark``: the test (or a fixture it uses, transitively) needs the ``spark`` session, or it
  lives in ``tests/spark/``;
* ``pg``: it runs against a PostgreSQL server (the ``postgres`` half of ``ledger_factory``,
  ``pg_dsn`` / ``pg_admin``, or a throwaway server of its own);
* ``jvm``: it starts a JVM in another process (a Spark standalone cluster, Spark Connect, a
  notebook or the tutorial's commands as scripts): the tests in :data:`JVM_TESTS`;
* ``slow`` (besides the statistical tests marked by hand): the long pure tests in
  :data:`LONG_TESTS`.

``make test`` and ``make test-compat`` run on three pytest-xdist workers, ``make test-fast`` on
two, with ``--dist loadgroup``: the ``spark`` tests are in seven groups, the end-to-end jobs of
tests/jobs in two halves (:data:`SPARK_JOBS_GROUP`, :data:`SPARK_JOBS_B_GROUP`) and of
tests/deploy (:data:`SPARK_DEPLOY_GROUP`), every
test of the shared Spark Connect server (:data:`SPARK_CONNECT_GROUP`), the two longest Spark
files (:data:`SPARK_LONG_GROUP`) and the rest in two halves (:data:`SPARK_GROUP`,
:data:`SPARK_B_GROUP`); each group runs on one
worker, in order, on that worker's one session (a session takes ~10 s to start; a worker that
runs two groups runs them one after the other on its one session), so the groups run side by
side, never more than one session per worker; the other tests (pure, PostgreSQL, a JVM of
their own) are grouped by file (a module fixture runs once) and the files spread over the
workers. The groups are handed out longest first (:data:`GROUP_SECONDS`).

``make test-fast`` runs ``-m "not spark and not pg and not jvm and not slow"`` with no JVM on
the path (a test that starts one without its marker fails there instead of being slow);
``make test`` runs every test, whatever its markers.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

_REPO_ROOT = Path(__file__).resolve().parent.parent
if str(_REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(_REPO_ROOT))


#: tests that start a JVM in a subprocess without the ``spark`` fixture: a file (relative to
#: tests/) or a test (file::name). test-fast has no JVM, so a forgotten one fails there, loudly.
JVM_TESTS = frozenset({
    "deploy/test_cluster.py", "deploy/test_connect.py", "docs/test_tutorial.py", "unit/test_cli_spark.py",
    "evaluation/test_notebooks.py::test_explore_epsilon_notebook_runs",
    "evaluation/test_notebooks.py::test_publish_dau_aov_notebook_runs",
})
#: pure tests that take tens of seconds (many processes, a whole documentation build): marked
#: slow, so out of test-fast's 3 minutes; `make test` runs them like every slow test
LONG_TESTS = frozenset({
    "ledger/test_concurrency.py::test_32_processes_exactly_10_succeed",
    "docs/test_api_reference.py::test_the_reference_builds_with_a_page_per_public_module",
})
PG_FILES = frozenset({"ledger/test_durability.py"})
PG_FIXTURES = frozenset({"pg_dsn", "pg_admin"})
#: the xdist groups of the ``spark`` tests (``--dist loadgroup``): each group on one worker and
#: one session of that worker (a worker that runs two groups runs them one after the other on
#: its one session). The end-to-end jobs (mostly driver processes of their own, kill -9, a
#: cluster) are two groups, tests/jobs and tests/deploy; every test of the shared Spark Connect
#: server is in a third, so its users take turns (a held write and its takeover need both of
#: its task slots); every other Spark test is in the ``spark`` group, or in ``spark-b`` for the
#: files of :data:`SPARK_B_FILES`
SPARK_GROUP = "spark"
SPARK_B_GROUP = "spark-b"
#: the in-process Spark files of the second half: one ``spark`` group was make test-compat's
#: whole critical path (530 of its 539 s on one worker, the two others idle), and the largest
#: group of make test. Chosen by their seconds in a clean-clone run (ciE, 2026-12-06; make test
#: / test-compat): mirror_incremental 150 / 86, cli_spark 38 / 108, event_units 36 / 37,
#: release_writer 33 / 18, versions 32 / -, series_current 30 / 21, release_write_once 23 / 13,
#: damaged_tables 20 / 11, mirror_rebuild 7 / 4: about 370 of make test's 850 s and 300 of
#: test-compat's 530
SPARK_B_FILES = frozenset({
    "spark/test_mirror_incremental.py", "unit/test_cli_spark.py", "spark/test_event_units.py",
    "spark/test_release_writer.py", "governance/test_versions.py", "spark/test_series_current.py",
    "spark/test_release_write_once.py", "spark/test_damaged_tables.py", "spark/test_mirror_rebuild.py",
    "spark/test_release_summaries.py",
})
SPARK_JOBS_GROUP = "spark-jobs"
#: tests/jobs in two halves (their seconds in ciG: 676 and 631): as one group of about 1,200 s
#: on one worker they were the longest group by far, and a run cannot end before its longest
#: group does
SPARK_JOBS_B_GROUP = "spark-jobs-b"
SPARK_JOBS_B_FILES = frozenset({
    "jobs/test_kill_stages.py", "jobs/test_concurrent_family.py", "jobs/test_key_table_e2e.py",
    "jobs/test_governance_e2e.py", "jobs/test_where_leak.py", "jobs/test_refusals.py",
})
SPARK_DEPLOY_GROUP = "spark-deploy"
SPARK_CONNECT_GROUP = "spark-connect"
SPARK_JOBS_DIRS = {"jobs/": SPARK_JOBS_GROUP, "deploy/": SPARK_DEPLOY_GROUP}
#: the Spark files long enough to be a group of their own, scheduled beside the others like
#: any group: the ``where`` fuzz (90-180 s; ``make test-compat`` runs only tests/unit and
#: tests/spark, where it was half the Spark time) and the stream's 60 daily refreshes (about
#: 230 s): :data:`SPARK_LONG_GROUP`. Neither uses the shared Spark Connect server
SPARK_LONG_GROUP = "spark-long"
SPARK_LONG_FILES = frozenset({"spark/test_where_total.py", "deploy/test_stream.py"})
#: the order in which the groups are handed to the workers: longest first (their rough seconds
#: in `make test` on 2 cores and 3 workers), so that no long group starts last and runs alone
#: at the end; the other per-file groups follow, the most tests first (xdist's own order)
GROUP_SECONDS = {SPARK_LONG_GROUP: 790, SPARK_JOBS_B_GROUP: 680, SPARK_JOBS_GROUP: 630, SPARK_GROUP: 600,
                 SPARK_DEPLOY_GROUP: 600, SPARK_B_GROUP: 500, SPARK_CONNECT_GROUP: 410, "evaluation/test_notebooks.py": 260,
                 "statistical/test_dp_inequality.py": 240, "statistical/test_coverage_table.py": 165,
                 "docs/test_tutorial.py": 135}
CONNECT_FIXTURES = frozenset({"connect_url"})


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: statistical or long-running test (still run in CI)")
    config.addinivalue_line("markers", "pg: needs a PostgreSQL server (given from its fixtures)")
    config.addinivalue_line("markers", "jvm: starts a JVM in another process (given from JVM_TESTS)")
    config.addinivalue_line("markers", "codegen: runs the session on generated code, as production (SESSION_EVALUATION)")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups (its own hook of the same name)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give each test the markers of what it needs (module docstring)."""
    tests_dir = Path(__file__).resolve().parent
    for item in items:
        try:
            rel = Path(str(item.fspath)).resolve().relative_to(tests_dir).as_posix()
        except ValueError:
            continue
        fixtures = set(getattr(item, "fixturenames", ()))
        params = getattr(getattr(item, "callspec", None), "params", {})
        if rel in SPARK_LONG_FILES and not fixtures & CONNECT_FIXTURES:
            item.add_marker(pytest.mark.spark)
            item.add_marker(pytest.mark.xdist_group(SPARK_LONG_GROUP))
        elif fixtures & CONNECT_FIXTURES:
            # the one Spark Connect server of the run: its users take turns, in one group
            if "spark" in fixtures:
                item.add_marker(pytest.mark.spark)
            item.add_marker(pytest.mark.xdist_group(SPARK_CONNECT_GROUP))
        elif "spark" in fixtures and rel.startswith(tuple(SPARK_JOBS_DIRS)):
            item.add_marker(pytest.mark.spark)
            item.add_marker(pytest.mark.xdist_group(
                SPARK_JOBS_B_GROUP if rel in SPARK_JOBS_B_FILES else SPARK_JOBS_DIRS[rel[:rel.index("/") + 1]]))
        elif "spark" in fixtures or rel.startswith("spark/"):
            item.add_marker(pytest.mark.spark)
            item.add_marker(pytest.mark.xdist_group(SPARK_B_GROUP if rel in SPARK_B_FILES else SPARK_GROUP))
        else:
            # a file's tests on one worker: a module-scoped fixture (a driver process, a built
            # wheel) runs once, not once per worker
            item.add_marker(pytest.mark.xdist_group(rel))
        if fixtures & PG_FIXTURES or params.get("ledger_factory") == "postgres" or rel in PG_FILES:
            item.add_marker(pytest.mark.pg)
        test_id = f"{rel}::{getattr(item, 'originalname', item.name)}"
        if rel in JVM_TESTS or test_id in JVM_TESTS:
            item.add_marker(pytest.mark.jvm)
        if test_id in LONG_TESTS:
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadgroup`` with the groups handed out longest first (:data:`GROUP_SECONDS`),
    then the per-file groups as xdist orders them (the most tests first)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class LongestFirst(LoadGroupScheduling):
        _ordered = False

        def _assign_work_unit(self, node):
            if not self._ordered:  # the queue is complete before the first unit is handed out
                self._ordered = True
                units = sorted(self.workqueue.items(), key=lambda u: -GROUP_SECONDS.get(u[0], 0))
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

    return LongestFirst(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    """On the xdist controller under ``--dist loadgroup``: every test here has a group
    (:func:`pytest_collection_modifyitems`), so every node id a worker collected must carry it
    (``<id>@<group>``, what xdist's scheduler keeps on one worker). When none does (a pytest
    that xdist's renaming no longer reaches: pytest 9.2 with xdist 3.8), the Spark group would
    run on both workers at once, two sessions on two cores and two clients of the one Connect
    server: refuse the run instead of letting it stall."""
    if node.config.getvalue("dist") != "loadgroup" or not ids:
        return
    lost = [i for i in ids if "@" not in i.rsplit("]", 1)[-1]]
    if lost:
        raise pytest.UsageError(
            f"--dist loadgroup: {len(lost)} of {len(ids)} tests have no '@<group>' in their node id (first: "
            f"{lost[0]}), so xdist would split their groups across workers: this pytest-xdist does not support "
            "this pytest (setup.cfg pins the pair): run `make setup`, or PYTEST_WORKERS=0")


@pytest.fixture(scope="session")
def spark():
    """One local[2] SparkSession with Delta for the whole test session."""
    from dp_spark.spark import get_or_create_session

    # 2g of heap (the default is 1g): the suite's one session runs hundreds of releases, some of
    # 100k cells; a clean-clone run once saw this JVM shut down midway (its shutdown hook
    # stopped the context) and every later Spark test fail, as a fatal error in local mode does
    # the JVM options of a long-lived session (.ci/test.sh: the jobs a test starts get C1-only
    # options through SPARK_SUBMIT_OPTS; this JVM lives the whole run and keeps C2)
    session_opts = os.environ.get("DP_SPARK_TEST_SESSION_JVM_OPTS")
    with pytest.MonkeyPatch.context() as mp:
        if session_opts is not None:
            mp.setenv("SPARK_SUBMIT_OPTS", session_opts)
        # a codegen cache of 1,000 classes (Spark's default: 100): the session compiles the
        # plans of hundreds of tests; tests/deploy/test_schedule.py + tests/spark/test_series_current.py,
        # alternating on a quiet machine: 384 -> 328 and 341 -> 328 CPU s (the same code, cached)
        session = get_or_create_session("dp_spark-tests", master="local[2]",
                                        extra_conf={"spark.driver.memory": "2g",
                                                    "spark.sql.codegen.cache.maxEntries": "1000",
                                                    **SESSION_EVALUATION[session_evaluation()]})
    yield session
    session.stop()


#: How the suite's in-process session evaluates expressions (``DP_SPARK_TEST_CODEGEN``):
#: ``interpreted`` (the default) runs Spark's interpreted evaluators, no Java generated and
#: compiled per plan; ``generated`` is Spark's default, as every job, notebook and the Connect
#: server the tests start run it, and as the tests marked ``codegen`` run in any case
#: (:func:`_codegen_where_marked`). The engine's Python code and the plans it builds are the
#: same either way; Spark checks its two evaluators against each other. Measured: 14 daily
#: refreshes of the stream test, the session's JVM and the driver, 5.0-5.6 -> 3.7-4.3 CPU s per
#: refresh; a third of the session's samples were generating code that it then found cached.
SESSION_EVALUATION = {
    "interpreted": {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"},
    "generated": {"spark.sql.codegen.wholeStage": "true", "spark.sql.codegen.factoryMode": "FALLBACK"},
}


def session_evaluation() -> str:
    mode = os.environ.get("DP_SPARK_TEST_CODEGEN", "interpreted")
    if mode not in SESSION_EVALUATION:
        raise pytest.UsageError(f"DP_SPARK_TEST_CODEGEN={mode!r}: use one of {sorted(SESSION_EVALUATION)}")
    return mode


@pytest.fixture(autouse=True)
def _codegen_where_marked(request):
    """A test marked ``codegen`` runs on generated code, as production does, whatever the
    session's default (:data:`SESSION_EVALUATION`): the ``where`` totality fuzz (an error that
    only generated code raises must be found), the Spark backend against the local reference,
    EXPLAIN's codegen text. The session's settings come back after it."""
    if request.node.get_closest_marker("codegen") is None:
        yield
        return
    conf = request.getfixturevalue("spark").conf
    before = {k: conf.get(k) for k in SESSION_EVALUATION["generated"]}
    for k, v in SESSION_EVALUATION["generated"].items():
        conf.set(k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            conf.set(k, v)


def _active_spark_context():
    """The JVM-backed SparkContext of this process, if one is running (never starts one)."""
    pyspark = sys.modules.get("pyspark")
    return None if pyspark is None else pyspark.SparkContext._active_spark_context


@pytest.fixture(autouse=True)
def _spark_only_in_its_group(request):
    """A test without the ``spark`` marker must not start a Spark session in this process: on
    two xdist workers it would be a second session beside the Spark group's (both on two
    cores, and a clean-clone run stalled so). Use the ``spark`` fixture, or put the file in
    tests/spark/. Caught where no session ran before the test (always so on the worker
    without the Spark group)."""
    before = _active_spark_context()
    yield
    if before is None and _active_spark_context() is not None and request.node.get_closest_marker("spark") is None:
        pytest.fail("this test started a Spark session in the test process without the spark fixture: "
                    "request `spark` (tests/conftest.py) so that it runs in the Spark group", pytrace=False)


@pytest.fixture(autouse=True)
def _engines_drained():
    """After each test, wait for the ledger mirror refreshes its engines started in the
    background (``Engine.close``), so that no test's Spark work runs into the next test."""
    yield
    engine_mod = sys.modules.get("dp_spark.engine")
    if engine_mod is not None:
        for engine in list(engine_mod._LIVE):
            engine.close(timeout=120)
