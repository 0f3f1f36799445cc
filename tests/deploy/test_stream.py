"""A stream release (``stream: {horizon_days, start}``) through the daily refresh, with Spark,
on tiny input whose exact running totals are known (4 orders a day, 2 or 3 new buyers a day).

* 60 daily refreshes of one stream (horizon 60, with a simultaneous band), one process, the
  suite's session: ONE ledger charge for the horizon (at day 1), every node of the tree stored
  once, each node's stored value = its exact sum + the seeded noise drawn for it when it
  completed, each point = the exact running total + the noises of its nodes (counts clamped at
  0); every rerun a cache hit that charges and draws nothing; the release table holds each
  point once (refresh d writes day d only: 180 rows, not 5,490), and ``show`` (so the chart:
  one band, Bonferroni), the statement (60 days, the band) and ``<family>_current`` read the
  whole stream, each day's refresh versioned under its day.
* a REAL ``kill -9`` of ``dp-spark refresh`` (a subprocess with its own JVM,
  tests/deploy/stream_kill_driver.py) on the stream's first day, right after its first
  component's nodes were stored (the charge reserved, the other components' nodes not drawn,
  no point written): the rerun heals it: one charge, the stored nodes kept (only the missing
  ones drawn), the point the stored nodes' sum, no duplicate point, and the next day charges
  nothing.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml

from tests.processes import kill_group
from dp_spark.core.budget import ZCDP
from dp_spark.mechanisms import tree
from dp_spark.mechanisms.samplers import NoiseSource, SeededNoiseSource
from dp_spark.schedule import daily_refresh, day_spec
from dp_spark.statistics.stream import plan_stream, stream_id_for

from .conftest import BUDGET, ROOT, START, child_env, local_engine
from tests.jobs.conftest import register, write_env

HORIZON = 60
D = [START + timedelta(days=i) for i in range(HORIZON)]
RHO = ZCDP("0.25")
NAME = "revenue_stream_band"
DRIVER = Path(__file__).with_name("stream_kill_driver.py")


@pytest.fixture(autouse=True)
def _test_mode(monkeypatch):
    monkeypatch.setenv("DP_SPARK_TEST_MODE", "1")


class Recorded(NoiseSource):
    """A seeded exact sampler that keeps every draw, in order (test mode only)."""

    name = "recorded-seeded"

    def __init__(self, seed: int):
        self.inner = SeededNoiseSource(seed)
        self.draws: list[int] = []

    def discrete_laplace(self, scale, n):
        out = self.inner.discrete_laplace(scale, n)
        self.draws += out
        return out

    def discrete_gaussian(self, sigma, n):
        out = self.inner.discrete_gaussian(sigma, n)
        self.draws += out
        return out


def _exact_daily(i: int) -> dict[str, int]:
    """The exact increments of day i (0-based) of :func:`_write_events`, per component."""
    return {"rows": 4, "sum": 67 + i, "units": 3 if i % 3 == 0 else 2}


def _write_events(spark, env_file: Path, days: int) -> None:
    """Tiny input: on day i, a new user a_i with one order of 10 + i, a new user b_i with two
    orders (20, 30), user c_(i // 3) (on 3 days) with one order of 7, and a new user n_i whose
    row has no order value (filtered out by the spec's where). No bound binds (each user on
    at most 3 days, at most 2 orders a day)."""
    from dp_spark.config import load_env
    from dp_spark.demo_data import EVENT_SCHEMA

    rows, eid = [], 0
    for i in range(days):
        day = START + timedelta(days=i)
        at = datetime(day.year, day.month, day.day, 12)
        for user, values in ((f"a{i}", [10.0 + i]), (f"b{i}", [20.0, 30.0]), (f"c{i // 3}", [7.0]), (f"n{i}", [None])):
            for v in values:
                rows.append((eid, user, at, day, "north", v))
                eid += 1
    path = load_env(env_file).datasets["demo_events"]
    spark.createDataFrame(rows, EVENT_SCHEMA).coalesce(1).write.format("delta").mode("overwrite").save(path)


def _stream_env(spark, base: Path, days: int):
    env_file = write_env(base)
    _write_events(spark, env_file, days)
    data = copy.deepcopy(yaml.safe_load((ROOT / "conf/releases/revenue_stream_band.yaml").read_text()))
    data["group_by"]["public_keys"]["dates"] = {"start": D[0].isoformat(), "end": D[-1].isoformat()}
    data["stream"] = {"horizon_days": HORIZON, "start": D[0].isoformat()}
    data["statistics"] = data["statistics"] + [{"name": "buyers", "kind": "distinct_units"}]
    return env_file, register(env_file, NAME, data)


def _parts(spec):
    """statistic name -> its tree part (plan of the whole horizon)."""
    plan = plan_stream(day_spec(spec, D[-1]))
    stat_part = {s.name: plan.part_of(s, c) for s, c in zip(plan.spec.statistics, plan.query.stat_components)}
    return plan, stat_part


def _table(spark, env_file: Path) -> list:
    from dp_spark.config import load_env

    return spark.read.format("delta").load(f"{load_env(env_file).output_root}/{NAME}").collect()


def test_60_daily_refreshes_charge_once_and_publish_the_running_totals(spark, tmp_path):
    t0 = time.monotonic()
    env_file, spec = _stream_env(spark, tmp_path, HORIZON)
    plan, stat_part = _parts(spec)
    # the exact daily increments on each component's grid (integers: the values are whole)
    exact = {p.name: [_exact_daily(i)[p.component.kind] << -p.component.grid_exponent for i in range(HORIZON)]
             for p in plan.parts}
    exact_nodes = {name: tree.node_values(xs, HORIZON) for name, xs in exact.items()}
    src = Recorded(11)
    # as the refresh job runs it: versions and statement once per run (a run of 10 days here)
    eng = local_engine(spark, env_file, source=src, refresh="deferred")
    sid = stream_id_for(day_spec(spec, D[0]), "official")
    noise: dict[str, dict] = {p.name: {} for p in plan.parts}  # node -> the draw it got
    results = []
    for t, day in enumerate(D, start=1):
        before = len(src.draws)
        r = daily_refresh(eng, spec, day)
        assert (r.status, r.charge) == ("published", RHO if t == 1 else None), (t, r.status, r.charge)
        # the draws of this refresh: one per node completing today, per component, in order
        new = src.draws[before:]
        for p in plan.parts:
            done = sorted(n for n in tree.tree_nodes(HORIZON) if (n[1] + 1) << n[0] == t)
            noise[p.name].update(zip(done, new[:len(done)]))
            new = new[len(done):]
            stored = eng.ledger.stream_nodes(sid, p.name)
            assert set(stored) == set(noise[p.name])  # every node completed so far, stored once
            assert all(stored[n] == exact_nodes[p.name][n] + noise[p.name][n] for n in done)
        assert new == []
        # the point: the exact running total + the noises of its nodes (a count clamped at 0)
        values = {row["statistic"]: row for row in r.rows}
        assert sorted(values) == ["buyers", "orders", "revenue"] and {row["key"] for row in r.rows} == {day.isoformat()}
        for stat, p in stat_part.items():
            grid = sum(exact[p.name][:t]) + sum(noise[p.name][n] for n in tree.prefix_nodes(t, HORIZON))
            hb = int(tree.band_halfwidth(t, p.calibration, spec.confidence, plan.band_points))
            clamp = (lambda x: x) if p.component.kind == "sum" else (lambda x: max(x, 0.0))
            for column, g in (("value", grid), ("band_low", grid - hb), ("band_high", grid + hb)):
                want = clamp(g * float(p.grid_unit))
                assert values[stat][column] == pytest.approx(want, rel=0, abs=1e-9), (t, stat, column)
        if t % 10 == 0:  # the end of a run; a rerun: served, nothing charged, nothing drawn
            eng.finish()
            drawn = len(src.draws)
            again = daily_refresh(eng, spec, day)
            assert (again.status, again.charge, again.rows) == ("cache_hit", None, r.rows)
            assert len(src.draws) == drawn
        results.append(r)
    loop = time.monotonic() - t0
    # one charge for the horizon: one committed entry, the stream's
    entries = eng.ledger.entries(BUDGET)
    assert [(e.release_id, e.state) for e in entries] == [(sid, "committed")]
    assert eng.ledger.status(BUDGET).spent == RHO
    assert all(len(v) == len(tree.tree_nodes(HORIZON)) for v in noise.values())  # 116 nodes each
    # reruns of old days, later: cache hits, nothing charged or drawn, the same numbers
    drawn = len(src.draws)
    for t in (1, 17, 59):
        again = daily_refresh(local_engine(spark, env_file, source=SeededNoiseSource(99)), spec, D[t - 1])
        assert (again.status, again.charge, again.rows) == ("cache_hit", None, results[t - 1].rows)
    assert len(src.draws) == drawn and len(eng.ledger.entries(BUDGET)) == 1
    # the table grows by the new day only: refresh d wrote point d, each point once (not the
    # d points of days 1 .. d: 3 x 60 rows, not 3 x 1,830)
    rows = _table(spark, env_file)
    cells = [(r["statistic"], r["key"]) for r in rows]
    assert len(cells) == len(set(cells)) == 3 * HORIZON
    assert {(r["release_id"], r["key"]) for r in rows} == {(x.release_id, d.isoformat()) for x, d in zip(results, D)}
    # ... and every reader sees the whole stream: the days' versions (one per day, current)
    from dp_spark.commands import show_family
    from dp_spark.config import load_env
    from dp_spark.delta.release_table import RELEASE_SCHEMA
    from dp_spark.evaluation.chart_data import series_chart_data
    from dp_spark.governance.versions import history, series_current_path, write_series_current

    env = load_env(env_file)
    versions = history(eng.ledger, NAME)
    assert [v["release_id"] for v in versions if v["state"] == "current"] == [x.release_id for x in results]
    shown = show_family(env, NAME, columns=[f.name for f in RELEASE_SCHEMA.fields])
    published = {(r["statistic"], r["key"]): r["value"] for r in rows}
    assert {(r["statistic"], r["key"]): r["value"] for r in shown} == published  # show and chart
    charts = series_chart_data(shown)
    assert [(c.statistic, len(c.points), c.releases, c.simultaneous, c.band_rule) for c in charts] == [
        (s, HORIZON, 1, True, "Bonferroni") for s in ("buyers", "orders", "revenue")]
    current = series_current_path(env.output_root, NAME)
    assert write_series_current(spark, f"{env.output_root}/{NAME}", eng.ledger, NAME, current) == 3 * HORIZON
    assert {(r["statistic"], r["key"]): r["value"]
            for r in spark.read.format("delta").load(current).collect()} == published  # <family>_current
    from dp_spark.governance import statement_dir

    text = (statement_dir(env) / f"{NAME}.md").read_text()  # the statement: the 60 days, the band
    assert "all 180 points of its horizon" in text and all(d.isoformat() in text for d in D)
    print(f"60 refreshes (+6 reruns) in {loop:.1f}s, the file's first test in {time.monotonic() - t0:.1f}s")


def test_a_refresh_killed_after_its_nodes_heals_with_the_same_nodes(spark, tmp_path):
    t0 = time.monotonic()
    env_file, spec = _stream_env(spark, tmp_path, 3)
    sync = tmp_path / "sync"
    sync.mkdir()
    spec_file = Path(env_file).parents[1] / "releases" / f"{NAME}.yaml"
    cmd = [sys.executable, str(DRIVER), str(sync), "--env", str(env_file), "--conf", str(spec_file),
           "--date", D[0].isoformat()]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
                            cwd=str(ROOT), start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not (sync / "at.nodes").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                kill_group(proc)
                out, err = proc.communicate(timeout=60)
                pytest.fail(f"the refresh never stored its nodes (exit {proc.returncode}):\n{out[-2000:]}\n"
                            f"{err[-4000:]}")
            time.sleep(0.1)
    finally:
        kill_group(proc)  # kill -9, mid-refresh
        proc.communicate(timeout=60)
    killed = time.monotonic() - t0
    sid = stream_id_for(day_spec(spec, D[0]), "official")
    plan, stat_part = _parts(spec)
    from dp_spark.config import load_env
    from dp_spark.ledger import open_ledger

    with open_ledger(load_env(env_file).ledger_url) as ledger:
        assert [(e.release_id, e.state) for e in ledger.entries(BUDGET)] == [(sid, "reserved")]  # charged, pending
        before = {p.name: ledger.stream_nodes(sid, p.name) for p in plan.parts}
    assert sorted(len(v) for v in before.values()) == [0] * (len(plan.parts) - 1) + [1]  # first component only
    assert [r for r in _table_or_empty(spark, env_file)] == []  # no point written
    # the rerun heals: no second charge, the stored node kept, only the missing nodes drawn
    src = Recorded(12)
    eng = local_engine(spark, env_file, source=src)
    healed = daily_refresh(eng, spec, D[0])
    assert (healed.status, healed.charge) == ("published", None)
    assert len(src.draws) == len(plan.parts) - 1  # node (0, 0) of each component not stored yet
    after = {p.name: eng.ledger.stream_nodes(sid, p.name) for p in plan.parts}
    for name, nodes in before.items():
        assert {n: after[name][n] for n in nodes} == nodes  # the same node noises
    values = {r["statistic"]: r["value"] for r in healed.rows}
    for stat, p in stat_part.items():  # the point: the stored node's value
        v = after[p.name][(0, 0)] * float(p.grid_unit)
        assert values[stat] == pytest.approx(max(v, 0.0) if p.component.kind != "sum" else v, rel=0, abs=1e-9)
    assert [(e.release_id, e.state) for e in eng.ledger.entries(BUDGET)] == [(sid, "committed")]
    assert eng.ledger.status(BUDGET).spent == RHO
    # the next day: nothing charged; a rerun of day 1: served; no point written twice
    second = daily_refresh(eng, spec, D[1])
    assert (second.status, second.charge) == ("published", None)
    again = daily_refresh(eng, spec, D[0])
    assert (again.status, again.charge, again.rows) == ("cache_hit", None, healed.rows)
    cells = [(r["statistic"], r["key"]) for r in _table(spark, env_file)]
    assert len(cells) == len(set(cells)) == 3 * 2  # each point written once
    assert len(eng.ledger.entries(BUDGET)) == 1 and eng.ledger.status(BUDGET).spent == RHO
    print(f"killed after {killed:.1f}s; the test in {time.monotonic() - t0:.1f}s")


def test_a_withdrawn_point_is_written_again_by_the_next_refresh(spark, tmp_path):
    """A refresh writes only the days no release of its stream wrote, leaving out the withdrawn
    releases: after a rollback of day 2's point, day 3's refresh writes days 2 and 3 (the
    same numbers for day 2: the same stored nodes), not day 1; nothing is charged again."""
    from dp_spark.governance.versions import history, rollback

    env_file, spec = _stream_env(spark, tmp_path, 3)
    eng = local_engine(spark, env_file, source=SeededNoiseSource(5))
    first, second = daily_refresh(eng, spec, D[0]), daily_refresh(eng, spec, D[1])
    withdrawn, restored = rollback(eng.ledger, NAME, "admin", "a check", series_key=D[1].isoformat())
    assert (withdrawn, restored) == (second.release_id, None)
    third = daily_refresh(eng, spec, D[2])
    assert (third.status, third.charge) == ("published", None)
    rows = _table(spark, env_file)
    days = {}
    for r in rows:
        days.setdefault(r["release_id"], set()).add(r["key"])
    assert days == {first.release_id: {D[0].isoformat()}, second.release_id: {D[1].isoformat()},
                    third.release_id: {D[1].isoformat(), D[2].isoformat()}}
    value = {(r["release_id"], r["statistic"], r["key"]): r["value"] for r in rows}
    for stat in ("buyers", "orders", "revenue"):  # the withdrawn day's point, written again: the same sum
        assert value[(third.release_id, stat, D[1].isoformat())] == value[(second.release_id, stat, D[1].isoformat())]
    assert [v["state"] for v in history(eng.ledger, NAME)] == ["current", "withdrawn", "current"]
    assert len(eng.ledger.entries(BUDGET)) == 1 and eng.ledger.status(BUDGET).spent == RHO


def _table_or_empty(spark, env_file: Path) -> list:
    try:
        return _table(spark, env_file)
    except Exception:  # no release table yet
        return []
