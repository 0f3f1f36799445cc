"""Simultaneous bands end to end: a release with ``confidence: {simultaneous: true}`` appended to
a family table written before the band columns existed (the columns are added, old rows read
null), its band columns read back, and ``dp-spark chart`` drawing the family as PNG and HTML."""

from __future__ import annotations

import math
from datetime import datetime

import yaml
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dp_spark import cli
from dp_spark.config import load_env
from dp_spark.delta import release_table as W
from dp_spark.engine import Engine
from dp_spark.statistics.noise import joint_alpha

from .conftest import ROOT, register


def _old_row() -> dict:
    r = {f.name: None for f in W.RELEASE_SCHEMA.fields}
    r.update(release_id="old", release_family="dau_daily", release_name="dau_daily", spec_version="v",
             mode="exploration", statistic="distinct_units", key="2026-10-01", keys={"day": "2026-10-01"}, value=1.0,
             ci_low=0.0, ci_high=2.0, confidence=0.95, expected_abs_error=1.0, mechanism="discrete_gaussian",
             noise_scale=1.0, noise_stddev=1.0, grid=1.0, charge_json="{}", budget_id="b", bounds_json="{}",
             privacy_unit="user", unit_column="user_id", neighbouring="add_remove_unit",
             parallel_composition=False, suppressed=False, input_table_id="t", input_version=1, code_version="c",
             created_at=datetime(2026, 1, 1))
    return r


def test_a_simultaneous_release_into_an_old_table_and_its_chart(spark, warehouse, tmp_path, capsys):
    env = load_env(warehouse)
    path = f"{env.output_root}/dau_daily"
    old_schema = T.StructType([f for f in W.RELEASE_SCHEMA.fields if f.name not in ("band_low", "band_high")])
    old = _old_row()
    spark.createDataFrame([tuple(old[f.name] for f in old_schema.fields)], old_schema) \
        .write.format("delta").save(path)
    assert W.check_release_table(spark, path) == "needs_columns"

    data = yaml.safe_load((ROOT / "conf/releases/dau_daily.yaml").read_text())
    data["confidence"] = {"level": 0.95, "simultaneous": True}
    spec = register(warehouse, "dau_daily", data)
    assert spec.simultaneous
    eng = Engine(env, spark=spark, principal="publisher_bob")
    try:
        r = eng.publish(spec)
    finally:
        eng.close()
    assert r.status == "published" and len(r.rows) == 30
    table = spark.read.format("delta").load(path)
    assert {"band_low", "band_high"} <= set(table.columns)
    old_back = table.where(F.col("release_id") == "old").collect()
    assert len(old_back) == 1 and old_back[0]["band_low"] is None and old_back[0]["band_high"] is None
    rows = table.where(F.col("release_id") == r.release_id).collect()
    assert len(rows) == 30
    from dp_spark.mechanisms import accuracy

    for row in rows:
        assert row["band_low"] <= row["ci_low"] <= row["value"] <= row["ci_high"] <= row["band_high"]
        # the band is the cell's noise interval at the Sidak level for 30 cells (a count: exact)
        sigma = row["noise_scale"] / row["grid"]
        h = accuracy.noise_halfwidth("discrete_gaussian", sigma, joint_alpha(0.05, 30)) * row["grid"]
        assert math.isclose(row["band_high"], row["value"] + h)
        assert row["band_high"] - row["value"] > row["ci_high"] - row["value"]

    # the statement explains the band
    from dp_spark.governance.statement import intervals_paragraph

    text = "\n".join(intervals_paragraph([{"name": "dau_daily", "confidence": "0.95", "simultaneous_bands": True}]))
    assert "Sidak" in text and "60" in text and "band_low" in text

    # dp-spark chart: a PNG and an interactive HTML of the published series
    png, html = tmp_path / "dau.png", tmp_path / "dau.html"
    for out in (png, html):
        rc = cli.main(["chart", "--env", str(warehouse), "--family", "dau_daily", "--out", str(out)])
        printed, err = capsys.readouterr()
        assert rc == 0, err
        assert "dau_daily/distinct_units: 30 points, with simultaneous band" in printed
        for row in rows:  # counts and names only: no published value is printed
            assert f"{row['value']:g}" not in printed.replace("30 points", "")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = html.read_text()
    data_part = page[page.rindex("Plotly.newPlot("):]
    assert "2026-11-01" in data_part and "2026-11-30" in data_part
    assert all(repr(float(row["value"])) in data_part for row in rows)
