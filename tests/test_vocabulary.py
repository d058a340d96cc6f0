"""One vocabulary each: the tab's words are the report's.

The tab is plain JavaScript served as files, so where it must know a Python definition (which
severities are actionable, the breakdown's category groups and keys) these tests read the
frontend's source and compare it with the Python one: changing one side alone fails here.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np

from tb_gpuadvisor.attribution.breakdown import CATEGORIES
from tb_gpuadvisor.checks.base import Severity
from tb_gpuadvisor.checks.finding import ACTIONABLE, QUIET

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


# Colour-vision deficiency simulation matrices on linear RGB (Machado, Oliveira and Fernandes 2009,
# severity 1.0: full protanopia, deuteranopia, tritanopia), and the smallest CIELAB distance two
# categories must keep under each: about 10 reads as clearly different at a glance.
VISION = {
    "normal": np.eye(3),
    "protanopia": np.array([[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216],
                            [-0.003882, -0.048116, 1.051998]]),
    "deuteranopia": np.array([[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413],
                              [-0.011820, 0.042940, 0.968881]]),
    "tritanopia": np.array([[1.255528, -0.076749, -0.178779], [-0.078411, 0.930809, 0.147602],
                            [0.004733, 0.691367, 0.303900]]),
}
MIN_DELTA_E = 10.0


def _linear(hex_colour: str) -> np.ndarray:
    c = np.array([int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)], float) / 255
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def _lab(rgb: np.ndarray) -> np.ndarray:
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ rgb
    f = xyz / np.array([0.95047, 1.0, 1.08883])
    f = np.where(f > 0.008856, np.cbrt(f), 7.787 * f + 16 / 116)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def test_category_colours_stay_apart_for_colour_blind_readers():
    style = (FRONTEND / "style.css").read_text()
    colours = {c.key: _linear(re.search(rf"\.c-{c.key}\b[^{{]*\{{ fill: (#[0-9a-f]{{6}})", style).group(1))
               for c in CATEGORIES}
    for vision, matrix in VISION.items():
        seen = {key: _lab(np.clip(matrix @ rgb, 0, 1)) for key, rgb in colours.items()}
        for a, b in itertools.combinations(seen, 2):
            assert np.linalg.norm(seen[a] - seen[b]) >= MIN_DELTA_E, (vision, a, b)


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
