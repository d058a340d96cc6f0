"""One window around a model's first call (the profiler recipe's capture, no schedule, no step
marks): led by what the capture cannot show and how to retake it, with its set-up never told as
a host cost; and findings judged by their share of the step as well as their time."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from synth_kineto import first_call_trace, kineto_trace, long_launch_trace, write_trace
from tb_gpuadvisor.input.kineto import build as kineto
from tb_gpuadvisor.kinds import HostEventKind
from tb_gpuadvisor.checks.context import StepScale
from tb_gpuadvisor.checks.finding import Severity
from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.multihost import build_report

ACTIONABLE = ("warning", "critical")


def _session(trace: dict, tmp_path: Path) -> dict:
    write_trace(tmp_path / "run" / "w.pt.trace.json", trace)
    return build_report(find_sessions(str(tmp_path / "run")))["sessions"][0]


def _finding(session: dict, check: str) -> dict:
    return next(f for f in session["findings"] if f["check"] == check)


def test_first_call_window_is_led_by_its_retake_not_host_overhead(tmp_path):
    """Hand check (synth_kineto.first_call_trace, cold): the window runs from the first event (the
    ``aten::to`` at 0) to the end of ``aten::item``: 150 ms of ``cudaFree`` (context creation) +
    0.4 ms of stream creation + 12 ms of cuBLAS initialisation before the first ``aten::mm``'s
    launch + lazy launches of 20 and 8 ms + about 40 us of ops and copies = 190.44 ms, of which
    the GPU works 30 us (5 + 10 + 2 + 10 + 3 + 2 us). Set-up is all of it but the ops' few us."""
    session = _session(first_call_trace(), tmp_path)
    assert session["steps"]["source"] == "window"
    # The traced span, the context's creation included (first to last GPU event would be 40 ms).
    assert session["steps"]["mean_ms"] == pytest.approx(190.44, abs=0.05)
    first = session["findings"][0]
    assert first["check"] == "profile_quality" and first["severity"] == "warning"
    assert "take it again after warm-up" in first["title"]
    assert "context creation" in first["summary"] and "first calls" not in first["title"]
    code = first["fixes"][0]["code"]
    assert "model(x)" in code.splitlines()[0] and "schedule(wait=1, warmup=1, active=3)" in code
    assert "prof.step()" in code
    # The set-up is its own part of the breakdown, not the host's: no host finding is actionable.
    device = session["breakdown"]["per_device"][0]
    assert device["setup_ms"] == pytest.approx(190.4, abs=0.1)
    assert device["other_host_ms"] < 0.05 and device["launch_ms"] < 0.05
    for check in ("host_overhead", "kernel_launch", "input_bound"):
        assert _finding(session, check)["severity"] not in ACTIONABLE
    assert "setup" in [c["key"] for c in session["breakdown"]["categories"]]
    assert session["bottleneck"]["bound_by"] == "one-time set-up"
    assert session["bottleneck"]["checks"] == ["profile_quality"]


def test_first_call_window_with_a_tiny_device_share_is_retaken(tmp_path):
    """Hand check: no context creation (CONTEXT_MS=0: the process used the GPU before), 12 + 20 + 8
    = 40.4 ms of library set-up and lazy launches, then 60 ms of Python that launches nothing: set-up
    is 40% of the ~100.5 ms window (under half), and the GPU works 30 us of it (0.03%): a window of
    first calls, still to be retaken; the 60 ms of Python are the warm part, judged as host time."""
    session = _session(first_call_trace(context_ms=0.0, host_ms=60.0), tmp_path)
    retake = session["trust"]["capture_to_retake"]
    assert "first calls" in retake and "0.0% of the captured time" in retake
    assert session["findings"][0]["check"] == "profile_quality"
    device = session["breakdown"]["per_device"][0]
    assert device["setup_ms"] == pytest.approx(40.4, abs=0.2)
    assert device["other_host_ms"] == pytest.approx(60.0, abs=0.1)
    # The warm part's 60 ms of Python is the host's, judged after the retake and at low confidence.
    host = session["findings"][1]
    assert host["check"] == "host_overhead" and host["confidence"] == "low"
    assert host["estimated_savings_ms_per_step"] == pytest.approx(60.0, abs=0.1)


def test_warmed_up_call_is_judged_as_it_is(tmp_path):
    """The same call warmed up (every launch 6 us): no set-up, no retake, and the report carries no
    set-up column (a report shows it only where there is some)."""
    session = _session(first_call_trace(cold=False), tmp_path)
    assert "capture_to_retake" not in session["trust"]
    assert session["findings"][0]["check"] != "profile_quality" or session["findings"][0]["severity"] == "info"
    assert "setup_ms" not in session["breakdown"]["per_device"][0]
    assert all("setup_ms" not in step for step in session["breakdown"]["steps"])
    assert "setup" not in [c["key"] for c in session["breakdown"]["categories"]]


def test_a_later_or_short_cudafree_is_not_context_creation(tmp_path):
    """A 5 ms ``cudaFree`` after the call's device work (empty_cache) frees memory; so does a 20 us
    one at the start: neither is set-up."""
    trace = first_call_trace(cold=False)
    events = trace["traceEvents"]
    end = max(e["ts"] + e["dur"] for e in events if e["ph"] == "X")
    late = copy.deepcopy(trace)
    late["traceEvents"].append({"ph": "X", "cat": "cuda_runtime", "name": "cudaFree", "pid": 1, "tid": 7,
                                "ts": end + 1, "dur": 5000.0})
    session = _session(late, tmp_path / "late")
    assert "setup_ms" not in session["breakdown"]["per_device"][0] and "capture_to_retake" not in session["trust"]
    short = copy.deepcopy(trace)
    for e in short["traceEvents"]:
        if e["ph"] == "X":
            e["ts"] += 30.0
    short["traceEvents"].append({"ph": "X", "cat": "cuda_runtime", "name": "cudaFree", "pid": 1, "tid": 7,
                                 "ts": 1000.0, "dur": 20.0})
    session = _session(short, tmp_path / "short")
    assert "setup_ms" not in session["breakdown"]["per_device"][0]


def test_library_setup_counts_once_per_query_name(tmp_path):
    """A library that queries kernel attributes on every call (two ``cudaFuncGetAttributes`` inside
    each ``aten::mm``) adds only the first query's op scope: the later calls' queries are 0.1 ms
    each, and no op before them is counted as set-up."""
    trace = first_call_trace(cold=False)
    for e in [e for e in trace["traceEvents"] if e.get("name") == "aten::mm"]:
        trace["traceEvents"].append({"ph": "X", "cat": "cuda_runtime", "name": "cudaFuncGetAttributes",
                                     "pid": 1, "tid": 7, "ts": e["ts"] + 0.2, "dur": 0.1})
    session = _session(trace, tmp_path)
    # The first aten::mm's start to its launch: 0.2 + 0.1 + up to its launch (about 1 us).
    assert session["breakdown"]["per_device"][0].get("setup_ms", 0.0) < 0.002
    assert "capture_to_retake" not in session["trust"]


class _Step(StepScale):
    def __init__(self, mean_step_ms: float) -> None:
        self.mean_step_ms = mean_step_ms


@pytest.mark.parametrize("step_ms, saving_ms, metric, expected", [
    (0.16, 0.088, Severity.CRITICAL, Severity.CRITICAL),   # 55% of a 0.16 ms step: the whole loop
    (0.16, 0.061, Severity.CRITICAL, Severity.WARNING),    # 38% of it: worth a change
    (0.16, 0.061, Severity.WARNING, Severity.WARNING),
    (0.5, 0.09, Severity.WARNING, Severity.INFO),          # 18% of a 0.5 ms step: under the floor
    (0.5, 0.09, Severity.CRITICAL, Severity.INFO),
    (2.6, 0.1, Severity.WARNING, Severity.INFO),           # 4% of a 2.6 ms step
    (10.0, 0.3, Severity.WARNING, Severity.INFO),          # 3%: under the share, over the floor
    (10.0, 0.6, Severity.CRITICAL, Severity.WARNING),      # 6%: a warning, not critical
    (10.0, 1.5, Severity.CRITICAL, Severity.CRITICAL),
])
def test_severity_counts_the_share_of_a_tiny_step(step_ms, saving_ms, metric, expected):
    assert _Step(step_ms).gated(metric, saving_ms) is expected


def test_the_gain_note_names_both_ways_to_a_warning():
    note = _Step(0.5).gain_note(Severity.INFO, 0.09)
    assert "0.2 ms" in note and "25% of the step" in note
    assert json.dumps(note)


def test_a_run_on_an_untraced_device_is_not_told_it_ran_on_the_cpu(tmp_path):
    """synth_kineto.untraced_device_trace: 4 steps of 20 x 40 us of op dispatch and a 12 ms
    ``.item()`` with no device event at all (what an MPS run writes). Reading a CPU tensor back
    takes microseconds, so 12 ms per step of waiting is for a device the profiler did not trace."""
    from synth_kineto import untraced_device_trace

    session = _session(untraced_device_trace(), tmp_path / "mps")
    first = session["findings"][0]
    assert first["check"] == "profile_quality" and first["severity"] == "warning"
    assert first["title"].startswith("The model ran on a device the profiler cannot trace")
    assert "ran on the CPU" not in first["title"] and "MPS" in first["summary"]
    assert "torch.mps.profiler.profile" in first["fixes"][0]["code"]
    placement = session["trust"]["placement"]
    assert placement["where"] == "cpu_only"
    assert placement["untraced_device_wait_ms_per_step"] == pytest.approx(12.0, abs=0.01)


def test_a_cpu_run_with_quick_read_backs_ran_on_the_cpu(tmp_path):
    """The same loop whose ``.item()`` returns in 20 us: a CPU run, told so (as context, since no
    GPU is listed: issue 44 ranks the run's real costs above it)."""
    from synth_kineto import untraced_device_trace

    session = _session(untraced_device_trace(item_ms=0.02), tmp_path / "cpu")
    told = [f for f in session["findings"] if f["title"].startswith("No GPU: the model ran on the CPU")]
    assert len(told) == 1 and told[0]["severity"] == "info"
    assert not any("cannot trace" in f["title"] for f in session["findings"])
    assert "untraced_device_wait_ms_per_step" not in session["trust"]["placement"]


def _export_calls(path: Path, calls: int) -> None:
    """A small model's first CALLS calls in the process, the first one without a warm-up, each
    profiled on its own the way the profiler recipe shows (one ``with profile()`` window, no schedule,
    written by ``export_chrome_trace``): PATH is the last call's trace."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    x = torch.randn(64, 256)
    for _ in range(calls):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            model(x).sum().item()
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))


@pytest.mark.parametrize("calls", [1, 2])
def test_recipe_windows_of_a_cpu_model_are_one_window_on_the_cpu(tmp_path, calls):
    """Real traces made here: the profiler recipe's window around a CPU model's first call, and
    around its second. Neither has a step mark; read from the raw JSON, each holds the aten ops
    (``cpu_op``) of two linears and a relu, a sum and an item, no device and no runtime call, inside
    the profiler's own ``PyTorch Profiler (0)`` event (category ``Trace``, not the program's). So:
    one window from the first op's start to the last op's end, a CPU run (its .item() reads a CPU
    tensor in microseconds: 8 us on the first call here), no GPU set-up and nothing to retake."""
    path = tmp_path / "run" / "trace.pt.trace.json"
    _export_calls(path, calls)
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "cpu_op"]
    span_ms = (max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)) / 1000
    session = build_report(find_sessions(str(tmp_path / "run")))["sessions"][0]
    assert session["steps"]["source"] == "window" and session["steps"]["count"] == 1
    assert session["steps"]["mean_ms"] == pytest.approx(span_ms, abs=0.01)
    assert session["trust"]["model_ran_on"] == "cpu_only" and "capture_to_retake" not in session["trust"]
    assert "untraced_device_wait_ms_per_step" not in session["trust"]["placement"]
    told = [f for f in session["findings"] if f["title"].startswith("No GPU: the model ran on the CPU")]
    assert len(told) == 1 and told[0]["severity"] == "info"     # context: no GPU is listed (issue 44)


def test_a_window_opening_on_a_busy_device_counts_that_work_as_not_traced(tmp_path):
    """The warmed-up call, profiled while the GPU still ran 42 ms of work queued before the window:
    its first copy call (``cudaMemcpyAsync`` of ``aten::to``) starts at the window's start and
    returns 42 ms later, when the queue drained and its copy ran. By hand: the GPU's first traced
    event starts 42.007 ms into the window; before it the GPU was busy with untraced work, so those
    42 ms are not traced, not idle, and no host finding is made of them."""
    trace = first_call_trace(cold=False)
    call = next(e for e in trace["traceEvents"] if e.get("name") == "cudaMemcpyAsync")
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and e["ts"] > call["ts"]:
            e["ts"] += 42_000.0
    call["dur"] += 42_000.0
    next(e for e in trace["traceEvents"] if e.get("name") == "aten::to")["dur"] += 42_000.0
    session = _session(trace, tmp_path)
    device = session["trust"]["devices"][0]
    first_copy_ms = device["covered_ms"][0]
    assert first_copy_ms == pytest.approx(42.007, abs=0.002)
    assert device["busy_before_window_until_ms"] == pytest.approx(first_copy_ms, abs=0.001)
    part = session["breakdown"]["per_device"][0]
    assert part["not_traced_ms"] == pytest.approx(42.0, abs=0.01)
    assert part["other_host_ms"] < 0.05
    for check in ("host_overhead", "kernel_launch", "memcpy"):
        assert _finding(session, check)["severity"] not in ACTIONABLE
    quality = _finding(session, "profile_quality")
    assert "work queued before it" in quality["summary"]
    assert any("torch.cuda.synchronize()" in fix["code"] for fix in quality["fixes"])


def test_a_window_opening_on_an_idle_device_covers_it_all(tmp_path):
    """The warmed-up call on an idle device: its copy call returns in 6 us, nothing was queued."""
    session = _session(first_call_trace(cold=False), tmp_path)
    assert "busy_before_window_until_ms" not in session["trust"]["devices"][0]
    assert session["breakdown"]["per_device"][0]["not_traced_ms"] == 0.0


def test_a_pageable_batch_copy_is_input_not_host_overhead(tmp_path):
    """synth_kineto.kineto_trace with a 16.5 MB pageable host-to-device copy per step whose call
    stages the batch for 4 ms before its 1.4 ms copy runs, then 20 kernels of 400 us. By hand: the
    GPU idles 4 ms per step inside the copy's call (and ~0.3 ms between launches), so about 4 ms of a
    ~13.7 ms step is the batch's feeding: input first, with pinned non-blocking copies as the fix."""
    from synth_kineto import kineto_trace

    trace = kineto_trace(steps=4, kernels=20, copy_us=1400.0, copy_staging_us=4000.0, copy_bytes=16_500_000)
    session = _session(trace, tmp_path)
    part = session["breakdown"]["per_device"][0]
    assert part["input_ms"] == pytest.approx(4.0, abs=0.01)
    first = session["findings"][0]
    assert first["check"] == "input_bound" and first["severity"] in ACTIONABLE
    assert "pageable memory" in first["summary"]
    assert "pin_memory=True" in first["fixes"][0]["code"] and "non_blocking=True" in first["fixes"][0]["code"]
    assert first["estimated_savings_ms_per_step"] == pytest.approx(4.0, abs=0.1)
    assert _finding(session, "host_overhead")["severity"] not in ACTIONABLE


def test_a_cold_first_iteration_is_judged_over_what_it_traced(tmp_path):
    """A cold first iteration with no step mark: the loop waits 2.7 s for its first batch (the
    DataLoader starting its workers) before the cold call of the first test. By hand: the traced
    span is 2700 ms + 1 us + 190.44 ms = 2890.44 ms (first to last GPU activity would be 40 ms of it); the wait
    is input (2700 ms, 93%), the 190.4 ms of set-up its own part, and input leads."""
    session = _session(first_call_trace(input_ms=2700.0), tmp_path)
    assert session["steps"]["mean_ms"] == pytest.approx(2890.44, abs=0.05)
    device = session["breakdown"]["per_device"][0]
    assert device["input_ms"] == pytest.approx(2700.0, abs=0.01)
    assert device["setup_ms"] == pytest.approx(190.4, abs=0.1)
    first = session["findings"][0]
    assert first["check"] == "input_bound" and first["severity"] == "critical"
    assert first["estimated_savings_ms_per_step"] == pytest.approx(2700.0, abs=1.0)


def test_only_a_first_launch_that_loads_its_kernel_is_set_up(tmp_path):
    """Hand check (synth_kineto.long_launch_trace): ProfilerStep#0's one launch lasts 200 ms (the
    first run of ``gemm_a``: its module loaded lazily) and the step 200.108 ms in all: set-up, so a
    warm-up step left out.  Each steady step (6 + 3000 + 2000 us of calls, 3 us apart, the 100 us
    of ``gemm_a``'s second run inside the copy's wait, 2 x 100 us + 1 us of graph kernels and 5 us to
    the step's end = 5.218 ms) holds a 3 ms blocking ``cudaMemcpy`` and a 2 ms ``cudaGraphLaunch``,
    the first of which launches the graph's kernels' first runs: long, but neither loads anything,
    so neither is set-up, and no steady step holds any."""
    path = write_trace(tmp_path / "run" / "w.pt.trace.json", long_launch_trace())
    act = kineto.read(str(path), "w").activity
    kinds = {}
    for row in range(len(act)):
        kinds.setdefault(act.names[act.name[row]], []).append(int(act.kind[row]))
    assert kinds["cudaLaunchKernel"] == [HostEventKind.FIRST_USE] + [HostEventKind.LAUNCH] * 3
    assert kinds["cudaMemcpy"] == kinds["cudaGraphLaunch"] == [HostEventKind.SLOW_LAUNCH] * 3
    session = build_report(find_sessions(str(tmp_path / "run")))["sessions"][0]
    (warm_up,) = session["trust"]["excluded_steps"]
    assert warm_up["step"] == 0 and "200.0 ms of first-use set-up" in warm_up["reason"]
    assert session["steps"]["count"] == 3 and session["steps"]["mean_ms"] == pytest.approx(5.218, abs=0.002)
    device = session["breakdown"]["per_device"][0]
    assert device.get("setup_ms", 0.0) == 0.0 and device["launch_ms"] < 0.01


def test_a_steady_step_of_long_copies_and_graph_launches_is_typical(tmp_path):
    """Hand check: the same trace without its first call is one steady step (5.218 ms) whose 5 ms of
    launch calls are a blocking copy and a graph launch, no set-up: one step is judged typical (no
    first-use set-up said of it, as was said when any launch of 1 ms or more counted)."""
    write_trace(tmp_path / "run" / "w.pt.trace.json", long_launch_trace(steps=1, first_launch_ms=0.0))
    session = build_report(find_sessions(str(tmp_path / "run")))["sessions"][0]
    assert session["steps"]["count"] == 1
    assert session["trust"]["single_step"] == {"typical": True, "atypical_because": []}
    assert session["trust"].get("capture_to_retake") is None


def test_the_adapter_marks_compilation_and_cudnn_search_as_set_up(tmp_path):
    """Hand check (synth_kineto.kineto_trace): the first step opens with 20 ms of
    ``_compile.compile_inner (dynamo_timed)`` and one ``aten::cudnn_convolution`` call that launches
    40 ``implicit_convolve_sgemm`` kernels (cuDNN timing its algorithms); the later steps' convolutions
    are plain ``aten::mm`` calls of one launch each.  The adapter marks the compile and that one call,
    nothing else, and the search's kernels still name the convolution as their op."""
    path = write_trace(tmp_path / "w.pt.trace.json", kineto_trace(steps=2, compile_us=20_000.0, autotune=40))
    capture = kineto.read(str(path), "w")
    act = capture.activity
    named = {kind: sorted({act.names[i] for i in act.name[act.kind == kind]})
             for kind in (HostEventKind.COMPILE, HostEventKind.AUTOTUNE)}
    assert named == {HostEventKind.COMPILE: ["_compile.compile_inner (dynamo_timed)"],
                     HostEventKind.AUTOTUNE: ["aten::cudnn_convolution"]}
    assert int((act.kind == HostEventKind.AUTOTUNE).sum()) == 1
    (gpu,) = capture.devices
    searched = [gpu.launch_ops[o] for n, o in zip(gpu.name, gpu.launch_op) if gpu.names[n] == "implicit_convolve_sgemm"]
    assert searched == ["aten::cudnn_convolution"] * 40
