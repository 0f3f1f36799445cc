# dp_spark: the two commands of the README are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))
export SPARK_LOCAL_IP := 127.0.0.1

.PHONY: setup jars demo test test-fast test-cluster test-connect test-deploy clean

setup: $(VENV)/.installed jars

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

# Delta's JVM jars from Maven Central into .jars/ (no Ivy at Spark start-up).
jars: .jars/.resolved

.jars/.resolved: conf/jvm/pom.xml
	mvn -q -f conf/jvm/pom.xml dependency:copy-dependencies
	touch $@

# README command 1: set up, generate the demo data, publish the DAU trend and the AOV
# per region on the embedded default (local Spark, local Delta warehouse, SQLite ledger).
demo: setup
	$(VENV)/bin/dp-spark generate-demo --env conf/envs/local.yaml
	$(PY) jobs/publish_release.py --env conf/envs/local.yaml \
	    --conf conf/releases/dau_daily.yaml --conf conf/releases/aov_by_region.yaml

# README command 2: the whole test suite, statistical tests and PostgreSQL included.
test: setup
	bash .ci/test.sh

test-fast: setup
	bash .ci/test.sh -m "not slow"

# Only the deployment tests, each with its service started and stopped around it.
test-cluster: setup
	DP_SPARK_TEST_MODE=1 bash .ci/cluster.sh $(PY) -m pytest -q -rs tests/deploy/test_cluster.py
test-connect: setup
	DP_SPARK_TEST_MODE=1 bash .ci/connect.sh $(PY) -m pytest -q -rs tests/deploy/test_connect.py
test-deploy: setup
	DP_SPARK_TEST_MODE=1 bash .ci/cluster.sh bash .ci/connect.sh $(PY) -m pytest -q -rs tests/deploy

clean:
	rm -rf warehouse spark-warehouse metastore_db derby.log .pytest_cache
