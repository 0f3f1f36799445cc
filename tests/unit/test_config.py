"""Release specs and env files: validated before Spark starts, errors name the field."""

from __future__ import annotations

import copy
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from dp_spark.core.budget import PureDP, ZCDP
from dp_spark.config import (
    load_env,
    load_release_spec,
    release_spec_from_dict,
)
from dp_spark.errors import ConfigError, DpSparkError, InvalidBoundsError
from dp_spark.core.units import Neighbouring, UnitKind

ROOT = Path(__file__).resolve().parents[2]

BASE = {
    "name": "aov",
    "dataset": "demo_events",
    "privacy_unit": {"kind": "user", "column": "user_id"},
    "metric": "mean",
    "group_by": {"column": "region", "public_keys": {"values": ["a", "b", "c"]}},
    "value": {"column": "order_value", "lower": 0, "upper": 500},
    "bounds": {"max_rows_per_unit": 5, "max_partitions_per_unit": 1},
    "budget": {"id": "b1", "measure": "pure_dp", "epsilon": 1.0},
    "mean": {"assumed_group_size": 100, "min_count": 5},
}


def spec(**changes):
    d = copy.deepcopy(BASE)
    for k, v in changes.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = v
    return release_spec_from_dict(d, source="t.yaml")


def test_shipped_specs_and_env_load():
    dau = load_release_spec(ROOT / "conf/releases/dau_daily.yaml")
    aov = load_release_spec(ROOT / "conf/releases/aov_by_region.yaml")
    assert dau.metric == "distinct_units" and dau.cells == 30
    assert dau.group_by.values[0] == "2026-11-01" and dau.group_by.values[-1] == "2026-11-30"
    assert dau.bounds.max_partitions_per_unit == 30
    assert aov.cells == 20 and aov.bounds.max_partitions_per_unit == 1
    assert isinstance(aov.charge, ZCDP)
    env = load_env(ROOT / "conf/envs/local.yaml")
    assert env.datasets["demo_events"].endswith("warehouse/input/demo_events")
    assert env.ledger_url.startswith("sqlite:") and env.ledger_url.endswith("warehouse/ledger.db")
    assert Path(env.output_root).is_absolute()


def test_defaults_and_derived_fields():
    s = spec()
    assert s.unit.kind is UnitKind.USER and s.neighbouring is Neighbouring.ADD_REMOVE_UNIT
    assert s.family == "aov" and s.columns == ("user_id", "region", "order_value")
    assert s.charge == PureDP(1) and s.confidence == Fraction(95, 100)
    assert s.value.lower == 0 and s.value.upper == 500
    # the grid exponent comes from the public bounds alone
    assert s.value.grid_exponent <= 0


def test_version_is_a_content_hash():
    a, b = spec(), spec()
    assert a.version() == b.version()
    c = spec(bounds={"max_rows_per_unit": 6, "max_partitions_per_unit": 1})
    assert c.version() != a.version()


def test_bounds_rounded_outward_to_the_grid():
    s = spec(value={"column": "order_value", "lower": 0.1, "upper": 9.3})
    step = Fraction(2) ** (s.value.grid_exponent + 1)
    assert s.value.lower <= Fraction("0.1") and s.value.upper >= Fraction("9.3")
    assert (s.value.lower / step).denominator == 1 and (s.value.upper / step).denominator == 1
    assert s.value.upper - Fraction("9.3") < step


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"name": "bad name"}, "name"),
        ({"privacy_unit": {"kind": "household", "column": "user_id"}}, "privacy_unit.kind"),
        ({"privacy_unit": None}, "privacy_unit"),
        ({"neighbouring": "swap"}, "neighbouring"),
        ({"neighbouring": "event"}, "neighbouring"),
        ({"metric": "median"}, "metric"),
        ({"value": None}, "value"),
        ({"bounds": {"max_rows_per_unit": 0}}, "bounds.max_rows_per_unit"),
        ({"bounds": {"max_rows_per_unit": 2, "max_partitions_per_unit": 0}}, "bounds.max_partitions_per_unit"),
        ({"bounds": {"max_rows_per_unit": 2, "k": 1}}, "bounds.k"),
        ({"budget": {"id": "b1", "measure": "pure_dp", "epsilon": 0}}, "budget.epsilon"),
        ({"budget": {"id": "b1", "measure": "pure_dp", "epsilon": float("nan")}}, "budget.epsilon"),
        ({"budget": {"id": "b1", "measure": "zcdp", "rho": -1}}, "budget.rho"),
        ({"budget": {"id": "b1", "measure": "approx_dp", "epsilon": 1}}, "budget.measure"),
        ({"budget": {"id": "b1", "measure": "zcdp", "epsilon": 1}}, "budget.delta"),
        ({"group_by": {"column": "region", "public_keys": {"values": []}}}, "group_by.public_keys.values"),
        ({"group_by": {"column": "region", "public_keys": {"values": ["a", "a"]}}}, "group_by.public_keys"),
        ({"group_by": {"column": "d", "public_keys": {"dates": {"start": "2026-02-01", "end": "2026-01-01"}}}},
         "group_by.public_keys.dates"),
        ({"confidence": 1.5}, "confidence"),
        ({"on_exhausted": "shrug"}, "on_exhausted.policy"),
        ({"on_exhausted": {"policy": "degrade"}}, "on_exhausted.fallback"),
        ({"columns": ["user_id"]}, "columns"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_bad_specs_name_the_field(changes, field):
    with pytest.raises(ConfigError) as exc:
        spec(**changes)
    assert f"'{field}'" in str(exc.value)
    assert "t.yaml" in str(exc.value)


@pytest.mark.parametrize("lo, hi", [(5, 1), (0, float("inf")), (float("nan"), 1)])
def test_bad_clamp_bounds(lo, hi):
    with pytest.raises(DpSparkError):
        spec(value={"column": "order_value", "lower": lo, "upper": hi})


def test_many_segments_guard():
    keys = [f"k{i}" for i in range(1001)]
    with pytest.raises(ConfigError, match="max_cells"):
        spec(group_by={"column": "region", "public_keys": {"values": keys}})
    s = spec(group_by={"column": "region", "public_keys": {"values": keys}}, max_cells=2000)
    assert s.cells == 1001
    with pytest.raises(ConfigError, match="max_cells"):
        spec(max_cells=10**8)  # above the hard limit (10M)


def test_for_keys_restricts_and_caps_l0():
    dau = load_release_spec(ROOT / "conf/releases/dau_daily.yaml")
    one = dau.for_keys(("2026-11-05",), name_suffix="_20261105")
    assert one.cells == 1 and one.bounds.max_partitions_per_unit == 1
    assert one.family == dau.family and one.version() != dau.version()
    with pytest.raises(ConfigError):
        dau.for_keys(("2027-01-01",), name_suffix="_x")


def test_yaml_errors_do_not_echo_content(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("name: [unclosed secret_value_123\n")
    with pytest.raises(ConfigError) as exc:
        load_release_spec(p)
    assert "secret_value_123" not in str(exc.value)
    with pytest.raises(ConfigError, match="not found"):
        load_release_spec(tmp_path / "missing.yaml")


def test_env_relative_paths(tmp_path):
    (tmp_path / "conf" / "envs").mkdir(parents=True)
    env_file = tmp_path / "conf" / "envs" / "t.yaml"
    env_file.write_text(yaml.safe_dump({"name": "t", "warehouse": "wh", "datasets": {"x": "{warehouse}/in/x"}}))
    env = load_env(env_file)
    assert env.warehouse == (tmp_path / "wh").resolve()
    assert env.datasets["x"] == str((tmp_path / "wh" / "in" / "x").resolve())
    assert env.ledger_url == f"sqlite:{(tmp_path / 'wh').resolve()}/ledger.db"
    with pytest.raises(ConfigError, match="'datasets'"):
        from dp_spark.config import env_from_dict

        env_from_dict({"name": "t", "warehouse": "wh"}, source="e.yaml")


def test_assumed_mean_is_optional_public_and_checked():
    plain = spec()
    assert plain.mean.assumed_mean is None and "assumed_mean" not in plain.canonical()["mean"]
    s = spec(mean={"assumed_group_size": 100, "min_count": 5, "assumed_mean": 45.5})
    assert s.mean.assumed_mean == Fraction("45.5") and s.canonical()["mean"]["assumed_mean"] == "91/2"
    assert s.version() != plain.version()  # a different split is a different release
    with pytest.raises(ConfigError, match=r"t\.yaml.*mean\.assumed_mean.*within"):
        spec(mean={"assumed_group_size": 100, "assumed_mean": 501})
    with pytest.raises(ConfigError, match=r"mean\.assumed_mean"):
        spec(mean={"assumed_group_size": 100, "assumed_mean": "lots"})


def test_env_errors_are_reported_at_once_by_field_path():
    from dp_spark.config import env_from_dict

    with pytest.raises(ConfigError) as exc:
        env_from_dict({"name": "t", "warehouse": "wh", "datasets": {"x": ""}, "lease_seconds": 0,
                       "spark": {"mastr": "local"}, "ledger_key_secret": {"scope": "secret_scope_7"}},
                      source="e.yaml")
    msg = str(exc.value)
    assert msg.startswith("e.yaml: 4 errors")
    for path in ("spark.mastr", "datasets.x.location", "lease_seconds", "ledger_key_secret.key"):
        assert f"field '{path}'" in msg, msg
    assert "secret_scope_7" not in msg


def test_access_policy_errors_are_reported_at_once_by_field_path():
    from dp_spark.governance.access import access_policy_from_dict

    with pytest.raises(ConfigError) as exc:
        access_policy_from_dict({"version": 2, "principals": {"x": {"roles": ["owner"]}, "y": {"roles": []}},
                                 "local_default": {"roles": ["publisher"]}, "pinned_versions": {"d": "short"},
                                 "extra": 1}, "access.yaml")
    msg = str(exc.value)
    assert msg.startswith("access.yaml: 6 errors"), msg
    for path in ("version", "pinned_versions", "principals.x.roles[0]", "principals.y.roles", "local_default.envs",
                 "extra"):
        assert f"field '{path}'" in msg, msg
    assert "owner" not in msg and "short" not in msg and "(allowed: [" in msg
