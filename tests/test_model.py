"""The timeline model: devices, device/host activity, steps and their sources."""

from __future__ import annotations

import numpy as np
import pytest
from synth import build_training_session, write_session

from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.timeline import PS_PER_MS
from tb_gpuadvisor.pipeline import load_session
from tb_gpuadvisor.kinds import DeviceEventKind, HostEventKind
from tb_gpuadvisor.input.xplane.build import read_host
from tb_gpuadvisor.input.files import CaptureError


def _load(tmp_path, synth, hosts=("h",)):
    write_session(tmp_path, "run", "s", {h: synth.space for h in hosts})
    (ref,) = find_sessions(str(tmp_path))
    return load_session(ref)


@pytest.mark.parametrize("marker,derived,source", [
    ("keras3", False, "keras"), ("keras2", True, "steps_line"), ("keras2", False, "keras2"),
    ("r", False, "custom_loop"), ("r", True, "steps_line"), ("steps_line", True, "steps_line"),
    ("none", False, "inferred"),
])
def test_every_marker_style_finds_every_step(tmp_path, marker, derived, source):
    synth = build_training_session(steps=7, step_ms=12.0, marker=marker, derived_lines=derived)
    model = _load(tmp_path, synth)
    assert model.steps.source == source
    assert len(model.steps) == 7
    planted = np.array([s.duration_ms for s in synth.truth.steps])
    measured = model.steps.duration_ps / PS_PER_MS
    # Periods run marker start to marker start; only the last one is bounded by its activity.
    assert np.allclose(measured[:-1], planted[:-1], rtol=0.02)


def test_markers_win_over_inference_and_keras2_without_steps_line(tmp_path):
    synth = build_training_session(steps=4, marker="keras2", derived_lines=False)
    model = _load(tmp_path, synth)
    assert (model.steps.source, len(model.steps), model.steps.marker_name) == ("keras2", 4, "TraceContext")


def test_devices_and_properties(tmp_path):
    synth = build_training_session(steps=3, gpus=4, cc=(8, 0))
    model = _load(tmp_path, synth)
    assert [d.device.name for d in model.gpus] == [f"/device:GPU:{i}" for i in range(4)]
    dev = model.gpus[0].device
    assert dev.compute_capability == "8.0" and dev.sm_count and dev.memory_bytes
    assert len(model.active_gpus) == 4


def test_device_activity_kinds_bytes_ops_and_correlation(tmp_path):
    synth = build_training_session(steps=3, gpus=2, memcpy_frac=0.1, h2d_bytes=3 << 20)
    model = _load(tmp_path, synth)
    gpu = model.gpus[0]
    h2d = gpu.kind == DeviceEventKind.MEMCPY_H2D
    assert h2d.any() and set(gpu.nbytes[h2d].tolist()) == {3 << 20}
    assert (gpu.kind == DeviceEventKind.COLLECTIVE).any()
    kernels = gpu.kind == DeviceEventKind.KERNEL
    assert (gpu.op[kernels] >= 0).all()
    assert all(":" in gpu.ops[i] for i in np.unique(gpu.op[kernels]))
    host = model.hosts[0].activity
    launch_ids = set(host.correlation_id[host.kind == HostEventKind.LAUNCH].tolist())
    assert set(gpu.correlation_id.tolist()) <= launch_ids
    assert (gpu.step >= 0).all()


def test_cupti_plane_launches_are_host_activity(tmp_path):
    synth = build_training_session(steps=3, launch_api="cuLaunchKernel", cupti_plane=True, marker="keras3")
    model = _load(tmp_path, synth)
    host = model.hosts[0].activity
    launch_names = {host.names[i] for i in np.unique(host.name[host.kind == HostEventKind.LAUNCH])}
    assert "cuLaunchKernel" in launch_names


def test_host_planes_built_apart_merge_into_one_time_ordered_table(tmp_path):
    """Each host plane's table is built in its own worker from its own origin; the host's table
    is their rows in time order (ties in plane order, then line order), with one list of names,
    threads and ids: the same rows, read here straight from the synthetic XSpace's two planes."""
    synth = build_training_session(steps=3, launch_api="cuLaunchKernel", cupti_plane=True, marker="r",
                                   memcpy_frac=0.05)
    expected = []
    for plane in synth.space.planes:
        if plane.name not in ("/host:CPU", "/host:CUPTI"):
            continue
        prefix = "" if plane.name == "/host:CPU" else "CUPTI/"
        names = {mid: meta.name for mid, meta in plane.event_metadata.items()}
        stat_ids = {meta.name: sid for sid, meta in plane.stat_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                corr = next((s.int64_value or s.uint64_value for s in event.stats
                             if s.metadata_id == stat_ids.get("correlation_id")), -1)
                expected.append((line.timestamp_ns * 1000 + event.offset_ps, names[event.metadata_id],
                                 prefix + (line.display_name or line.name), corr))
    expected.sort(key=lambda row: row[0])       # stable: plane order, then line order, on ties
    activity = _load(tmp_path, synth).hosts[0].activity
    got = [(int(s), activity.names[n], activity.threads[t], int(c))
           for s, n, t, c in zip(activity.start_ps, activity.name, activity.thread, activity.correlation_id)]
    assert any(t.startswith("CUPTI/") for _, _, t, _ in got) and any(c >= 0 for *_, c in got)
    assert any(not t.startswith("CUPTI/") for _, _, t, _ in got)
    assert got == [(s - expected[0][0] + got[0][0], n, t, c) for s, n, t, c in expected]


def test_input_wait_is_classified(tmp_path):
    synth = build_training_session(steps=5, input_wait_frac=0.3, marker="r", derived_lines=False)
    model = _load(tmp_path, synth)
    host = model.hosts[0].activity
    wait = host.kind == HostEventKind.INPUT_WAIT
    planted = sum(s.input_ms for s in synth.truth.steps)
    assert host.dur_ps[wait].sum() / PS_PER_MS == pytest.approx(planted, rel=0.01)


def test_jax_capture(tmp_path):
    synth = build_training_session(steps=5, framework="jax", marker="none")
    model = _load(tmp_path, synth)
    assert model.framework == "jax"
    assert model.steps.source == "inferred" and len(model.steps) == 5


def test_multi_host_session_shares_one_timeline(tmp_path):
    synth = build_training_session(steps=4, gpus=2)
    model = _load(tmp_path, synth, hosts=("w0", "w1"))
    assert [h.name for h in model.hosts] == ["w0", "w1"]
    assert len(model.gpus) == 4 and len(model.steps) == 4


def test_bad_host_is_an_error_and_the_good_host_loads(tmp_path):
    good = build_training_session(steps=3).space.SerializeToString()
    write_session(tmp_path, "run", "s", {"good": good, "bad": good[: len(good) // 2]})
    (ref,) = find_sessions(str(tmp_path))
    model = load_session(ref)
    assert [h.name for h in model.hosts] == ["good"]
    assert model.errors[0]["host"] == "bad" and "truncated" in model.errors[0]["message"]
    assert len(model.steps) == 3


def test_gpu_plane_without_events(tmp_path):
    synth = build_training_session(steps=3, gpus=1)
    for plane in synth.space.planes:
        if plane.name.startswith("/device:GPU"):
            del plane.lines[:]
    model = _load(tmp_path, synth)
    assert len(model.gpus) == 1 and not model.active_gpus and len(model.gpus[0]) == 0


# ----------------------------------------------------------------- real captures

def _corpus_model(corpus, run_prefix):
    refs = [r for r in find_sessions(str(corpus)) if r.run.startswith(run_prefix)]
    assert refs, run_prefix
    return [load_session(r) for r in refs]


def test_every_corpus_capture_loads(corpus):
    for ref in find_sessions(str(corpus)):
        model = load_session(ref)
        assert not model.errors, (ref.run, model.errors)
        # Each format's framework: XPlane captures are TensorFlow or JAX, Kineto traces PyTorch.
        expected = ("pytorch",) if ref.run.startswith("pytorch-") else ("tensorflow", "jax")
        assert model.framework in expected, (ref.run, model.framework)


def test_rtx5000_series(corpus):
    models = _corpus_model(corpus, "keras-cnn-rtx5000/")
    assert len(models) == 7
    for model in models:
        assert len(model.steps) == 21 and model.steps.source == "steps_line"
        (gpu,) = model.gpus
        assert (gpu.device.compute_capability, gpu.device.sm_count) == ("7.5", 48)
        assert model.framework == "tensorflow"


def test_bert_8xv100(corpus):
    (model,) = _corpus_model(corpus, "bert-8xv100")
    assert len(model.gpus) == 8
    assert {g.device.compute_capability for g in model.gpus} == {"7.0"}
    assert {g.device.sm_count for g in model.gpus} == {80}
    with_events = [g.device.name for g in model.gpus if len(g)]
    assert with_events == ["/device:GPU:1", "/device:GPU:4", "/device:GPU:6"]
    assert len(model.steps) == 1


def test_empty_gpu_trace_and_tpu(corpus):
    (empty,) = _corpus_model(corpus, "keras-cnn-rtx5000-empty-gpu-trace")
    assert len(empty.gpus) == 1 and len(empty.gpus[0]) == 0
    (tpu,) = _corpus_model(corpus, "jax-tpu-v6e")
    assert not tpu.gpus and {d.device.kind for d in tpu.devices} == {"tpu"}
    assert tpu.framework == "jax" and len(tpu.steps) > 1


def test_amd_capture(corpus):
    (model,) = _corpus_model(corpus, "jax-mi300x-amd")
    assert {g.device.vendor for g in model.gpus} == {"AMD"}
    assert model.framework == "jax"


def test_capture_too_big_for_memory_is_refused_with_a_clear_message(tmp_path, monkeypatch):
    monkeypatch.setenv("TB_GPUADVISOR_MEMORY_LIMIT_MB", "1")
    model = _load(tmp_path, build_training_session(steps=3))
    assert not model.hosts and len(model.steps) == 0
    assert "memory" in model.errors[0]["message"] and "GiB" in model.errors[0]["message"]


def test_events_the_profiler_dropped_are_counted(tmp_path):
    synth = build_training_session(steps=3)
    synth.space.warnings.append("CUPTI: dropped 12 events (buffer full)")
    synth.space.errors.append("Dropped 3 activity records")
    model = _load(tmp_path, synth)
    assert model.hosts[0].dropped_events == 15
    assert any("dropped 12" in w for w in model.warnings)


@pytest.mark.parametrize("spread", [40, 1 << 40])
def test_sorted_keys_first_value_wins_in_table_and_sorted_forms(spread):
    """SortedKeys answers like a dict filled in key order with setdefault (a repeated key keeps
    its first value), whether its keys span a small range (the table) or not (sorted search),
    including queries outside the keys' range and at the int64 limits."""
    from tb_gpuadvisor.arrays import SortedKeys
    rng = np.random.default_rng(spread)
    for _ in range(100):
        n = int(rng.integers(1, 60))
        keys = rng.integers(-5, spread, n)
        values = rng.integers(-100, 100, n).astype(np.int32)
        queries = np.concatenate([rng.integers(-20, 80, 40), keys,
                                  [np.iinfo(np.int64).max, np.iinfo(np.int64).min]])
        first: dict[int, int] = {}
        for key, value in zip(keys.tolist(), values.tolist()):
            first.setdefault(key, value)
        table = SortedKeys(keys, values)
        assert (table._table is not None) == (spread == 40 or len(set(keys.tolist())) == 1)
        assert table.get(queries, -7).tolist() == [first.get(q, -7) for q in queries.tolist()]


def test_sorted_keys_take_int32_queries_whatever_the_keys():
    """Id columns are int32 where they fit (narrow_ids): a host's may be int32 while a device's
    keys need int64, and the other way round; either way the look-up is the same."""
    from tb_gpuadvisor.arrays import SortedKeys
    big = np.array([(1 << 40) + 3, (1 << 40) + 1, 5], np.int64)
    assert SortedKeys(big, np.arange(3, dtype=np.int32)).get(np.array([5, -1, 7], np.int32)).tolist() == [2, -1, -1]
    small = SortedKeys(np.array([3, 1, 2], np.int32), np.arange(3, dtype=np.int32))
    assert small.get(np.array([1, 1 << 40, -1], np.int64)).tolist() == [1, -1, -1]
    assert small.get(np.array([2, 9], np.int32)).tolist() == [2, -1]


def test_narrow_ids_keeps_int64_only_where_a_value_needs_it():
    from tb_gpuadvisor.arrays import narrow_ids
    assert narrow_ids(np.array([-1, 7, 2**31 - 1], np.int64)).dtype == np.int32
    assert narrow_ids(np.array([-1, 2**31], np.int64)).dtype == np.int64
    assert narrow_ids(np.array([-(2**31) - 1], np.int64)).dtype == np.int64
    assert narrow_ids(np.empty(0, np.int64)).dtype == np.int32
    assert narrow_ids(np.array([-1, 7], np.int64)).tolist() == [-1, 7]
    absent = narrow_ids(np.full(1000, -1, np.int64))       # a stat the capture never records
    assert absent.tolist() == [-1] * 1000 and absent.strides == (0,) and not absent.flags.writeable
    assert narrow_ids(absent) is absent


def test_kept_masks_of_one_value_take_no_memory():
    """A name mask that matches no event (or every one: most of a capture's) is one read-only
    value for every row; any other is kept as it is, read-only."""
    from tb_gpuadvisor.arrays import kept_mask
    for value in (False, True):
        kept = kept_mask(np.full(10_000, value))
        assert kept.strides == (0,) and not kept.flags.writeable and kept.tolist() == [value] * 10_000
        assert kept_mask(kept) is kept
    mixed = np.arange(10) % 3 == 0
    assert kept_mask(mixed) is mixed and not mixed.flags.writeable
    assert kept_mask(np.empty(0, bool)).size == 0


@pytest.mark.parametrize("changes", [0, 3, 500])
def test_runs_give_the_column_back(changes):
    """A step-like column is kept as runs and given back whole; one that changes at most rows
    stays as it is (runs would not save memory)."""
    from tb_gpuadvisor.arrays import Runs
    rng = np.random.default_rng(changes)
    column = np.cumsum(np.isin(np.arange(1000), rng.choice(1000, changes, replace=False))
                       * rng.integers(-10**12, 10**12, 1000)).astype(np.int64)
    kept = Runs.packed(column)
    assert isinstance(kept, Runs) == (changes < 100)
    assert Runs.dense(kept).dtype == np.int64
    assert np.array_equal(Runs.dense(kept), column)
    for tiny in (np.empty(0, np.int64), np.array([4], np.int64)):
        assert np.array_equal(Runs.dense(Runs.packed(tiny)), tiny)


@pytest.mark.parametrize("spread", [40, 1 << 40])
def test_renumber_small_ints_answers_like_np_unique(spread):
    """The dense-table form (small non-negative ids) and the sorted form (anything else) both
    give np.unique's distinct values and inverse."""
    from tb_gpuadvisor.arrays import renumber_small_ints
    rng = np.random.default_rng(spread)
    for _ in range(50):
        values = rng.integers(0 if spread == 40 else -spread, spread, int(rng.integers(1, 80)))
        used, inverse = renumber_small_ints(values)
        want_used, want_inverse = np.unique(values, return_inverse=True)
        assert np.array_equal(used, want_used) and np.array_equal(inverse, want_inverse)
        assert inverse.dtype == np.int32


def test_plane_read_buffers_are_reused_unless_large(monkeypatch):
    """A worker reads plane after plane into one buffer, grown when a plane does not fit; a buffer
    larger than KEEP_BUFFER_BYTES is let go once its plane is decoded, before the plane's tables
    are built (it would add to the decode's peak), and a small one is kept for the next plane."""
    from tb_gpuadvisor.input.xplane import build
    monkeypatch.setattr(build, "KEEP_BUFFER_BYTES", 1000)
    buffers = build._ReadBuffers()
    small = buffers.fitting(600)
    buffers.decoded()
    assert buffers.fitting(400) is small and buffers.fitting(600) is small
    large = buffers.fitting(5000)
    assert large.size >= 5000 and large is not small
    buffers.decoded()
    assert buffers.data is None and buffers.fitting(10).size == 10


@pytest.mark.parametrize("days, refused", [(1, False), (60, True)])
def test_a_host_plane_far_from_the_gpu_planes_is_placed_or_refused(tmp_path, days, refused):
    """Each plane's table is built from the plane's own origin and moved onto the host's after:
    a host plane whose clock reads a day later keeps its events exactly a day after the GPUs';
    sixty days later (past the +-53 days every time keeps) the capture is refused in one line
    rather than overflowing."""
    synth = build_training_session(steps=3)
    path = tmp_path / "h.xplane.pb"
    path.write_bytes(synth.space.SerializeToString())
    plain = read_host(str(path), "h")
    shift_ns = days * 86_400 * 10**9
    for line in next(p for p in synth.space.planes if p.name == "/host:CPU").lines:
        line.timestamp_ns += shift_ns
    path.write_bytes(synth.space.SerializeToString())
    if refused:
        with pytest.raises(CaptureError, match="too far from the capture's other times"):
            read_host(str(path), "h")
        return
    shifted = read_host(str(path), "h")
    gap = (shifted.activity.start_ps[0] - shifted.devices[0].start_ps[0]) - \
        (plain.activity.start_ps[0] - plain.devices[0].start_ps[0])
    assert gap == shift_ns * 1000
