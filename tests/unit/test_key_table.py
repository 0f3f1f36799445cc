"""``public_keys: {table, column, where}`` without Spark: the spec model (both forms), the env's
``public`` datasets, the refusal of a key table that is not public, the size check against
max_cells, the release id, and the reference backend's key set."""

from __future__ import annotations

from pathlib import Path

import pytest

from dp_spark import precheck
from dp_spark.config import env_from_dict, release_spec_from_dict
from dp_spark.engine import plan_for, release_id_for
from dp_spark.errors import ConfigError
from dp_spark.report import cells_text
from dp_spark.spec.release import release_spec_errors
from dp_spark.spec.runtime import KeyTable, PublicKeys, TableKeys

KEYS = {"table": "products", "column": "product_id", "where": "active AND startswith(product_id, 'p')"}


def spec_dict(form: str, keys: dict | None = None, **extra) -> dict:
    d = {"name": "rev", "dataset": "shop", "privacy_unit": {"kind": "user", "column": "user_id"},
         "bounds": {"max_rows_per_unit": 5, "max_partitions_per_unit": 8},
         "budget": {"id": "b", "measure": "zcdp", "rho": 0.1}}
    entry = {"column": "product", "public_keys": dict(KEYS if keys is None else keys)}
    if form == "multi":
        d.update(statistics=[{"name": "n", "kind": "count"}, {"name": "u", "kind": "distinct_units"}],
                 group_by=[entry])
    else:
        d.update(metric="count", group_by=entry)
    d.update(extra)
    return d


def field(form: str, leaf: str) -> str:
    return f"{'group_by[0]' if form == 'multi' else 'group_by'}.public_keys.{leaf}"


FORMS = ("multi", "single")


@pytest.mark.parametrize("form", FORMS)
def test_a_key_table_parses_into_an_unread_key_set_in_both_forms(form):
    spec = release_spec_from_dict(spec_dict(form))
    (k,) = spec.key_sets
    assert k == TableKeys(column="product", table=KeyTable("products", "product_id", KEYS["where"]))
    assert spec.table_key_sets == ((0, k),) and spec.key_table_pins == ()
    assert spec.bounds.max_partitions_per_unit == 8  # capped only once the keys are read
    with pytest.raises(ConfigError, match=r"public_keys\.table.*read from the key table"):
        _ = spec.cells
    with pytest.raises(ConfigError, match="read from the key table"):
        plan_for(spec)  # no plan, so no release, before the keys are read
    with pytest.raises(ConfigError, match=r"release id of a spec with a key table .*needs its keys read first"):
        release_id_for(spec, "t", 1, "official")
    assert "key table products" in cells_text(spec)


@pytest.mark.parametrize("form", FORMS)
def test_read_keys_are_a_public_key_set_with_the_lists_bounds_and_the_files_version(form):
    spec = release_spec_from_dict(spec_dict(form))
    listed = release_spec_from_dict(spec_dict(form, {"values": ["p1", "p2", "p3"]}))
    read = spec.with_table_keys({0: (("p1", "p2", "p3"), "table-id", 4)})
    (k,) = read.key_sets
    assert isinstance(k, PublicKeys) and k.values == ("p1", "p2", "p3") and k.pin == ("table-id", 4)
    assert read.group_by == k and read.cells == 3 and read.table_key_sets == ()
    assert read.bounds == listed.bounds  # L0 8 -> 3, as the listed keys' at parse time
    assert read.version() == spec.version()  # the spec version is the file's
    assert plan_for(read).event == plan_for(listed).event  # the same cells, the same charge


@pytest.mark.parametrize("form", FORMS)
def test_the_release_id_folds_in_the_key_tables_id_and_version(form):
    spec = release_spec_from_dict(spec_dict(form))
    ids = {release_id_for(spec.with_table_keys({0: (("p1", "p2"), t, v)}), "input", 9, "official")
           for t, v in (("t1", 1), ("t1", 2), ("t2", 1))}
    assert len(ids) == 3
    same = release_id_for(spec.with_table_keys({0: (("p1", "p2"), "t1", 1)}), "input", 9, "official")
    assert same in ids  # the same versions: the same release (a rerun is a cache hit)


@pytest.mark.parametrize("form", FORMS)
def test_too_many_or_no_keys_are_refused_with_the_sizes_never_a_key(form):
    spec = release_spec_from_dict(spec_dict(form, max_cells=10))
    per_key = 2 if form == "multi" else 1
    keys = tuple(f"secret-{i:03d}" for i in range(11))
    with pytest.raises(ConfigError) as exc:
        spec.with_table_keys({0: (keys, "t", 1)})
    msg = str(exc.value)
    assert f"{field(form, 'table')} holds 11 keys" in msg and f"{11 * per_key} cells" in msg
    assert "max_cells=10" in msg and "secret" not in msg
    with pytest.raises(ConfigError, match=r"holds no key"):
        spec.with_table_keys({0: ((), "t", 1)})
    spec.check_key_table_sizes({0: 10 // per_key})  # at the cap: allowed


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("keys, path, problem", [
    ({"table": "products"}, "column", "needs the column"),
    ({"values": ["a"], "column": "c"}, "column", "only a key 'table' takes it"),
    ({"dates": {"start": "2026-11-01", "end": "2026-11-02"}, "where": "x = 1"}, "where", "only a key 'table'"),
    ({"table": "products", "column": "c", "where": "raise_error('x') IS NULL"}, "where", "raise_error"),
    ({"table": "products", "column": "c", "where": "c / 2 > 1"}, "where", "operator '/'"),
    ({"table": "products", "column": "c", "rows": 3}, "rows", "unknown field"),
])
def test_malformed_key_tables_are_refused_by_field_path(form, keys, path, problem):
    errors = release_spec_errors(spec_dict(form, keys))
    assert any(p == field(form, path) and problem in m for p, m in errors), errors


@pytest.mark.parametrize("form", FORMS)
def test_one_of_values_dates_or_table(form):
    errors = release_spec_errors(spec_dict(form, {"table": "products", "column": "c", "values": ["a"]}))
    assert (field(form, "table").rsplit(".", 1)[0], "give exactly one of 'values', 'dates' or 'table'") in errors


def test_a_key_tables_where_may_read_any_of_its_columns():
    """Its columns are the key table's, checked against the table's schema when it is pinned
    (not against the release's 'columns')."""
    spec = release_spec_from_dict(spec_dict("multi", {"table": "products", "column": "c",
                                                      "where": "active AND coalesce(shelf, 0) > 2"}))
    assert spec.key_sets[0].table.where == "active AND coalesce(shelf, 0) > 2"


def test_merge_other_takes_a_key_table_and_refuses_a_clashing_key():
    spec = release_spec_from_dict(spec_dict("multi", min_group_size={"threshold": 5, "strategy": "merge_other",
                                                                      "other_key": "p2"}))
    with pytest.raises(ConfigError, match=r"other_key' is a key of the key table") as exc:
        spec.with_table_keys({0: (("p1", "p2"), "t", 1)})
    assert "p1" not in str(exc.value)


def env(datasets: dict):
    return env_from_dict({"name": "t", "warehouse": "wh", "datasets": datasets}, source="env.yaml", root=Path("/r"))


def test_the_env_declares_public_datasets_and_keeps_bare_locations():
    e = env({"shop": "{warehouse}/input/shop", "products": {"location": "{warehouse}/input/products", "public": True},
             "stores": {"location": "cat.stores"}})
    assert e.datasets == {"shop": "/r/wh/input/shop", "products": "/r/wh/input/products", "stores": "cat.stores"}
    assert e.public_datasets == frozenset({"products"})
    with pytest.raises(ConfigError, match=r"datasets\.products\.publik.*did you mean 'public'"):
        env({"products": {"location": "x/y", "publik": True}})


@pytest.mark.parametrize("form", FORMS)
def test_a_key_table_the_env_does_not_declare_public_is_refused_naming_the_field(form):
    spec = release_spec_from_dict(spec_dict(form), source="rev.yaml")
    private = env({"shop": "x/shop", "products": "x/products"})
    with pytest.raises(ConfigError) as exc:
        precheck.check_key_tables(spec, private.public_datasets, tuple(private.datasets), private.source)
    msg = str(exc.value)
    assert msg.startswith(f"rev.yaml: field '{field(form, 'table')}'") and "public: true" in msg
    undeclared = env({"shop": "x/shop"})
    with pytest.raises(ConfigError, match=r"not declared under 'datasets'"):
        precheck.check_key_tables(spec, undeclared.public_datasets, tuple(undeclared.datasets), undeclared.source)
    public = env({"shop": "x/shop", "products": {"location": "x/products", "public": True}})
    precheck.check_key_tables(spec, public.public_datasets, tuple(public.datasets), public.source)


def test_validate_refuses_a_key_table_that_is_not_public(tmp_path):
    """``dp-spark validate`` (the Checker) refuses it too, without Spark."""
    from dp_spark import commands

    (tmp_path / "budgets.yaml").write_text(
        "version: 1\nbudgets:\n  b:\n    description: t\n    dataset: shop\n    privacy_unit: user\n"
        "    measure: zcdp\n    cap: {rho: 10}\n    statement_delta: 1.0e-7\n    window: none\n")
    (tmp_path / "access.yaml").write_text(f"version: 1\nreleases_dir: {tmp_path}\nprincipals: {{}}\n")
    e = env_from_dict({"name": "t", "warehouse": str(tmp_path / "wh"), "policies": str(tmp_path / "budgets.yaml"),
                       "datasets": {"shop": "x/shop", "products": "x/products"}}, source="env.yaml", root=tmp_path)
    checker = commands.checker(e, principal="someone")
    with pytest.raises(ConfigError, match=r"group_by\[0\]\.public_keys\.table.*not declared public"):
        checker.check(release_spec_from_dict(spec_dict("multi")))


def test_the_reference_backend_reads_a_key_set_as_spark_does():
    from dp_spark.backends.local import table_keys

    rows = [{"product_id": p, "active": a} for p, a in
            (("p3", True), ("p1", True), (None, True), ("p3", True), ("p2", False), ("p10", True))]
    assert table_keys(rows, "product_id") == ("p1", "p10", "p2", "p3")
    assert table_keys(rows, "product_id", where=lambda r: r["active"]) == ("p1", "p10", "p3")
    assert table_keys([{"k": 5}, {"k": 12}], "k") == ("12", "5")  # cast to string, then sorted
