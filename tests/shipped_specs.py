"""The release specs the project ships in ``conf/releases/``: the only ones the tests own.

``conf/releases/`` is also where a user pre-registers their own specs (the tutorial writes
``tutorial_orders_by_region.yaml`` there with ``ReleaseBuilder.to_yaml``). The tests that check
every shipped spec (schema header, golden release ids, plan and explorer on each) iterate this
manifest, never the folder, so a user's spec, finished or not, never breaks ``make test``
(``tests/docs/test_tutorial.py`` runs the tutorial, then those checks, in a copy of the repo).

Shipping a new spec: add its file name here and regenerate the golden release ids
(``python -m tests.unit.test_golden_release_ids --write``, saying so in the commit).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RELEASES = ROOT / "conf" / "releases"

SHIPPED_SPECS: tuple[str, ...] = (
    "aov_by_region.yaml",
    "dau_daily.yaml",
    "dau_rolling.yaml",
    "orders_by_day_region.yaml",
    "orders_by_found_region.yaml",
    "revenue_stream.yaml",
    "revenue_stream_band.yaml",
    "wau_mau_daily.yaml",
)


def shipped_spec_paths(root: Path = ROOT) -> list[Path]:
    """The shipped specs' paths under ``root``'s ``conf/releases/``, sorted by name."""
    return [root / "conf" / "releases" / name for name in sorted(SHIPPED_SPECS)]
