"""Public keys read from a key table (``public_keys: {table, column, where}``), end to end on
Spark: the same cells as the same keys listed; a key table the env does not declare public is
refused before anything is read; a changed key table is a new release, a rerun a cache hit; a
key table too large for max_cells is refused before the charge."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dp_spark.config import load_env
from dp_spark.engine import Engine
from dp_spark.errors import ConfigError
from dp_spark.mechanisms.samplers import SeededNoiseSource

from .conftest import register, write_env

POLICIES = {"version": 1, "budgets": {"shop_user": {
    "description": "test shop", "dataset": "shop", "privacy_unit": "user", "measure": "zcdp",
    "cap": {"rho": 10.0}, "statement_delta": 1.0e-7, "window": "none", "max_per_release": {"rho": 1.0}}}}
#: the key table: p01..p05 and p99 (no sale at all), p04 inactive; the data also sells p06,
#: which the key table does not hold
CATALOGUE = [("p01", True, 1), ("p02", True, 1), ("p03", True, 2), ("p04", False, 2), ("p05", True, 3),
             ("p99", True, 3), (None, True, 1)]
#: the keys the key table gives with where "active": distinct, non-null, sorted
ACTIVE = ["p01", "p02", "p03", "p05", "p99"]
KEY_TABLE = {"table": "products", "column": "product_id", "where": "active AND try_add(shelf, 0) > 0"}


def shop(base: Path, spark, *, products_public: bool = True, products_path: str = "{warehouse}/input/products",
         write_products: bool = True) -> Path:
    """A warehouse with a `shop` dataset (60 users buying p01..p06) and a `products` key table."""
    base.mkdir(parents=True, exist_ok=True)
    pol = base / "policies.yaml"
    pol.write_text(yaml.safe_dump(POLICIES))
    products = {"location": products_path, **({"public": True} if products_public else {})}
    env_file = write_env(base, policies=pol,
                         extra_datasets={"shop": "{warehouse}/input/shop", "products": products})
    rows = [(f"u{i}", f"p0{1 + (i + j) % 6}", float((i * 7 + j) % 90)) for i in range(60) for j in range(1 + i % 3)]
    spark.createDataFrame(rows, "user_id string, product string, order_value double") \
        .write.format("delta").save(str(base / "wh" / "input" / "shop"))
    if write_products:
        spark.createDataFrame(CATALOGUE, "product_id string, active boolean, shelf int") \
            .write.format("delta").save(str(base / "wh" / "input" / "products"))
    return env_file


def spec_dict(name: str, keys: dict, *, form: str = "multi", max_cells: int = 1000) -> dict:
    d = {"name": name, "family": name, "dataset": "shop", "description": "key table",
         "privacy_unit": {"kind": "user", "column": "user_id"},
         "bounds": {"max_rows_per_unit": 3, "max_partitions_per_unit": 10},  # L0 capped at the keys
         "budget": {"id": "shop_user", "measure": "zcdp", "rho": 0.1}, "max_cells": max_cells}
    if form == "multi":
        d["group_by"] = [{"column": "product", "public_keys": keys}]
        d["statistics"] = [{"name": "users", "kind": "distinct_units"},
                           {"name": "revenue", "kind": "sum", "column": "order_value", "lower": 0, "upper": 100}]
    else:
        d["group_by"] = {"column": "product", "public_keys": keys}
        d["metric"] = "count"
    return d


def engine(spark, env_file, seed: int = 7) -> Engine:
    return Engine(load_env(env_file), spark=spark, principal="publisher_bob", source=SeededNoiseSource(seed))


def cells(result) -> list[tuple]:
    return sorted((r["statistic"], r["key"], r["value"], r["ci_low"], r["ci_high"]) for r in result.rows)


def spent(eng: Engine) -> object:
    return eng.ledger.status("shop_user", full=False).remaining


@pytest.mark.parametrize("form", ["multi", "single"])
def test_keys_from_a_public_table_publish_the_cells_of_the_same_keys_listed(spark, tmp_path, form):
    """The same noise source, the same keys: the same cells, value for value. A key of the
    table without a row (p99) has its noisy cell; a key of the data missing from the table
    (p06), an inactive one (p04) and the null key are not published."""
    env_file = shop(tmp_path, spark)
    listed = register(env_file, "listed", spec_dict("listed", {"values": ACTIVE}, form=form))
    table = register(env_file, "from_table", spec_dict("from_table", KEY_TABLE, form=form))
    eng = engine(spark, env_file)
    a = eng.publish(listed)
    eng.close()
    eng = engine(spark, env_file)  # the same seed: the same draws in the same order
    validated = eng.validate(table)
    assert validated.spec.key_sets[0].values == tuple(ACTIVE)
    assert validated.spec.bounds == listed.bounds  # L0 capped at the 5 keys, as the list's
    assert validated.spec.version() == table.version()  # the spec version is the file's
    b = eng.publish(table, validated=validated)
    eng.close()
    assert (a.status, b.status) == ("published", "published")
    assert a.release_id != b.release_id
    assert cells(a) == cells(b)
    assert {r["key"] for r in b.rows} == set(ACTIVE)  # p99 in, p04 / p06 / null out


def test_a_key_table_not_declared_public_is_refused_before_anything_is_read(spark, tmp_path):
    """The env names `products` without public: true, at a path with no table at all: the
    refusal names the field and the fix (had anything been read, the error would be the
    missing table's: the control below). Nothing is created, nothing charged."""
    env_file = shop(tmp_path, spark, products_public=False, write_products=False)
    spec = register(env_file, "from_table", spec_dict("from_table", KEY_TABLE))
    with pytest.raises(ConfigError) as exc:
        engine(spark, env_file).publish(spec)
    msg = str(exc.value)
    assert "group_by[0].public_keys.table" in msg and "not declared public" in msg and "public: true" in msg
    assert not (tmp_path / "wh" / "ledger.db").exists()
    assert not (tmp_path / "wh" / "releases" / "from_table").exists()
    # control: declared public, the same missing path: now the read is tried, and fails as such
    env = yaml.safe_load(env_file.read_text())
    env["datasets"]["products"]["public"] = True
    env_file.write_text(yaml.safe_dump(env))
    with pytest.raises(Exception) as missing:
        engine(spark, env_file).publish(spec)
    assert "not declared public" not in str(missing.value) and "products" in str(missing.value)


def test_a_changed_key_table_is_a_new_release_and_a_rerun_a_cache_hit(spark, tmp_path):
    env_file = shop(tmp_path, spark)
    spec = register(env_file, "from_table", spec_dict("from_table", KEY_TABLE))
    eng = engine(spark, env_file)
    first = eng.publish(spec)
    left = spent(eng)
    again = eng.publish(spec)  # the same data and key table versions
    assert (first.status, again.status) == ("published", "cache_hit")
    assert again.release_id == first.release_id and again.charge is None and spent(eng) == left
    spark.createDataFrame([("p06", True, 1)], "product_id string, active boolean, shelf int") \
        .write.format("delta").mode("append").save(str(tmp_path / "wh" / "input" / "products"))
    second = eng.publish(spec)
    eng.close()
    assert second.status == "published" and second.release_id != first.release_id
    assert {r["key"] for r in second.rows} == set(ACTIVE) | {"p06"}
    assert spent(eng) != left  # the new release is charged


def test_a_key_table_larger_than_max_cells_is_refused_before_the_charge(spark, tmp_path, monkeypatch):
    """5 keys x 2 statistics = 10 cells > max_cells 9: refused with the sizes and the cap, no
    key in the message, nothing charged (a first publish, then the refused one), and no key
    collected on the driver (only counted)."""
    import dp_spark.backends.spark as backend

    env_file = shop(tmp_path, spark)
    eng = engine(spark, env_file)
    eng.publish(register(env_file, "listed", spec_dict("listed", {"values": ["p01"]})))
    left = spent(eng)
    big = register(env_file, "too_big", spec_dict("too_big", KEY_TABLE, max_cells=9))

    def no_collect(*a, **k):
        raise AssertionError("keys collected before their number was checked")

    monkeypatch.setattr(backend, "collect_table_keys", no_collect)
    with pytest.raises(ConfigError) as exc:
        eng.publish(big)
    eng.close()
    msg = str(exc.value)
    assert "holds 5 keys" in msg and "10 cells" in msg and "max_cells=9" in msg
    assert not any(k in msg for k in ACTIVE)
    assert spent(eng) == left
