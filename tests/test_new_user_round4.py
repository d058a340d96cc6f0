"""What a new user tripped on, round four (issue 44): the fix-first on CPU runs, fixes that must run
as pasted, the all-hosts view of DDP ranks, compare's default base, unreadable captures."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import statistics
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from synth_kineto import kineto_trace, write_trace

from tb_gpuadvisor.compare import compare_sessions, render_comparison_text
from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.multihost import analyze_session, build_report
from tb_gpuadvisor.render import render_text

REPO = Path(__file__).resolve().parent.parent
# The host events of a GPU launch: a trace without them is of a model that never touched a GPU.
_LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")


def _cpu_trace(path: Path, lists_gpu: bool) -> dict:
    """A PyTorch run on the CPU whose DataLoader makes each step wait 3 ms (kineto_trace's input
    wait) beside 2 ms of ops; LISTS_GPU keeps the deviceProperties entry a machine with a GPU writes
    (the process saw a GPU and never used it)."""
    trace = kineto_trace(device=False, input_us=3000, kernel_us=100)
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("cat") not in _LAUNCH_CATEGORIES]
    if not lists_gpu:
        del trace["deviceProperties"]
    write_trace(path / "run" / "w.1.pt.trace.json", trace)
    (session,) = build_report(find_sessions(str(path)))["sessions"]
    return session


def test_no_gpu_at_all_is_context_and_the_input_wait_is_the_first_fix(tmp_path):
    """No GPU listed: "No GPU" is an info finding (as in TensorFlow and JAX reports) and the 3 ms
    input wait of each 5.2 ms step is ranked and named first; the text says how to check for a GPU
    without a fix that only -v prints."""
    session = _cpu_trace(tmp_path, lists_gpu=False)
    assert session["trust"]["model_ran_on"] == "cpu_only"
    first = session["findings"][0]
    assert first["check"] == "input_bound" and first["severity"] == "critical"
    assert session["first_fix"]["check"] == "input_bound"
    no_gpu = next(f for f in session["findings"] if f["title"].startswith("No GPU"))
    assert no_gpu["severity"] == "info" and "leads" not in no_gpu["metrics"]
    assert "torch.cuda.is_available()" in no_gpu["summary"] and "fix below" not in no_gpu["summary"]
    assert "torch.device('cuda')" in no_gpu["fixes"][0]["code"]
    assert "fix below" not in render_text({"sessions": [session]}, width=100)


def test_a_listed_gpu_that_got_no_work_is_the_first_fix(tmp_path):
    """deviceProperties lists an A100 and no event ran on it: moving the model there comes first,
    before the input wait that saves more, said in PyTorch's words with PyTorch's check."""
    session = _cpu_trace(tmp_path, lists_gpu=True)
    assert session["trust"]["model_ran_on"] == "host_despite_gpu"
    first = session["findings"][0]
    assert first["check"] == "op_placement" and first["severity"] == "critical"
    assert "PyTorch saw the GPU" in first["summary"] and "TensorFlow" not in first["summary"]
    assert "torch.cuda.is_available()" in first["fixes"][0]["code"]
    assert session["first_fix"]["check"] == "op_placement"
    assert "before the findings that save more" in session["first_fix"]["why"]
    waits = next(f for f in session["findings"] if f["check"] == "input_bound")
    assert waits["estimated_savings_ms_per_step"] > first["estimated_savings_ms_per_step"]


def _input_fixes(session: dict) -> list[str]:
    return [fix["code"] for fix in next(f for f in session["findings"] if f["check"] == "input_bound")["fixes"]]


def test_a_batch_cheaper_than_a_worker_hand_off_is_told_to_index_whole_batches(tmp_path):
    """0.2 ms of DataLoader wait per step (an in-memory TensorDataset's indexing and collate) is less
    than a worker's hand-off of a batch (vocab.pytorch.WORKER_HANDOFF_MS): workers are not the fix,
    one indexing call per batch is. 3 ms of wait per step (the test above) still gets workers."""
    trace = kineto_trace(device=False, input_us=200, kernel_us=100)
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("cat") not in _LAUNCH_CATEGORIES]
    del trace["deviceProperties"]
    write_trace(tmp_path / "run" / "w.1.pt.trace.json", trace)
    (session,) = build_report(find_sessions(str(tmp_path)))["sessions"]
    codes = _input_fixes(session)
    assert any("BatchSampler" in code for code in codes)
    assert not any("num_workers" in code for code in codes)
    slow = _cpu_trace(tmp_path / "slow", lists_gpu=False)
    assert any("num_workers=workers" in code for code in _input_fixes(slow))


def test_a_multi_rank_runs_dataloader_fix_keeps_the_distributed_sampler(tmp_path):
    """Two ranks' traces of one session, each waiting 3 ms per step on its DataLoader: the loader the
    fix builds takes a DistributedSampler, not shuffle=True over the whole dataset."""
    for rank in (0, 1):
        trace = kineto_trace(device=False, input_us=3000, kernel_us=100)
        trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("cat") not in _LAUNCH_CATEGORIES]
        del trace["deviceProperties"]
        write_trace(tmp_path / "run" / f"rank{rank}.1.pt.trace.json", trace)
    (session,) = build_report(find_sessions(str(tmp_path)))["sessions"]
    assert len(session["hosts"]) == 2
    codes = [code for code in _input_fixes(session) if "DataLoader(" in code]
    assert codes and all("DistributedSampler(" in code and "shuffle=True" not in code for code in codes)


def test_compare_of_cpu_only_runs_names_no_gpu(tmp_path):
    """Two CPU-only runs (0.2 ms, then 3 ms of input wait per step): the parts of the step compared
    are the CPU's compute and the time no op ran (what grew), never "GPU idle" or kernels."""
    slow = _cpu_trace(tmp_path / "slow", lists_gpu=False)
    trace = kineto_trace(device=False, input_us=200, kernel_us=100)
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("cat") not in _LAUNCH_CATEGORIES]
    del trace["deviceProperties"]
    write_trace(tmp_path / "fast" / "run" / "w.1.pt.trace.json", trace)
    (fast,) = build_report(find_sessions(str(tmp_path / "fast")))["sessions"]
    comparison = compare_sessions(fast, slow)
    text = render_comparison_text(comparison)
    parts = {row["part"] for row in comparison["device_time"]}
    assert {"CPU compute", "no op running"} <= parts and not any("GPU" in p or "kernel" in p for p in parts)
    assert "no op running" in text and "GPU" not in text


def test_an_unreadable_pytorch_capture_says_so_and_nothing_else(tmp_path):
    """A .pt.trace.json of random bytes: the report is PyTorch's (the file format says so), says
    nothing was read and where the model ran is unknown, with no CPU-only sentence, no "other hosts",
    and no TensorFlow step-marker fix."""
    path = tmp_path / "run" / "w.1.pt.trace.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(bytes(range(256)) * 8)
    (session,) = build_report(find_sessions(str(tmp_path)))["sessions"]
    assert session["framework"] == "pytorch"
    quality = next(f for f in session["findings"] if f["check"] == "profile_quality")
    assert quality["metrics"]["model_ran_on"] == "unknown" and quality["metrics"]["capture_kind"] == "unknown"
    assert "CPU" not in quality["summary"] and "other hosts" not in quality["summary"]
    assert "No host file could be read" in quality["summary"]
    codes = " ".join(fix["code"] for f in session["findings"] for fix in f["fixes"])
    assert "tf." not in codes and "StepTraceAnnotation" not in codes


def test_random_bytes_named_gz_are_not_gzip(tmp_path):
    path = tmp_path / "run" / "w.1.pt.trace.json.gz"
    path.parent.mkdir(parents=True)
    path.write_bytes(bytes(range(3, 256)) * 8)
    (session,) = build_report(find_sessions(str(tmp_path)))["sessions"]
    (error,) = session["errors"]
    assert "is named .gz but is not gzip" in error["message"] and "utf-8" not in error["message"]


def test_stopping_the_demo_server_by_its_pid_stops_tensorboard(tmp_path):
    """kill PID on `python -m demo.serve` (SIGTERM) reaches its TensorBoard child: the port is free
    again once the parent has exited."""
    pytest.importorskip("tensorboard")
    from demo.serve import port_taken

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "demo.serve", "--logdir", str(tmp_path), "--host", "127.0.0.1",
                               "--port", str(port)], cwd=REPO, stderr=subprocess.DEVNULL,
                              start_new_session=True)     # its own group: whatever is left is stopped below
    try:
        deadline = time.monotonic() + 120
        while port_taken("127.0.0.1", port) is None:
            assert server.poll() is None and time.monotonic() < deadline, "TensorBoard did not start"
            time.sleep(0.5)
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
        assert port_taken("127.0.0.1", port) is None
    finally:
        try:
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server.wait()


def test_the_jax_helpers_summary_names_step_trace_annotation():
    """The end-of-training summary of a JAX loop names its markers as the CLI and the tab do."""
    from tb_gpuadvisor import inloop

    steps = {"count": 5, "source": "custom_loop", "mean_ms": 2.0}
    report = {"sessions": [{"framework": "jax", "steps": steps, "findings": [], "errors": []}]}
    line = inloop.summary_line(report, None, "/logs/s")
    assert "StepTraceAnnotation markers" in line and "custom_loop" not in line
    assert "custom_loop" not in inloop.advice_text(report, None, "/logs/s", "/logs")


def test_analyze_and_compare_help_name_pytorch_traces(capsys):
    from tb_gpuadvisor.cli import main

    for command in ("analyze", "compare"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert ".pt.trace.json" in capsys.readouterr().out


# Runs of tests/ddp_loop.py made before the tests give up on a machine too loaded to show what it plants.
DDP_RUNS = 4


def _per_step_ms(trace: Path) -> tuple[list[float], list[float]]:
    """Per ProfilerStep#N window of one rank's raw trace JSON (ms from the trace's clock): when its first
    gloo:all_reduce starts, and the gap on the step's thread from the DataLoader's batch to DDP's forward."""
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    named = lambda prefix: sorted((e["ts"], e["ts"] + e["dur"], e["tid"]) for e in events  # noqa: E731
                                  if e["name"].startswith(prefix))
    calls, batches, forwards = named("gloo:all_reduce"), named("enumerate(DataLoader)"), named("DistributedDataParallel.forward")
    arrivals, gaps = [], []
    for lo, hi, tid in named("ProfilerStep#"):
        arrivals.append(next(start for start, _, _ in calls if lo <= start < hi) / 1000)
        batch = next(end for start, end, t in batches if lo <= start < hi and t == tid)
        gaps.append((next(start for start, _, t in forwards if batch <= start < hi and t == tid) - batch) / 1000)
    return arrivals, gaps


def _rank_gaps(logdir: Path) -> tuple[list[float], list[float]]:
    """Per step of a ddp_loop run: how long after rank 1 rank 0 reached the all-reduce, and rank 0's
    sleep (ms, from the raw trace JSON)."""
    (one, _), (zero, sleeps) = (_per_step_ms(next((logdir / "ddp").glob(f"rank{r}.*.json"))) for r in (1, 0))
    return [late - early for late, early in zip(zero, one)], sleeps


@pytest.fixture(scope="module")
def ddp_logdir(tmp_path_factory) -> Path:
    """tests/ddp_loop.py: 2 CPU ranks (gloo), rank 0 sleeping 20 ms a step before its forward pass. A
    run in which rank 0 did not reach some step's all-reduce at least half its sleep after rank 1
    (other work on a shared 2-core machine stalled rank 1 for as long: it happened in about one run
    in six while others' tests loaded the machine) does not hold what the tests judge, and is made
    again, at most DDP_RUNS times."""
    pytest.importorskip("torch")
    logdir = tmp_path_factory.mktemp("ddp")
    for _ in range(DDP_RUNS):
        shutil.rmtree(logdir / "ddp", ignore_errors=True)
        done = subprocess.run([sys.executable, str(REPO / "tests" / "ddp_loop.py"), str(logdir / "ddp")],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        gaps, sleeps = _rank_gaps(logdir)
        if all(gap >= sleep / 2 for gap, sleep in zip(gaps, sleeps)):
            return logdir
    pytest.skip(f"in {DDP_RUNS} runs other work on this machine stalled rank 1 as long as rank 0's sleep")


def _views(logdir: Path) -> dict[str, dict]:
    """The session as the tab shows it: all hosts, and each rank alone."""
    (ref,) = find_sessions(str(logdir))
    views = {"all": analyze_session(ref)}
    views.update({host: analyze_session(dataclasses.replace(ref, hosts=(host,))) for host in ref.hosts})
    return views


def test_ddp_rank_views_and_the_all_hosts_header_agree(ddp_logdir):
    """Rank 1 reaches each gradient all-reduce about 20 ms before rank 0 (rank 0's sleep) and waits in
    gloo:all_reduce (hand check on the raw trace of one run: its 4 gloo:all_reduce annotations lie
    24.4, 20.6, 22.5 and 21.9 ms inside its steps, rank 0's 1.9 to 5.1 ms). That wait is the rank's
    collective time, not host overhead: in its median step host overhead is a fraction of a
    millisecond (0.53 to 0.60 ms in that run), and no finding names gloo. Rank 0's sleep is its host
    overhead (20.7 ms a step). The median step, since on a loaded machine one step of a rank can hold
    a long stall of its own. The all-hosts view's header step and the text under it give the same mean."""
    views = _views(ddp_logdir)
    rank1 = views["rank1"]
    part = rank1["breakdown"]["per_device"][0]
    assert part["collective_transfer_ms"] + part["collective_wait_ms"] > 2.5
    median_overhead = lambda view: statistics.median(s["other_host_ms"] for s in view["breakdown"]["steps"])  # noqa: E731
    assert median_overhead(rank1) < 2.5
    assert not any("gloo" in e["name"] for f in rank1["findings"] for e in f["evidence"])
    assert median_overhead(views["rank0"]) > 10.0
    every = views["all"]
    mean = every["steps"]["mean_ms"]
    overhead = next(f for f in every["findings"] if f["check"] == "host_overhead")
    said = re.search(r"of a ([\d.]+) ms step", overhead["summary"])
    other = re.search(r"These numbers are (\w+)'s", overhead["summary"])
    if other is None or other.group(1) == every["hosts"][0]:     # the primary's numbers, not another rank's
        assert said and abs(float(said.group(1)) - mean) <= 0.006      # the header's mean, as the text rounds it
    first, what_if = every["first_fix"], every.get("what_if")
    if first is not None and "largest estimated saving" in first["why"]:     # the machine's load decides
        saving = next(f for f in every["findings"] if f["check"] == first["check"])["estimated_savings_ms_per_step"]
        told = re.search(r"([\d.]+) ms per step \((\d+)% of the mean step\)", first["why"])
        assert told and abs(float(told.group(1)) - saving) <= 0.006    # the finding's saving, as the text rounds it
        assert abs(int(told.group(2)) - 100 * saving / mean) <= 0.51
    if what_if is not None:
        assert what_if["step_ms"] == pytest.approx(mean, abs=0.002)


def test_ddp_all_hosts_saving_is_the_waiting_the_straggler_fix_gives_back(ddp_logdir):
    """Hand check from the raw trace JSON (both ranks ran on one machine, one clock), per
    ProfilerStep#N window: when each rank's first gloo:all_reduce starts (it arrives), and on rank 0
    the gap on the step's thread from the DataLoader's batch to DistributedDataParallel.forward (its
    sleep; about 0.03 ms on rank 1). Rank 1 arrives first and waits in the all-reduce until rank 0
    arrives. Rank 0's host overhead fixed lets it arrive earlier by at least its sleep, and gives rank 1
    back its wait up to that: per step at least min(arrival gap, sleep), at most the arrival gap.
    In one run (others' tests loading the 2 cores) the gaps were 21.86, 19.53, 21.85 and 21.20 ms with
    sleeps of 20.13 to 20.14 ms: 19.98 to 21.11 ms per step; the all-hosts view said 19.94 (it measures
    the waiting as rank 1's all-reduce time with no op alongside beyond rank 0's; rank 0's own fix is
    20.7 ms, its sleep and smaller gaps). The rule before, the least any host gains alone, said rank 1's
    own 0.57. With the 5 ms sleep the run had before, quiet: gaps 3.38 to 5.48 ms, sleeps 5.13 to
    5.26, bounds 4.66 to 4.77, the view 4.91, the rule before 0.84. gloo's threads stall under load
    (a gap once 7.5 ms against the 5 ms sleep): the bounds have 20% and 15% of slack for that.
    Whichever rank is the primary, the saving is the same and, most of the step, critical."""
    gaps, sleeps = _rank_gaps(ddp_logdir)
    assert len(gaps) == 4 and min(sleeps) > 19
    least, most = sum(map(min, gaps, sleeps)) / 4, sum(gaps) / 4
    (ref,) = find_sessions(str(ddp_logdir))
    for hosts in (ref.hosts, ref.hosts[::-1]):
        session = analyze_session(dataclasses.replace(ref, hosts=hosts))
        overhead = next(f for f in session["findings"] if f["check"] == "host_overhead")
        saving = overhead["estimated_savings_ms_per_step"]
        assert 0.8 * least <= saving <= 1.15 * most, (hosts, least, most)
        assert overhead["severity"] == "critical"
        if hosts[0] == "rank1":        # told with rank 0's numbers, whose sleep rank 1 waits for
            told = re.search(r"These numbers are rank0's; the saving shown, ([\d.]+) ms per step", overhead["summary"])
            assert told and abs(float(told.group(1)) - saving) <= 0.006     # as the text rounds it


def test_one_ranks_trace_of_collectives_keeps_the_distributed_sampler(tmp_path):
    """One rank's trace alone (the tab's view of one host) is of a multi-rank run when it records a
    collective between ranks (here a gloo:all_reduce after each step's ops)."""
    trace = kineto_trace(device=False, input_us=3000, kernel_us=100)
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("cat") not in _LAUNCH_CATEGORIES]
    del trace["deviceProperties"]
    steps = [e for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")]
    trace["traceEvents"] += [{"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1, "tid": 99,
                              "ts": s["ts"] + s["dur"] - 50, "dur": 40} for s in steps]
    write_trace(tmp_path / "run" / "rank1.1.pt.trace.json", trace)
    (session,) = build_report(find_sessions(str(tmp_path)))["sessions"]
    codes = [code for code in _input_fixes(session) if "DataLoader(" in code]
    assert codes and all("DistributedSampler(" in code and "shuffle=True" not in code for code in codes)
