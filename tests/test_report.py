"""Ranking, the fix-first pick, and one broken check not hiding the others."""

from __future__ import annotations

import dataclasses

import pytest

from synth import build_training_session

from tb_gpuadvisor.checks import REGISTRY, Finding, Severity, all_checks
from tb_gpuadvisor.checks.context import WARNING_GAIN_SHARE, WARNING_MIN_MS, StepScale
from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.multihost import analyze_session
from tb_gpuadvisor.render import render_markdown, render_text
from tb_gpuadvisor.report import rank_findings


def _finding(check: str, severity: Severity, saving: float) -> Finding:
    return Finding(check, severity, f"{check} title", "summary", estimated_savings_ms_per_step=saving)


def test_actionable_findings_rank_by_saving_then_the_rest_by_severity():
    ranked = rank_findings([
        _finding("a", Severity.OK, 0.0), _finding("b", Severity.WARNING, 1.0),
        _finding("c", Severity.CRITICAL, 0.5), _finding("d", Severity.INFO, 3.0),
        _finding("e", Severity.NOT_APPLICABLE, 0.0), _finding("f", Severity.WARNING, 2.5),
    ])
    assert [f.check for f in ranked] == ["f", "b", "c", "d", "a", "e"]


def test_report_ranks_the_planted_problem_first(tmp_path):
    capture = build_training_session(steps=6, input_wait_frac=0.4, host_overhead_frac=0.05)
    (ref,) = find_sessions(str(capture.write(tmp_path)))
    session = analyze_session(ref)
    assert session["findings"][0]["check"] == "input_bound"
    assert [f["rank"] for f in session["findings"]] == list(range(1, len(session["findings"]) + 1))
    assert session["first_fix"]["check"] == "input_bound" and "ms per step" in session["first_fix"]["why"]


def test_a_check_that_crashes_becomes_an_error_and_the_others_still_run(tmp_path, monkeypatch):
    all_checks()

    def broken(analysis):
        raise RuntimeError("boom")

    monkeypatch.setitem(REGISTRY, "memory", dataclasses.replace(REGISTRY["memory"], function=broken))
    (ref,) = find_sessions(str(build_training_session(steps=3).write(tmp_path)))
    session = analyze_session(ref)
    assert any(e.get("check") == "memory" and "boom" in e["message"] for e in session["errors"])
    assert len(session["findings"]) == len([c for c in REGISTRY.values() if c.applies_to(session["framework"])]) - 1


def test_capture_problem_first_when_nothing_saves_time(tmp_path):
    """A GPU session whose device trace was lost: nothing can be measured on the device, so the
    capture problem comes first and says why."""
    session = build_training_session(gpus=1, marker="r", steps=4)
    for plane in session.space.planes:
        if plane.name.startswith("/device:GPU"):
            del plane.lines[:]
    session.write(tmp_path)
    (ref,) = find_sessions(str(tmp_path))
    report = analyze_session(ref)
    assert report["first_fix"]["check"] == "profile_quality"
    assert "fix this first" in report["first_fix"]["why"]


def test_every_corpus_session_analyses_without_errors(corpus):
    for ref in find_sessions(str(corpus)):
        session = analyze_session(ref)
        assert session["errors"] == [], (ref.run, session["errors"])
        assert len(session["findings"]) == len([c for c in REGISTRY.values() if c.applies_to(session["framework"])])


def test_amd_gpus_show_their_gfx_version_not_a_compute_capability(corpus):
    """Issue 25 item 7: the MI355X planes of jax-mi355x-amd carry device_vendor AMD and
    compute_cap_major 9, minor 5 (gfx950) and core_count 256 (compute units). Today's main
    prints "cc 9.5, 256 SMs" as if it were an NVIDIA compute capability."""
    report = {"sessions": [analyze_session(find_sessions(str(corpus / "jax-mi355x-amd"))[0])]}
    for text in (render_text(report, width=100), render_markdown(report)):
        assert "/device:GPU:0, gfx95x, 256 CUs," in text
        assert "cc 9.5" not in text and "SMs" not in text


@pytest.mark.parametrize("case", ["jax-mi355x-amd", "jax-mi300x-amd", "pytorch-mi300x-ddp-resnet18"])
def test_amd_matrix_units_are_called_matrix_cores(corpus, case):
    """AMD's Instinct GPUs multiply matrices on Matrix Cores (MFMA); NVIDIA's Tensor Cores are not
    theirs. Every GPU of these captures has device vendor AMD."""
    finding = next(f for f in analyze_session(find_sessions(str(corpus / case))[0])["findings"]
                   if f["check"] == "tensor_core")
    assert "Matrix Core" in finding["title"] + finding["summary"]
    assert "Tensor Core" not in finding["title"] + finding["summary"]


def test_time_origin_is_the_capture_clock_at_the_reports_zero(tmp_path):
    """Issue 26.3: links open XProf's trace viewer on the capture's own clock. The synthetic capture's
    first event is at 1.5 ms of its clock (its lines start at 1 ms, the first step 0.5 ms later; XProf
    shows step 0 at 1500 us), and the report's times start at 0: time_origin_ms is 1.5, and a step's
    start_ms plus it is XProf's time of that step."""
    capture = build_training_session(steps=4, input_wait_frac=0.3)
    (ref,) = find_sessions(str(capture.write(tmp_path, run="train", session="s1")))
    session = analyze_session(ref)
    assert session["time_origin_ms"] == 1.5
    steps = [e for f in session["findings"] for e in f["evidence"] if e["kind"] == "step"]
    assert steps and steps[0]["start_ms"] + session["time_origin_ms"] == 1.5 + 20.0 * int(steps[0]["name"].split()[1])


@dataclasses.dataclass
class _Step(StepScale):
    mean_step_ms: float


@pytest.mark.parametrize("step_ms, severity, saving, expected", [
    (0.5, Severity.WARNING, 0.09, Severity.INFO),         # 18% of a tiny step, but 0.09 ms
    (1.0, Severity.CRITICAL, 0.25, Severity.WARNING),     # 25% of the step, 0.25 ms
    (1.0, Severity.CRITICAL, 0.6, Severity.CRITICAL),     # both floors cleared
    (20.0, Severity.CRITICAL, 0.6, Severity.INFO),        # 3% of a long step: the share still rules
    (4.0, Severity.WARNING, 0.2, Severity.WARNING),
])
def test_severity_weighs_the_absolute_time_a_fix_wins(step_ms, severity, saving, expected):
    """A warning needs WARNING_MIN_MS per step and a critical CRITICAL_MIN_MS, whatever their
    share of the step; the share thresholds still apply on top."""
    scale = _Step(step_ms)
    assert scale.gated(severity, saving) is expected
    note = scale.gain_note(expected, saving)
    assert (note != "") == (expected is Severity.INFO)
    if expected is Severity.INFO and saving / step_ms >= WARNING_GAIN_SHARE:
        assert f"{WARNING_MIN_MS} ms" in note and "critical path" not in note


@pytest.mark.parametrize("marker, linked", [("keras3", False), ("r", True)])
def test_input_pipeline_page_is_linked_only_where_xprof_finds_the_steps(tmp_path, marker, linked):
    """Keras 3's "Profiled batch" markers are not XProf's step markers: its input pipeline page
    then says "No step marker observed", so the tf.data stages link to the trace viewer instead.
    A capture with XProf's own Steps line keeps the link."""
    build_training_session(steps=5, input_wait_frac=0.4, marker=marker).write(tmp_path, "train", "s1")
    (ref,) = find_sessions(str(tmp_path))
    session = analyze_session(ref)
    tools = {e.get("tool") for f in session["findings"] for e in f["evidence"] if e["kind"] == "stage"}
    assert tools and ("input_pipeline_analyzer" in tools) is linked
    assert "trace_viewer@" in tools or linked
