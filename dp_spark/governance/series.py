"""A series' days from its version records: pure helpers shared by the version record
(:mod:`dp_spark.governance.versions`) and the privacy statement
(:mod:`dp_spark.governance.statement`), which both read a family's versions
(:func:`dp_spark.governance.versions.history`). No pyspark."""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["is_series", "series_days"]


def is_series(versions: Sequence[dict[str, Any]]) -> bool:
    """Whether a family's versions (:func:`dp_spark.governance.versions.history`) are those of a series: some version
    publishes one key (a day) of it."""
    return any(v.get("series_key") is not None for v in versions)


def series_days(versions: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The days (series keys) of a series, in key order, from its versions (:func:`dp_spark.governance.versions.history`):
    ``{day, state, version_no, release_id, published_at, principal, versions, superseded,
    withdrawn}`` each. ``state`` is ``current`` with the day's current version, else
    ``withdrawn`` (every version of the day withdrawn: the day is not published);
    ``versions`` counts all the day's versions, ``superseded`` / ``withdrawn`` the earlier ones
    replaced or withdrawn."""
    out = []
    for day in sorted({v["series_key"] for v in versions if v.get("series_key") is not None}):
        mine = [v for v in versions if v.get("series_key") == day]
        cur = [v for v in mine if v["state"] == "current"]
        shown = cur[-1] if cur else mine[-1]
        out.append({"day": day, "state": "current" if cur else "withdrawn", "version_no": int(shown["version_no"]),
                    "release_id": shown["release_id"], "published_at": shown["at"], "principal": shown["principal"],
                    "versions": len(mine), "superseded": sum(1 for v in mine if v["state"] == "superseded"),
                    "withdrawn": sum(1 for v in mine if v["state"] == "withdrawn")})
    return out


# --------------------------------------------------------------------------------------
# rendering and writing
# --------------------------------------------------------------------------------------
