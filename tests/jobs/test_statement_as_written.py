"""The statement's summary of a release the engine wrote itself comes from the rows it wrote,
not from a read of the release table: the same summary, one Spark read less per release.

For every way a release reaches the table on the driver (one statistic with ``min_group_size``
suppression, several statistics over day x region, private keys, a stream's point), under both
refresh modes, the summaries the statement was built from (its cache file) equal every official
row of the family read back from Delta and summarised (the reference), and the log says the
release was taken as written (so the equality is about the in-memory summary, not a read). The
last test shows the comparison can fail: a summary that is not the written rows' (one cell
less) is caught by its commit's row count and read from the table instead, and one that counts
the cells right but says something else reaches the statement, where the equality fails."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import yaml

from dp_spark.config import load_env
from dp_spark.engine import Engine
from dp_spark.governance import statement as st
from dp_spark.governance.statement import summarise_release_rows, summary_cache_dir

from .conftest import ROOT, register

LOGGER = "dp_spark.governance.statement"
_KEEP = Engine._keep_written


def _spec(warehouse, which: str):
    if which == "suppressed":
        d = yaml.safe_load((ROOT / "conf/releases/aov_by_region.yaml").read_text())
        d["name"] = d["family"] = "aov_thresholded"
        d["min_group_size"] = {"threshold": 400, "strategy": "suppress"}
        return register(warehouse, "aov_thresholded", d)
    return register(warehouse, which)


def _reference(spark, env, family: str) -> list[dict]:
    rows = (spark.read.format("delta").load(f"{env.output_root}/{family}")
            .where(f"release_family = '{family}' AND mode = 'official'").collect())
    return summarise_release_rows([r.asDict() for r in rows])


def _cached(env, family: str) -> list[dict]:
    d = json.loads((summary_cache_dir(Path(env.warehouse) / "statements") / f"{family}.json").read_text())
    return [{k: st._from_json(v) for k, v in s.items()} for s in d["summaries"]]


def _how(caplog, family: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == LOGGER and f"release summaries of {family} " in r.getMessage()]


@pytest.mark.parametrize("refresh", ["each", "deferred"])
@pytest.mark.parametrize("which", ["suppressed", "orders_by_day_region", "orders_by_found_region", "revenue_stream"])
def test_the_summary_of_a_release_written_here_is_the_tables(spark, warehouse, caplog, which, refresh):
    env = load_env(warehouse)
    spec = _spec(warehouse, which)
    eng = Engine(env, spark=spark, principal="publisher_bob", refresh=refresh)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        res = eng.publish(spec)
        eng.finish()
    eng.close()
    assert res.status == "published" and res.rows
    if which == "suppressed":
        assert any(r["suppressed"] for r in res.rows)  # the suppressed keys are in the summary
    how = _how(caplog, spec.family)
    assert how and all("0 release(s) read, 1 as written" in h for h in how), how
    reference = _reference(spark, env, spec.family)
    assert [s["release_id"] for s in reference] == [res.release_id]
    assert _cached(env, spec.family) == reference


def _mutating(monkeypatch, change):
    """The engine keeps ``change(summary)`` instead of its written rows' summary."""
    def keep(self, release_id, mine):
        _KEEP(self, release_id, mine)
        if release_id in self._written:
            self._written[release_id] = change(self._written[release_id])

    monkeypatch.setattr(Engine, "_keep_written", keep)


def test_a_summary_that_is_not_the_written_rows_is_read_or_caught(spark, warehouse, caplog, monkeypatch):
    env = load_env(warehouse)
    spec = _spec(warehouse, "orders_by_day_region")
    _mutating(monkeypatch, lambda s: dict(s, cells=s["cells"] - 1))
    eng = Engine(env, spark=spark, principal="publisher_bob", refresh="deferred")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        eng.publish(spec)
        eng.finish()
    how = _how(caplog, spec.family)
    assert how and all("1 release(s) read (" in h for h in how), how  # its commit's rows disagree: read
    assert _cached(env, spec.family) == _reference(spark, env, spec.family)

    # counted right but saying something else: taken as written, and the comparison above fails
    _mutating(monkeypatch, lambda s: dict(s, statistics=["count"]))
    d = yaml.safe_load((ROOT / "conf/releases/orders_by_day_region.yaml").read_text())
    d["name"] = "orders_by_day_region_2"  # another release of the family
    d["family"] = spec.family
    other = register(warehouse, "orders_by_day_region_2", d)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        eng.publish(other)
        eng.finish()
    eng.close()
    how = _how(caplog, spec.family)
    assert how and all("0 release(s) read, 1 as written" in h for h in how), how
    assert _cached(env, spec.family) != _reference(spark, env, spec.family)
