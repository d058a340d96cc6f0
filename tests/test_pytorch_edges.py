"""PyTorch traces at the edges of what torch.profiler writes (issues 38 and 34).

A capture of ``ProfilerActivity.CUDA`` only holds the GPU's kernels and copies and no host
event: it is still PyTorch's, its replay and checks run on it, and the report says what it can
tell (the GPU's work) and what it cannot (why the GPU idled). ``ProfilerStep#N`` may then be
written only on the GPU side (``gpu_user_annotation``, as PyTorch 1.8-1.10 traces do too): the
steps come from those when the host has none. A session one of whose rank files is still being
written is answered as being written (exit 2), not as a partial report.

Hand check of the synthetic traces (tests/synth_kineto.py, times in us): with INPUT_US=3000 and
SYNC_US=2000 each step's 20 kernels of 20 us (60 us launches apart) follow a 3 ms DataLoader wait
and end 2 ms before the next step: the GPU idles about 5 ms of each ~6.3 ms step, which a trace
with the host blames on the input and the sync, and one without the host cannot explain.
"""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
from synth_kineto import kineto_trace, write_trace

from tb_gpuadvisor import cli
from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.pipeline import load_session
from tb_gpuadvisor.timeline import PS_PER_MS
from tb_gpuadvisor.multihost import build_report
from tb_gpuadvisor.vocab import pytorch

IDLE_STEPS = {"kernel_us": 20.0, "launch_us": 60.0, "input_us": 3000.0, "sync_us": 2000.0, "copy_us": 50.0}
HOST_CHECKS = ("host_overhead", "input_bound", "kernel_launch", "sync_stalls", "op_placement")


def _session(run: Path) -> dict:
    sessions = build_report(find_sessions(str(run)))["sessions"]
    assert len(sessions) == 1
    return sessions[0]


def _write(tmp_path: Path, **params) -> Path:
    write_trace(tmp_path / "run" / "w.pt.trace.json", kineto_trace(**params))
    return tmp_path / "run"


def test_device_only_trace_is_pytorch_and_claims_no_idle_cause(tmp_path):
    """Kernels and copies with no cpu_op, cuda_runtime or annotation: every check runs (no
    IndexError in the replay), the GPU's idle is not traced rather than host time, no host
    finding is made, and profile_quality says the host side was not recorded with the fix."""
    session = _session(_write(tmp_path, host=False, **IDLE_STEPS))
    assert session["framework"] == "pytorch"
    assert session["errors"] == []
    findings = {f["check"]: f for f in session["findings"]}
    assert not any(f["severity"] != "ok" for c, f in findings.items() if c in HOST_CHECKS)
    quality = findings["profile_quality"]
    assert quality["severity"] == "warning" and "Host side not recorded" in quality["title"]
    assert any("ProfilerActivity.CPU" in fix["code"] for fix in quality["fixes"])
    step = session["breakdown"]["steps"][0]
    assert step["not_traced_ms"] > 0.5 * step["duration_ms"]
    assert step["other_host_ms"] == step["input_ms"] == step["launch_ms"] == 0.0


def test_same_trace_with_the_host_names_its_idle_causes(tmp_path):
    """The control: the same steps with the host recorded have no untraced time, blame the input
    wait, and profile_quality does not say the host is missing."""
    session = _session(_write(tmp_path, **IDLE_STEPS))
    assert session["errors"] == []
    assert all(s["not_traced_ms"] == 0.0 for s in session["breakdown"]["steps"])
    findings = {f["check"]: f for f in session["findings"]}
    assert findings["input_bound"]["severity"] != "ok"
    assert "Host side not recorded" not in findings["profile_quality"]["title"]


def test_steps_come_from_gpu_side_profiler_steps_when_the_host_has_none(tmp_path):
    """With ProfilerStep#5..8 only as gpu_user_annotation events (device pid/tid), the steps are
    those four: each starts where its step's first GPU event (the input copy) starts, so step k
    lasts from there to step k+1's; hand check: in the synthetic trace consecutive steps start
    6.278 ms apart (3000 input + 50 copy + 20 x 63 launches + 2000 sync + waits, in us)."""
    trace = kineto_trace(host=False, gpu_steps=True, **IDLE_STEPS)
    marks = [e for e in trace["traceEvents"] if e.get("cat") == "gpu_user_annotation"]
    starts_us = np.array([e["ts"] for e in marks])
    write_trace(tmp_path / "run" / "w.pt.trace.json", trace)
    model = load_session(find_sessions(str(tmp_path / "run"))[0])
    steps = model.steps
    assert steps.source == pytorch.DEVICE_STEP_SOURCE
    assert steps.number.tolist() == [5, 6, 7, 8]
    assert np.allclose(np.diff(steps.start_ps) / PS_PER_MS, np.diff(starts_us) / 1000.0)
    session = _session(tmp_path / "run")
    assert session["steps"]["count"] == 4 and session["steps"]["source"] == pytorch.DEVICE_STEP_SOURCE
    assert session["errors"] == []


def test_real_trace_without_its_host_events_keeps_the_gpu_step(corpus, tmp_path):
    """pytorch-h100-owlv2 with every host event removed (only kernel, gpu_memcpy, gpu_memset and
    gpu_user_annotation kept, as a ProfilerActivity.CUDA capture writes it). Hand check (json on
    the raw trace): 132,152 events, 5,226 kept; ProfilerStep#6 is on the host (user_annotation,
    1211.182 ms) and on the GPU (gpu_user_annotation, pid 0 tid 7, ts 1419116233497.124 us,
    dur 1078288.381 us): the one step is the GPU's, 1078.288 ms."""
    with gzip.open(corpus / "pytorch-h100-owlv2" / "worker0.pt.trace.json.gz") as f:
        trace = json.load(f)
    kept = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("ph") == "M" or e.get("cat") in kept]
    write_trace(tmp_path / "run" / "w.pt.trace.json", trace)
    session = _session(tmp_path / "run")
    assert session["framework"] == "pytorch" and session["errors"] == []
    assert session["steps"]["source"] == pytorch.DEVICE_STEP_SOURCE and session["steps"]["count"] == 1
    assert session["steps"]["mean_ms"] == pytest.approx(1078.288, abs=0.001)
    findings = {f["check"]: f for f in session["findings"]}
    assert findings["profile_quality"]["title"] == "Host side not recorded"
    assert not any(f["severity"] != "ok" for c, f in findings.items() if c in HOST_CHECKS)


def test_host_profiler_steps_win_over_gpu_side_ones(tmp_path):
    """A trace with both: the host's ProfilerStep#N decide (paced as usual), the GPU's are unused."""
    model = load_session(find_sessions(str(_write(tmp_path, gpu_steps=True, **IDLE_STEPS)))[0])
    assert model.steps.source == pytorch.STEP_SOURCE and len(model.steps) == 4


def test_legacy_trace_with_steps_on_the_gpu_only(tmp_path):
    """PyTorch 1.8-1.10 spellings (Kernel/Runtime/Operator) whose host events carry no
    ProfilerStep#N but whose GPU side does: the steps are the GPU's four."""
    trace = kineto_trace(old=True, gpu_steps=True, steps=4)
    trace["traceEvents"] = [e for e in trace["traceEvents"]
                            if not (e.get("cat") == "Operator" and str(e.get("name")).startswith("ProfilerStep#"))]
    write_trace(tmp_path / "run" / "w.pt.trace.json", trace)
    session = _session(tmp_path / "run")
    assert session["framework"] == "pytorch" and session["errors"] == []
    assert session["steps"]["source"] == pytorch.DEVICE_STEP_SOURCE and session["steps"]["count"] == 4


def _two_ranks(tmp_path: Path) -> Path:
    """Rank 0 complete, rank 1 cut mid-event and just modified: one rank still being written."""
    run = tmp_path / "run"
    write_trace(run / "rank-0.pt.trace.json", kineto_trace())
    text = json.dumps(kineto_trace())
    (run / "rank-1.pt.trace.json").write_text(text[: len(text) // 2])
    return run


def test_cli_session_with_one_rank_being_written_exits_2(tmp_path, capsys):
    """The complete rank is not reported as the session: one line says a host is still being
    written, and the exit status is 2 (as for a single trace being written)."""
    run = _two_ranks(tmp_path)
    assert cli.main(["analyze", str(run)]) == 2
    out = capsys.readouterr()
    text = out.out + out.err
    assert "being written" in text and "rank-1" in text


def test_cli_session_with_an_old_truncated_rank_is_a_partial_report(tmp_path, capsys):
    """A rank file truncated for good (not changed for minutes) is an unreadable host: the other
    rank is reported and the exit status stays 0."""
    run = _two_ranks(tmp_path)
    old = time.time() - 3600
    os.utime(run / "rank-1.pt.trace.json", (old, old))
    assert cli.main(["analyze", str(run)]) == 0
    assert "being written" not in capsys.readouterr().out


def test_cli_partial_flag_accepts_the_other_ranks_report(tmp_path, capsys):
    """--partial: the same session is reported from its complete rank and exits 0."""
    run = _two_ranks(tmp_path)
    assert cli.main(["analyze", str(run), "--partial", "--format", "json"]) == 0
    session = json.loads(capsys.readouterr().out)["sessions"][0]
    assert [e["host"] for e in session["errors"] if e.get("being_written")] == ["rank-1"]
    assert session["steps"]["count"] == 4
