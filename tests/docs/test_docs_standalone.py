"""The docs stand on their own: no internal check numbers or tracker references a reader
cannot follow ("RELIABILITY 22", "check 17", "issue 13, item 4")."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]

INTERNAL = re.compile(
    r"\b(RELIABILITY|SECURITY|PRIVACY|CORRECTNESS|USABILITY)\s+#?\d+"   # review check numbers
    r"|\bcheck\s+#?\d+\b(?!\s*-)"                                     # "check 17" (not "check 93-97%")
    r"|\bissue\s+#?\d+|\bitem\s+#?\d+\b"                              # the tracker's issue/item numbers
    r"|\(#\d+\)",
    re.IGNORECASE,
)


def test_there_are_docs():
    assert len(DOCS) >= 8


def test_docs_cite_no_internal_check_numbers():
    hits = [f"{p.relative_to(ROOT)}:{i}: {m.group(0)!r}"
            for p in DOCS for i, line in enumerate(p.read_text().splitlines(), 1)
            for m in INTERNAL.finditer(line)]
    assert not hits, "internal references a reader cannot follow:\n" + "\n".join(hits)


def test_the_pattern_catches_what_it_should():
    for bad in ("(RELIABILITY 22)", "check 17", "issue 13, item 4", "see (#12)", "Security 3"):
        assert INTERNAL.search(bad), bad
    for fine in ("the tests check 93-97% at 95%", "checks 3 things", "item", "2,000 users"):
        assert not INTERNAL.search(fine), fine
