"""Every report stays the same unless a change means it to: the corpus captures and the synthetic
scenarios of tests/golden.py against the outputs stored in tests/golden/ (regenerate with
``python tests/golden.py --update`` and name the intended change in the commit)."""

from __future__ import annotations

import difflib

import pytest

import golden


@pytest.mark.parametrize("case", golden.cases())
def test_reports_match_golden(case: str) -> None:
    now, kept = golden.outputs(case), golden.stored(case)
    for suffix in ("json", "txt", "md"):
        if now[suffix] != kept[suffix]:
            diff = "".join(list(difflib.unified_diff(kept[suffix].splitlines(True), now[suffix].splitlines(True),
                                                     f"golden/{case}.{suffix}", "now", n=1))[:60])
            pytest.fail(f"{case}.{suffix} changed:\n{diff}")
