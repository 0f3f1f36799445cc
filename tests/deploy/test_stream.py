"""A stream release (``stream: {horizon_days, start}``) through the daily refresh, with Spark:
one ledger charge for the whole horizon, the right running totals at each point, reruns are
cache hits, and a run that dies after its nodes are stored heals with the same nodes."""

from __future__ import annotations

import copy
import itertools
from datetime import timedelta

import pytest
import yaml

from dp_spark.core.budget import ZCDP
from dp_spark.errors import ReleaseFailedError
from dp_spark.mechanisms import tree
from dp_spark.mechanisms.samplers import NoiseSource, RecordingNoiseSource, SeededNoiseSource
from dp_spark.schedule import daily_refresh, day_spec
from dp_spark.statistics.stream import plan_stream, stream_id_for

from .conftest import BUDGET, ROOT, START, local_engine
from tests.jobs.conftest import register

DAYS = 8
D = [START + timedelta(days=i) for i in range(DAYS)]
RHO = ZCDP("0.25")


@pytest.fixture(autouse=True)
def _test_mode(monkeypatch):
    monkeypatch.setenv("DP_SPARK_TEST_MODE", "1")


class ZeroNoise(NoiseSource):
    """No noise (test mode only): the published points are then the true running totals."""

    name = "zero"

    def discrete_laplace(self, scale, n):
        return [0] * n

    def discrete_gaussian(self, sigma, n):
        return [0] * n


def _stream_data(**over) -> dict:
    data = yaml.safe_load((ROOT / "conf/releases/revenue_stream.yaml").read_text())
    data.update(over)
    return data


def _twin(env, data: dict):
    """The same statistics and bounds as one ordinary (non-stream) release of all the days."""
    twin = copy.deepcopy(data)
    twin.pop("stream")
    twin.update(name="revenue_daily_twin", family="revenue_daily_twin")
    return register(env, "revenue_daily_twin", twin)


def _values(result) -> dict:
    return {r["statistic"]: r["value"] for r in result.rows}


def test_daily_refreshes_charge_once_and_publish_the_running_totals(spark, deploy_env):
    # L0 = 31 >= the days and K = L0 x Linf: the first-L0-days and K cuts never bind, so the twin
    # (one release of all 30 days) keeps the same rows
    data = _stream_data(bounds={"max_partitions_per_unit": 31, "max_rows_per_partition": 5,
                                "max_rows_per_unit": 155})
    data["statistics"] = data["statistics"] + [{"name": "buyers", "kind": "distinct_units"}]
    spec = register(deploy_env, "revenue_stream", data)
    eng = local_engine(spark, deploy_env, source=ZeroNoise())
    results = [daily_refresh(eng, spec, d) for d in D]
    assert [r.status for r in results] == ["published"] * DAYS
    assert [r.charge for r in results] == [RHO] + [None] * (DAYS - 1)  # the horizon, charged once
    entries = eng.ledger.entries(BUDGET)
    assert len(entries) == 1 and entries[0].state == "committed"
    assert entries[0].release_id == stream_id_for(day_spec(spec, D[0]), "official")
    assert eng.ledger.status(BUDGET).spent == RHO
    # the nodes: every node completed by day DAYS, stored once
    sid = entries[0].release_id
    plan = plan_stream(day_spec(spec, D[-1]))
    for part in plan.parts:
        stored = eng.ledger.stream_nodes(sid, part.name)
        assert set(stored) == {(h, j) for h in range(DAYS.bit_length()) for j in range(DAYS >> h)}
    # the right running totals: the twin's daily values (no noise), accumulated
    twin = local_engine(spark, deploy_env, source=ZeroNoise()).publish(_twin(deploy_env, data))
    daily = {(r["key"], r["statistic"]): r["value"] for r in twin.rows}
    for stat in ("orders", "revenue"):
        running = list(itertools.accumulate(daily[(d.isoformat(), stat)] for d in D))
        assert [_values(r)[stat] for r in results] == pytest.approx(running, rel=0, abs=1e-6)
        assert running[-1] > running[0] > 0
    assert all([row["key"] for row in r.rows] == [d.isoformat()] * 3 for r, d in zip(results, D))
    # distinct users ever seen: each counted on their first day with an order
    from pyspark.sql import functions as F

    from dp_spark.config import load_env

    events = spark.read.format("delta").load(load_env(deploy_env).datasets["demo_events"])
    seen = [events.where(F.col("order_value").isNotNull() & (F.col("day") <= F.lit(d)))
            .select("user_id").distinct().count() for d in D]
    assert [_values(r)["buyers"] for r in results] == seen and seen[-1] > seen[0] > 0
    # a rerun of any day: served, nothing charged, the same numbers
    again = daily_refresh(local_engine(spark, deploy_env, source=ZeroNoise()), spec, D[3])
    assert again.status == "cache_hit" and again.charge is None and again.rows == results[3].rows
    assert [e.release_id for e in eng.ledger.entries(BUDGET) if e.release_family == "revenue_stream"] == [sid]


def test_a_run_killed_after_its_nodes_heals_with_the_same_nodes(spark, deploy_env, monkeypatch):
    spec = register(deploy_env, "revenue_stream", _stream_data())
    eng = local_engine(spark, deploy_env, source=SeededNoiseSource(5))
    first = daily_refresh(eng, spec, D[0])
    assert first.status == "published" and first.charge == RHO

    import dp_spark.delta.release_table as rt

    real_write = rt.write_release

    def killed(*a, **k):  # the process dies after its nodes were stored, before its write
        raise RuntimeError("killed")

    monkeypatch.setattr(rt, "write_release", killed)
    with pytest.raises(ReleaseFailedError):
        daily_refresh(local_engine(spark, deploy_env, source=SeededNoiseSource(6)), spec, D[2])
    sid = stream_id_for(day_spec(spec, D[0]), "official")
    plan = plan_stream(day_spec(spec, D[2]))
    stored = {p.name: eng.ledger.stream_nodes(sid, p.name) for p in plan.parts}
    assert all(len(v) == 4 for v in stored.values())  # day 1 .. 3: (0,0) (0,1) (0,2) (1,0)
    monkeypatch.setattr(rt, "write_release", real_write)
    recorder = RecordingNoiseSource(SeededNoiseSource(7))
    healed = daily_refresh(local_engine(spark, deploy_env, source=recorder), spec, D[2])
    assert healed.status == "published" and healed.charge is None
    assert recorder.calls == []  # no node drawn again
    for p in plan.parts:  # the point is the stored nodes' sum: (1, 0) + (0, 2)
        total = sum(stored[p.name][n] for n in tree.prefix_nodes(3, 365)) * float(p.grid_unit)
        value = _values(healed)[next(s.name for s in spec.statistics
                                     if (s.kind == "sum") == (p.component.kind == "sum"))]
        assert value == pytest.approx(max(total, 0.0) if p.component.kind == "rows" else total)
    assert len(eng.ledger.entries(BUDGET)) == 1 and eng.ledger.status(BUDGET).spent == RHO
