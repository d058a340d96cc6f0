"""One vocabulary each: the tab's words are the report's.

The tab is plain JavaScript served as files, so where it must know a Python definition (which
severities are actionable, the breakdown's category groups and keys) these tests read the
frontend's source and compare it with the Python one: changing one side alone fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

from tb_gpuadvisor.attribution.breakdown import CATEGORIES
from tb_gpuadvisor.checks.base import ACTIONABLE, QUIET, Severity

FRONTEND = Path(__file__).resolve().parents[1] / "frontend"


def _js_object_keys(source: str, name: str) -> set[str]:
    body = re.search(rf"const {name} = \{{(.*?)\}};", source, re.S).group(1)
    return set(re.findall(r"(\w+):", body))


def test_the_tab_calls_the_same_severities_actionable_as_the_report():
    views = (FRONTEND / "views.js").read_text()
    listed = re.search(r"const ACTIONABLE = new Set\(\[(.*?)\]\);", views).group(1)
    assert set(re.findall(r"'(\w+)'", listed)) == {s.value for s in ACTIONABLE}
    assert ACTIONABLE.isdisjoint(QUIET) and Severity.INFO not in ACTIONABLE | QUIET


def test_the_tab_names_every_breakdown_group_and_colours_every_category():
    views = (FRONTEND / "views.js").read_text()
    style = (FRONTEND / "style.css").read_text()
    groups = {c.group for c in CATEGORIES}
    assert _js_object_keys(views, "GROUP_LABEL") == groups
    for group in groups:
        assert f".c-group-{group}" in style, group
    colours = {}
    for category in CATEGORIES:
        rule = re.search(rf"\.c-{category.key}\b[^{{]*\{{ fill: (#[0-9a-f]{{6}})", style)
        assert rule, f"no colour for category {category.key}"
        colours[category.key] = rule.group(1)
    assert len(set(colours.values())) == len(colours), colours     # no two categories alike


def test_the_tab_keeps_the_reports_order():
    """The ranking is report.rank_findings alone: the tab has no sort of its own."""
    views = (FRONTEND / "views.js").read_text()
    assert "rankFindings" not in views and ".sort(" not in views.split("export function findingsView")[1].split(
        "// -- compare")[0]


def test_one_primary_device_for_trust_breakdown_and_checks(tmp_path):
    """GPU:0 ran nothing, so the primary GPU is GPU:1 everywhere (the first GPU that ran kernels)."""
    from synth import build_training_session
    from synth_whatif import analysed

    session = build_training_session(steps=3, gpus=3)
    gpu0 = next(p for p in session.space.planes if p.name == "/device:GPU:0")
    gpu0.lines.clear()
    analysis = analysed(session, tmp_path)
    primary = analysis.model.primary_gpu
    assert primary is not None and primary.device.name == "/device:GPU:1"
    assert analysis.primary_device is primary
    assert analysis.breakdown.primary.name == primary.device.name == analysis.breakdown.to_json()["device"]
