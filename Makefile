# dp_spark: the two commands of the README are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))
export SPARK_LOCAL_IP := 127.0.0.1

# pyspark and delta-spark are the `spark` extra (the wheel alone does not install them: a
# Databricks Runtime ships its own). Each venv pins one supported pair; the jar of the same
# Delta release comes from conf/jvm/pom.xml.
SPARK_PINS := pyspark==4.2.0 delta-spark==4.4.0

# The compatibility environment: Python 3.12 + pyspark 4.0.x + delta-spark 4.0.1, the
# Databricks LTS combination (Runtime 17.3 LTS: Python 3.12, Spark 4.0), in its own venv and
# jar directory. `make test-compat` runs the unit and Spark tests on it (.ci/run does).
COMPAT_PYTHON ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12.*/bin/python3.12) python3.12)
COMPAT_VENV := .venv-compat
COMPAT_PY := $(COMPAT_VENV)/bin/python
COMPAT_JARS := .jars-compat
COMPAT_PINS := pyspark==4.0.1 delta-spark==4.0.1
COMPAT_TESTS := tests/unit tests/spark
# the slow statistical tests of pure code (no Spark, no JVM) already ran in `make test`; the
# compat run keeps every Spark / JVM test and every quick pure one (the Python 3.12 axis)
COMPAT_MARKERS := spark or jvm or not slow

# pytest-xdist workers for make test / test-fast / test-compat (--dist loadgroup: the in-process
# Spark tests stay on one worker and one session, tests/conftest.py); PYTEST_WORKERS=0 runs serially
# make test / test-compat run on three workers (SUITE_WORKERS=0: serially): the Spark tests in
# seven groups (tests/jobs in two halves, tests/deploy, the Spark Connect tests, the two longest
# files, the rest in two halves), one session per worker, handed out longest first (tests/conftest.py). Three workers on
# 2 cores: the jobs wait on processes of their own (spark-submit, kill -9, a notebook), so a third
# worker fills the idle CPU (make test 1,568 s -> 1,471 s, make test-compat 307 s -> 273 s, the
# same clean clone). The stalls of earlier two-worker runs were pytest 9.2 with pytest-xdist 3.8,
# under which no group held (setup.cfg pins pytest < 9.2 and tests/conftest.py refuses a run
# whose groups did not take)
PYTEST_WORKERS ?= 2
# the JVMs of the test runs on the serial collector, the long-lived ones (sessions) compiling
# with C2 only what is ten times hotter than by default, the short-lived ones the tests start
# with C1 only (.ci/test.sh says why and what each saved)
export TEST_JVM_OPTS ?= -XX:+UseSerialGC
export TEST_SESSION_JVM_OPTS ?= -XX:Tier4InvocationThreshold=50000 -XX:Tier4MinInvocationThreshold=6000 \
	-XX:Tier4CompileThreshold=150000 -XX:Tier4BackEdgeThreshold=400000
export TEST_CHILD_JVM_OPTS ?= -XX:TieredStopAtLevel=1
SUITE_WORKERS ?= 3
XDIST := -n $(PYTEST_WORKERS) --dist loadgroup
SUITE_XDIST := -n $(SUITE_WORKERS) --dist loadgroup

.PHONY: setup jars demo test test-fast lint test-cluster test-connect test-deploy \
	setup-compat jars-compat test-compat print-compat-python clean

setup: $(VENV)/.installed jars

$(VENV)/.installed: setup.cfg pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[spark,test]' $(SPARK_PINS)
	touch $@

# Delta's JVM jars from Maven Central into .jars/ (no Ivy at Spark start-up).
jars: .jars/.resolved

.jars/.resolved: conf/jvm/pom.xml
	mvn -q -f conf/jvm/pom.xml dependency:copy-dependencies
	touch $@

# The compatibility environment (see COMPAT_* above).
setup-compat: $(COMPAT_VENV)/.installed jars-compat

$(COMPAT_VENV)/.installed: setup.cfg pyproject.toml Makefile
	$(COMPAT_PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_PY) -m pip install -q --upgrade pip
	$(COMPAT_PY) -m pip install -q -e '.[spark,test]' $(COMPAT_PINS)
	touch $@

jars-compat: $(COMPAT_JARS)/.resolved

$(COMPAT_JARS)/.resolved: conf/jvm/pom.xml
	mvn -q -f conf/jvm/pom.xml -P spark-4.0 dependency:copy-dependencies
	touch $@

# Unit and Spark tests (not the statistical / e2e / deploy ones) on the compat environment.
# Under CI=true a missing pyenv Python or registry is a failure, never a skip.
test-compat: setup-compat
	$(COMPAT_PY) -c "import sys, pyspark, importlib.metadata as m; \
	    v = (sys.version.split()[0], pyspark.__version__, m.version('delta-spark')); print('compat:', v); \
	    assert v[0].startswith('3.12.') and v[1].startswith('4.0.') and v[2].startswith('4.0.'), v"
	PYSPARK_PYTHON=$(abspath $(COMPAT_PY)) PYSPARK_DRIVER_PYTHON=$(abspath $(COMPAT_PY)) \
	DP_SPARK_JARS_DIR=$(abspath $(COMPAT_JARS)) DP_SPARK_TEST_MODE=1 DP_SPARK_WHERE_FUZZ=sample \
	DP_SPARK_TEST_SESSION_JVM_OPTS="$(strip $(SPARK_SUBMIT_OPTS) $(TEST_JVM_OPTS) $(TEST_SESSION_JVM_OPTS))" \
	SPARK_SUBMIT_OPTS="$(strip $(SPARK_SUBMIT_OPTS) $(TEST_JVM_OPTS) $(TEST_CHILD_JVM_OPTS))" \
	    $(COMPAT_PY) -m pytest -q -rs -p no:cacheprovider --durations=15 $(SUITE_XDIST) -m "$(COMPAT_MARKERS)" $(COMPAT_TESTS)

print-compat-python:
	@echo $(COMPAT_PYTHON)

# README command 1: set up, generate the demo data, publish the DAU trend, the AOV per region
# and the DAU / WAU / MAU series on the embedded default (local Spark, local Delta warehouse,
# SQLite ledger), then print the series.
demo: setup
	$(VENV)/bin/dp-spark generate-demo --env conf/envs/local.yaml
	$(PY) jobs/publish_release.py --env conf/envs/local.yaml \
	    --conf conf/releases/dau_daily.yaml --conf conf/releases/aov_by_region.yaml \
	    --conf conf/releases/wau_mau_daily.yaml --conf conf/releases/revenue_stream.yaml \
	    --conf conf/releases/revenue_stream_band.yaml
	$(VENV)/bin/dp-spark show --env conf/envs/local.yaml --family wau_mau_daily
	$(VENV)/bin/dp-spark chart --env conf/envs/local.yaml --family wau_mau_daily \
	    --out warehouse/charts/wau_mau_daily.png
	$(VENV)/bin/dp-spark chart --env conf/envs/local.yaml --family revenue_stream \
	    --out warehouse/charts/revenue_stream.png
	$(VENV)/bin/dp-spark chart --env conf/envs/local.yaml --family revenue_stream_band \
	    --out warehouse/charts/revenue_stream_band.png

# README command 2: the whole test suite, statistical tests and PostgreSQL included.
test: setup
	PYTEST_WORKERS=$(SUITE_WORKERS) bash .ci/test.sh

# Everything that needs no Spark, PostgreSQL or JVM (markers given by tests/conftest.py), with
# no service started and no JVM to start: a test that needs one without its marker fails here.
FAST_MARKERS := not spark and not pg and not jvm and not slow
# The layers (import-linter contracts in .importlinter: the pure layers import no pyspark, arrows
# point down), ruff and mypy on the package. .ci/run runs it before the tests.
lint: setup
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check dp_spark
	$(VENV)/bin/mypy --cache-dir /tmp/dp_spark_mypy_cache

test-fast: setup
	JAVA_HOME=/nonexistent/test-fast-has-no-jvm DP_SPARK_TEST_MODE=1 \
	    $(PY) -m pytest -q -rs -p no:cacheprovider --durations=10 $(XDIST) -m "$(FAST_MARKERS)"

# Only the deployment tests, each with its service started and stopped around it.
test-cluster: setup
	DP_SPARK_TEST_MODE=1 bash .ci/cluster.sh $(PY) -m pytest -q -rs tests/deploy/test_cluster.py
test-connect: setup
	DP_SPARK_TEST_MODE=1 bash .ci/connect.sh $(PY) -m pytest -q -rs tests/deploy/test_connect.py
test-deploy: setup
	DP_SPARK_TEST_MODE=1 bash .ci/cluster.sh bash .ci/connect.sh $(PY) -m pytest -q -rs tests/deploy

clean:
	rm -rf warehouse spark-warehouse metastore_db derby.log .pytest_cache
