"""The suite's session evaluates expressions as ``DP_SPARK_TEST_CODEGEN`` says (interpreted by
default), and a test marked ``codegen`` runs on generated code, as production does, with the
session's setting back afterwards (tests/conftest.py ``SESSION_EVALUATION``). The marked test
comes first: the one after it sees the restored setting."""

from __future__ import annotations

import pytest

from tests.conftest import SESSION_EVALUATION, session_evaluation


def _codegen_subtrees(spark) -> str:
    df = spark.range(10).selectExpr("id * 2 AS x").where("x > 3")
    mode = spark._jvm.org.apache.spark.sql.execution.ExplainMode.fromString("codegen")
    text = df._jdf.queryExecution().explainString(mode)
    assert sorted(r.x for r in df.collect()) == [4, 6, 8, 10, 12, 14, 16, 18]
    return text.splitlines()[0]


@pytest.mark.codegen
def test_a_codegen_test_runs_generated_code(spark):
    assert {k: spark.conf.get(k) for k in SESSION_EVALUATION["generated"]} == SESSION_EVALUATION["generated"]
    assert _codegen_subtrees(spark) == "Found 1 WholeStageCodegen subtrees."


def test_the_session_evaluates_as_configured_after_it(spark):
    mode = session_evaluation()
    assert {k: spark.conf.get(k) for k in SESSION_EVALUATION[mode]} == SESSION_EVALUATION[mode]
    want = "Found 0 WholeStageCodegen subtrees." if mode == "interpreted" else "Found 1 WholeStageCodegen subtrees."
    assert _codegen_subtrees(spark) == want
