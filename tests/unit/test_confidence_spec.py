"""``confidence`` in a release spec: the number form (as always), the mapping form
``{level, simultaneous}``; a non-simultaneous mapping is the number (same spec, same release
ids), a simultaneous one is a new release."""

from __future__ import annotations

import copy
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from dp_spark import engine as engine_mod
from dp_spark.config import release_spec_from_dict
from dp_spark.errors import ConfigError
from dp_spark.spec.release import release_spec_errors

ROOT = Path(__file__).resolve().parents[2]
MULTI = ROOT / "conf" / "releases" / "orders_by_day_region.yaml"
SINGLE = ROOT / "conf" / "releases" / "aov_by_region.yaml"


def _spec(path: Path, confidence=None) -> dict:
    d = copy.deepcopy(yaml.safe_load(path.read_text()))
    if confidence is not None:
        d["confidence"] = confidence
    return d


def _rid(spec) -> str:
    return engine_mod.release_id_for(spec, "table", 3, "official")


@pytest.mark.parametrize("path", [MULTI, SINGLE], ids=["statistics", "metric"])
def test_number_and_non_simultaneous_mapping_are_one_spec(path):
    number = release_spec_from_dict(_spec(path, 0.9))
    as_string = release_spec_from_dict(_spec(path, "0.9"))
    mapping = release_spec_from_dict(_spec(path, {"level": 0.9, "simultaneous": False}))
    level_only = release_spec_from_dict(_spec(path, {"level": 0.9}))
    for s in (number, as_string, mapping, level_only):
        assert s.confidence == Fraction(9, 10) and s.simultaneous is False
    assert number.canonical() == mapping.canonical() == level_only.canonical() == as_string.canonical()
    assert _rid(number) == _rid(mapping) == _rid(level_only)
    assert number.version() == mapping.version()
    # the default (no confidence at all) is 0.95, pointwise, as before
    d = _spec(path)
    d.pop("confidence", None)
    plain = release_spec_from_dict(d)
    assert plain.confidence == Fraction(19, 20) and not plain.simultaneous
    assert _rid(plain) == _rid(release_spec_from_dict(_spec(path, {"simultaneous": False})))


@pytest.mark.parametrize("path", [MULTI, SINGLE], ids=["statistics", "metric"])
def test_simultaneous_is_a_new_release(path):
    pointwise = release_spec_from_dict(_spec(path, 0.95))
    band = release_spec_from_dict(_spec(path, {"level": 0.95, "simultaneous": True}))
    assert band.simultaneous is True and band.confidence == Fraction(19, 20)
    assert band.canonical()["simultaneous"] is True and "simultaneous" not in pointwise.canonical()
    assert _rid(band) != _rid(pointwise) and band.version() != pointwise.version()


@pytest.mark.parametrize("bad, path", [
    (1.5, "confidence"), ("x", "confidence"), ({"level": 0.3}, "confidence.level"),
    ({"level": 0.9, "simultaneous": "yes"}, "confidence.simultaneous"),
    ({"level": 0.9, "simultanous": True}, "confidence.simultanous"),
])
def test_bad_confidence_is_refused_at_its_path(bad, path):
    errors = release_spec_errors(_spec(MULTI, bad))
    assert errors and any(path in repr(e) for e in errors), errors
    with pytest.raises(ConfigError, match=path.replace(".", r"\.")):
        release_spec_from_dict(_spec(MULTI, bad))


def test_merge_other_with_bands_is_refused():
    d = _spec(MULTI, {"level": 0.95, "simultaneous": True})
    d["group_by"] = d["group_by"][1:] if isinstance(d["group_by"], list) else d["group_by"]
    d["min_group_size"] = {"threshold": 5, "strategy": "merge_other"}
    with pytest.raises(ConfigError, match="simultaneous bands do not cover a merged cell"):
        release_spec_from_dict(d)
    d["min_group_size"] = {"threshold": 5, "strategy": "suppress"}
    assert release_spec_from_dict(d).simultaneous


def test_the_statement_explains_multiplicity_and_names_the_band():
    from dp_spark.governance.statement import intervals_paragraph

    plain = "\n".join(intervals_paragraph([{"name": "a", "confidence": "0.95"}]))
    assert "60" in plain and "about 3 intervals" in plain and "about 5%" in plain
    assert "No query of this family publishes simultaneous bands" in plain
    banded = "\n".join(intervals_paragraph([{"name": "a", "confidence": "0.9", "simultaneous_bands": True}]))
    assert "`a` publishes a simultaneous band" in banded and "0.9^(1/m) (Sidak)" in banded
    assert "90%" in banded and "independent" in banded


def test_the_builder_sets_simultaneous_bands():
    import dp_spark.api as dp

    b = (dp.release("x").on("demo_events", unit="user_id").by(day=dp.dates("2026-11-01", "2026-11-30"))
         .distinct_units("dau").bounds(rows_per_unit=30, partitions_per_unit=30)
         .charge(rho=0.25, budget="demo_events_user"))
    assert not b.confidence(0.9).spec().simultaneous
    assert b.confidence(0.9).to_dict()["confidence"] == 0.9  # the number form, as before
    banded = b.confidence(0.9, simultaneous=True)
    assert banded.spec().simultaneous and banded.spec().confidence == Fraction(9, 10)
    assert release_spec_from_dict(yaml.safe_load(banded.to_yaml())).simultaneous
