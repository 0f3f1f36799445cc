"""Permissions: each role allowed and refused; default deny; pre-registration; principals."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from dp_spark.config import load_release_spec
from dp_spark.errors import ConfigError, PermissionDeniedError
from dp_spark.governance.access import (
    PRINCIPAL_ENV,
    AccessPolicy,
    access_policy_for_env,
    access_policy_from_dict,
    authorize,
    is_preregistered,
    load_access_policy,
    resolve_principal,
    resolve_principal_with_source,
)
from tests.shipped_specs import shipped_spec_paths

ROOT = Path(__file__).resolve().parents[2]
DAU = ROOT / "conf/releases/dau_daily.yaml"


@pytest.fixture
def project(tmp_path):
    """A project root with conf/releases (a copy of the real specs) and an access policy."""
    rel = tmp_path / "conf" / "releases"
    rel.mkdir(parents=True)
    for f in shipped_spec_paths():
        shutil.copy(f, rel / f.name)
    pol = tmp_path / "conf" / "policies"
    pol.mkdir()
    shutil.copy(ROOT / "conf/policies/access.yaml", pol / "access.yaml")
    return tmp_path


@pytest.fixture
def policy(project) -> AccessPolicy:
    return load_access_policy(project / "conf/policies/access.yaml").for_env("cluster", {})


def spec_in(project, name="dau_daily.yaml"):
    return project / "conf/releases" / name


def test_shipped_policy_loads_with_demo_principals():
    p = load_access_policy(ROOT / "conf/policies/access.yaml")
    assert p.releases_dir == (ROOT / "conf/releases").resolve()
    assert p.roles_of("analyst_alice") == {"analyst"}
    assert p.roles_of("publisher_bob") == {"publisher"}
    assert p.roles_of("admin_carol") == {"admin"}
    assert p.roles_of("somebody") == frozenset()  # local default inactive until for_env


def test_publisher_official_allowed_and_refused(policy, project):
    path = spec_in(project)
    spec = load_release_spec(path)
    policy.check("publisher_bob", "publish", mode="official", spec_path=path, spec=spec)
    with pytest.raises(PermissionDeniedError, match=r"publisher_bob.*roles: publisher.*publish:exploration"):
        policy.check("publisher_bob", "publish", mode="exploration", budget_id="demo_events_user")
    with pytest.raises(PermissionDeniedError, match="may not rollback: missing permission 'admin'"):
        policy.check("publisher_bob", "rollback")
    with pytest.raises(PermissionDeniedError, match="pre-registered spec file"):
        policy.check("publisher_bob", "publish", mode="official")


def test_analyst_exploration_only_on_its_budgets(policy, project):
    policy.check("analyst_alice", "publish", mode="exploration", budget_id="demo_events_user")
    with pytest.raises(PermissionDeniedError, match=r"analyst_alice' \(roles: analyst\).*publish:official.*"
                                                    "role publisher is required"):
        policy.check("analyst_alice", "publish", mode="official", spec_path=spec_in(project))
    with pytest.raises(PermissionDeniedError, match="explore:other_budget"):
        policy.check("analyst_alice", "publish", mode="exploration", budget_id="other_budget")
    with pytest.raises(PermissionDeniedError, match="must name the budget"):
        policy.check("analyst_alice", "publish", mode="exploration")
    with pytest.raises(PermissionDeniedError, match="admin"):
        policy.check("analyst_alice", "admin")


def test_admin_rollback_and_admin_but_no_publishing(policy, project):
    policy.check("admin_carol", "rollback")
    policy.check("admin_carol", "admin")
    for mode in ("official", "exploration"):
        with pytest.raises(PermissionDeniedError, match=f"admin_carol.*publish:{mode}"):
            policy.check("admin_carol", "publish", mode=mode, spec_path=spec_in(project), budget_id="demo_events_user")


def test_default_deny_unknown_principal_action_mode(policy, project):
    with pytest.raises(PermissionDeniedError, match=r"'mallory' \(roles: none\).*default deny"):
        policy.check("mallory", "publish", mode="official", spec_path=spec_in(project))
    with pytest.raises(PermissionDeniedError, match="unknown action"):
        policy.check("admin_carol", "drop_table")
    with pytest.raises(PermissionDeniedError, match="mode must be"):
        policy.check("publisher_bob", "publish", mode="draft")
    with pytest.raises(PermissionDeniedError, match="<none>"):
        policy.check("", "admin")


def test_local_default_only_in_local_env_without_override(project):
    base = load_access_policy(project / "conf/policies/access.yaml")
    local = base.for_env("local", {})
    local.check("some_os_user", "publish", mode="official", spec_path=spec_in(project))
    local.check("some_os_user", "publish", mode="exploration", budget_id="demo_events_user")
    with pytest.raises(PermissionDeniedError):
        local.check("some_os_user", "rollback")
    # a job that declares its identity is matched strictly, even on the local env
    strict = base.for_env("local", {PRINCIPAL_ENV: "some_os_user"})
    with pytest.raises(PermissionDeniedError, match="not listed"):
        strict.check("some_os_user", "publish", mode="official", spec_path=spec_in(project))
    # listed principals keep their own grant on the local env
    with pytest.raises(PermissionDeniedError):
        local.check("analyst_alice", "publish", mode="official", spec_path=spec_in(project))
    # any other env name never gets the default
    with pytest.raises(PermissionDeniedError):
        base.for_env("cluster", {}).check("some_os_user", "publish", mode="official", spec_path=spec_in(project))


def test_preregistration(policy, project, tmp_path):
    path = spec_in(project)
    spec = load_release_spec(path)
    assert is_preregistered(path, project / "conf/releases", spec)
    # outside the releases dir (a copy elsewhere) -> refused
    elsewhere = tmp_path / "mine.yaml"
    shutil.copy(path, elsewhere)
    assert not is_preregistered(elsewhere, project / "conf/releases", spec)
    with pytest.raises(PermissionDeniedError, match="not under the registered releases directory"):
        policy.check("publisher_bob", "publish", mode="official", spec_path=elsewhere, spec=spec)
    # a symlink inside the dir pointing outside -> refused (resolved path is outside)
    link = project / "conf/releases" / "link.yaml"
    link.symlink_to(elsewhere)
    assert not is_preregistered(link, project / "conf/releases")
    # ../ escapes are resolved too
    assert not is_preregistered(project / "conf/releases/../../mine.yaml", project / "conf/releases")
    # an in-memory change of the spec (edited after loading) no longer matches the file
    from dataclasses import replace
    from dp_spark.core.budget import ZCDP

    edited = replace(spec, charge=ZCDP("0.5"))
    with pytest.raises(PermissionDeniedError, match="content hash differs"):
        policy.check("publisher_bob", "publish", mode="official", spec_path=path, spec=edited)
    # the file edited on disk: loading it gives the new version, which is the registered one now
    data = yaml.safe_load(path.read_text())
    data["budget"]["rho"] = 0.3
    path.write_text(yaml.safe_dump(data))
    assert not is_preregistered(path, project / "conf/releases", spec)  # the old version is gone
    assert is_preregistered(path, project / "conf/releases", load_release_spec(path))
    assert not is_preregistered(project / "conf/releases/missing.yaml", project / "conf/releases")


def test_per_day_restriction_of_a_registered_spec_is_registered(project):
    path = spec_in(project)
    spec = load_release_spec(path)
    day = spec.for_keys(("2026-11-05",), name_suffix="_20261105")
    assert day.version() != spec.version()
    assert is_preregistered(path, project / "conf/releases", day)
    # but a restriction of another spec, or with a widened budget, is not
    from dataclasses import replace
    from dp_spark.core.budget import ZCDP

    assert not is_preregistered(path, project / "conf/releases", replace(day, charge=ZCDP("1")))
    aov = load_release_spec(spec_in(project, "aov_by_region.yaml"))
    assert not is_preregistered(path, project / "conf/releases", aov)


def test_pinned_versions(project):
    path = spec_in(project)
    spec = load_release_spec(path)
    rd = project / "conf/releases"
    assert is_preregistered(path, rd, spec, {"dau_daily": spec.version()})
    assert not is_preregistered(path, rd, spec, {"dau_daily": "0" * 16})
    pol = access_policy_from_dict({"principals": {"bob": {"roles": ["publisher"]}},
                                   "pinned_versions": {"dau_daily": "0" * 16}}, root=project)
    with pytest.raises(PermissionDeniedError, match="pinned"):
        pol.check("bob", "publish", mode="official", spec_path=path, spec=spec)


def test_policy_validation_names_field():
    bad = [
        ({"principals": {"x": {"roles": ["owner"]}}}, "principals.x.roles"),
        ({"principals": {"x": {"roles": []}}}, "principals.x.roles"),
        ({"principals": {"x": {"roles": ["publisher"], "exploration_budgets": ["b"]}}}, "principals.x.exploration_budgets"),
        ({"principals": {"x": {"roles": ["admin"], "color": 1}}}, "principals.x.color"),
        ({"principals": {"bad name": {"roles": ["admin"]}}}, "principals"),
        ({"version": 2}, "version"),
        ({"extra": 1}, "extra"),
        ({"local_default": {"roles": ["publisher"]}}, "local_default.envs"),
        ({"pinned_versions": {"dau": "short"}}, "pinned_versions"),
    ]
    for data, field in bad:
        with pytest.raises(ConfigError, match=f"field '{field}"):
            access_policy_from_dict(data, "access.yaml")
    with pytest.raises(ConfigError, match="not found"):
        load_access_policy("/nonexistent/access.yaml")


def test_policy_for_env_reads_file_beside_budgets(project):
    env = SimpleNamespace(name="local", policies=project / "conf/policies/budgets.yaml")
    p = access_policy_for_env(env, {})
    assert p.active_default is not None and p.roles_of("whoever") == {"publisher", "analyst"}
    env2 = SimpleNamespace(name="local", policies=project / "elsewhere/budgets.yaml")
    with pytest.raises(ConfigError, match="access policy file not found"):
        access_policy_for_env(env2, {})


class FakeLedger:
    def __init__(self):
        self.rows = []

    def append_audit(self, **kw):
        self.rows.append(kw)


def test_authorize_audits_refusals_only(policy, project):
    led = FakeLedger()
    spec = load_release_spec(spec_in(project))
    authorize(policy, "publisher_bob", "publish", mode="official", spec=spec, ledger=led)
    assert led.rows == []
    with pytest.raises(PermissionDeniedError):
        authorize(policy, "analyst_alice", "publish", mode="official", spec=spec, ledger=led)
    assert len(led.rows) == 1
    row = led.rows[0]
    assert row["decision"] == "refused_permission" and row["action"] == "publish:official"
    assert row["principal"] == "analyst_alice" and row["spec_name"] == "dau_daily"
    assert row["spec_version"] == spec.version() and row["release_id"] is None and row["charge_json"] is None
    assert "publish:official" in row["detail"]
    with pytest.raises(PermissionDeniedError):
        authorize(policy, "publisher_bob", "rollback", ledger=led)
    assert led.rows[-1]["action"] == "rollback"


def test_authorize_with_real_ledger(policy, project, tmp_path):
    from dp_spark.ledger import open_ledger

    led = open_ledger(f"sqlite:{tmp_path}/ledger.db", key=b"k" * 32)
    with pytest.raises(PermissionDeniedError):
        authorize(policy, "mallory", "admin", ledger=led)
    rows = led.audit_rows()
    assert len(rows) == 1 and rows[0].decision == "refused_permission" and rows[0].principal == "mallory"
    led.close()


# --------------------------------------------------------------------------------------
# principals
# --------------------------------------------------------------------------------------
class FakeConf:
    def __init__(self, d):
        self.d = d

    def get(self, k, default=None):
        return self.d.get(k, default)


class FakeSpark:
    def __init__(self, user=None, sql_user=None, conf=None, connect=False):
        self._user, self._sql_user, self.conf, self._connect = user, sql_user, FakeConf(conf or {}), connect

    @property
    def sparkContext(self):
        if self._connect:
            raise RuntimeError("[JVM_ATTRIBUTE_NOT_SUPPORTED] sparkContext is not supported in Spark Connect")
        return SimpleNamespace(sparkUser=lambda: self._user)

    def sql(self, q):
        assert "current_user()" in q
        u = self._sql_user
        return SimpleNamespace(first=lambda: {"u": u})


def test_resolve_principal_order(monkeypatch):
    import getpass

    monkeypatch.setattr(getpass, "getuser", lambda: "os_user")
    # the env var is a declaration only on the local env
    assert resolve_principal_with_source(FakeSpark(user="spark_u"), {PRINCIPAL_ENV: "svc_job"},
                                         env_name="local") == ("svc_job", "env")
    db = {"DATABRICKS_RUNTIME_VERSION": "15.4"}
    assert resolve_principal_with_source(FakeSpark(user="root", conf={"spark.databricks.notebook.userName": "a@x.com"}),
                                         db) == ("a@x.com", "notebook")
    assert resolve_principal_with_source(FakeSpark(user="root", sql_user="b@x.com"), db) == ("b@x.com", "notebook")
    assert resolve_principal_with_source(FakeSpark(user="spark_u"), {}) == ("spark_u", "spark")
    assert resolve_principal_with_source(FakeSpark(connect=True, sql_user="connect_u"), {}) == ("connect_u", "spark")
    assert resolve_principal_with_source(FakeSpark(connect=True), {}) == ("os_user", "os")
    assert resolve_principal(None, {}) == "os_user"
    assert resolve_principal(None, {PRINCIPAL_ENV: "  "}, env_name="local") == "os_user"  # blank override ignored


def test_principal_env_var_ignored_outside_local(monkeypatch):
    """On a cluster env the platform's user is the principal: $DP_SPARK_PRINCIPAL (set by
    whoever configures the job) never is, on Databricks, on plain Spark, on Connect or
    without Spark; on the local env it is honoured."""
    import getpass

    monkeypatch.setattr(getpass, "getuser", lambda: "os_user")
    claim = {PRINCIPAL_ENV: "admin_carol"}
    db = dict(claim, DATABRICKS_RUNTIME_VERSION="15.4")
    for env_name in ("prod", "databricks", None):
        assert resolve_principal_with_source(FakeSpark(user="root", sql_user="b@x.com"), db,
                                             env_name=env_name) == ("b@x.com", "notebook")
        assert resolve_principal_with_source(FakeSpark(user="spark_u"), claim, env_name=env_name) == ("spark_u", "spark")
        assert resolve_principal_with_source(FakeSpark(connect=True, sql_user="connect_u"), claim,
                                             env_name=env_name) == ("connect_u", "spark")
        assert resolve_principal(None, claim, env_name=env_name) == "os_user"
    assert resolve_principal(FakeSpark(user="spark_u"), claim, env_name="local") == "admin_carol"
    # the test-only escape (CI sets it): tests may still declare a principal on their envs
    assert resolve_principal(FakeSpark(user="spark_u"), dict(claim, DP_SPARK_TEST_MODE="1"),
                             env_name="prod") == "admin_carol"


def test_resolve_principal_real_session(spark):
    import getpass

    assert resolve_principal(spark, {}) == spark.sparkContext.sparkUser()
    assert resolve_principal_with_source(spark, {})[1] == "spark"
    assert getpass.getuser()
