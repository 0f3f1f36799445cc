"""A user's own specs and the Python API from any folder (issue 32, items 3 and 5).

* ``ReleaseBuilder.to_yaml`` heads a spec file like the shipped ones (the editor's JSON Schema),
  and the header changes nothing in the spec;
* ``plan()`` without a budget id resolves it like ``publish`` does (the one policy of the
  dataset in the charge's measure), from any working folder, or says which field to add;
* ``load_env()`` without an argument finds the project env as the CLI does (not yet: it lives
  in dp_spark/config.py; the test below is a strict xfail until it does).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import dp_spark.api as dp
from dp_spark.config import load_release_spec, release_spec_from_dict
from dp_spark.errors import ConfigError
from dp_spark.ledger.policy import load_policies

ROOT = Path(__file__).resolve().parents[2]
HEADER = "# yaml-language-server: $schema=../release-spec.schema.json"


def builder(budget=None, dataset="demo_events"):
    return (dp.release("user_spec_test").on(dataset, unit="user_id").by(region=["r1", "r2"])
            .bounds(rows_per_unit=5).count("orders").mean("aov", "order_value", 0, 500)
            .charge(rho=0.25, budget=budget))


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """A working folder outside the project, no $DP_SPARK_ENV: as a notebook in another folder."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DP_SPARK_ENV", raising=False)
    return tmp_path


# -- to_yaml: the schema header --------------------------------------------------------------
def test_to_yaml_heads_a_spec_in_conf_releases_like_the_shipped_ones(tmp_path):
    project = tmp_path / "proj"
    (project / "conf" / "releases").mkdir(parents=True)
    (project / "conf" / "release-spec.schema.json").write_text((ROOT / "conf/release-spec.schema.json").read_text())
    path = project / "conf" / "releases" / "mine.yaml"
    b = builder("demo_events_user")
    text = b.to_yaml(path)
    assert path.read_text() == text and text.splitlines()[0] == HEADER
    # the shipped specs start the same way
    assert (ROOT / "conf/releases/aov_by_region.yaml").read_text().splitlines()[0] == HEADER
    # a comment: the spec, its version and so its release ids are those of the header-less YAML
    spec = load_release_spec(path)
    assert spec.version() == b.spec().version() == release_spec_from_dict(yaml.safe_load(text)).version()
    # deeper folders point further up; the text alone is for conf/releases/
    sub = project / "conf" / "releases" / "team"
    sub.mkdir()
    assert b.to_yaml(sub / "x.yaml").splitlines()[0] == "# yaml-language-server: $schema=../../release-spec.schema.json"
    assert b.to_yaml().splitlines()[0] == HEADER
    # no schema above the file: no header (a wrong pointer would be worse than none)
    lone = tmp_path / "lone" / "x.yaml"
    lone.parent.mkdir()
    assert not b.to_yaml(lone).startswith("#")
    assert dp.schema_reference(lone) is None


def test_the_written_spec_validates_against_the_json_schema(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    import json

    schema = json.loads((ROOT / "conf/release-spec.schema.json").read_text())
    text = builder("demo_events_user").to_yaml()
    jsonschema.validate(yaml.safe_load(text), schema)


# -- plan(): the budget resolved as publish resolves it ----------------------------------------
def test_plan_without_a_budget_id_uses_the_datasets_policy_from_any_folder(elsewhere):
    rows = builder().plan(group_size=500)
    assert [r["statistic"] for r in rows] == ["orders", "aov"]
    # the policy found gives the (epsilon, delta) statement too, at its statement delta
    assert all(r["epsilon"] > 0 and r["delta"] == pytest.approx(1e-7) for r in rows)
    # the same as naming the budget
    named = builder("demo_events_user").plan(group_size=500)
    assert [r["expected_abs_error"] for r in rows] == [r["expected_abs_error"] for r in named]


def test_plan_resolves_against_a_given_env_or_policy(elsewhere):
    rows = builder().plan(env=ROOT / "conf/envs/local.yaml")
    assert rows[0]["epsilon"] > 0
    policy = load_policies(ROOT / "conf/policies/budgets.yaml")["demo_events_user"]
    assert builder().plan(budget_policy=policy)[0]["delta"] == pytest.approx(1e-7)
    pure = load_policies(ROOT / "conf/policies/budgets.yaml")["demo_events_user_pure"]
    with pytest.raises(ConfigError) as e:
        builder().plan(budget_policy=pure)  # pure_dp policy, zcdp charge
    assert "budget.id" in str(e.value) and "demo_events_user_pure (pure_dp on 'demo_events')" in str(e.value)


def test_plan_without_a_matching_budget_names_the_field_and_the_declared_budgets(elsewhere):
    with pytest.raises(ConfigError) as e:
        builder(dataset="clickstream").plan()
    msg = str(e.value)
    assert "charge(..., budget='ID') (field budget.id)" in msg
    assert "demo_events_user (zcdp on 'demo_events')" in msg and "demo_events_user_pure" in msg
    assert "must be an identifier" not in msg


def test_plan_with_no_env_to_look_in_says_what_to_give(elsewhere, monkeypatch):
    monkeypatch.setenv("DP_SPARK_ENV", str(elsewhere / "no_such_env.yaml"))
    with pytest.raises(ConfigError) as e:
        builder().plan()
    assert "field budget.id" in str(e.value) and "plan(env=...)" in str(e.value)
    # a named budget plans without any env (no statement then)
    rows = builder("demo_events_user").plan()
    assert rows[0]["epsilon"] is None and rows[0]["expected_abs_error"] > 0


def test_publish_and_plan_fill_in_the_same_budget():
    policies = load_policies(ROOT / "conf/policies/budgets.yaml")
    assert builder().for_policies(policies).spec().budget_id == "demo_events_user"
    with pytest.raises(ConfigError, match=r"field budget\.id"):
        builder(dataset="clickstream").for_policies(policies)


# -- load_env(): the project env by default ------------------------------------------------------
@pytest.mark.xfail(strict=True, raises=TypeError,
                   reason="dp_spark.config.load_env has no default yet (issue 32 item 5: config.py is "
                          "being rewritten; it should resolve None as dp_spark.cli.resolve_env does)")
def test_load_env_without_a_path_finds_the_project_env_from_any_folder(elsewhere):
    from dp_spark.config import load_env

    env = load_env()
    assert env.name == "local" and Path(env.policies) == ROOT / "conf/policies/budgets.yaml"
