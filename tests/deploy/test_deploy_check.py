"""dp_spark.deploy_check: the placeholders a deployment still carries, with file, line and field.

The shipped files are checked in tests/deploy/test_bundle.py (every placeholder is named in
docs/deploy.md's checklist); here the rules, on a throwaway project."""

from __future__ import annotations

from pathlib import Path

import yaml

from dp_spark.config import load_env
from dp_spark.deploy_check import env_placeholders, main, placeholders_in

ROOT = Path(__file__).resolve().parents[2]


def project(tmp_path: Path, *, env_text: str, access_text: str = "version: 1\n", bundle: str | None = None,
            name: str = "cloud") -> Path:
    (tmp_path / "conf" / "envs").mkdir(parents=True)
    (tmp_path / "conf" / "policies").mkdir(parents=True)
    (tmp_path / "conf" / "policies" / "budgets.yaml").write_text((ROOT / "conf/policies/budgets.yaml").read_text())
    (tmp_path / "conf" / "policies" / "access.yaml").write_text(access_text)
    if bundle is not None:
        (tmp_path / "databricks.yml").write_text(bundle)
    env = tmp_path / "conf" / "envs" / f"{name}.yaml"
    env.write_text(env_text)
    return env


ENV = """\
# A comment line that mentions a # PLACEHOLDER is prose, not a marker
name: cloud
warehouse: /Volumes/c/s/wh          # PLACEHOLDER: your volume
datasets:
  events: cat.sch.events            # PLACEHOLDER: your input table
  other: "a#b.c.d"                  # a '#' inside quotes is no comment
ledger_url: postgresql://u@db.internal.corp:5432/x
"""

ACCESS = """\
version: 1
principals:
  someone_real:
    roles: [publisher]
  the_sp:   # PLACEHOLDER(cloud): the service principal's application id
    roles: [publisher]
  other_env_sp:   # PLACEHOLDER(elsewhere): not this env's
    roles: [publisher]
  unscoped_sp:   # PLACEHOLDER: a shared file's marker must name its env
    roles: [publisher]
"""


def test_markers_with_field_paths_and_the_env_scope_of_shared_files(tmp_path):
    env_file = project(tmp_path, env_text=ENV, access_text=ACCESS)
    found = env_placeholders(load_env(env_file), env_file)
    got = [(p.path, p.line, p.field, p.value, p.hint) for p in found]
    assert got == [
        ("conf/envs/cloud.yaml", 3, "warehouse", "/Volumes/c/s/wh", "your volume"),
        ("conf/envs/cloud.yaml", 5, "datasets.events", "cat.sch.events", "your input table"),
        ("conf/policies/access.yaml", 5, "principals.the_sp", "", "the service principal's application id"),
    ]
    assert str(found[0]) == "conf/envs/cloud.yaml:3: warehouse = /Volumes/c/s/wh is a placeholder: your volume"


def test_a_reserved_example_host_is_reported_even_unmarked(tmp_path):
    env_file = project(tmp_path, env_text="name: cloud\nwarehouse: wh\ndatasets: {e: c.s.t}\n"
                                          "ledger_url: postgresql://u@ledger.example.com:5432/x\n")
    (p,) = env_placeholders(load_env(env_file), env_file)
    assert p.field == "ledger_url" and p.value == "ledger.example.com" and "RFC 2606" in p.hint
    # marked: reported once, with the marker's hint
    env_file.write_text(env_file.read_text().replace("/x\n", "/x   # PLACEHOLDER: your host\n"))
    (p,) = env_placeholders(load_env(env_file), env_file)
    assert p.hint == "your host" and p.line == 4


def test_the_bundle_counts_only_when_it_names_the_env(tmp_path):
    bundle = ("variables:\n  env_file:\n    default: ${workspace.file_path}/conf/envs/cloud.yaml\n"
              "  principal:\n    default: sp   # PLACEHOLDER(cloud): your service principal\n")
    env_file = project(tmp_path, env_text="name: cloud\nwarehouse: wh\ndatasets: {e: c.s.t}\n", bundle=bundle)
    (p,) = env_placeholders(load_env(env_file), env_file)
    assert (p.path, p.field, p.value) == ("databricks.yml", "variables.principal.default", "sp")
    (tmp_path / "databricks.yml").write_text(bundle.replace("cloud.yaml", "another.yaml"))
    assert env_placeholders(load_env(env_file), env_file) == []


def test_main_exits_1_while_placeholders_remain_then_0(tmp_path, capsys):
    env_file = project(tmp_path, env_text=ENV)
    assert main(["--env", str(env_file)]) == 1
    out = capsys.readouterr().out
    assert "conf/envs/cloud.yaml:3: warehouse" in out and "2 placeholder(s) left for env 'cloud'" in out
    env_file.write_text(ENV.replace("# PLACEHOLDER: your volume", "").replace("# PLACEHOLDER: your input table", ""))
    assert main(["--env", str(env_file)]) == 0
    assert "no placeholder left" in capsys.readouterr().out
    assert main(["--env", str(tmp_path / "missing.yaml")]) == 2


def test_placeholders_in_a_plain_file(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("a:\n  b:\n    c: 1   # PLACEHOLDER(e1): one\n  d: 2   # PLACEHOLDER: two\n")
    assert [(p.field, p.value) for p in placeholders_in(f, "e1", own_file=False)] == [("a.b.c", "1")]
    assert [(p.field, p.value) for p in placeholders_in(f, "e2", own_file=True)] == [("a.d", "2")]
    assert yaml.safe_load(f.read_text()) == {"a": {"b": {"c": 1}, "d": 2}}  # markers are plain comments
