"""The bands of ``confidence: {simultaneous: true}`` in the noise step (QueryPlan.noise), for
every kind of the shipped multi-statistic spec: each cell's band is its own interval
construction at the Sidak level for the statistic's cells, it contains the pointwise interval,
and a spec without bands publishes no band fields (null in the table). A suppressed cell
withholds its band."""

from __future__ import annotations

import copy
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from dp_spark.config import release_spec_from_dict
from dp_spark.mechanisms.samplers import SeededNoiseSource
from dp_spark.statistics.base import kind_of
from dp_spark.statistics.noise import joint_alpha
from dp_spark.statistics.plan import key_tuples, plan_query
from dp_spark.statistics.postprocess import apply_min_group_size

ROOT = Path(__file__).resolve().parents[2]
MULTI = ROOT / "conf" / "releases" / "orders_by_day_region.yaml"


@pytest.fixture(autouse=True)
def _test_mode(monkeypatch):
    monkeypatch.setenv("DP_SPARK_TEST_MODE", "1")


def _plan(simultaneous: bool):
    d = copy.deepcopy(yaml.safe_load(MULTI.read_text()))
    d["group_by"][0]["public_keys"] = {"dates": {"start": "2026-11-01", "end": "2026-11-04"}}
    d["confidence"] = {"level": 0.9, "simultaneous": simultaneous}
    d["max_cells"] = 10_000
    return plan_query(release_spec_from_dict(d, "o.yaml"))


def _partials(plan, n):
    out = {}
    for i in range(n):
        out[i] = {"dp_rows": 40 + i, "dp_units": 30 + i}
        for comp in plan.components:
            if comp.clamp is not None:
                for part in ("lo", "mid", "hi"):
                    out[i][f"{comp.sum_alias}_{part}"] = 0
    return out


def test_every_kind_gets_its_interval_at_the_sidak_level_as_band():
    plan = _plan(True)
    n = len(key_tuples(plan.spec.key_sets))
    partials = _partials(plan, n)
    comps_by_stat = dict(zip([s.name for s in plan.spec.statistics], plan.stat_components))
    grids: dict = {}
    cells = plan.noise(partials, SeededNoiseSource(5), components=grids)
    assert len(cells) == n * len(plan.spec.statistics)
    band_alpha = Fraction(joint_alpha(Fraction(1, 10), n))
    assert 0 < band_alpha < Fraction(1, 10) / n * Fraction(11, 10)
    seen = set()
    for c in cells:
        assert c["band_low"] <= c["ci_low"] <= c["ci_high"] <= c["band_high"], c["statistic"]
        stat = next(s for s in plan.spec.statistics if s.name == c["statistic"])
        if stat.name in seen:
            continue
        seen.add(stat.name)
        comps = comps_by_stat[stat.name]
        mine = {comp: grids[comp][c["key"]] for comp in comps}
        want = kind_of(stat.kind).finish(stat, mine, {comp: plan.plan_of(comp) for comp in comps}, band_alpha)
        assert (c["band_low"], c["band_high"]) == pytest.approx((want["ci_low"], want["ci_high"]), rel=1e-12, abs=1e-9)
    assert seen == {s.name for s in plan.spec.statistics}
    # wider than the pointwise interval somewhere for every statistic (unless the interval
    # already is the clamp's whole range: a quantile of a small group)
    for stat in plan.spec.statistics:
        mine = [c for c in cells if c["statistic"] == stat.name]
        whole = stat.clamp is not None and all(
            (c["ci_low"], c["ci_high"]) == (float(stat.clamp.lower), float(stat.clamp.upper)) for c in mine)
        assert whole or any(c["band_high"] - c["band_low"] > c["ci_high"] - c["ci_low"] for c in mine), stat.name


def test_without_bands_the_cells_hold_no_band_and_the_noise_is_the_same():
    with_b, without = _plan(True), _plan(False)
    n = len(key_tuples(without.spec.key_sets))
    a = with_b.noise(_partials(with_b, n), SeededNoiseSource(9))
    b = without.noise(_partials(without, n), SeededNoiseSource(9))
    assert all("band_low" not in c and "band_high" not in c for c in b)
    strip = [{k: v for k, v in c.items() if k not in ("band_low", "band_high")} for c in a]
    assert strip == b  # the same draws, values and pointwise intervals


def test_a_suppressed_cell_withholds_its_band():
    plan = _plan(True)
    n = len(key_tuples(plan.spec.key_sets))
    cells = plan.noise(_partials(plan, n), SeededNoiseSource(11))
    out, suppressed = apply_min_group_size(cells, threshold=10**9, strategy="suppress", count_statistic="users")
    assert suppressed and all(c["suppressed"] for c in out)
    assert all(c["band_low"] != c["band_low"] and c["band_high"] != c["band_high"] for c in out)  # NaN
