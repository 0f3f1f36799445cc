"""databricks.yml is a bundle that references only files that exist, whose structure passes
the Databricks bundle schema's required fields, and whose env file names the ledger's
secrets; conf/envs/databricks.yaml loads.

No network and no Databricks CLI: the schema checks are a SUBSET of the bundle JSON schema
(``databricks bundle schema``; copied from databricks/cli ``bundle/schema/jsonschema.json``
at commit 7bbe2852131b, Aug 2026): for each object kind the bundle uses, its required fields
and its allowed fields (the schema has ``additionalProperties: false`` on all of them), the
``pause_status`` enum, and the form of ``${...}`` / ``{{...}}`` references. Types of scalar
fields, and the kinds this bundle does not use, are not checked. ``databricks bundle
validate`` remains the full check, against a workspace.

The shipped deployment runs as shipped: each job's principal (``run_as``) may publish each of
its specs under the shipped access policy, each spec passes ``dp-spark validate`` on the
Databricks env, and a month of the schedule fits the budgets; every placeholder still in the
bundle, the env and the access policy (``dp_spark.deploy_check``) is named in docs/deploy.md's
"Before the first deploy" checklist, which opens the page.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import pytest
import yaml

from .conftest import ROOT

BUNDLE = ROOT / "databricks.yml"
ENV_FILE = ROOT / "conf" / "envs" / "databricks.yaml"

# kind -> (required fields, allowed fields). Subset of the Databricks bundle schema (above).
SCHEMA: dict[str, tuple[tuple[str, ...], str]] = {
    "root": ((),
        "artifacts bundle environments experimental include permissions presets python resources "
        "run_as scripts sync targets variables workspace"),
    "bundle": (("name",),
        "cluster_id compute_id databricks_cli_version deployment engine git name uuid"),
    "artifact": ((),
        "build dynamic_version executable files path type"),
    "target": ((),
        "artifacts bundle cluster_id compute_id default git mode permissions presets resources "
        "run_as sync variables workspace"),
    "resources": ((),
        "alerts apps catalogs clusters dashboards database_catalogs database_instances experiments "
        "external_locations genie_spaces instance_pools job_runs jobs model_serving_endpoints models "
        "pipelines postgres_branches postgres_catalogs postgres_databases postgres_endpoints "
        "postgres_projects postgres_roles postgres_synced_tables quality_monitors registered_models "
        "schemas secret_scopes secrets sql_warehouses synced_database_tables vector_search_endpoints "
        "vector_search_indexes volumes"),
    "variable": ((),
        "default description lookup type"),
    "job": ((),
        "budget_policy_id continuous description email_notifications environments git_source health "
        "job_clusters lifecycle max_concurrent_runs name notification_settings parameters parent_path "
        "performance_target permissions queue run_as schedule tags tasks timeout_seconds trigger "
        "triggers usage_policy_id webhook_notifications"),
    "task": (("task_key",),
        "ai_runtime_task alert_task clean_rooms_notebook_task compute condition_task dashboard_task "
        "dbt_cloud_task dbt_platform_task dbt_task depends_on description disable_auto_optimization "
        "disabled email_notifications environment_key existing_cluster_id for_each_task "
        "gen_ai_compute_task health job_cluster_key libraries max_retries min_retry_interval_millis "
        "new_cluster notebook_task notification_settings pipeline_task power_bi_task "
        "python_operator_task python_wheel_task retry_on_timeout run_if run_job_task spark_jar_task "
        "spark_python_task spark_submit_task sql_task task_key timeout_seconds webhook_notifications"),
    "python_wheel_task": (("entry_point", "package_name"),
        "entry_point named_parameters package_name parameters"),
    "spark_python_task": (("python_file",),
        "parameters python_file source"),
    "schedule": (("quartz_cron_expression", "timezone_id"),
        "pause_status quartz_cron_expression sql_condition timezone_id"),
    "job_cluster": (("job_cluster_key",),
        "job_cluster_key new_cluster serverless_compute_id"),
    "new_cluster": ((),
        "apply_policy_default_values autoscale autotermination_minutes aws_attributes azure_attributes "
        "cluster_log_conf cluster_name custom_tags data_security_mode dependency_mode docker_image "
        "driver_instance_pool_id driver_node_type_flexibility driver_node_type_id enable_elastic_disk "
        "enable_local_disk_encryption gcp_attributes init_scripts instance_pool_id is_single_node kind "
        "node_type_id num_workers policy_id remote_disk_throughput runtime_engine single_user_name "
        "spark_conf spark_env_vars spark_version ssh_public_keys total_initial_remote_disk_size "
        "use_ml_runtime worker_node_type_flexibility workload_type"),
    "library": ((),
        "cran egg jar maven pypi requirements whl"),
    "job_parameter": (("default", "name"),
        "default name"),
    "run_as": ((),
        "group_name service_principal_name user_name"),
}
PAUSE_STATUS = {"UNPAUSED", "PAUSED"}
TASK_KINDS = {"python_wheel_task", "spark_python_task"}  # the kinds this bundle uses (checked deeper)
# ${var.x}, ${workspace.file_path}, ... (the bundle's interpolation) and {{job.parameters.x}},
# {{secrets/scope/key}} (Databricks' dynamic value and secret references).
BUNDLE_REF = re.compile(r"\$\{([a-z_]+(?:\.[A-Za-z0-9_-]+)+)\}")
DYNAMIC_REF = re.compile(r"\{\{\s*(job\.[a-z_.]+|secrets/[^/{}\s]+/[^/{}\s]+)\s*\}\}")


def _bundle() -> dict:
    return yaml.safe_load(BUNDLE.read_text())


def _check(kind: str, obj, where: str, errors: list[str]) -> dict:
    if not isinstance(obj, dict):
        errors.append(f"{where}: a mapping expected ({kind}), got {type(obj).__name__}")
        return {}
    required, allowed = SCHEMA[kind]
    for field in required:
        if field not in obj:
            errors.append(f"{where}: required field {field!r} is missing ({kind})")
    for field in obj:
        if field not in allowed.split():
            errors.append(f"{where}: field {field!r} is not allowed in a {kind}")
    return obj


def _schema_errors(bundle: dict) -> list[str]:
    errors: list[str] = []
    _check("root", bundle, "<root>", errors)
    _check("bundle", bundle.get("bundle"), "bundle", errors)
    for name, var in (bundle.get("variables") or {}).items():
        _check("variable", var, f"variables.{name}", errors)
    for name, art in (bundle.get("artifacts") or {}).items():
        _check("artifact", art, f"artifacts.{name}", errors)
    for name, target in (bundle.get("targets") or {}).items():
        _check("target", target or {}, f"targets.{name}", errors)
    resources = _check("resources", bundle.get("resources"), "resources", errors)
    for job_key, job in (resources.get("jobs") or {}).items():
        w = f"resources.jobs.{job_key}"
        job = _check("job", job, w, errors)
        if "run_as" in job:
            _check("run_as", job["run_as"], f"{w}.run_as", errors)
        if "schedule" in job:
            s = _check("schedule", job["schedule"], f"{w}.schedule", errors)
            if s.get("pause_status", "UNPAUSED") not in PAUSE_STATUS:
                errors.append(f"{w}.schedule.pause_status: not one of {sorted(PAUSE_STATUS)}")
        for i, p in enumerate(job.get("parameters") or []):
            _check("job_parameter", p, f"{w}.parameters[{i}]", errors)
        cluster_keys = set()
        for i, jc in enumerate(job.get("job_clusters") or []):
            jc = _check("job_cluster", jc, f"{w}.job_clusters[{i}]", errors)
            cluster_keys.add(jc.get("job_cluster_key"))
            if "new_cluster" in jc:
                _check("new_cluster", jc["new_cluster"], f"{w}.job_clusters[{i}].new_cluster", errors)
        tasks = job.get("tasks") or []
        if not tasks:
            errors.append(f"{w}: no tasks")
        keys = [t.get("task_key") for t in tasks if isinstance(t, dict)]
        if len(keys) != len(set(keys)):
            errors.append(f"{w}: duplicate task_key")
        for i, task in enumerate(tasks):
            tw = f"{w}.tasks[{i}]"
            task = _check("task", task, tw, errors)
            kinds = [k for k in task if k.endswith("_task")]
            if len(kinds) != 1:
                errors.append(f"{tw}: exactly one *_task expected, got {kinds}")
            for k in kinds:
                if k in TASK_KINDS:
                    _check(k, task[k], f"{tw}.{k}", errors)
            if task.get("job_cluster_key") is not None and task["job_cluster_key"] not in cluster_keys:
                errors.append(f"{tw}: job_cluster_key {task['job_cluster_key']!r} is not a job cluster")
            for j, lib in enumerate(task.get("libraries") or []):
                _check("library", lib, f"{tw}.libraries[{j}]", errors)
    return errors


def _strings(node):
    if isinstance(node, dict):
        for v in node.values():
            yield from _strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v)
    elif isinstance(node, str):
        yield node


def test_bundle_structure_passes_the_schema_subset():
    assert _schema_errors(_bundle()) == []


def test_schema_check_catches_what_it_claims_to():
    """The checker itself: a missing required field and an unknown field are both reported."""
    bad = _bundle()
    del bad["bundle"]["name"]
    task = bad["resources"]["jobs"]["dp_spark_weekly"]["tasks"][0]
    task.pop("task_key")
    task["python_wheel_task"].pop("entry_point")
    bad["resources"]["jobs"]["dau_backfill"]["schedule"] = {"quartz_cron_expression": "0 0 0 * * ?",
                                                            "pause_status": "OFF"}
    bad["resources"]["jobs"]["dau_backfill"]["job_clusters"][0]["new_cluster"]["spark_env"] = {}
    errors = "\n".join(_schema_errors(bad))
    for expected in ("'name' is missing (bundle)", "'task_key' is missing", "'entry_point' is missing",
                     "'timezone_id' is missing", "pause_status", "'spark_env' is not allowed"):
        assert expected in errors, (expected, errors)


def test_every_reference_is_known_and_every_variable_declared():
    bundle = _bundle()
    declared = set(bundle.get("variables") or {})
    for s in _strings(bundle):
        for ref in BUNDLE_REF.findall(s):
            root, _, rest = ref.partition(".")
            assert root in {"var", "workspace", "bundle", "resources", "artifacts"}, ref
            if root == "var":
                assert rest in declared, f"${{{ref}}} is not declared under variables"
        leftover = DYNAMIC_REF.sub("", BUNDLE_REF.sub("x", s))
        assert "${" not in leftover and "{{" not in leftover, f"malformed reference in {s!r}"


def _expand(value: str, variables: dict) -> str:
    for _ in range(5):
        value = re.sub(r"\$\{var\.([A-Za-z0-9_]+)\}", lambda m: str(variables[m.group(1)].get("default", "")), value)
    return value


def _referenced_paths(bundle: dict) -> list[tuple[str, str]]:
    """(where, repo-relative path) of every file the bundle names."""
    variables = bundle.get("variables") or {}
    out = []
    for s in _strings(bundle):
        v = _expand(s, variables)
        if "${workspace.file_path}/" in v:
            out.append((s, v.split("${workspace.file_path}/", 1)[1]))
    for name, art in (bundle.get("artifacts") or {}).items():
        out.append((f"artifacts.{name}.path", art.get("path", ".")))
    for job in bundle["resources"]["jobs"].values():
        for task in job["tasks"]:
            if "spark_python_task" in task:
                out.append((task["task_key"], task["spark_python_task"]["python_file"]))
    for inc in bundle.get("include") or []:
        out.append(("include", inc))
    return out


def test_every_path_in_the_bundle_exists():
    bundle = _bundle()
    paths = _referenced_paths(bundle)
    # the env file, both specs, the refresh job and the wheel's project directory at least
    assert len(paths) >= 5, paths
    missing = [(w, p) for w, p in paths if not (ROOT / p.removeprefix("./")).exists()]
    assert not missing, f"databricks.yml names files that do not exist: {missing}"
    assert any(p.endswith("conf/envs/databricks.yaml") for _, p in paths)
    # the artifact's directory builds a wheel; the tasks' whl libraries are its output glob
    for name, art in bundle["artifacts"].items():
        project = ROOT / art.get("path", ".")
        assert (project / "setup.cfg").is_file() and (project / "pyproject.toml").is_file(), name
        assert "-w dist" in art["build"], f"artifacts.{name}: the wheel must land in dist/"
    for job in bundle["resources"]["jobs"].values():
        for task in job["tasks"]:
            for lib in task.get("libraries") or []:
                assert lib.get("whl") == "./dist/*.whl", (task["task_key"], lib)


def test_job_clusters_pass_the_ledger_secrets_from_the_scope():
    bundle = _bundle()
    scope = bundle["variables"]["secret_scope"]["default"]
    env = yaml.safe_load(ENV_FILE.read_text())
    for job_key, job in bundle["resources"]["jobs"].items():
        for jc in job["job_clusters"]:
            env_vars = jc["new_cluster"].get("spark_env_vars") or {}
            assert env_vars.get("DP_SPARK_LEDGER_KEY") == "{{secrets/${var.secret_scope}/ledger_hmac_key}}", job_key
            assert env_vars.get("PGPASSWORD") == "{{secrets/${var.secret_scope}/ledger_db_password}}", job_key
    # the env file names the same secrets (serverless and notebooks have no cluster env vars)
    assert env["ledger_key_secret"] == {"scope": scope, "key": "ledger_hmac_key"}
    assert env["ledger_password_secret"] == {"scope": scope, "key": "ledger_db_password"}
    # no secret value anywhere in the bundle or the env file
    for text in (BUNDLE.read_text(), ENV_FILE.read_text()):
        assert not re.search(r"(?i)postgres(ql)?://[^@\s]*:[^@\s]*@", text), "password in a URL"


def test_databricks_env_loads_with_unity_catalog_tables_and_a_postgres_ledger(monkeypatch):
    from dp_spark.config import load_env

    monkeypatch.delenv("DATABRICKS_RUNTIME_VERSION", raising=False)
    env = load_env(ENV_FILE)
    assert env.name == "databricks" and env.master is None
    assert env.datasets and all("/" not in t and t.count(".") == 2 for t in env.datasets.values()), \
        "inputs are Unity Catalog tables (catalog.schema.table)"
    assert env.ledger_url.startswith("postgresql://")
    assert env.ledger_key_secret == ("dp_spark", "ledger_hmac_key")
    assert env.policies.is_file()


def test_secret_refs_are_read_on_databricks_only(monkeypatch):
    from dp_spark import secrets
    from dp_spark.errors import ConfigError

    refs = {"ledger_key_secret": ("dp_spark", "k"), "ledger_password_secret": None}
    read = []

    def fake_get(scope, key):
        read.append((scope, key))
        return "x" * 40

    # off Databricks: nothing is read or exported
    monkeypatch.delenv("DATABRICKS_RUNTIME_VERSION", raising=False)
    environ: dict = {}
    assert secrets.export_secrets(refs, "t", environ=environ) == [] and environ == {} and not read
    # on Databricks: exported when unset, left alone when already set (spark_env_vars)
    monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "17.3")
    monkeypatch.setattr(secrets, "_databricks_get_secret", fake_get)
    environ = {}
    assert secrets.export_secrets(refs, "t", environ=environ) == ["DP_SPARK_LEDGER_KEY"]
    assert environ == {"DP_SPARK_LEDGER_KEY": "x" * 40} and read == [("dp_spark", "k")]
    environ = {"DP_SPARK_LEDGER_KEY": "from-the-cluster"}
    assert secrets.export_secrets(refs, "t", environ=environ) == []
    # an unreadable secret is an error naming it, never a value
    def failing(scope, key):
        raise RuntimeError("secret-value-would-be-here")
    monkeypatch.setattr(secrets, "_databricks_get_secret", failing)
    with pytest.raises(ConfigError) as e:
        secrets.export_secrets(refs, "t", environ={})
    assert "dp_spark/k" in str(e.value) and "secret-value" not in str(e.value)
    # malformed references are refused at load
    with pytest.raises(ConfigError):
        secrets.parse_secret_ref({"scope": "s"}, "t", "ledger_key_secret")


def test_the_wheel_does_not_install_spark_or_delta():
    """pyspark and delta-spark are the `spark` extra only (a Databricks Runtime ships its own)."""
    import configparser

    cp = configparser.ConfigParser()
    cp.read(ROOT / "setup.cfg")
    requires = [r.strip() for r in cp["options"]["install_requires"].splitlines() if r.strip()]
    assert not [r for r in requires if re.match(r"(?i)(pyspark|delta-spark)\b", r)], requires
    extra = [r.strip() for r in cp["options.extras_require"]["spark"].splitlines() if r.strip()]
    assert any(r.startswith("pyspark") for r in extra) and any(r.startswith("delta-spark") for r in extra)
    assert "3.13" in cp["options"]["python_requires"] or "<3.14" in cp["options"]["python_requires"]


# --------------------------------------------------------------------------------------
# The shipped deployment runs as shipped: principal, access policy, env, specs and budgets agree
# --------------------------------------------------------------------------------------
RUN_DATE = date(2026, 12, 1)  # a job's date: the DAU refresh publishes the day before it
DEPLOY_DOC = ROOT / "docs" / "deploy.md"


@dataclass(frozen=True)
class JobSpec:
    job: str
    task: str
    principal: str
    env_file: Path
    spec_file: Path
    command: str          # "publish" or "refresh"
    scheduled: bool
    cron: str | None


def _resolve_ref(value: str, variables: dict) -> str:
    value = _expand(value, variables)
    return value.replace("${workspace.file_path}", str(ROOT))


def _job_specs(bundle: dict) -> list[JobSpec]:
    """Every (job, task, spec) of the bundle with its principal and env file, as they resolve
    from the bundle's variable defaults and the synced files (= this checkout)."""
    variables = bundle.get("variables") or {}
    out = []
    for job_key, job in bundle["resources"]["jobs"].items():
        run_as = job.get("run_as") or {}
        principal = _resolve_ref(run_as.get("service_principal_name") or run_as.get("user_name") or "", variables)
        cron = (job.get("schedule") or {}).get("quartz_cron_expression")
        for task in job["tasks"]:
            if "python_wheel_task" in task:
                argv = [_resolve_ref(a, variables) for a in task["python_wheel_task"]["parameters"]]
                command, argv = argv[0], argv[1:]
            else:
                argv = [_resolve_ref(a, variables) for a in task["spark_python_task"]["parameters"]]
                command = "refresh"
            env_file = Path(argv[argv.index("--env") + 1])
            for i, a in enumerate(argv):
                if a == "--conf":
                    out.append(JobSpec(job_key, task["task_key"], principal, env_file, Path(argv[i + 1]),
                                       command, cron is not None, cron))
    return out


def _spec_as_run(js: JobSpec):
    """The spec the task publishes: the file's, or (a refresh) its restriction to a day."""
    from dp_spark.config import load_release_spec
    from dp_spark.schedule import day_spec

    spec = load_release_spec(js.spec_file, run_date=RUN_DATE)
    return day_spec(spec, date.fromordinal(RUN_DATE.toordinal() - 1)) if js.command == "refresh" else spec


def test_each_job_principal_may_publish_each_of_its_specs_under_the_shipped_policies(monkeypatch, capsys):
    """Loads databricks.yml, resolves each job's principal, env and specs, and runs on each what
    `dp-spark validate` and the engine run before the charge: the spec against the env and its
    budgets, then the access check (publisher, pre-registered spec) for the job's principal."""
    from dp_spark import cli
    from dp_spark.config import load_env
    from dp_spark.governance.access import access_policy_for_env, authorize

    monkeypatch.delenv("DATABRICKS_RUNTIME_VERSION", raising=False)
    takes_principal = any("--principal" in a.option_strings for a in cli.command_parser("validate")._actions)
    jobs = _job_specs(_bundle())
    assert {j.job for j in jobs} == set(_bundle()["resources"]["jobs"]) and len(jobs) >= 3
    for js in jobs:
        where = f"{js.job}.{js.task} ({js.spec_file.name})"
        assert js.principal, f"{where}: no run_as principal"
        assert js.env_file == ENV_FILE, where
        capsys.readouterr()
        argv = ["--env", str(js.env_file), "--conf", str(js.spec_file)]
        if takes_principal:  # validate checks the access policy too: as the job's principal
            argv += ["--principal", js.principal]
        assert cli.validate_main(argv) == 0, f"{where}: {capsys.readouterr().err}"
        assert ": ok (" in capsys.readouterr().out, where
        env = load_env(js.env_file)
        # no $DP_SPARK_PRINCIPAL on a job: the principal is the platform's, matched strictly
        policy = access_policy_for_env(env, environ={})
        assert policy.active_default is None, "the local default must not apply to the databricks env"
        authorize(policy, js.principal, "publish", mode="official", spec=_spec_as_run(js))


def test_the_bundle_principal_is_the_access_policy_publisher():
    bundle = _bundle()
    principal = bundle["variables"]["principal"]["default"]
    access = yaml.safe_load((ROOT / "conf/policies/access.yaml").read_text())
    assert "publisher" in access["principals"].get(principal, {}).get("roles", []), \
        f"databricks.yml runs the jobs as {principal!r}, which conf/policies/access.yaml does not list as a publisher"
    for job_key, job in bundle["resources"]["jobs"].items():
        assert job["run_as"] == {"service_principal_name": "${var.principal}"}, job_key


def test_a_principal_the_policy_does_not_list_is_refused_with_the_fix(monkeypatch):
    """What a deployer sees when the two files disagree: the principal, and the file to add it to."""
    from dp_spark.config import load_env
    from dp_spark.errors import PermissionDeniedError
    from dp_spark.governance.access import access_policy_for_env, authorize

    monkeypatch.delenv("DATABRICKS_RUNTIME_VERSION", raising=False)
    js = next(j for j in _job_specs(_bundle()) if j.command == "publish")
    policy = access_policy_for_env(load_env(js.env_file), environ={})
    with pytest.raises(PermissionDeniedError) as e:
        authorize(policy, "0000aaaa-unlisted-sp", "publish", mode="official", spec=_spec_as_run(js))
    assert "0000aaaa-unlisted-sp" in str(e.value) and "not listed" in str(e.value)
    assert str(ROOT / "conf/policies/access.yaml") in str(e.value)


def _runs_per_month(cron: str) -> int:
    """Worst-case runs in a calendar month of a quartz cron (sec min hour dom month dow)."""
    fields = cron.split()
    assert len(fields) in (6, 7), cron
    sec, minute, hour, dom, month, dow = fields[:6]
    assert month == "*" and not any(c in sec + minute + hour for c in "*/,-"), f"one run a day at most: {cron}"
    if dom in ("*", "?") and dow in ("*", "?"):
        return 31
    if dom == "?":
        days = dow.split(",")
        assert all(re.fullmatch(r"[1-7]|MON|TUE|WED|THU|FRI|SAT|SUN", d) for d in days), cron
        return 5 * len(days)
    if dow == "?" and re.fullmatch(r"\d+(,\d+)*", dom):
        return len(dom.split(","))
    raise AssertionError(f"teach this test the schedule {cron!r}")


def test_a_month_of_the_schedule_fits_the_budgets():
    """Every scheduled task charges its spec (a refresh: one day's cell) once per run; in the
    worst month the charges of each budget fit its cap, and each charge its max_per_release."""
    from dp_spark.config import load_env
    from dp_spark.ledger.policy import load_policies

    policies = load_policies(load_env(ENV_FILE).policies)
    spent: dict[str, object] = {}
    for js in _job_specs(_bundle()):
        if not js.scheduled:
            continue  # the backfill is run by a person, against what the schedule leaves
        spec = _spec_as_run(js)
        policy = policies[spec.budget_id]
        assert policy.window.kind == "monthly", f"{spec.budget_id}: teach this test the {policy.window.kind} window"
        if policy.max_per_release is not None:
            assert spec.charge.fits_in(policy.max_per_release), (js.task, spec.charge, policy.max_per_release)
        month = spec.charge * _runs_per_month(js.cron)
        spent[spec.budget_id] = month if spec.budget_id not in spent else spent[spec.budget_id] + month
    assert spent, "no scheduled charge found"
    for budget_id, total in spent.items():
        assert total.fits_in(policies[budget_id].cap), \
            f"a month of the schedule spends {total} of {budget_id}, over its cap {policies[budget_id].cap}"


def test_the_month_arithmetic_the_bundle_states_is_the_schedule():
    """databricks.yml's comment gives the month's charges: they are the computed ones."""
    from fractions import Fraction

    total = Fraction(0)
    for js in _job_specs(_bundle()):
        if js.scheduled:
            total += _spec_as_run(js).charge.rho * _runs_per_month(js.cron)
    assert total == Fraction("1.87")

    def flat(text: str) -> str:  # prose across lines (and comment lines) as one line
        return re.sub(r"\s*\n[\s#]*", " ", text)

    assert "rho 1.87 per month" in flat(BUNDLE.read_text()) and "rho 1.87 per month" in flat(DEPLOY_DOC.read_text())


def _checklist() -> str:
    """docs/deploy.md's first section: the "Before the first deploy" checklist."""
    text = DEPLOY_DOC.read_text()
    sections = re.split(r"^## ", text, flags=re.MULTILINE)
    assert len(sections) > 2 and sections[1].startswith("Before the first deploy"), \
        "docs/deploy.md must open with its 'Before the first deploy' checklist"
    return sections[1]


def test_deploy_doc_opens_with_a_checklist_naming_every_placeholder(monkeypatch):
    from dp_spark.config import load_env
    from dp_spark.deploy_check import env_placeholders

    monkeypatch.delenv("DATABRICKS_RUNTIME_VERSION", raising=False)
    checklist = _checklist()
    found = env_placeholders(load_env(ENV_FILE), ENV_FILE)
    files = {p.path for p in found}
    # the env, the bundle and the access policy each still carry the shipped stand-ins
    assert files == {"conf/envs/databricks.yaml", "databricks.yml", "conf/policies/access.yaml"}, found
    for p in found:
        parts = p.field.split(".")
        if p.field == "variables.principal.default":
            name = "var.principal"
        elif parts[0] == "variables":
            name = parts[1]  # variables.node_type_id.default -> node_type_id
        else:
            name = parts[-1]  # datasets.demo_events -> demo_events
        assert f"`{name}`" in checklist and p.path in checklist, (str(p), name)
    for must in ("secret scope", "ledger_hmac_key", "ledger_db_password", "application id",
                 "python -m dp_spark.deploy_check --env conf/envs/databricks.yaml", "dp-spark validate"):
        assert must in checklist, must
    # the two halves of the principal are named together, so that they are changed together
    assert "var.principal" in checklist and "conf/policies/access.yaml" in checklist
    # the local env has nothing to replace
    assert env_placeholders(load_env(ROOT / "conf/envs/local.yaml"), ROOT / "conf/envs/local.yaml") == []
