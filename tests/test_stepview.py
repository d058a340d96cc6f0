"""A step as a picture (stepview): every finding's marks add up to its number, the rows stay
bounded, and the representative step is the median one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import synth
from stepview_check import disagreements
from tb_gpuadvisor import stepview
from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.pipeline import Analysed, analysed_session

PYTORCH = ("pytorch-a100-tracediff/control", "pytorch-a100-tracediff/test", "pytorch-b200-eager",
           "pytorch-h100-owlv2", "pytorch-h100-qwen", "pytorch-hta-2ranks", "pytorch-mi300x-ddp-resnet18",
           "pytorch-resnet50-dataloader/num_workers_0", "pytorch-resnet50-dataloader/num_workers_4")

# Demo-like runs: each plants the problem of one demo scenario (demo/catalogue.py), or several.
SYNTH = {
    "input_bound": dict(steps=5, input_wait_frac=0.4, marker="r"),
    "host_overhead": dict(steps=6, host_overhead_frac=0.25),
    "launch_bound": dict(steps=6, framework="jax", marker="none", launch_frac=0.3, kernel_us=15),
    "planted": dict(steps=6, step_ms=20.0, gpus=4, marker="keras3", input_wait_frac=0.35, host_overhead_frac=0.06,
                    launch_frac=0.08, gpu_compute_scale={0: 1.4}, launch_skew_ms=1.5, kernel_us=120,
                    memcpy_frac=0.05, host_ops_frac=0.2, allreduce_calls=3, cc=(8, 0)),
    "cpu_only": dict(steps=4, gpus=0, marker="r", host_overhead_frac=0.2),
}


def _analysed(path: Path) -> Analysed:
    refs = find_sessions(str(path))
    assert len(refs) == 1
    return analysed_session(refs[0])


def _synth(tmp_path: Path, name: str) -> Analysed:
    synth.build_training_session(**SYNTH[name]).write(tmp_path, "train", "s1")
    return _analysed(tmp_path)


@pytest.mark.parametrize("name", sorted(SYNTH))
def test_marks_add_up_to_the_finding_on_demo_like_runs(tmp_path: Path, name: str):
    analysed = _synth(tmp_path, name)
    assert disagreements(analysed) == []
    view = analysed.timeline()
    marked = {m["check"] for m in view["findings"] if "why" not in m}
    assert {"input_bound", "host_overhead"} <= marked


def test_input_bound_run_marks_its_input_waits(tmp_path: Path):
    """The planted 40% input wait (synth: every step's wait is 0.4 of a 20 ms step) is what the
    input finding marks: 8 ms of the representative step, in one interval."""
    view = _synth(tmp_path, "input_bound").timeline()
    mark = next(m for m in view["findings"] if m["check"] == "input_bound")
    assert mark["step_percent"] == pytest.approx(40.0, abs=1.0)
    assert mark["finding_percent"] == pytest.approx(40.0, abs=1.0)
    assert sum(mark["dur"]) == pytest.approx(0.4 * view["duration_us"], rel=0.02)
    kinds = {row["kind"] for row in view["rows"]}
    assert kinds == {"cause", "device", "host"}
    waits = [row for row in view["rows"] if row["kind"] == "host"
             and stepview.GROUPS.index("input") in row["group"]]
    assert waits, "a host row draws the input wait"


@pytest.mark.parametrize("case", PYTORCH)
def test_marks_add_up_to_the_finding_on_every_pytorch_trace(corpus: Path, case: str):
    """Hand check (resnet50 num_workers_0, step 6, the representative one: steps last 166.4, 158.5,
    140.3, 163.1, 141.4, 159.1 ms): from the raw JSON, the part of step 6's
    ``DataLoader...__next__`` call (43.83 ms) covered by no Kernel/Memcpy/Memset interval is
    37.46 ms; the input finding marks 37.55 ms there (the rest: short waits at the step's end)."""
    analysed = _analysed(corpus / case)
    assert disagreements(analysed) == []
    view = analysed.timeline()
    json.dumps(view)
    assert len(json.dumps(view)) < 2_000_000
    if case.endswith("num_workers_0"):
        assert view["step"] == 6
        mark = next(m for m in view["findings"] if m["check"] == "input_bound")
        assert sum(mark["dur"]) / 1000 == pytest.approx(37.46, abs=0.5)


def test_two_hosts_have_rows_of_each(tmp_path: Path):
    for host, scale in (("w0", None), ("w1", {1: 1.3})):
        synth.build_training_session(steps=5, gpus=2, cc=(8, 0), collective_frac=0.1, allreduce_calls=2,
                                     gpu_compute_scale=scale, host=host).write(tmp_path, "train", "s1")
    view = _analysed(tmp_path).timeline()
    hosts = {row["host"] for row in view["rows"] if row["kind"] != "cause"}
    assert hosts == {"w0", "w1"}
    devices = {(row["host"], row["device"]) for row in view["rows"] if row["kind"] == "device"}
    assert len(devices) == 4


def test_representative_step_is_the_median_and_an_unknown_step_is_refused(tmp_path: Path):
    analysed = _synth(tmp_path, "host_overhead")
    steps = analysed.analysis.model.steps
    order = np.argsort(steps.duration_ps, kind="stable")
    assert analysed.timeline()["step"] == int(steps.number[order[(order.size - 1) // 2]])
    with pytest.raises(stepview.StepNotFound, match="not one of the trusted steps"):
        analysed.timeline(10_000)


def test_short_rectangles_merge_and_long_ones_stand_alone():
    ps = 1_000_000
    start = np.array([0, 2, 4, 100, 300, 301], np.int64) * ps
    end = np.array([1, 3, 5, 250, 300.5 * 1, 302], np.float64)
    end = (end * ps).astype(np.int64)
    rects = stepview._Rects(start, end, np.arange(6), np.zeros(6, np.int8), np.full(6, -1), np.zeros(6, np.int8))
    merged, count = stepview._merged(rects, 10 * ps, 100)
    assert merged.start.tolist() == [0, 100 * ps, 300 * ps]
    assert merged.end.tolist() == [5 * ps, 250 * ps, 302 * ps]
    assert count.tolist() == [3, 1, 2]
    # Over its cap, a row is merged across its smallest gaps (50 us here), the largest (95 us) stays.
    capped, count = stepview._merged(rects, 10 * ps, 2)
    assert capped.start.tolist() == [0, 100 * ps] and count.tolist() == [3, 3]
    assert capped.end.tolist() == [5 * ps, 302 * ps]
    assert capped.name.tolist() == [0, 3]       # the longest event names the merged rectangle


def test_cli_timeline_flag_adds_the_step_and_only_then(tmp_path: Path, capsys):
    from schema_check import validate
    from tb_gpuadvisor.cli import main
    from tb_gpuadvisor.schema import report_schema

    synth.build_training_session(steps=5, input_wait_frac=0.3).write(tmp_path, "good", "s1")
    assert main(["analyze", str(tmp_path), "--format", "json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(["analyze", str(tmp_path), "--format", "json", "--timeline", "representative"]) == 0
    drawn = json.loads(capsys.readouterr().out)
    assert validate(drawn, report_schema()) == []
    timeline = drawn["sessions"][0].pop("timeline")
    assert drawn == plain
    assert timeline["step"] in timeline["steps"]
    assert main(["analyze", str(tmp_path), "--format", "json", "--timeline", "99"]) == 0
    assert "not one of the trusted steps" in json.loads(capsys.readouterr().out)["sessions"][0]["timeline_error"]
    assert main(["analyze", str(tmp_path), "--timeline", "2"]) == 2
    assert "--format json" in capsys.readouterr().err


def test_service_route_answers_pending_then_the_step(tmp_path: Path):
    from tb_gpuadvisor import service

    synth.build_training_session(steps=4, input_wait_frac=0.3).write(tmp_path, "train", "s1")
    svc = service.AdvisorService([service.LogRoot("", str(tmp_path))], wait_s=10.0)
    try:
        first = svc.timeline("train", "s1", None)
        steps = first["steps"]
        assert first["step"] in steps
        again = svc.timeline("train", "s1", str(steps[0]))
        assert again["step"] == steps[0]
        with pytest.raises(service.NotFound, match="not one of the trusted steps"):
            svc.timeline("train", "s1", "12345")
        with pytest.raises(service.BadRequest, match="step number"):
            svc.timeline("train", "s1", "first")
        with pytest.raises(service.BadRequest):
            svc.timeline("../x", "s1", None)
    finally:
        svc.close()


def test_service_holds_the_last_drawn_sessions_only(tmp_path: Path):
    """HELD_SESSIONS analyses stay in memory (each holds its capture's events); a third session
    drawn pushes out the least recently drawn one, which is analysed again when asked for."""
    from tb_gpuadvisor import service

    for session in ("s1", "s2", "s3"):
        synth.build_training_session(steps=2).write(tmp_path, "train", session)
    analysed: list[str] = []

    class Held:
        def __init__(self, ref) -> None:
            analysed.append(ref.session)

        def timeline(self, step: int | None) -> dict:
            return {"step": step}

    svc = service.AdvisorService([service.LogRoot("", str(tmp_path))], wait_s=10.0, analysed=Held)
    try:
        assert service.HELD_SESSIONS == 2
        for session in ("s1", "s2", "s1", "s3", "s1", "s2"):
            assert svc.timeline("train", session, "3") == {"step": 3}
        assert analysed == ["s1", "s2", "s3", "s2"]
    finally:
        svc.close()


def test_window_finds_every_overlapping_event_long_ones_too():
    """The step's rows of a table: what a brute-force overlap test finds, a whole-capture event
    (kept apart as one of the longest) included."""
    from tb_gpuadvisor.timeline import TableKey

    class Table:
        key = TableKey()
        start_ps = np.sort(np.random.default_rng(0).integers(0, 10**9, 5000)).astype(np.int64)
        dur_ps = np.random.default_rng(1).integers(1, 10**5, 5000).astype(np.int64)
        dur_ps[3] = 10**10           # an annotation over the whole capture
        end_ps = start_ps + dur_ps

    for lo, hi in ((0, 10**6), (5 * 10**8, 5 * 10**8 + 10**7), (2 * 10**9, 3 * 10**9)):
        expected = np.flatnonzero((Table.start_ps < hi) & (Table.end_ps > lo))
        assert stepview._window(Table, lo, hi).tolist() == expected.tolist()
        assert 3 in expected
