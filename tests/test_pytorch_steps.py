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

from tb_gpuadvisor.discovery import find_sessions
from tb_gpuadvisor.model import load_session
from tb_gpuadvisor.model.timeline import PS_PER_MS
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
