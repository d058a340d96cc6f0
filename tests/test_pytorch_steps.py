"""PyTorch steps from the side that sets the pace, and what is judged on them (issue 38).

``ProfilerStep#N`` times the host's enqueue. A step ends no earlier than the device work its
runtime calls launched (joined by correlation id): with no sync inside the step the host runs
ahead and the step lasts as long as its device work.

Hand check for the corpus numbers (standard library only, on the raw JSON): steps are the
host's ``ProfilerStep#N`` events; every ``kernel``/``gpu_memcpy``/``gpu_memset`` (older
spellings too) belongs to the step whose host period (its start to the next one's start, the
last to its own end) holds the ``cuda_runtime`` call of its ``args.correlation``; a step's
window runs from the later of its host start and the end of the previous step's device work,
to the next window's start (the last: to the later of its marker's end and its device work's
end).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from synth_kineto import kineto_trace, write_trace

from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.pipeline import load_session
from tb_gpuadvisor.timeline import PS_PER_MS
from tb_gpuadvisor.multihost import build_report
from tb_gpuadvisor.render import render_text
from tb_gpuadvisor.trust import assess


def _session(path: Path) -> dict:
    sessions = build_report(find_sessions(str(path)))["sessions"]
    assert len(sessions) == 1
    return sessions[0]


def _write(tmp_path: Path, **params) -> Path:
    write_trace(tmp_path / "run" / "w.pt.trace.json", kineto_trace(**params))
    return tmp_path / "run"


def test_host_running_ahead_gives_steps_as_long_as_the_gpu_takes(tmp_path):
    """4 steps of 20 kernels of 400 us launched in ~0.27 ms each, with nothing waiting for the GPU:
    the GPU runs 8 ms per step back to back. The host's markers alone give 0.27 ms steps (and an
    8 ms last one left out as an outlier)."""
    run = _write(tmp_path, steps=4, kernels=20, kernel_us=400.0, ahead=True)
    model = load_session(find_sessions(str(run))[0])
    steps = model.steps
    assert steps.paced_by == "device"
    assert np.allclose(steps.duration_ps / PS_PER_MS, 8.0, atol=0.02)
    # The host keeps its own periods: its launches stay in the step that made them.
    assert np.all(steps.host_end_ps - steps.host_start_ps < 0.3 * PS_PER_MS)
    trust = assess(model)
    assert not trust.excluded and len(trust.steps) == 4
    dev = trust.view.hosts[0].devices[0]
    assert np.bincount(dev.step[dev.step >= 0]).tolist() == [20, 20, 20, 20]
    session = _session(run)
    assert session["steps"]["paced_by"] == "device"
    assert session["steps"]["mean_ms"] == pytest.approx(8.0, abs=0.02)
    assert session["bottleneck"]["bound_by"] == "device compute"
    assert not any(f["check"] in ("kernel_launch", "host_overhead") and f["severity"] in ("warning", "critical")
                   for f in session["findings"])
    assert "the device set the pace" in render_text({"schema_version": 1, "sessions": [session]})


def test_last_window_does_not_swallow_a_queued_step(tmp_path):
    """The host launched a fifth step's kernels after the last marker (a step ahead when the
    profiler stopped): the last marked step ends with its own device work at 32 ms, not at the
    queued step's end at 40 ms."""
    run = _write(tmp_path, steps=4, kernels=20, kernel_us=400.0, ahead=True, queued=1)
    trust = assess(load_session(find_sessions(str(run))[0]))
    assert len(trust.steps) == 4 and not trust.excluded
    assert np.allclose(trust.steps.duration_ps / PS_PER_MS, 8.0, atol=0.02)


def test_first_step_starts_when_the_work_queued_before_it_ends(tmp_path):
    """One unmarked step's 20 kernels are launched before ProfilerStep#5 (the host runs ahead):
    the GPU runs them 0-8 ms, so #5's own work runs 8-16 ms and its window starts at 8 ms, not
    at its host start (0.27 ms), which would make it 16 ms long."""
    run = _write(tmp_path, steps=4, kernels=20, kernel_us=400.0, ahead=True, lead=1)
    steps = load_session(find_sessions(str(run))[0]).steps
    assert steps.paced_by == "device" and steps.number.tolist() == [5, 6, 7, 8]
    assert np.allclose(steps.duration_ps / PS_PER_MS, 8.0, atol=0.02)
    assert (steps.start_ps[0] - steps.host_start_ps[0]) / PS_PER_MS == pytest.approx(7.75, abs=0.05)


@pytest.mark.parametrize("sync_us, paced_by", [(0.0, "device"), (4000.0, "host")])
def test_a_sync_per_step_is_paced_by_whichever_side_the_other_waits_for(tmp_path, sync_us, paced_by):
    """Each step ends in loss.item(): with nothing after it the GPU is busy 8.0 of each 8.03 ms
    (device-paced); with 4 ms of Python logging after the sync the GPU idles a third of the step
    (host-paced). Either way the steps are the markers' periods (the sync keeps them apart)."""
    run = _write(tmp_path, steps=4, kernels=20, kernel_us=400.0, sync_us=sync_us)
    steps = load_session(find_sessions(str(run))[0]).steps
    assert steps.paced_by == paced_by
    assert np.array_equal(steps.start_ps, steps.host_start_ps)


def test_resnet50_dataloader_is_host_paced_and_its_step_ends_with_its_gpu_work(corpus):
    """Hand check (module docstring's method): ProfilerStep#5 runs 0-159.174 ms on the host; its
    1,547 device events end at 166.355 ms, after #6 started (159.246 ms), so its window is
    0-166.355 ms; the mean over the 6 steps stays 154.8 ms (first start and last end unchanged).
    The GPU idles in the DataLoader's waits: host-paced."""
    model = load_session(find_sessions(str(corpus / "pytorch-resnet50-dataloader/num_workers_0"))[0])
    steps = model.steps
    assert steps.paced_by == "host"
    assert steps.duration_ps[0] / PS_PER_MS == pytest.approx(166.355, abs=0.01)
    assert float(steps.duration_ps.mean()) / PS_PER_MS == pytest.approx(154.8, abs=0.05)


def test_a100_tracediff_test_is_device_paced(corpus):
    """Hand check: rank 3's host enqueues ProfilerStep#1009 in 100.3 ms and #1012 in 82.0 ms while
    their device work ends 157.408 and 512.442 ms after the first step's start (the host runs
    ahead); device-inclusive steps 157.408, 117.128, 114.802, 123.104, 116.692, 116.143 ms."""
    steps = load_session(find_sessions(str(corpus / "pytorch-a100-tracediff/test"))[0]).steps
    assert steps.paced_by == "device"
    assert np.allclose(steps.duration_ps / PS_PER_MS, [157.408, 117.128, 114.802, 123.104, 116.692, 116.143],
                       atol=0.01)


# --- the capture judged before the launches (issue 38, parts 3 and 6) -----------------------------

def _first(session: dict) -> dict:
    return session["findings"][0]


def _serious(session: dict, check: str) -> bool:
    """Whether CHECK is an actionable finding the capture supports."""
    return any(f["check"] == check and f["severity"] in ("warning", "critical") and f["confidence"] != "low"
               for f in session["findings"])


def test_launch_calls_without_device_events_say_the_device_trace_is_missing_first(tmp_path):
    """800 cudaLaunchKernel calls over 4 steps and not one kernel, copy or memset (CUPTI recorded
    nothing): the device trace is missing; nothing may say the device idled."""
    session = _session(_write(tmp_path, steps=4, kernels=200, kernel_us=40.0, device=False))
    first = _first(session)
    assert first["check"] == "profile_quality" and first["title"].startswith("Device trace missing")
    assert first["metrics"]["leads"] is True and session["trust"]["model_ran_on"] == "gpu_trace_lost"
    assert "800 GPU launch calls" in first["summary"]
    assert any("ProfilerActivity.CUDA" in fix["code"] for fix in first["fixes"])
    assert session["bottleneck"] is None
    assert not any("idles the device" in f["title"] for f in session["findings"] if f["severity"] != "ok")
    assert session["first_fix"]["check"] == "profile_quality"


def test_cpu_only_pytorch_trace_says_first_that_the_model_ran_on_the_cpu(tmp_path):
    """A PyTorch trace with no deviceProperties and no runtime call: aten ops only."""
    trace = kineto_trace(steps=4, kernels=20, device=False)
    trace.pop("deviceProperties")
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("name") != "cudaLaunchKernel"]
    write_trace(tmp_path / "run" / "w.pt.trace.json", trace)
    session = _session(tmp_path / "run")
    first = _first(session)
    assert first["check"] == "profile_quality" and first["title"].startswith("No GPU: the model ran on the CPU")
    assert session["trust"]["model_ran_on"] == "cpu_only"
    assert any("torch.cuda.is_available()" in fix["code"] for fix in first["fixes"])
    assert not any("tensorflow" in fix["code"] for fix in first["fixes"])


def test_copy_benchmark_leads_with_its_copies_not_op_placement(tmp_path):
    """5 steps, each one 2 ms pageable host-to-device copy of 64 MiB (cudaMemcpyAsync) then
    loss.item()'s cudaStreamSynchronize; no kernel launched at all."""
    session = _session(_write(tmp_path, steps=5, kernels=0, copy_us=2000.0, copy_bytes=64 << 20, sync_us=10.0))
    first = _first(session)
    assert first["check"] == "memcpy" and first["severity"] == "critical" and first["confidence"] == "high"
    assert "pageable" in first["summary"]
    assert not _serious(session, "op_placement")
    quality = next(f for f in session["findings"] if f["check"] == "profile_quality")
    assert quality["severity"] == "ok" and "copy-only program" in quality["summary"]


def test_a_warm_up_step_is_left_out_before_its_idle_is_attributed(tmp_path):
    """The first of 4 steps launches its first 150 kernels through a 300 us cuModuleLoadData each
    (45 ms of lazy loading in a ~47 ms step): it is left out as warm-up, the other 3 are judged."""
    trust = assess(load_session(find_sessions(str(_write(tmp_path, steps=4, kernels=200, kernel_us=15.0,
                                                               launch_us=8.0, lazy_loads=150)))[0]))
    assert [e.number for e in trust.excluded] == [5] and "lazy kernel loading" in trust.excluded[0].reason
    assert len(trust.steps) == 3 and trust.retake is None


@pytest.mark.parametrize("params, words", [
    (dict(steps=1, lazy_loads=150), "lazy kernel loading"),
    (dict(steps=2, compile_us=20000.0), "torch.compile"),
    (dict(steps=2, autotune=40), "cuDNN autotuning"),
])
def test_a_capture_of_warm_up_is_one_to_retake_first(tmp_path, params, words):
    """One step of 200 launches, 150 of them loading their kernel (45 of 47 ms), or two steps
    whose first spends 20 ms in torch.compile (``_compile.compile_inner (dynamo_timed)``) or 40 ms
    in one aten::cudnn_convolution launching 40 candidate kernels (cudnn.benchmark): what is left
    is too little to judge, so the capture is to be taken again after warm-up."""
    session = _session(_write(tmp_path, kernels=200, kernel_us=15.0, launch_us=8.0, **params))
    first = _first(session)
    assert first["check"] == "profile_quality" and "Warm-up capture" in first["title"]
    assert words in session["trust"]["capture_to_retake"]
    assert any("torch.profiler.schedule(wait=" in fix["code"] for fix in first["fixes"])
    assert not _serious(session, "kernel_launch") and not _serious(session, "host_overhead")


def test_a_final_sync_outlasting_the_last_kernel_is_set_up_not_a_stopped_trace(tmp_path):
    """The last of 4 steps ends in a cudaDeviceSynchronize that returns 200 ms after the last
    kernel: that step is left out as set-up, and the GPU's trace is not said to stop early."""
    session = _session(_write(tmp_path, steps=4, kernels=200, kernel_us=15.0, launch_us=8.0,
                              final_sync_us=200000.0))
    excluded = session["trust"]["excluded_steps"]
    assert [e["step"] for e in excluded] == [8] and "final synchronize" in excluded[0]["reason"]
    assert not session["trust"]["partial_device_trace"]
    assert session["steps"]["count"] == 3


def test_many_short_kernels_behind_their_launches_are_launch_bound_at_the_measured_cost(tmp_path):
    """200 kernels of 4 us per step, each launched by an 8 us cudaLaunchKernel 3 us after the
    last: the GPU waits for the launches; the launch cost is this capture's median, 8 us."""
    session = _session(_write(tmp_path, steps=4, kernels=200, kernel_us=4.0, launch_us=8.0))
    first = _first(session)
    assert first["check"] == "kernel_launch" and first["severity"] == "critical"
    assert first["metrics"]["launch_cost_us"] == pytest.approx(8.0) and first["metrics"]["launch_cost_measured"]


@pytest.mark.parametrize("params", [
    dict(cpu_input_us=3000.0, copy_us=200.0),      # torch.randn on the CPU, then .to('cuda')
    dict(silent_us=2000.0),                        # a custom kernel after 2 ms of unrecorded host work
    dict(sync_us=3000.0),                          # loss.item() then 3 ms of Python logging
])
def test_idle_that_launches_did_not_cause_is_not_launch_bound(tmp_path, params):
    """Each step's GPU idles 2-3 ms behind host work that is not launching: an aten::randn on the
    CPU, 2 ms of silence before the first launch, or Python after a cudaStreamSynchronize. Only
    the gaps between launch calls that follow each other closely are launch time."""
    session = _session(_write(tmp_path, steps=4, kernels=200, kernel_us=15.0, launch_us=8.0, **params))
    launch = next(f for f in session["findings"] if f["check"] == "kernel_launch")
    assert launch["severity"] not in ("warning", "critical")
    assert launch["metrics"]["launch_percent"] < 3.0


# --- a saving checked against the fix applied (issue 38, part 7) ----------------------------------

def test_dataloader_saving_predicted_on_a_tiny_mlp_is_the_measured_one(tiny_pair):
    """One update of a 64-64-10 MLP per step (a few hundred microseconds) behind a DataLoader whose
    32 samples take 0.25 ms each to make. Measured here: with num_workers=0 the step is 15.4 ms and
    the loop waits 13.2 ms of it in ``_SingleProcessDataLoaderIter.__next__``; with 4 workers 1.5 ms,
    the host's own dispatch and the batch's hand-over from the workers (0.9 ms) then set the step.
    The replay of the slow run without its waits (13.2 ms) is within 25% of the measured 13.8 ms."""
    sessions = {s["run"]: s for s in build_report(find_sessions(str(tiny_pair)))["sessions"]}
    slow, fixed = sessions["tiny_slow"], sessions["tiny_fixed"]
    predicted = next(f for f in slow["findings"] if f["check"] == "input_bound")["estimated_savings_ms_per_step"]
    measured = slow["steps"]["mean_ms"] - fixed["steps"]["mean_ms"]
    assert measured > 0 and predicted == pytest.approx(measured, rel=0.25)


def test_dataloader_saving_predicted_on_resnet50_is_the_measured_one(corpus):
    """Hand check: num_workers_0's 6 ProfilerStep#N windows average 154.80 ms, num_workers_4's
    128.30 ms (module docstring's method): the fix saved 26.5 ms per step. The replay of
    num_workers_0 without its DataLoader waits must predict it within 25%."""
    slow = _session(corpus / "pytorch-resnet50-dataloader/num_workers_0")
    fixed = _session(corpus / "pytorch-resnet50-dataloader/num_workers_4")
    predicted = next(f for f in slow["findings"] if f["check"] == "input_bound")["estimated_savings_ms_per_step"]
    measured = slow["steps"]["mean_ms"] - fixed["steps"]["mean_ms"]
    assert measured == pytest.approx(26.5, abs=0.05)
    assert predicted == pytest.approx(measured, rel=0.25)


def test_idle_after_a_sync_is_the_sync_named_by_its_op_not_launch_bound(tmp_path):
    """Every 5 kernels of 30 us the host calls .item() (aten::item around cudaStreamSynchronize):
    the queue drains, and the GPU idles from inside the sync until the next launch lands, 7% of
    the step. That idle is the sync's (its op named), not the launch rate's."""
    session = _session(_write(tmp_path, steps=4, kernels=200, kernel_us=30.0, launch_us=8.0, sync_every=5))
    launch = next(f for f in session["findings"] if f["check"] == "kernel_launch")
    assert launch["severity"] not in ("warning", "critical")
    host = next(f for f in session["findings"] if f["check"] == "host_overhead")
    assert "aten::item" in host["summary"]


@pytest.mark.parametrize("params", [
    dict(ahead=True, queued=1),                    # steps.paced_by
    dict(device=False),                            # trust.model_ran_on gpu_trace_lost, metrics.leads
    dict(steps=1, lazy_loads=150),                 # trust.capture_to_retake
    dict(kernels=0, copy_us=2000.0, sync_us=10.0),  # a copy-only program
])
def test_the_new_report_fields_follow_the_schema(tmp_path, params):
    from schema_check import validate
    from tb_gpuadvisor.schema import report_schema

    run = _write(tmp_path, **{"steps": 4, "kernels": 200, "kernel_us": 15.0, "launch_us": 8.0, **params})
    assert validate(build_report(find_sessions(str(run))), report_schema()) == []
