"""The step breakdown: planted step layouts come back part by part, per device."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from synth import build_training_session
from synth_whatif import analysed

from tb_gpuadvisor.attribution.breakdown import compute_breakdown
from tb_gpuadvisor.model import intervals as iv
from tb_gpuadvisor.vocab.tensorflow import op_key
from tb_gpuadvisor.checks.context import Analysis
from tb_gpuadvisor.timeline import (
    Device, DeviceActivity, HostActivity, HostModel, MemoryRecords, SessionModel, Steps,
)
from tb_gpuadvisor.kinds import DeviceEventKind, HostEventKind

# Every category group: together they are the whole step.
GROUPS = ("compute", "collective", "copy", "not_traced", "input", "launch", "host")


def analyse(tmp_path: Path, **planted) -> tuple[Analysis, object]:
    session = build_training_session(**planted)
    return analysed(session, tmp_path), session.truth


def test_parts_add_up_and_match_planted_sizes(tmp_path: Path) -> None:
    analysis, truth = analyse(tmp_path, input_wait_frac=0.35, launch_frac=0.12, host_overhead_frac=0.08,
                              memcpy_frac=0.06, steps=6)
    dev = analysis.breakdown.primary
    assert dev.name == "/device:GPU:0"
    total = sum(dev.part(group) for group in GROUPS)
    assert np.array_equal(total, dev.duration)
    assert dev.percent("input") == pytest.approx(truth.percent("input_ms"), abs=0.5)
    assert dev.percent("host") + dev.percent("not_traced") == pytest.approx(truth.percent("other_ms"), abs=0.5)
    assert dev.percent("launch") == pytest.approx(truth.percent("launch_idle_ms", 0), abs=0.5)
    assert dev.percent("copy") == pytest.approx(truth.percent("copy_ms", 0), abs=0.5)
    assert dev.percent("compute") == pytest.approx(truth.percent("compute_ms", 0), abs=0.5)


def test_low_precision_and_collectives_per_gpu(tmp_path: Path) -> None:
    analysis, truth = analyse(tmp_path, gpus=2, cc=(8, 0), fp16_frac=0.45, tensor_core_frac=0.5,
                              collective_frac=0.1, gpu_compute_scale={0: 1.0, 1: 0.7}, steps=4)
    breakdown = analysis.breakdown
    assert [d.name for d in breakdown.devices] == ["/device:GPU:0", "/device:GPU:1"]
    for g, dev in enumerate(breakdown.devices):
        low_share = 100.0 * dev.total("compute_16bit") / dev.total("compute")
        planted = 100.0 * truth.mean("low_precision_ms", g) / truth.mean("compute_ms", g)
        assert low_share == pytest.approx(planted, abs=1.0)
        assert dev.percent("collective") == pytest.approx(truth.percent("collective_ms", g), abs=1.0)
    # The less loaded GPU waits longer inside the collective.
    assert breakdown.devices[1].total("collective") > breakdown.devices[0].total("collective")


def test_busy_set_is_the_busy_time_of_the_parts(tmp_path: Path) -> None:
    # The busy set is grown from the kept sets when asked: it must cover exactly the compute,
    # collective and copy time the per-step parts count, as one sorted disjoint set.
    analysis, _ = analyse(tmp_path, gpus=2, collective_frac=0.1, memcpy_frac=0.06, steps=4)
    dev = analysis.breakdown.primary
    starts, ends = dev.busy_set
    assert np.all(ends > starts) and np.all(starts[1:] > ends[:-1])
    assert dev.total("collective") > 0 and dev.total("copy") > 0
    assert iv.total(dev.busy_set) == int(dev.busy.sum())
    assert iv.total(iv.intersect(dev.busy_set, dev.sets["compute"])) == dev.total("compute")


def test_cpu_only_capture_uses_the_host_as_device(tmp_path: Path) -> None:
    analysis, truth = analyse(tmp_path, gpus=0, marker="r", input_wait_frac=0.27, steps=5)
    breakdown = analysis.breakdown
    assert breakdown.device_kind == "cpu"
    (dev,) = breakdown.devices
    assert dev.name == "/host:CPU"
    assert dev.percent("input") == pytest.approx(truth.percent("input_ms"), abs=1.0)
    assert dev.total("launch") == 0 and dev.total("copy") == 0
    assert dev.percent("compute") > 60


def test_json_shape(tmp_path: Path) -> None:
    analysis, truth = analyse(tmp_path, input_wait_frac=0.1, steps=3)
    out = analysis.breakdown.to_json()
    assert out["device"] == "/device:GPU:0"
    assert len(out["steps"]) == 3
    row = out["steps"][1]
    # One vocabulary: the categories' columns and nothing else (no sums under older names).
    assert set(row) == {"step", "start_ms", "duration_ms"} | {f"{c['key']}_ms" for c in out["categories"]}
    assert row["input_ms"] == pytest.approx(truth.steps[1].input_ms, abs=0.05)
    (per_device,) = out["per_device"]
    assert set(per_device) >= {"device", "host", "compute_ms", "collective_ms", "copy_ms", "idle_ms",
                               "busy_percent"}
    assert 0 < per_device["busy_percent"] <= 100


# --- Priority rules on a hand-made timeline (times in microseconds) ---------------------------

US = 1_000_000


def _host(events: list[tuple[str, HostEventKind, int, int, int]]) -> HostActivity:
    """(name, kind, start_us, dur_us, correlation_id) events on one thread."""
    names = sorted({e[0] for e in events})
    n = len(events)
    return HostActivity(
        host="h", start_ps=np.array([e[2] * US for e in events], np.int64),
        dur_ps=np.array([e[3] * US for e in events], np.int64), thread=np.zeros(n, np.int32),
        name=np.array([names.index(e[0]) for e in events], np.int32),
        kind=np.array([e[1] for e in events], np.int8), step_num=np.full(n, -1, np.int64),
        is_root=np.zeros(n, bool), group_id=np.full(n, -1, np.int64),
        correlation_id=np.array([e[4] for e in events], np.int64), names=names, threads=["main"],
        step=np.zeros(n, np.int32))


def _gpu(index: int, kernels: list[tuple[int, int, int, str]]) -> DeviceActivity:
    """(start_us, dur_us, correlation_id, op) kernels on one stream."""
    n = len(kernels)
    ops = sorted({k[3] for k in kernels})
    return DeviceActivity(
        device=Device(f"/device:GPU:{index}", "h", "gpu", index),
        start_ps=np.array([k[0] * US for k in kernels], np.int64),
        dur_ps=np.array([k[1] * US for k in kernels], np.int64),
        kind=np.full(n, DeviceEventKind.KERNEL, np.int8), stream=np.zeros(n, np.int32),
        name=np.zeros(n, np.int32), op=np.array([ops.index(k[3]) for k in kernels], np.int32),
        correlation_id=np.array([k[2] for k in kernels], np.int64), group_id=np.full(n, -1, np.int64),
        nbytes=np.zeros(n, np.int64), details=np.full(n, -1, np.int32), names=["volta_sgemm_128x64_nn"],
        ops=ops, streams=["Stream #1(Compute)"], detail_strings=[], step=np.zeros(n, np.int32))


def _model(activity: HostActivity, gpus: list[DeviceActivity]) -> SessionModel:
    empty_i = np.empty(0, np.int64)
    memory = MemoryRecords("h", empty_i, np.empty(0, np.int32), np.empty(0, bool), empty_i, empty_i, empty_i,
                           empty_i, empty_i, np.empty(0), np.empty(0, np.int32), [], [])
    steps = Steps("custom_loop", np.array([0]), np.array([0]), np.array([1000 * US]), np.array([-1]))
    return SessionModel("run", "s", [HostModel("h", "h.xplane.pb", activity, memory, gpus, 0)], steps,
                        "tensorflow")


def test_idle_priority_input_over_launch_over_other() -> None:
    # GPU busy [900, 1000); idle [0, 900).
    activity = _host([
        ("IteratorGetNextOp::DoCompute", HostEventKind.INPUT_WAIT, 0, 300, -1),
        ("cudaLaunchKernel", HostEventKind.LAUNCH, 200, 300, 7),     # 200-300 overlaps input: input wins
        ("python_callback", HostEventKind.OTHER, 400, 400, -1),      # 400-500 overlaps launch: launch wins
    ])
    model = _model(activity, [_gpu(0, [(900, 100, 7, "dense/MatMul:MatMul")])])
    dev = compute_breakdown(model).primary
    assert dev.parts["input"][0] == 300 * US
    assert dev.parts["launch"][0] == 200 * US
    assert dev.parts["other_host"][0] == 400 * US     # 500-800 under the callback, 800-900 with nothing at all
    assert dev.part("compute")[0] == 100 * US


def test_launches_count_only_for_the_gpu_they_launch_for() -> None:
    activity = _host([
        ("cudaLaunchKernel", HostEventKind.LAUNCH, 0, 100, 1),            # for GPU:0
        ("cudaLaunchKernel", HostEventKind.LAUNCH, 100, 100, 2),          # for GPU:1
        ("model/dense/MatMul:MatMul", HostEventKind.FRAMEWORK_OP, 200, 100, -1),  # dispatches GPU:1's op
    ])
    gpu0 = _gpu(0, [(900, 100, 1, "model/conv/Conv2D:Conv2D")])
    gpu1 = _gpu(1, [(900, 100, 2, "model/dense/MatMul:MatMul")])
    breakdown = compute_breakdown(_model(activity, [gpu0, gpu1]))
    assert breakdown.devices[0].parts["launch"][0] == 100 * US
    assert breakdown.devices[1].parts["launch"][0] == 200 * US


def test_op_key_links_host_and_device_op_names() -> None:
    assert op_key("model/dense/MatMul:MatMul") == "model/dense/MatMul"
    assert op_key("model/dense/MatMul:MatMul#shape=(float[8,8])#") == "model/dense/MatMul"
    assert op_key("model/dense/MatMul") == "model/dense/MatMul"
