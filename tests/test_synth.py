"""The synthetic capture builder plants what it claims, read back at the event level.

These checks parse the written bytes with our schema and measure the planted
quantities directly from events (interval unions, stats), independently of
the timeline model, so a model bug cannot hide behind a builder bug.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import pytest


import synth  # noqa: E402
from synth import PS_PER_MS, event_start_ps, iter_events  # noqa: E402
from tb_gpuadvisor.input.xplane.schema import XSpace  # noqa: E402


def _roundtrip(session: synth.SynthSession, tmp_path: Path) -> XSpace:
    folder = session.write(tmp_path, "run", "s1")
    return XSpace.FromString((folder / "synth-host.xplane.pb").read_bytes())


def _union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _overlap(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    total, i, j = 0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _gaps(busy: list[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    gaps, t = [], start
    for a, b in busy:
        if a > t:
            gaps.append((t, min(a, end)))
        t = max(t, b)
    if t < end:
        gaps.append((t, end))
    return [(a, b) for a, b in gaps if b > a]


def _device_busy(space: XSpace, gpu: int) -> list[tuple[int, int]]:
    return _union([(event_start_ps(line, e), event_start_ps(line, e) + e.duration_ps)
                   for _, line, e, _, _ in iter_events(space, f"/device:GPU:{gpu}", "Stream #")])


def _host_intervals(space: XSpace, names: set[str] | None = None,
                    with_stat: str | None = None) -> list[tuple[int, int]]:
    out = []
    for _, line, e, name, stats in iter_events(space, "/host:CPU"):
        if (names is None or name in names) and (with_stat is None or with_stat in stats):
            out.append((event_start_ps(line, e), event_start_ps(line, e) + e.duration_ps))
    return _union(out)


PLANTED = dict(steps=6, step_ms=20.0, gpus=4, marker="keras3", input_wait_frac=0.35,
               host_overhead_frac=0.06, launch_frac=0.08, gpu_compute_scale={0: 1.4},
               launch_skew_ms=1.5, kernel_us=120, fp16_frac=0.3, tensor_core_frac=0.25,
               host_ops_frac=0.2, memcpy_frac=0.05, h2d_bytes=8 << 20, d2h_bytes=2 << 20,
               allreduce_calls=3, peak_mem_frac=0.85, cc=(8, 0))


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> tuple[synth.SynthSession, XSpace]:
    session = synth.build_training_session(**PLANTED)
    return session, _roundtrip(session, tmp_path_factory.mktemp("planted"))


def test_planes_and_device_properties(planted):
    _, space = planted
    names = [p.name for p in space.planes]
    assert names[0] == "/host:CPU"
    assert [n for n in names if n.startswith("/device:GPU:")] == [f"/device:GPU:{g}" for g in range(4)]
    gpu = next(p for p in space.planes if p.name == "/device:GPU:2")
    stats = {gpu.stat_metadata[s.metadata_id].name: s for s in gpu.stats}
    assert stats["compute_cap_major"].int64_value == 8
    assert stats["core_count"].int64_value == 108
    assert stats["memory_size"].WhichOneof("value") == "uint64_value"
    assert stats["memory_bandwidth"].WhichOneof("value") == "uint64_value"


def test_step_markers_and_steps(planted):
    session, space = planted
    markers = [(stats, event_start_ps(line, e)) for _, line, e, name, stats
               in iter_events(space, "/host:CPU") if name == "Profiled batch"]
    assert [m[0]["step_num"] for m in markers] == list(range(6))
    starts = [m[1] for m in markers]
    assert starts == [s.start_ps for s in session.truth.steps]
    assert {b - a for a, b in zip(starts, starts[1:])} == {20 * PS_PER_MS}


def test_every_device_event_has_one_launch(planted):
    _, space = planted
    host = Counter(stats["correlation_id"] for _, _, _, _, stats
                   in iter_events(space, "/host:CPU") if "correlation_id" in stats)
    device = [(name, stats) for p, _, _, name, stats in iter_events(space)
              if p.name.startswith("/device:GPU:")]
    assert device and all(host[stats["correlation_id"]] == 1 for _, stats in device)
    assert len(host) == len(device)
    ref_kinds = {"level 0", "annotation", "kernel_details"}
    for plane in space.planes:
        if plane.name.startswith("/device:GPU:"):
            for line in plane.lines:
                for event in line.events[:5]:
                    kinds = {plane.stat_metadata[s.metadata_id].name: s.WhichOneof("value")
                             for s in event.stats}
                    assert kinds["correlation_id"] == "uint64_value"
                    assert all(kinds[k] == "ref_value" for k in ref_kinds & kinds.keys())
                    assert "level 0" in kinds


def test_input_wait_and_other_idle(planted):
    session, space = planted
    step_ps = 20 * PS_PER_MS
    waits = _host_intervals(space, {"IteratorGetNextOp::DoCompute"})
    assert len(waits) == 6
    launches = _host_intervals(space, with_stat="correlation_id")
    for gpu in range(4):
        busy = _device_busy(space, gpu)
        for step in session.truth.steps:
            idle = _gaps(busy, step.start_ps, step.start_ps + step_ps)
            input_idle = _overlap(idle, waits)
            assert input_idle == pytest.approx(0.35 * step_ps, rel=1e-6)
            # Before the device window the GPU idles with no launch running.
            pre = [(step.start_ps, step.start_ps + round(0.06 * step_ps))]
            assert _overlap(pre, launches) == 0 and _overlap(pre, busy) == 0
            assert step.other_ms == pytest.approx(1.2)


def test_launch_gaps_and_skew(planted):
    session, space = planted
    step_ps = 20 * PS_PER_MS
    launches = _host_intervals(space, with_stat="correlation_id")
    for gpu in range(4):
        busy = _device_busy(space, gpu)
        expected = 0.08 * 20 + (1.5 if gpu else 0.0)
        for step in session.truth.steps:
            idle = _gaps(busy, step.start_ps, step.start_ps + step_ps)
            assert _overlap(idle, launches) / PS_PER_MS == pytest.approx(expected, abs=1e-6)
    # Keras 3 captures carry no group_id: step 0's first device event is the earliest.
    first = {g: min(event_start_ps(line, e) for _, line, e, _, _ in
                    iter_events(space, f"/device:GPU:{g}", "Stream #")) for g in range(4)}
    truth = session.truth.steps[0].gpus
    skew = (first[1] - first[0]) / PS_PER_MS
    assert skew == pytest.approx(truth[1].first_op_start_ms - truth[0].first_op_start_ms, abs=1e-9)
    # Per-op launch gaps differ a little between GPUs with different kernel counts.
    assert skew == pytest.approx(1.5, abs=0.02)


def test_compute_precision_and_tensor_cores(planted):
    session, space = planted
    per_gpu = defaultdict(Counter)
    for plane, _, e, name, stats in iter_events(space):
        if not plane.name.startswith("/device:GPU:") or "Memcpy" in name:
            continue
        c = per_gpu[plane.name]
        if name.startswith("nccl"):
            c["collective"] += e.duration_ps
            c["calls"] += 1
            continue
        c["compute"] += e.duration_ps
        if "fp16" in name or "Eigen::half" in name or "f16f16" in name:
            c["low"] += e.duration_ps
        if any(tag in name for tag in ("s16816", "s1688", "s884", "xmma")):
            c["tc"] += e.duration_ps
        op_type = stats["level 0"].rsplit(":", 1)[1]
        if op_type in ("MatMul", "Conv2D"):
            c["eligible"] += e.duration_ps
    steps = 6
    c0, c1 = per_gpu["/device:GPU:0"], per_gpu["/device:GPU:1"]
    assert c0["compute"] / c1["compute"] == pytest.approx(1.4, rel=1e-3)
    assert c0["low"] / c0["compute"] == pytest.approx(0.3, abs=0.005)
    assert c0["tc"] / c0["compute"] == pytest.approx(0.25, abs=0.005)
    assert c0["eligible"] / c0["compute"] == pytest.approx(0.6, abs=0.005)
    assert c0["calls"] == 3 * steps
    # The slowest GPU (GPU:1..3 are late by the skew) spends collective_frac in NCCL.
    assert c1["collective"] / steps / PS_PER_MS == pytest.approx(session.truth.mean(
        "collective_ms", 1), rel=1e-6)
    truth0 = session.truth.mean("compute_ms", 0)
    assert c0["compute"] / steps / PS_PER_MS == pytest.approx(truth0, rel=1e-6)


def test_copies_host_ops_and_memory(planted):
    session, space = planted
    copies = defaultdict(list)
    for plane, _, e, name, stats in iter_events(space):
        if plane.name == "/device:GPU:0" and name.startswith("Memcpy"):
            copies[name].append((e.duration_ps, stats["memcpy_details"]))
    assert {d for _, d in copies["MemcpyH2D"]} == {"size:8388608 dest:0 async:1"}
    assert {d for _, d in copies["MemcpyD2H"]} == {"size:2097152 dest:0 async:1"}
    copy_ps = sum(d for v in copies.values() for d, _ in v) / 6
    assert copy_ps / PS_PER_MS == pytest.approx(0.05 * 20, abs=1e-6)
    # Copies never overlap a kernel on the same GPU.
    kernels, copy_iv = [], []
    for _, line, e, name, _ in iter_events(space, "/device:GPU:0", "Stream #"):
        iv = (event_start_ps(line, e), event_start_ps(line, e) + e.duration_ps)
        (copy_iv if name.startswith("Memcpy") else kernels).append(iv)
    assert _overlap(_union(copy_iv), _union(kernels)) == 0
    # Host ops: name:Type events on host threads that launch nothing.
    host_op = 0
    for plane, line, e, name, stats in iter_events(space, "/host:CPU"):
        if ":" in name and "/" in name and "correlation_id" not in stats:
            host_op += e.duration_ps
    device_compute = session.truth.mean("compute_ms", 0) * 6 * PS_PER_MS
    launched_op = sum(1 for _, _, _, name, _ in iter_events(space, "/host:CPU")
                      if name.startswith("sequential/") and not name.startswith("sequential/host_"))
    host_only = sum(e.duration_ps for _, _, e, name, _ in iter_events(space, "/host:CPU")
                    if name.startswith("sequential/host_"))
    assert launched_op > 0
    assert host_only / (host_only + device_compute) == pytest.approx(0.2, abs=1e-6)
    assert host_op >= host_only
    # Memory: peak as planted, allocator per GPU, stat kinds as TF writes them.
    peaks = {(stats["allocator_name"], stats["peak_bytes_in_use"])
             for _, _, _, name, stats in iter_events(space, "/host:CPU")
             if name == "MemoryAllocation"}
    size = synth.GPU_PRESETS[(8, 0)].memory_size
    assert peaks == {(f"GPU_{g}_bfc", round(0.85 * size)) for g in range(4)}
    assert session.truth.peak_bytes[0] == round(0.85 * size)


@pytest.mark.parametrize("marker,event,stat", [
    ("keras2", "TraceContext", "step_num"),
    ("r", "train", "_r"),
    ("keras3", "Profiled batch", "step_num"),
])
def test_marker_styles(tmp_path, marker, event, stat):
    space = _roundtrip(synth.build_training_session(steps=4, marker=marker,
                                                    input_wait_frac=0.1), tmp_path)
    found = [stats for _, _, _, name, stats in iter_events(space, "/host:CPU") if name == event]
    assert len(found) == 4 and all(stat in s for s in found)
    if marker == "r":
        assert all(s["_r"] == 1 and "step_num" in s for s in found)
        main = [line.name for _, line, _, name, _ in iter_events(space, "/host:CPU")
                if name == "IteratorGetNextOp::DoCompute"]
        assert set(main) == {"python"}
    has_group = any("group_id" in s for *_, s in iter_events(space, "/device:GPU:0"))
    assert has_group == (marker != "keras3")


def test_steps_line_and_fallback(tmp_path):
    space = _roundtrip(synth.build_training_session(steps=5, marker="steps_line"), tmp_path)
    gpu = next(p for p in space.planes if p.name == "/device:GPU:0")
    steps = next(line for line in gpu.lines if line.name == "Steps")
    assert steps.id == synth.STEPS_LINE_ID and len(steps.events) == 5
    assert {line.id for line in gpu.lines} >= {synth.TF_OPS_LINE_ID, synth.TF_NAME_SCOPE_LINE_ID}
    names = {name for *_, name, _ in iter_events(space, "/host:CPU")}
    assert "TraceContext" not in names and "Profiled batch" not in names

    none = synth.build_training_session(steps=5, marker="none").space
    runs = [name for *_, name, _ in iter_events(none, "/host:CPU")
            if name.startswith("EagerLocalExecute: __inference_train_function_")]
    assert len(runs) == 5 and len(set(runs)) == 1
    assert not any(line.name == "Steps" for p in none.planes for line in p.lines)


def test_cupti_plane_launches(tmp_path):
    space = _roundtrip(synth.build_training_session(
        steps=3, gpus=2, launch_api="cuLaunchKernel", cupti_plane=True), tmp_path)
    cupti = next(p for p in space.planes if p.name == "/host:CUPTI")
    host = next(p for p in space.planes if p.name == "/host:CPU")
    assert {line.id for line in cupti.lines} <= {line.id for line in host.lines}
    apis = Counter(name for *_, name, _ in iter_events(space, "/host:CUPTI"))
    assert set(apis) == {"cuLaunchKernel"}
    kernels = sum(1 for p, line, _, _, _ in iter_events(space)
                  if p.name.startswith("/device:GPU:") and line.name.startswith("Stream #"))
    assert apis["cuLaunchKernel"] == kernels


def test_jax_on_nvidia_shape(tmp_path):
    session = synth.build_training_session(steps=4, gpus=2, framework="jax", marker="none",
                                           bf16_frac=0.5, cc=(9, 0), launch_frac=0.1)
    space = _roundtrip(session, tmp_path)
    lines = {line.name.split("/")[0] for p in space.planes if p.name == "/host:CPU"
             for line in p.lines}
    assert lines == {"python", "py_xla_execute"}
    modules = [name for *_, name, _ in iter_events(space, "/host:CPU")
               if name == "jit_train_step:XLA GPU module"]
    assert len(modules) == 4 * 2
    device = [(name, stats) for p, _, _, name, stats in iter_events(space)
              if p.name.startswith("/device:GPU:")]
    assert all(s["hlo_module"] == "jit_train_step" and "hlo_op" in s for _, s in device)
    assert not any(":" in s["hlo_op"] for _, s in device)
    assert any(name.startswith("fusion.") for name, _ in device)
    assert any(name.startswith("ncclDevKernel_AllReduce") for name, _ in device)
    assert not any("level 0" in s for _, s in device)


def test_cpu_only_capture():
    session = synth.build_training_session(steps=3, gpus=0, input_wait_frac=0.25)
    assert [p.name for p in session.space.planes] == ["/host:CPU"]
    assert session.truth.mean("input_ms") == pytest.approx(5.0)


def test_warmup_step_is_longer():
    truth = synth.build_training_session(steps=4, first_step_factor=3.0).truth
    assert [s.duration_ms for s in truth.steps] == [60.0, 20.0, 20.0, 20.0]


def test_impossible_plans_are_refused():
    with pytest.raises(ValueError):
        synth.build_training_session(input_wait_frac=0.6, launch_frac=0.5)
    with pytest.raises(ValueError):
        synth.build_training_session(tensor_core_frac=0.8, eligible_frac=0.5)
    with pytest.raises(ValueError):
        synth.build_training_session(bf16_frac=0.5, cc=(7, 0))
    with pytest.raises(ValueError):
        synth.build_training_session(marker="epochs")


def test_bad_inputs(tmp_path):
    good = synth.build_training_session(steps=2).space.SerializeToString()
    for kind in ("truncated", "empty", "garbage"):
        path = synth.write_bad_session(tmp_path, "bad", kind, kind, source=good)
        data = path.read_bytes()
        assert path.name == "bad-host.xplane.pb"
        if kind == "empty":
            assert data == b""
        else:
            with pytest.raises(Exception):
                XSpace.FromString(data)


def test_make_capture_parses(tmp_path):
    import make_capture

    info = make_capture.make_capture(tmp_path, 5, gpus=2)
    assert info.path == tmp_path / "run" / "plugins" / "profile" / info.path.parent.name / "bench-host.xplane.pb"
    assert 4.0e6 < info.bytes < 6.0e6
    space = XSpace.FromString(info.path.read_bytes())
    assert sum(len(line.events) for p in space.planes for line in p.lines) == info.events
    kernels = [(name, stats) for p, line, _, name, stats in iter_events(space)
               if p.name.startswith("/device:GPU:") and line.name.startswith("Stream #")
               and "Memcpy" not in line.name]
    assert len(kernels) == info.kernel_events
    host_corr = Counter(s["correlation_id"] for *_, s in iter_events(space, "/host:CPU")
                        if "correlation_id" in s)
    assert all(host_corr[s["correlation_id"]] == 1 for _, s in kernels)
    steps = [s["step_num"] for *_, name, s in iter_events(space, "/host:CPU") if name == "train"]
    assert steps == list(range(128, 128 + info.steps))
    step_line = [e for p in space.planes if p.name == "/device:GPU:0"
                 for line in p.lines if line.name == "Steps" for e in line.events]
    assert len(step_line) == info.steps
    assert min(line.timestamp_ns for p in space.planes for line in p.lines) > 0
